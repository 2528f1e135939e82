// k-selection (TopK, sort_pairs) against a full sort.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "gpuivf_core.h"
#include "test_util.h"

using namespace gpuivf;

namespace {

// n candidates with many tied scores (only 50 distinct values) and ids
// pushed in shuffled order, so ties must be broken by id, not arrival.
void candidates(int64_t n, uint32_t seed, std::vector<float> *vals, std::vector<uint64_t> *ids) {
    std::mt19937 gen(seed);
    vals->resize(n);
    ids->resize(n);
    for (int64_t i = 0; i < n; i++) {
        (*vals)[i] = static_cast<float>(gen() % 50) * 0.25f;
        (*ids)[i] = static_cast<uint64_t>(i) * 3 + 1000;
    }
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = gen() % (i + 1);
        std::swap((*vals)[i], (*vals)[j]);
        std::swap((*ids)[i], (*ids)[j]);
    }
}

}  // namespace

class TopKVsSort : public ::testing::TestWithParam<int> {};

TEST_P(TopKVsSort, SameAsFullSortWithTiesById) {
    const int k = GetParam();
    for (int64_t n : {int64_t{1}, int64_t{31}, int64_t{999}, int64_t{5003}}) {
        std::vector<float> vals;
        std::vector<uint64_t> ids;
        candidates(n, static_cast<uint32_t>(n * 7 + k), &vals, &ids);
        auto expect = gpuivf_test::sorted_pairs(vals, ids);

        std::vector<float> hv(k);
        std::vector<uint64_t> hi(k);
        TopK t;
        topk_init(&t, hv.data(), hi.data(), k);
        EXPECT_EQ(topk_threshold(&t), std::numeric_limits<float>::infinity());
        for (int64_t i = 0; i < n; i++) topk_push(&t, vals[i], ids[i]);
        const int64_t kept = std::min<int64_t>(k, n);
        ASSERT_EQ(t.size, kept);
        if (kept == k) {
            EXPECT_EQ(topk_threshold(&t), expect[k - 1].first);
        }
        topk_sort(&t);
        for (int64_t i = 0; i < kept; i++) {
            ASSERT_EQ(hv[i], expect[i].first) << "n=" << n << " k=" << k << " i=" << i;
            ASSERT_EQ(hi[i], expect[i].second) << "n=" << n << " k=" << k << " i=" << i;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(K, TopKVsSort, ::testing::Values(1, 10, 100, 1000));

TEST(TopK, NaNSortsLast) {
    float hv[3];
    uint64_t hi[3];
    TopK t;
    topk_init(&t, hv, hi, 3);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    topk_push(&t, nan, 1);
    topk_push(&t, 2.0f, 2);
    topk_push(&t, std::numeric_limits<float>::infinity(), 3);
    topk_push(&t, 1.0f, 4);  // displaces the NaN
    topk_sort(&t);
    EXPECT_EQ(hi[0], 4u);
    EXPECT_EQ(hi[1], 2u);
    EXPECT_EQ(hi[2], 3u);
}

TEST(TopK, ZeroCapacityKeepsNothing) {
    TopK t;
    topk_init(&t, nullptr, nullptr, 0);
    topk_push(&t, 1.0f, 1);
    EXPECT_EQ(t.size, 0);
}

TEST(SortPairs, SameAsStdSort) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{33}, int64_t{4097}}) {
        std::vector<float> vals;
        std::vector<uint64_t> ids;
        candidates(n, 99, &vals, &ids);
        auto expect = gpuivf_test::sorted_pairs(vals, ids);
        sort_pairs(vals.data(), ids.data(), n);
        for (int64_t i = 0; i < n; i++) {
            ASSERT_EQ(vals[i], expect[i].first);
            ASSERT_EQ(ids[i], expect[i].second);
        }
    }
}

TEST(SortPairs, NaNAfterInfinity) {
    float vals[4] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                     -1.0f, std::numeric_limits<float>::quiet_NaN()};
    uint64_t ids[4] = {9, 8, 7, 6};
    sort_pairs(vals, ids, 4);
    EXPECT_EQ(ids[0], 7u);
    EXPECT_EQ(ids[1], 8u);
    EXPECT_EQ(ids[2], 6u);
    EXPECT_EQ(ids[3], 9u);
}
