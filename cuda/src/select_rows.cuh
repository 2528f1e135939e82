/*
 * select_rows.cuh — BlockSelect over rows: one block (4 warps) per row or
 * row segment, each warp a WarpSelect over an interleaved share of the
 * columns, warps sharing their best threshold through shared memory, then a
 * tree merge of the warp queues.
 *
 * The float path is the bandwidth-critical one (exact kNN tiles, select_k):
 * 16-byte streaming loads, four in flight per thread, a fused
 * v * scale[c] + add[c] (the norm add of the exact kNN), and a fast filter
 * that tests four plain floats against the threshold with one warp vote;
 * only when some lane of the warp has a survivor does the warp build keys and
 * go through WarpSelect::add.
 */
#ifndef GPUIVF_CUDA_SELECT_ROWS_CUH
#define GPUIVF_CUDA_SELECT_ROWS_CUH

#include "select.h"
#include "warp_select.cuh"

namespace gpuivf_cuda {

__device__ __forceinline__ float select_transform(const SelectRowsArgs &a, float v, int64_t c) {
    if (a.col_scale) v = v * __ldg(a.col_scale + c);
    if (a.col_add) v = v + __ldg(a.col_add + c);
    return a.negate ? -v : v;
}

template <int W, int T, int kThreads>
__global__ void __launch_bounds__(kThreads) select_rows_kernel(const SelectRowsArgs a) {
    constexpr int kWarps = kThreads / 32;
    constexpr int kUnroll = 4;
    __shared__ Key merge_smem[kWarps * W];
    __shared__ Key block_threshold;

    const int64_t row = blockIdx.x;
    const int split = blockIdx.y;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    int k = a.row_k ? a.row_k[row] : a.k;
    k = k < 1 ? 1 : (k > W ? W : k);

    if (threadIdx.x == 0) block_threshold = a.init ? a.init[row * a.init_ld + k - 1] : kSentinelKey;
    __syncthreads();

    WarpSelect<W, T> ws;
    ws.init(k, &block_threshold);
    ws.refresh();
    if (a.init != nullptr && warp == 0) {
        /* Continue from the previous tiles' result (sorted, k entries). */
#pragma unroll
        for (int r = 0; r < W / 32; ++r) {
            const int e = r * 32 + lane;
            ws.queue[r] = e < k ? a.init[row * a.init_ld + e] : kSentinelKey;
        }
    }

    const int64_t c0 = static_cast<int64_t>(split) * a.split_cols;
    const int64_t c1 = min(a.cols, c0 + a.split_cols);

    if (a.keys != nullptr) {
        const Key *rp = a.keys + row * a.ld;
        for (int64_t b = c0; b < c1; b += kThreads) {
            const int64_t c = b + threadIdx.x;
            ws.add(c < c1 ? rp[c] : kSentinelKey);
        }
    } else {
        const float *rp = a.values + row * a.ld;
        const float *seg = rp + c0;
        const int64_t len = c1 > c0 ? c1 - c0 : 0;
        const bool aligned = (reinterpret_cast<uintptr_t>(seg) & 15) == 0 &&
                             (a.col_scale == nullptr || (reinterpret_cast<uintptr_t>(a.col_scale + c0) & 15) == 0) &&
                             (a.col_add == nullptr || (reinterpret_cast<uintptr_t>(a.col_add + c0) & 15) == 0);
        const int64_t nvec = aligned ? len / 4 : 0;
        const float4 *seg4 = reinterpret_cast<const float4 *>(seg);

        for (int64_t b = 0; b < nvec; b += kThreads * kUnroll) {
            float4 x[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int64_t i = b + u * kThreads + threadIdx.x;
                x[u] = i < nvec ? __ldcs(seg4 + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int64_t i = b + u * kThreads + threadIdx.x;
                const bool valid = i < nvec;
                float4 v = x[u];
                if (valid && (a.col_scale || a.col_add || a.negate)) {
                    const int64_t c = c0 + 4 * i;
                    if (a.col_scale) {
                        const float4 s = __ldg(reinterpret_cast<const float4 *>(a.col_scale + c));
                        v.x *= s.x, v.y *= s.y, v.z *= s.z, v.w *= s.w;
                    }
                    if (a.col_add) {
                        const float4 s = __ldg(reinterpret_cast<const float4 *>(a.col_add + c));
                        v.x += s.x, v.y += s.y, v.z += s.z, v.w += s.w;
                    }
                    if (a.negate) v.x = -v.x, v.y = -v.y, v.z = -v.z, v.w = -v.w;
                }
                const bool pass = valid && (ws.may_pass(v.x) | ws.may_pass(v.y) | ws.may_pass(v.z) |
                                            ws.may_pass(v.w));
                if (__any_sync(kFullMask, pass)) {
                    /* Slow path: one add() call site, four keys. */
                    const uint32_t idx = a.index_base + static_cast<uint32_t>(c0 + 4 * i);
#pragma unroll 1
                    for (int t = 0; t < 4; ++t) {
                        const float vt = t == 0 ? v.x : (t == 1 ? v.y : (t == 2 ? v.z : v.w));
                        ws.add(pass ? make_key(vt, idx + t) : kSentinelKey);
                    }
                }
            }
            ws.refresh();
        }
        /* Unaligned rows, and the last len % 4 columns. */
        for (int64_t b = c0 + 4 * nvec; b < c1; b += kThreads) {
            const int64_t c = b + threadIdx.x;
            const bool valid = c < c1;
            const float v = valid ? select_transform(a, __ldcs(rp + c), c) : 0.0f;
            const bool pass = valid && ws.may_pass(v);
            if (__any_sync(kFullMask, pass))
                ws.add(pass ? make_key(v, a.index_base + static_cast<uint32_t>(c)) : kSentinelKey);
        }
    }

    ws.flush();
    block_merge_queues<W, T, kWarps>(ws, merge_smem);
    if (warp == 0) {
        Key *o = a.out + (row * gridDim.y + split) * a.out_ld;
#pragma unroll
        for (int r = 0; r < W / 32; ++r) {
            const int e = r * 32 + lane;
            if (e < a.out_count) o[e] = e < k ? ws.queue[r] : kSentinelKey;
        }
    }
}

}  // namespace gpuivf_cuda

#endif /* GPUIVF_CUDA_SELECT_ROWS_CUH */
