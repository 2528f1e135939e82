// Exact k nearest neighbours against a double-precision brute force.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "gpuivf_core.h"
#include "test_util.h"

using namespace gpuivf;

namespace {

// The ids of the k best rows by a double-precision score (ties by row).
std::vector<uint64_t> brute_force(Metric m, const std::vector<float> &base, int64_t n,
                                  const float *q, int d, int k, std::vector<double> *scores) {
    std::vector<float> pq(d), pb(d);
    prepare_vector(m, q, pq.data(), d);
    std::vector<std::pair<double, uint64_t>> all(n);
    for (int64_t i = 0; i < n; i++) {
        prepare_vector(m, &base[i * d], pb.data(), d);
        all[i] = {gpuivf_test::reference_score(m, pq.data(), pb.data(), d), static_cast<uint64_t>(i)};
    }
    std::sort(all.begin(), all.end());
    std::vector<uint64_t> ids;
    scores->clear();
    for (int i = 0; i < k && i < n; i++) {
        ids.push_back(all[i].second);
        scores->push_back(all[i].first);
    }
    return ids;
}

}  // namespace

class ExactKnn : public ::testing::TestWithParam<Metric> {};

TEST_P(ExactKnn, MatchesBruteForce) {
    const Metric m = GetParam();
    const int d = 33, n = 2500, nq = 40, k = 20;  // n spans several GEMM tiles
    auto base = gpuivf_test::random_vectors(n, d, 1);
    auto queries = gpuivf_test::random_vectors(nq, d, 2);
    std::vector<float> vals(nq * k);
    std::vector<uint64_t> ids(nq * k);
    ASSERT_TRUE(ok(exact_knn(m, base.data(), n, queries.data(), nq, d, k, vals.data(), ids.data(), nullptr)));
    for (int qi = 0; qi < nq; qi++) {
        std::vector<double> expect_scores;
        auto expect = brute_force(m, base, n, &queries[qi * d], d, k, &expect_scores);
        for (int i = 0; i < k; i++) {
            EXPECT_NEAR(vals[qi * k + i], expect_scores[i], 1e-4 * std::max(1.0, std::fabs(expect_scores[i])));
            // Random data has no near-ties at this precision: same rows.
            EXPECT_EQ(ids[qi * k + i], expect[i]) << "query " << qi << " rank " << i;
        }
        for (int i = 1; i < k; i++) EXPECT_LE(vals[qi * k + i - 1], vals[qi * k + i]);
    }
}

INSTANTIATE_TEST_SUITE_P(Metrics, ExactKnn, ::testing::Values(Metric::L2, Metric::InnerProduct, Metric::Cosine),
                         [](const ::testing::TestParamInfo<Metric> &info) {
                             return std::string(metric_name(info.param));
                         });

TEST(ExactKnnEdge, FewerRowsThanKArePadded) {
    const float base[6] = {0, 0, 1, 1, 5, 5};
    const float q[2] = {1, 1};
    float vals[5];
    uint64_t ids[5];
    ASSERT_TRUE(ok(exact_knn(Metric::L2, base, 3, q, 1, 2, 5, vals, ids, nullptr)));
    EXPECT_EQ(ids[0], 1u);
    EXPECT_EQ(vals[0], 0.0f);
    EXPECT_EQ(ids[1], 0u);
    EXPECT_EQ(vals[1], 2.0f);
    EXPECT_EQ(ids[2], 2u);
    EXPECT_EQ(vals[2], 32.0f);
    EXPECT_EQ(ids[3], UINT64_MAX);
    EXPECT_EQ(vals[4], std::numeric_limits<float>::infinity());
}

TEST(ExactKnnEdge, TiesBrokenByRow) {
    std::vector<float> base(100 * 4, 1.0f);  // all rows identical
    const float q[4] = {0, 0, 0, 0};
    float vals[10];
    uint64_t ids[10];
    ASSERT_TRUE(ok(exact_knn(Metric::L2, base.data(), 100, q, 1, 4, 10, vals, ids, nullptr)));
    for (int i = 0; i < 10; i++) EXPECT_EQ(ids[i], static_cast<uint64_t>(i));
}

TEST(ExactKnnEdge, RejectsBadK) {
    float v[2] = {0, 0}, out;
    uint64_t id;
    EXPECT_EQ(exact_knn(Metric::L2, v, 1, v, 1, 2, 0, &out, &id, nullptr).code, kInvalidArgument);
    EXPECT_EQ(exact_knn(Metric::L2, v, 1, v, 1, 2, kMaxK + 1, &out, &id, nullptr).code, kInvalidArgument);
}
