/*
 * knn.cpp — exact k nearest neighbours by GEMM tiles (ANALYZE ground truth,
 * the GPU engine's reference).
 *
 * The GEMM form of a distance loses a few bits to cancellation, enough to
 * swap near-ties.  So each query keeps a wider GEMM shortlist, whose members
 * are then scored again with the exact functions of distance.cpp (what the
 * SQL operators compute) and cut to k: the answer is exact unless more than
 * the margin of candidates are within rounding of the k-th.
 */
#include <algorithm>
#include <cstring>
#include <limits>
#include <new>

#include "core_internal.h"

namespace gpuivf {

namespace {

/* Extra shortlist entries per query beyond k. */
int shortlist_size(int k, int64_t n) {
    int64_t s = static_cast<int64_t>(k) + std::max(k, 16);
    return static_cast<int>(std::min<int64_t>(s, n));
}

/* Prepared copy of rows (unit vectors for cosine, unchanged otherwise). */
void prepare_rows(Metric m, const float *x, int64_t n, int d, float *out) {
    for (int64_t i = 0; i < n; i++) prepare_vector(m, x + i * d, out + i * d, d);
}

/* The internal "smaller is better" score of two prepared vectors. */
float exact_score(Metric m, const float *a, const float *b, int d) {
    if (m == Metric::InnerProduct) return -inner_product(a, b, d);
    return l2_squared(a, b, d);
}

Status knn_run(Metric m, const float *base, int64_t n, const float *queries, int64_t nq, int d,
               int k, float *out_vals, uint64_t *out_ids, const CancelHook *cancel) {
    const int cap = shortlist_size(k, n);
    const bool l2_form = m != Metric::InnerProduct;

    std::vector<float> q(static_cast<size_t>(nq) * d);
    prepare_rows(m, queries, nq, d, q.data());
    std::vector<float> qn(nq);
    row_norms(q.data(), nq, d, qn.data());

    std::vector<float> heap_vals(static_cast<size_t>(nq) * cap);
    std::vector<uint64_t> heap_ids(static_cast<size_t>(nq) * cap);
    std::vector<TopK> heaps(nq);
    for (int64_t i = 0; i < nq; i++)
        topk_init(&heaps[i], &heap_vals[i * cap], &heap_ids[i * cap], cap);

    const int64_t col_tile = std::min<int64_t>(n, detail::kColTile);
    const int64_t row_tile = std::min<int64_t>(nq, detail::kRowTile);
    std::vector<float> b(static_cast<size_t>(col_tile) * d), bn(col_tile);
    std::vector<float> tile(static_cast<size_t>(row_tile * col_tile));

    for (int64_t c0 = 0; c0 < n; c0 += col_tile) {
        if (detail::canceled(cancel)) return detail::canceled_status();
        const int64_t cols = std::min(col_tile, n - c0);
        prepare_rows(m, base + c0 * d, cols, d, b.data());
        row_norms(b.data(), cols, d, bn.data());
        for (int64_t r0 = 0; r0 < nq; r0 += row_tile) {
            const int64_t rows = std::min(row_tile, nq - r0);
            if (l2_form) {
                detail::l2_sq_tile(&q[r0 * d], &qn[r0], rows, b.data(), bn.data(), cols, d, tile.data());
            } else {
                detail::gemm_abt(&q[r0 * d], rows, b.data(), cols, d, tile.data());
                for (int64_t i = 0; i < rows * cols; i++) tile[i] = -tile[i];
            }
            for (int64_t i = 0; i < rows; i++) {
                TopK *h = &heaps[r0 + i];
                const float *row = &tile[i * cols];
                float thr = topk_threshold(h);
                for (int64_t j = 0; j < cols; j++) {
                    if (row[j] <= thr) {
                        topk_push(h, row[j], static_cast<uint64_t>(c0 + j));
                        thr = topk_threshold(h);
                    }
                }
            }
        }
    }

    /* Exact re-score of each shortlist, then the k best. */
    std::vector<float> bv(d);
    for (int64_t i = 0; i < nq; i++) {
        TopK *h = &heaps[i];
        for (int s = 0; s < h->size; s++) {
            prepare_vector(m, base + h->ids[s] * d, bv.data(), d);
            h->vals[s] = exact_score(m, &q[i * d], bv.data(), d);
        }
        sort_pairs(h->vals, h->ids, h->size);
        const int keep = std::min(k, h->size);
        for (int s = 0; s < k; s++) {
            out_vals[i * k + s] = s < keep ? h->vals[s] : std::numeric_limits<float>::infinity();
            out_ids[i * k + s] = s < keep ? h->ids[s] : UINT64_MAX;
        }
    }
    return status_ok();
}

}  // namespace

Status exact_knn(Metric m, const float *base, int64_t n, const float *queries, int64_t nq,
                 int d, int k, float *out_vals, uint64_t *out_ids,
                 const CancelHook *cancel) noexcept {
    if (d < 1 || d > kMaxDims)
        return status_error(kInvalidArgument, "dimension %d is out of range 1..%d", d, kMaxDims);
    if (k < 1 || k > kMaxK)
        return status_error(kInvalidArgument, "k %d is out of range 1..%d", k, kMaxK);
    if (n < 0 || nq < 0 || (n > 0 && base == nullptr) ||
        (nq > 0 && (queries == nullptr || out_vals == nullptr || out_ids == nullptr)))
        return status_error(kInvalidArgument, "invalid arguments to exact_knn");
    if (m != Metric::L2 && m != Metric::InnerProduct && m != Metric::Cosine)
        return status_error(kInvalidArgument, "unknown metric %d", static_cast<int>(m));
    if (nq == 0) return status_ok();
    if (n == 0) {
        for (int64_t i = 0; i < nq * k; i++) {
            out_vals[i] = std::numeric_limits<float>::infinity();
            out_ids[i] = UINT64_MAX;
        }
        return status_ok();
    }
    try {
        return knn_run(m, base, n, queries, nq, d, k, out_vals, out_ids, cancel);
    } catch (const std::bad_alloc &) {
        return detail::out_of_memory_status("exact k-nearest-neighbour search");
    } catch (...) {
        return detail::internal_error_status("exact k-nearest-neighbour search");
    }
}

}  // namespace gpuivf
