/*
 * select_rows.cuh — WarpSelect / BlockSelect over rows.  Two layouts:
 *  - warp rows: each warp of the block selects its own row (many rows: no
 *    block merge, and each row's early phase, when almost everything passes,
 *    is paid once instead of once per warp);
 *  - block rows: the block's four warps share one row (or row segment),
 *    interleaving its columns and sharing the best threshold through shared
 *    memory, then merging their queues in a tree (few, long rows).
 *
 * Every thread takes four consecutive columns per step.  The float path is
 * the bandwidth-critical one (exact kNN tiles, select_k): 16-byte streaming
 * loads, software pipelined (the next two in flight while two are tested),
 * and a fast filter that tests plain floats against the threshold with one
 * warp vote per step; only a warp with a survivor reserves thread-queue room
 * and offers its candidates.  (The exact
 * kNN's norm add happens inside its GEMM, knn.cu, so the tiles arrive here
 * as finished scores.)
 */
#ifndef GPUIVF_CUDA_SELECT_ROWS_CUH
#define GPUIVF_CUDA_SELECT_ROWS_CUH

#include "select.h"
#include "warp_select.cuh"

namespace gpuivf_cuda {

/* Register budget: at least this many blocks per multiprocessor (8 for
 * W = 128, 64 registers, spilled a little and made the kNN's selection
 * slower: DESIGN.md). */
template <int W>
struct SelectMinBlocks {
    static constexpr int value = W <= 64 ? 8 : (W <= 256 ? 4 : 1);
};

/* A streamed float4: read once, so evict first. */
__device__ __forceinline__ float4 stream_load4(const float *p) { return __ldcs(reinterpret_cast<const float4 *>(p)); }

/* Four consecutive values of a row starting at column c (< c1). */
__device__ __forceinline__ float4 load4(const float *rp, int c, int c1, bool vec) {
    if (vec && c + 3 < c1) return stream_load4(rp + c);
    float4 v;
    v.x = __ldcs(rp + c);
    v.y = c + 1 < c1 ? __ldcs(rp + c + 1) : 0.0f;
    v.z = c + 2 < c1 ? __ldcs(rp + c + 2) : 0.0f;
    v.w = c + 3 < c1 ? __ldcs(rp + c + 3) : 0.0f;
    return v;
}

template <int W, int T, int kThreads>
__global__ void __launch_bounds__(kThreads, SelectMinBlocks<W>::value) select_rows_kernel(const SelectRowsArgs a) {
    constexpr int kWarps = kThreads / 32;
    constexpr int kUnroll = 2; /* float4 loads a lane per group (below) */
    using WS = WarpSelect<W, T>;
    constexpr int kSmemKeys = kWarps * W > kWarps * WS::kSmemKeys ? kWarps * W : kWarps * WS::kSmemKeys;
    __shared__ Key smem[kSmemKeys];
    __shared__ Key thresholds[1];

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const bool warp_rows = a.warp_rows != 0;
    const int64_t row = warp_rows ? static_cast<int64_t>(blockIdx.x) * kWarps + warp : blockIdx.x;
    const bool active = row < a.rows;
    const bool owner = warp_rows || warp == 0; /* holds the row's result */
    const int split = blockIdx.y;
    int k = active ? (a.row_k ? a.row_k[row] : a.k) : 1;
    k = k < 1 ? 1 : (k > W ? W : k);

    /* A warp alone on its row keeps its threshold in registers; the warps of
     * a block row share theirs. */
    Key *thr = warp_rows ? nullptr : &thresholds[0];
    if (!warp_rows && threadIdx.x == 0) *thr = a.init ? a.init[row * a.init_ld + k - 1] : kSentinelKey;
    __syncthreads();

    WS ws;
    ws.init(k, smem + warp * WS::kSmemKeys, thr);
    if (warp_rows) {
        if (active && a.init) ws.set_threshold(a.init[row * a.init_ld + k - 1]);
    } else {
        ws.refresh();
    }
    if (active && a.init != nullptr && owner) {
        /* Continue from the previous tiles' result (sorted, k entries). */
#pragma unroll
        for (int r = 0; r < W / 32; ++r) {
            const int e = r * 32 + lane;
            ws.queue[r] = e < k ? a.init[row * a.init_ld + e] : kSentinelKey;
        }
    }

    if (a.run_len > 0 && active) {
        /* Sorted runs: no key above the smallest run k-th can be among the
         * row's k best (that run alone has k keys at or below it). */
        Key bound = kSentinelKey;
        const int runs = static_cast<int>(a.cols / a.run_len);
        for (int r = lane; r < runs; r += 32)
            bound = key_min(bound, a.keys[row * a.ld + static_cast<int64_t>(r) * a.run_len + k - 1]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) bound = key_min(bound, __shfl_xor_sync(kFullMask, bound, o));
        if (bound != kSentinelKey && bound + 1 < ws.threshold) ws.set_threshold(bound + 1);
    }

    const int64_t c0 = static_cast<int64_t>(split) * a.split_cols;
    const int64_t c1 = active ? min(a.cols, c0 + a.split_cols) : c0;
    /* 32-bit offsets inside the segment keep the loop's registers few. */
    const int len = c1 > c0 ? static_cast<int>(c1 - c0) : 0;
    const int nthr = warp_rows ? 32 : kThreads;
    const int tid = warp_rows ? lane : threadIdx.x;
    const uint32_t index0 = a.index_base + static_cast<uint32_t>(c0);

    if (a.keys != nullptr) {
        /* Merging partial results: few keys, no fast path needed. */
        const Key *kp = a.keys + row * a.ld + c0;
        for (int b = 0; b < len; b += 4 * nthr) {
            const int c = b + 4 * tid;
            Key kv[4];
#pragma unroll
            for (int t = 0; t < 4; ++t) kv[t] = c + t < len ? kp[c + t] : kSentinelKey;
            const bool pass = kv[0] < ws.threshold || kv[1] < ws.threshold || kv[2] < ws.threshold ||
                              kv[3] < ws.threshold;
            if (__any_sync(kFullMask, pass)) {
                ws.reserve(4);
#pragma unroll
                for (int t = 0; t < 4; ++t) ws.offer_key(kv[t]);
            }
        }
    } else {
        const float *seg = a.values + row * a.ld + c0;
        const bool vec = (reinterpret_cast<uintptr_t>(seg) & 15) == 0;
        const int steps = static_cast<int>(ceil_div(len, 4 * nthr));
        /* Software pipelined: group s0 + kUnroll's loads are issued before
         * group s0 is processed, so a warp in its slow path (a merge) still
         * has loads in flight.  Two float4 a group (four in flight at most,
         * the registers of the unpipelined four-group loop): 1.73 -> 1.69 ms
         * for k = 100 (DESIGN.md); four a group took 90 registers, fewer warps
         * stayed resident and k = 10 fell from 90 % to 51 % of copy. */
        float4 x[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int c = 4 * (u * nthr + tid);
            x[u] = c < len ? load4(seg, c, len, vec) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        for (int s0 = 0; s0 < steps; s0 += kUnroll) {
            float4 nx[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int c = 4 * ((s0 + kUnroll + u) * nthr + tid);
                nx[u] = c < len ? load4(seg, c, len, vec) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
            /* one group at a time: the processing loop is not unrolled (x
             * shifts down instead), so the slow path and its merge are
             * emitted once */
#pragma unroll 1
            for (int u = 0; u < kUnroll; ++u) {
                const int c = 4 * ((s0 + u) * nthr + tid);
                const int n = c < len ? min(4, len - c) : 0;
                float4 v = x[0];
#pragma unroll
                for (int q = 0; q + 1 < kUnroll; ++q) x[q] = x[q + 1];
                if (a.negate) v.x = -v.x, v.y = -v.y, v.z = -v.z, v.w = -v.w;
                const bool pass = (n > 0 && ws.may_pass(v.x)) | (n > 1 && ws.may_pass(v.y)) |
                                  (n > 2 && ws.may_pass(v.z)) | (n > 3 && ws.may_pass(v.w));
                if (__any_sync(kFullMask, pass)) {
                    ws.reserve(4);
                    if (pass) {
                        const uint32_t idx = index0 + static_cast<uint32_t>(c);
                        if (n > 0) ws.offer(v.x, idx);
                        if (n > 1) ws.offer(v.y, idx + 1);
                        if (n > 2) ws.offer(v.z, idx + 2);
                        if (n > 3) ws.offer(v.w, idx + 3);
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) x[u] = nx[u];
            ws.refresh();
        }
    }

    ws.flush();
    if (warp_rows) {
        if (active) {
            Key *o = a.out + (row * gridDim.y + split) * a.out_ld;
#pragma unroll
            for (int r = 0; r < W / 32; ++r) {
                const int e = r * 32 + lane;
                if (e < a.out_count) o[e] = e < k ? ws.queue[r] : kSentinelKey;
            }
        }
        return;
    }
    __syncthreads(); /* the thread queues' memory now holds the queue merge */
    block_merge_queues<W, T, kWarps>(ws, smem);
    if (warp == 0 && active) {
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
