#!/bin/bash
# A/B of select_rows build knobs (NOTES.md): builds variants in their own
# build directories and times select_k only.  Usage: ab_select.sh "FLAGS" ...
set -u
D=$PWD/.device-cuda
mkdir -p /tmp/gpuivf-blas && tar xJf $D/blas.tar.xz -C /tmp/gpuivf-blas
export LD_LIBRARY_PATH=/tmp/gpuivf-blas/lib:${LD_LIBRARY_PATH:-}
i=0
for flags in "$@"; do
  i=$((i+1))
  cmake -S . -B /tmp/ab$i -DCMAKE_BUILD_TYPE=Release -DCMAKE_LIBRARY_PATH=/tmp/gpuivf-blas/lib \
    -DCMAKE_INCLUDE_PATH=/tmp/gpuivf-blas/include "-DCMAKE_CUDA_FLAGS=$flags" > /dev/null 2>&1 &&
  cmake --build /tmp/ab$i -j16 --target gpuivf_bench > /tmp/ab$i.log 2>&1 || { tail -5 /tmp/ab$i.log; continue; }
  echo "== variant '$flags'"
  /tmp/ab$i/cuda/bench/gpuivf_bench --select-only --out /tmp 2>&1 | grep -E "select_k(100|10)_(ms|pct)"
done
