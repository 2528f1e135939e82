// src/core/random.h, the generators and the row sampling that the CPU
// engine, the GPU engine's k-means and the test tools share: pinned
// outputs (a change would silently change every trained model and every
// generated data set), and the sample's properties.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "random.h"

TEST(Random, Xoshiro256IsPinned) {
    gpuivf::Xoshiro256 r(1234);
    EXPECT_EQ(r.next(), 840842556444225107ull);
    EXPECT_EQ(r.next(), 15548185570577040190ull);
    EXPECT_EQ(r.next(), 12744864379734484625ull);
    EXPECT_EQ(r.below(1000003), 281175u);
    EXPECT_EQ(r.uniform(), 0.10114519104249819);
}

TEST(Random, SplitMix64IsPinned) {
    gpuivf::SplitMix64 r(1234);
    EXPECT_EQ(r.next(), 13478418381427711195ull);
    EXPECT_EQ(r.next(), 10936887474700444964ull);
}

TEST(Random, SampleRowsIsPinned) {
    gpuivf::Xoshiro256 r(99);
    EXPECT_EQ(gpuivf::sample_rows(1000, 10, r), (std::vector<int64_t>{37, 125, 230, 251, 297, 302, 462, 561, 756, 878}));
}

TEST(Random, SampleRowsAreSortedDistinctAndComplete) {
    gpuivf::SplitMix64 r(7);
    for (int64_t n : {1, 2, 17, 1000, 100000})
        for (int64_t count : {int64_t(0), int64_t(1), n / 3, n - 1, n, n + 5}) {
            const std::vector<int64_t> rows = gpuivf::sample_rows(n, count, r);
            EXPECT_EQ(static_cast<int64_t>(rows.size()), std::max<int64_t>(0, std::min(n, count))) << n << " " << count;
            EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end()));
            EXPECT_EQ(std::adjacent_find(rows.begin(), rows.end()), rows.end());
            for (int64_t v : rows) EXPECT_TRUE(v >= 0 && v < n);
        }
}

TEST(Random, BelowStaysInRange) {
    gpuivf::Xoshiro256 r(5);
    for (uint64_t bound : {1ull, 2ull, 3ull, 1000003ull, (1ull << 63) + 1})
        for (int i = 0; i < 1000; i++) EXPECT_LT(r.below(bound), bound);
    for (int i = 0; i < 1000; i++) {
        const double u = r.uniform();
        EXPECT_TRUE(u >= 0.0 && u < 1.0);
    }
}
