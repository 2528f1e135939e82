#!/bin/bash
# A/B of build knobs (cuda/NOTES.md): builds each variant's gpuivf_bench in
# its own directory (in parallel), then times one part of the benchmark for
# each, one after the other on the same GPU.
#   cuda/bench/ab.sh select|knn|ivfpq "FLAGS" ...
# select: select_k only (k = 10, 100); knn: the exact kNN (GEMM alone, GEMM +
# selection); ivfpq: the 1M IVF-PQ searches, the
# coarse quantizer and the worker-shaped calls; worker: the worker-shaped
# calls' latency and closed-loop throughput on 2/4/8 streams.
set -u
what=$1; shift
D=$PWD/.device-cuda
mkdir -p /tmp/gpuivf-blas && tar xJf $D/blas.tar.xz -C /tmp/gpuivf-blas
export LD_LIBRARY_PATH=/tmp/gpuivf-blas/lib:${LD_LIBRARY_PATH:-}
case $what in
  select) arg=--select-only; keys='select_k(100|10)_(ms|pct)' ;;
  knn) arg=--knn-only; keys='knn_' ;;
  ivfpq) arg=--ivfpq-only; keys='^ *(ivfpq[a-z0-9_]*_(ms|QPS|recall10)|ivf_coarse_only_ms|worker_(auto|perlist)_b(1|16|64|256)_us)' ;;
  worker) arg=--worker-only; keys='^ *worker_(perlist_b(1|8|16|64)_us|perlist_b(1|16|64)_enqueue_us|tput_[a-z0-9_]*_s(2|4|8)_b(4|8|16)_qps)' ;;
  *) echo "usage: ab.sh select|knn|ivfpq|worker FLAGS ..."; exit 2 ;;
esac
jobs=$(( 16 / $# )); [ $jobs -lt 2 ] && jobs=2
i=0
for flags in "$@"; do
  i=$((i+1))
  { cmake -S . -B /tmp/ab$i -DCMAKE_BUILD_TYPE=Release -DCMAKE_LIBRARY_PATH=/tmp/gpuivf-blas/lib \
      -DCMAKE_INCLUDE_PATH=/tmp/gpuivf-blas/include "-DCMAKE_CUDA_FLAGS=$flags" &&
    cmake --build /tmp/ab$i -j$jobs --target gpuivf_bench; } > /tmp/ab$i.log 2>&1 &
done
wait
i=0
for flags in "$@"; do
  i=$((i+1))
  echo "== variant $i '$flags'"
  [ -x /tmp/ab$i/cuda/bench/gpuivf_bench ] || { grep -E "error" /tmp/ab$i.log | head -5; continue; }
  mkdir -p /tmp/ab$i/out
  /tmp/ab$i/cuda/bench/gpuivf_bench $arg --out /tmp/ab$i/out 2>&1 | grep -E "$keys"
done
