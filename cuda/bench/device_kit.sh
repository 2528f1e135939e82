# cuda/bench/device_kit.sh — sourced (from the repository root) by the scripts
# of cuda/bench that run on the GPU machine.  That machine has CUDA, CMake and
# compute-sanitizer but no OpenBLAS, GoogleTest or data; make_device_kit.sh
# packs them here into .device/cuda/kit.tar.xz (carry .device/cuda).  This
# unpacks the kit, points the loader, CMake and the tests at it, and defines:
#   build_engine SRC BUILD JOBS [cmake args]  the GPU tests and gpuivf_bench of tree SRC
#   SANITIZER_TESTS                           a test filter that reaches every kernel in seconds
KIT_TAR=${KIT_TAR:-$PWD/.device/cuda/kit.tar.xz}
KIT_DIR=/tmp/gpuivf-kit
CMAKE_KIT=()
if [ -f "$KIT_TAR" ]; then
	mkdir -p "$KIT_DIR" && tar -xJf "$KIT_TAR" -C "$KIT_DIR"
	export LD_LIBRARY_PATH=$KIT_DIR/lib:${LD_LIBRARY_PATH:-}
	export GPUIVF_DATA_DIR=${GPUIVF_DATA_DIR:-$KIT_DIR/data}
	CMAKE_KIT=(-DCMAKE_LIBRARY_PATH="$KIT_DIR/lib" -DCMAKE_INCLUDE_PATH="$KIT_DIR/include")
else
	echo "no kit at $KIT_TAR (cuda/bench/make_device_kit.sh): using what the machine has" >&2
fi

build_engine() { # BUILD_TIMEOUT seconds (0: none) bounds the compilation
	local src=$1 build=$2 jobs=$3
	shift 3
	cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release "${CMAKE_KIT[@]}" "$@" &&
		timeout "${BUILD_TIMEOUT:-0}" cmake --build "$build" -j"$jobs" --target gpuivf_cuda_tests gpuivf_bench
}

SANITIZER_TESTS='SelectK.StrideIdsAndDeviceMemory:SelectK.NaNRanksLast:ExactKnn.TiesAndPadding:IvfPq.PerQueryKAndNprobe:IvfPq.CollectCutsLongLists:IvfPq.WideBlocksForLargeTables:IvfPq.AppendAndRemove:IvfPq.ConflictFreeScanWidths:IvfPq.PairedScanMatchesSingleQueries:IvfPq.GpuEncodingAppend:KMeans.EmptyClustersAndFewPoints'
