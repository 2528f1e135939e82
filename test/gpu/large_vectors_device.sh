#!/usr/bin/env bash
# test/gpu/large_vectors_device.sh — pgvector columns too large for pgvector's
# own indexes, on the GPU: a vector(3072) column (OpenAI
# text-embedding-3-large's size; too large for an index page, so the index
# re-ranks from the table and the GPU's copy holds codes only) and a
# halfvec(4000) column (kept as halves in the index and on the GPU), and
# optionally a real[] of 16,000 dimensions.  For each:
#   1. CREATE INDEX with gpuivf.device = gpu (trained and encoded on the GPU
#      worker): time, and the worker's build requests;
#   2. exact mode (gpuivf.probes = lists) against a sequential scan ordered
#      by pgvector's operator: NQ queries, the same ids in the same order;
#   3. the GPU answers: gpuivf.device = gpu with the tuned probes, the
#      worker's query count, EXPLAIN ANALYZE's Device line, and the answers
#      equal gpuivf.device = cpu's (ids and distances);
#   4. recall@10 of those answers against the sequential scan.
# It prints one summary table last.
#
# Builds nothing of gpuivf: KIT (default .device-worker, as for
# test/gpu/worker_end_to_end.sh) holds pgkit.sh, pgkit.tar.xz, gpuivf.so and
# gpuivf_gpu.so built on the development machine, plus ../shared/vendor's
# build.sh and pgvector-0.8.6.tar.gz: pgvector is built here against the
# kit's PostgreSQL (test/gpu/cluster_lib.sh, setup_postgres KIT pgvector).
# Data: numpy (the device's python3), clustered rows.
#
# On the device, from the repository root:
#   bash test/gpu/large_vectors_device.sh .device-worker
# Environment (defaults): ROWS (50000), NQ (50), WIDE=1 adds real[] x 16000
# (ROWS_WIDE rows, default 5000), OUT (/tmp/gpuivf-large-out).  About 3-5
# minutes on an H100/H200.
# Locally, as a dry run with the CPU stand-in engine:
#   GPUIVF_LOCAL=1 ENGINE=$PWD/build/gpuivf_fake_gpu.so ROWS=3000 NQ=10 \
#     PG_CONFIG=... bash test/gpu/large_vectors_device.sh
set -u
KIT=${1:-.device-worker}
OUT=${OUT:-/tmp/gpuivf-large-out}
ROWS=${ROWS:-50000}
NQ=${NQ:-50}
ROWS_WIDE=${ROWS_WIDE:-5000}
PORT=${PORT:-5433}
W=${W:-/tmp/gpuivf-large}
SHARED_BUFFERS=${SHARED_BUFFERS:-8GB}
MAINTENANCE_WORK_MEM=${MAINTENANCE_WORK_MEM:-4GB}
mkdir -p "$OUT"
# shellcheck source=test/gpu/cluster_lib.sh
source "$(dirname "$0")/cluster_lib.sh"
trap stop_servers EXIT

setup_postgres "$KIT" pgvector
say "data: $ROWS x 3072 and $ROWS x 4000 (numpy)"
mkdir -p "$W/d3072" "$W/d4000"
$PY "$W/gpuivf_device.py" gen "$W/d3072" "$ROWS" 3072 "$NQ" || exit 1
$PY "$W/gpuivf_device.py" gen "$W/d4000" "$ROWS" 4000 "$NQ" || exit 1
if [ -n "${WIDE:-}" ]; then
	mkdir -p "$W/d16000" && $PY "$W/gpuivf_device.py" gen "$W/d16000" "$ROWS_WIDE" 16000 "$NQ" || exit 1
fi
chown -R "$PGUSER_OS" "$W"

# PostgreSQL's own max_connections, checkpoint_timeout and log_line_prefix
# rather than the common ones of start_server
start_server pg "$PORT" "listen_addresses = ''" "shared_preload_libraries = 'gpuivf'" \
	"max_connections = 100" "checkpoint_timeout = 5min" "log_line_prefix = '%m [%p] '" "log_min_messages = warning"
sleep 2
sql "CREATE EXTENSION gpuivf_vector CASCADE;" || exit 1
say "worker: $(sql "SELECT worker || ' ' || state || ' ' || coalesce(device_name, '') || ' ' || coalesce(message, '') FROM gpuivf_stat")"

wstat() { sql "SELECT queries || ' ' || builds || ' ' || cpu_fallbacks || ' ' || errors FROM gpuivf_stat WHERE worker = 0"; }

# per-query ids (and distances) of table.col ORDER BY col <op> query LIMIT 10
results() {          # table type settings file
	local f="$W/q_$1.sql"
	echo "SET client_min_messages = warning; $3" > "$f"
	for ((q = 0; q < NQ; q++)); do
		echo "SELECT $q, array_agg(id ORDER BY d, id), array_agg(d ORDER BY d, id) FROM (SELECT id, v <-> (SELECT v::$2 FROM queries_$1 WHERE qid = $q) AS d FROM $1 ORDER BY v <-> (SELECT v::$2 FROM queries_$1 WHERE qid = $q) LIMIT 10) s;" >> "$f"
	done
	sqlf "$f" > "$4"
}

SUMMARY=()
check() {            # table type dims lists datadir
	local t=$1 type=$2 dims=$3 lists=$4 dir=$5 t0 t1 b0 b1 q0 q1 build
	say "$t: loading $type"
	sql "CREATE TABLE ${t}_raw (id bigint, v real[]);
	     COPY ${t}_raw FROM '$dir/base.bin' WITH (FORMAT binary);
	     CREATE TABLE $t AS SELECT id, v::$type AS v FROM ${t}_raw;
	     DROP TABLE ${t}_raw;
	     CREATE TABLE queries_$t (qid bigint, v real[]);
	     COPY queries_$t FROM '$dir/queries.bin' WITH (FORMAT binary);
	     VACUUM ANALYZE $t;" || return 1
	b0=$(wstat | awk '{print $2}')
	t0=$(date +%s.%N)
	sql "SET gpuivf.device = gpu; CREATE INDEX ${t}_idx ON $t USING gpuivf (v) WITH (lists = $lists);" || return 1
	t1=$(date +%s.%N)
	b1=$(wstat | awk '{print $2}')
	build=$(awk "BEGIN { printf \"%.1f\", $t1 - $t0 }")
	local info
	info=$(sql "SELECT concat_ws(' ', gpuivf_index_info('${t}_idx') ->> 'rerank_from', gpuivf_index_info('${t}_idx') ->> 'storage', pg_size_pretty(pg_relation_size('${t}_idx')))")
	say "$t: CREATE INDEX on the GPU worker ${build}s ($((b1 - b0)) build requests): re-rank from / storage / size: $info"

	local ptype=${type%%(*}
	results "$t" "$ptype" "SET enable_indexscan = off; SET enable_bitmapscan = off;" "$W/r_${t}_seq.txt"
	results "$t" "$ptype" "SET enable_seqscan = off; SET gpuivf.probes = $lists;" "$W/r_${t}_exact.txt"
	local exact
	exact=$($PY "$W/gpuivf_device.py" compare "$W/r_${t}_exact.txt" "$W/r_${t}_seq.txt")
	say "$t: exact mode vs sequential scan: $exact"

	q0=$(wstat | awk '{print $1}')
	results "$t" "$ptype" "SET enable_seqscan = off; SET gpuivf.device = gpu;" "$W/r_${t}_gpu.txt"
	q1=$(wstat | awk '{print $1}')
	results "$t" "$ptype" "SET enable_seqscan = off; SET gpuivf.device = cpu;" "$W/r_${t}_cpu.txt"
	local same recall dev
	same=$($PY "$W/gpuivf_device.py" compare "$W/r_${t}_gpu.txt" "$W/r_${t}_cpu.txt")
	recall=$($PY "$W/gpuivf_device.py" recall "$W/r_${t}_gpu.txt" "$W/r_${t}_seq.txt")
	dev=$(sql "SET enable_seqscan = off; SET gpuivf.device = gpu; EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) SELECT id FROM $t ORDER BY v <-> (SELECT v::$ptype FROM queries_$t WHERE qid = 0) LIMIT 10;" | grep -E 'Device|Probes:|Re-ranked' | tr -s ' ' | tr '\n' ';')
	say "$t: on the GPU: $((q1 - q0)) worker queries; $dev GPU vs CPU: $same; recall@10 $recall"
	SUMMARY+=("| $t | $type | $build s | $info | $exact | $((q1 - q0)) of $NQ | $same | $recall |")
}

check v3072 'vector(3072)' 3072 "${LISTS:-200}" "$W/d3072"
check h4000 'halfvec(4000)' 4000 "${LISTS:-200}" "$W/d4000"
[ -n "${WIDE:-}" ] && check r16000 'real[]' 16000 "${LISTS_WIDE:-70}" "$W/d16000"

cp "$W/pg/server.log" "$OUT/" 2>/dev/null
stop_servers
echo
echo "| table | type | CREATE INDEX (GPU) | re-rank from / storage / index size | exact mode vs seq scan | queries on the GPU | GPU vs CPU | recall@10 |"
echo "|---|---|---|---|---|---|---|---|"
for line in "${SUMMARY[@]}"; do echo "$line"; done
