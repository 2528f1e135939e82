// k-selection (WarpSelect / BlockSelect through gpuivf_cuda_select_k) against
// a full sort: every k-bucket, rows long and short (one block per row, and
// rows split over several blocks plus the merge pass), sizes that are not
// multiples of 32, ties, smallest and largest, strides and user ids.
#include "cuda_test_util.h"

namespace {

// Reference: for each row the k best (value, column) pairs; ties by column.
void reference_select(const std::vector<float> &x, int64_t rows, int64_t cols, int64_t ld, int k, bool largest,
                      std::vector<float> *vals, std::vector<int64_t> *cols_out) {
    vals->assign(rows * k, largest ? -INFINITY : INFINITY);
    cols_out->assign(rows * k, -1);
    std::vector<int64_t> idx(cols);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) idx[c] = c;
        const float *row = &x[r * ld];
        auto better = [&](int64_t a, int64_t b) {
            const float va = largest ? -row[a] : row[a];
            const float vb = largest ? -row[b] : row[b];
            if (va < vb) return true;
            if (vb < va) return false;
            return a < b;
        };
        const int64_t take = std::min<int64_t>(k, cols);
        std::partial_sort(idx.begin(), idx.begin() + take, idx.end(), better);
        for (int64_t i = 0; i < take; i++) {
            (*vals)[r * k + i] = row[idx[i]];
            (*cols_out)[r * k + i] = idx[i];
        }
    }
}

void check_select(int64_t rows, int64_t cols, int k, bool largest, bool ties, uint32_t seed) {
    SCOPED_TRACE(::testing::Message() << "rows " << rows << " cols " << cols << " k " << k << " largest "
                                      << largest << " ties " << ties);
    std::vector<float> x = gt::random_vectors(rows, static_cast<int>(cols), seed, -100.0f, 100.0f);
    if (ties)
        for (float &v : x) v = std::floor(v / 40.0f); // about five distinct values
    std::vector<float> ref_vals;
    std::vector<int64_t> ref_cols;
    reference_select(x, rows, cols, cols, k, largest, &ref_vals, &ref_cols);

    std::vector<float> vals(rows * k);
    std::vector<uint64_t> ids(rows * k);
    gt::poison_nan(vals);
    gt::poison(ids);
    EXPECT_GPU_OK(gpuivf_cuda_select_k(gt::gpu(), x.data(), rows, cols, cols, nullptr, k, largest ? 1 : 0,
                                       vals.data(), ids.data()));
    int64_t bad = 0;
    for (int64_t i = 0; i < rows * k && bad < 5; i++) {
        const uint64_t want = ref_cols[i] < 0 ? UINT64_MAX : static_cast<uint64_t>(ref_cols[i]);
        if (ids[i] != want || !(vals[i] == ref_vals[i])) {
            ADD_FAILURE() << "row " << i / k << " rank " << i % k << ": got (" << vals[i] << ", " << ids[i]
                          << ") want (" << ref_vals[i] << ", " << want << ")";
            bad++;
        }
    }
}

TEST(SelectK, MatchesSortOverBucketsAndShapes) {
    REQUIRE_GPU();
    const int ks[] = {1, 10, 100, 1000};
    const int64_t shapes[][2] = {{7, 1}, {5, 31}, {3, 33}, {9, 1000}, {4, 4097}, {3, 100003}, {300, 2501}};
    uint32_t seed = 1;
    for (int k : ks)
        for (const auto &s : shapes)
            for (bool largest : {false, true}) check_select(s[0], s[1], k, largest, false, seed++);
}

TEST(SelectK, EveryBucket) {
    REQUIRE_GPU();
    uint32_t seed = 100;
    for (int k : {31, 32, 33, 64, 65, 200, 256, 257, 512, 513, 1024})
        for (int64_t rows : {int64_t(2), int64_t(700)}) check_select(rows, 5003, k, false, false, seed++);
}

TEST(SelectK, TiesGoToTheSmallerColumn) {
    REQUIRE_GPU();
    uint32_t seed = 200;
    for (int k : {1, 10, 100, 1000})
        for (bool largest : {false, true}) {
            check_select(6, 20011, k, largest, true, seed++);
            check_select(400, 1500, k, largest, true, seed++);
        }
}

TEST(SelectK, StrideIdsAndDeviceMemory) {
    REQUIRE_GPU();
    const int64_t rows = 37, cols = 3001, ld = 3010;
    const int k = 50;
    std::vector<float> x = gt::random_vectors(rows, static_cast<int>(ld), 5);
    std::vector<uint64_t> user_ids(rows * ld);
    for (size_t i = 0; i < user_ids.size(); i++) user_ids[i] = 1000000007ull * i + 11;
    std::vector<float> ref_vals;
    std::vector<int64_t> ref_cols;
    reference_select(x, rows, cols, ld, k, false, &ref_vals, &ref_cols);

    void *dx = nullptr, *di = nullptr, *dv = nullptr, *dids = nullptr;
    EXPECT_GPU_OK(gpuivf_cuda_malloc(gt::gpu(), sizeof(float) * x.size(), &dx));
    EXPECT_GPU_OK(gpuivf_cuda_malloc(gt::gpu(), sizeof(uint64_t) * user_ids.size(), &di));
    EXPECT_GPU_OK(gpuivf_cuda_malloc(gt::gpu(), sizeof(float) * rows * k, &dv));
    EXPECT_GPU_OK(gpuivf_cuda_malloc(gt::gpu(), sizeof(uint64_t) * rows * k, &dids));
    EXPECT_GPU_OK(gpuivf_cuda_memcpy(gt::gpu(), dx, x.data(), sizeof(float) * x.size()));
    EXPECT_GPU_OK(gpuivf_cuda_memcpy(gt::gpu(), di, user_ids.data(), sizeof(uint64_t) * user_ids.size()));
    EXPECT_GPU_OK(gpuivf_cuda_select_k(gt::gpu(), static_cast<float *>(dx), rows, cols, ld,
                                       static_cast<uint64_t *>(di), k, 0, static_cast<float *>(dv),
                                       static_cast<uint64_t *>(dids)));
    std::vector<float> vals(rows * k);
    std::vector<uint64_t> ids(rows * k);
    EXPECT_GPU_OK(gpuivf_cuda_memcpy(gt::gpu(), vals.data(), dv, sizeof(float) * vals.size()));
    EXPECT_GPU_OK(gpuivf_cuda_memcpy(gt::gpu(), ids.data(), dids, sizeof(uint64_t) * ids.size()));
    for (int64_t r = 0; r < rows; r++)
        for (int i = 0; i < k; i++) {
            ASSERT_EQ(vals[r * k + i], ref_vals[r * k + i]);
            ASSERT_EQ(ids[r * k + i], user_ids[r * ld + ref_cols[r * k + i]]);
        }
    for (void *p : {dx, di, dv, dids}) EXPECT_GPU_OK(gpuivf_cuda_free(gt::gpu(), p));
}

TEST(SelectK, NaNRanksLast) {
    REQUIRE_GPU();
    std::vector<float> x = {3.0f, NAN, -1.0f, 2.0f, NAN};
    std::vector<float> vals(5);
    std::vector<uint64_t> ids(5);
    EXPECT_GPU_OK(gpuivf_cuda_select_k(gt::gpu(), x.data(), 1, 5, 5, nullptr, 5, 0, vals.data(), ids.data()));
    EXPECT_EQ(ids[0], 2u);
    EXPECT_EQ(ids[1], 3u);
    EXPECT_EQ(ids[2], 0u);
    EXPECT_EQ(ids[3], 1u);
    EXPECT_EQ(ids[4], 4u);
    EXPECT_TRUE(std::isnan(vals[3]) && std::isnan(vals[4]));
    EXPECT_GPU_OK(gpuivf_cuda_select_k(gt::gpu(), x.data(), 1, 5, 5, nullptr, 3, 1, vals.data(), ids.data()));
    EXPECT_EQ(ids[0], 0u);
    EXPECT_EQ(ids[1], 3u);
    EXPECT_EQ(ids[2], 2u);
}

TEST(SelectK, InvalidArguments) {
    REQUIRE_GPU();
    std::vector<float> x(10, 1.0f), v(2000);
    std::vector<uint64_t> i(2000);
    gpuivf_cuda_status st = gpuivf_cuda_select_k(gt::gpu(), x.data(), 1, 10, 10, nullptr, 0, 0, v.data(), i.data());
    EXPECT_EQ(st.code, GPUIVF_CUDA_INVALID_ARGUMENT);
    EXPECT_STREQ(st.message, "k 0 is out of range 1..1024");
    st = gpuivf_cuda_select_k(gt::gpu(), x.data(), 1, 10, 10, nullptr, 1025, 0, v.data(), i.data());
    EXPECT_EQ(st.code, GPUIVF_CUDA_INVALID_ARGUMENT);
    st = gpuivf_cuda_select_k(gt::gpu(), x.data(), 1, 10, 5, nullptr, 3, 0, v.data(), i.data());
    EXPECT_EQ(st.code, GPUIVF_CUDA_INVALID_ARGUMENT);
    st = gpuivf_cuda_select_k(nullptr, x.data(), 1, 10, 10, nullptr, 3, 0, v.data(), i.data());
    EXPECT_EQ(st.code, GPUIVF_CUDA_INVALID_ARGUMENT);
}

} // namespace
