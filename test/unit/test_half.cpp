// Half precision (pgvector's halfvec element): conversions to and from
// float32 against the compiler's _Float16, exhaustively for every half.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gpuivf_core.h"
#include "test_util.h"

using namespace gpuivf;

namespace {

uint32_t bits_of(float f) {
    uint32_t b;
    std::memcpy(&b, &f, sizeof(b));
    return b;
}

float float_of(uint32_t b) {
    float f;
    std::memcpy(&f, &b, sizeof(f));
    return f;
}

uint16_t reference_half(float f) {
    _Float16 h = static_cast<_Float16>(f);
    uint16_t b;
    std::memcpy(&b, &h, sizeof(b));
    return b;
}

float reference_float(uint16_t b) {
    _Float16 h;
    std::memcpy(&h, &b, sizeof(h));
    return static_cast<float>(h);
}

}  // namespace

// Every half widens to the value the compiler's conversion gives, and
// narrows back to itself (NaNs: to a NaN).
TEST(Half, EveryHalfRoundTrips) {
    std::vector<uint16_t> all(65536);
    for (uint32_t i = 0; i < 65536; i++) all[i] = static_cast<uint16_t>(i);
    std::vector<float> wide(65536);
    half_to_float_n(all.data(), wide.data(), 65536);
    std::vector<uint16_t> back(65536);
    float_to_half_n(wide.data(), back.data(), 65536);
    for (uint32_t i = 0; i < 65536; i++) {
        const uint16_t h = static_cast<uint16_t>(i);
        const float f = half_to_float(h);
        const bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
        ASSERT_EQ(bits_of(f), bits_of(wide[i])) << "bulk and scalar widening differ at " << i;
        if (nan) {
            ASSERT_TRUE(std::isnan(f)) << i;
            ASSERT_TRUE(std::isnan(half_to_float(float_to_half(f)))) << i;
            continue;
        }
        ASSERT_EQ(bits_of(f), bits_of(reference_float(h))) << "half " << i;
        ASSERT_EQ(float_to_half(f), h) << "half " << i;
        ASSERT_EQ(back[i], h) << "bulk narrowing, half " << i;
    }
}

// Narrowing rounds to nearest, ties to even, like the compiler's
// conversion: floats around every half boundary, the subnormal range,
// overflow to infinity, and random values.
TEST(Half, NarrowingRoundsToNearestEven) {
    std::vector<float> xs = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f,
                             1e6f, -1e30f, 5.960464477539063e-08f /* 2^-24 */,
                             2.9802322387695312e-08f /* 2^-25: ties to 0 */,
                             4.470348358154297e-08f /* 1.5 * 2^-25 */, 6.103515625e-05f /* 2^-14 */,
                             6.1e-05f, 1e-10f, INFINITY, -INFINITY};
    for (uint32_t i = 0; i < 0x7c00; i += 7) {
        const uint32_t b = bits_of(reference_float(static_cast<uint16_t>(i)));
        for (int32_t delta = -4097; delta <= 4097; delta += 1024) xs.push_back(float_of(b + delta));
        xs.push_back(float_of(b + 0x1000));  // exactly halfway (for normal halves)
    }
    std::mt19937 rng(7);
    for (int i = 0; i < 200000; i++) xs.push_back(float_of(static_cast<uint32_t>(rng())));
    std::vector<uint16_t> bulk(xs.size());
    float_to_half_n(xs.data(), bulk.data(), static_cast<int64_t>(xs.size()));
    for (size_t i = 0; i < xs.size(); i++) {
        if (std::isnan(xs[i])) continue;
        ASSERT_EQ(float_to_half(xs[i]), reference_half(xs[i])) << "float " << xs[i] << " (bits "
                                                               << bits_of(xs[i]) << ")";
        ASSERT_EQ(bulk[i], reference_half(xs[i])) << "bulk, float " << xs[i];
    }
}

// The distance of half vectors is the float32 distance of the widened
// values: the same function, so index and engine agree by construction.
TEST(Half, DistanceOfWidenedValues) {
    const int d = 37;
    std::vector<uint16_t> a(d), b(d);
    for (int i = 0; i < d; i++) {
        a[i] = float_to_half(0.1f * static_cast<float>(i) - 1.3f);
        b[i] = float_to_half(0.7f - 0.05f * static_cast<float>(i * i % 11));
    }
    std::vector<float> fa(d), fb(d);
    half_to_float_n(a.data(), fa.data(), d);
    half_to_float_n(b.data(), fb.data(), d);
    double ref = 0;
    for (int i = 0; i < d; i++) ref += (double) (fa[i] - fb[i]) * (fa[i] - fb[i]);
    EXPECT_NEAR(l2_distance(fa.data(), fb.data(), d), std::sqrt(ref), 1e-5);
}
