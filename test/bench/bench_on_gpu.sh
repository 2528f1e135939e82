#!/usr/bin/env bash
# test/bench/bench_on_gpu.sh — the benchmark (test/bench/run) at 1M rows on the
# GPU machine, with the GPU worker: gpuivf.device = gpu, 1/16/64 pgbench
# clients, the batched kNN join; results, summary.md and plots in $OUT/bench.
#
# Builds nothing of gpuivf: it installs a gpuivf.so and gpuivf_gpu.so built on
# the development machine, carried with PostgreSQL in a pgkit folder (see
# ../shared/device/README.md; install_postgres of test/gpu/cluster_lib.sh),
# the same folder test/gpu/worker_end_to_end.sh uses:
#   KIT/pgkit.sh, KIT/pgkit.tar.xz, KIT/gpuivf.so, KIT/gpuivf_gpu.so, and
#   optionally KIT/gpuivf_gen, KIT/gpuivf_gt (else compiled here with g++),
#   and KIT/build.sh with KIT/pgvector-*.tar.gz (copies of ../shared/vendor's):
#   pgvector is then built here against the kit's PostgreSQL (its users'
#   build: -march=native, no JIT bitcode) and measured next to gpuivf.
# DATA=recipe generates the rows with gpuivf_gen (the recipe that behaves
# like real embeddings, the data test/bench/run generates itself) in
# GEN_PARTS (16) processes at once, and the ground truth with torch on the
# GPU (test/gpu/gpuivf_device.py gt): about a minute at 1M x 768, where one
# gpuivf_gen and gpuivf_gt take several.  DATA=numpy: isotropic Gaussian
# clusters from numpy instead (test/gpu/gpuivf_device.py fvecs) — in high
# dimensions their neighbours are nearly equidistant, which no real
# embedding is: PQ-ordered recall there says little about real data.
#
# On the device, from the repository root (as root; PostgreSQL runs as the
# kit's user pgrun):
#   bash test/bench/bench_on_gpu.sh .device-worker
# Environment (defaults): ROWS (1000000), DIMS (128), QUERIES (1000),
# CLIENTS (1,16,64), DEVICE (gpu; gpu,cpu measures both on the same index —
# about twice the time), SECONDS_PER_POINT (4), OUT (/tmp/gpuivf-bench-device),
# TIME_LIMIT (seconds test/bench/run may measure: 510 minus the set-up here).
# Extra arguments after KIT go to test/bench/run as they are.
# Locally, as a dry run against the installed PostgreSQL (PG_CONFIG's) and gpuivf:
#   GPUIVF_LOCAL=1 ROWS=20000 DIMS=64 QUERIES=200 CLIENTS=1,4 SECONDS_PER_POINT=1 \
#     bash test/bench/bench_on_gpu.sh .device-worker
# Sized for the 10-minute command limit: about 5-7 minutes at 1M x 128 with
# DEVICE=gpu (data and ground truth ~1 min, build, 11 knob values x 3 client
# counts x 4 s of pgbench, recall passes, the join).
set -u
KIT=${1:-.device-worker}
shift || true
OUT=${OUT:-/tmp/gpuivf-bench-device}
ROWS=${ROWS:-1000000}
DIMS=${DIMS:-128}
QUERIES=${QUERIES:-1000}
CLIENTS=${CLIENTS:-1,16,64}
DEVICE=${DEVICE:-gpu}
SECONDS_PER_POINT=${SECONDS_PER_POINT:-4}
# shellcheck source=test/gpu/cluster_lib.sh
source "$(dirname "$0")/../gpu/cluster_lib.sh"
mkdir -p "$OUT"

perl -MFile::Temp -MTime::HiRes -MGetopt::Long -MPOSIX -e 1 \
	|| { echo "error: test/bench/run needs perl with File::Temp, Time::HiRes, Getopt::Long, POSIX" >&2; exit 1; }

# ------------------------------------------------- PostgreSQL and gpuivf
# (test/bench/run starts its own server: only the installation is shared)
install_postgres "$KIT" pgvector

# ------------------------------------------------------ data tools
TOOLS=/tmp/gpuivf-bench-tools
rm -rf "$TOOLS" && mkdir -p "$TOOLS"
if [ -x "$KIT/gpuivf_gen" ] && [ -x "$KIT/gpuivf_gt" ] && "$KIT/gpuivf_gen" --help >/dev/null 2>&1; then
	cp "$KIT/gpuivf_gen" "$KIT/gpuivf_gt" "$TOOLS/"
else
	say "compiling gpuivf_gen and gpuivf_gt"
	g++ -O2 -std=c++17 -o "$TOOLS/gpuivf_gen" test/tools/gpuivf_gen.cpp || exit 1
	g++ -O2 -std=c++17 -pthread -o "$TOOLS/gpuivf_gt" test/tools/gpuivf_gt.cpp || exit 1
fi
export GPUIVF_TOOLS_DIR=$TOOLS
DATA_ARGS=()
case "${DATA:-}" in
numpy | recipe)
	# a data set for test/bench/run --dataset: gen_base.fvecs, gen_query.fvecs
	# and gen_groundtruth.ivecs (exact top-100, on the GPU with torch when it can)
	DATASET=/tmp/gpuivf-bench-data
	rm -rf "$DATASET" && mkdir -p "$DATASET"
	if [ "$DATA" = numpy ]; then
		say "data: numpy, $ROWS x $DIMS and $QUERIES queries"
		"${PY:-python3}" test/gpu/gpuivf_device.py fvecs "$DATASET" "$ROWS" "$DIMS" "$QUERIES" || exit 1
	else
		P=${GEN_PARTS:-16}
		say "data: gpuivf_gen in $P parts, $ROWS x $DIMS and $QUERIES queries"
		for k in $(seq 0 $((P - 1))); do
			# part 0 also writes the queries; the parts together are the rows
			"$TOOLS/gpuivf_gen" --rows "$ROWS" --dims "$DIMS" --queries "$QUERIES" --part "$k/$P" \
				--base "$DATASET/part$k.fvecs" $([ "$k" = 0 ] && echo --query "$DATASET/gen_query.fvecs") >/dev/null &
		done
		wait
		for k in $(seq 0 $((P - 1))); do cat "$DATASET/part$k.fvecs" && rm -f "$DATASET/part$k.fvecs"; done > "$DATASET/gen_base.fvecs"
		"${PY:-python3}" test/gpu/gpuivf_device.py gt "$DATASET" || exit 1
	fi
	chmod -R a+rX "$DATASET"
	DATA_ARGS=(--dataset "$DATASET") ;;
esac

# ------------------------------------------------------ the benchmark
# test/bench/run runs as root here and starts PostgreSQL as pgrun (runuser,
# with the kit's PATH and LD_LIBRARY_PATH); its temporary directory is
# under /tmp, which pgrun can enter.
export GPUIVF_PG_USER=$PGUSER_OS TMPDIR=/tmp
# the plots: python3 (the device's has matplotlib), else /usr/bin/python3;
# GPUIVF_PYTHON picks another
# --time-limit: stop measuring (visibly, in summary.md) early enough that
# the outputs are written within the device's 10-minute command limit.
TIME_LIMIT=${TIME_LIMIT:-$((510 - ($(date +%s) - started)))}
say "test/bench/run: $ROWS x $DIMS, $QUERIES queries, clients $CLIENTS, device $DEVICE, time limit ${TIME_LIMIT}s"
perl test/bench/run --rows "$ROWS" --dims "$DIMS" --queries "$QUERIES" --clients "$CLIENTS" "${DATA_ARGS[@]}" \
	--device "$DEVICE" --seconds "$SECONDS_PER_POINT" --shared-buffers 16GB --port 5840 \
	--time-limit "$TIME_LIMIT" --out "$OUT/bench" "$@"
rc=$?
say "test/bench/run exited with $rc; results in $OUT/bench:"
ls -l "$OUT/bench"
exit $rc
