/*
 * rescore.cu — exact re-scoring and the final sort: one block per row, the
 * candidates' values and ids in shared memory, half a warp per candidate for
 * the exact distance (the CPU's lane order), then every candidate's rank
 * among the row's (value, id) pairs, which is its place in the output.
 */
#include "rescore.h"

namespace gpuivf_cuda {

namespace {

/* 64 candidates' distances in flight a pass (the GPU worker re-ranks 200
 * per query: 4 passes instead of 13 at 256 threads). */
constexpr int kThreads = 1024;
constexpr int kMaxCandidates = 1024;

/* (value, id) order of src/core's pair_less: smaller value, NaN after every
 * number, then smaller id. */
__device__ __forceinline__ bool pair_less(double av, uint64_t aid, double bv, uint64_t bid) {
    if (av < bv) return true;
    if (bv < av) return false;
    const bool an = av != av, bn = bv != bv;
    if (an != bn) return bn;
    return aid < bid;
}

__global__ void __launch_bounds__(kThreads) rescore_kernel(const RescoreArgs a) {
    __shared__ double vals[kMaxCandidates];
    __shared__ uint64_t ids[kMaxCandidates];
    __shared__ uint32_t index[kMaxCandidates];
    __shared__ int rank[kMaxCandidates];

    const int64_t row = blockIdx.x;
    const double nan = __longlong_as_double(0x7ff8000000000000ll);

    /* Candidates; an empty slot is (NaN, UINT64_MAX): after every real one. */
    const int n = a.candidates;
    for (int e = threadIdx.x; e < n; e += kThreads) {
        rank[e] = 0;
        const Key key = a.keys[row * a.key_ld + e];
        const uint32_t idx = key_index(key);
        index[e] = idx;
        if (idx == kNoIndex) {
            vals[e] = nan;
            ids[e] = UINT64_MAX;
        } else {
            vals[e] = static_cast<double>(key_score(key));
            ids[e] = a.ids ? a.ids[idx] : static_cast<uint64_t>(idx);
        }
    }
    __syncthreads();

    if (a.mode != RescoreMode::Keys) {
        /* Half a warp per candidate; every lane runs the same trip count. */
        const int half = threadIdx.x / kCoreLanes;
        const int l = threadIdx.x & (kCoreLanes - 1);
        const float *q = a.queries + row * a.d;
        for (int base = 0; base < a.candidates; base += kThreads / kCoreLanes) {
            const int e = base + half;
            const uint32_t idx = e < a.candidates ? index[e] : kNoIndex;
            const bool valid = idx != kNoIndex;
            const float *x = valid ? a.vectors + static_cast<int64_t>(idx) * a.d : q;
            float p0 = 0.0f, p1 = 0.0f, p2 = 0.0f;
            if (a.mode == RescoreMode::KnnExact && !a.vector_scale) {
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
            } else if (a.metric == Metric::L2) {
                p0 = core_l2_partial(q, x, a.d, l);
            } else {
                p0 = core_dot_partial(q, x, a.d, l);
                if (a.metric == Metric::Cosine) {
                    p1 = core_dot_partial(q, q, a.d, l);
                    p2 = core_dot_partial(x, x, a.d, l);
                }
            }
            p0 = core_lane_sum(p0);
            p1 = core_lane_sum(p1);
            p2 = core_lane_sum(p2);
            if (valid && l == 0) {
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
            }
        }
        __syncthreads();
    }

    /* Rank of candidate i: the candidates before it in (value, id) order,
     * equal pairs (empty slots) by position, so the ranks are a permutation.
     * The rows' candidates are split over groups of threads, each counting
     * over its share of the others (no sort network, two barriers). */
    const int n32 = (n + 31) & ~31;
    const int groups = n32 > 0 ? max(1, kThreads / n32) : 1;
    const int i = threadIdx.x % max(n32, 1), g = threadIdx.x / max(n32, 1);
    if (i < n && g < groups) {
        const double vi = vals[i];
        const uint64_t idi = ids[i];
        int before = 0;
        for (int j = g; j < n; j += groups)
            before += pair_less(vals[j], ids[j], vi, idi) || (j < i && !pair_less(vi, idi, vals[j], ids[j]));
        atomicAdd(&rank[i], before);
    }
    __syncthreads();

    const int k = a.row_k ? a.row_k[row] : a.k;
    const int kept = min(k, n);
    const double inf = __longlong_as_double(0x7ff0000000000000ll);
    auto put = [&](int e, double v, uint64_t id) {
        const bool real = id != UINT64_MAX;
        if (!real) v = inf;
        if (real && a.mode == RescoreMode::Keys && a.to_distance) v = score_to_distance(a.metric, static_cast<float>(v));
        const int64_t o = row * a.out_ld + e;
        if (a.out_float) a.out_float[o] = static_cast<float>(v);
        if (a.out_double) a.out_double[o] = v;
        a.out_ids[o] = real ? id : UINT64_MAX;
    };
    for (int e = threadIdx.x; e < n; e += kThreads)
        if (rank[e] < kept && rank[e] < a.out_ld) put(rank[e], vals[e], ids[e]);
    for (int e = kept + threadIdx.x; e < a.out_ld; e += kThreads) put(e, inf, UINT64_MAX);
}

}  // namespace

void rescore_and_sort(Resources &res, const RescoreArgs &a) {
    if (a.rows <= 0) return;
    GPUIVF_REQUIRE(a.candidates >= 0 && a.candidates <= kMaxCandidates, "too many re-rank candidates: %d",
                   a.candidates);
    rescore_kernel<<<static_cast<unsigned>(a.rows), kThreads, 0, res.stream>>>(a);
    GPUIVF_CUDA_CHECK_LAUNCH();
}

}  // namespace gpuivf_cuda
