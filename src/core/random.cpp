/*
 * random.cpp — row sampling and gathering for the engine's subsamples
 * (k-means, PQ training); the generators are random.h's.
 */
#include <cstring>

#include "core_internal.h"

namespace gpuivf {
namespace detail {

std::vector<int64_t> sample_rows(int64_t n, int64_t count, uint64_t seed) {
    Rng rng(seed);
    return gpuivf::sample_rows(n, count, rng);
}

std::vector<float> gather_rows(const float *x, int d, const std::vector<int64_t> &rows) {
    std::vector<float> out(rows.size() * static_cast<size_t>(d));
    for (size_t i = 0; i < rows.size(); i++)
        std::memcpy(&out[i * d], x + rows[i] * d, sizeof(float) * d);
    return out;
}

}  // namespace detail
}  // namespace gpuivf
