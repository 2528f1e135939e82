#!/usr/bin/env bash
# test/gpu/citus.sh — gpuivf under Citus with one Citus worker per GPU,
# against a single node with one GPU, on one multi-GPU machine:
#   single node   one server, its GPU worker on GPU 0: the table, CREATE
#                 INDEX on the GPU, ANALYZE, recall@10 of NQ queries against
#                 the exact top-10, QPS at 1/16/64 pgbench clients; then it
#                 stops (its GPU memory and cores are free for Citus);
#   Citus         a coordinator (no GPU worker) and one worker per GPU (its
#                 gpuivf GPU worker on that GPU, gpuivf.devices), the table
#                 distributed by id (SHARDS_PER_WORKER shards a worker), the
#                 queries a reference table; CREATE INDEX ... WITH
#                 (target_recall = 0.95) through the coordinator (each shard
#                 built and calibrated on its worker's GPU), ANALYZE; exact
#                 mode (SET LOCAL gpuivf.probes, propagated) against the
#                 exact top-10 for NQ_EXACT queries; recall@10 with the
#                 automatic probes; QPS through the coordinator at 1/16/64
#                 clients, with each worker's GPU searches (gpuivf_stat).
# Prints a table last.  All servers share the host's cores: the Citus rows
# pay for the coordinator's planning, its connections to the workers and the
# workers' statements on the same cores as the single node's.
#
# On the GPU machine (nvidia-h200-x2 or -x4), from the repository root:
#   bash test/gpu/pack_citus.sh .device-worker      # here, once: Citus into the kit
#   bash test/gpu/citus.sh .device-worker           # there
# Environment: ROWS (1000000), DIMS (128), NQ (1000), NQ_EXACT (100),
# CLIENTS ("1 16 64"), BENCH_S (6), SHARDS_PER_WORKER (1), GPUS (all that
# nvidia-smi lists), MODE (both | single | citus: one of the two halves, for
# 10M rows, whose load and builds need more than one 10-minute command).
# About 3 minutes at 1M x 128 on two H200s.
# A dry run on the development machine with the CPU stand-in engine (Citus
# installed into the PostgreSQL that pg_config names):
#   GPUIVF_LOCAL=1 GPUIVF_FAKE_DEVICES=2 ENGINE=$PWD/build/gpuivf_fake_gpu.so \
#     ROWS=20000 DIMS=32 NQ=100 NQ_EXACT=20 BENCH_S=2 bash test/gpu/citus.sh
set -u
KIT=${1:-.device-worker}
ROWS=${ROWS:-1000000}
DIMS=${DIMS:-128}
NQ=${NQ:-1000}
NQ_EXACT=${NQ_EXACT:-100}
CLIENTS=${CLIENTS:-1 16 64}
SHARDS_PER_WORKER=${SHARDS_PER_WORKER:-1}
MODE=${MODE:-both}
W=${W:-/tmp/gpuivf-citus}
# shellcheck source=test/gpu/cluster_lib.sh
source "$(dirname "$0")/cluster_lib.sh"
trap stop_servers EXIT
PS=5471     # single node
PC=5480     # coordinator; workers PC+1 ...

setup_postgres "$KIT"
if [ -z "${GPUIVF_LOCAL:-}" ]; then
	[ -f "$KIT/citus/lib/citus.so" ] || { echo "error: no Citus in $KIT/citus (run test/gpu/pack_citus.sh $KIT on the development machine)" >&2; exit 1; }
	cp -r "$KIT/citus/lib/." "$(pg_config --pkglibdir)/"
	cp "$KIT/citus/extension/"* "$(pg_config --sharedir)/extension/"
	cp "$KIT/citus/deps/"* /opt/pgkit/lib/ 2>/dev/null
	GPUS=${GPUS:-$(nvidia-smi -L | grep -c '^GPU')}
else
	GPUS=${GPUS:-${GPUIVF_FAKE_DEVICES:-1}}
fi
say "data: $ROWS x $DIMS, $NQ queries, exact top-10; $GPUS GPUs"
make_data "$W" "$ROWS" "$DIMS" "$NQ"
KNN=$(knn_script items)
: > "$W/bench.txt"
: > "$W/summary.txt"
note() { echo "$*" | tee -a "$W/summary.txt"; }
timed() {   # port sql -> seconds
	local t0
	t0=$(date +%s.%N)
	sqlp "$1" "$2" >/dev/null || exit 1
	awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t0 }"
}
LOAD_SQL="CREATE TABLE queries (qid bigint PRIMARY KEY, v real[]);
	COPY queries FROM '$W/queries.bin' WITH (FORMAT binary);"
COPY_SQL="COPY items FROM '$W/base.bin' WITH (FORMAT binary);"
# the recall target with the index (where the build has the option; 0.95 is
# also gpuivf.target_recall's default)
INDEX_SQL="CREATE INDEX items_v ON items USING gpuivf (v) WITH (target_recall = 0.95);"
build_index() {   # port [settings] -> seconds
	local t
	t=$(timed "$1" "${2:-} $INDEX_SQL" 2>/dev/null) || t=$(timed "$1" "${2:-} ${INDEX_SQL/ WITH (target_recall = 0.95)/}")
	echo "$t"
}
GPU="SET gpuivf.device = gpu;"

# --------------------------------------------------------- single node
if [ "$MODE" != citus ]; then
	say "single node, GPU 0"
	start_server single $PS "shared_preload_libraries = 'gpuivf'" "gpuivf.devices = '0'"
	sqlp $PS "CREATE EXTENSION gpuivf; $LOAD_SQL CREATE TABLE items (id bigint, v real[]);" || exit 1
	T_COPY=$(timed $PS "$COPY_SQL VACUUM ANALYZE items; VACUUM ANALYZE queries;")
	T_INDEX=$(build_index $PS "$GPU")
	T_ANALYZE=$(timed $PS "ANALYZE items")
	query_results $PS items "$GPU" "$W/r_single.txt" "$NQ"
	R_SINGLE=$(recall "$W/r_single.txt")
	note "single node: COPY ${T_COPY}s, CREATE INDEX ${T_INDEX}s, ANALYZE ${T_ANALYZE}s, $(sqlp $PS "SELECT format('%s lists, %s probes', i->>'lists', i->'probes'->>'in_use') FROM (SELECT gpuivf_index_info('items_v') i) s"), recall@10 $R_SINGLE"
	for c in $CLIENTS; do
		read -r tps p50 p99 <<< "$(pgbench_tps $PS "$c" "$KNN" "single_$c" "-c gpuivf.device=gpu")"
		echo "single node, 1 GPU|$c|$tps|$p50|$p99" | tee -a "$W/bench.txt"
	done
	as_pg "pg_ctl -D $W/single/data -m fast -w stop >/dev/null"
fi

# ---------------------------------------------------------------- Citus
if [ "$MODE" != single ]; then
	CITUS_CONF=("citus.node_conninfo = 'sslmode=disable'" "citus.max_cached_conns_per_worker = 4")
	start_server coordinator $PC "shared_preload_libraries = 'citus'" "${CITUS_CONF[@]}"
	for ((g = 0; g < GPUS; g++)); do
		start_server "worker$g" $((PC + 1 + g)) "shared_preload_libraries = 'citus,gpuivf'" \
			"gpuivf.devices = '$g'" "${CITUS_CONF[@]}"
		sqlp $((PC + 1 + g)) "CREATE EXTENSION citus; CREATE EXTENSION gpuivf;" || exit 1
	done
	sqlp $PC "CREATE EXTENSION citus; CREATE EXTENSION gpuivf;
		SELECT citus_set_coordinator_host('127.0.0.1', $PC);" >/dev/null || exit 1
	for ((g = 0; g < GPUS; g++)); do
		sqlp $PC "SELECT citus_add_node('127.0.0.1', $((PC + 1 + g)))" >/dev/null || exit 1
	done
	sqlp $PC "$LOAD_SQL SELECT create_reference_table('queries');
		CREATE TABLE items (id bigint, v real[]);
		SELECT create_distributed_table('items', 'id', shard_count := $((GPUS * SHARDS_PER_WORKER)));" >/dev/null || exit 1
	C_COPY=$(timed $PC "$COPY_SQL VACUUM ANALYZE items;")
	C_INDEX=$(build_index $PC)
	C_ANALYZE=$(timed $PC "ANALYZE items")
	SHARDS=$(sqlp $PC "SELECT string_agg(format('shard %s on port %s: %s lists, %s probes (%s)', shardid, nodeport, i->>'lists', i->'probes'->>'in_use', coalesce(i->'probes'->>'target_source', 'gpuivf.target_recall')), '; ') FROM (SELECT shardid, nodeport, result::jsonb i FROM run_command_on_shards('items', \$\$SELECT gpuivf_index_info(x.indexrelid) FROM pg_index x WHERE x.indrelid = '%1\$s'::regclass\$\$) JOIN citus_shards USING (shardid)) s")
	DEVICES=$(sqlp $PC "SELECT string_agg(format('port %s: %s', nodeport, result), '; ' ORDER BY nodeport) FROM run_command_on_workers(\$\$SELECT format('GPU %s (%s)', device, device_name) FROM gpuivf_stat\$\$)")
	note "Citus: $GPUS workers, $((GPUS * SHARDS_PER_WORKER)) shards; COPY through the coordinator ${C_COPY}s, CREATE INDEX ${C_INDEX}s, ANALYZE ${C_ANALYZE}s"
	note "  $SHARDS"
	note "  GPU workers: $DEVICES"

	# exact mode through the coordinator equals the exact top-10
	LISTS=$(sqlp $PC "SELECT max((result::jsonb->>'lists')::int) FROM run_command_on_shards('items', \$\$SELECT gpuivf_index_info(x.indexrelid) FROM pg_index x WHERE x.indrelid = '%1\$s'::regclass\$\$)")
	query_results $PC items "SET citus.propagate_set_commands = local; BEGIN; SET LOCAL gpuivf.probes = $LISTS;" "$W/r_exact.txt" "$NQ_EXACT"
	head -n "$NQ_EXACT" "$W/gt.txt" > "$W/gt_exact.txt"
	EXACT=$($PY "$W/gpuivf_device.py" compare "$W/r_exact.txt" "$W/gt_exact.txt")
	note "Citus exact mode (probes = lists on every shard) vs the exact top-10: $EXACT"

	query_results $PC items "$GPU" "$W/r_citus.txt" "$NQ"
	R_CITUS=$(recall "$W/r_citus.txt")
	note "Citus recall@10 with the automatic probes (target 0.95 on every shard): $R_CITUS"
	gq() { sqlp $PC "SELECT string_agg(result, ' ' ORDER BY nodeport) FROM run_command_on_workers('SELECT queries FROM gpuivf_stat')"; }
	for c in $CLIENTS; do
		g0=$(gq)
		read -r tps p50 p99 <<< "$(pgbench_tps $PC "$c" "$KNN" "citus_$c" "-c gpuivf.device=gpu")"
		g1=$(gq)
		echo "Citus, $GPUS workers x 1 GPU|$c|$tps|$p50|$p99" | tee -a "$W/bench.txt"
		say "  GPU searches per worker over that run: $(echo "$g0|$g1" | awk -F'|' '{ n = split($1, a, " "); split($2, b, " "); for (i = 1; i <= n; i++) printf "%d ", b[i] - a[i] }')"
	done
fi
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader 2>/dev/null | sed 's/^/  GPU memory used: /'

echo
echo "================================ Citus vs a single node: summary ================================"
echo "data      $ROWS x $DIMS generated, $NQ queries; $GPUS GPUs"
cat "$W/summary.txt"
echo
echo "| setup | clients | QPS | p50 (ms) | p99 (ms) |"
echo "|---|---:|---:|---:|---:|"
md_rows "$W/bench.txt"
echo "elapsed $(( $(date +%s) - started ))s"
