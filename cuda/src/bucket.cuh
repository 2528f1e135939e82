/*
 * bucket.cuh — the launchers of one k-bucket (KBucket<W>, select.h).  Each
 * select_kW.cu includes this and instantiates KBucket<W> once: the
 * WarpSelect kernels (select_rows and the two scans) are instantiated
 * exactly once per bucket, in their own translation unit (a short, parallel
 * build).
 */
#ifndef GPUIVF_CUDA_BUCKET_CUH
#define GPUIVF_CUDA_BUCKET_CUH

#include "ivfpq_scan8.cuh"
#include "select_rows.cuh"

namespace gpuivf_cuda {

template <int W>
void KBucket<W>::launch_select_rows(const SelectRowsArgs &a, int splits, cudaStream_t stream) {
    constexpr int kT = ThreadQueueLength<W>::value;
    const int64_t blocks = a.warp_rows ? ceil_div(a.rows, kSelectRowsThreads / 32) : a.rows;
    const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(splits));
    select_rows_kernel<W, kT, kSelectRowsThreads><<<grid, kSelectRowsThreads, 0, stream>>>(a);
    GPUIVF_CUDA_CHECK_LAUNCH();
}

template <int W>
size_t KBucket<W>::ivfpq_scan_queue_bytes() {
    return sizeof(Key) * (kScanThreads / 32) * WarpSelect<W, ScanQueueLength<W>::value>::kSmemKeys;
}

template <int W>
void KBucket<W>::launch_ivfpq_scan(const IvfPqScanArgs &a, size_t smem_bytes, cudaStream_t stream) {
    constexpr int kT = ScanQueueLength<W>::value;
    auto kernel = a.scan8 ? ivfpq_scan8_kernel<W, kT, kScanThreads, 1> : ivfpq_scan_kernel<W, kT, kScanThreads>;
    int threads = kScanThreads;
    dim3 grid(static_cast<unsigned>(a.splits), static_cast<unsigned>(a.nq));
    if constexpr (ivfpq_scan_collects(W)) {
        if (a.wide_blocks && !a.scan8) {
            kernel = ivfpq_scan_kernel<W, kT, 2 * kScanThreads>;
            threads = 2 * kScanThreads;
        }
    }
    if (a.scan8_pairs) {
        kernel = ivfpq_scan8_pairs_kernel<W, kScan8PairSlots>();
        if (!kernel) throw Error(GPUIVF_CUDA_INTERNAL, "no paired scan for k-bucket %d", W);
        threads = 2 * kScanThreads;
        grid = dim3(1u, static_cast<unsigned>(ceil_div(int64_t(a.nq) * a.splits, 2)));
    }
    if (smem_bytes + 256 > 48 * 1024) /* the static block_threshold counts too */
        GPUIVF_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(smem_bytes)));
    kernel<<<grid, threads, smem_bytes, stream>>>(a);
    GPUIVF_CUDA_CHECK_LAUNCH();
}

}  // namespace gpuivf_cuda

#endif /* GPUIVF_CUDA_BUCKET_CUH */
