// Product quantization: training, encoding, decoding, code packing.
#include <gtest/gtest.h>

#include <cstring>

#include "gpuivf_core.h"
#include "test_util.h"

using namespace gpuivf;

namespace {

// Mean squared reconstruction error of a PQ trained and applied on x.
double round_trip_error(const std::vector<float> &x, int64_t n, int d, int m, int nbits) {
    const int ksub = 1 << nbits;
    std::vector<float> cb(static_cast<size_t>(m) * ksub * (d / m));
    Status s = pq_train(x.data(), n, d, m, nbits, 42, cb.data(), nullptr);
    EXPECT_TRUE(ok(s)) << s.message;
    std::vector<uint8_t> codes(n * pq_code_size(m, nbits));
    pq_encode(cb.data(), d, m, nbits, x.data(), n, codes.data());
    std::vector<float> y(x.size());
    pq_decode(cb.data(), d, m, nbits, codes.data(), n, y.data());
    double err = 0.0;
    for (int64_t i = 0; i < n; i++) err += gpuivf_test::reference_score(Metric::L2, &x[i * d], &y[i * d], d);
    return err / n;
}

}  // namespace

TEST(Pq, ReconstructionErrorDecreasesWithM) {
    const int d = 32, n = 3000;
    auto x = gpuivf_test::random_vectors(n, d, 17);
    double energy = 0;
    for (float v : x) energy += static_cast<double>(v) * v;
    energy /= n;
    for (int nbits : {4, 8}) {
        double prev = energy;
        for (int m : {1, 2, 4, 8, 16}) {
            double err = round_trip_error(x, n, d, m, nbits);
            EXPECT_LT(err, prev) << "nbits=" << nbits << " m=" << m;
            prev = err;
        }
    }
}

TEST(Pq, EightBitsBeatFourBits) {
    const int d = 16, n = 4000;
    auto x = gpuivf_test::random_vectors(n, d, 23);
    EXPECT_LT(round_trip_error(x, n, d, 4, 8), round_trip_error(x, n, d, 4, 4));
}

// Encoding picks the nearest sub-centroid of each sub-space.
TEST(Pq, EncodeChoosesNearestSubCentroid) {
    const int d = 12, m = 3, dsub = 4;
    for (int nbits : {4, 8}) {
        const int ksub = 1 << nbits;
        auto cb = gpuivf_test::random_vectors(m * ksub, dsub, 5 + nbits);
        auto x = gpuivf_test::random_vectors(200, d, 6);
        std::vector<uint8_t> codes(200 * pq_code_size(m, nbits));
        pq_encode(cb.data(), d, m, nbits, x.data(), 200, codes.data());
        for (int i = 0; i < 200; i++) {
            for (int j = 0; j < m; j++) {
                int best = 0;
                double bd = 1e30;
                for (int c = 0; c < ksub; c++) {
                    double s = gpuivf_test::reference_score(Metric::L2, &x[i * d + j * dsub],
                                                            &cb[(j * ksub + c) * dsub], dsub);
                    if (s < bd) {
                        bd = s;
                        best = c;
                    }
                }
                const uint8_t *code = &codes[i * pq_code_size(m, nbits)];
                int got = nbits == 8 ? code[j] : ((j & 1) ? code[j / 2] >> 4 : code[j / 2] & 15);
                EXPECT_EQ(got, best) << "nbits=" << nbits << " i=" << i << " j=" << j;
            }
        }
    }
}

// 4-bit packing: sub-quantizer j in byte j/2, low nibble for even j, high for
// odd j; an odd m leaves the last high nibble zero.
TEST(Pq, FourBitPackingLayout) {
    const int m = 5, d = 5, ksub = 16;
    // Sub-centroid c of every sub-space is the value c: a residual of value v
    // encodes as code v.
    std::vector<float> cb(m * ksub);
    for (int j = 0; j < m; j++)
        for (int c = 0; c < ksub; c++) cb[j * ksub + c] = static_cast<float>(c);
    const float x[5] = {1, 2, 15, 0, 7};
    uint8_t code[3] = {0xff, 0xff, 0xff};
    ASSERT_EQ(pq_code_size(m, 4), 3);
    pq_encode(cb.data(), d, m, 4, x, 1, code);
    EXPECT_EQ(code[0], 0x21);
    EXPECT_EQ(code[1], 0x0f);
    EXPECT_EQ(code[2], 0x07);
    float y[5];
    pq_decode(cb.data(), d, m, 4, code, 1, y);
    for (int t = 0; t < d; t++) EXPECT_EQ(y[t], x[t]);
}

TEST(Pq, EightBitCodesAreOneBytePerSubQuantizer) {
    const int m = 3, d = 3, ksub = 256;
    std::vector<float> cb(m * ksub);
    for (int j = 0; j < m; j++)
        for (int c = 0; c < ksub; c++) cb[j * ksub + c] = static_cast<float>(c);
    const float x[3] = {200, 3, 255};
    uint8_t code[3];
    pq_encode(cb.data(), d, m, 8, x, 1, code);
    EXPECT_EQ(code[0], 200);
    EXPECT_EQ(code[1], 3);
    EXPECT_EQ(code[2], 255);
}

// Long sub-vectors take the row-by-row encoder (no stack transpose).
TEST(Pq, LongSubVectorsRoundTrip) {
    const int d = 128, m = 1, n = 600;
    auto x = gpuivf_test::random_vectors(n, d, 31);
    std::vector<float> cb(256 * d);
    ASSERT_TRUE(ok(pq_train(x.data(), n, d, m, 8, 1, cb.data(), nullptr)));
    std::vector<uint8_t> codes(n);
    pq_encode(cb.data(), d, m, 8, x.data(), n, codes.data());
    // Fewer points (600) than 2.5 x ksub: each code's centroid is its nearest.
    for (int i = 0; i < n; i += 37) {
        double own = gpuivf_test::reference_score(Metric::L2, &x[i * d], &cb[codes[i] * d], d);
        for (int c = 0; c < 256; c++)
            ASSERT_LE(own, gpuivf_test::reference_score(Metric::L2, &x[i * d], &cb[c * d], d) + 1e-4);
    }
}

// Sub-quantizers claimed by two "processes" in turn (their own calls of
// pq_train_claimed, one shared claim counter) give pq_train's codebook.
TEST(Pq, ClaimedSubQuantizersMatchPqTrain) {
    const int n = 40000, d = 32, m = 8, nbits = 8;
    auto x = gpuivf_test::random_vectors(n, d, 6);
    const size_t floats = static_cast<size_t>(m) * 256 * (d / m);
    std::vector<float> a(floats), b(floats, -1.0f);
    ASSERT_TRUE(ok(pq_train(x.data(), n, d, m, nbits, 9, a.data(), nullptr)));
    struct Claims {
        int64_t next = 0;
        int given = 0;
        int limit = 0;
    } c;
    WorkClaim claim{[](void *arg) -> int64_t {
                        Claims *c = static_cast<Claims *>(arg);
                        if (c->given == c->limit) return -1;   /* this caller stops */
                        c->given++;
                        return c->next++;
                    },
                    &c};
    c.limit = 3;  /* the first caller takes 3, the second the rest */
    ASSERT_TRUE(ok(pq_train_claimed(x.data(), n, d, m, nbits, 9, b.data(), &claim, nullptr)));
    c.given = 0;
    c.limit = m;
    ASSERT_TRUE(ok(pq_train_claimed(x.data(), n, d, m, nbits, 9, b.data(), &claim, nullptr)));
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), floats * sizeof(float)));
}

TEST(Pq, RejectsBadShape) {
    float x[8] = {}, cb[8];
    EXPECT_EQ(pq_train(x, 1, 8, 3, 8, 0, cb, nullptr).code, kInvalidArgument);  // 3 does not divide 8
    EXPECT_EQ(pq_train(x, 1, 8, 2, 6, 0, cb, nullptr).code, kInvalidArgument);  // 6 bits
    EXPECT_EQ(pq_train(x, 0, 8, 2, 8, 0, cb, nullptr).code, kInvalidArgument);  // no data
}
