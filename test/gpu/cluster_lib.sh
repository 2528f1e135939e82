# shellcheck shell=bash
# test/gpu/cluster_lib.sh — the PostgreSQL set-up that the GPU-machine
# scripts share (worker_end_to_end.sh, calibration_on_gpu.sh,
# large_vectors_device.sh, list_balance.sh, the several-server replicas.sh,
# partitions.sh, citus.sh, and test/bench/scale_on_gpu.sh, bench_on_gpu.sh):
# sourced.
#
# On the GPU machine (the default) gpuivf.so and gpuivf_gpu.so, built on the
# development machine, travel with PostgreSQL in a kit folder (KIT: pgkit.sh,
# pgkit.tar.xz, gpuivf.so, gpuivf_gpu.so; ../shared/device/README.md), and
# PostgreSQL runs as the kit's user pgrun.  GPUIVF_LOCAL=1 is a dry run on
# the development machine: the PostgreSQL that pg_config (PG_CONFIG) names,
# with gpuivf installed, run as the user postgres; ENGINE=path of the CPU
# stand-in of the GPU engine (make fake-gpu-engine) serves as "the GPU"
# (GPUIVF_FAKE_DEVICES=n of them).
#
#   install_postgres KIT [pgvector] [vector.so]
#                          PostgreSQL and gpuivf (and gpuivf_vector): PATH,
#                          PGBIN, PGUSER_OS, GPUS (the GPU list), as_pg; on
#                          the GPU machine with "pgvector" pgvector is built
#                          from the kit's build.sh and pgvector-*.tar.gz,
#                          with "vector.so" a pgvector built elsewhere
#                          (KIT/vector.so, vector.control, vector--*.sql) is
#                          copied, each when the kit holds it
#   setup_postgres KIT [pgvector] [vector.so]
#                          install_postgres, then a fresh work folder $W
#                          (with gpuivf_device.py) owned by PGUSER_OS
#   as_pg CMD              CMD as the PostgreSQL user, with PGHOST=$W,
#                          PGPORT=$PORT (the server of a script with one)
#                          and PGUSER=postgres
#   make_data DIR ROWS DIMS NQ
#                          DIR/base.bin, DIR/queries.bin (binary COPY of
#                          (id bigint, v real[])) and DIR/gt.txt, the exact
#                          top-10 of every query ("qid|{ids}|{distances}")
#   start_server NAME PORT [CONF...]
#                          initdb + start a server in $W/NAME (data/,
#                          server.log) with the common settings and the
#                          given lines (a line given overrides a common
#                          one: the last of a setting wins)
#   sqlp PORT SQL          psql -At against the server on PORT
#   sqlfp PORT FILE        the same with a file
#   sql SQL, sqlf FILE     the same against the server on PORT
#   pgbench_tps PORT CLIENTS SCRIPT LABEL [PGOPTIONS]
#                          one BENCH_S-second pgbench run; prints
#                          "tps p50 p99" (ms, from the transaction log)
#   query_results PORT TABLE SETTINGS FILE [NQ]
#                          the top-10 of the first NQ queries of table
#                          queries as "qid|{ids}|{distances}" lines
#   recall FILE            recall@10 of such a file against $W/gt.txt
#   knn_script TABLE       a pgbench script: the 10 nearest rows of TABLE to
#                          a random one of the queries
#   md_rows FILE           "a|b|c" lines as markdown table rows
#   wait_worker_ready      up to 30 s for a GPU worker of the server on
#                          PORT to be ready (after a start or a restart)
#   restart_server NAME [VAR=VALUE]
#                          restarts the server in $W/NAME (VAR exported to
#                          its postmaster first: a setting read at start,
#                          or the CPU stand-in's GPUIVF_FAKE_INSTANT), then
#                          wait_worker_ready
#   stop_servers           stops every server under $W
#   say TEXT               a timestamped progress line
# Variables: W (work folder, default /tmp/gpuivf-cluster), PORT (5432),
# BENCH_S (6), PY, SHARED_BUFFERS (4GB) and MAINTENANCE_WORK_MEM (2GB) of
# start_server.

W=${W:-/tmp/gpuivf-cluster}
PORT=${PORT:-5432}
BENCH_S=${BENCH_S:-6}
PY=${PY:-python3}
started=${started:-$(date +%s)}
say() { echo "== [$(( $(date +%s) - started ))s] $*"; }

install_postgres() {
	# (not "kit": pgkit.sh, sourced below, sets a variable of that name)
	local kit_dir=$1 want=" ${*:2} "
	if [ -n "${GPUIVF_LOCAL:-}" ]; then
		PGBIN=$("${PG_CONFIG:-pg_config}" --bindir)
		export PATH=$PGBIN:$PATH
		PGUSER_OS=postgres
		as_pg() { runuser -u postgres -- env PATH="$PGBIN:$PATH" PGHOST="$W" PGPORT="$PORT" PGUSER=postgres ${ENGINE:+GPUIVF_FAKE_DEVICES=${GPUIVF_FAKE_DEVICES:-1}} bash -c "cd /tmp; $*"; }
		GPUS=
	else
		if [ ! -f "$kit_dir/pgkit.sh" ] || [ ! -f "$kit_dir/pgkit.tar.xz" ] || [ ! -f "$kit_dir/gpuivf.so" ] || [ ! -f "$kit_dir/gpuivf_gpu.so" ]; then
			echo "error: $kit_dir must hold pgkit.sh, pgkit.tar.xz, gpuivf.so and gpuivf_gpu.so" >&2
			exit 1
		fi
		# shellcheck disable=SC1090,SC1091
		source "$kit_dir/pgkit.sh" unpack "$kit_dir/pgkit.tar.xz" || exit 1
		PGBIN=$(pg_config --bindir)
		PGUSER_OS=pgrun
		as_pg() { pgkit_as "export PGHOST=$W PGPORT=$PORT; $*"; }
		cp "$kit_dir/gpuivf.so" "$kit_dir/gpuivf_gpu.so" "$(pg_config --pkglibdir)/" || exit 1
		cp gpuivf.control gpuivf_vector.control sql/gpuivf--0.1.0.sql sql/gpuivf_vector--0.1.0.sql \
			"$(pg_config --sharedir)/extension/" || exit 1
		if [[ "$want" == *" vector.so "* ]] && [ -f "$kit_dir/vector.so" ]; then
			cp "$kit_dir/vector.so" "$(pg_config --pkglibdir)/" || exit 1
			cp "$kit_dir"/vector.control "$kit_dir"/vector--*.sql "$(pg_config --sharedir)/extension/" || exit 1
		fi
		if [[ "$want" == *" pgvector "* ]] && [ -f "$kit_dir/build.sh" ] && ls "$kit_dir"/pgvector-*.tar.gz >/dev/null 2>&1; then
			say "building pgvector from $(ls "$kit_dir"/pgvector-*.tar.gz) against $(pg_config --version)"
			PG_CONFIG=$(command -v pg_config) bash "$kit_dir/build.sh" pgvector || exit 1
		fi
		GPUS=$(nvidia-smi -L 2>&1 | head -8)
		echo "$GPUS"
	fi
}

setup_postgres() {
	install_postgres "$@"
	rm -rf "$W" && mkdir -p "$W" && cp test/gpu/gpuivf_device.py "$W/" && chown -R "$PGUSER_OS" "$W"
}

make_data() {
	$PY "$W/gpuivf_device.py" gen "$1" "$2" "$3" "$4" 10 || exit 1
	chown -R "$PGUSER_OS" "$1"
}

# the settings every server gets (one machine, many servers: modest memory)
start_server() {
	local name=$1 port=$2 dir=$W/$1
	shift 2
	mkdir -p "$dir" && chown "$PGUSER_OS" "$dir"
	as_pg "initdb -A trust -U postgres -D $dir/data >/dev/null" || exit 1
	{
		echo "port = $port"
		echo "unix_socket_directories = '$W'"
		echo "listen_addresses = '127.0.0.1'"
		echo "max_connections = 300"
		echo "shared_buffers = ${SHARED_BUFFERS:-4GB}"
		echo "maintenance_work_mem = ${MAINTENANCE_WORK_MEM:-2GB}"
		echo "dynamic_shared_memory_type = mmap"
		echo "jit = off"
		echo "fsync = off"
		echo "synchronous_commit = off"
		echo "max_wal_size = 16GB"
		echo "checkpoint_timeout = 30min"
		echo "max_parallel_workers_per_gather = 0"
		echo "log_line_prefix = '%m [%p] %b '"
		for line in "$@"; do echo "$line"; done
		# the stand-in engine, where the GPU worker runs
		[ -n "${ENGINE:-}" ] && [[ "$*" == *"shared_preload_libraries = "*gpuivf* ]] &&
			echo "gpuivf.engine_library = '$ENGINE'"
	} >> "$dir/data/postgresql.conf"
	as_pg "pg_ctl -D $dir/data -l $dir/server.log -w start >/dev/null" || { cat "$dir/server.log"; exit 1; }
}

# one file per statement: a script may run statements at the same time
sqlp() {
	local f rc
	f=$(mktemp "$W/q_$1.XXXXXX.sql")
	printf '%s\n' "$2" > "$f"
	sqlfp "$1" "$f"
	rc=$?
	rm -f "$f"
	return $rc
}
sqlfp() { chown "$PGUSER_OS" "$2"; as_pg "psql -X -q -At -v ON_ERROR_STOP=1 -h $W -p $1 -U postgres -f $2 postgres"; }

sql() { sqlp "$PORT" "$1"; }
sqlf() { sqlfp "$PORT" "$1"; }

pgbench_tps() {
	local port=$1 c=$2 script=$3 label=$4 opts=${5:-} j lat tps
	j=$(( c < 16 ? c : 16 ))
	rm -f "$W/pgb_${label}"*
	as_pg "PGOPTIONS='$opts' pgbench -n -M prepared -h $W -p $port -U postgres -c $c -j $j -T $BENCH_S -l --log-prefix=$W/pgb_$label -f $script postgres" > "$W/pgbench_$label.log" 2>&1
	tps=$(grep -E '^tps' "$W/pgbench_$label.log" | head -1 | awk '{printf "%.0f", $3}')
	lat=$($PY "$W/gpuivf_device.py" latency "$W/pgb_$label" | awk '{print $1, $2}' | sed 's/p50=//; s/p99=//')
	echo "${tps:-0} $lat"
}

query_results() {
	local port=$1 table=$2 settings=$3 out=$4 n=${5:-1000} f=$W/qr_$1_$2.sql
	echo "$settings" > "$f"
	for ((q = 0; q < n; q++)); do
		echo "SELECT $q, array_agg(id ORDER BY d, id), array_agg(d ORDER BY d, id) FROM (SELECT id, v <-> (SELECT v FROM queries WHERE qid = $q) AS d FROM $table ORDER BY v <-> (SELECT v FROM queries WHERE qid = $q) LIMIT 10) s;" >> "$f"
	done
	sqlfp "$port" "$f" > "$out"
}

recall() { $PY "$W/gpuivf_device.py" recall "$1" "$W/gt.txt"; }

# the kNN statement pgbench runs against TABLE (a random one of the queries)
knn_script() {
	local table=$1 f=$W/knn_$1.sql nq
	nq=$(wc -l < "$W/gt.txt")
	printf '%s\n' "\\set q random(0, $((nq - 1)))" \
		"SELECT id FROM $table ORDER BY v <-> (SELECT v FROM queries WHERE qid = :q) LIMIT 10;" > "$f"
	chown "$PGUSER_OS" "$f"
	echo "$f"
}

# a file of "a|b|c" lines as the rows of a markdown table
md_rows() { awk -F'|' '{ s = "|"; for (i = 1; i <= NF; i++) s = s " " $i " |"; print s }' "$1"; }

wait_worker_ready() {
	for _ in $(seq 1 60); do
		[ "$(sql "SELECT count(*) FROM gpuivf_stat WHERE state = 'ready'")" -gt 0 ] && break
		sleep 0.5
	done
}

restart_server() {
	as_pg "${2:+export $2; }pg_ctl -D $W/$1/data -l $W/$1/server.log -w -m fast restart >/dev/null" || return 1
	wait_worker_ready
}

stop_servers() {
	local d
	for d in "$W"/*/data; do
		[ -f "$d/postmaster.pid" ] && as_pg "pg_ctl -D $d -m fast -w stop >/dev/null"
	done
}
