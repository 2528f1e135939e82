/*
 * resources.cu — creating and releasing the resources object, the arena, and
 * the error type.
 */
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "resources.h"

namespace gpuivf_cuda {

Error::Error(int32_t code, const char *fmt, ...) : code_(code) {
    va_list ap;
    va_start(ap, fmt);
    int len = std::vsnprintf(message_, sizeof(message_), fmt, ap);
    va_end(ap);
    if (len < 0) std::strcpy(message_, "unknown error");
}

void throw_cuda_error(cudaError_t err, const char *what, const char *file, int line) {
    (void)cudaGetLastError(); /* clear a non-sticky error so later calls can work */
    const char *base = std::strrchr(file, '/');
    base = base ? base + 1 : file;
    if (err == cudaErrorMemoryAllocation)
        throw Error(GPUIVF_CUDA_OUT_OF_MEMORY, "out of device memory (%s at %s:%d)", what, base, line);
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver)
        throw Error(GPUIVF_CUDA_NO_DEVICE, "no usable CUDA device: %s", cudaGetErrorString(err));
    throw Error(GPUIVF_CUDA_DEVICE_ERROR, "CUDA error %s (%s) in %s at %s:%d", cudaGetErrorName(err),
                cudaGetErrorString(err), what, base, line);
}

void throw_cublas_error(cublasStatus_t err, const char *what, const char *file, int line) {
    const char *base = std::strrchr(file, '/');
    base = base ? base + 1 : file;
    if (err == CUBLAS_STATUS_ALLOC_FAILED)
        throw Error(GPUIVF_CUDA_OUT_OF_MEMORY, "out of device memory in cuBLAS (%s at %s:%d)", what, base, line);
    throw Error(GPUIVF_CUDA_DEVICE_ERROR, "cuBLAS error %s in %s at %s:%d", cublasGetStatusName(err), what, base,
                line);
}

void resources_init(Resources &res, int device, int64_t temp_bytes) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        throw Error(GPUIVF_CUDA_NO_DEVICE, "no CUDA device is available");
    }
    GPUIVF_REQUIRE(device >= 0 && device < count, "device %d does not exist (%d devices)", device, count);
    res.device = device;
    GPUIVF_CUDA_TRY(cudaSetDevice(device));
    cudaDeviceProp prop;
    GPUIVF_CUDA_TRY(cudaGetDeviceProperties(&prop, device));
    res.sm_count = prop.multiProcessorCount;
    res.smem_optin = prop.sharedMemPerBlockOptin;
    res.cc_major = prop.major;
    res.cc_minor = prop.minor;
    std::snprintf(res.name, sizeof(res.name), "%.127s", prop.name);

    /* The main stream (selection, scans) gets the higher priority: while a
     * GEMM tile runs on the other stream, the selection of the previous tile
     * takes multiprocessors as soon as GEMM blocks retire. */
    int prio_low = 0, prio_high = 0;
    GPUIVF_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&prio_low, &prio_high));
    GPUIVF_CUDA_TRY(cudaStreamCreateWithPriority(&res.stream, cudaStreamNonBlocking, prio_high));
    GPUIVF_CUDA_TRY(cudaStreamCreateWithFlags(&res.gemm_stream, cudaStreamNonBlocking));
    GPUIVF_CUDA_TRY(cudaEventCreateWithFlags(&res.ev_fork, cudaEventDisableTiming));
    for (int i = 0; i < 2; i++) {
        GPUIVF_CUDA_TRY(cudaEventCreateWithFlags(&res.ev_gemm[i], cudaEventDisableTiming));
        GPUIVF_CUDA_TRY(cudaEventCreateWithFlags(&res.ev_select[i], cudaEventDisableTiming));
    }
    GPUIVF_CUBLAS_TRY(cublasCreate(&res.cublas));
    GPUIVF_CUBLAS_TRY(cublasSetStream(res.cublas, res.gemm_stream));
    /* Plain fp32: TF32 would change which neighbours are found. */
    GPUIVF_CUBLAS_TRY(cublasSetMathMode(res.cublas, CUBLAS_PEDANTIC_MATH));

    size_t free_b = 0, total_b = 0;
    GPUIVF_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    size_t want = temp_bytes > 0 ? static_cast<size_t>(temp_bytes) : std::min<size_t>(free_b / 4, size_t(2) << 30);
    want = round_up(static_cast<int64_t>(want), 256);
    void *p = nullptr;
    err = cudaMalloc(&p, want);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        throw Error(GPUIVF_CUDA_OUT_OF_MEMORY, "cannot allocate a temporary arena of %zu bytes", want);
    }
    res.arena = static_cast<char *>(p);
    res.arena_size = want;
    res.arena_top = 0;

    /* 16 MB of pinned host memory for searches; without it they still work,
     * with pageable copies */
    void *h = nullptr, *hd = nullptr;
    if (cudaHostAlloc(&h, size_t(16) << 20, cudaHostAllocMapped) == cudaSuccess) {
        res.pinned = static_cast<char *>(h);
        res.pinned_size = size_t(16) << 20;
        /* where kernels see it (the same address with unified addressing) */
        if (cudaHostGetDevicePointer(&hd, h, 0) == cudaSuccess)
            res.pinned_device = static_cast<char *>(hd);
        else
            (void)cudaGetLastError();
    } else {
        (void)cudaGetLastError();
    }
}

void resources_release(Resources &res) noexcept {
    if (res.stream) cudaSetDevice(res.device);
    if (res.stream) cudaStreamSynchronize(res.stream);
    if (res.gemm_stream) cudaStreamSynchronize(res.gemm_stream);
    drop_search_graphs(res);
    if (res.arena) cudaFree(res.arena);
    if (res.pinned) cudaFreeHost(res.pinned);
    res.pinned = nullptr;
    if (res.cublas) cublasDestroy(res.cublas);
    for (int i = 0; i < 2; i++) {
        if (res.ev_gemm[i]) cudaEventDestroy(res.ev_gemm[i]);
        if (res.ev_select[i]) cudaEventDestroy(res.ev_select[i]);
    }
    if (res.ev_fork) cudaEventDestroy(res.ev_fork);
    if (res.stream) cudaStreamDestroy(res.stream);
    if (res.gemm_stream) cudaStreamDestroy(res.gemm_stream);
    res.arena = nullptr;
    res.cublas = nullptr;
    res.stream = res.gemm_stream = nullptr;
}

void use_device(Resources &res) { GPUIVF_CUDA_TRY(cudaSetDevice(res.device)); }

void check_cancel(Resources &res) {
    if (res.cancel_fn && res.cancel_fn(res.cancel_arg)) {
        /* Let the queued work finish so no kernel still uses freed buffers. */
        cudaStreamSynchronize(res.stream);
        throw Error(GPUIVF_CUDA_CANCELED, "canceled");
    }
}

void sync(Resources &res) { GPUIVF_CUDA_TRY(cudaStreamSynchronize(res.stream)); }

void *arena_alloc(Resources &res, size_t bytes) {
    bytes = static_cast<size_t>(round_up(static_cast<int64_t>(bytes), 256));
    if (res.arena == nullptr || res.arena_top + bytes > res.arena_size) return nullptr;
    void *p = res.arena + res.arena_top;
    res.blocks.push_back({res.arena_top, bytes, false});
    res.arena_top += bytes;
    return p;
}

void arena_free(Resources &res, void *p) noexcept {
    size_t offset = static_cast<size_t>(static_cast<char *>(p) - res.arena);
    for (auto it = res.blocks.rbegin(); it != res.blocks.rend(); ++it) {
        if (it->offset == offset) {
            it->freed = true;
            break;
        }
    }
    /* Blocks may be released out of order: pop every freed block on top. */
    while (!res.blocks.empty() && res.blocks.back().freed) {
        res.arena_top = res.blocks.back().offset;
        res.blocks.pop_back();
    }
}

void *pinned_alloc(Resources &res, size_t bytes) noexcept {
    bytes = static_cast<size_t>(round_up(static_cast<int64_t>(bytes), 64));
    if (res.pinned == nullptr || res.pinned_top + bytes > res.pinned_size) return nullptr;
    void *p = res.pinned + res.pinned_top;
    res.pinned_top += bytes;
    return p;
}

size_t arena_available(const Resources &res) noexcept { return res.arena_size - res.arena_top; }

void *device_malloc(size_t bytes) {
    void *p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes > 0 ? bytes : 1);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        throw Error(GPUIVF_CUDA_OUT_OF_MEMORY, "out of device memory allocating %zu bytes", bytes);
    }
    return p;
}

bool is_device_pointer(const void *p) {
    cudaPointerAttributes attr;
    cudaError_t err = cudaPointerGetAttributes(&attr, p);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

}  // namespace gpuivf_cuda
