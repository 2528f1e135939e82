// The IVF-PQ model: encoding, probing, look-up tables and the ADC scan.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "gpuivf_core.h"
#include "test_util.h"

using namespace gpuivf;

namespace {

struct Case {
    Metric metric;
    int nbits;
};
void PrintTo(const Case &c, std::ostream *os) { *os << metric_name(c.metric) << " " << c.nbits << " bits"; }

class IvfPqTest : public ::testing::TestWithParam<Case> {
protected:
    static constexpr int d = 24, n = 3000, nlist = 16, m = 6;
    void SetUp() override {
        x = gpuivf_test::random_vectors(n, d, 77);
        // A slight offset keeps inner products away from zero on average.
        for (float &v : x) v += 0.2f;
        gpuivf_test::train_ivfpq(GetParam().metric, x.data(), n, d, nlist, m, GetParam().nbits, &t);
        code_size = pq_code_size(m, GetParam().nbits);
    }
    // The vector an entry's code stands for: its centroid plus the decoded residual.
    std::vector<float> decoded(int64_t i) {
        std::vector<float> v(d);
        pq_decode(t.codebook.data(), d, m, GetParam().nbits, &t.codes[i * code_size], 1, v.data());
        for (int c = 0; c < d; c++) v[c] += t.centroids[t.lists[i] * d + c];
        return v;
    }
    std::vector<float> x;
    gpuivf_test::TrainedIvfPq t;
    int code_size = 0;
};

}  // namespace

TEST_P(IvfPqTest, EncodeAssignsNearestListAndNearestCodes) {
    std::vector<int32_t> labels(n);
    ASSERT_TRUE(ok(assign_nearest(t.centroids.data(), nullptr, nlist, d, t.prepared.data(), n, labels.data(), nullptr, nullptr)));
    EXPECT_EQ(labels, t.lists);
    std::vector<float> residuals(t.prepared);
    for (int64_t i = 0; i < n; i++)
        for (int c = 0; c < d; c++) residuals[i * d + c] -= t.centroids[t.lists[i] * d + c];
    std::vector<uint8_t> codes(t.codes.size());
    pq_encode(t.codebook.data(), d, m, GetParam().nbits, residuals.data(), n, codes.data());
    EXPECT_EQ(codes, t.codes);
}

// ADC score = exact internal score between the query and the decoded vector.
TEST_P(IvfPqTest, AdcScoreEqualsExactScoreToDecodedVector) {
    auto queries = gpuivf_test::random_vectors(5, d, 99);
    std::vector<float> lut(ivfpq_lut_size(t.model));
    ASSERT_EQ(static_cast<int>(lut.size()), m << GetParam().nbits);
    for (int qi = 0; qi < 5; qi++) {
        std::vector<float> q(d);
        prepare_vector(GetParam().metric, &queries[qi * d], q.data(), d);
        for (int list = 0; list < nlist; list++) {
            float bias;
            ivfpq_build_lut(t.model, q.data(), list, lut.data(), &bias);
            std::vector<int64_t> members;
            for (int64_t i = 0; i < n; i++)
                if (t.lists[i] == list) members.push_back(i);
            std::vector<uint8_t> codes(members.size() * code_size);
            for (size_t r = 0; r < members.size(); r++)
                std::memcpy(&codes[r * code_size], &t.codes[members[r] * code_size], code_size);
            std::vector<float> scores(members.size());
            ivfpq_adc_scores(t.model, lut.data(), bias, codes.data(), members.size(), scores.data());
            for (size_t r = 0; r < members.size(); r++) {
                auto v = decoded(members[r]);
                double exact = gpuivf_test::reference_score(GetParam().metric, q.data(), v.data(), d);
                ASSERT_NEAR(scores[r], exact, 1e-4 * std::max(1.0, std::fabs(exact)))
                    << "query " << qi << " list " << list << " entry " << members[r];
            }
        }
    }
}

// The scan keeps exactly the k best (score, id) pairs of ivfpq_adc_scores.
TEST_P(IvfPqTest, AdcScanKeepsTheBestScores) {
    std::vector<float> q(d);
    prepare_vector(GetParam().metric, &x[5 * d], q.data(), d);
    std::vector<float> lut(ivfpq_lut_size(t.model)), scores(n);
    float bias;
    ivfpq_build_lut(t.model, q.data(), 3, lut.data(), &bias);
    ivfpq_adc_scores(t.model, lut.data(), bias, t.codes.data(), n, scores.data());
    std::vector<uint64_t> ids(n);
    for (int i = 0; i < n; i++) ids[i] = 5000 - i;  // descending ids: ties must not follow arrival
    auto expect = gpuivf_test::sorted_pairs(scores, ids);
    for (int k : {1, 10, 100}) {
        std::vector<float> hv(k);
        std::vector<uint64_t> hi(k);
        TopK top;
        topk_init(&top, hv.data(), hi.data(), k);
        // Scanned in two calls, as a list spread over two pages would be.
        ivfpq_adc_scan(t.model, lut.data(), bias, t.codes.data(), ids.data(), 1001, &top);
        ivfpq_adc_scan(t.model, lut.data(), bias, &t.codes[1001 * code_size], &ids[1001], n - 1001, &top);
        topk_sort(&top);
        ASSERT_EQ(top.size, k);
        for (int i = 0; i < k; i++) {
            EXPECT_EQ(hv[i], expect[i].first);
            EXPECT_EQ(hi[i], expect[i].second);
        }
    }
}

TEST_P(IvfPqTest, ProbeListsMatchBruteForce) {
    auto queries = gpuivf_test::random_vectors(20, d, 5);
    for (int qi = 0; qi < 20; qi++) {
        std::vector<float> q(d);
        prepare_vector(GetParam().metric, &queries[qi * d], q.data(), d);
        std::vector<float> all(nlist);
        std::vector<uint64_t> ids(nlist);
        for (int c = 0; c < nlist; c++) {
            Metric probe = GetParam().metric == Metric::InnerProduct ? Metric::InnerProduct : Metric::L2;
            all[c] = static_cast<float>(gpuivf_test::reference_score(probe, q.data(), &t.centroids[c * d], d));
            ids[c] = c;
        }
        auto expect = gpuivf_test::sorted_pairs(all, ids);
        const int nprobe = 5;
        int32_t lists[nprobe];
        float scores[nprobe];
        ivfpq_probe_lists(t.model, q.data(), nprobe, lists, scores);
        for (int i = 0; i < nprobe; i++) {
            EXPECT_EQ(static_cast<uint64_t>(lists[i]), expect[i].second) << "query " << qi;
            EXPECT_NEAR(scores[i], expect[i].first, 1e-4 * std::max(1.0f, std::fabs(expect[i].first)));
        }
    }
}

INSTANTIATE_TEST_SUITE_P(MetricsAndBits, IvfPqTest,
                         ::testing::Values(Case{Metric::L2, 8}, Case{Metric::L2, 4},
                                           Case{Metric::InnerProduct, 8}, Case{Metric::InnerProduct, 4},
                                           Case{Metric::Cosine, 8}, Case{Metric::Cosine, 4}),
                         [](const ::testing::TestParamInfo<Case> &info) {
                             return std::string(metric_name(info.param.metric)) + "_" +
                                    std::to_string(info.param.nbits) + "bit";
                         });

TEST(IvfPqProbe, MoreProbesThanListsArePadded) {
    const float cents[4] = {0, 0, 10, 10};
    const float norms[2] = {0, 200};
    const float cb[2 * 256] = {};
    IvfPqModel model{Metric::L2, 2, 2, 2, 8, cents, norms, cb};
    const float q[2] = {9, 9};
    int32_t lists[4];
    float scores[4];
    ivfpq_probe_lists(model, q, 4, lists, scores);
    EXPECT_EQ(lists[0], 1);
    EXPECT_EQ(lists[1], 0);
    EXPECT_EQ(scores[0], 2.0f);
    EXPECT_EQ(scores[1], 162.0f);
    EXPECT_EQ(lists[2], -1);
    EXPECT_EQ(lists[3], -1);
    EXPECT_EQ(scores[3], std::numeric_limits<float>::infinity());
}

TEST(IvfPqScore, ToSqlDistance) {
    EXPECT_DOUBLE_EQ(ivfpq_score_to_distance(Metric::L2, 25.0f), 5.0);
    EXPECT_DOUBLE_EQ(ivfpq_score_to_distance(Metric::L2, -1e-7f), 0.0);
    EXPECT_DOUBLE_EQ(ivfpq_score_to_distance(Metric::InnerProduct, -3.5f), -3.5);
    // |a - b|^2 = 2 - 2 cos for unit vectors.
    EXPECT_DOUBLE_EQ(ivfpq_score_to_distance(Metric::Cosine, 1.0f), 0.5);
}

TEST(IvfPqEncode, RejectsBadModel) {
    IvfPqModel model{Metric::L2, 10, 1, 3, 8, nullptr, nullptr, nullptr};
    float x[10] = {};
    int32_t list;
    uint8_t code[3];
    EXPECT_EQ(ivfpq_encode(model, x, 1, &list, code, nullptr).code, kInvalidArgument);
}
