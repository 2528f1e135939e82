/*
 * block_kth.cuh — the k-th smallest of a block's keys in shared memory, by
 * radix selection (a byte at a time from the top) until exactly k keys are
 * at or below what is fixed.  No sort, no queues: the IVF-PQ scan's
 * collect-then-cut (ivfpq_scan.cuh) and the re-rank's choice among a row's
 * runs (rescore.cu) both keep the keys at or below it; the re-rank also
 * uses it to skip ranking candidates that cannot be output.  Distinct keys
 * (a key holds the entry's position) give exactly k at or below; with equal
 * keys it may be more.
 */
#ifndef GPUIVF_CUDA_BLOCK_KTH_CUH
#define GPUIVF_CUDA_BLOCK_KTH_CUH

#include "common.cuh"

namespace gpuivf_cuda {

/* Shared scratch of block_kth_key. */
struct KthShared {
    int hist[256];
    int bin, before, count;
};

/* The k-th smallest of keys[0, n) (1 <= k <= n), or a key with exactly k
 * keys at or below it; block-wide (warps = blockDim.x / 32), every thread
 * gets it.  Radix selection a byte at a time from the top: a
 * histogram of the next byte of the keys that share the bytes fixed so far
 * (shared-memory atomics), the bin where the k-th falls found by one warp's
 * scan; it stops as soon as that bin holds exactly the keys still wanted,
 * usually after three or four bytes (the top bytes of scores of one query
 * are nearly all the same).  Three barriers a byte; a bisection over the
 * key range needs one a bit of resolution and took 1.5-2x the time in the
 * scan and the re-rank (cuda/DESIGN.md). */
__device__ __forceinline__ Key block_kth_key(const Key *keys, int n, int k, KthShared &ks, int warps) {
    const int lane = threadIdx.x & 31;
    const int threads = warps * 32;
    Key prefix = 0, mask = 0;
    int want = k; /* keys still to take among those matching the prefix */
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += threads) ks.hist[b] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += threads) {
            const Key key = keys[i];
            if ((key & mask) == prefix) atomicAdd(&ks.hist[static_cast<int>(key >> shift) & 255], 1);
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            /* lane l: bins 8l .. 8l + 7; the lane whose bins hold the
             * want-th key finds its bin */
            int c[8], sum = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                c[j] = ks.hist[8 * lane + j];
                sum += c[j];
            }
            int incl = sum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int t = __shfl_up_sync(kFullMask, incl, o);
                if (lane >= o) incl += t;
            }
            int cum = incl - sum;
            if (cum < want && want <= incl) {
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    if (cum < want && want <= cum + c[j]) {
                        ks.bin = 8 * lane + j;
                        ks.before = cum;
                        ks.count = c[j];
                    }
                    cum += c[j];
                }
            }
        }
        __syncthreads();
        const int bin = ks.bin, before = ks.before, count = ks.count;
        prefix |= static_cast<Key>(bin) << shift;
        mask |= static_cast<Key>(255) << shift;
        want -= before;
        /* every key with this prefix is wanted: exactly k at or below */
        if (count == want) return prefix | ~mask;
    }
    return prefix;
}

/* Append each lane's key for which `take` holds to buf at *counter (whole
 * warp; one atomic a warp, the lanes' order kept); returns the slot, or -1. */
__device__ __forceinline__ int warp_append_slot(bool take, int *counter) {
    const int lane = threadIdx.x & 31;
    const unsigned m = __ballot_sync(kFullMask, take);
    if (m == 0) return -1;
    int base = 0;
    if (lane == 0) base = atomicAdd(counter, __popc(m));
    base = __shfl_sync(kFullMask, base, 0);
    return take ? base + __popc(m & ((1u << lane) - 1u)) : -1;
}

/* Hand each key of keys[0, n) at or below t to take(slot, key), the slots
 * counted up from *counter (a shared int that every thread sees as 0 when
 * this starts); block-wide, one atomic a warp.  With t from block_kth_key
 * that is exactly the k best, in no particular order. */
template <typename Take>
__device__ __forceinline__ void block_take_at_or_below(const Key *keys, int n, Key t, int *counter, int threads,
                                                       Take take) {
    for (int b = 0; b < n; b += threads) {
        const int i = b + threadIdx.x;
        const Key key = i < n ? keys[i] : kSentinelKey;
        const int at = warp_append_slot(i < n && key <= t, counter);
        if (at >= 0) take(at, key);
    }
}

}  // namespace gpuivf_cuda

#endif /* GPUIVF_CUDA_BLOCK_KTH_CUH */
