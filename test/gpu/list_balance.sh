#!/bin/bash
# test/gpu/list_balance.sh — how a lone query's GPU latency follows the
# index's largest lists.  GPU-built indexes of the same vectors that differ
# only in the luck of their training: table s1 holds the generated vectors,
# s2 and s4 the same vectors times 2 and 4 (exact in float: the same
# neighbours, the same scan work per code, but other values, so the
# value-hashed training sample and the k-means local optimum differ).  For
# each index: its list sizes and the scan work of the queries at PROBES
# (gpuivf_device.py lists: the codes of the probed lists, and the largest
# probed list, the longest block of a lone query's scan, which gives every
# probed list a block of its own), then two rounds of 1-client pgbench over
# the indexes in turn (TPS, p50/p99 ms) with gpuivf.probes fixed.  A gap in
# latency that follows "largest probed list" within one build of gpuivf is
# the index, not the code.
#
# On the device (from the repo root; KIT as for cluster_lib.sh):
#   bash test/gpu/list_balance.sh .device-worker
# Variables: ROWS (1000000), DIMS (128), NQ (1000), LISTS (1000), SCALES (1 2 4),
# PROBES (32), BENCH_S (10), PORT (5440), W, OUT (/tmp/gpuivf-device-out).
# Locally, a dry run with the CPU stand-in engine:
#   GPUIVF_LOCAL=1 ENGINE=build/gpuivf_fake_gpu.so ROWS=20000 LISTS=100 PROBES=8 BENCH_S=2 \
#     bash test/gpu/list_balance.sh
set -u
KIT=${1:-.device-worker}
ROWS=${ROWS:-1000000}
DIMS=${DIMS:-128}
NQ=${NQ:-1000}
LISTS=${LISTS:-1000}
PROBES=${PROBES:-32}
BENCH_S=${BENCH_S:-10}
PORT=${PORT:-5440}
OUT=${OUT:-/tmp/gpuivf-device-out}
W=${W:-/tmp/gpuivf-list-balance}
mkdir -p "$OUT"
# shellcheck source=test/gpu/cluster_lib.sh
source "$(dirname "$0")/cluster_lib.sh"
trap stop_servers EXIT

setup_postgres "$KIT"
say "data: $ROWS x $DIMS clustered, $NQ queries"
make_data "$W" "$ROWS" "$DIMS" "$NQ"
start_server pg "$PORT" "shared_preload_libraries = 'gpuivf'" "log_min_messages = debug1"
SCALES=${SCALES:-1 2 4}
TABLES=""
sqlp "$PORT" "CREATE EXTENSION gpuivf;
CREATE TABLE base (id bigint, v real[]);
COPY base FROM '$W/base.bin' WITH (FORMAT binary);
CREATE TABLE queries (qid bigint PRIMARY KEY, v real[]);
COPY queries FROM '$W/queries.bin' WITH (FORMAT binary);" || exit 1
for f in $SCALES; do
	t=s$f
	TABLES="$TABLES $t"
	sqlp "$PORT" "CREATE TABLE $t AS SELECT id, array(SELECT x * $f::real FROM unnest(v) x)::real[] AS v FROM base;
CREATE TABLE queries_$t AS SELECT qid, array(SELECT x * $f::real FROM unnest(v) x)::real[] AS v FROM queries;
ALTER TABLE queries_$t ADD PRIMARY KEY (qid);" || exit 1
	sqlp "$PORT" "VACUUM ANALYZE $t; VACUUM ANALYZE queries_$t;" || exit 1
done
sqlp "$PORT" "DROP TABLE base;" || exit 1

for t in $TABLES; do
	say "GPU build of ${t}_idx"
	sqlp "$PORT" "SET gpuivf.device = gpu; CREATE INDEX ${t}_idx ON $t USING gpuivf (v) WITH (lists = $LISTS);" || exit 1
	printf '%s\n' "\\set q random(0, $((NQ - 1)))" \
		"SELECT id FROM $t ORDER BY v <-> (SELECT v FROM queries_$t WHERE qid = :q) LIMIT 10;" > "$W/knn_$t.sql"
	chown "$PGUSER_OS" "$W/knn_$t.sql"
done
sqlp "$PORT" "CHECKPOINT;" || exit 1
declare -A WORK
for t in $TABLES; do
	file=$(sqlp "$PORT" "SELECT current_setting('data_directory') || '/' || pg_relation_filepath('${t}_idx');")
	WORK[$t]=$($PY "$W/gpuivf_device.py" lists "$file" "$W/queries.bin" "$PROBES" "${t#s}")
	say "${t}_idx: ${WORK[$t]}"
done

# warm every index (first searches upload the indexes to the GPU)
for t in $TABLES; do
	sqlp "$PORT" "SET gpuivf.device = gpu; SET gpuivf.probes = $PROBES;
SELECT count(*) FROM (SELECT id FROM $t ORDER BY v <-> (SELECT v FROM queries_$t WHERE qid = 0) LIMIT 10) s;" >/dev/null
done
: > "$OUT/list_balance.txt"
for round in 1 2; do
	for t in $TABLES; do
		r=$(pgbench_tps "$PORT" 1 "$W/knn_$t.sql" "${t}_$round" "-c gpuivf.device=gpu -c gpuivf.probes=$PROBES")
		say "round $round ${t}_idx: tps p50 p99 = $r"
		echo "$t $round $r" >> "$OUT/list_balance.txt"
	done
done
cp "$W/pg/server.log" "$OUT/list_balance_server.log" 2>/dev/null

echo
echo "data $ROWS x $DIMS, lists $LISTS, probes $PROBES, LIMIT 10, 1 client, ${BENCH_S}s a round"
for t in $TABLES; do
	echo "${t}_idx  ${WORK[$t]}"
	awk -v t="$t" '$1 == t { printf "   round %s: %s TPS, p50 %s ms, p99 %s ms\n", $2, $3, $4, $5 }' "$OUT/list_balance.txt"
done
