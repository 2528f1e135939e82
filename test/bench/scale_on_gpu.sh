#!/usr/bin/env bash
# test/bench/scale_on_gpu.sh — gpuivf at 10M+ rows on the GPU machine, in one command
# that fits the device's 10-minute limit (by default it stops starting new
# steps after TIME_LIMIT = 530 s and says which it skipped).
#
#   bash test/bench/scale_on_gpu.sh KIT        KIT: pgkit.sh, pgkit.tar.xz, gpuivf.so,
#                                       gpuivf_gpu.so (as for test/gpu/worker_end_to_end.sh;
#                                       PostgreSQL's set-up: test/gpu/cluster_lib.sh)
#                                       and, for pgvector, vector.so, vector.control,
#                                       vector--*.sql, built here from the vendored
#                                       source against Debian's PostgreSQL 15:
#     tar -C /tmp -xzf ../shared/vendor/pgvector-0.8.6.tar.gz &&
#     make -C /tmp/pgvector with_llvm=no PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config &&
#     cp /tmp/pgvector/vector.so /tmp/pgvector/vector.control /tmp/pgvector/sql/vector--*.sql KIT/
#   ROWS=10000000 DIMS=128 bash test/bench/scale_on_gpu.sh .device-worker     (the default)
#   ROWS=5000000 DIMS=768 RERANK=false bash test/bench/scale_on_gpu.sh .device-worker
#   ROWS=5000000 DIMS=768 TYPE=halfvec PGVECTOR=0 bash test/bench/scale_on_gpu.sh .device-worker
#   ALSO_LISTS="6324" ...   after step 4, the index rebuilt with each of these
#       list counts and measured at the first target (steps 2 and 3 again)
#   GPUIVF_LOCAL=1 ROWS=200000 STREAMS=2 WORKERS=1 ... (a dry run here, with the
#       installed PostgreSQL of PG_CONFIG and ENGINE=path/to/gpuivf_fake_gpu.so)
#
# Steps, each logged to $OUT/progress.txt as it ends:
#   1. data: STREAMS processes of gpuivf_gen --part k/STREAMS generate the rows
#      on this machine, each straight into a binary COPY of its own (FIFOs),
#      and into scale_truth.py, which computes the exact top-10 of the NQ
#      queries on the GPU (torch) once the rows are in; then VACUUM ANALYZE;
#      TYPE = real[] (default), vector or halfvec (pgvector's types, through
#      gpuivf_vector's operator classes; the exact top-10 of halfvec rows is
#      that of the rows and queries rounded to half precision);
#   2. CREATE INDEX USING gpuivf on the GPU with WORKERS parallel workers:
#      time, the build's phases (its DEBUG1 line), index size, the peak
#      private memory (RssAnon) of the building backend, of its parallel
#      workers (the largest and their sum) and of the GPU worker, the GPU's
#      memory in use;
#   3. for each TARGETS recall target: recall@10 of the NQ queries with the
#      automatic probes, and pgbench QPS / p50 / p99 at each CLIENTS count;
#   3a. SWEEP="default search_streams=2 answer_spin=0 ...": the first target
#      again at SWEEP_CLIENTS (64) under each entry's settings (server
#      restarted), with the GPU worker's time breakdown (its DEBUG1 lines);
#   3b. HOST_RERANK=1 (default): the same index with gpuivf.gpu_memory_limit
#      at half of its GPU copy, so that only its codes fit (README.md, "Larger
#      than the GPU"): recall@10 and QPS at the first target, next to the
#      copy that fits;
#   4. INSERTERS clients inserting while 64 query (BENCH_S seconds): both
#      rates and the queries' p99; then 20 rows, each inserted and committed,
#      must each be the answer of the next GPU query for its own vector;
#   4b. ALSO_LISTS: step 4's rows deleted, the index rebuilt with each list
#      count, steps 2-3 at the first target;
#   5. pgvector, when the kit has it and time remains: a vector(DIMS) copy of
#      the table, hnsw (m 16, ef_construction 64, WORKERS workers) and
#      ivfflat, each bounded by the time left; a build cut short reports how
#      far it got (pg_stat_progress_create_index).
# Every pgbench step also reports, from gpuivf_stat and /proc/stat over its
# run: the GPU worker's busy share (GPU time / wall), its mean batch size and
# the machine's CPU busy share: which side limits the rate.
# $OUT gets progress.txt, summary.md, results.csv and build.csv (the format of
# test/bench/run, for test/bench/plot.py), and the logs.
set -u
KIT=${1:-.device-worker}
OUT=${OUT:-/tmp/gpuivf-scale-out}
ROWS=${ROWS:-10000000}
DIMS=${DIMS:-128}
NQ=${NQ:-1000}
STREAMS=${STREAMS:-16}
WORKERS=${WORKERS:-15}
LISTS=${LISTS:-0}                 # 0: the index's automatic lists
RERANK=${RERANK:-true}
TYPE=${TYPE:-real[]}              # real[], vector or halfvec
ALSO_LISTS=${ALSO_LISTS:-}
MWM=${MWM:-8GB}                   # maintenance_work_mem of the builds
HNSW_MWM=${HNSW_MWM:-20GB}
SHARED_BUFFERS=${SHARED_BUFFERS:-24GB}
TARGETS=${TARGETS:-0.95 0.99}
CLIENTS=${CLIENTS:-1 64}
BENCH_S=${BENCH_S:-15}
INSERTERS=${INSERTERS:-16}
HOST_RERANK=${HOST_RERANK:-1}
PGVECTOR=${PGVECTOR:-1}
# pgvector's copy of the table: halfvec above 400 dimensions (half the disk:
# 5M x 768 as vector would not fit the machine's 64 GB disk beside the real[]
# table, 20 GB, and the WAL, kept to 8 GB there)
PGV_TYPE=${PGV_TYPE:-$([ "$DIMS" -gt 400 ] && echo halfvec || echo vector)}
# the column's type, the query vector's cast to it, the index's operator class
case "$TYPE" in
	'real[]') COLTYPE='real[]' QCAST='' OPCLASS='' COPYSUF=bin ;;
	vector | halfvec) COLTYPE="$TYPE($DIMS)" QCAST="::$TYPE($DIMS)" OPCLASS=" ${TYPE}_l2_ops" COPYSUF=$TYPE.bin
		PGV_TYPE=$TYPE ;;
	*) echo "error: TYPE must be real[], vector or halfvec" >&2; exit 1 ;;
esac
TIME_LIMIT=${TIME_LIMIT:-530}
PORT=${PORT:-5433}
W=${W:-/tmp/gpuivf-scale}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MAINTENANCE_WORK_MEM=$MWM
mkdir -p "$OUT"
: > "$OUT/progress.txt"
# shellcheck source=test/gpu/cluster_lib.sh
source "$REPO/test/gpu/cluster_lib.sh"
trap stop_servers EXIT
say() { echo "== [$(( $(date +%s) - started ))s] $*" | tee -a "$OUT/progress.txt"; }
left() { echo $(( TIME_LIMIT - ($(date +%s) - started) )); }
now() { date +%s.%N; }
secs() { awk "BEGIN { printf \"%.1f\", $2 - $1 }"; }

# ------------------------------------------------------------ PostgreSQL
setup_postgres "$KIT" vector.so
[ -n "$GPUS" ] && printf '%s\n' "$GPUS" >> "$OUT/progress.txt"
g++ -O3 -march=native -std=c++17 -I"$REPO/test/tools" "$REPO/test/tools/gpuivf_gen.cpp" -o "$W/gpuivf_gen" || exit 1
chown -R "$PGUSER_OS" "$W"
# 5M x 768: the WAL kept to 8 GB beside the tables on the machine's 64 GB disk
wal=()
[ "$DIMS" -gt 400 ] && wal=("max_wal_size = 8GB")
start_server pg "$PORT" "listen_addresses = ''" "shared_preload_libraries = 'gpuivf'" "max_connections = 200" \
	"max_worker_processes = 40" "max_parallel_workers = 32" "max_parallel_maintenance_workers = $WORKERS" "${wal[@]}"
sleep 2
if [ "$TYPE" = 'real[]' ]; then sql "CREATE EXTENSION gpuivf;"; else sql "CREATE EXTENSION gpuivf_vector CASCADE;"; fi
wait_worker_ready
say "worker: $(sql "SELECT string_agg(state || ' ' || coalesce(device_name, '') || ' ' || coalesce(message, ''), '; ') FROM gpuivf_stat")"

# -------------------------------------------------- memory while it builds
# Peak RssAnon (private memory) of the building backend, its parallel
# workers (largest, and their sum at any one time) and the GPU worker, and
# the GPU's memory in use; sampled every 0.5 s until $W/mem.stop appears.
mem_sampler() {
	local leader=0 wmax=0 wsum=0 gpuw=0 gmem=0 s m g
	rm -f "$W/mem.stop"
	while [ ! -f "$W/mem.stop" ]; do
		s=0
		for pid in $(ps -u "$PGUSER_OS" -o pid=); do
			m=$(awk '/^RssAnon/ { print $2 }' "/proc/$pid/status" 2>/dev/null)
			[ -z "$m" ] && continue
			case "$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null)" in
				*"parallel worker"*) s=$((s + m)); [ "$m" -gt "$wmax" ] && wmax=$m ;;
				*"CREATE INDEX"*) [ "$m" -gt "$leader" ] && leader=$m ;;
				*"gpuivf gpu worker"*) [ "$m" -gt "$gpuw" ] && gpuw=$m ;;
			esac
		done
		[ "$s" -gt "$wsum" ] && wsum=$s
		g=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
		[ -n "$g" ] && [ "$g" -gt "$gmem" ] && gmem=$g
		echo "leader_MB=$((leader / 1024)) worker_max_MB=$((wmax / 1024)) workers_sum_MB=$((wsum / 1024)) gpu_worker_MB=$((gpuw / 1024)) gpu_mem_MiB=$gmem" > "$W/mem.txt"
		sleep 0.5
	done
}

# ------------------------------------------------------------------ 1. data
say "1. data: $ROWS x $DIMS, $NQ queries, $STREAMS streams"
storage=$([ "$DIMS" -gt 400 ] && echo PLAIN || echo EXTENDED)   # a 768-float real[] fits a page
sql "CREATE TABLE items (id bigint, v $COLTYPE); ALTER TABLE items ALTER v SET STORAGE $storage;
     CREATE TABLE queries (id bigint PRIMARY KEY, v real[]); CREATE TABLE truth (qid int, rank int, id bigint);"
"$W/gpuivf_gen" --rows "$ROWS" --dims "$DIMS" --queries "$NQ" --query "$W/queries.bin" --query "$W/queries.fvecs" >/dev/null || exit 1
chown "$PGUSER_OS" "$W"/queries.*
# the exact top-10 needs numpy (torch for speed); without, recall is not measured
truth=$(python3 -c 'import numpy' 2>/dev/null && echo 1 || echo 0)
t0=$(now)
parts=()
for ((k = 0; k < STREAMS; k++)); do
	mkfifo "$W/copy$k.$COPYSUF"
	[ "$truth" = 1 ] && mkfifo "$W/part$k.fvecs" && parts+=("$W/part$k.fvecs")
	chown "$PGUSER_OS" "$W/copy$k.$COPYSUF"
done
truth_pid=
if [ "$truth" = 1 ]; then
	python3 "$REPO/test/bench/scale_truth.py" $([ "$TYPE" = halfvec ] && echo --half) "$W/queries.fvecs" 10 "$ROWS" "$W/truth.tsv" "${parts[@]}" > "$W/truth.log" 2>&1 &
	truth_pid=$!
fi
gens=()
for ((k = 0; k < STREAMS; k++)); do
	as_pg "psql -X -q -c \"COPY items FROM '$W/copy$k.$COPYSUF' WITH (FORMAT binary)\"" > "$W/copy$k.log" 2>&1 &
	gens+=($!)
	"$W/gpuivf_gen" --rows "$ROWS" --dims "$DIMS" --part "$k/$STREAMS" --base "$W/copy$k.$COPYSUF" \
		${parts[$k]:+--base "${parts[$k]}"} > /dev/null &
	gens+=($!)
done
wait "${gens[@]}"
t1=$(now)
[ -n "$truth_pid" ] && wait "$truth_pid"
t2=$(now)
sql "COPY queries FROM '$W/queries.bin' WITH (FORMAT binary);" || exit 1
if [ -f "$W/truth.tsv" ]; then
	chown "$PGUSER_OS" "$W/truth.tsv"
	sql "COPY truth FROM '$W/truth.tsv';"
else
	echo "no exact results (numpy missing): recall not measured" > "$W/truth.log"
fi
sql "VACUUM ANALYZE items; VACUUM ANALYZE queries;"
t3=$(now)
LOAD_S=$(secs "$t0" "$t1")
VACUUM_S=$(secs "$t2" "$t3")
HEAP=$(sql "SELECT pg_size_pretty(pg_table_size('items'))")
say "   loaded $(sql "SELECT count(*) FROM items") rows in ${LOAD_S}s ($STREAMS COPY streams), truth $(tail -1 "$W/truth.log") after $(secs "$t1" "$t2")s more, VACUUM ANALYZE ${VACUUM_S}s; table $HEAP"

# ------------------------------------------------------------ 2. the build
# build_index LISTS: CREATE INDEX items_gpuivf (LISTS 0: automatic); sets
# with, BUILD_S, BUILD_MEM, PHASES, CALIB, INDEX_SIZE, INFO
build_index() {
	local mem_pid t0 t1 bytes
	with="rerank = $RERANK"
	[ "$1" != 0 ] && with="$with, lists = $1"
	say "2. CREATE INDEX USING gpuivf (v$OPCLASS) WITH ($with), $WORKERS workers, maintenance_work_mem $MWM"
	mem_sampler &
	mem_pid=$!
	t0=$(now)
	sql "SET gpuivf.device = gpu; SET client_min_messages = debug1; CREATE INDEX items_gpuivf ON items USING gpuivf (v$OPCLASS) WITH ($with);" 2> "$W/build.log" || { tail -5 "$W/build.log"; }
	t1=$(now)
	touch "$W/mem.stop"; wait "$mem_pid"
	BUILD_S=$(secs "$t0" "$t1")
	BUILD_MEM=$(cat "$W/mem.txt" 2>/dev/null)
	PHASES=$(grep -ho 'gpuivf build of "[^"]*": [0-9]* rows.*' "$W/build.log" | sed 's/^gpuivf build of "[^"]*": //')
	CALIB=$(grep -ho 'calibrated on .*' "$W/build.log" | head -1)
	INDEX_SIZE=$(sql "SELECT pg_size_pretty(pg_relation_size('items_gpuivf'))")
	bytes=$(sql "SELECT pg_relation_size('items_gpuivf')")
	INFO=$(sql "SELECT format('lists %s, pq_m %s, probes %s, re-rank depths measured %s', i->>'lists', i->>'pq_m', i->'probes'->>'in_use', coalesce(i->'calibration'->>'depths', '-')) FROM (SELECT gpuivf_index_info('items_gpuivf') i) s")
	say "   ${BUILD_S}s, index $INDEX_SIZE ($INFO); $BUILD_MEM"
	say "   phases: $PHASES"
	say "   calibration: $CALIB"
	grep -h 'NOTICE\|ERROR' "$W/build.log" | head -5 | tee -a "$OUT/progress.txt"
	echo "gpuivf,\"$with; $WORKERS workers\",$ROWS,$DIMS,$BUILD_S,${bytes:-0}" >> "$OUT/build.csv"
	BUILD_ROWS+=("| CREATE INDEX ($with, $WORKERS workers) | ${BUILD_S} s, index $INDEX_SIZE ($INFO) |"
		"| build phases | $PHASES |" "| calibration | $CALIB |" "| peak memory during the build | $BUILD_MEM |")
}
BUILD_ROWS=()
echo "system,params,rows,dims,build_s,index_bytes" > "$OUT/build.csv"
build_index "$LISTS"

# ---------------------------------------------- 3. recall and throughput
cat > "$W/knn.sql" <<EOF
\set q random(0, $((NQ - 1)))
SELECT id FROM items ORDER BY v <-> (SELECT v$QCAST FROM queries WHERE id = :q) LIMIT 10;
EOF
chown "$PGUSER_OS" "$W/knn.sql"
recall() {   # settings -> recall@10 over all queries ("-" without exact results)
	[ "$(sql "SELECT count(*) > 0 FROM truth")" = t ] || { echo "-"; return; }
	sql "$1 SELECT round(avg(hit), 4) FROM (SELECT (SELECT count(*) FROM truth t WHERE t.qid = q.id AND t.id = ANY (
	       ARRAY(SELECT i.id FROM items i ORDER BY i.v <-> q.v$QCAST LIMIT 10))) / 10.0 AS hit FROM queries q) s"
}
# the GPU workers' queries, batches and GPU time (ms), and the machine's
# busy and total CPU ticks (/proc/stat)
wcount() { sql "SELECT coalesce(sum(queries), 0) || ' ' || coalesce(sum(batches), 0) || ' ' || coalesce(sum(gpu_time_ms), 0) FROM gpuivf_stat"; }
cputicks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 }' /proc/stat; }
# pgbench LABEL CLIENTS SCRIPT OPTIONS -> "tps p50 p99" (ms, from the
# transaction log); $W/stats_LABEL.txt: the GPU workers' busy share (GPU
# time / wall), their mean batch and the machine's CPU busy share meanwhile
bench() {
	local c=$2 j=$(($2 < 16 ? $2 : 16)) w0 w1 c0 c1 t0 t1 tps
	rm -f "$W"/pgb_"$1"*
	w0=$(wcount); c0=$(cputicks); t0=$(now)
	as_pg "PGOPTIONS='$4' pgbench -n -M prepared -c $c -j $j -T $BENCH_S -l --log-prefix=$W/pgb_$1 -f $3 postgres" > "$W/pgbench_$1.log" 2>&1
	t1=$(now); c1=$(cputicks); w1=$(wcount)
	echo "$w0 $w1 $c0 $c1 $t0 $t1" | awk '{ wall = ($12 - $11) * 1000; b = $5 - $2; tot = $10 - $8
		gpu = 0; batch = 0; cpu = 0
		if (wall > 0) gpu = 100 * ($6 - $3) / wall
		if (b > 0) batch = ($4 - $1) / b
		if (tot > 0) cpu = 100 * ($9 - $7) / tot
		printf "GPU busy %.0f %%, mean batch %.1f, CPU busy %.0f %%\n", gpu, batch, cpu }' > "$W/stats_$1.txt"
	tps=$(awk '/^tps/ { printf "%.0f", $3; exit }' "$W/pgbench_$1.log")
	cat "$W"/pgb_"$1"* 2>/dev/null | awk '{ print $3 / 1000.0 }' | sort -n |
		awk -v tps="${tps:-0}" '{ a[NR] = $1 } END { if (NR) printf "%s %.3f %.3f\n", tps, a[int(NR * 0.5) + 1], a[int(NR * 0.99) + 1]; else print tps " - -" }'
}
echo "system,device,params,rows,dims,queries,metric,knob,value,clients,recall_at_10,qps,lat_avg_ms,lat_p50_ms,lat_p99_ms" > "$OUT/results.csv"
RES_ROWS=()
# measure TARGET STEP: the index's probes and recall@10 at TARGET, and QPS
# at each CLIENTS count
measure() {
	local target=$1 set_t probes r c tps p50 p99
	set_t="SET gpuivf.device = gpu; SET gpuivf.target_recall = $target;"
	probes=$(sql "LOAD 'gpuivf'; $set_t SELECT format('%s (re-rank %s)', p->>'in_use', coalesce(p->>'rerank_candidates', '-')) FROM (SELECT gpuivf_index_info('items_gpuivf') -> 'probes' AS p) s")
	r=$(recall "$set_t")
	say "$2. target $target: probes $probes, recall@10 $r"
	for c in $CLIENTS; do
		read -r tps p50 p99 <<< "$(bench "t${target}_c$c" "$c" "$W/knn.sql" "-c gpuivf.device=gpu -c gpuivf.target_recall=$target")"
		RES_ROWS+=("| $with; target $target: probes $probes, recall@10 $r, $c clients | $tps QPS, p50 $p50 ms, p99 $p99 ms; $(cat "$W/stats_t${target}_c$c.txt") |")
		say "   $c clients: $tps QPS, p50 $p50 ms, p99 $p99 ms; $(cat "$W/stats_t${target}_c$c.txt")"
		echo "gpuivf,gpu,\"$with\",$ROWS,$DIMS,$NQ,l2,target_recall,$target,$c,$r,$tps,0,$p50,$p99" >> "$OUT/results.csv"
	done
}
for target in $TARGETS; do
	[ "$(left)" -lt 60 ] && { say "3. SKIPPED target $target: out of time"; continue; }
	measure "$target" 3
done

# ------------------------------------- 3a. settings side by side (SWEEP)
# worker_times FROM -> the GPU worker's DEBUG1 time breakdown logged since
# byte FROM of the server log, summed: where its one thread spent the run
worker_times() {
	tail -c +$(($1 + 1)) "$W/pg/server.log" | grep -o 'in [0-9.]* s: [0-9]* searches of .* idle [0-9]* ms' |
		awk '{ gsub(/[^0-9. ]/, " "); n = split($0, f, " +"); k = 0
		       for (i = 1; i <= n; i++) if (f[i] != "" && f[i] != ".") s[++k] += f[i] }
		     END { if (!NR) { print "no DEBUG1 breakdown"; exit }
		       w = s[1] * 1000; printf "worker thread over %.0f s: take %.0f %%, prepare %.0f %%, engine start %.0f %%, waiting for the GPU %.0f %%, answer %.0f %%, polling %.0f %%, idle %.0f %%; %.1f requests a search\n",
		       s[1], 100 * s[4] / w, 100 * s[5] / w, 100 * s[6] / w, 100 * s[7] / w, 100 * s[8] / w, 100 * s[9] / w, 100 * s[10] / w, (s[2] ? s[3] / s[2] : 0) }'
}
# SWEEP="default search_streams=2 search_streams=1,answer_spin=0 ...": each
# entry's gpuivf settings (comma-separated; "default": none) set with ALTER
# SYSTEM and the server restarted (search_streams is read at start), then
# recall@10 and pgbench at SWEEP_CLIENTS at the first target, with the
# worker's time breakdown; the settings are reset after each entry.
SWEEP=${SWEEP:-}
SWEEP_CLIENTS=${SWEEP_CLIENTS:-64}
for entry in $SWEEP; do
	[ "$(left)" -lt $((BENCH_S * $(echo $SWEEP_CLIENTS | wc -w) + 40)) ] && { say "3a. SKIPPED $entry: out of time"; continue; }
	target=${TARGETS%% *}
	names=()
	sets="ALTER SYSTEM SET log_min_messages = debug1;"
	if [ "$entry" != default ]; then
		for kv in ${entry//,/ }; do
			names+=("${kv%%=*}")
			sets="$sets ALTER SYSTEM SET gpuivf.${kv%%=*} = '${kv#*=}';"
		done
	fi
	sql "$sets" >/dev/null
	restart_server pg
	set_t="SET gpuivf.device = gpu; SET gpuivf.target_recall = $target;"
	probes=$(sql "LOAD 'gpuivf'; $set_t SELECT format('%s (re-rank %s)', p->>'in_use', coalesce(p->>'rerank_candidates', '-')) FROM (SELECT gpuivf_index_info('items_gpuivf') -> 'probes' AS p) s")
	r=$(recall "$set_t")
	say "3a. $entry, target $target: probes $probes, recall@10 $r"
	for c in $SWEEP_CLIENTS; do
		log_from=$(stat -c %s "$W/pg/server.log")
		read -r tps p50 p99 <<< "$(bench "sw_${entry//[=,]/_}_c$c" "$c" "$W/knn.sql" "-c gpuivf.device=gpu -c gpuivf.target_recall=$target")"
		say "   $c clients: $tps QPS, p50 $p50 ms, p99 $p99 ms; $(cat "$W/stats_sw_${entry//[=,]/_}_c$c.txt"); $(worker_times "$log_from")"
		echo "gpuivf,gpu,\"$with; $entry\",$ROWS,$DIMS,$NQ,l2,target_recall,$target,$c,$r,$tps,0,$p50,$p99" >> "$OUT/results.csv"
	done
	sets="ALTER SYSTEM RESET log_min_messages;"
	for n in "${names[@]}"; do sets="$sets ALTER SYSTEM RESET gpuivf.$n;"; done
	sql "$sets" >/dev/null
done
[ -n "$SWEEP" ] && restart_server pg

# ------------------------------- 3b. an index twice the GPU memory limit
HOST="not run"
if [ "$HOST_RERANK" = 1 ] && [ "$RERANK" = true ] && [ "$(left)" -gt $((3 * BENCH_S + 60)) ]; then
	target=${TARGETS%% *}
	full=$(sql "SELECT max((e->>'bytes')::bigint) FROM jsonb_array_elements(gpuivf_index_info('items_gpuivf') -> 'gpu_cache') e")
	if [ -n "$full" ] && [ "$full" -gt 0 ]; then
		sql "ALTER SYSTEM SET gpuivf.gpu_memory_limit = '$((full / 2048))kB'; SELECT pg_reload_conf();" >/dev/null
		sleep 2
		set_t="SET gpuivf.device = gpu; SET gpuivf.target_recall = $target;"
		r=$(recall "$set_t")
		HOST="gpu_memory_limit $((full / 2048 / 1024)) MB (the copy with vectors: $((full >> 20)) MB); recall@10 $r"
		for c in $CLIENTS; do
			read -r tps p50 p99 <<< "$(bench "host_c$c" "$c" "$W/knn.sql" "-c gpuivf.device=gpu -c gpuivf.target_recall=$target")"
			HOST="$HOST; $c clients $tps QPS (p50 $p50, p99 $p99 ms; $(cat "$W/stats_host_c$c.txt"))"
			echo "gpuivf host re-rank,gpu,\"$with; gpu_memory_limit $((full / 2048))kB\",$ROWS,$DIMS,$NQ,l2,target_recall,$target,$c,$r,$tps,0,$p50,$p99" >> "$OUT/results.csv"
		done
		where=$(sql "SELECT string_agg(format('%s MB, rerank %s', (e->>'bytes')::bigint >> 20, e->>'rerank'), '; ') FROM jsonb_array_elements(gpuivf_index_info('items_gpuivf') -> 'gpu_cache') e")
		HOST="$HOST; GPU copies after: $where"
		sql "ALTER SYSTEM RESET gpuivf.gpu_memory_limit; SELECT pg_reload_conf();" >/dev/null
		sleep 2
	else
		HOST="not run: the index has no GPU copy"
	fi
	say "3b. index over the GPU limit, target $target: $HOST"
fi

# ------------------------------------------------------------- 4. inserts
# catchup_summary FILE -> count and median / max of the catch-ups' times (ms)
# from the worker's DEBUG1 lines ("... in T ms (walking the lists W ms,
# reading vectors V ms, to the engine E ms); walked L of N lists")
catchup_summary() {
	local nrem ngen
	nrem=$(grep -c 'only inserts: no' "$1")
	ngen=$(grep -c 'by the generation: no' "$1")
	sed -n 's/.*: \([0-9]*\) entries of \([0-9]*\) list pages in \([0-9]*\) ms (walking the lists \([0-9]*\) ms, reading vectors \([0-9]*\) ms, to the engine \([0-9]*\) ms)\(; walked \([0-9]*\) of \([0-9]*\) lists\)\{0,1\}.*/\1 \2 \3 \4 \5 \6 \8 \9/p' "$1" |
		awk -v nrem="$nrem" -v ngen="$ngen" 'function med(a, n,   i, j, t) { for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t } return n ? a[int((n + 1) / 2)] : 0 }
		     function mx(a, n,   i, m) { m = 0; for (i = 1; i <= n; i++) if (a[i] > m) m = a[i]; return m }
		     { n++; e[n] = $1; p[n] = $2; t[n] = $3; w[n] = $4; v[n] = $5; g[n] = $6; if ($8 != "") { nk++; l[nk] = $7; nl = $8 } }
		     END { if (!n) { print "no DEBUG1 catch-up lines"; exit }
		           printf "%d logged (%d removed entries first; %d saw the generation move: a VACUUM meanwhile); median / max: %s / %s ms in all, walking %s / %s ms, vectors %s / %s ms, engine %s / %s ms, entries %s / %s, list pages %s / %s, lists walked %s / %s of %s\n",
		             n, nrem, ngen, med(t, n), mx(t, n), med(w, n), mx(w, n), med(v, n), mx(v, n), med(g, n), mx(g, n), med(e, n), mx(e, n), med(p, n), mx(p, n), (nk ? med(l, nk) : "-"), (nk ? mx(l, nk) : "-"), (nk ? nl : "-") }'
}
INSERTS="not run"
if [ "$INSERTERS" -gt 0 ] && [ "$(left)" -gt $((BENCH_S + 40)) ]; then
	sql "CREATE SEQUENCE ins_ids START 1000000000;"
	cat > "$W/ins.sql" <<EOF
\set q random(0, $((NQ - 1)))
INSERT INTO items SELECT nextval('ins_ids'), (ARRAY(SELECT x + 0.01 * (random() - 0.5) FROM unnest(v) x)::real[])$QCAST FROM queries WHERE id = :q;
EOF
	chown "$PGUSER_OS" "$W/ins.sql"
	# the worker's catch-ups meanwhile: its DEBUG1 line per catch-up (SyncCopy)
	sql "ALTER SYSTEM SET log_min_messages = debug1; SELECT pg_reload_conf();" >/dev/null
	sleep 1
	log_from=$(stat -c %s "$W/pg/server.log")
	ups0=$(sql "SELECT sum(refreshes) FROM gpuivf_stat")
	bench ins "$INSERTERS" "$W/ins.sql" "" > "$W/ins.res" &
	ins_pid=$!
	read -r qtps qp50 qp99 <<< "$(bench mixq 64 "$W/knn.sql" "-c gpuivf.device=gpu")"
	wait "$ins_pid"
	read -r itps _ ip99 < "$W/ins.res"
	ups=$(( $(sql "SELECT sum(refreshes) FROM gpuivf_stat") - ups0 ))
	sql "ALTER SYSTEM RESET log_min_messages; SELECT pg_reload_conf();" >/dev/null
	tail -c +$((log_from + 1)) "$W/pg/server.log" | grep 'GPU worker caught up index' > "$W/catchup.log"
	CATCHUP=$(catchup_summary "$W/catchup.log")
	fresh=0
	for k in $(seq 1 20); do
		got=$(sql "INSERT INTO items SELECT -$k, (ARRAY(SELECT x + 0.5 FROM unnest(v) x)::real[])$QCAST FROM queries WHERE id = $k;
		           SET gpuivf.device = gpu; SELECT id FROM items ORDER BY v <-> (SELECT (ARRAY(SELECT x + 0.5 FROM unnest(v) x)::real[])$QCAST FROM queries WHERE id = $k) LIMIT 1;" 2>&1)
		[ "$got" = "-$k" ] && fresh=$((fresh + 1))
	done
	INSERTS="$INSERTERS inserting: $itps rows/s (p99 $ip99 ms); 64 querying meanwhile: $qtps QPS, p99 $qp99 ms ($(cat "$W/stats_mixq.txt")); committed rows found by the next GPU query: $fresh of 20; catch-ups of the GPU copy: $ups ($CATCHUP)"
	say "4. $INSERTS"
fi

# ------------------------------------------------- 4b. other list counts
for lists in $ALSO_LISTS; do
	[ "$(left)" -lt $((2 * BENCH_S * $(echo $CLIENTS | wc -w) + 90)) ] && { say "4b. SKIPPED lists $lists: out of time"; continue; }
	# the index of the original rows: step 4's rows (near copies of the
	# queries) would change the exact answers
	sql "DROP INDEX items_gpuivf; DELETE FROM items WHERE id < 0 OR id >= $ROWS; VACUUM items;"
	build_index "$lists"
	measure "${TARGETS%% *}" 4b
done

# ------------------------------------------------------------ 5. pgvector
PGV="not run"
if [ "$PGVECTOR" = 1 ] && [ "$(sql "SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'")" = 1 ] && [ "$(left)" -gt 90 ]; then
	t0=$(now)
	PGV_TABLE=$([ "$TYPE" = 'real[]' ] && echo items_v || echo items)
	if [ "$TYPE" = 'real[]' ]; then
		sql "CREATE EXTENSION vector; CREATE TABLE items_v (id bigint, v $PGV_TYPE($DIMS));"
		for ((k = 0; k < STREAMS; k++)); do
			sql "INSERT INTO items_v SELECT id, v::vector($DIMS)::$PGV_TYPE($DIMS) FROM items WHERE id >= 0 AND id < $ROWS AND id % $STREAMS = $k;" &
		done
		wait
		sql "VACUUM ANALYZE items_v;"
		say "5. pgvector: $PGV_TYPE($DIMS) copy of the table in $(secs "$t0" "$(now)")s"
	else
		say "5. pgvector: on the same $PGV_TYPE($DIMS) table"
	fi
	# pgvector_build NAME DDL -> a line: time, or how far it got when cut short
	pgvector_build() {
		local budget=$(( $(left) - 20 )) t0 res prog
		[ "$budget" -lt 30 ] && { echo "$1 not run: out of time"; return; }
		t0=$(now)
		( while sleep 5; do sql "SELECT format('%s s: %s, blocks %s/%s, tuples %s/%s', round(extract(epoch FROM now() - a.query_start)), p.phase, p.blocks_done, p.blocks_total, p.tuples_done, p.tuples_total) FROM pg_stat_progress_create_index p JOIN pg_stat_activity a USING (pid)" >> "$W/progress_$1.txt" 2>/dev/null; done ) &
		local mon=$!
		res=$(sql "SET maintenance_work_mem = '$HNSW_MWM'; SET max_parallel_maintenance_workers = $WORKERS; SET statement_timeout = '${budget}s'; $2" 2>&1)
		kill "$mon" 2>/dev/null; wait "$mon" 2>/dev/null
		prog=$(grep -v '^$' "$W/progress_$1.txt" 2>/dev/null | tail -1)
		if echo "$res" | grep -q ERROR; then
			echo "$1 cut short after $(secs "$t0" "$(now)")s ($(echo "$res" | grep -o 'ERROR.*' | head -1)); last progress: $prog"
		else
			echo "$1 built in $(secs "$t0" "$(now)")s, $(sql "SELECT pg_size_pretty(pg_relation_size('items_v_$1'))")"
		fi
	}
	lists_v=$([ "$LISTS" != 0 ] && echo "$LISTS" || awk "BEGIN { n = $ROWS; print (n <= 1000000 ? int(n / 1000) : int(sqrt(n))) }")
	H=$(pgvector_build hnsw "CREATE INDEX items_v_hnsw ON $PGV_TABLE USING hnsw (v ${PGV_TYPE}_l2_ops) WITH (m = 16, ef_construction = 64);")
	say "   $H"
	I=$(pgvector_build ivfflat "CREATE INDEX items_v_ivfflat ON $PGV_TABLE USING ivfflat (v ${PGV_TYPE}_l2_ops) WITH (lists = $lists_v);")
	say "   $I"
	PGV="$H; $I"
fi

# ------------------------------------------------------------- summary
{
	echo "# gpuivf at $ROWS x $DIMS ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
	echo
	echo "| | |"
	echo "|---|---|"
	echo "| load of $COLTYPE rows ($STREAMS binary COPY streams) | ${LOAD_S} s (VACUUM ANALYZE ${VACUUM_S} s), table $HEAP |"
	printf '%s\n' "${BUILD_ROWS[@]}" "${RES_ROWS[@]}"
	echo "| index twice the GPU limit (codes on the GPU, re-rank on the host) | $HOST |"
	echo "| inserts | $INSERTS |"
	echo "| pgvector | $PGV |"
	echo
	echo "elapsed $(( $(date +%s) - started )) s"
} > "$OUT/summary.md"
cat "$OUT/summary.md"
python3 "$REPO/test/bench/plot.py" "$OUT" >/dev/null 2>&1 || true
cp "$W/build.log" "$W/pg/server.log" "$OUT/" 2>/dev/null
stop_servers
