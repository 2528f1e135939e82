/*
 * warp_select.cuh — register-resident k-selection after Johnson, Douze and
 * Jégou, "Billion-scale similarity search with GPUs" (WarpSelect).
 *
 * Each warp keeps, in registers:
 *  - a warp queue of W keys (W = the k-bucket, 32..1024), sorted ascending
 *    across the warp: element e lives in register e / 32 of lane e % 32;
 *  - per lane a thread queue of T pending keys.
 * A candidate is compared with the warp's running threshold (the k-th key of
 * the warp queue, or a better one published by another warp of the block);
 * almost every candidate fails that one compare, which is why the selection
 * can run at memory speed.  A survivor is pushed on its lane's thread queue.
 * As soon as any lane's thread queue is full, the warp merges: the 32 x T
 * pending keys are sorted by a bitonic network across the warp, merged into
 * the warp queue by the unequal-size merge below, and the threshold is
 * refreshed.  Keys are the packed (score, index) values of common.cuh.
 *
 * Merging sequences of different lengths.  To merge a sorted run B of length
 * L into the sorted queue A of length W and keep the W smallest, compare
 * A[e] with B[W-1-e] and keep the minimum: the result is bitonic (ascending
 * then descending) and holds the W smallest of A and B, so one bitonic merge
 * network of size W sorts it.  When L < W only the last L positions of A have
 * a partner (the others would meet padding), so only those compares are
 * emitted; when L > W only the first W of B can matter.  This is the
 * odd-size merge that lets the thread queues (32 x T keys) and the warp
 * queue (W keys) have unrelated lengths.
 *
 * Every function here must be called by all 32 lanes of a warp together.
 */
#ifndef GPUIVF_CUDA_WARP_SELECT_CUH
#define GPUIVF_CUDA_WARP_SELECT_CUH

#include "common.cuh"

namespace gpuivf_cuda {

constexpr unsigned kFullMask = 0xffffffffu;

template <int N>
struct Log2 {
    static constexpr int value = 1 + Log2<N / 2>::value;
};
template <>
struct Log2<1> {
    static constexpr int value = 0;
};

__device__ __forceinline__ Key key_min(Key a, Key b) { return a < b ? a : b; }
__device__ __forceinline__ Key key_max(Key a, Key b) { return a < b ? b : a; }

/* Compare-exchange of one register row between lanes `lane` and
 * `lane ^ stride`: the lower lane of the pair keeps the smaller key when the
 * pair is to end ascending. */
__device__ __forceinline__ Key lane_exchange(Key v, int stride, bool ascending, int lane) {
    const Key other = __shfl_xor_sync(kFullMask, v, stride);
    const bool lower = (lane & stride) == 0;
    return (lower == ascending) ? key_min(v, other) : key_max(v, other);
}

/* Bitonic sort of the 32 * R keys of v (element e = r * 32 + lane), ascending. */
template <int R>
__device__ __forceinline__ void warp_sort_keys(Key (&v)[R], int lane) {
    constexpr int kLog = Log2<32 * R>::value;
#pragma unroll
    for (int ls = 1; ls <= kLog; ++ls) {
        const int size = 1 << ls;
#pragma unroll
        for (int lt = ls - 1; lt >= 0; --lt) {
            const int stride = 1 << lt;
            if (stride >= 32) {
                /* Partners are in the same lane: register r and r ^ (stride / 32). */
                const int rs = stride >> 5;
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    if ((r & rs) == 0) {
                        const int rp = r | rs;
                        const bool asc = ((r << 5) & size) == 0;
                        const Key lo = key_min(v[r], v[rp]);
                        const Key hi = key_max(v[r], v[rp]);
                        v[r] = asc ? lo : hi;
                        v[rp] = asc ? hi : lo;
                    }
                }
            } else {
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const bool asc = (((r << 5) | lane) & size) == 0;
                    v[r] = lane_exchange(v[r], stride, asc, lane);
                }
            }
        }
    }
}

/* Bitonic merge: v holds a bitonic sequence of 32 * R keys; sort it ascending. */
template <int R>
__device__ __forceinline__ void warp_merge_bitonic(Key (&v)[R], int lane) {
    constexpr int kLog = Log2<32 * R>::value;
#pragma unroll
    for (int lt = kLog - 1; lt >= 0; --lt) {
        const int stride = 1 << lt;
        if (stride >= 32) {
            const int rs = stride >> 5;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if ((r & rs) == 0) {
                    const int rp = r | rs;
                    const Key lo = key_min(v[r], v[rp]);
                    const Key hi = key_max(v[r], v[rp]);
                    v[r] = lo;
                    v[rp] = hi;
                }
            }
        } else {
#pragma unroll
            for (int r = 0; r < R; ++r) v[r] = lane_exchange(v[r], stride, true, lane);
        }
    }
}

/* Thread-queue length per k-bucket: longer queues mean fewer merges but more
 * registers and a larger sort per merge (powers of two for the networks). */
template <int W>
struct ThreadQueueLength {
    static constexpr int value = W <= 32 ? 2 : (W <= 256 ? 4 : 8);
};

template <int W, int T>
struct WarpSelect {
    static_assert(W >= 32 && (W & (W - 1)) == 0, "warp queue length must be a power of two >= 32");
    static_assert(T >= 1 && (T & (T - 1)) == 0, "thread queue length must be a power of two");
    static constexpr int kRows = W / 32;

    Key queue[kRows];  /* the warp queue, sorted ascending across the warp */
    Key pending[T];    /* this lane's thread queue (unsorted) */
    int count;         /* keys in pending */
    Key threshold;     /* a candidate is kept only when below this */
    float threshold_score;  /* threshold's score: the float fast path */
    int kth_row, kth_lane;  /* where element k - 1 of the warp queue lives */
    int lane;
    Key *shared_threshold;  /* block-wide best threshold (shared memory), or null */

    __device__ __forceinline__ void init(int k, Key *shared) {
        lane = threadIdx.x & 31;
#pragma unroll
        for (int r = 0; r < kRows; ++r) queue[r] = kSentinelKey;
#pragma unroll
        for (int t = 0; t < T; ++t) pending[t] = kSentinelKey;
        count = 0;
        kth_row = (k - 1) >> 5;
        kth_lane = (k - 1) & 31;
        shared_threshold = shared;
        set_threshold(kSentinelKey);
    }

    __device__ __forceinline__ void set_threshold(Key t) {
        threshold = t;
        threshold_score = key_score(t); /* NaN for the sentinel: everything may pass */
    }

    /* Conservative float test: false only when the score cannot be kept. */
    __device__ __forceinline__ bool may_pass(float score) const { return !(score > threshold_score); }

    /* Adopt a better threshold published by another warp of the block. */
    __device__ __forceinline__ void refresh() {
        if (shared_threshold) {
            const Key s = *reinterpret_cast<volatile Key *>(shared_threshold);
            if (s < threshold) set_threshold(s);
        }
    }

    /* Offer one key per lane (kSentinelKey for "nothing"). */
    __device__ __forceinline__ void add(Key key) {
        if (key < threshold) {
#pragma unroll
            for (int t = T - 1; t > 0; --t) pending[t] = pending[t - 1];
            pending[0] = key;
            ++count;
        }
        if (__any_sync(kFullMask, count == T)) merge();
    }

    /* Merge every lane's thread queue into the warp queue.  Inlined (a call
     * would move the queues to local memory), so callers keep the number of
     * call sites of add()/merge() small. */
    __device__ __forceinline__ void merge() {
        warp_sort_keys<T>(pending, lane);
        if constexpr (T >= kRows) {
            /* Only the kRows smallest rows of the sorted run can enter. */
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                const Key other = __shfl_xor_sync(kFullMask, pending[kRows - 1 - r], 31);
                queue[r] = key_min(queue[r], other);
            }
        } else {
            /* The run is shorter than the queue: only its last T rows meet it. */
#pragma unroll
            for (int r = kRows - T; r < kRows; ++r) {
                const Key other = __shfl_xor_sync(kFullMask, pending[kRows - 1 - r], 31);
                queue[r] = key_min(queue[r], other);
            }
        }
        warp_merge_bitonic<kRows>(queue, lane);
#pragma unroll
        for (int t = 0; t < T; ++t) pending[t] = kSentinelKey;
        count = 0;

        /* The k-th smallest key of the queue bounds everything worth keeping. */
        Key v = queue[0];
#pragma unroll
        for (int r = 1; r < kRows; ++r)
            if (r == kth_row) v = queue[r];
        const Key kth = __shfl_sync(kFullMask, v, kth_lane);
        if (kth < threshold) set_threshold(kth);
        if (shared_threshold != nullptr && kth != kSentinelKey && lane == 0) atomicMin(shared_threshold, kth);
        refresh();
    }

    /* Merge whatever is still pending. */
    __device__ __forceinline__ void flush() {
        if (__any_sync(kFullMask, count > 0)) merge();
    }
};

/*
 * BlockSelect's last step: merge the sorted warp queues of the block's warps
 * into warp 0's registers, pairwise in a tree through shared memory
 * (smem: kWarps * W keys).  Every thread of the block must call.
 */
template <int W, int T, int kWarps>
__device__ __forceinline__ void block_merge_queues(WarpSelect<W, T> &ws, Key *smem) {
    constexpr int kRows = W / 32;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < kRows; ++r) smem[warp * W + r * 32 + lane] = ws.queue[r];
    __syncthreads();
#pragma unroll
    for (int s = 1; s < kWarps; s *= 2) {
        if ((warp % (2 * s)) == 0 && warp + s < kWarps) {
            const Key *other = smem + (warp + s) * W;
#pragma unroll
            for (int r = 0; r < kRows; ++r) ws.queue[r] = key_min(ws.queue[r], other[W - 1 - (r * 32 + lane)]);
            warp_merge_bitonic<kRows>(ws.queue, lane);
#pragma unroll
            for (int r = 0; r < kRows; ++r) smem[warp * W + r * 32 + lane] = ws.queue[r];
        }
        __syncthreads();
    }
}

}  // namespace gpuivf_cuda

#endif /* GPUIVF_CUDA_WARP_SELECT_CUH */
