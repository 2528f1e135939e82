#!/bin/bash
# cuda/bench/phase_clocks.sh — the phase clocks of the scan and the re-rank
# (measurement knobs GPUIVF_SCAN_PHASE_CLOCKS, GPUIVF_RESCORE_PHASE_CLOCKS; cuda/NOTES.md)
# in the GPU worker's call shape: builds both variants, runs --worker-only, prints
# the median and 10th/90th percentiles of each phase in cycles (block 0 of each call).
mkdir -p /tmp/gpuivf-blas && tar xJf .device-cuda/blas.tar.xz -C /tmp/gpuivf-blas
export LD_LIBRARY_PATH=/tmp/gpuivf-blas/lib GPUIVF_BENCH_RERANK=200
for v in RESCORE SCAN; do
  { cmake -S . -B /tmp/c$v -DCMAKE_BUILD_TYPE=Release -DCMAKE_LIBRARY_PATH=/tmp/gpuivf-blas/lib -DCMAKE_INCLUDE_PATH=/tmp/gpuivf-blas/include "-DCMAKE_CUDA_FLAGS=-DGPUIVF_${v}_PHASE_CLOCKS" && cmake --build /tmp/c$v -j8 --target gpuivf_bench; } > /tmp/c$v.log 2>&1 &
done
wait
for v in RESCORE SCAN; do
  mkdir -p /tmp/c$v/out
  timeout ${T:-40} /tmp/c$v/cuda/bench/gpuivf_bench --worker-only --out /tmp/c$v/out 2>&1 | grep phase_clocks > /tmp/p$v.txt
  echo "== $v $(wc -l < /tmp/p$v.txt) lines"
  for c in 2 3 4 5 6; do cut -d' ' -f$c /tmp/p$v.txt | sort -n > /tmp/c.txt; n=$(wc -l < /tmp/c.txt); [ $n -gt 0 ] && echo "phase$((c-1)) p10 $(sed -n "$((n/10+1))p" /tmp/c.txt) median $(sed -n "$((n/2+1))p" /tmp/c.txt) p90 $(sed -n "$((n*9/10))p" /tmp/c.txt)"; done
done
