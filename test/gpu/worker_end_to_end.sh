#!/usr/bin/env bash
# test/gpu/worker_end_to_end.sh — the GPU worker, end to end, on a machine with a GPU.
#
# Builds nothing: it installs a gpuivf.so and gpuivf_gpu.so built on the
# development machine (carried with PostgreSQL in a pgkit, see
# ../shared/device/README.md), starts a cluster with
# shared_preload_libraries = 'gpuivf', and checks and measures:
#   1. CREATE INDEX on the GPU worker vs on the CPU: time, both verify, recall;
#   2. GPU vs CPU answers on the same index for NQ queries (top-10 ids), and
#      the same from CONC (64) concurrent clients, each asking all of them;
#      ANALYZE's calibration with the exact kNN (ground truth) on the GPU
#      worker vs on the CPU: time, exact_knn requests, the same curve;
#   3. recall@10 against exact results;
#   4. a committed insert is found by the next query on the GPU;
#   5. QPS and p50/p99 latency for 1/16/64 pgbench clients, device=gpu vs cpu,
#      with the mean batch size and the GPU's busy fraction, the 64-client GPU
#      row again with one probed list, and PostgreSQL alone (the same
#      statement shape returning ten rows by TID, from one page and from ten
#      random pages) as the per-statement ceiling; with INSTANT_ENGINE=path
#      of the stand-in (make fake-gpu-engine) also the worker path with
#      searches that cost nothing;
#   6. kill -9 of the worker: clear errors, the cluster restarts, GPU answers.
# With SHARDS=n (n >= 2, needs n GPUs: gpuivf.devices lists them, or all
# visible are used) also a sharded run (README.md, "Sharding"):
#   2c. answers with gpuivf.shards = n vs unsharded GPU and CPU (must be the
#       same), where the shards live (gpuivf_index_info), a shard worker
#       terminated: ERROR under gpu, CPU answer under auto, then recovery;
#   5.  a "gpushard" pgbench row (device=gpu, shards=n).
# DEVICES=0,1 sets gpuivf.devices (e.g. a local dry run with the stand-in:
#   GPUIVF_LOCAL=1 GPUIVF_FAKE_DEVICES=2 DEVICES=0,1 SHARDS=2 ENGINE=... ).
# BUILD_ONLY=1 stops after the two CREATE INDEX (their phase timings, from the
# build's DEBUG1 line, are printed either way); SKIP_CPU_BUILD=1 (with
# BUILD_ONLY) leaves out the CPU one.
# QPS_ONLY=1 builds only the GPU index and runs only the pgbench rows (DEVS,
# default "gpu cpu"; CLIENTS, default "1 16 64"; AB; SWEEP; INSTANT_ENGINE),
# for A/B runs of the worker's throughput.
# It prints a summary table last and leaves logs in $OUT.
#
# On the device (from the repo root):  bash test/gpu/worker_end_to_end.sh .device-worker
#   where .device-worker/ holds pgkit.sh, pgkit.tar.xz, gpuivf.so, gpuivf_gpu.so
#   (PostgreSQL's set-up: test/gpu/cluster_lib.sh).
# Locally, as a dry run against an installed build (PG_CONFIG) and any engine:
#   GPUIVF_LOCAL=1 PORT=5610 ENGINE=/path/to/gpuivf_fake_gpu.so bash test/gpu/worker_end_to_end.sh
set -u
KIT=${1:-.device-worker}
OUT=${OUT:-/tmp/gpuivf-device-out}
ROWS=${ROWS:-100000}
DIMS=${DIMS:-128}
NQ=${NQ:-1000}
LISTS=${LISTS:-316}
PROBES=${PROBES:-16}
BENCH_S=${BENCH_S:-6}
PORT=${PORT:-5432}
W=${W:-/tmp/gpuivf-work}
SHARDS=${SHARDS:-}
mkdir -p "$OUT"
# shellcheck source=test/gpu/cluster_lib.sh
source "$(dirname "$0")/cluster_lib.sh"
trap stop_servers EXIT

setup_postgres "$KIT"
say "data: $ROWS x $DIMS, $NQ queries"
if [ -n "${GEN:-}" ]; then
	# realistic clustered data (test/tools/gpuivf_gen, the recipe of
	# shared/data/README.md) and exact ground truth (test/tools/gpuivf_gt)
	"$GEN" --rows "$ROWS" --dims "$DIMS" --queries "$NQ" --base "$W/base.bin" --base "$W/base.fvecs" \
		--query "$W/queries.bin" --query "$W/queries.fvecs" >/dev/null || exit 1
	"${GT:-$(dirname "$GEN")/gpuivf_gt}" --base "$W/base.fvecs" --query "$W/queries.fvecs" --out "$W/gt.ivecs" \
		--dist "$W/gt_dist.fvecs" --k 10 >/dev/null || exit 1
	rm -f "$W/base.fvecs"
else
	$PY "$W/gpuivf_device.py" gen "$W" "$ROWS" "$DIMS" "$NQ" || exit 1
fi
chown -R "$PGUSER_OS" "$W"

# checkpoints every few seconds (the 1 GB default) while COPY and the builds
# write their WAL would land inside the builds' timings, differently each
# run: the common max_wal_size = 16GB, checkpoint_timeout = 30min.  DEBUG1:
# the GPU worker's time breakdown (every 2 s while it serves).
start_server pg "$PORT" "listen_addresses = ''" "shared_preload_libraries = 'gpuivf'" "max_connections = 200" \
	"log_min_messages = debug1" ${DEVICES:+"gpuivf.devices = '$DEVICES'"}
sleep 2
sql "CREATE EXTENSION gpuivf;"
say "worker: $(sql "SELECT worker || ' ' || state || ' ' || coalesce(device_name, '') || ' ' || coalesce(message, '') FROM gpuivf_stat")"

sql "CREATE TABLE items (id bigint, v real[]);
     COPY items FROM '$W/base.bin' WITH (FORMAT binary);
     CREATE TABLE queries (qid bigint PRIMARY KEY, v real[]);
     COPY queries FROM '$W/queries.bin' WITH (FORMAT binary);
     VACUUM ANALYZE items; VACUUM ANALYZE queries;" || exit 1

# ------------------------------------------------------------ 1. builds
wstat() { sql "SELECT queries || ' ' || batches || ' ' || gpu_time_ms || ' ' || builds || ' ' || cpu_fallbacks || ' ' || errors || ' ' || exact_knn FROM gpuivf_stat WHERE worker = 0"; }
t0=$(date +%s.%N)
if [ -z "${SKIP_CPU_BUILD:-}${QPS_ONLY:-}" ]; then
	sql "SET gpuivf.device = cpu; SET client_min_messages = debug1; CREATE INDEX items_cpu ON items USING gpuivf (v) WITH (lists = $LISTS);" 2> "$W/build_cpu.log" || { cat "$W/build_cpu.log"; exit 1; }
fi
t1=$(date +%s.%N)
b0=$(wstat | awk '{print $4}')
sql "SET gpuivf.device = gpu; SET client_min_messages = debug1; CREATE INDEX items_gpu ON items USING gpuivf (v) WITH (lists = $LISTS);" 2> "$W/build_gpu.log" || { cat "$W/build_gpu.log"; exit 1; }
t2=$(date +%s.%N)
b1=$(wstat | awk '{print $4}')
BUILD_CPU=$(awk "BEGIN { printf \"%.2f\", $t1 - $t0 }")
BUILD_GPU=$(awk "BEGIN { printf \"%.2f\", $t2 - $t1 }")
say "CREATE INDEX: cpu ${BUILD_CPU}s, gpu ${BUILD_GPU}s (worker build requests: $((b1 - b0)))"
# where the time went (the build's DEBUG1 summary line)
PHASES_CPU=$(grep -ho 'gpuivf build of .*' "$W/build_cpu.log" 2>/dev/null | sed 's/^gpuivf build of "[^"]*": //')
PHASES_GPU=$(grep -ho 'gpuivf build of .*' "$W/build_gpu.log" | sed 's/^gpuivf build of "[^"]*": //')
say "  cpu phases: ${PHASES_CPU:-not run}"
say "  gpu phases: $PHASES_GPU"
say "  cpu calibration: $(grep -ho 'calibrated on .*' "$W/build_cpu.log" 2>/dev/null | head -1)"
say "  gpu calibration: $(grep -ho 'calibrated on .*' "$W/build_gpu.log" | head -1)"
if [ -n "${BUILD_ONLY:-}" ]; then
	exit 0
fi
VERIFY="not run" BUILD_AGREE="not run" GPU_CPU="not run" CAL_GPU="-" CAL_CPU="-" CAL_SAME="-" x0=0 x1=0
CAL_GPU_LOG="" CAL_CPU_LOG="" RECALL="-" RECALL32="-" FRESH="-" r0="-" r1="-" KILL_ERR="" newstate="" AFTER="not run"
if [ -z "${QPS_ONLY:-}" ]; then
VERIFY=$(sql "SELECT gpuivf_verify('items_cpu', true); SELECT gpuivf_verify('items_gpu', true); SELECT 'ok'" 2>&1 | tail -1)
say "gpuivf_verify(heapallindexed) of both: $VERIFY"

# per-query results of an index on the worker: qid|{ids}|{distances}
worker_results() {   # index nprobe file
	local f="$W/wq_$1_$2.sql"
	: > "$f"
	for ((q = 0; q < NQ; q++)); do
		echo "SELECT $q, array_agg(replace(heap_tid::text, ',', '.') ORDER BY distance, heap_tid), array_agg(distance ORDER BY distance, heap_tid) FROM gpuivf_worker_search('$1', (SELECT v FROM queries WHERE qid = $q), 10, $2);" >> "$f"
	done
	sqlf "$f" > "$3"
}
# per-query results of SQL (the only remaining index answers): qid|{ids}|{distances}
sql_results() {      # device probes file [nq]
	local n=${4:-$NQ}
	local f="$W/sq_$1_$2.sql"
	echo "SET gpuivf.device = $1; SET gpuivf.probes = $2; SET enable_seqscan = off; ${SHARD_SET:-}" > "$f"
	for ((q = 0; q < n; q++)); do
		echo "SELECT $q, array_agg(id ORDER BY d, id), array_agg(d ORDER BY d, id) FROM (SELECT id, v <-> (SELECT v FROM queries WHERE qid = $q) AS d FROM items ORDER BY v <-> (SELECT v FROM queries WHERE qid = $q) LIMIT 10) s;" >> "$f"
	done
	sqlf "$f" > "$3"
}

worker_results items_cpu "$PROBES" "$W/r_idxcpu.txt"
worker_results items_gpu "$PROBES" "$W/r_idxgpu.txt"
BUILD_AGREE=$($PY "$W/gpuivf_device.py" compare "$W/r_idxcpu.txt" "$W/r_idxgpu.txt")
say "GPU-built vs CPU-built index, searched on the GPU: $BUILD_AGREE"

# ------------------------------------------------- 2. GPU vs CPU answers
sql "DROP INDEX items_cpu;"
sql_results gpu "$PROBES" "$W/r_gpu.txt"
sql_results cpu "$PROBES" "$W/r_cpu.txt"
GPU_CPU=$($PY "$W/gpuivf_device.py" compare "$W/r_gpu.txt" "$W/r_cpu.txt")
say "GPU vs CPU, same index, nprobe $PROBES: $GPU_CPU"

# ------------------------------ 2b. concurrent clients, every answer checked
# CONC clients at once (default 64), each asking all NQ queries on the GPU,
# client c starting at query c * NQ / CONC, so that batches mix the queries
# of many backends; every client's answers must be the CPU's.
CONC=${CONC:-64}
cs0=$(wstat)
for ((c = 0; c < CONC; c++)); do
	f="$W/conc_$c.sql"
	head -1 "$W/sq_gpu_$PROBES.sql" > "$f"
	tail -n +2 "$W/sq_gpu_$PROBES.sql" | awk -v off=$((c * NQ / CONC)) -v n="$NQ" \
		'{ a[NR - 1] = $0 } END { for (i = 0; i < n; i++) print a[(i + off) % n] }' >> "$f"
	sqlf "$f" > "$W/conc_$c.txt" 2> "$W/conc_$c.err" &
done
wait
cs1=$(wstat)
CONC_OK=0
for ((c = 0; c < CONC; c++)); do
	r=$($PY "$W/gpuivf_device.py" compare "$W/conc_$c.txt" "$W/r_cpu.txt")
	case "$r" in
		"queries=$NQ same_ids_in_order=$NQ "*) CONC_OK=$((CONC_OK + 1)) ;;
		*) say "client $c: $r $(head -c 300 "$W/conc_$c.err")" ;;
	esac
done
CONC_BATCH=$(echo "$cs0 $cs1" | awk '{ if ($9 > $2) printf "%.2f", ($8 - $1) / ($9 - $2); else print "-" }')
CONC_SUMMARY="$CONC_OK of $CONC clients got the CPU's top-10 for all $NQ queries (mean batch $CONC_BATCH)"
say "$CONC concurrent clients on the GPU: $CONC_SUMMARY"

# ---------------------------------------------- 2c. sharded (SHARDS=n)
SHARD_SUMMARY="not run (set SHARDS=2)"
if [ -n "$SHARDS" ]; then
	SHARD_SET="SET gpuivf.shards = $SHARDS;" sql_results gpu "$PROBES" "$W/r_gpushard.txt"
	SH_GPU=$($PY "$W/gpuivf_device.py" compare "$W/r_gpushard.txt" "$W/r_gpu.txt")
	SH_CPU=$($PY "$W/gpuivf_device.py" compare "$W/r_gpushard.txt" "$W/r_cpu.txt")
	SH_SAME=$(cmp -s "$W/r_gpushard.txt" "$W/r_gpu.txt" && echo identical || echo DIFFERENT)
	SH_WHERE=$(sql "SELECT string_agg(format('worker %s: shard %s/%s, %s rows, %s MB', e->>'worker', e->>'shard', e->>'shards', e->>'vectors', ((e->>'bytes')::bigint >> 20)), '; ') FROM jsonb_array_elements(gpuivf_index_info('items_gpu') -> 'gpu_cache') e WHERE (e->>'shards')::int > 1")
	say "sharded ($SHARDS) vs unsharded GPU: $SH_SAME ($SH_GPU); vs CPU: $SH_CPU; placement: $SH_WHERE"
	q1sql="SET gpuivf.shards = $SHARDS; SET gpuivf.probes = $PROBES; SELECT id FROM items ORDER BY v <-> (SELECT v FROM queries WHERE qid = 7) LIMIT 1;"
	spid=$(sql "SELECT pid FROM gpuivf_stat WHERE worker = 1")
	sql "SELECT pg_terminate_backend($spid);" >/dev/null
	sleep 0.5
	SH_ERR=$(sql "SET gpuivf.device = gpu; $q1sql" 2>&1 | grep -m1 -oE 'ERROR:.*')
	SH_AUTO=$(sql "SET gpuivf.device = auto; $q1sql" 2>&1)
	for i in $(seq 1 100); do
		[ "$(sql "SELECT count(*) FROM gpuivf_stat WHERE state = 'ready' AND worker < $SHARDS")" = "$SHARDS" ] && break
		sleep 0.3
	done
	SH_AFTER=$(sql "SET gpuivf.device = gpu; $q1sql" 2>&1)
	say "shard worker 1 terminated: gpu -> ${SH_ERR:-no error}; auto -> $SH_AUTO; after restart gpu -> $SH_AFTER"
	SHARD_SUMMARY="vs unsharded GPU: $SH_SAME ($SH_GPU); vs CPU: $SH_CPU; $SH_WHERE; worker 1 gone: gpu '${SH_ERR:-no error}', auto '$SH_AUTO', after restart '$SH_AFTER'"
fi

# ------------------------------------- 2b. ANALYZE calibration (exact kNN)
# ANALYZE calibrates items_gpu (the only gpuivf index left): ground truth by
# exact kNN on the worker under gpu, in the backend under cpu; the DEBUG1
# line says where and how long each step took.
calibrate() {        # device -> "seconds|calibration log line"
	local t0 t1 line
	t0=$(date +%s.%N)
	line=$(sql "SET gpuivf.device = $1; SET client_min_messages = debug1; ANALYZE items;" 2>&1 | grep -o 'calibrated on .*' | head -1)
	t1=$(date +%s.%N)
	echo "$(awk "BEGIN { printf \"%.2f\", $t1 - $t0 }")|$line"
}
curve() { sql "SELECT gpuivf_index_info('items_gpu') -> 'calibration' -> 'curve'"; }
x0=$(wstat | awk '{print $7}')
IFS='|' read -r CAL_GPU CAL_GPU_LOG <<< "$(calibrate gpu)"
x1=$(wstat | awk '{print $7}')
CURVE_GPU=$(curve)
IFS='|' read -r CAL_CPU CAL_CPU_LOG <<< "$(calibrate cpu)"
CURVE_CPU=$(curve)
CAL_SAME=$([ -n "$CURVE_GPU" ] && [ "$CURVE_GPU" = "$CURVE_CPU" ] && echo yes || echo NO)
CAL_INFO=$(sql "SELECT format('%s probes for recall %s', p ->> 'in_use', p ->> 'target_recall') FROM (SELECT gpuivf_index_info('items_gpu') -> 'probes' AS p) s")
say "ANALYZE of items: gpu ${CAL_GPU}s (exact_knn requests $((x1 - x0)); $CAL_GPU_LOG)"
say "ANALYZE of items: cpu ${CAL_CPU}s ($CAL_CPU_LOG); same curve: $CAL_SAME; $CAL_INFO"

# ------------------------------------------------------------- 3. recall
if [ -f "$W/gt.ivecs" ]; then
	$PY "$W/gpuivf_device.py" truth "$W/gt.ivecs" "$W/gt_dist.fvecs" 200 > "$W/r_exact.txt"
else
	sql_results cpu "$LISTS" "$W/r_exact.txt" 200
fi
head -200 "$W/r_gpu.txt" > "$W/r_gpu200.txt"
RECALL=$($PY "$W/gpuivf_device.py" recall "$W/r_gpu200.txt" "$W/r_exact.txt")
sql_results gpu 32 "$W/r_gpu32.txt" 200
RECALL32=$($PY "$W/gpuivf_device.py" recall "$W/r_gpu32.txt" "$W/r_exact.txt")
say "recall@10 vs exact (200 queries): nprobe $PROBES $RECALL, nprobe 32 $RECALL32"

# ----------------------------------------------------- 4. fresh inserts
r0=$(sql "SELECT refreshes FROM gpuivf_stat WHERE worker = 0")
sql "INSERT INTO items SELECT -1, v FROM queries WHERE qid = 7;"
FRESH=$(sql "SET gpuivf.device = gpu; SET gpuivf.probes = $PROBES; SELECT id FROM items ORDER BY v <-> (SELECT v FROM queries WHERE qid = 7) LIMIT 1;")
r1=$(sql "SELECT refreshes FROM gpuivf_stat WHERE worker = 0")
say "committed insert found by the next GPU query: id $FRESH (expected -1), refreshes $r0 -> $r1"
fi # QPS_ONLY

# --------------------------------------------------------------- 5. QPS
cat > "$W/knn.sql" <<EOF
\set q random(0, $((NQ - 1)))
SELECT id FROM items ORDER BY v <-> (SELECT v FROM queries WHERE qid = :q) LIMIT 10;
EOF
chown "$PGUSER_OS" "$W/knn.sql"
: > "$W/bench.txt"
# CPU time (user + system clock ticks) of GPU worker 0 so far
wcpu() {
	local pid
	pid=$(sql "SELECT pid FROM gpuivf_stat WHERE worker = 0")
	awk '{ print $14 + $15 }' "/proc/$pid/stat" 2>/dev/null || echo 0
}
# Busy and total clock ticks of all CPUs so far (/proc/stat): whether the
# machine's cores were saturated over a run.
mcpu() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 }' /proc/stat; }
# CPU clock ticks of the postmaster's exited children (cutime + cstime): the
# backends of a pgbench run, once it has ended and they are reaped.
bcpu() { awk '{ print $16 + $17 }' "/proc/$(head -1 "$W/pg/data/postmaster.pid")/stat"; }
# One pgbench run of BENCH_S seconds: pgbench_run LABEL CLIENTS SCRIPT
# [PGOPTIONS]; sets TPS, LAT (p50/p99/mean from the transaction log), FAIL,
# MCPU (how busy the machine's cores were) and BACKEND_US (CPU microseconds
# per statement of the run's backends).
pgbench_run() {
	local label=$1 c=$2 script=$3 opts=${4:-} j=$(($2 < 16 ? $2 : 16)) m0 m1 b0 b1 ntx
	rm -f "$W"/pgb_*
	m0=$(mcpu)
	b0=$(bcpu)
	as_pg "PGOPTIONS='$opts' pgbench -n -M prepared -c $c -j $j -T $BENCH_S -l --log-prefix=$W/pgb_${label}_$c -f $script postgres" > "$W/pgbench_${label}_$c.log" 2>&1
	m1=$(mcpu)
	sleep 0.5
	b1=$(bcpu)
	TPS=$(grep -E '^tps' "$W/pgbench_${label}_$c.log" | head -1 | awk '{print $3}')
	ntx=$(grep -E '^number of transactions actually processed' "$W/pgbench_${label}_$c.log" | awk '{print $NF}')
	FAIL=$(grep -E 'number of failed|aborted' "$W/pgbench_${label}_$c.log" | head -1)
	LAT=$($PY "$W/gpuivf_device.py" latency "$W/pgb_${label}_$c")
	MCPU=$(echo "$m0 $m1" | awk '{ if ($4 > $2) printf "%.0f%%", 100 * ($3 - $1) / ($4 - $2); else print "-" }')
	BACKEND_US=$(echo "$b0 $b1 ${ntx:-0} $(getconf CLK_TCK)" | awk '{ if ($3 > 0) printf "%.1f", 1e6 * ($2 - $1) / $4 / $3; else print "-" }')
}
# One row of bench.txt: knn_row LABEL CLIENTS PGOPTIONS — the pgbench run
# with the worker's mean batch, GPU busy fraction and CPU share over it, and
# how busy the machine's cores were.
knn_row() {
	local label=$1 c=$2 opts=$3 probes=${4:-$PROBES} s0 s1 c0 c1 q0 q1 bt0 bt1 g0 g1 mb busy wc
	s0=$(wstat)
	c0=$(wcpu)
	# PERF_WORKER=S: a perf profile of the GPU worker (all its threads) over
	# S seconds of the 64-client GPU row, into $OUT/perf_worker.txt
	if [ -n "${PERF_WORKER:-}" ] && [ "$label" = gpu ] && [ "$c" = 64 ] && command -v perf >/dev/null; then
		(sleep 1; perf record -g -p "$(sql "SELECT pid FROM gpuivf_stat WHERE worker = 0")" -o "$W/perf.data" -- sleep "$PERF_WORKER" >/dev/null 2>&1
		 perf report -i "$W/perf.data" --no-children --sort sym -g none 2>/dev/null | grep -v '^#' | head -80 > "$OUT/perf_worker.txt"
		 perf report -i "$W/perf.data" --no-children --sort tid -g none 2>/dev/null | grep -v '^#' | head -12 >> "$OUT/perf_worker.txt") &
	fi
	pgbench_run "$label" "$c" "$W/knn.sql" "$opts -c gpuivf.probes=$probes"
	wait
	c1=$(wcpu)
	s1=$(wstat)
	read -r q0 bt0 g0 _ <<< "$s0"
	read -r q1 bt1 g1 _ <<< "$s1"
	mb=$(echo "$q1 $q0 $bt1 $bt0" | awk '{ if ($3 > $4) printf "%.2f", ($1 - $2) / ($3 - $4); else print "-" }')
	busy=$(echo "$g1 $g0 $BENCH_S" | awk '{ printf "%.1f%%", 100 * ($1 - $2) / ($3 * 1000) }')
	wc=$(echo "$c1 $c0 $BENCH_S $(getconf CLK_TCK)" | awk '{ printf "%.0f%%", 100 * ($1 - $2) / ($4 * $3) }')
	echo "$label $c $TPS $LAT batch=$mb gpu_busy=$busy worker_cpu=$wc machine_cpu=$MCPU backend_us=$BACKEND_US $FAIL" | tee -a "$W/bench.txt"
}
for dev in ${DEVS:-gpu cpu ${SHARDS:+gpushard}}; do
	for c in ${CLIENTS:-1 16 64}; do
		opts="-c gpuivf.device=$dev"
		[ "$dev" = gpushard ] && opts="-c gpuivf.device=gpu -c gpuivf.shards=$SHARDS"
		knn_row "$dev" "$c" "$opts"
	done
done

# How much the 64-client throughput depends on the GPU's work per query: the
# same row with one probed list instead of PROBES (a fraction of the scan,
# the statement otherwise the same).  Throughput that barely moves is set by
# what a search costs whatever its work (launches, the chain of kernels, the
# worker's thread) and by the CPU side.
if [ -z "${SHARDS:-}" ] && [[ " ${DEVS:-gpu cpu} " == *" gpu "* ]] && [[ " ${CLIENTS:-1 16 64} " == *" 64 "* ]]; then
	knn_row gpu_probes1 64 "-c gpuivf.device=gpu" 1
fi

# every worker's share of the work so far (replication over several GPUs:
# each worker keeps its own copy of the index and takes requests from the
# one queue)
PER_WORKER=$(sql "SELECT string_agg(format('worker %s (GPU %s): %s queries in %s batches, %s indexes cached', worker, device, queries, batches, indexes_cached), '; ' ORDER BY worker) FROM gpuivf_stat")
say "per worker: $PER_WORKER"

# AB="name:PGOPTIONS|name:PGOPTIONS" AB_ROUNDS=n: the GPU rows of AB_CLIENTS
# (default 64) clients of each variant, alternating, n rounds (default 3): an
# A/B of per-session settings on one machine within one run, e.g.
#   AB="r200:-c gpuivf.rerank_candidates=200|r100:-c gpuivf.rerank_candidates=100"
if [ -n "${AB:-}" ]; then
	IFS='|' read -r -a ab_variants <<< "$AB"
	for round in $(seq 1 "${AB_ROUNDS:-3}"); do
		for v in "${ab_variants[@]}"; do
			for c in ${AB_CLIENTS:-64}; do
				knn_row "ab_${v%%:*}" "$c" "-c gpuivf.device=gpu ${v#*:}"
			done
		done
	done
fi

# After a restart: one GPU query, so that the worker loads the index before
# a timed row.
warm_gpu() {
	sql "SET gpuivf.device = gpu; SET gpuivf.probes = $PROBES; SELECT count(*) FROM (SELECT id FROM items ORDER BY v <-> (SELECT v FROM queries WHERE qid = 0) LIMIT 10) s" >/dev/null
}

# SWEEP="gpuivf.search_streams=4 gpuivf.wake_thread=off": the GPU rows of
# SWEEP_CLIENTS (default 64) clients again under each setting (ALTER SYSTEM
# and a restart each; reset after).  A setting listed twice runs twice, so
# "a b a b" alternates.
for set in ${SWEEP:-}; do
	sql "ALTER SYSTEM SET ${set%%=*} = '${set#*=}'" >/dev/null
	restart_server pg
	warm_gpu
	for c in ${SWEEP_CLIENTS:-64}; do
		knn_row "gpu_${set#gpuivf.}" "$c" "-c gpuivf.device=gpu"
	done
	sql "ALTER SYSTEM RESET ${set%%=*}" >/dev/null
done
[ -n "${SWEEP:-}" ] && restart_server pg

# INSTANT_ENGINE=path of the CPU stand-in (make fake-gpu-engine): the
# 64-client row with the worker running it with GPUIVF_FAKE_INSTANT, i.e. a
# search that costs nothing and answers k rows of the index at once (wrong
# rows on purpose).  What is left is the path itself: the backend, the
# queue, the worker's thread and the wake-ups.  The GPU row's distance to it
# is what the GPU's searches cost the throughput.
if [ -n "${INSTANT_ENGINE:-}" ]; then
	cp "$INSTANT_ENGINE" "$W/instant_engine.so" && chown "$PGUSER_OS" "$W/instant_engine.so"
	sql "ALTER SYSTEM SET gpuivf.engine_library = '$W/instant_engine.so'" >/dev/null
	restart_server pg GPUIVF_FAKE_INSTANT=1
	warm_gpu
	knn_row instant 64 "-c gpuivf.device=gpu"
	sql "ALTER SYSTEM RESET gpuivf.engine_library" >/dev/null
	restart_server pg
	warm_gpu
fi

# The rows of PostgreSQL alone: pg_alone_rows LABEL SCRIPT WHAT, one pgbench
# run per client count.
pg_alone_rows() {
	for c in ${CLIENTS:-1 16 64}; do
		pgbench_run "$1" "$c" "$2"
		echo "$1 $c $TPS $LAT machine_cpu=$MCPU backend_us=$BACKEND_US ($3)" | tee -a "$W/bench.txt"
	done
}

# PostgreSQL alone: the same statement shape (the query vector fetched by its
# id, ten rows of items returned) with the ten rows found by their TIDs
# instead of by the kNN search: the per-statement ceiling the GPU rows are
# compared with.
TIDS=$(sql "SELECT string_agg('\"' || ctid::text || '\"', ',') FROM (SELECT ctid FROM items LIMIT 10) s")
printf '%s\n' "\\set q random(0, $((NQ - 1)))" \
	"SELECT id FROM items WHERE ctid = ANY ('{$TIDS}'::tid[]) AND (SELECT v FROM queries WHERE qid = :q) IS NOT NULL;" \
	> "$W/pgonly.sql"
chown "$PGUSER_OS" "$W/pgonly.sql"
pg_alone_rows pgonly "$W/pgonly.sql" "ten rows by TID, no kNN"
# The same with ten TIDs drawn at random per statement, as a kNN's ten rows
# are: ten heap pages visited instead of one (the last page, maybe not full,
# is left out; every other page holds RPP rows of the fixed-size table).
NPAGES=$(sql "SELECT pg_relation_size('items') / current_setting('block_size')::int")
RPP=$(sql "SELECT count(*) FROM items WHERE ctid >= '(0,1)'::tid AND ctid < '(1,0)'::tid")
{
	echo "\set q random(0, $((NQ - 1)))"
	for i in $(seq 1 10); do
		echo "\set p$i random(0, $((NPAGES - 2)))"
		echo "\set l$i random(1, $RPP)"
	done
	printf 'SELECT id FROM items WHERE ctid = ANY (ARRAY['
	for i in $(seq 1 10); do
		[ "$i" -gt 1 ] && printf ', '
		printf "('(' || :p$i::text || ',' || :l$i::text || ')')::tid"
	done
	echo "]) AND (SELECT v FROM queries WHERE qid = :q) IS NOT NULL;"
} > "$W/pgrandom.sql"
chown "$PGUSER_OS" "$W/pgrandom.sql"
sql "EXPLAIN (COSTS OFF) $(sed -n '$p' "$W/pgrandom.sql" | sed 's/:[pl][0-9]*::text/1::text/g; s/:q/0/')" > "$W/pgrandom_plan.txt" 2>&1
say "ten random rows by TID: $NPAGES pages of $RPP rows, plan: $(grep -m1 -oE "Tid Scan.*|Seq Scan.*" "$W/pgrandom_plan.txt")"
pg_alone_rows pgrandom "$W/pgrandom.sql" "ten random rows by TID, no kNN"
# SPINNERS=n: the 64-client row of PostgreSQL alone with random rows again
# while n processes spin on the CPU (what n cores held by the GPU worker's
# polling threads cost the backends).
if [ -n "${SPINNERS:-}" ]; then
	spin_pids=""
	for i in $(seq 1 "$SPINNERS"); do
		bash -c 'while :; do :; done' &
		spin_pids="$spin_pids $!"
	done
	CLIENTS=64 pg_alone_rows "pgrandom_spin$SPINNERS" "$W/pgrandom.sql" "ten random rows, $SPINNERS spinning processes"
	kill $spin_pids 2>/dev/null
	wait $spin_pids 2>/dev/null
fi


# ------------------------------------------------------------ 6. kill -9
if [ -z "${QPS_ONLY:-}" ]; then
pid=$(sql "SELECT pid FROM gpuivf_stat WHERE worker = 0")
as_pg "PGOPTIONS='-c gpuivf.device=gpu -c gpuivf.probes=$PROBES' pgbench -n -c 8 -j 8 -T 5 -f $W/knn.sql postgres" > "$W/pgbench_kill.log" 2>&1 &
bgpid=$!
sleep 2
kill -9 "$pid"
wait "$bgpid"
KILL_ERR=$(grep -m1 -oE 'terminating connection because of crash of another server process|server closed the connection unexpectedly|FATAL:.*' "$W/pgbench_kill.log")
newstate=""
for i in $(seq 1 100); do
	newstate=$(sql "SELECT state FROM gpuivf_stat WHERE worker = 0 AND pid <> $pid" 2>/dev/null)
	[ "$newstate" = "ready" ] && break
	sleep 0.3
done
AFTER=$(sql "SET gpuivf.device = gpu; SET gpuivf.probes = $PROBES; SELECT id FROM items ORDER BY v <-> (SELECT v FROM queries WHERE qid = 7) LIMIT 1;" 2>&1)
say "kill -9 of the worker (pid $pid): in-flight clients saw \"$KILL_ERR\"; new worker: ${newstate:-none}; GPU query after: $AFTER"
fi # QPS_ONLY

# -------------------------------------------------------------- summary
sql "\\x on
SELECT * FROM gpuivf_stat;" > "$OUT/gpuivf_stat.txt"
cp "$W/pg/server.log" "$OUT/server.log" 2>/dev/null
cp "$W/bench.txt" "$OUT/" 2>/dev/null
stop_servers
echo
echo "================================ gpuivf GPU worker: summary ================================"
echo "data                 $ROWS x $DIMS clustered, lists $LISTS, nprobe $PROBES, $NQ queries"
echo "CREATE INDEX         cpu ${BUILD_CPU}s   gpu ${BUILD_GPU}s   verify: $VERIFY"
echo "  phases cpu         ${PHASES_CPU:-not run}"
echo "  phases gpu         $PHASES_GPU"
echo "GPU- vs CPU-built    $BUILD_AGREE"
echo "GPU vs CPU answers   $GPU_CPU"
echo "concurrent clients   ${CONC_SUMMARY:-not run}"
echo "ANALYZE calibration  gpu ${CAL_GPU}s (exact_knn requests $((x1 - x0)))   cpu ${CAL_CPU}s   same curve: $CAL_SAME"
echo "  gpu: $CAL_GPU_LOG"
echo "  cpu: $CAL_CPU_LOG"
echo "recall@10 (GPU)      nprobe $PROBES: $RECALL   nprobe 32: $RECALL32"
echo "insert then query    first id $FRESH (want -1); refreshes $r0 -> $r1"
echo "kill -9 worker       clients: ${KILL_ERR:-no error seen}; new worker ${newstate:-none}; then GPU answer: $AFTER"
echo "workers              $PER_WORKER"
echo "sharded (SHARDS)     ${SHARD_SUMMARY:-not run (set SHARDS=2)}"
echo "pgbench (device clients tps p50/p99 ms, batch = mean queries per GPU call):"
sed 's/^/  /' "$W/bench.txt"
grep -E "gpuivf gpu worker" "$W/pg/server.log" | grep -vE "statement:|DEBUG" | head -8
echo "GPU worker time breakdown (DEBUG1, one line per ~2 s of serving):"
grep -oE "gpuivf GPU worker [0-9]+ in [0-9.]+ s: .*" "$W/pg/server.log" | sed 's/^/  /' | tail -40
echo "elapsed $(( $(date +%s) - started ))s"
