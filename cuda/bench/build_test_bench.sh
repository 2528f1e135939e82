#!/bin/bash
# cuda/bench/build_test_bench.sh [all|test|sanitize|bench] [--quick] — on the
# GPU machine, from the repository root (carry .device/cuda, see
# device_kit.sh): builds the GPU engine's tests and benchmark, runs the GPU
# tests, compute-sanitizer memcheck (leak check) and racecheck on the
# sanitizer set, and the benchmark with the PyTorch baseline.  Logs go to
# $OUT (or ./bench-out): build.log test.log memcheck.log racecheck.log
# bench.log combined.json.
set -u
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
what=${1:-all}
quick=${2:-}
. cuda/bench/device_kit.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv
if [ "${REBUILD:-1}" = 1 ]; then
	{ time build_engine . build 16; } >"$OUT/build.log" 2>&1 ||
		{ grep -E "error|Error" "$OUT/build.log" | head -40; tail -20 "$OUT/build.log"; exit 1; }
	tail -4 "$OUT/build.log"
fi
T=build/cuda/test/gpuivf_cuda_tests
if [ "$what" = all ] || [ "$what" = test ]; then
	timeout "${TEST_TIMEOUT:-240}" $T >"$OUT/test.log" 2>&1
	echo "tests rc=$?"
	grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|FAILED  \]|recall|inertia|reconstruction|GPU:" "$OUT/test.log" | head -40
	grep -A12 "Failure" "$OUT/test.log" | head -150
fi
if [ "$what" = all ] || [ "$what" = sanitize ]; then
	filter=${SAN_FILTER:-$SANITIZER_TESTS}
	timeout "${SAN_TIMEOUT:-200}" compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 $T \
		--gtest_filter="$filter" >"$OUT/memcheck.log" 2>&1
	echo "memcheck rc=$?"
	grep -E "ERROR SUMMARY|LEAK SUMMARY|PASSED|FAILED|Invalid" "$OUT/memcheck.log" | head -20
	timeout "${SAN_TIMEOUT:-200}" compute-sanitizer --tool racecheck --error-exitcode 9 $T \
		--gtest_filter="$filter" >"$OUT/racecheck.log" 2>&1
	echo "racecheck rc=$?"
	grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED|Race" "$OUT/racecheck.log" | head -20
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
	B=/tmp/gpuivf_bench
	mkdir -p $B
	{
		timeout "${BENCH_TIMEOUT:-200}" build/cuda/bench/gpuivf_bench --out $B $quick 2>&1
		PYTHONUNBUFFERED=1 timeout "${TORCH_TIMEOUT:-150}" python3 cuda/bench/torch_baseline.py $B $quick 2>&1
	} | tee "$OUT/bench.log" | tail -45
	cp $B/combined.json "$OUT/" 2>/dev/null || cp $B/results.json "$OUT/" 2>/dev/null
fi
