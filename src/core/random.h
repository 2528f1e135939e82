/*
 * random.h — deterministic pseudo-random numbers and row sampling: the same
 * seed gives the same numbers on every platform and compiler, which the
 * standard library's distributions do not promise.
 *
 * Header only and plain C++ (no PostgreSQL, no CUDA, no other file of
 * src/core), so that the three users share one copy: the CPU engine
 * (k-means starts and subsamples), the GPU engine's host code (cuda/, its
 * k-means), and the test tools' data generators (test/tools).
 */
#ifndef GPUIVF_RANDOM_H
#define GPUIVF_RANDOM_H

#include <cstdint>
#include <vector>

namespace gpuivf {

/* One step of splitmix64 (Steele, Lea and Flood): advances *state. */
inline uint64_t splitmix64(uint64_t *state) noexcept {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform draws from a generator G that has next() (64 random bits). */
template <class G>
class RandomDraws {
public:
    /* Uniform in [0, bound), bound > 0: rejection sampling, no modulo bias. */
    uint64_t below(uint64_t bound) noexcept {
        const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
        uint64_t r;
        do {
            r = self().next();
        } while (r >= limit);
        return r % bound;
    }
    /* Uniform in [0, 1), 53 random bits. */
    double uniform() noexcept { return static_cast<double>(self().next() >> 11) * (1.0 / 9007199254740992.0); }

private:
    G &self() noexcept { return static_cast<G &>(*this); }
};

/* splitmix64 as a generator (the GPU engine's k-means). */
class SplitMix64 : public RandomDraws<SplitMix64> {
public:
    explicit SplitMix64(uint64_t seed) noexcept : s_(seed) {}
    uint64_t next() noexcept { return splitmix64(&s_); }

private:
    uint64_t s_;
};

/* xoshiro256** (Blackman and Vigna), its state seeded through splitmix64
 * (the CPU engine and the test tools). */
class Xoshiro256 : public RandomDraws<Xoshiro256> {
public:
    explicit Xoshiro256(uint64_t seed) noexcept {
        uint64_t sm = seed;
        for (uint64_t &word : s_) word = splitmix64(&sm);
    }
    uint64_t next() noexcept {
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

private:
    static uint64_t rotl(uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }
    uint64_t s_[4];
};

/* Row indices of a uniform sample of `count` rows out of n, ascending (so
 * the copied rows are read in memory order); every row when count >= n.
 * Selection sampling (Knuth's algorithm S): one pass, no n-sized buffer. */
template <class G>
std::vector<int64_t> sample_rows(int64_t n, int64_t count, G &rng) {
    std::vector<int64_t> rows;
    if (count >= n) {
        rows.resize(static_cast<size_t>(n > 0 ? n : 0));
        for (int64_t i = 0; i < n; i++) rows[static_cast<size_t>(i)] = i;
        return rows;
    }
    rows.reserve(static_cast<size_t>(count > 0 ? count : 0));
    int64_t needed = count;
    for (int64_t i = 0; i < n && needed > 0; i++) {
        if (static_cast<int64_t>(rng.below(static_cast<uint64_t>(n - i))) < needed) {
            rows.push_back(i);
            needed--;
        }
    }
    return rows;
}

}  // namespace gpuivf

#endif /* GPUIVF_RANDOM_H */
