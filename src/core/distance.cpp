/*
 * distance.cpp — the exact distances: what the SQL functions return and what
 * the index re-ranks with.
 *
 * Summation order is part of the contract (index order must equal a
 * sequential scan's bit for bit, and a standby on another CPU must agree):
 * element i is accumulated in float32 lane i % kLanes of kLanes independent
 * accumulators, the tail (i >= d - d % kLanes) in lane i % kLanes too, and the
 * lanes are summed pairwise at the end.  The file is compiled with
 * -ffp-contract=off so no FMA changes the rounding, which makes the AVX2 and
 * the baseline clones of target_clones return identical bits.
 */
#include <cmath>
#include <cstring>
#include <limits>

#include "core_internal.h"

namespace gpuivf {

namespace {

constexpr int kLanes = 16;

/* Pairwise sum of the lanes in a fixed order. */
inline float reduce_lanes(float *acc) noexcept {
    for (int width = kLanes / 2; width > 0; width /= 2)
        for (int i = 0; i < width; i++) acc[i] += acc[i + width];
    return acc[0];
}

}  // namespace

__attribute__((target_clones("avx2", "default")))
float l2_squared(const float *a, const float *b, int d) noexcept {
    float acc[kLanes] = {};
    int i = 0;
    for (; i + kLanes <= d; i += kLanes) {
        for (int l = 0; l < kLanes; l++) {
            float diff = a[i + l] - b[i + l];
            acc[l] += diff * diff;
        }
    }
    for (int l = 0; i + l < d; l++) {
        float diff = a[i + l] - b[i + l];
        acc[l] += diff * diff;
    }
    return reduce_lanes(acc);
}

__attribute__((target_clones("avx2", "default")))
float inner_product(const float *a, const float *b, int d) noexcept {
    float acc[kLanes] = {};
    int i = 0;
    for (; i + kLanes <= d; i += kLanes) {
        for (int l = 0; l < kLanes; l++) acc[l] += a[i + l] * b[i + l];
    }
    for (int l = 0; i + l < d; l++) acc[l] += a[i + l] * b[i + l];
    return reduce_lanes(acc);
}

double l2_distance(const float *a, const float *b, int d) noexcept {
    return std::sqrt(static_cast<double>(l2_squared(a, b, d)));
}

double negative_inner_product(const float *a, const float *b, int d) noexcept {
    return -static_cast<double>(inner_product(a, b, d));
}

double cosine_distance(const float *a, const float *b, int d) noexcept {
    const float dot = inner_product(a, b, d);
    const float na = inner_product(a, a, d);
    const float nb = inner_product(b, b, d);
    if (!(na > 0.0f) || !(nb > 0.0f)) return std::numeric_limits<double>::quiet_NaN();
    double sim = static_cast<double>(dot) / std::sqrt(static_cast<double>(na) * static_cast<double>(nb));
    /* Rounding can push |cos| a hair above 1. */
    if (sim > 1.0) sim = 1.0;
    if (sim < -1.0) sim = -1.0;
    return 1.0 - sim;
}

bool components_within(const float *x, int64_t n, float bound) noexcept {
    bool good = true;
    for (int64_t i = 0; i < n; i++) good &= std::fabs(x[i]) <= bound; /* false for NaN */
    return good;
}

double metric_distance(Metric m, const float *a, const float *b, int d) noexcept {
    switch (m) {
        case Metric::L2: return l2_distance(a, b, d);
        case Metric::InnerProduct: return negative_inner_product(a, b, d);
        case Metric::Cosine: return cosine_distance(a, b, d);
    }
    return std::numeric_limits<double>::quiet_NaN();
}

bool prepare_vector(Metric m, const float *in, float *out, int d) noexcept {
    if (in != out) std::memmove(out, in, sizeof(float) * static_cast<size_t>(d));
    if (m != Metric::Cosine) return true;
    const float norm2 = inner_product(in, in, d);
    if (!(norm2 > 0.0f)) return false;
    const float inv = static_cast<float>(1.0 / std::sqrt(static_cast<double>(norm2)));
    for (int i = 0; i < d; i++) out[i] *= inv;
    return true;
}

void row_norms(const float *x, int64_t n, int d, float *norms) noexcept {
    for (int64_t i = 0; i < n; i++) norms[i] = inner_product(x + i * d, x + i * d, d);
}

}  // namespace gpuivf
