/*
 * rescore.cu — exact re-scoring and the final sort, one block per row:
 *  1. the row's candidates: its keys, or, when the row is the runs of a
 *     scan's probe splits, its k best keys chosen here (every run is cut
 *     at the smallest of the runs' k-th keys, which no key of the k best
 *     passes, then the k-th of the survivors by radix selection,
 *     block_kth.cuh),
 *     so a search needs no merge kernel between the scan and the re-rank,
 *     and the scan need not sort its runs;
 *  2. their values and ids in shared memory, and every candidate's vector
 *     prefetched into L2 at once (one memory round trip for all of them,
 *     not one per pass of the distance loop);
 *  3. half a warp per candidate for the exact distance (the CPU's lane
 *     order);
 *  4. every candidate's rank among the row's (value, id) pairs, which is
 *     its place in the output.
 * The block has as many threads as the row needs (half a warp a candidate
 * when re-scoring, a thread a candidate for the final order alone), so the
 * final sort of a 10-candidate row does not occupy 1,024 threads.
 */
#include <algorithm>

#include <cuda_fp16.h>

#include "block_kth.cuh"
#include "rescore.h"

namespace gpuivf_cuda {

namespace {

constexpr int kMaxThreads = 1024;
constexpr int kMinThreads = 64;
constexpr int kMaxCandidates = 1024;
/* A row of runs: each thread holds this many of its keys while the runs'
 * bound is read, so a row of runs has at most this many keys a thread. */
constexpr int kRunKeysPerThread = 8;
/* the kernel's static shared memory, with room to spare */
constexpr size_t kStaticSmemBytes = kMaxCandidates * (sizeof(double) + 2 * sizeof(uint64_t) + 2 * sizeof(int32_t)) +
                                    sizeof(KthShared) + 64;

/* A value as an unsigned integer in src/core's pair_less order of values:
 * smaller first, -0 equal to +0, NaN after every number (all NaN equal), so
 * a candidate's rank is a few integer compares (the double compares and NaN
 * tests of pair_less cost ~35 instructions a pair: 18,000 cycles for 200). */
__device__ __forceinline__ Key value_order(double v) {
    if (v != v) return kSentinelKey;
    if (v == 0.0) v = 0.0;
    const Key u = static_cast<Key>(__double_as_longlong(v));
    return (u >> 63) ? ~u : (u | (Key(1) << 63));
}

/* Lane l's partial sums for a metric's distance between q and x (float or
 * __half values): L2 |q-x|^2 in p0; inner product and cosine q.x in p0,
 * cosine also q.q in p1 and x.x in p2 (core_cosine_distance's inputs). */
template <typename X>
__device__ __forceinline__ void metric_partials(Metric metric, const float *q, const X *x, int d, int l,
                                                float &p0, float &p1, float &p2) {
    if (metric == Metric::L2) {
        p0 = core_l2_partial(q, x, d, l);
        return;
    }
    p0 = core_dot_partial(q, x, d, l);
    if (metric == Metric::Cosine) {
        p1 = core_dot_partial(q, q, d, l);
        p2 = core_dot_partial(x, x, d, l);
    }
}

__global__ void __launch_bounds__(kMaxThreads) rescore_kernel(const RescoreArgs a) {
    /* phases (measurement builds only, common.cuh): to the survivors, to the
     * candidates, to the distances, to the ranks, to the end */
    PhaseClocks clocks;
    extern __shared__ Key run_survivors[]; /* a row of runs: its keys at or below the bound */
    __shared__ double vals[kMaxCandidates];
    __shared__ Key order[kMaxCandidates]; /* value_order(vals[e]) */
    __shared__ uint64_t ids[kMaxCandidates];
    __shared__ uint32_t index[kMaxCandidates];
    __shared__ int rank[kMaxCandidates];
    __shared__ KthShared kth;
    __shared__ Key runs_bound;
    __shared__ int survivors, taken;

    const int64_t row = blockIdx.x;
    const int threads = blockDim.x, lane = threadIdx.x & 31;
    const double nan = __longlong_as_double(0x7ff8000000000000ll);
    const bool rescores = a.mode != RescoreMode::Keys;

    /* Candidate e: an empty slot is (NaN, UINT64_MAX), after every real one. */
    const int n = a.candidates;
    auto place = [&](int e, Key key) {
        rank[e] = 0;
        const uint32_t idx = key_index(key);
        index[e] = idx;
        if (idx == kNoIndex) {
            vals[e] = nan;
            order[e] = kSentinelKey;
            ids[e] = UINT64_MAX;
            return;
        }
        if (rescores) {
            if (a.vectors_half)
                prefetch_l2(a.vectors_half + static_cast<int64_t>(idx) * a.d, sizeof(uint16_t) * a.d);
            else
                prefetch_l2(a.vectors + static_cast<int64_t>(idx) * a.d, sizeof(float) * a.d);
        }
        vals[e] = static_cast<double>(key_score(key));
        order[e] = value_order(vals[e]);
        ids[e] = a.ids ? a.ids[idx] : static_cast<uint64_t>(idx);
    };
    if (a.runs > 1) {
        /* The row's kr best keys among its runs (the host checked that the
         * runs fit kRunKeysPerThread keys a thread). */
        const int total = a.runs * n;
        int kr = a.run_k ? a.run_k[row] : n;
        kr = kr < 1 ? 1 : (kr > n ? n : kr);
        const Key *rp = a.keys + row * a.key_ld;
        Key mine[kRunKeysPerThread];
#pragma unroll
        for (int j = 0; j < kRunKeysPerThread; ++j) {
            const int e = j * threads + threadIdx.x;
            mine[j] = e < total ? rp[e] : kSentinelKey;
        }
        if (threadIdx.x < 32) {
            /* a run's kr-th key bounds the row's kr-th from above */
            Key b = kSentinelKey;
            for (int r = lane; r < a.runs; r += 32)
                b = key_min(b, a.run_bounds ? a.run_bounds[row * a.runs + r] : rp[static_cast<int64_t>(r) * n + kr - 1]);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) b = key_min(b, __shfl_xor_sync(kFullMask, b, o));
            if (lane == 0) {
                runs_bound = b;
                survivors = 0;
                taken = 0;
            }
        }
        __syncthreads();
        const Key bound = runs_bound;
#pragma unroll
        for (int j = 0; j < kRunKeysPerThread; ++j) {
            const int slot = warp_append_slot(key_index(mine[j]) != kNoIndex && mine[j] <= bound, &survivors);
            if (slot >= 0) run_survivors[slot] = mine[j];
        }
        __syncthreads();
        clocks.mark(0);
        const int s = survivors;
        const Key t = s > kr ? block_kth_key(run_survivors, s, kr, kth, threads / 32) : kSentinelKey;
        const int got = s > kr ? kr : s; /* keys are distinct: exactly kr at or below t */
        block_take_at_or_below(run_survivors, s, t, &taken, threads, [&](int at, Key key) {
            if (at < got) place(at, key);
        });
        for (int e = got + threadIdx.x; e < n; e += threads) place(e, kSentinelKey);
    } else {
        for (int e = threadIdx.x; e < n; e += threads) place(e, a.keys[row * a.key_ld + e]);
    }
    __syncthreads();
    clocks.mark(1);

    if (rescores) {
        /* Half a warp per candidate; every lane runs the same trip count. */
        const int half = threadIdx.x / kCoreLanes;
        const int l = threadIdx.x & (kCoreLanes - 1);
        const float *q = a.queries + row * a.d;
        for (int base = 0; base < a.candidates; base += threads / kCoreLanes) {
            const int e = base + half;
            const uint32_t idx = e < a.candidates ? index[e] : kNoIndex;
            const bool valid = idx != kNoIndex;
            const float *x = valid && a.vectors ? a.vectors + static_cast<int64_t>(idx) * a.d : q;
            float p0 = 0.0f, p1 = 0.0f, p2 = 0.0f;
            if (a.vectors_half) {
                /* a half-precision index (SqlDistance): the widened halves;
                 * an empty slot reads row 0 (its result is not used) */
                const __half *xh = reinterpret_cast<const __half *>(a.vectors_half) +
                                   static_cast<int64_t>(valid ? idx : 0) * a.d;
                metric_partials(a.metric, q, xh, a.d, l, p0, p1, p2);
            } else if (a.mode == RescoreMode::KnnExact && !a.vector_scale) {
                p0 = a.metric == Metric::InnerProduct ? core_dot_partial(q, x, a.d, l) : core_l2_partial(q, x, a.d, l);
            } else if (a.mode == RescoreMode::KnnExact) {
                const float s = (a.vector_scale && valid) ? a.vector_scale[idx] : 1.0f;
                for (int i = l; i < a.d; i += kCoreLanes) {
                    const float xi = a.vector_scale ? __fmul_rn(x[i], s) : x[i];
                    if (a.metric == Metric::InnerProduct) {
                        p0 = __fadd_rn(p0, __fmul_rn(q[i], xi));
                    } else {
                        const float diff = __fsub_rn(q[i], xi);
                        p0 = __fadd_rn(p0, __fmul_rn(diff, diff));
                    }
                }
            } else {
                metric_partials(a.metric, q, x, a.d, l, p0, p1, p2);
            }
            p0 = core_lane_sum(p0);
            p1 = core_lane_sum(p1);
            p2 = core_lane_sum(p2);
            /* The ADC distances asked for (out_adc_double): vals[e], the
             * key's score, becomes the exact distance here, so lane 0 keeps
             * the score's bits in index[e] instead of in another shared
             * array (this kernel's static shared memory bounds its
             * occupancy, also in the builds' exact kNN).  index[e] is read
             * as a vector index only by this half-warp, in this iteration
             * (each candidate has one half-warp, once), at its top, and not
             * after the loop; all 32 lanes are here (same trip count), and
             * __syncwarp orders every lane's load of index[e] before lane
             * 0's store (the lane sums' shuffles wait for all lanes too but
             * promise no memory order: racecheck reports the hazard without
             * the barrier).  Empty slots keep kNoIndex: they are output as
             * padding without it. */
            if (a.out_adc_double) __syncwarp();
            if (valid && l == 0) {
                if (a.out_adc_double) index[e] = __float_as_uint(static_cast<float>(vals[e]));
                double v;
                if (a.mode == RescoreMode::KnnExact)
                    v = a.metric == Metric::InnerProduct ? static_cast<double>(-p0) : static_cast<double>(p0);
                else if (a.metric == Metric::L2)
                    v = sqrt(static_cast<double>(p0));
                else if (a.metric == Metric::InnerProduct)
                    v = -static_cast<double>(p0);
                else
                    v = core_cosine_distance(p0, p1, p2);
                vals[e] = v;
                order[e] = value_order(v);
            }
        }
        __syncthreads();
        clocks.mark(2);
    }

    const int k = a.row_k ? a.row_k[row] : a.k;
    const int kept = min(k, n);

    /* Only candidates at or below the kept-th smallest value can be output
     * (at least kept others are before any above it): when they are at
     * most a quarter (the GPU worker's 10 of 200), the others skip the
     * ranking (rank n).  The k-th costs a few barriers, so not for the
     * coarse quantizer's 32 of 64. */
    Key limit = kSentinelKey;
    if (kept > 0 && 4 * kept <= n) limit = block_kth_key(order, n, kept, kth, threads / 32);

    /* Rank of candidate i: the candidates before it in (value, id) order,
     * equal pairs (empty slots) by position, so the ranks are a permutation.
     * The rows' candidates are split over groups of threads, each counting
     * over its share of the others (no sort network, two barriers). */
    const int n32 = (n + 31) & ~31;
    const int groups = n32 > 0 ? max(1, threads / n32) : 1;
    for (int t = threadIdx.x; t < n32 * groups; t += threads) {
        const int i = t % n32, g = t / n32;
        if (i >= n) continue;
        const Key oi = order[i];
        if (oi > limit) {
            if (g == 0) rank[i] = n;
            continue;
        }
        const uint64_t idi = ids[i];
        int before = 0;
        for (int j = g; j < n; j += groups) {
            const Key oj = order[j];
            const uint64_t idj = ids[j];
            before += oj < oi || (oj == oi && (idj < idi || (idj == idi && j < i)));
        }
        atomicAdd(&rank[i], before);
    }
    __syncthreads();
    clocks.mark(3);

    const double inf = __longlong_as_double(0x7ff0000000000000ll);
    /* output slot e: value v, and adc, the ADC score when re-scored */
    auto put = [&](int e, double v, float adc, uint64_t id) {
        const bool real = id != UINT64_MAX;
        if (!real) v = inf;
        if (real && a.mode == RescoreMode::Keys && a.to_distance) v = score_to_distance(a.metric, static_cast<float>(v));
        const int64_t o = row * a.out_ld + e;
        if (a.out_float) a.out_float[o] = static_cast<float>(v);
        if (a.out_double) a.out_double[o] = v;
        if (a.out_adc_double) a.out_adc_double[o] = !real ? inf : rescores ? score_to_distance(a.metric, adc) : v;
        a.out_ids[o] = real ? id : UINT64_MAX;
    };
    for (int e = threadIdx.x; e < n; e += threads) {
        if (rank[e] < kept && rank[e] < a.out_ld) {
            /* re-scored: the ADC score's bits were left in index[e] (above) */
            const float adc = rescores && a.out_adc_double ? __uint_as_float(index[e]) : 0.0f;
            put(rank[e], vals[e], adc, ids[e]);
        }
    }
    for (int e = kept + threadIdx.x; e < a.out_ld; e += threads) put(e, inf, 0.0f, UINT64_MAX);
    clocks.mark(4);
    if (blockIdx.x == 0 && threadIdx.x == 0 && a.runs > 1) clocks.print("rescore_phase_clocks");
}

}  // namespace

bool rescore_takes_runs(const Resources &res, int runs, int candidates) {
    const int64_t total = static_cast<int64_t>(runs) * candidates;
    return runs > 1 && candidates <= kMaxCandidates && total <= int64_t(kRunKeysPerThread) * kMaxThreads &&
           sizeof(Key) * static_cast<size_t>(total) + kStaticSmemBytes <= res.smem_optin;
}

void rescore_and_sort(Resources &res, const RescoreArgs &a) {
    if (a.rows <= 0) return;
    GPUIVF_REQUIRE(a.candidates >= 0 && a.candidates <= kMaxCandidates, "too many re-rank candidates: %d",
                   a.candidates);
    int threads;
    size_t smem = 0;
    if (a.runs > 1) {
        GPUIVF_REQUIRE(rescore_takes_runs(res, a.runs, a.candidates), "%d runs of %d candidates do not fit a block",
                       a.runs, a.candidates);
        threads = kMaxThreads;
        smem = sizeof(Key) * static_cast<size_t>(a.runs) * a.candidates;
        /* static + dynamic past 48 KB needs the limit raised; always to the
         * most a block can have (a recorded graph replays this launch after
         * calls of other sizes) */
        if (smem + kStaticSmemBytes > 48 * 1024)
            GPUIVF_CUDA_TRY(cudaFuncSetAttribute(rescore_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(res.smem_optin - kStaticSmemBytes)));
    } else {
        const int per = a.mode == RescoreMode::Keys ? 1 : kCoreLanes;
        threads = static_cast<int>(std::min<int64_t>(
            kMaxThreads, std::max<int64_t>(kMinThreads, round_up(static_cast<int64_t>(a.candidates) * per, 32))));
    }
    rescore_kernel<<<static_cast<unsigned>(a.rows), threads, smem, res.stream>>>(a);
    GPUIVF_CUDA_CHECK_LAUNCH();
}

}  // namespace gpuivf_cuda
