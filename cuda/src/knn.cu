/*
 * knn.cu — exact kNN by tiles.
 *
 * For a tile of queries Q and base rows X one GEMM writes finished scores
 * into a row-major tile: the norm add is fused into the GEMM by one extra
 * dimension, [q, 1] . [-2x, |x|^2] = |x|^2 - 2 q.x (cosine: x replaced by
 * the unit vector x^; inner product: -q.x, no extra dimension), so neither a
 * separate pass nor per-column loads in the selection are needed.  |q|^2 is
 * constant per row and only added at the end.  The select kernel keeps each
 * query's best keys; the running result of the previous base tiles seeds the
 * next tile's selection (the queue and the threshold start from it), so
 * there is no separate merge pass and later tiles reject almost everything
 * at the first compare.
 *
 * GEMM and selection overlap: GEMMs run on the second stream into two tile
 * buffers while the selection of the previous tile runs on the main stream,
 * ordered by events (a buffer is rewritten only after its selection ended).
 */
#include <algorithm>
#include <limits>

#include "knn.h"
#include "rescore.h"
#include "select.h"
#include "vectors.h"

namespace gpuivf_cuda {

namespace {

__global__ void knn_gemm_finalize_kernel(const Key *keys, int64_t key_ld, int64_t rows, int k, const float *qnorms,
                                         float *out_scores, uint64_t *out_ids) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= rows * k) return;
    const int64_t row = t / k;
    const int e = static_cast<int>(t - row * k);
    const Key key = keys[row * key_ld + e];
    if (key_index(key) == kNoIndex) {
        out_scores[t] = __int_as_float(0x7f800000);
        out_ids[t] = UINT64_MAX;
        return;
    }
    float v = key_score(key);
    if (qnorms) {
        v += qnorms[row];
        if (v < 0.0f) v = 0.0f;
    }
    out_scores[t] = v;
    out_ids[t] = key_index(key);
}

/* out row i = [-2 x^, |x^|^2, 0 ...] (da floats), x^ = x * scale[i] (cosine)
 * or x; a warp per row. */
__global__ void augment_base_kernel(const float *x, int64_t n, int d, int da, const float *scale, float *out) {
    const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (row >= n) return;
    const float s = scale ? scale[row] : 1.0f;
    float acc = 0.0f;
    for (int t = lane; t < d; t += 32) {
        const float v = scale ? __fmul_rn(x[row * d + t], s) : x[row * d + t];
        acc = fmaf(v, v, acc);
        out[row * da + t] = -2.0f * v;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    for (int t = d + lane; t < da; t += 32) out[row * da + t] = t == d ? acc : 0.0f;
}

/* out row i = [q, 1, 0 ...] (da floats). */
__global__ void augment_queries_kernel(const float *q, int64_t n, int d, int da, float *out) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= n * da) return;
    const int64_t row = t / da;
    const int c = static_cast<int>(t - row * da);
    out[t] = c < d ? q[row * d + c] : (c == d ? 1.0f : 0.0f);
}

__global__ void fill_padding_kernel(int64_t count, float *scores, uint64_t *ids) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= count) return;
    scores[t] = __int_as_float(0x7f800000);
    ids[t] = UINT64_MAX;
}

/*
 * Small batches against a small base (the coarse quantizer of a search the
 * GPU worker drained from its queue): every (query, base row) score exactly
 * with the CPU's arithmetic (what the re-score does with the shortlist:
 * lane l of a half-warp sums elements l, l+16, ... in order, then the lanes
 * pairwise), then one block per query sorts the (score, index) keys in
 * shared memory.  Two launches instead of augment + GEMM + select +
 * re-score, whose fixed latencies dominate at a few dozen queries; the keys
 * are the exact top k, which the shortlist path also returns unless fp32
 * GEMM error moved a true neighbour past k + max(k, 16) places.
 */
constexpr int kSmallThreads = 256;
constexpr int kSmallRowsPerHalf = 4; /* base rows in flight per half-warp */
constexpr int kSmallRowsPerBlock = kSmallThreads / kCoreLanes * kSmallRowsPerHalf;

__global__ void __launch_bounds__(kSmallThreads) knn_small_score_kernel(const float *base, int n,
                                                                       const float *queries, int d, int ip,
                                                                       Key *keys) {
    const int64_t row = blockIdx.y;
    const int half = threadIdx.x / kCoreLanes;
    const int l = threadIdx.x & (kCoreLanes - 1);
    const int c0 = blockIdx.x * kSmallRowsPerBlock + half * kSmallRowsPerHalf;
    const float *q = queries + row * d;
    const float *x[kSmallRowsPerHalf];
    float acc[kSmallRowsPerHalf];
#pragma unroll
    for (int g = 0; g < kSmallRowsPerHalf; ++g) {
        x[g] = base + static_cast<int64_t>(min(c0 + g, n - 1)) * d;
        acc[g] = 0.0f;
    }
    for (int i = l; i < d; i += kCoreLanes) {
        const float qi = q[i];
        float xi[kSmallRowsPerHalf];
#pragma unroll
        for (int g = 0; g < kSmallRowsPerHalf; ++g) xi[g] = x[g][i];
#pragma unroll
        for (int g = 0; g < kSmallRowsPerHalf; ++g) {
            if (ip) {
                acc[g] = __fadd_rn(acc[g], __fmul_rn(qi, xi[g]));
            } else {
                const float diff = __fsub_rn(qi, xi[g]);
                acc[g] = __fadd_rn(acc[g], __fmul_rn(diff, diff));
            }
        }
    }
#pragma unroll
    for (int g = 0; g < kSmallRowsPerHalf; ++g) {
        const float sum = core_lane_sum(acc[g]);
        if (l == 0 && c0 + g < n) keys[row * n + c0 + g] = make_key(ip ? -sum : sum, static_cast<uint32_t>(c0 + g));
    }
}

constexpr int kSortThreads = 1024;

/* One block per query: sort the row's keys (a bitonic sort whose strides
 * under 32 are register shuffles inside a warp, so only the wider strides
 * cost a shared-memory pass and a barrier), then write the first k. */
__global__ void __launch_bounds__(kSortThreads) knn_small_sort_kernel(const Key *scored, int n, int k, int sort_size,
                                                                     float *out_scores, uint64_t *out_ids,
                                                                     int32_t *out_lists) {
    extern __shared__ __align__(16) unsigned char small_smem[];
    Key *keys = reinterpret_cast<Key *>(small_smem);
    const int64_t row = blockIdx.x;
    const int threads = blockDim.x; /* min(sort_size, kSortThreads) */
    const int per = sort_size / threads;
    if (k <= 32 && per == 1) {
        /* Only the best 32 (a worker's nprobe): each warp sorts its 32 keys
         * in registers, then a tree of merges keeps the best 32 of two runs
         * per step (one run ascending against the other descending: their
         * element-wise minimum holds the 32 smallest as a bitonic sequence,
         * sorted by five shuffle steps).  Five barriers for 1,024 keys
         * instead of the full sort's 55 passes; the same first k (the keys
         * are distinct). */
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        Key v = threadIdx.x < n ? scored[row * n + threadIdx.x] : kSentinelKey;
        for (int size = 2; size <= 32; size <<= 1)
            for (int st = size >> 1; st > 0; st >>= 1) v = bitonic_exchange_lanes(v, lane, size, st);
        keys[threadIdx.x] = v;
        __syncthreads();
        for (int runs = threads / 32; runs > 1; runs >>= 1) {
            if (warp < runs / 2) {
                const Key a = keys[(2 * warp) * 32 + lane], b = keys[(2 * warp + 1) * 32 + (31 - lane)];
                v = a < b ? a : b;
                for (int st = 16; st > 0; st >>= 1) v = bitonic_exchange_lanes(v, lane, 32, st);
            }
            __syncthreads();
            if (warp < runs / 2) keys[warp * 32 + lane] = v;
            __syncthreads();
        }
    } else {
        for (int e = threadIdx.x; e < sort_size; e += threads) keys[e] = e < n ? scored[row * n + e] : kSentinelKey;
        __syncthreads();
        for (int size = 2; size <= sort_size; size <<= 1) {
            int stride = size >> 1;
            for (; stride >= 32; stride >>= 1) {
                for (int i = threadIdx.x; i < sort_size; i += threads) {
                    const int j = i ^ stride;
                    if (j > i) {
                        const Key a = keys[i], b = keys[j];
                        if (((i & size) == 0) == (b < a)) {
                            keys[i] = b;
                            keys[j] = a;
                        }
                    }
                }
                __syncthreads();
            }
            /* the strides under 32 of this size: in registers */
            for (int r = 0; r < per; ++r) {
                const int i = r * threads + threadIdx.x;
                Key v = keys[i];
                for (int st = stride; st > 0; st >>= 1) v = bitonic_exchange_lanes(v, i, size, st);
                keys[i] = v;
            }
            __syncthreads();
        }
    }
    for (int e = threadIdx.x; e < k; e += threads) {
        const Key key = e < n ? keys[e] : kSentinelKey;
        const bool real = key_index(key) != kNoIndex;
        out_scores[row * k + e] = real ? key_score(key) : __int_as_float(0x7f800000);
        out_ids[row * k + e] = real ? key_index(key) : UINT64_MAX;
        if (out_lists) out_lists[row * k + e] = real ? static_cast<int32_t>(key_index(key)) : -1;
    }
}

/* The shortlist kept for k: k, or k + max(k, 16) re-scored exactly (what
 * src/core keeps too). */
int knn_shortlist(int k, bool exact_rescore) { return exact_rescore ? std::min(kMaxK, k + std::max(k, 16)) : k; }

__global__ void ids_to_lists_kernel(const uint64_t *ids, int64_t count, int32_t *lists) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < count) lists[i] = ids[i] == UINT64_MAX ? -1 : static_cast<int32_t>(ids[i]);
}

/* exact_knn without opts.out_lists, except where the direct path writes
 * them (then it returns true). */
bool exact_knn_scores(Resources &res, Metric metric, const float *base, int64_t n, const float *queries, int64_t nq,
                      int d, int k, const KnnOptions &opts, float *out_scores, uint64_t *out_ids) {
    GPUIVF_REQUIRE(k >= 1 && k <= kMaxK, "k %d is out of range 1..%d", k, kMaxK);
    GPUIVF_REQUIRE(n < static_cast<int64_t>(kNoIndex), "too many base vectors for the GPU: %lld",
                   static_cast<long long>(n));
    if (n == 0) {
        fill_padding_kernel<<<static_cast<unsigned>(ceil_div(nq * k, 256)), 256, 0, res.stream>>>(nq * k, out_scores,
                                                                                                 out_ids);
        GPUIVF_CUDA_CHECK_LAUNCH();
        return false;
    }
    const bool ip = metric == Metric::InnerProduct;
    const bool cosine = metric == Metric::Cosine;

    if (opts.exact_rescore && !cosine && !opts.gemm_only && n <= kKnnDirectMaxBase && nq <= kKnnDirectMaxQueries) {
        int sort_size = 32;
        while (sort_size < n) sort_size *= 2;
        TempBuffer<Key> scored(res, nq * n);
        const dim3 grid(static_cast<unsigned>(ceil_div(n, kSmallRowsPerBlock)), static_cast<unsigned>(nq));
        knn_small_score_kernel<<<grid, kSmallThreads, 0, res.stream>>>(base, static_cast<int>(n), queries, d, ip ? 1 : 0,
                                                                      scored.data());
        GPUIVF_CUDA_CHECK_LAUNCH();
        const size_t smem = sizeof(Key) * sort_size; /* <= 32 kB: no opt-in */
        knn_small_sort_kernel<<<static_cast<unsigned>(nq), std::min(sort_size, kSortThreads), smem, res.stream>>>(
            scored.data(), static_cast<int>(n), k, sort_size, out_scores, out_ids, opts.out_lists);
        GPUIVF_CUDA_CHECK_LAUNCH();
        return true;
    }

    /* Cosine: prepare_vector's scale of each base row (the CPU's bits, for
     * the exact re-score). */
    TempBuffer<float> col_scale;
    if (cosine) {
        col_scale.allocate(res, n);
        row_norms(res, base, n, d, nullptr, col_scale.data(), nullptr);
    }

    /* Prepared queries and their norms (added back at the end). */
    const float *qp = queries;
    TempBuffer<float> qbuf, qnorms;
    if (cosine && !opts.queries_prepared) {
        qbuf.allocate(res, nq * d);
        prepare_rows(res, metric, queries, nq, d, qbuf.data());
        qp = qbuf.data();
    }
    if (!ip && !opts.exact_rescore) {
        qnorms.allocate(res, nq);
        row_norms(res, qp, nq, d, qnorms.data(), nullptr, nullptr);
    }

    /* GEMM operands: the augmented rows (norm add fused into the GEMM), or
     * the plain ones for inner product and for the GEMM-only benchmark. */
    const bool augment = !ip && !opts.gemm_only;
    const int da = augment ? static_cast<int>(round_up(d + 1, 4)) : d;
    const float *gb = base, *gq = qp;
    TempBuffer<float> base_aug, q_aug;
    if (augment) {
        base_aug.allocate(res, n * da);
        augment_base_kernel<<<static_cast<unsigned>(ceil_div(n * 32, 256)), 256, 0, res.stream>>>(
            base, n, d, da, cosine ? col_scale.data() : nullptr, base_aug.data());
        GPUIVF_CUDA_CHECK_LAUNCH();
        q_aug.allocate(res, nq * da);
        augment_queries_kernel<<<static_cast<unsigned>(ceil_div(nq * da, 256)), 256, 0, res.stream>>>(qp, nq, d, da,
                                                                                                    q_aug.data());
        GPUIVF_CUDA_CHECK_LAUNCH();
        gb = base_aug.data();
        gq = q_aug.data();
    }

    const int ks = knn_shortlist(k, opts.exact_rescore);
    const int w = select_bucket(ks);

    /* Tile sizes: two distance tiles take about two thirds of the free
     * arena.  Large tiles beat every smaller shape measured, also those
     * that stay in L2 (DESIGN.md): the selection's restarts and the GEMM's
     * efficiency cost more than the L2 saves. */
    const int64_t avail = static_cast<int64_t>(arena_available(res));
    const int64_t tile_floats = std::min<int64_t>(std::max<int64_t>(avail / 12, int64_t(1) << 20), int64_t(1) << 28);
    const int64_t qt0 = std::min<int64_t>(nq, 16384);
    const int64_t nt = std::min(round_up(n, 128), std::max<int64_t>(128, (tile_floats / qt0) / 128 * 128));
    const int64_t qt = std::min<int64_t>(std::min<int64_t>(nq, std::max<int64_t>(1, tile_floats / nt)), 1 << 20);
    const int64_t ldc = nt; /* a multiple of 4: rows stay 16-byte aligned */

    TempBuffer<float> tiles[2];
    const int64_t ntiles = ceil_div(n, nt);
    tiles[0].allocate(res, qt * ldc);
    if (ntiles > 1) tiles[1].allocate(res, qt * ldc);
    TempBuffer<Key> state(res, qt * ks);
    TempBuffer<Key> partial;

    const float alpha = augment ? 1.0f : (ip ? -1.0f : -2.0f);
    const float beta = 0.0f;

    for (int64_t q0 = 0; q0 < nq; q0 += qt) {
        const int64_t rows = std::min(qt, nq - q0);
        const int splits = (rows >= 2 * res.sm_count) ? 1 : std::max(1, std::min<int>(
                                                                            static_cast<int>(ceil_div(4 * res.sm_count, rows)),
                                                                            static_cast<int>(ceil_div(nt, 2048))));
        if (splits > 1 && partial.size() < rows * splits * ks) partial.allocate(res, rows * splits * ks);

        GPUIVF_CUDA_TRY(cudaEventRecord(res.ev_fork, res.stream));
        GPUIVF_CUDA_TRY(cudaStreamWaitEvent(res.gemm_stream, res.ev_fork, 0));
        int64_t t = 0;
        for (int64_t c0 = 0; c0 < n; c0 += nt, ++t) {
            const int64_t cols = std::min(nt, n - c0);
            const int b = static_cast<int>(t & 1);
            float *tile = tiles[b].data();
            if (t >= 2) GPUIVF_CUDA_TRY(cudaStreamWaitEvent(res.gemm_stream, res.ev_select[b], 0));
            /* Column-major C (cols x rows, ldc) = X^T-view * Q: row-major [query][base]. */
            GPUIVF_CUBLAS_TRY(cublasSgemm(res.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(cols),
                                          static_cast<int>(rows), da, &alpha, gb + c0 * da, da, gq + q0 * da, da,
                                          &beta, tile, static_cast<int>(ldc)));
            GPUIVF_CUDA_TRY(cudaEventRecord(res.ev_gemm[b], res.gemm_stream));
            GPUIVF_CUDA_TRY(cudaStreamWaitEvent(res.stream, res.ev_gemm[b], 0));
            if (!opts.gemm_only) {
                SelectRowsArgs a;
                a.values = tile;
                a.ld = ldc;
                a.rows = rows;
                a.cols = cols;
                a.index_base = static_cast<uint32_t>(c0);
                a.k = ks;
                a.out_count = ks;
                if (splits == 1) {
                    a.split_cols = round_up(cols, 4);
                    a.warp_rows = use_warp_rows(res, rows) ? 1 : 0;
                    a.init = t > 0 ? state.data() : nullptr;
                    a.init_ld = ks;
                    a.out = state.data();
                    a.out_ld = ks;
                    launch_select_rows(w, a, 1, res.stream);
                } else {
                    a.split_cols = round_up(ceil_div(cols, splits), 4);
                    const int s = static_cast<int>(ceil_div(cols, a.split_cols));
                    a.out = partial.data();
                    a.out_ld = ks;
                    launch_select_rows(w, a, s, res.stream);
                    SelectRowsArgs m;
                    m.keys = partial.data();
                    m.ld = static_cast<int64_t>(s) * ks;
                    m.rows = rows;
                    m.cols = static_cast<int64_t>(s) * ks;
                    m.split_cols = round_up(m.cols, 4);
                    m.init = t > 0 ? state.data() : nullptr;
                    m.init_ld = ks;
                    m.k = ks;
                    m.out = state.data();
                    m.out_ld = ks;
                    m.out_count = ks;
                    launch_select_rows(w, m, 1, res.stream);
                }
            }
            GPUIVF_CUDA_TRY(cudaEventRecord(res.ev_select[b], res.stream));
            if ((t & 15) == 15) check_cancel(res);
        }
        if (opts.gemm_only) continue;

        if (opts.exact_rescore) {
            RescoreArgs r;
            r.mode = RescoreMode::KnnExact;
            r.metric = metric;
            r.keys = state.data();
            r.key_ld = ks;
            r.candidates = ks;
            r.rows = rows;
            r.k = k;
            r.queries = qp + q0 * d;
            r.d = d;
            r.vectors = base;
            r.vector_scale = cosine ? col_scale.data() : nullptr;
            r.out_float = out_scores + q0 * k;
            r.out_ids = out_ids + q0 * k;
            r.out_ld = k;
            rescore_and_sort(res, r);
        } else {
            knn_gemm_finalize_kernel<<<static_cast<unsigned>(ceil_div(rows * k, 256)), 256, 0, res.stream>>>(
                state.data(), ks, rows, k, ip ? nullptr : qnorms.data() + q0, out_scores + q0 * k, out_ids + q0 * k);
            GPUIVF_CUDA_CHECK_LAUNCH();
        }
    }
    return false;
}

}  // namespace

void exact_knn(Resources &res, Metric metric, const float *base, int64_t n, const float *queries, int64_t nq, int d,
               int k, const KnnOptions &opts, float *out_scores, uint64_t *out_ids) {
    if (nq <= 0) return;
    if (exact_knn_scores(res, metric, base, n, queries, nq, d, k, opts, out_scores, out_ids) || !opts.out_lists) return;
    ids_to_lists_kernel<<<static_cast<unsigned>(ceil_div(nq * k, 256)), 256, 0, res.stream>>>(out_ids, nq * k,
                                                                                            opts.out_lists);
    GPUIVF_CUDA_CHECK_LAUNCH();
}

}  // namespace gpuivf_cuda
