/*
 * random.cpp — the engine's own deterministic random numbers and row
 * sampling (k-means subsamples, k-means++ draws).
 */
#include <algorithm>
#include <cstring>

#include "core_internal.h"

namespace gpuivf {
namespace detail {

static uint64_t splitmix64(uint64_t *state) noexcept {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }

Rng::Rng(uint64_t seed) noexcept {
    uint64_t sm = seed;
    for (uint64_t &word : s_) word = splitmix64(&sm);
}

uint64_t Rng::next() noexcept {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
}

uint64_t Rng::below(uint64_t bound) noexcept {
    /* Rejection sampling: no modulo bias, still deterministic. */
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t r;
    do {
        r = next();
    } while (r >= limit);
    return r % bound;
}

double Rng::uniform() noexcept { return (next() >> 11) * (1.0 / 9007199254740992.0); }

std::vector<int64_t> sample_rows(int64_t n, int64_t count, uint64_t seed) {
    std::vector<int64_t> rows;
    if (count >= n) {
        rows.resize(n);
        for (int64_t i = 0; i < n; i++) rows[i] = i;
        return rows;
    }
    /* Selection sampling (Knuth's algorithm S): one pass, no n-sized buffer. */
    Rng rng(seed);
    rows.reserve(count);
    int64_t needed = count;
    for (int64_t i = 0; i < n && needed > 0; i++) {
        if (static_cast<int64_t>(rng.below(static_cast<uint64_t>(n - i))) < needed) {
            rows.push_back(i);
            needed--;
        }
    }
    return rows;
}

std::vector<float> gather_rows(const float *x, int d, const std::vector<int64_t> &rows) {
    std::vector<float> out(rows.size() * static_cast<size_t>(d));
    for (size_t i = 0; i < rows.size(); i++)
        std::memcpy(&out[i * d], x + rows[i] * d, sizeof(float) * d);
    return out;
}

}  // namespace detail
}  // namespace gpuivf
