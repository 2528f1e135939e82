# shellcheck shell=bash
# scripts/common.sh — shared by scripts/test.sh and scripts/demo.sh (sourced).
#
# Installs what is missing from Debian's packages (as root), builds gpuivf,
# and runs throwaway PostgreSQL clusters as an unprivileged user: PostgreSQL
# refuses to run as root.

PG_MAJOR=${PG_MAJOR:-15}
# PG_CONFIG (as for any PGXS build) selects another PostgreSQL installation.
if [ -n "${PG_CONFIG:-}" ] && [ -x "$PG_CONFIG" ]; then
	PG_BIN=$("$PG_CONFIG" --bindir)
else
	PG_BIN=/usr/lib/postgresql/$PG_MAJOR/bin
fi
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}

# Debian packages the build and the tests need.
GPUIVF_PACKAGES=(
	build-essential cmake pkg-config perl
	"postgresql-$PG_MAJOR" "postgresql-server-dev-$PG_MAJOR" "postgresql-client-$PG_MAJOR"
	libopenblas-dev libopenblas-serial-dev  # single-threaded BLAS inside backends (src/core/CMakeLists.txt)
	libgtest-dev libbenchmark-dev libipc-run-perl
	sqlsmith  # SQL fuzzing (test/t/610_fuzz_sqlsmith.pl)
	python3-matplotlib  # test/bench plots (the benchmark skips them, visibly, without it)
)

say() { printf '\n=== %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

is_root() { [ "$(id -u)" -eq 0 ]; }

# apt-get install whatever is missing; nothing at all when everything is there.
ensure_packages() {
	local missing=() p
	for p in "${GPUIVF_PACKAGES[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	if [ ${#missing[@]} -eq 0 ]; then
		echo "all needed Debian packages are installed"
		return 0
	fi
	is_root || die "missing Debian packages: ${missing[*]} (run as root to install them)"
	say "installing: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q || die "apt-get update failed"
	apt-get install -y -q --no-install-recommends "${missing[@]}" || die "apt-get install failed"
}

# The unprivileged user that runs PostgreSQL: the current user unless root.
pg_user() {
	if is_root; then echo "${GPUIVF_PG_USER:-postgres}"; else id -un; fi
}

# Runs a command as pg_user (a login-less switch; no password needed as root).
as_pg() {
	if is_root; then
		runuser -u "$(pg_user)" -- env PATH="$PG_BIN:$PATH" "$@"
	else
		env PATH="$PG_BIN:$PATH" "$@"
	fi
}

# build_and_install [TREE [RUNNER...]]: CMake (engine, unit tests, tools) and
# PGXS (the extension) in TREE (default: the checkout), each build command
# run through RUNNER (e.g. as_pg), then `make install` as the current user.
build_and_install() {
	local tree=${1:-$REPO}
	shift || true
	export PATH="$PG_BIN:$PATH"
	say "building the engine, unit tests and tools (CMake)"
	"$@" cmake -S "$tree" -B "$tree/build" -DCMAKE_BUILD_TYPE=Release >/dev/null || return 1
	"$@" cmake --build "$tree/build" -j "$JOBS" || return 1
	say "building the extension (PGXS)"
	"$@" make -C "$tree" -j "$JOBS" PG_CONFIG="$PG_BIN/pg_config" || return 1
	say "installing the extension"
	if is_root || [ -w "$("$PG_BIN/pg_config" --pkglibdir)" ]; then
		make -C "$tree" install PG_CONFIG="$PG_BIN/pg_config" >/dev/null || return 1
	else
		die "make install needs root (or write access to $("$PG_BIN/pg_config" --pkglibdir))"
	fi
}

# ensure_vendored NAME CONTROL VAR: a PostgreSQL extension that Debian 12
# does not package, installed into the PostgreSQL that PG_CONFIG names:
# when its control file (CONTROL, without .control) is missing, it is built
# from the source tarball NAME-*.tar.gz in ../shared/vendor next to the
# checkout (GPUIVF_VENDOR_DIR overrides) with that folder's build.sh.  Sets
# the variable VAR to the reason when the extension is not available
# afterwards (the tests that need it report themselves skipped with it) and
# exports it; never fails the caller.
ensure_vendored() {
	local name=$1 control=$2 var=$3 pg_config=$PG_BIN/pg_config vendor reason=
	if [ -f "$("$pg_config" --sharedir)/extension/$control.control" ]; then
		echo "$name: installed"
	else
		vendor=${GPUIVF_VENDOR_DIR:-$REPO/../shared/vendor}
		if [ ! -f "$vendor/build.sh" ] || ! ls "$vendor/$name"-*.tar.gz >/dev/null 2>&1; then
			reason="$name is not installed in $("$pg_config" --bindir)/.. and there is no $name source in $vendor to build it from"
		elif ! is_root && [ ! -w "$("$pg_config" --pkglibdir)" ]; then
			reason="$name is not installed and installing it into $("$pg_config" --pkglibdir) needs root"
		else
			echo "$name: building it from $vendor"
			PG_CONFIG=$pg_config bash "$vendor/build.sh" "$name" ||
				reason="$name is not installed and building it from $vendor failed (see above)"
		fi
		[ -n "$reason" ] && echo "$name: not available ($reason); the tests that need it report themselves skipped"
	fi
	printf -v "$var" '%s' "$reason"
	export "${var?}"
	return 0
}

# make_pg_dir VAR: a new directory owned by pg_user, its path stored in VAR
# (not printed: a command substitution would run in a subshell and the
# directory would escape cleanup_all, which removes it at exit).
CLEANUP_DIRS=()
CLEANUP_CLUSTERS=()
make_pg_dir() {
	local d
	d=$(mktemp -d "${TMPDIR:-/tmp}/gpuivf.XXXXXX") || die "mktemp failed"
	chmod 755 "$d"
	is_root && chown "$(pg_user)" "$d"
	CLEANUP_DIRS+=("$d")
	printf -v "$1" '%s' "$d"
}

# A free TCP port on 127.0.0.1 from $1 upwards (default 5500).
free_port() {
	local port=${1:-5500}
	while [ "$port" -lt 65000 ]; do
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			echo "$port"
			return 0
		fi
		port=$((port + 1))
	done
	die "no free port"
}

# start_cluster DIR PORT [listen_addresses]: initdb + start; the Unix socket
# lives in DIR, TCP (when asked) only on 127.0.0.1.
start_cluster() {
	local dir=$1 port=$2 listen=${3:-}
	mkdir -p "$dir" && chmod 755 "$dir"
	is_root && chown "$(pg_user)" "$dir"
	as_pg initdb -D "$dir/data" -A trust -U postgres -N -E UTF8 --locale=C >"$dir/initdb.log" 2>&1 \
		|| { cat "$dir/initdb.log"; return 1; }
	cat >>"$dir/data/postgresql.conf" <<-EOF
		port = $port
		listen_addresses = '$listen'
		unix_socket_directories = '$dir'
		shared_buffers = 256MB
		maintenance_work_mem = 512MB
		max_wal_size = 2GB
		fsync = off
		synchronous_commit = off
		jit = off
	EOF
	as_pg pg_ctl -D "$dir/data" -l "$dir/server.log" -w start >/dev/null || { cat "$dir/server.log"; return 1; }
	CLEANUP_CLUSTERS+=("$dir/data")
}

stop_cluster() {
	as_pg pg_ctl -D "$1" -m fast -w stop >/dev/null 2>&1 || true
}

cleanup_all() {
	local c d
	for c in "${CLEANUP_CLUSTERS[@]}"; do stop_cluster "$c"; done
	if [ -z "${GPUIVF_KEEP_TMP:-}" ]; then
		for d in "${CLEANUP_DIRS[@]}"; do rm -rf "$d"; done
	fi
}

# ../shared/data next to the checkout, when present (real data sets).
shared_data_dir() {
	if [ -n "${GPUIVF_DATA_DIR:-}" ]; then
		echo "$GPUIVF_DATA_DIR"
	elif [ -d "$REPO/../shared/data" ]; then
		(cd "$REPO/../shared/data" && pwd)
	fi
}
