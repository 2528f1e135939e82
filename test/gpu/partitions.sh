#!/usr/bin/env bash
# test/gpu/partitions.sh — a partitioned table against one table with the
# same rows, on one GPU: PARTS hash partitions of ROWS / PARTS rows each vs
# one table of ROWS rows, the same queries.
#   1. CREATE INDEX on both through the GPU worker (automatic options: at
#      1.6M rows sqrt(rows) lists for the table, rows/1000 per partition),
#      ANALYZE (every partition calibrated);
#   2. recall@10 of both against the exact top-10 (automatic probes, target
#      0.95), and the answers of one partition alone (a tenant's query);
#   3. QPS (pgbench, prepared kNN statements, BENCH_S s each) at 1/16/64
#      clients: the table, the partitioned table (a Merge Append of PARTS
#      GPU searches a statement, one after the other), one partition;
#      DEVS="gpu cpu" adds the CPU engine's rows;
#   4. a batched LATERAL join of all queries over each (GpuivfBatchKnn: one
#      search call per index for the whole chunk);
#   5. where a statement over the partitions spends its time: GPU requests
#      per statement and the worker's mean batch (gpuivf_stat).
# Prints a table last.
#
# On the GPU machine (nvidia-h200 or nvidia-h100-x1), from the repository
# root, with the kit folder of test/gpu/worker_end_to_end.sh:
#   bash test/gpu/partitions.sh .device-worker
# Environment: ROWS (1600000), PARTS (16), DIMS (128), NQ (1000), BENCH_S
# (6), DEVS ("gpu").  About 4 minutes at 1.6M x 128 (5 with DEVS="gpu cpu").
# On the development machine (CPU engine; the CPU stand-in as "GPU"):
#   GPUIVF_LOCAL=1 ENGINE=$PWD/build/gpuivf_fake_gpu.so ROWS=160000 DIMS=64 \
#     NQ=200 BENCH_S=3 DEVS="gpu cpu" bash test/gpu/partitions.sh
set -u
KIT=${1:-.device-worker}
ROWS=${ROWS:-1600000}
PARTS=${PARTS:-16}
DIMS=${DIMS:-128}
NQ=${NQ:-1000}
DEVS=${DEVS:-gpu}
W=${W:-/tmp/gpuivf-partitions}
# shellcheck source=test/gpu/cluster_lib.sh
source "$(dirname "$0")/cluster_lib.sh"
trap stop_servers EXIT
P=5461

setup_postgres "$KIT"
say "data: $ROWS x $DIMS, $NQ queries, exact top-10"
make_data "$W" "$ROWS" "$DIMS" "$NQ"
start_server one $P "shared_preload_libraries = 'gpuivf'" "gpuivf.devices = '0'" "max_locks_per_transaction = 256"
{
	echo "CREATE EXTENSION gpuivf;"
	echo "CREATE TABLE items (id bigint, v real[]);"
	echo "COPY items FROM '$W/base.bin' WITH (FORMAT binary);"
	echo "CREATE TABLE parts (id bigint, v real[]) PARTITION BY HASH (id);"
	for ((i = 0; i < PARTS; i++)); do
		echo "CREATE TABLE parts_$i PARTITION OF parts FOR VALUES WITH (MODULUS $PARTS, REMAINDER $i);"
	done
	echo "COPY parts FROM '$W/base.bin' WITH (FORMAT binary);"
	echo "CREATE TABLE queries (qid bigint PRIMARY KEY, v real[]);"
	echo "COPY queries FROM '$W/queries.bin' WITH (FORMAT binary);"
	echo "VACUUM ANALYZE items; VACUUM ANALYZE parts; VACUUM ANALYZE queries;"
} > "$W/load.sql"
sqlfp $P "$W/load.sql" || exit 1

build() {   # table -> seconds
	local t0
	t0=$(date +%s.%N)
	sqlp $P "SET gpuivf.device = gpu; CREATE INDEX ${1}_v ON $1 USING gpuivf (v);" >/dev/null || exit 1
	awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t0 }"
}
BUILD_ONE=$(build items)
BUILD_PARTS=$(build parts)
sqlp $P "ANALYZE items; ANALYZE parts;"
OPTIONS_ONE=$(sqlp $P "SELECT format('%s lists, %s probes', i->>'lists', i->'probes'->>'in_use') FROM (SELECT gpuivf_index_info('items_v') i) s")
OPTIONS_PART=$(sqlp $P "SELECT format('%s lists, %s probes', i->>'lists', i->'probes'->>'in_use') FROM (SELECT gpuivf_index_info(x.indexrelid) i FROM pg_index x WHERE x.indrelid = 'parts_0'::regclass) s")
say "CREATE INDEX: table ${BUILD_ONE}s ($OPTIONS_ONE); $PARTS partitions ${BUILD_PARTS}s (each $OPTIONS_PART)"
PLAN=$(sqlp $P "SET gpuivf.device = gpu; EXPLAIN (ANALYZE, COSTS OFF, SUMMARY OFF) SELECT id FROM parts ORDER BY v <-> (SELECT v FROM queries WHERE qid = 1) LIMIT 10")
echo "$PLAN" | head -24

# ------------------------------------------------------------ recall
: > "$W/recall.txt"
for dev in $DEVS; do
	for t in items parts; do
		query_results $P $t "SET gpuivf.device = $dev; SET enable_seqscan = off;" "$W/r_${dev}_$t.txt" "$NQ"
		echo "$dev|$t|$(recall "$W/r_${dev}_$t.txt")" >> "$W/recall.txt"
	done
done
SAME=$($PY "$W/gpuivf_device.py" compare "$W/r_$(echo $DEVS | awk '{print $1}')_parts.txt" "$W/r_$(echo $DEVS | awk '{print $1}')_items.txt")
say "recall@10: $(tr '\n' ' ' < "$W/recall.txt"); partitions vs table: $SAME"

# --------------------------------------------------------------- QPS
: > "$W/bench.txt"
wstat() { sqlp $P "SELECT requests || ' ' || queries || ' ' || batches FROM gpuivf_stat WHERE worker = 0"; }
for dev in $DEVS; do
	for t in items parts parts_0; do
		script=$(knn_script $t)
		for c in 1 16 64; do
			[ "$t" = parts_0 ] && [ "$c" != 64 ] && continue
			s0=$(wstat)
			read -r tps p50 p99 <<< "$(pgbench_tps $P "$c" "$script" "${dev}_${t}_$c" "-c gpuivf.device=$dev")"
			s1=$(wstat)
			per=$(echo "$s0 $s1 $tps $BENCH_S" | awk '{ n = $7 * $8; if (n > 0 && $6 > $3) printf "%.1f requests, batch %.1f", ($4 - $1) / n, ($5 - $2) / ($6 - $3); else print "-" }')
			[ "$dev" = cpu ] && per="-"
			echo "$dev|$t|$c|$tps|$p50|$p99|$per" | tee -a "$W/bench.txt"
		done
	done
done

# ------------------------------------------------------- batched join
: > "$W/join.txt"
for t in items parts; do
	t0=$(date +%s.%N)
	n=$(sqlp $P "SET gpuivf.device = gpu; SELECT count(*) FROM queries q CROSS JOIN LATERAL (SELECT i.id FROM $t i ORDER BY i.v <-> q.v LIMIT 10) n")
	echo "$t|$n|$(awk "BEGIN { printf \"%.3f\", $(date +%s.%N) - $t0 }")" >> "$W/join.txt"
done
say "batched LATERAL join of $NQ queries: $(tr '\n' ' ' < "$W/join.txt")"

echo
echo "================================ partitions vs one table: summary ================================"
echo "data          $ROWS x $DIMS generated, $NQ queries; $PARTS hash partitions of $((ROWS / PARTS)) rows"
echo "CREATE INDEX  table ${BUILD_ONE}s ($OPTIONS_ONE); partitions ${BUILD_PARTS}s (each $OPTIONS_PART)"
echo "answers       partitions vs table: $SAME"
echo "LATERAL join  (rows, seconds): $(tr '\n' ' ' < "$W/join.txt")"
echo
echo "| device | table | recall@10 |"
echo "|---|---|---:|"
md_rows "$W/recall.txt"
echo
echo "| device | table | clients | QPS | p50 (ms) | p99 (ms) | GPU requests a statement, mean batch |"
echo "|---|---|---:|---:|---:|---:|---|"
md_rows "$W/bench.txt"
echo "elapsed $(( $(date +%s) - started ))s"
