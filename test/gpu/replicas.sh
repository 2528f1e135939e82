#!/usr/bin/env bash
# test/gpu/replicas.sh — GPU read replicas on a two-GPU machine: a primary
# whose GPU worker serves GPU 0 and a streaming hot standby (pg_basebackup)
# whose GPU worker serves GPU 1 (gpuivf.devices), on one host.
#   1. ROWS x DIMS generated vectors, CREATE INDEX on the primary's GPU,
#      ANALYZE; the standby replays it all;
#   2. the standby's GPU answers equal the primary's (NQ queries, ids and
#      distances), recall@10 of both against the exact top-10;
#   3. a row inserted on the primary is found by the standby's GPU once
#      replayed;
#   4. read QPS (pgbench, prepared kNN statements, BENCH_S s each): the
#      primary alone at 1/16/64 clients, the standby alone at 64, and both at
#      once (64 + 64 clients, and 32 + 32), each server's own GPU doing its
#      searches (gpuivf_stat);
# and prints a table last.  Both servers share the host's CPU cores: on one
# machine the pair is bounded by the cores, which a standby on its own
# machine would not share.
#
# On the GPU machine (nvidia-h200-x2 or nvidia-h100-x2), from the repository
# root, with the kit folder of test/gpu/worker_end_to_end.sh:
#   bash test/gpu/replicas.sh .device-worker
# Environment: ROWS (1000000), DIMS (128), NQ (1000), BENCH_S (6).
# A dry run on the development machine with the CPU stand-in engine:
#   GPUIVF_LOCAL=1 GPUIVF_FAKE_DEVICES=2 ENGINE=$PWD/build/gpuivf_fake_gpu.so \
#     ROWS=20000 DIMS=32 NQ=100 BENCH_S=2 bash test/gpu/replicas.sh
# About 3 minutes at 1M x 128 on the H200 pair.
set -u
KIT=${1:-.device-worker}
ROWS=${ROWS:-1000000}
DIMS=${DIMS:-128}
NQ=${NQ:-1000}
W=${W:-/tmp/gpuivf-replicas}
# shellcheck source=test/gpu/cluster_lib.sh
source "$(dirname "$0")/cluster_lib.sh"
trap stop_servers EXIT
P1=5451
P2=5452

setup_postgres "$KIT"
say "data: $ROWS x $DIMS, $NQ queries, exact top-10"
make_data "$W" "$ROWS" "$DIMS" "$NQ"

say "primary (GPU 0)"
start_server primary $P1 "shared_preload_libraries = 'gpuivf'" "gpuivf.devices = '0'" \
	"wal_level = replica" "max_wal_senders = 4" "hot_standby_feedback = on"
sqlp $P1 "CREATE EXTENSION gpuivf;
	CREATE TABLE items (id bigint, v real[]);
	COPY items FROM '$W/base.bin' WITH (FORMAT binary);
	CREATE TABLE queries (qid bigint PRIMARY KEY, v real[]);
	COPY queries FROM '$W/queries.bin' WITH (FORMAT binary);
	VACUUM ANALYZE items; VACUUM ANALYZE queries;" || exit 1
t0=$(date +%s.%N)
sqlp $P1 "SET gpuivf.device = gpu; CREATE INDEX items_v ON items USING gpuivf (v);" || exit 1
BUILD=$(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t0 }")
sqlp $P1 "ANALYZE items;"
say "CREATE INDEX on GPU 0: ${BUILD}s; $(sqlp $P1 "SELECT format('%s lists, probes %s (%s)', i->>'lists', i->'probes'->>'in_use', i->'probes'->>'source') FROM (SELECT gpuivf_index_info('items_v') i) s")"

say "standby (GPU 1): pg_basebackup"
mkdir -p "$W/standby" && chown "$PGUSER_OS" "$W/standby"
t0=$(date +%s.%N)
as_pg "pg_basebackup -h $W -p $P1 -U postgres -D $W/standby/data -R -X stream -c fast" || exit 1
BACKUP=$(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t0 }")
{
	echo "port = $P2"
	echo "gpuivf.devices = '1'"
} >> "$W/standby/data/postgresql.conf"
as_pg "pg_ctl -D $W/standby/data -l $W/standby/server.log -w start >/dev/null" || { cat "$W/standby/server.log"; exit 1; }
caught_up() {
	local lsn
	lsn=$(sqlp $P1 "SELECT pg_current_wal_lsn()")
	for _ in $(seq 1 600); do
		[ "$(sqlp $P2 "SELECT pg_last_wal_replay_lsn() >= '$lsn'")" = t ] && return 0
		sleep 0.1
	done
	return 1
}
caught_up || { echo "the standby did not catch up"; exit 1; }
say "standby replaying (base backup ${BACKUP}s); recovery: $(sqlp $P2 "SELECT pg_is_in_recovery()")"
for p in $P1 $P2; do
	for _ in $(seq 1 100); do
		[ "$(sqlp $p "SELECT count(*) FROM gpuivf_stat WHERE state = 'ready'")" = 1 ] && break
		sleep 0.2
	done
done
WORKERS="primary: $(sqlp $P1 "SELECT format('worker on GPU %s (%s)', device, device_name) FROM gpuivf_stat"); standby: $(sqlp $P2 "SELECT format('worker on GPU %s (%s)', device, device_name) FROM gpuivf_stat")"
say "$WORKERS"

# ------------------------------------------------- answers and recall
GPU="SET gpuivf.device = gpu; SET enable_seqscan = off;"
query_results $P1 items "$GPU" "$W/r_primary.txt" "$NQ"
t0=$(date +%s.%N)
query_results $P2 items "$GPU" "$W/r_standby.txt" "$NQ"
LOAD=$(sqlp $P2 "SELECT loads || ' load(s), ' || queries || ' queries' FROM gpuivf_stat")
SAME=$($PY "$W/gpuivf_device.py" compare "$W/r_standby.txt" "$W/r_primary.txt")
RECALL_P=$(recall "$W/r_primary.txt")
RECALL_S=$(recall "$W/r_standby.txt")
say "standby vs primary: $SAME; recall@10 primary $RECALL_P, standby $RECALL_S; standby's worker: $LOAD"

# ------------------------------------------------------- replayed insert
r0=$(sqlp $P2 "SELECT refreshes FROM gpuivf_stat")
sqlp $P1 "INSERT INTO items SELECT -1, v FROM queries WHERE qid = 7;"
caught_up
FRESH=$(sqlp $P2 "$GPU SELECT id FROM items ORDER BY v <-> (SELECT v FROM queries WHERE qid = 7) LIMIT 1")
r1=$(sqlp $P2 "SELECT refreshes FROM gpuivf_stat")
say "row inserted on the primary, found on the standby's GPU once replayed: id $FRESH (want -1), refreshes $r0 -> $r1"
sqlp $P1 "DELETE FROM items WHERE id = -1;"
caught_up

# ------------------------------------------------------------- QPS
KNN=$(knn_script items)
OPTS="-c gpuivf.device=gpu"
: > "$W/bench.txt"
row() { echo "$*" | tee -a "$W/bench.txt"; }
wq() { sqlp "$1" "SELECT queries FROM gpuivf_stat"; }
for c in 1 16 64; do
	read -r tps p50 p99 <<< "$(pgbench_tps $P1 "$c" "$KNN" "primary_$c" "$OPTS")"
	row "primary alone|$c|$tps|$p50|$p99"
done
read -r tps p50 p99 <<< "$(pgbench_tps $P2 64 "$KNN" standby_64 "$OPTS")"
row "standby alone|64|$tps|$p50|$p99"
for c in 64 32; do
	q1=$(wq $P1); q2=$(wq $P2)
	pgbench_tps $P1 "$c" "$KNN" "both_p_$c" "$OPTS" > "$W/both_p.txt" &
	pgbench_tps $P2 "$c" "$KNN" "both_s_$c" "$OPTS" > "$W/both_s.txt" &
	wait
	read -r tp pp50 pp99 < "$W/both_p.txt"
	read -r ts sp50 sp99 < "$W/both_s.txt"
	row "both at once: primary|$c|$tp|$pp50|$pp99"
	row "both at once: standby|$c|$ts|$sp50|$sp99"
	row "both at once: sum|$((2 * c))|$((tp + ts))||"
	say "GPU searches over that run: primary's worker $(( $(wq $P1) - q1 )), standby's $(( $(wq $P2) - q2 ))"
done
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader 2>/dev/null | sed 's/^/  GPU memory used: /'

echo
echo "================================ GPU read replicas: summary ================================"
echo "data                $ROWS x $DIMS generated, $NQ queries; CREATE INDEX on GPU 0 ${BUILD}s; base backup ${BACKUP}s"
echo "workers             $WORKERS"
echo "standby vs primary  $SAME"
echo "recall@10           primary $RECALL_P, standby $RECALL_S (automatic probes, target 0.95)"
echo "replayed insert     standby's GPU found id $FRESH (want -1); its copy caught up: refreshes $r0 -> $r1"
echo
echo "| servers | clients | QPS | p50 (ms) | p99 (ms) |"
echo "|---|---:|---:|---:|---:|"
md_rows "$W/bench.txt"
echo "elapsed $(( $(date +%s) - started ))s"
