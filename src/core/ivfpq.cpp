/*
 * ivfpq.cpp — the IVF-PQ model around the quantizers: encoding many vectors
 * (coarse assignment + residual PQ), choosing the lists to probe, building a
 * query's look-up tables.  The ADC scan itself is in adc.cpp.
 */
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>

#include "core_internal.h"

namespace gpuivf {

namespace {

/* Vectors per encoding batch: the residual copy stays cache-sized (2 MiB at
 * d = 128) and the assignment GEMM is still large enough to be efficient. */
constexpr int64_t kEncodeBatch = 4096;

Status encode_run(const IvfPqModel &model, const float *x, int64_t n, int32_t *lists,
                  uint8_t *codes, const CancelHook *cancel) {
    const int d = model.d;
    const int code_size = pq_code_size(model.m, model.nbits);
    const int64_t batch = std::min(n, kEncodeBatch);
    std::vector<float> residuals(static_cast<size_t>(batch) * d);
    for (int64_t b0 = 0; b0 < n; b0 += batch) {
        if (detail::canceled(cancel)) return detail::canceled_status();
        const int64_t rows = std::min(batch, n - b0);
        const float *xb = x + b0 * d;
        Status st = detail::assign_rows(model.centroids, model.centroid_norms, model.nlist, d, xb,
                                        nullptr, rows, lists + b0, nullptr, cancel);
        if (!ok(st)) return st;
        for (int64_t i = 0; i < rows; i++) {
            const float *c = model.centroids + static_cast<int64_t>(lists[b0 + i]) * d;
            for (int t = 0; t < d; t++) residuals[i * d + t] = xb[i * d + t] - c[t];
        }
        pq_encode(model.codebook, d, model.m, model.nbits, residuals.data(), rows,
                  codes + b0 * code_size);
    }
    return status_ok();
}

}  // namespace

Status ivfpq_encode(const IvfPqModel &model, const float *x, int64_t n, int32_t *lists,
                    uint8_t *codes, const CancelHook *cancel) noexcept {
    if (model.d < 1 || model.d > kMaxDims || model.nlist < 1 || model.m < 1 ||
        model.d % model.m != 0 || (model.nbits != 4 && model.nbits != 8) ||
        model.centroids == nullptr || model.codebook == nullptr)
        return status_error(kInvalidArgument, "invalid IVF-PQ model");
    if (n < 0 || (n > 0 && (x == nullptr || lists == nullptr || codes == nullptr)))
        return status_error(kInvalidArgument, "invalid arguments to ivfpq_encode");
    try {
        return encode_run(model, x, n, lists, codes, cancel);
    } catch (const std::bad_alloc &) {
        return detail::out_of_memory_status("IVF-PQ encoding");
    } catch (...) {
        return detail::internal_error_status("IVF-PQ encoding");
    }
}

void ivfpq_probe_lists(const IvfPqModel &model, const float *q, int nprobe, int32_t *lists_out,
                       float *scores_out) noexcept {
    /* The output arrays double as the selection heap, so nothing is allocated. */
    const int keep = std::max(0, std::min(nprobe, model.nlist));
    int size = 0;
    for (int c = 0; c < model.nlist; c++) {
        const float *cent = model.centroids + static_cast<int64_t>(c) * model.d;
        const float score = model.metric == Metric::InnerProduct ? -inner_product(q, cent, model.d)
                                                                 : l2_squared(q, cent, model.d);
        detail::heap_push(scores_out, lists_out, keep, &size, score, static_cast<int32_t>(c));
    }
    detail::heap_sort(scores_out, lists_out, size);
    for (int i = size; i < nprobe; i++) {
        lists_out[i] = -1;
        scores_out[i] = std::numeric_limits<float>::infinity();
    }
}

int ivfpq_lut_size(const IvfPqModel &model) noexcept { return model.m * (1 << model.nbits); }

namespace {

/* One sub-space's table: out[k] = |r - cb_k|^2 (L2) or -r.cb_k (inner
 * product) for the ksub sub-centroids cb_k of dsub floats.  D > 0 fixes dsub
 * at compile time: the short inner loop unrolls and the compiler can
 * vectorise across sub-centroids, which a call of l2_squared per entry
 * (dsub = 4: 8192 calls per table) cannot. */
template <int D, bool IP>
__attribute__((always_inline)) inline void sub_table(const float *r, const float *cb, int ksub, int dsub,
                                                     float *out) {
    const int dims = D > 0 ? D : dsub;
    for (int k = 0; k < ksub; k++) {
        const float *c = cb + k * dims;
        float s = 0.0f;
        for (int t = 0; t < dims; t++) {
            if (IP) {
                s += r[t] * c[t];
            } else {
                float diff = r[t] - c[t];
                s += diff * diff;
            }
        }
        out[k] = IP ? -s : s;
    }
}

template <bool IP>
__attribute__((always_inline)) inline void tables(const float *r, const float *codebook, int m, int ksub,
                                                  int dsub, float *lut) {
    for (int j = 0; j < m; j++) {
        const float *rj = r + j * dsub;
        const float *cb = codebook + static_cast<int64_t>(j) * ksub * dsub;
        float *out = lut + j * ksub;
        switch (dsub) {
            case 1: sub_table<1, IP>(rj, cb, ksub, dsub, out); break;
            case 2: sub_table<2, IP>(rj, cb, ksub, dsub, out); break;
            case 4: sub_table<4, IP>(rj, cb, ksub, dsub, out); break;
            case 8: sub_table<8, IP>(rj, cb, ksub, dsub, out); break;
            default:
                for (int k = 0; k < ksub; k++)
                    out[k] = IP ? -inner_product(rj, cb + k * dsub, dsub) : l2_squared(rj, cb + k * dsub, dsub);
        }
    }
}

__attribute__((target_clones("avx2", "default")))
void build_tables(bool inner_product, const float *r, const float *codebook, int m, int ksub, int dsub,
                  float *lut) {
    if (inner_product)
        tables<true>(r, codebook, m, ksub, dsub, lut);
    else
        tables<false>(r, codebook, m, ksub, dsub, lut);
}

}  // namespace

void ivfpq_build_lut(const IvfPqModel &model, const float *q, int list, float *lut,
                     float *bias) noexcept {
    const int d = model.d;
    const int dsub = d / model.m;
    const int ksub = 1 << model.nbits;
    const float *c = model.centroids + static_cast<int64_t>(list) * d;
    if (model.metric == Metric::InnerProduct) {
        /* q.(c + r) = q.c + sum_j q_j.r_j: the table is independent of the list. */
        *bias = -inner_product(q, c, d);
        build_tables(true, q, model.codebook, model.m, ksub, dsub, lut);
        return;
    }
    /* |q - (c + r)|^2 = sum_j |(q - c)_j - r_j|^2 */
    *bias = 0.0f;
    float residual[kMaxDims];
    for (int t = 0; t < d; t++) residual[t] = q[t] - c[t];
    build_tables(false, residual, model.codebook, model.m, ksub, dsub, lut);
}

double ivfpq_score_to_distance(Metric m, float score) noexcept {
    switch (m) {
        case Metric::L2: return std::sqrt(static_cast<double>(std::max(score, 0.0f)));
        case Metric::InnerProduct: return static_cast<double>(score);
        case Metric::Cosine: return static_cast<double>(score) / 2.0;
    }
    return std::numeric_limits<double>::quiet_NaN();
}

}  // namespace gpuivf
