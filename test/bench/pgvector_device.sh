#!/usr/bin/env bash
# test/bench/pgvector_device.sh — gpuivf next to pgvector on the GPU machine:
# for 1M x 128 and 1M x 768, build time, index size, recall@10 and QPS at
# 1/16/64 pgbench clients of gpuivf (gpuivf.device = gpu and cpu, on the same
# index), pgvector's hnsw (m 16, ef_construction 64; ef_search 40/100/200)
# and ivfflat (lists = rows / 1000; probes 10/20/40), all on one vector(dims)
# table with the same 1,000 queries (test/bench/run; gpuivf through
# gpuivf_vector's vector_l2_ops).  pgvector is built there from the carried
# tarball against the kit's PostgreSQL, as its users build it (-march=native),
# and indexes with parallel workers (15) and maintenance_work_mem large
# enough for an in-memory hnsw graph.
#
# Each STEP is one self-contained device call (< 9 minutes: it generates its
# data again, deterministically):
#   128          1M x 128: gpuivf (GPU, CPU), hnsw and ivfflat
#   768-gpuivf   1M x 768: gpuivf (GPU, CPU)
#   768-hnsw     1M x 768: hnsw
#   768-ivfflat  1M x 768: ivfflat
#   merge        (here, after the others) one summary.md and recall_qps.png
#                of the steps: bash test/bench/pgvector_device.sh merge DIR...
#                (the $OUT/<step>/bench folders fetched from the device;
#                written into $OUT, default bench-out/pgvector)
# A step that runs out of time writes what it measured and says what it
# skipped (a build stopped by the limit reports its progress).
#
# KIT (default .device-worker, as for test/bench/bench_on_gpu.sh): pgkit.sh,
# pgkit.tar.xz, gpuivf.so, gpuivf_gpu.so, and ../shared/vendor's build.sh and
# pgvector-0.8.6.tar.gz.  On the device, from the repository root:
#   bash test/bench/pgvector_device.sh STEP [KIT]
# Outputs: $OUT/<step>/bench/ (results.csv, build.csv, summary.md, plots; OUT
# defaults to /tmp/gpuivf-pgvector).
# Locally, as a dry run (small data, the installed PostgreSQL, any engine):
#   GPUIVF_LOCAL=1 ROWS=20000 QUERIES=100 CLIENTS=1,2 DEVICE=cpu bash test/bench/pgvector_device.sh 128
set -u
STEP=${1:?usage: pgvector_device.sh 128|768-gpuivf|768-hnsw|768-ivfflat [KIT] | merge DIR...}
shift
if [ "$STEP" = merge ]; then
	OUTDIR=${OUT:-bench-out/pgvector}
	exec perl "$(dirname "$0")/run" --merge "$(IFS=,; echo "$*")" --out "$OUTDIR"
fi
KIT=${1:-.device-worker}
OUT=${OUT:-/tmp/gpuivf-pgvector}
export ROWS=${ROWS:-1000000} QUERIES=${QUERIES:-1000} CLIENTS=${CLIENTS:-1,16,64}
export SECONDS_PER_POINT=${SECONDS_PER_POINT:-3}
common=(--column-type vector --ef-search 40,100,200 --target-recalls 0.9,0.95,0.99 --probes none
	--ivfflat-probes 10,20,40 --no-batch-join --parallel-build "${PARALLEL_BUILD:-15}")
case "$STEP" in
128)
	export DIMS=128 DEVICE=${DEVICE:-gpu,cpu}
	extra=(--maintenance-work-mem 8GB --label 1Mx128) ;;
768-gpuivf)
	export DIMS=768 DEVICE=${DEVICE:-gpu,cpu} DATA=${DATA:-recipe}
	extra=(--only gpuivf --maintenance-work-mem 8GB --label 1Mx768) ;;
768-hnsw)
	export DIMS=768 DEVICE=${DEVICE:-gpu} DATA=${DATA:-recipe}
	extra=(--only hnsw --maintenance-work-mem 24GB --label 1Mx768) ;;
768-ivfflat)
	export DIMS=768 DEVICE=${DEVICE:-gpu} DATA=${DATA:-recipe}
	extra=(--only ivfflat --maintenance-work-mem 8GB --label 1Mx768) ;;
*)
	echo "unknown STEP $STEP (128, 768-gpuivf, 768-hnsw, 768-ivfflat, merge)" >&2
	exit 2 ;;
esac
OUT=$OUT/$STEP exec bash "$(dirname "$0")/bench_on_gpu.sh" "$KIT" "${common[@]}" "${extra[@]}"
