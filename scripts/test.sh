#!/usr/bin/env bash
# scripts/test.sh — runs every test of gpuivf on a Debian 12 machine.
#
#   sudo bash scripts/test.sh        (as root: installs missing Debian packages)
#
# 1. installs what is missing (build-essential, cmake, postgresql-15 and its
#    server headers, OpenBLAS, GoogleTest, Google Benchmark, IPC::Run);
# 2. builds the engine, unit tests and tools (CMake) and the extension (PGXS),
#    and installs the extension; builds and installs Citus from the source
#    in ../shared/vendor when the server lacks it (about 4 minutes on 2
#    cores; GPUIVF_CITUS=0 skips it; the Citus tests report themselves
#    skipped, with the reason, when it is not there) and pgvector likewise
#    (the tests on pgvector's types report themselves skipped when it cannot);
# 3. runs the unit tests (ctest; GPU tests report themselves skipped without a
#    GPU), pg_regress (make installcheck against a throwaway cluster) and the
#    TAP tests (test/t), PostgreSQL always running as an unprivileged user;
# 4. prints "N passed, N failed" summed over all three and exits non-zero on
#    any failure.
#
# Environment: GPUIVF_DATA_DIR (real data sets; default ../shared/data next
# to the checkout), GPUIVF_KEEP_TMP=1 keeps the temporary directories,
# GPUIVF_TAP_TESTS="test/t/003_*.pl" runs only some TAP files,
# GPUIVF_VENDOR_DIR (vendored extension sources; default ../shared/vendor),
# GPUIVF_CITUS=0 does not build Citus.
set -uo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
trap cleanup_all EXIT

PASSED=0
FAILED=0
SKIPPED=0
BREAKDOWN=()

record() { # record SUITE PASSED FAILED SKIPPED
	PASSED=$((PASSED + $2))
	FAILED=$((FAILED + $3))
	SKIPPED=$((SKIPPED + $4))
	BREAKDOWN+=("$1: $2 passed, $3 failed, $4 skipped")
}

finish() {
	say "summary"
	local line
	for line in "${BREAKDOWN[@]}"; do echo "  $line"; done
	echo "$PASSED passed, $FAILED failed"
	[ "$FAILED" -eq 0 ]
	exit $?
}

started=$SECONDS
say "Debian packages"
ensure_packages
say "Citus"
if [ "${GPUIVF_CITUS:-1}" = 0 ]; then
	export CITUS_MISSING="GPUIVF_CITUS=0 was given"
	echo "Citus: not built ($CITUS_MISSING)"
else
	ensure_vendored citus citus CITUS_MISSING
fi
say "pgvector"
ensure_vendored pgvector vector PGVECTOR_MISSING

# As root, everything is built and tested in a copy of the tree owned by the
# unprivileged user (PostgreSQL refuses root, and tests write into the tree
# and may build helpers there); only `make install` runs as root.  The
# checkout itself stays untouched.
make_pg_dir WORK
if is_root; then
	say "copying the tree for $(pg_user)"
	TREE=$WORK/gpuivf
	mkdir -p "$TREE"
	tar -C "$REPO" --exclude=./.git --exclude=./build --exclude=./tmp_check --exclude=./results \
		--exclude='*.o' --exclude='*.so' -cf - . | tar -C "$TREE" -xf -
	chown -R "$(pg_user)" "$WORK"
	RUN=(as_pg)
else
	TREE=$REPO
	RUN=()
fi

if ! build_and_install "$TREE" "${RUN[@]}"; then
	record build 0 1 0
	finish
fi
is_root && chown -R "$(pg_user)" "$TREE"

DATA_DIR=$(shared_data_dir)
if [ -n "$DATA_DIR" ] && [ -d "$DATA_DIR" ]; then
	export GPUIVF_DATA_DIR=$DATA_DIR
	echo "real data sets: $DATA_DIR"
else
	echo "real data sets: not found (tests that need them report themselves skipped)"
fi

# ---------------------------------------------------------------- unit tests
say "unit tests (ctest)"
JUNIT=$WORK/ctest.xml
(cd "$TREE/build" && "${RUN[@]}" env ${GPUIVF_DATA_DIR:+GPUIVF_DATA_DIR="$GPUIVF_DATA_DIR"} \
	ctest --output-on-failure -j "$JOBS" --output-junit "$JUNIT")
if [ -f "$JUNIT" ]; then
	attr() { perl -0ne 'print $1 if /<testsuite\b[^>]*?\s'"$1"'="(\d+)"/' "$JUNIT"; }
	total=$(attr tests); failures=$(attr failures); skipped=$(attr skipped); disabled=$(attr disabled)
	errors=$(attr errors)
	skipped=$(( ${skipped:-0} + ${disabled:-0} ))
	failures=$(( ${failures:-0} + ${errors:-0} ))
	record ctest $(( ${total:-0} - failures - skipped )) "$failures" "$skipped"
	grep -o '<testcase name="[^"]*"[^>]*status="\(skipped\|disabled\|notrun\)"' "$JUNIT" \
		| sed 's/<testcase name="\([^"]*\)".*/  skipped: \1/' || true
else
	record ctest 0 1 0
fi

# ------------------------------------------------------------------ pg_regress
say "pg_regress (make installcheck)"
PORT=$(free_port 5500)
REGRESS_LOG=$WORK/regress.log
: >"$REGRESS_LOG"
start_cluster "$WORK/regress" "$PORT" &&
as_pg env PGHOST="$WORK/regress" PGPORT="$PORT" \
	make -C "$TREE" installcheck TAP_TESTS= PG_CONFIG="$PG_BIN/pg_config" 2>&1 | tee "$REGRESS_LOG"
ok=$(grep -cE '\.\.\. ok( |$)' "$REGRESS_LOG")
bad=$(grep -cE '\.\.\. FAILED' "$REGRESS_LOG")
if [ $((ok + bad)) -eq 0 ]; then
	echo "pg_regress ran no test"
	bad=1
fi
record pg_regress "$ok" "$bad" 0
[ "$bad" -gt 0 ] && [ -f "$TREE/regression.diffs" ] && head -200 "$TREE/regression.diffs"
stop_cluster "$WORK/regress/data"

# ------------------------------------------------------------------------ TAP
say "TAP tests (test/t)"
TAP_LOG=$WORK/tap.log
tap_args=()
[ -n "${GPUIVF_TAP_TESTS:-}" ] && tap_args=(PROVE_TESTS="$GPUIVF_TAP_TESTS")
as_pg env ${GPUIVF_DATA_DIR:+GPUIVF_DATA_DIR="$GPUIVF_DATA_DIR"} \
	${CITUS_MISSING:+CITUS_MISSING="$CITUS_MISSING"} \
	${PGVECTOR_MISSING:+PGVECTOR_MISSING="$PGVECTOR_MISSING"} \
	make -C "$TREE" installcheck REGRESS= PG_CONFIG="$PG_BIN/pg_config" \
	PROVE_FLAGS="-I ./test/perl -v" "${tap_args[@]}" 2>&1 | tee "$TAP_LOG"
# Assertions: "ok N" / "not ok N" (TODO items count as passed, "# skip" as
# skipped); a file that died early or skipped entirely is seen in prove's
# per-file verdicts.
tap_ok=$(grep -E '^\s*ok [0-9]+' "$TAP_LOG" | grep -vic '# skip')
tap_skip=$(grep -E '^\s*ok [0-9]+' "$TAP_LOG" | grep -ic '# skip')
tap_bad=$(grep -E '^\s*not ok [0-9]+' "$TAP_LOG" | grep -vic '# TODO')
tap_todo=$(grep -E '^\s*not ok [0-9]+' "$TAP_LOG" | grep -ic '# TODO')
tap_ok=$((tap_ok + tap_todo))
tap_skip=$((tap_skip + $(grep -cE '^test/t/\S+ \.+ skipped:' "$TAP_LOG")))
# files that failed without a "not ok" (died, wrong plan): prove's summary
# lists them with "Failed: 0"
dubious=$(grep -cE '^test/t/\S+ +\(Wstat: .*Failed: 0\)' "$TAP_LOG")
if ! grep -q '^Result: PASS' "$TAP_LOG" && [ "$tap_bad" -eq 0 ] && [ "$dubious" -eq 0 ]; then
	dubious=1
fi
record TAP "$tap_ok" $((tap_bad + dubious)) "$tap_skip"
grep -E '^test/t/.* \.+ skipped:' "$TAP_LOG" | sed 's/^/  /' || true

echo "elapsed: $((SECONDS - started)) s"
finish
