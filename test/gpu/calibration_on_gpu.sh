#!/usr/bin/env bash
# test/gpu/calibration_on_gpu.sh — calibration on the workload, on the GPU
# machine: 1M x 128 generated rows whose queries come from another
# distribution (gpuivf_gen --query-*), the index calibrated on its rows vs on
# the recorded workload, and what recording queries costs.
#
#   1. data: ROWS x DIMS rows, NQ held-out queries and NCAL calibration
#      queries of one shifted distribution (disjoint), exact top-100 of the
#      held-out ones (gpuivf_gt);
#   2. CREATE INDEX on the GPU worker (it calibrates on rows);
#   3. calibrated on rows, then on the recorded workload (the NCAL queries run
#      through the index, recorded, then ANALYZE with gpuivf.analyze_sample =
#      NCAL): for each target (ALTER INDEX ... SET (target_recall)), the
#      probes chosen for LIMIT 10 and 100, held-out recall@10 and @100, and
#      QPS / p99 at each client count on the GPU path (pgbench, prepared
#      statements, a random held-out query per transaction; measured queries
#      are not recorded, gpuivf.query_sample = 0);
#   4. recording's cost: 64 clients, the workload-calibrated index at target
#      0.95, AB_ROUNDS alternating runs with gpuivf.query_sample = 0 (off) and
#      its default (on: every query offered to the reservoir); QPS and mean
#      latency of each, and the difference.
# It prints a table last; logs and the per-point numbers are in $OUT.
#
# Builds nothing: it installs a gpuivf.so and gpuivf_gpu.so built on the
# development machine, carried with PostgreSQL in a pgkit folder (see
# ../shared/device/README.md), the folder test/gpu/worker_end_to_end.sh uses:
#   KIT/pgkit.sh, KIT/pgkit.tar.xz, KIT/gpuivf.so, KIT/gpuivf_gpu.so
# (PostgreSQL's set-up: test/gpu/cluster_lib.sh; gpuivf_gen and gpuivf_gt are
# compiled here with g++).  On the device, from
# the repository root, as root:
#   bash test/gpu/calibration_on_gpu.sh .device-worker
# Locally, as a dry run against an installed build (PG_CONFIG) with the CPU
# stand-in of the GPU engine (make fake-gpu-engine):
#   GPUIVF_LOCAL=1 ENGINE=$PWD/build/gpuivf_fake_gpu.so ROWS=20000 DIMS=32 NQ=200 NCAL=300 \
#     LISTS=100 CLIENTS="1 4" BENCH_S=1 AB_S=1 AB_ROUNDS=1 bash test/gpu/calibration_on_gpu.sh
# Environment (defaults): ROWS (1000000), DIMS (128), NQ (1000), NCAL (1000),
# LISTS (1000), QGEN (the query distribution: '--query-clusters 1000
# --query-spread 1.5 --query-shift 1.5'), TARGETS ("0.90 0.95 0.99"), CLIENTS
# ("1 16 64"), BENCH_S (5 s a pgbench point), AB_S (8), AB_ROUNDS (3), DEVICE
# (gpu), RERANK (gpuivf.rerank_candidates; default automatic: 200, or the
# deeper re-rank ANALYZE measured), SHARED_BUFFERS (8GB), MAINTENANCE_WORK_MEM (4GB), PORT
# (5870), OUT (/tmp/gpuivf-calibration-out), W (work directory).
# About 5-6 minutes at the defaults on one H100/H200 (16 cores).
set -u
KIT=${1:-.device-worker}
OUT=${OUT:-/tmp/gpuivf-calibration-out}
ROWS=${ROWS:-1000000}
DIMS=${DIMS:-128}
NQ=${NQ:-1000}
NCAL=${NCAL:-1000}
LISTS=${LISTS:-1000}
QGEN=${QGEN:---query-clusters 1000 --query-spread 1.5 --query-shift 1.5}
TARGETS=${TARGETS:-0.90 0.95 0.99}
CLIENTS=${CLIENTS:-1 16 64}
BENCH_S=${BENCH_S:-5}
AB_S=${AB_S:-8}
AB_ROUNDS=${AB_ROUNDS:-3}
DEVICE=${DEVICE:-gpu}
PORT=${PORT:-5870}
W=${W:-/tmp/gpuivf-calibration-work}
SEED=42
SHARED_BUFFERS=${SHARED_BUFFERS:-8GB}
MAINTENANCE_WORK_MEM=${MAINTENANCE_WORK_MEM:-4GB}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
# shellcheck source=test/gpu/cluster_lib.sh
source "$(dirname "$0")/cluster_lib.sh"
trap stop_servers EXIT
setup_postgres "$KIT"

# ------------------------------------------------------------------ 1. data
say "tools"
g++ -O2 -std=c++17 -o "$W/gpuivf_gen" test/tools/gpuivf_gen.cpp || exit 1
g++ -O3 -march=native -std=c++17 -pthread -o "$W/gpuivf_gt" test/tools/gpuivf_gt.cpp || exit 1
say "data: $ROWS x $DIMS rows, $NQ held-out and $NCAL calibration queries ($QGEN)"
# shellcheck disable=SC2086
"$W/gpuivf_gen" --rows "$ROWS" --dims "$DIMS" --queries "$NQ" --seed $SEED $QGEN \
	--base "$W/base.bin" --base "$W/base.fvecs" --query "$W/held.bin" --query "$W/held.fvecs" >/dev/null || exit 1
# shellcheck disable=SC2086
"$W/gpuivf_gen" --rows "$ROWS" --dims "$DIMS" --queries "$NCAL" --seed $SEED $QGEN --query-first "$NQ" \
	--query "$W/calib.bin" >/dev/null || exit 1
"$W/gpuivf_gt" --base "$W/base.fvecs" --query "$W/held.fvecs" --k 100 --out "$W/gt.ivecs" >/dev/null || exit 1
rm -f "$W/base.fvecs"
cat > "$W/recall.py" <<'EOF'
import struct, sys
# recall.py GT.ivecs RESULTS K: RESULTS has one "{id,id,...}" line per query
d = open(sys.argv[1], 'rb').read(); gt = []; i = 0
while i < len(d):
    k = struct.unpack('<i', d[i:i + 4])[0]; gt.append(struct.unpack('<%di' % k, d[i + 4:i + 4 + 4 * k])); i += 4 + 4 * k
k = int(sys.argv[3]); rows = [l.strip() for l in open(sys.argv[2]) if l.startswith('{')]
hits = sum(len(set(int(x) for x in r.strip('{}').split(',') if x) & set(gt[q][:k])) for q, r in enumerate(rows))
print('%.4f' % (hits / (k * len(rows))))
EOF
chown -R "$PGUSER_OS" "$W"

start_server pg "$PORT" "listen_addresses = ''" "shared_preload_libraries = 'gpuivf'" "max_connections = 200" \
	${RERANK:+"gpuivf.rerank_candidates = $RERANK"}
sleep 2
sql "CREATE EXTENSION gpuivf;"
say "worker: $(sql "SELECT worker || ' ' || state || ' ' || coalesce(device_name, '') || ' ' || coalesce(message, '') FROM gpuivf_stat")"
sql "CREATE TABLE items (id bigint, v real[]);
     COPY items FROM '$W/base.bin' WITH (FORMAT binary);
     CREATE TABLE held (qid bigint PRIMARY KEY, v real[]);
     COPY held FROM '$W/held.bin' WITH (FORMAT binary);
     CREATE TABLE calib (qid bigint PRIMARY KEY, v real[]);
     COPY calib FROM '$W/calib.bin' WITH (FORMAT binary);
     VACUUM ANALYZE items; VACUUM ANALYZE held; VACUUM ANALYZE calib;" || exit 1
say "loaded"

# ------------------------------------------------------------- 2. the index
t0=$(date +%s.%N)
sql "SET gpuivf.device = $DEVICE; SET client_min_messages = debug1;
     CREATE INDEX items_idx ON items USING gpuivf (v) WITH (lists = $LISTS);" 2> "$W/build.log" || { cat "$W/build.log"; exit 1; }
BUILD=$(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t0 }")
say "CREATE INDEX ${BUILD}s: $(grep -ho 'calibrated on .*' "$W/build.log" | head -1)"
info() { sql "SELECT gpuivf_index_info('items_idx') #>> '{$1}'"; }

# held-out recall at LIMIT k (recording off): one psql session of NQ queries
recall() {   # k
	local f="$W/held_$1.sql"
	echo "SET gpuivf.device = $DEVICE; SET gpuivf.query_sample = 0; SET enable_seqscan = off;" > "$f"
	for ((q = 0; q < NQ; q++)); do
		echo "SELECT ARRAY(SELECT id FROM items ORDER BY v <-> (SELECT v FROM held WHERE qid = $q) LIMIT $1);" >> "$f"
	done
	sqlf "$f" > "$W/held_$1.out" || return 1
	python3 "$W/recall.py" "$W/gt.ivecs" "$W/held_$1.out" "$1"
}
# pgbench on the GPU path: "QPS p99_ms mean_ms"; extra -c settings in $2
printf '%s\n' "\\set qid random(0, $((NQ - 1)))" \
	"SELECT id FROM items ORDER BY v <-> (SELECT v FROM held WHERE qid = :qid) LIMIT 10;" > "$W/knn.sql"
bench() {    # clients seconds [settings]
	local c=$1 j=$1 dir="$W/pgb_$RANDOM"
	[ "$j" -gt 16 ] && j=16
	mkdir -p "$dir" && chown "$PGUSER_OS" "$dir"
	as_pg "cd $dir && PGOPTIONS='-c gpuivf.device=$DEVICE -c enable_seqscan=off ${3:-}' pgbench -n -M prepared -c $c -j $j -T $2 -l -f $W/knn.sql" > "$dir/out.txt" 2>&1
	local tps
	tps=$(grep -o 'tps = [0-9.]*' "$dir/out.txt" | head -1 | awk '{print $3}')
	# latency (field 3, µs) sorted: p99 and mean (plain awk: mawk has no asort)
	cat "$dir"/pgbench_log.* | awk '{ print $3 / 1000.0 }' | sort -g |
		awk -v tps="${tps:-0}" '{ l[n++] = $1; s += $1 }
			END { printf "%.0f %.2f %.3f\n", tps, n ? l[int(0.99 * (n - 1))] : 0, n ? s / n : 0 }'
	rm -rf "$dir"
}

# ----------------------------------------------------- 3. rows vs workload
ROWS_OUT=()
measure() {  # label
	local t p10 p100 r10 r100 line c
	for t in $TARGETS; do
		sql "ALTER INDEX items_idx SET (target_recall = $t);"
		p10=$(info probes,by_limit,10); p100=$(info probes,by_limit,100)
		r10=$(recall 10); r100=$(recall 100)
		line="| $1 | $t | $p10 / $p100 | $r10 | $r100 |"
		for c in $CLIENTS; do
			read -r qps p99 _ <<< "$(bench "$c" "$BENCH_S" '-c gpuivf.query_sample=0')"
			line="$line $qps ($p99) |"
		done
		say "$line"
		ROWS_OUT+=("$line")
	done
	sql "ALTER INDEX items_idx RESET (target_recall);"
}
say "calibrated on $(info calibration,source), $(info calibration,sample) queries; nearest-centre distance $(info calibration,nearest_centre_distance,mean)"
measure "rows"

# the workload: the calibration queries through the index (recorded)
f="$W/record.sql"
echo "SET gpuivf.device = $DEVICE; SET enable_seqscan = off;" > "$f"
for ((q = 0; q < NCAL; q++)); do
	echo "SELECT count(*) FROM (SELECT id FROM items ORDER BY v <-> (SELECT v FROM calib WHERE qid = $q) LIMIT 10) s;" >> "$f"
done
sqlf "$f" > /dev/null 2> "$W/record.err" || { cat "$W/record.err"; exit 1; }
DRIFT=$(grep -c 'have drifted' "$W/record.err")
say "recorded $(info recorded_queries,seen) queries (nearest-centre distance $(info recorded_queries,nearest_centre_distance)); drift notices: $DRIFT"
t0=$(date +%s.%N)
sql "SET gpuivf.analyze_sample = $NCAL; SET client_min_messages = debug1; ANALYZE items;" 2> "$W/analyze.log" || { cat "$W/analyze.log"; exit 1; }
ANALYZE_S=$(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t0 }")
say "ANALYZE ${ANALYZE_S}s: $(grep -ho 'calibrated on .*' "$W/analyze.log" | head -1)"
measure "$(info calibration,source)"
sql "SELECT gpuivf_index_info('items_idx') - 'list_size'" > "$OUT/index_info.json"

# ---------------------------------------------------- 4. recording's cost
sql "ALTER INDEX items_idx SET (target_recall = 0.95);"
AB_OFF=() AB_ON=()
for ((i = 1; i <= AB_ROUNDS; i++)); do
	off=$(bench 64 "$AB_S" '-c gpuivf.query_sample=0')
	on=$(bench 64 "$AB_S" '')
	say "A/B round $i, 64 clients: query_sample 0: $off; default: $on (QPS p99_ms mean_ms)"
	AB_OFF+=("$off") AB_ON+=("$on")
done
AB=$(printf '%s\n' "${AB_OFF[@]}" | awk '{ q += $1; m += $3 } END { printf "%.0f %.4f", q / NR, m / NR }')
AB2=$(printf '%s\n' "${AB_ON[@]}" | awk '{ q += $1; m += $3 } END { printf "%.0f %.4f", q / NR, m / NR }')
RECORDED_AB=$(info recorded_queries,seen)
stop_servers
cp "$W/pg/server.log" "$W/build.log" "$W/analyze.log" "$OUT/" 2>/dev/null

# ------------------------------------------------------------------ table
{
echo
echo "## Calibration on the workload: $ROWS x $DIMS, $LISTS lists, queries from another distribution ($QGEN)"
echo
echo "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); $(nproc) cores; CREATE INDEX ${BUILD} s; ANALYZE on $NCAL recorded queries ${ANALYZE_S} s; drift notices while recording: $DRIFT"
echo "Held-out queries: $NQ of the same distribution as the $NCAL recorded ones, disjoint. QPS (p99 ms), pgbench $BENCH_S s, gpuivf.device = $DEVICE."
echo
echo "| calibrated on | target | probes LIMIT 10 / 100 | recall@10 | recall@100 | $(for c in $CLIENTS; do printf 'QPS %s cl. | ' "$c"; done)"
echo "|---|---:|---:|---:|---:|$(for c in $CLIENTS; do printf -- '---:|'; done)"
printf '%s\n' "${ROWS_OUT[@]}"
echo
echo "Recording's cost, 64 clients, target 0.95, $AB_ROUNDS x $AB_S s each, alternating:"
read -r q0 m0 <<< "$AB"; read -r q1 m1 <<< "$AB2"
awk -v q0="$q0" -v q1="$q1" -v m0="$m0" -v m1="$m1" -v n="$RECORDED_AB" 'BEGIN {
	printf "| gpuivf.query_sample | QPS | mean latency (ms) |\n|---|---:|---:|\n"
	printf "| 0 (off) | %.0f | %.3f |\n| 1000 (default, on) | %.0f | %.3f |\n", q0, m0, q1, m1
	printf "\nrecording on: %+.2f %% QPS, %+.2f %% mean latency (%s queries offered to the reservoir since ANALYZE)\n",
		100 * (q1 - q0) / q0, 100 * (m1 - m0) / m0, n }'
echo "total $(( $(date +%s) - started )) s; logs in $OUT"
} | tee "$OUT/summary.md"
