/*
 * rng.h — the test tools' random numbers, so that a seed gives the same data
 * on every machine and compiler (std::normal_distribution is
 * implementation-defined): src/core/random.h's xoshiro256**, one stream per
 * purpose drawn from one user seed, and normals by the Box–Muller method.
 * Included by path, not through an include directory, so that a tool still
 * builds with a bare `g++ -std=c++17 test/tools/gpuivf_gen.cpp`.
 */
#ifndef GPUIVF_TEST_RNG_H
#define GPUIVF_TEST_RNG_H

#include <cmath>
#include <cstdint>

#include "../../src/core/random.h"

namespace testrng {

class Rng : public gpuivf::Xoshiro256 {
  public:
    /* stream separates independent sequences drawn from one user seed. */
    Rng(uint64_t seed, uint64_t stream) : Xoshiro256(seed ^ (stream * 0xD1B54A32D192ED03ull)) {}

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
    bool have_spare_ = false;
    double spare_ = 0.0;
};

}  // namespace testrng

#endif
