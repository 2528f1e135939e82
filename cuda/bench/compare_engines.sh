#!/bin/bash
# cuda/bench/compare_engines.sh OLD NEW — on the GPU machine, from the
# repository root (carry .device/cuda: the kit of make_device_kit.sh, and
# the baseline tree it extracts to .device/cuda/old):
#   1. builds the GPU engine (tests + gpuivf_bench) of both trees, in parallel;
#   2. runs both trees' GPU tests and compute-sanitizer memcheck (leak check)
#      of NEW on the sanitizer set, in parallel (correctness only);
#   3. runs gpuivf_bench of each tree alternately on the one card (OLD NEW,
#      then NEW OLD, ...: ROUNDS rounds, none started that would end past
#      BUDGET seconds);
#   4. prints a table last: per case the median of OLD and NEW, the change,
#      and each side's spread over its runs.
# Under $OUT (at most 7 files): build.log test_old.log test_new.log
# memcheck_new.log bench.log compare.tsv (every case) summary.txt.
# BENCH_ARGS: extra arguments of gpuivf_bench (e.g. --large-only).
# Each step has a time limit (BUILD_TIMEOUT, TEST_TIMEOUT, SAN_TIMEOUT,
# BENCH_TIMEOUT seconds) so that the whole stays under 8 minutes.
set -u
[ $# -eq 2 ] || { echo "usage: cuda/bench/compare_engines.sh OLD_TREE NEW_TREE" >&2; exit 2; }
old=$(cd "$1" && pwd) && new=$(cd "$2" && pwd) || exit 2
OUT=${OUT:-$PWD/bench-out}
ROUNDS=${ROUNDS:-2}
BUDGET=${BUDGET:-400}
JOBS=${JOBS:-8}
export BUILD_TIMEOUT=${BUILD_TIMEOUT:-240}
TEST_TIMEOUT=${TEST_TIMEOUT:-180}
SAN_TIMEOUT=${SAN_TIMEOUT:-180}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-120}
W=/tmp/gpuivf-compare
rm -rf "$W" && mkdir -p "$W" "$OUT"
. "$new/cuda/bench/device_kit.sh"
SAN_FILTER=${SAN_FILTER:-$SANITIZER_TESTS:IvfPq.ProbesPerBlockGiveTheSameResults}
say() { echo "[$SECONDS s] $*" | tee -a "$OUT/summary.txt"; }
: >"$OUT/summary.txt"
say "old $old, new $new"
say "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"

# 1. builds
for t in old new; do
	(build_engine "${!t}" "$W/$t" "$JOBS" >"$W/build_$t.log" 2>&1; echo $? >"$W/build_$t.rc") &
done
wait
cat "$W/build_old.log" "$W/build_new.log" >"$OUT/build.log"
for t in old new; do
	if [ "$(cat "$W/build_$t.rc")" != 0 ]; then
		say "the $t tree failed to build:"
		grep -E "error" "$W/build_$t.log" | head -20
		exit 1
	fi
done
say "built both trees"

# 2. tests and memcheck, side by side
for t in old new; do
	(timeout "$TEST_TIMEOUT" "$W/$t/cuda/test/gpuivf_cuda_tests" >"$OUT/test_$t.log" 2>&1
		echo $? >"$W/test_$t.rc") &
done
if command -v compute-sanitizer >/dev/null; then
	(timeout "$SAN_TIMEOUT" compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 \
		"$W/new/cuda/test/gpuivf_cuda_tests" --gtest_filter="$SAN_FILTER" >"$OUT/memcheck_new.log" 2>&1
		echo $? >"$W/memcheck.rc") &
else
	echo "compute-sanitizer not found" >"$OUT/memcheck_new.log"
	echo 127 >"$W/memcheck.rc"
fi
wait
for t in old new; do
	say "tests $t: rc $(cat "$W/test_$t.rc"), $(grep -E '^\[==========\] .* ran' "$OUT/test_$t.log" | tail -1)" \
		"$(grep -E '^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]' "$OUT/test_$t.log" | tr '\n' ' ')"
	grep -E '^\[  FAILED  \] [A-Za-z]' "$OUT/test_$t.log" | head -10 | tee -a "$OUT/summary.txt"
done
say "memcheck new: rc $(cat "$W/memcheck.rc"), $(grep -E 'ERROR SUMMARY|LEAK SUMMARY|not found' "$OUT/memcheck_new.log" |
	tr '\n' ' ')$(grep -c -E '^\[       OK \]' "$OUT/memcheck_new.log") tests ok"

# 3. benchmarks, alternating
: >"$OUT/bench.log"
bench() { # tree run
	local dir=$W/bench_$1_$2 t0=$SECONDS rc
	mkdir -p "$dir"
	timeout "$BENCH_TIMEOUT" "$W/$1/cuda/bench/gpuivf_bench" --out "$dir" ${BENCH_ARGS:-} >"$dir/log" 2>&1
	rc=$?
	{ echo "== $1 tree, run $2: rc $rc, $((SECONDS - t0)) s"; cat "$dir/log"; } >>"$OUT/bench.log"
	rm -f "$dir"/ivf_*
	say "bench $1 run $2: rc $rc, $((SECONDS - t0)) s"
}
pair=0
for r in $(seq 1 "$ROUNDS"); do
	if [ "$r" -gt 1 ] && [ $((SECONDS + pair)) -gt "$BUDGET" ]; then
		say "stopping after $((r - 1)) round(s): another would end past ${BUDGET} s"
		break
	fi
	t0=$SECONDS
	if [ $((r % 2)) = 1 ]; then bench old "$r"; bench new "$r"; else bench new "$r"; bench old "$r"; fi
	pair=$((SECONDS - t0))
done

# 4. the table
python3 - "$W" "$OUT/compare.tsv" <<'PY' | tee -a "$OUT/summary.txt"
import glob, json, os, statistics, sys
w, tsv = sys.argv[1], sys.argv[2]
runs = {}
for side in ("old", "new"):
    runs[side] = []
    for path in sorted(glob.glob(os.path.join(w, "bench_%s_*" % side, "results.json"))):
        with open(path) as f:
            runs[side].append(json.load(f))
if not runs["old"] or not runs["new"]:
    print("no benchmark results to compare (%d old, %d new runs)" % (len(runs["old"]), len(runs["new"])))
    sys.exit(0)
keys = list(runs["new"][0]) + [k for k in runs["old"][0] if k not in runs["new"][0]]
def stat(side, k):
    v = [r[k] for r in runs[side] if k in r]
    return (statistics.median(v), min(v), max(v)) if v else None
def fmt(x):
    return "-" if x is None else ("{:,.0f}".format(x) if abs(x) >= 1000 else "%.4g" % x)
with open(tsv, "w") as f:
    f.write("case\told_median\tnew_median\tchange_pct\told_min\told_max\tnew_min\tnew_max\n")
    for k in keys:
        o, n = stat("old", k), stat("new", k)
        ch = (100.0 * (n[0] - o[0]) / o[0]) if o and n and o[0] else None
        f.write("\t".join([k, fmt(o and o[0]), fmt(n and n[0]), fmt(ch), fmt(o and o[1]), fmt(o and o[2]),
                           fmt(n and n[1]), fmt(n and n[2])]) + "\n")
head = ["copy_GBps", "select_k100_ms", "select_k10_ms", "select_k1000_ms", "knn_gemm_only_ms",
        "knn_gemm_select_ms", "knn_exact_rescore_ms", "kmeans_1M_1024_20it_s", "ivfpq_train_default_s",
        "encode_1M_s", "ivfpq_QPS", "ivfpq_recall10", "ivfpq_perlist_lut_QPS", "ivfpq_rerank40_QPS",
        "ivfpq_rerank40_recall10", "ivfpq_batch100_QPS", "ivf_coarse_only_ms",
        "worker_perlist_b1_us", "worker_perlist_b8_us", "worker_perlist_b64_us", "worker_perlist_b256_us",
        "worker_auto_b8_us", "worker_perlist_b16_enqueue_us", "worker_tput_perlist_s4_b8_qps",
        "worker_tput_perlist_r200_s4_b8_qps", "worker_tput_perlist_r200_s8_b8_qps",
        "worker_tput_perlist_r200_s4_b16_qps", "worker_tput_auto_r200_s4_b8_qps",
        "worker_tput_perlist_r200_s8_b8_mpb4_qps", "worker_perlist_b1_mpb4_us",
        "large_r800_b1_us", "large_r800_b4_us", "large_r800_b8_us", "large_tput_r800_s16_b4_qps",
        "large_tput_r800_s16_b4_mpb5_qps", "large_tput_r200_s16_b4_qps"]
print("%d old and %d new runs; median (min-max); every case in compare.tsv" % (len(runs["old"]), len(runs["new"])))
print("%-40s %26s %26s %8s" % ("case", "old", "new", "change"))
for k in head:
    o, n = stat("old", k), stat("new", k)
    if not o and not n:
        continue
    cell = lambda s: "-" if s is None else "%s (%s-%s)" % (fmt(s[0]), fmt(s[1]), fmt(s[2]))
    ch = "%+.1f%%" % (100.0 * (n[0] - o[0]) / o[0]) if o and n and o[0] else "-"
    print("%-40s %26s %26s %8s" % (k, cell(o), cell(n), ch))
PY
say "done"
