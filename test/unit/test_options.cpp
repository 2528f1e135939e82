// Automatic options and code sizes: the rules every layer relies on.
#include <gtest/gtest.h>

#include "gpuivf_core.h"

using namespace gpuivf;

TEST(AutoLists, ThousandRowsPerListUpToOneMillion) {
    EXPECT_EQ(auto_lists(0), 1);
    EXPECT_EQ(auto_lists(999), 1);
    EXPECT_EQ(auto_lists(1000), 1);
    EXPECT_EQ(auto_lists(100000), 100);
    EXPECT_EQ(auto_lists(1000000), 1000);
}

TEST(AutoLists, SquareRootAboveOneMillion) {
    EXPECT_EQ(auto_lists(4000000), 2000);
    EXPECT_EQ(auto_lists(1000001), 1000);
    EXPECT_EQ(auto_lists(int64_t{1} << 40), kMaxLists);
}

TEST(PqAutoM, LargestDivisorNotAboveQuarterOfDims) {
    EXPECT_EQ(pq_auto_m(128), 32);
    EXPECT_EQ(pq_auto_m(768), 96);
    EXPECT_EQ(pq_auto_m(1536), 96);
    EXPECT_EQ(pq_auto_m(784), 56);
    EXPECT_EQ(pq_auto_m(3), 1);
    EXPECT_EQ(pq_auto_m(1), 1);
    EXPECT_EQ(pq_auto_m(100), 25);
    EXPECT_EQ(pq_auto_m(97), 1);
}

TEST(PqCodeSize, BytesPerCode) {
    EXPECT_EQ(pq_code_size(32, 8), 32);
    EXPECT_EQ(pq_code_size(32, 4), 16);
    EXPECT_EQ(pq_code_size(5, 4), 3);
}
