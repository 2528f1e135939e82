#!/bin/bash
# Build, test, sanitize and benchmark the GPU engine on the device machine in
# one call (see cuda/NOTES.md).  Logs go to $OUT (or ./bench-out), at most six
# files: build.log test.log memcheck.log racecheck.log bench.log combined.json.
#   cuda/bench/run_device.sh [all|test|sanitize|bench] [--quick]
set -u
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
what=${1:-all}
quick=${2:-}
# Carried by the device call (ignored in git: .git/info/exclude): siftsmall and
# OpenBLAS (lib + cblas.h), which the CPU reference engine links and the
# device image may lack.
D=$PWD/.device-cuda
export GPUIVF_DATA_DIR=${GPUIVF_DATA_DIR:-$D/data}
CMAKE_EXTRA=${CMAKE_EXTRA:-}
if [ -f $D/blas.tar.xz ]; then
  mkdir -p /tmp/gpuivf-blas && tar xJf $D/blas.tar.xz -C /tmp/gpuivf-blas
  export LD_LIBRARY_PATH=/tmp/gpuivf-blas/lib:${LD_LIBRARY_PATH:-}
  CMAKE_EXTRA="$CMAKE_EXTRA -DCMAKE_LIBRARY_PATH=/tmp/gpuivf-blas/lib -DCMAKE_INCLUDE_PATH=/tmp/gpuivf-blas/include"
fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv
if [ "${REBUILD:-1}" = 1 ]; then
  { cmake -S . -B build -DCMAKE_BUILD_TYPE=Release $CMAKE_EXTRA && \
    time cmake --build build -j16 --target gpuivf_cuda_tests gpuivf_bench; } > "$OUT/build.log" 2>&1 \
    || { grep -E "error|Error" "$OUT/build.log" | head -40; tail -20 "$OUT/build.log"; exit 1; }
  tail -4 "$OUT/build.log"
fi
T=build/cuda/test/gpuivf_cuda_tests
if [ "$what" = all ] || [ "$what" = test ]; then
  timeout ${TEST_TIMEOUT:-240} $T > "$OUT/test.log" 2>&1; echo "tests rc=$?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|FAILED  \]|recall|inertia|reconstruction|GPU:" "$OUT/test.log" | head -40
  grep -A12 "Failure" "$OUT/test.log" | head -150
fi
if [ "$what" = all ] || [ "$what" = sanitize ]; then
  small=${SAN_FILTER:-'SelectK.StrideIdsAndDeviceMemory:SelectK.NaNRanksLast:ExactKnn.TiesAndPadding:IvfPq.PerQueryKAndNprobe:IvfPq.CollectCutsLongLists:IvfPq.AppendAndRemove:IvfPq.ConflictFreeScanWidths:IvfPq.PairedScanMatchesSingleQueries:IvfPq.GpuEncodingAppend:KMeans.EmptyClustersAndFewPoints'}
  timeout ${SAN_TIMEOUT:-200} compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 $T --gtest_filter="$small" > "$OUT/memcheck.log" 2>&1; echo "memcheck rc=$?"
  grep -E "ERROR SUMMARY|LEAK SUMMARY|PASSED|FAILED|Invalid" "$OUT/memcheck.log" | head -20
  timeout ${SAN_TIMEOUT:-200} compute-sanitizer --tool racecheck --error-exitcode 9 $T --gtest_filter="$small" > "$OUT/racecheck.log" 2>&1; echo "racecheck rc=$?"
  grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED|Race" "$OUT/racecheck.log" | head -20
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
  B=/tmp/gpuivf_bench; mkdir -p $B
  { timeout ${BENCH_TIMEOUT:-200} build/cuda/bench/gpuivf_bench --out $B $quick 2>&1
    PYTHONUNBUFFERED=1 timeout ${TORCH_TIMEOUT:-150} python3 cuda/bench/torch_baseline.py $B $quick 2>&1; } | tee "$OUT/bench.log" | tail -45
  cp $B/combined.json "$OUT/" 2>/dev/null || cp $B/results.json "$OUT/" 2>/dev/null
fi
