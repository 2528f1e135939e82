/*
 * pq.cpp — product quantization: per-sub-space k-means codebooks, encoding
 * by nearest sub-centroid, decoding.  Codebook layout [m][ksub][dsub].
 */
#include <algorithm>
#include <cstring>
#include <new>

#include "core_internal.h"

namespace gpuivf {

namespace {

/* Transposed sub-codebooks up to this many floats live on the stack (64 KiB);
 * larger ones (dsub > 64 at 8 bits) are scanned row by row instead, where
 * each distance is long enough to vectorise on its own. */
constexpr int kStackCodebookFloats = 16384;

/* Training rows per sub-centroid.  A sub-space has only dsub dimensions, so
 * fewer rows than the coarse quantizer's 256 per centroid suffice: on
 * bench_core's 100k x 128 data (m = 32, 8 bits) the relative reconstruction
 * error is 0.0790 at 256, 0.0802 at 128 and 0.0819 at 64, while the time
 * halves at each step. */
constexpr int kPqPointsPerCentroid = 128;

bool valid_pq_shape(int d, int m, int nbits) {
    return d >= 1 && d <= kMaxDims && m >= 1 && m <= kMaxPqM && d % m == 0 &&
           (nbits == 4 || nbits == 8);
}

Status pq_train_run(const float *residuals, int64_t n, int d, int m, int nbits, uint64_t seed,
                    float *codebook, const WorkClaim *claim, const CancelHook *cancel) {
    const int dsub = d / m;
    const int ksub = 1 << nbits;
    KMeansParams params = kmeans_default_params();
    params.seed = seed;
    params.max_points_per_centroid = kPqPointsPerCentroid;
    /* Sub-space k-means needs the sample only once: subsample it here so each
     * of the m runs gathers from the small copy. */
    const int64_t max_points = static_cast<int64_t>(ksub) * params.max_points_per_centroid;
    std::vector<float> sample;
    if (n > max_points) {
        sample = detail::gather_rows(residuals, d, detail::sample_rows(n, max_points, seed ^ 0x5eedULL));
        residuals = sample.data();
        n = max_points;
    }
    std::vector<float> sub(static_cast<size_t>(n) * dsub);
    int64_t next = 0;
    for (;;) {
        const int64_t j = claim != nullptr ? claim->next(claim->arg) : next++;
        if (j < 0 || j >= m) break;
        if (detail::canceled(cancel)) return detail::canceled_status();
        for (int64_t i = 0; i < n; i++)
            std::memcpy(&sub[i * dsub], residuals + i * d + j * dsub, sizeof(float) * dsub);
        params.seed = seed + 7919ULL * (j + 1);
        /* not kmeans_train: residuals may reach twice its input bound */
        float *cb = codebook + j * ksub * dsub;
        Status st = detail::kmeans_run(sub.data(), n, dsub, ksub, params, cb, cancel);
        if (!ok(st)) return st;
        if (!components_within(cb, static_cast<int64_t>(ksub) * dsub, kMaxModelComponent))
            return status_error(kInternal, "product quantizer training produced a value that is not finite or out of range");
    }
    return status_ok();
}

}  // namespace

Status pq_train_claimed(const float *residuals, int64_t n, int d, int m, int nbits, uint64_t seed,
                        float *codebook, const WorkClaim *claim, const CancelHook *cancel) noexcept {
    if (!valid_pq_shape(d, m, nbits))
        return status_error(kInvalidArgument,
                            "invalid product quantizer shape: %d dimensions, %d sub-quantizers, %d bits",
                            d, m, nbits);
    if (n < 1 || residuals == nullptr || codebook == nullptr)
        return status_error(kInvalidArgument, "product quantizer training needs at least one vector");
    /* residuals of vectors and centroids within kMaxComponent lie within twice it */
    if (!components_within(residuals, n * d, 2 * kMaxComponent))
        return status_error(kInvalidArgument,
                            "product quantizer training residuals must be finite with magnitudes up to %g",
                            2 * static_cast<double>(kMaxComponent));
    try {
        return pq_train_run(residuals, n, d, m, nbits, seed, codebook, claim, cancel);
    } catch (const std::bad_alloc &) {
        return detail::out_of_memory_status("product quantizer training");
    } catch (...) {
        return detail::internal_error_status("product quantizer training");
    }
}

Status pq_train(const float *residuals, int64_t n, int d, int m, int nbits, uint64_t seed,
                float *codebook, const CancelHook *cancel) noexcept {
    return pq_train_claimed(residuals, n, d, m, nbits, seed, codebook, nullptr, cancel);
}

void pq_encode(const float *codebook, int d, int m, int nbits, const float *residuals, int64_t n,
               uint8_t *codes) noexcept {
    const int dsub = d / m;
    const int ksub = 1 << nbits;
    const int code_size = pq_code_size(m, nbits);
    std::memset(codes, 0, static_cast<size_t>(n) * code_size);
    const bool transposed = ksub * dsub <= kStackCodebookFloats;
    float ct[kStackCodebookFloats];
    for (int j = 0; j < m; j++) {
        const float *cb = codebook + static_cast<int64_t>(j) * ksub * dsub;
        if (transposed) detail::transpose(cb, ksub, dsub, ct);
        for (int64_t i = 0; i < n; i++) {
            const float *x = residuals + i * d + j * dsub;
            int best = 0;
            if (transposed) {
                best = detail::nearest_transposed(x, ct, ksub, dsub, nullptr);
            } else {
                float bd = l2_squared(x, cb, dsub);
                for (int c = 1; c < ksub; c++) {
                    float dist = l2_squared(x, cb + c * dsub, dsub);
                    if (dist < bd) {
                        bd = dist;
                        best = c;
                    }
                }
            }
            detail::pq_set_code(codes + i * code_size, j, nbits, best);
        }
    }
}

void pq_decode(const float *codebook, int d, int m, int nbits, const uint8_t *codes, int64_t n,
               float *residuals) noexcept {
    const int dsub = d / m;
    const int ksub = 1 << nbits;
    const int code_size = pq_code_size(m, nbits);
    for (int64_t i = 0; i < n; i++) {
        for (int j = 0; j < m; j++) {
            const int c = detail::pq_get_code(codes + i * code_size, j, nbits);
            std::memcpy(residuals + i * d + j * dsub,
                        codebook + (static_cast<int64_t>(j) * ksub + c) * dsub, sizeof(float) * dsub);
        }
    }
}

}  // namespace gpuivf
