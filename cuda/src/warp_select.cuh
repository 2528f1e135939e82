/*
 * warp_select.cuh — register-resident k-selection after Johnson, Douze and
 * Jégou, "Billion-scale similarity search with GPUs" (WarpSelect).
 *
 * Each warp keeps a warp queue of W keys in registers (W = the k-bucket,
 * 32..1024), sorted ascending across the warp: element e lives in register
 * e / 32 of lane e % 32; and per lane a thread queue of T pending keys (in
 * shared memory, see WarpSelect below).
 * A candidate is compared with the warp's running threshold (the k-th key of
 * the warp queue, or a better one published by another warp of the block);
 * almost every candidate fails that one compare, which is why the selection
 * can run at memory speed.  A survivor is appended to its lane's thread
 * queue.  As soon as some lane's thread queue might overflow, the warp
 * merges: the pending keys of all lanes are compacted into full runs of
 * 32 x B keys, each run is sorted by a bitonic network across the warp and
 * merged into the warp queue by the unequal-size merge below, and the
 * threshold is refreshed after each run (runs that can no longer beat it are
 * skipped).  Warps working on the same row share their best threshold
 * through shared memory.  Keys are the packed (score, index) values of
 * common.cuh.
 *
 * Merging sequences of different lengths.  To merge a sorted run B of length
 * L into the sorted queue A of length W and keep the W smallest, compare
 * A[e] with B[W-1-e] and keep the minimum: the result is bitonic (ascending
 * then descending) and holds the W smallest of A and B, so one bitonic merge
 * network of size W sorts it.  When L < W only the last L positions of A have
 * a partner (the others would meet padding), so only those compares are
 * emitted; when L > W only the first W of B can matter.  This is the
 * odd-size merge that lets the runs (32 x B keys) and the warp queue (W
 * keys) have unrelated lengths.
 *
 * Every function here must be called by all 32 lanes of a warp together,
 * except WarpSelect::offer / offer_key, which a lane calls for its own
 * candidates after the warp reserved room.
 */
#ifndef GPUIVF_CUDA_WARP_SELECT_CUH
#define GPUIVF_CUDA_WARP_SELECT_CUH

#include "common.cuh"

namespace gpuivf_cuda {

template <int N>
struct Log2 {
    static constexpr int value = 1 + Log2<N / 2>::value;
};
template <>
struct Log2<1> {
    static constexpr int value = 0;
};

/* One stage of a bitonic network over the 32 * R keys of v (element
 * e = r * 32 + lane): strides size / 2 .. 1, each pair ascending where
 * e & size is 0.  Partners at strides of 32 and more are in the same lane
 * (registers r and r ^ (stride / 32)), the others in lanes lane ^ stride. */
template <int R>
__device__ __forceinline__ void warp_bitonic_stage(Key (&v)[R], int lane, int ls) {
    const int size = 1 << ls;
#pragma unroll
    for (int lt = ls - 1; lt >= 0; --lt) {
        const int stride = 1 << lt;
        if (stride >= 32) {
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

/* Bitonic sort of the 32 * R keys of v (element e = r * 32 + lane), ascending. */
template <int R>
__device__ __forceinline__ void warp_sort_keys(Key (&v)[R], int lane) {
#pragma unroll
    for (int ls = 1; ls <= Log2<32 * R>::value; ++ls) warp_bitonic_stage<R>(v, lane, ls);
}

/* Bitonic merge: v holds a bitonic sequence of 32 * R keys; sort it
 * ascending (the sort's last stage: every pair ascends). */
template <int R>
__device__ __forceinline__ void warp_merge_bitonic(Key (&v)[R], int lane) {
    warp_bitonic_stage<R>(v, lane, Log2<32 * R>::value);
}

/* Thread-queue length (slots per lane) of each kernel's k-bucket. */
template <int W>
struct ThreadQueueLength {
    static constexpr int value = 8;
};
/* Rows of 32 merged into the warp queue at once: one row is cheapest for
 * short queues; a long queue is better fed larger sorted runs (the merge
 * network's cost is the queue's, whatever the run length). */
template <int W>
struct MergeRows {
    static constexpr int value = W <= 128 ? 1 : (W >= 512 ? 4 : W / 128);
};

/*
 * The warp queue lives in registers; the per-lane thread queues live in
 * shared memory (T slots per lane, slot s of lane l at tq[s * 32 + l]), so a
 * survivor is appended with one store instead of shifting registers.  The
 * warp reserves room before offering (reserve(n): merge if some lane has
 * fewer than n free slots), so offering needs no vote.  A merge compacts all
 * lanes' pending keys into full rows (prefix sum of the counts), sorts them
 * B rows (32 * B keys) at a time with the bitonic network and merges each run
 * into the queue with the unequal-size merge; a run whose smallest key does
 * not beat the threshold any more is skipped.
 */
template <int W, int T>
struct WarpSelect {
    static_assert(W >= 32 && (W & (W - 1)) == 0, "warp queue length must be a power of two >= 32");
    static constexpr int kRows = W / 32;
    static constexpr int kB = MergeRows<W>::value;
    static_assert(kB <= kRows && kB <= T, "merge runs must fit the queue and the thread queues");
    /* Shared memory per warp: thread queues + the compaction buffer. */
    static constexpr int kSmemKeys = warp_select_smem_keys(T);

    Key queue[kRows];  /* the warp queue, sorted ascending across the warp */
    Key *tq;           /* this warp's thread queues */
    Key *cbuf;         /* this warp's compaction buffer */
    int count;         /* keys pending in this lane's thread queue */
    Key threshold;     /* a candidate is kept only when below this */
    float threshold_score;  /* threshold's score: the float fast path */
    int kth_row, kth_lane;  /* where element k - 1 of the warp queue lives */
    int lane;
    Key *shared_threshold;  /* best threshold of the block (shared memory), or null */
    uint32_t shared_threshold_saddr; /* the same as a shared-window address */
    bool has_shared_threshold;

    __device__ __forceinline__ void init(int k, Key *smem, Key *shared) {
        lane = threadIdx.x & 31;
#pragma unroll
        for (int r = 0; r < kRows; ++r) queue[r] = kSentinelKey;
        tq = smem;
        cbuf = smem + T * 32;
        count = 0;
        kth_row = (k - 1) >> 5;
        kth_lane = (k - 1) & 31;
        shared_threshold = shared;
        has_shared_threshold = shared != nullptr;
        shared_threshold_saddr = shared ? static_cast<uint32_t>(__cvta_generic_to_shared(shared)) : 0u;
        set_threshold(kSentinelKey);
    }

    __device__ __forceinline__ void set_threshold(Key t) {
        threshold = t;
        threshold_score = key_score(t); /* NaN for the sentinel: everything may pass */
    }

    /* Conservative float test: false only when the score cannot be kept. */
    __device__ __forceinline__ bool may_pass(float score) const { return !(score > threshold_score); }

    /* Adopt a better threshold published by another warp of the block.  A
     * volatile load through the shared window: through the generic pointer
     * the compiler rebuilds the window address every time (about 12
     * instructions per call in the scan's inner loop). */
    __device__ __forceinline__ void refresh() {
        if (has_shared_threshold) {
            Key s;
            asm volatile("ld.volatile.shared.u64 %0, [%1];" : "=l"(s) : "r"(shared_threshold_saddr));
            if (s < threshold) set_threshold(s);
        }
    }

    /* Make room for n more keys in every lane's thread queue (whole warp). */
    __device__ __forceinline__ void reserve(int n) {
        if (__any_sync(kFullMask, count > T - n)) merge();
    }
    /* Merge whatever is still pending (whole warp). */
    __device__ __forceinline__ void flush() {
        if (__any_sync(kFullMask, count > 0)) merge();
    }

    /* One lane's candidate; room must have been reserved.  The key is built
     * only when the float compare cannot decide. */
    __device__ __forceinline__ void offer(float score, uint32_t index) {
        if (score < threshold_score || (!(score > threshold_score) && make_key(score, index) < threshold)) {
            tq[count * 32 + lane] = make_key(score, index);
            ++count;
        }
    }
    __device__ __forceinline__ void offer_key(Key key) {
        if (key < threshold) {
            tq[count * 32 + lane] = key;
            ++count;
        }
    }

    /* Merge every lane's thread queue into the warp queue.  Inlined (a call
     * would move the queue to local memory); kernels keep its call sites to
     * reserve() in their main loop and one flush(). */
    __device__ __forceinline__ void merge() {
        /* Compact: lane l's keys go to cbuf[prefix(l) ...]. */
        int incl = count;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(kFullMask, incl, o);
            if (lane >= o) incl += y;
        }
        const int total = __shfl_sync(kFullMask, incl, 31);
        const int first = incl - count;
        for (int s = 0; s < count; ++s) cbuf[first + s] = tq[s * 32 + lane];
        __syncwarp();
        for (int base = 0; base < total; base += 32 * kB) {
            Key run[kB];
#pragma unroll
            for (int b = 0; b < kB; ++b) {
                const int e = base + b * 32 + lane;
                run[b] = e < total ? cbuf[e] : kSentinelKey;
            }
            warp_sort_keys<kB>(run, lane);
            /* Nothing in the run beats the current k-th: skip it. */
            if (!(__shfl_sync(kFullMask, run[0], 0) < threshold)) continue;
            /* Unequal-size merge: the run (32 * kB keys) meets only the last
             * kB rows of the queue. */
#pragma unroll
            for (int r = kRows - kB; r < kRows; ++r) {
                const Key other = __shfl_xor_sync(kFullMask, run[kRows - 1 - r], 31);
                queue[r] = key_min(queue[r], other);
            }
            warp_merge_bitonic<kRows>(queue, lane);
            /* A bitwise blend, not `if (r == kth_row) v = queue[r]`: the
             * compiler turns that select chain into a dynamic index, which
             * would move the whole queue to local memory. */
            Key v = 0;
#pragma unroll
            for (int r = 0; r < kRows; ++r) v |= queue[r] & (Key{0} - static_cast<Key>(r == kth_row));
            const Key kth = __shfl_sync(kFullMask, v, kth_lane);
            if (kth < threshold) set_threshold(kth);
        }
        __syncwarp();
        count = 0;
        if (has_shared_threshold && threshold != kSentinelKey && lane == 0)
            atomicMin(shared_threshold, threshold);
        refresh();
    }
};

struct BlockBarrier {
    __device__ __forceinline__ void operator()() const { __syncthreads(); }
};

/*
 * BlockSelect's last step: merge the sorted warp queues of kWarps warps
 * into the first one's registers, pairwise in a tree through shared memory
 * (smem: kWarps * W keys; warp: this warp's place among the kWarps; sync:
 * a barrier of those warps, by default the whole block's).
 */
template <int W, int T, int kWarps, class Barrier = BlockBarrier>
__device__ __forceinline__ void block_merge_queues(WarpSelect<W, T> &ws, Key *smem,
                                                   int warp = static_cast<int>(threadIdx.x >> 5),
                                                   Barrier sync = Barrier()) {
    constexpr int kRows = W / 32;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < kRows; ++r) smem[warp * W + r * 32 + lane] = ws.queue[r];
    sync();
#pragma unroll
    for (int ls = 0; (1 << ls) < kWarps; ++ls) {
        const int s = 1 << ls;
        if ((warp % (2 * s)) == 0 && warp + s < kWarps) {
            const Key *other = smem + (warp + s) * W;
#pragma unroll
            for (int r = 0; r < kRows; ++r) ws.queue[r] = key_min(ws.queue[r], other[W - 1 - (r * 32 + lane)]);
            warp_merge_bitonic<kRows>(ws.queue, lane);
#pragma unroll
            for (int r = 0; r < kRows; ++r) smem[warp * W + r * 32 + lane] = ws.queue[r];
        }
        sync();
    }
}

}  // namespace gpuivf_cuda

#endif /* GPUIVF_CUDA_WARP_SELECT_CUH */
