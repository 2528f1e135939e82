#!/bin/bash
# cuda/bench/phase_clocks.sh — on the GPU machine, from the repository root
# (carry .device/cuda): the phase clocks of the collecting scan and the
# re-rank (common.cuh, built with -DGPUIVF_PHASE_CLOCKS) in the GPU worker's
# call shape (gpuivf_bench --worker-only, 200 candidates); prints the 10th,
# 50th and 90th percentile of each phase in cycles (one block of each call).
set -u
. cuda/bench/device_kit.sh
B=/tmp/gpuivf-phase-clocks
build_engine . $B 16 -DCMAKE_CUDA_FLAGS=-DGPUIVF_PHASE_CLOCKS >$B.log 2>&1 || { tail -20 $B.log; exit 1; }
mkdir -p $B/out
GPUIVF_BENCH_RERANK=200 timeout "${T:-60}" $B/cuda/bench/gpuivf_bench --worker-only --out $B/out >$B/bench.txt 2>&1
for label in scan_phase_clocks rescore_phase_clocks; do
	grep "^$label " $B/bench.txt >$B/$label.txt
	echo "== $label: $(wc -l <$B/$label.txt) calls"
	for c in 2 3 4 5 6; do
		cut -d' ' -f$c $B/$label.txt | sort -n >$B/col.txt
		n=$(wc -l <$B/col.txt)
		[ "$n" -gt 0 ] && echo "phase$((c - 1)) p10 $(sed -n "$((n / 10 + 1))p" $B/col.txt)" \
			"median $(sed -n "$((n / 2 + 1))p" $B/col.txt) p90 $(sed -n "$((n * 9 / 10))p" $B/col.txt)"
	done
done
