// Exact distances: the values the SQL functions return.
#include <gtest/gtest.h>

#include <cmath>

#include "gpuivf_core.h"
#include "test_util.h"

using namespace gpuivf;

TEST(Distance, KnownValues) {
    const float a[3] = {1, 2, 3};
    const float b[3] = {4, 6, 3};
    EXPECT_EQ(l2_squared(a, b, 3), 25.0f);
    EXPECT_DOUBLE_EQ(l2_distance(a, b, 3), 5.0);
    EXPECT_EQ(inner_product(a, b, 3), 25.0f);
    EXPECT_DOUBLE_EQ(negative_inner_product(a, b, 3), -25.0);
    EXPECT_NEAR(cosine_distance(a, b, 3), 1.0 - 25.0 / (std::sqrt(14.0) * std::sqrt(61.0)), 1e-7);
}

TEST(Distance, MetricDistanceDispatches) {
    const float a[2] = {3, 0};
    const float b[2] = {0, 4};
    EXPECT_DOUBLE_EQ(metric_distance(Metric::L2, a, b, 2), 5.0);
    EXPECT_DOUBLE_EQ(metric_distance(Metric::InnerProduct, a, b, 2), 0.0);
    EXPECT_DOUBLE_EQ(metric_distance(Metric::Cosine, a, b, 2), 1.0);
    EXPECT_DOUBLE_EQ(metric_distance(Metric::Cosine, a, a, 2), 0.0);
    const float c[2] = {-6, 0};
    EXPECT_DOUBLE_EQ(metric_distance(Metric::Cosine, a, c, 2), 2.0);
}

TEST(Distance, CosineOfZeroVectorIsNaN) {
    const float zero[4] = {0, 0, 0, 0};
    const float one[4] = {1, 0, 0, 0};
    EXPECT_TRUE(std::isnan(cosine_distance(zero, one, 4)));
    EXPECT_TRUE(std::isnan(cosine_distance(one, zero, 4)));
    EXPECT_TRUE(std::isnan(metric_distance(Metric::Cosine, zero, zero, 4)));
}

// Every dimension from 1 to 70 exercises the lane loop and the tail.
TEST(Distance, MatchesDoubleReferenceForAllTailLengths) {
    for (int d = 1; d <= 70; d++) {
        auto x = gpuivf_test::random_vectors(2, d, 100 + d);
        const float *a = x.data(), *b = x.data() + d;
        double l2 = gpuivf_test::reference_score(Metric::L2, a, b, d);
        double ip = -gpuivf_test::reference_score(Metric::InnerProduct, a, b, d);
        EXPECT_NEAR(l2_squared(a, b, d), l2, 1e-5 * (1 + l2)) << "d=" << d;
        EXPECT_NEAR(inner_product(a, b, d), ip, 1e-5 * (1 + std::fabs(ip))) << "d=" << d;
        EXPECT_EQ(l2_distance(a, b, d), std::sqrt(static_cast<double>(l2_squared(a, b, d))));
    }
}

TEST(Distance, SymmetricBitForBit) {
    auto x = gpuivf_test::random_vectors(2, 131, 7);
    EXPECT_EQ(l2_squared(x.data(), x.data() + 131, 131), l2_squared(x.data() + 131, x.data(), 131));
    EXPECT_EQ(inner_product(x.data(), x.data() + 131, 131), inner_product(x.data() + 131, x.data(), 131));
}

TEST(PrepareVector, NormalizesOnlyForCosine) {
    const float in[2] = {3, 4};
    float out[2];
    EXPECT_TRUE(prepare_vector(Metric::L2, in, out, 2));
    EXPECT_EQ(out[0], 3.0f);
    EXPECT_TRUE(prepare_vector(Metric::InnerProduct, in, out, 2));
    EXPECT_EQ(out[1], 4.0f);
    EXPECT_TRUE(prepare_vector(Metric::Cosine, in, out, 2));
    EXPECT_FLOAT_EQ(out[0], 0.6f);
    EXPECT_FLOAT_EQ(out[1], 0.8f);
}

TEST(PrepareVector, ZeroVectorIsCopiedAndReported) {
    const float in[3] = {0, 0, 0};
    float out[3] = {9, 9, 9};
    EXPECT_FALSE(prepare_vector(Metric::Cosine, in, out, 3));
    EXPECT_EQ(out[0], 0.0f);
    EXPECT_EQ(out[2], 0.0f);
}

TEST(PrepareVector, InPlace) {
    float v[2] = {0, -5};
    EXPECT_TRUE(prepare_vector(Metric::Cosine, v, v, 2));
    EXPECT_EQ(v[1], -1.0f);
}

TEST(RowNorms, SquaredNorms) {
    const float x[4] = {3, 4, 1, 1};
    float n[2];
    row_norms(x, 2, 2, n);
    EXPECT_EQ(n[0], 25.0f);
    EXPECT_EQ(n[1], 2.0f);
}

TEST(Status, FormatsMessage) {
    Status s = status_error(kInvalidArgument, "bad value %d", 42);
    EXPECT_EQ(s.code, kInvalidArgument);
    EXPECT_STREQ(s.message, "bad value 42");
    EXPECT_FALSE(ok(s));
    EXPECT_TRUE(ok(status_ok()));
}
