/*
 * rng.h — a small, fully specified random number generator for the test
 * tools, so that a seed gives the same data on every machine and compiler
 * (std::normal_distribution is implementation-defined).
 *
 * xoshiro256** seeded through splitmix64; normals by the Box–Muller method.
 */
#ifndef GPUIVF_TEST_RNG_H
#define GPUIVF_TEST_RNG_H

#include <cmath>
#include <cstdint>

namespace testrng {

inline uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

class Rng {
  public:
    /* stream separates independent sequences drawn from one user seed. */
    Rng(uint64_t seed, uint64_t stream) {
        uint64_t sm = seed ^ (stream * 0xD1B54A32D192ED03ull);
        for (auto &w : s_) w = splitmix64(&sm);
    }

    uint64_t next() {
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

    /* Uniform in [0, 1) with 53 random bits. */
    double uniform() { return (double)(next() >> 11) * 0x1.0p-53; }

    /* Standard normal. */
    double normal() {
        if (have_spare_) {
            have_spare_ = false;
            return spare_;
        }
        double u1;
        do {
            u1 = uniform();
        } while (u1 <= 0.0);
        const double u2 = uniform();
        const double r = std::sqrt(-2.0 * std::log(u1));
        const double a = 6.283185307179586 * u2;
        spare_ = r * std::sin(a);
        have_spare_ = true;
        return r * std::cos(a);
    }

  private:
    static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
    uint64_t s_[4];
    bool have_spare_ = false;
    double spare_ = 0.0;
};

}  // namespace testrng

#endif
