// Real data: SIFT10K (siftsmall) with its official ground truth, when
// ../shared/data is present (or $GPUIVF_DATA_DIR points at it).
#include <gtest/gtest.h>

#include <set>

#include "gpuivf_core.h"
#include "test_util.h"

using namespace gpuivf;

#define LOAD_SIFT_OR_SKIP(s)                                                   \
    gpuivf_test::SiftSmall s;                                                  \
    if (!gpuivf_test::load_siftsmall(&s)) GTEST_SKIP() << "skipped: ../shared/data/siftsmall not found"

TEST(SiftSmall, ExactKnnReproducesOfficialGroundTruth) {
    LOAD_SIFT_OR_SKIP(s);
    const int k = 10;
    std::vector<float> vals(s.nq * k);
    std::vector<uint64_t> ids(s.nq * k);
    ASSERT_TRUE(ok(exact_knn(Metric::L2, s.base.data(), s.n, s.queries.data(), s.nq, s.d, k,
                             vals.data(), ids.data(), nullptr)));
    int exact_queries = 0;
    for (int64_t q = 0; q < s.nq; q++) {
        bool same = true;
        for (int i = 0; i < k; i++) same &= ids[q * k + i] == static_cast<uint64_t>(s.truth[q * s.truth_k + i]);
        exact_queries += same;
    }
    EXPECT_EQ(exact_queries, s.nq);
}

// IVF-PQ as the index uses it: 100 lists, m = 32, probe 10 lists, keep 100
// ADC candidates, re-rank them exactly.
TEST(SiftSmall, IvfPqWithRerankReachesRecallFloor) {
    LOAD_SIFT_OR_SKIP(s);
    const int nlist = 100, m = 32, nprobe = 10, candidates = 100, k = 10;
    gpuivf_test::TrainedIvfPq t;
    gpuivf_test::train_ivfpq(Metric::L2, s.base.data(), s.n, s.d, nlist, m, 8, &t);

    // Inverted lists: member rows and their codes, list by list.
    const int code_size = pq_code_size(m, 8);
    std::vector<std::vector<uint64_t>> ids(nlist);
    std::vector<std::vector<uint8_t>> codes(nlist);
    for (int64_t i = 0; i < s.n; i++) {
        ids[t.lists[i]].push_back(i);
        codes[t.lists[i]].insert(codes[t.lists[i]].end(), &t.codes[i * code_size], &t.codes[(i + 1) * code_size]);
    }

    int64_t hits = 0;
    std::vector<float> lut(ivfpq_lut_size(t.model));
    for (int64_t q = 0; q < s.nq; q++) {
        const float *query = &s.queries[q * s.d];
        int32_t probe[nprobe];
        float probe_scores[nprobe];
        ivfpq_probe_lists(t.model, query, nprobe, probe, probe_scores);
        std::vector<float> cv(candidates);
        std::vector<uint64_t> ci(candidates);
        TopK top;
        topk_init(&top, cv.data(), ci.data(), candidates);
        for (int p = 0; p < nprobe; p++) {
            float bias;
            ivfpq_build_lut(t.model, query, probe[p], lut.data(), &bias);
            ivfpq_adc_scan(t.model, lut.data(), bias, codes[probe[p]].data(), ids[probe[p]].data(),
                           ids[probe[p]].size(), &top);
        }
        for (int i = 0; i < top.size; i++) cv[i] = l2_squared(query, &s.base[ci[i] * s.d], s.d);
        sort_pairs(cv.data(), ci.data(), top.size);
        std::set<int64_t> truth(&s.truth[q * s.truth_k], &s.truth[q * s.truth_k + k]);
        for (int i = 0; i < k && i < top.size; i++) hits += truth.count(static_cast<int64_t>(ci[i]));
    }
    const double recall = static_cast<double>(hits) / (s.nq * k);
    RecordProperty("recall_at_10", std::to_string(recall));
    std::printf("siftsmall IVF-PQ lists=%d m=%d nprobe=%d rerank=%d: recall@10 = %.3f\n", nlist, m, nprobe,
                candidates, recall);
    EXPECT_GE(recall, 0.9);
}
