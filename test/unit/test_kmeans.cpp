// k-means training and nearest-centroid assignment.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "gpuivf_core.h"
#include "test_util.h"

using namespace gpuivf;

namespace {

// Index of the centroid nearest to v (double precision reference).
int nearest(const std::vector<float> &cents, int k, int d, const float *v, double *dist) {
    int best = -1;
    double bd = std::numeric_limits<double>::infinity();
    for (int c = 0; c < k; c++) {
        double s = gpuivf_test::reference_score(Metric::L2, v, &cents[c * d], d);
        if (s < bd) {
            bd = s;
            best = c;
        }
    }
    if (dist) *dist = bd;
    return best;
}

bool all_finite(const std::vector<float> &v) {
    for (float f : v)
        if (!std::isfinite(f)) return false;
    return true;
}

// Smallest squared distance between two different centroids.
double min_pairwise(const std::vector<float> &cents, int k, int d) {
    double m = std::numeric_limits<double>::infinity();
    for (int a = 0; a < k; a++)
        for (int b = a + 1; b < k; b++)
            m = std::min(m, gpuivf_test::reference_score(Metric::L2, &cents[a * d], &cents[b * d], d));
    return m;
}

}  // namespace

TEST(KMeans, RecoversWellSeparatedCentroids) {
    const int k = 20, d = 16;
    auto data = gpuivf_test::clustered(4000, d, k, 10.0f, 0.5f, 1);
    std::vector<float> cents(k * d);
    ASSERT_TRUE(ok(kmeans_train(data.points.data(), 4000, d, k, kmeans_default_params(), cents.data(), nullptr)));
    // Every true centre has its own trained centroid within the spread.
    std::vector<int> used(k, 0);
    for (int c = 0; c < k; c++) {
        double dist;
        int match = nearest(cents, k, d, &data.centres[c * d], &dist);
        EXPECT_LT(dist, 0.05 * d) << "centre " << c;
        used[match]++;
    }
    for (int c = 0; c < k; c++) EXPECT_EQ(used[c], 1) << "trained centroid " << c;
}

TEST(KMeans, DeterministicForASeed) {
    auto x = gpuivf_test::random_vectors(3000, 24, 5);
    KMeansParams p = kmeans_default_params();
    std::vector<float> a(50 * 24), b(50 * 24), c(50 * 24);
    ASSERT_TRUE(ok(kmeans_train(x.data(), 3000, 24, 50, p, a.data(), nullptr)));
    ASSERT_TRUE(ok(kmeans_train(x.data(), 3000, 24, 50, p, b.data(), nullptr)));
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
    p.seed += 1;
    ASSERT_TRUE(ok(kmeans_train(x.data(), 3000, 24, 50, p, c.data(), nullptr)));
    EXPECT_NE(0, std::memcmp(a.data(), c.data(), a.size() * sizeof(float)));
}

// Only 5 distinct points for 12 clusters: most clusters start or become
// empty and must be re-seeded by splitting, never left as NaN or duplicates.
TEST(KMeans, EmptyClustersAreSplit) {
    const int d = 6, k = 12, distinct = 5, n = 1000;
    auto base = gpuivf_test::random_vectors(distinct, d, 3);
    std::vector<float> x(n * d);
    for (int i = 0; i < n; i++) std::memcpy(&x[i * d], &base[(i % distinct) * d], d * sizeof(float));
    std::vector<float> cents(k * d);
    ASSERT_TRUE(ok(kmeans_train(x.data(), n, d, k, kmeans_default_params(), cents.data(), nullptr)));
    EXPECT_TRUE(all_finite(cents));
    EXPECT_GT(min_pairwise(cents, k, d), 0.0);
    for (int p = 0; p < distinct; p++) {
        double dist;
        nearest(cents, k, d, &base[p * d], &dist);
        EXPECT_LT(dist, 1e-3) << "point " << p;
    }
}

// A cluster far away that k-means++ is unlikely to leave empty, plus a
// heavily populated blob: more clusters than the blob needs.
TEST(KMeans, EveryClusterGetsPointsOnSkewedData) {
    const int d = 8, k = 64, n = 6400;
    auto x = gpuivf_test::random_vectors(n, d, 11);
    for (int i = 0; i < n / 2; i++)
        for (int t = 0; t < d; t++) x[i * d + t] *= 1e-3f;  // half the points in a tiny blob
    std::vector<float> cents(k * d);
    ASSERT_TRUE(ok(kmeans_train(x.data(), n, d, k, kmeans_default_params(), cents.data(), nullptr)));
    EXPECT_TRUE(all_finite(cents));
    std::vector<int32_t> labels(n);
    ASSERT_TRUE(ok(assign_nearest(cents.data(), nullptr, k, d, x.data(), n, labels.data(), nullptr, nullptr)));
    std::vector<int> counts(k, 0);
    for (int32_t l : labels) counts[l]++;
    for (int c = 0; c < k; c++) EXPECT_GT(counts[c], 0) << "cluster " << c;
}

TEST(KMeans, FewerPointsThanClusters) {
    const int d = 4, k = 10, n = 3;
    auto x = gpuivf_test::random_vectors(n, d, 4);
    std::vector<float> cents(k * d);
    ASSERT_TRUE(ok(kmeans_train(x.data(), n, d, k, kmeans_default_params(), cents.data(), nullptr)));
    EXPECT_TRUE(all_finite(cents));
    EXPECT_EQ(0, std::memcmp(cents.data(), x.data(), n * d * sizeof(float)));
    EXPECT_GT(min_pairwise(cents, k, d), 0.0);
    for (int c = n; c < k; c++) {
        double dist =
            gpuivf_test::reference_score(Metric::L2, &cents[c * d], &x[(c % n) * d], d);
        EXPECT_LT(dist, 1e-4) << "surplus centroid " << c << " should repeat a point";
    }
}

TEST(KMeans, SubsamplesLargeInput) {
    // 200 points per centroid allowed: 30000 points are cut to 2000.
    const int d = 8, k = 10;
    auto data = gpuivf_test::clustered(30000, d, k, 10.0f, 0.5f, 8);
    KMeansParams p = kmeans_default_params();
    p.max_points_per_centroid = 200;
    std::vector<float> cents(k * d);
    ASSERT_TRUE(ok(kmeans_train(data.points.data(), 30000, d, k, p, cents.data(), nullptr)));
    for (int c = 0; c < k; c++) {
        double dist;
        nearest(cents, k, d, &data.centres[c * d], &dist);
        EXPECT_LT(dist, 0.05 * d);
    }
}

TEST(KMeans, RejectsBadArguments) {
    float x[4] = {0, 0, 0, 0}, c[4];
    KMeansParams p = kmeans_default_params();
    EXPECT_EQ(kmeans_train(x, 0, 2, 1, p, c, nullptr).code, kInvalidArgument);
    EXPECT_EQ(kmeans_train(x, 2, 0, 1, p, c, nullptr).code, kInvalidArgument);
    EXPECT_EQ(kmeans_train(x, 2, 2, 0, p, c, nullptr).code, kInvalidArgument);
    EXPECT_EQ(kmeans_train(nullptr, 2, 2, 1, p, c, nullptr).code, kInvalidArgument);
}

TEST(KMeans, CancelHookStopsTraining) {
    auto x = gpuivf_test::random_vectors(2000, 16, 9);
    std::vector<float> cents(40 * 16);
    int calls = 0;
    CancelHook hook{[](void *arg) { return ++*static_cast<int *>(arg) > 2; }, &calls};
    Status s = kmeans_train(x.data(), 2000, 16, 40, kmeans_default_params(), cents.data(), &hook);
    EXPECT_EQ(s.code, kCanceled);
    EXPECT_GT(calls, 2);
}

// The stepped run, its rows labelled in parts that start at multiples of
// kAssignRowBlock (as a parallel build's processes do), gives kmeans_train's
// centroids bit for bit; also when the run subsamples and when n <= k.
TEST(KMeans, SteppedRunInPartsMatchesKmeansTrain) {
    struct Shape { int n, d, k, max_points; };
    for (Shape s : {Shape{5000, 40, 64, 256}, Shape{9000, 20, 10, 300}, Shape{3, 4, 10, 256}}) {
        auto x = gpuivf_test::random_vectors(s.n, s.d, 17);
        KMeansParams p = kmeans_default_params();
        p.max_points_per_centroid = s.max_points;
        std::vector<float> a(s.k * s.d), b(s.k * s.d), norms(s.k);
        ASSERT_TRUE(ok(kmeans_train(x.data(), s.n, s.d, s.k, p, a.data(), nullptr)));
        Status st;
        KMeansRun *run = kmeans_begin(x.data(), s.n, s.d, s.k, p, b.data(), nullptr, &st);
        ASSERT_NE(run, nullptr) << st.message;
        const float *rows;
        int64_t n;
        int steps = 0;
        while (kmeans_wants_labels(run, &rows, &n)) {
            std::vector<int32_t> labels(n);
            row_norms(b.data(), s.k, s.d, norms.data());
            /* parts of 1, 3, 1, 3, ... blocks, the last one short */
            for (int64_t r0 = 0, part = 0; r0 < n; part++) {
                const int64_t len = std::min<int64_t>(n - r0, kAssignRowBlock * (part % 2 ? 3 : 1));
                ASSERT_TRUE(ok(assign_nearest(b.data(), norms.data(), s.k, s.d, rows + r0 * s.d, len,
                                              labels.data() + r0, nullptr, nullptr)));
                r0 += len;
            }
            ASSERT_TRUE(ok(kmeans_step(run, labels.data())));
            steps++;
        }
        kmeans_end(run);
        EXPECT_EQ(s.n <= s.k, steps == 0);
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "n=" << s.n;
    }
}

TEST(KMeans, SteppedRunRejectsBadArguments) {
    float x[4] = {0, 0, 0, 0}, c[4];
    Status st;
    EXPECT_EQ(kmeans_begin(x, 0, 2, 1, kmeans_default_params(), c, nullptr, &st), nullptr);
    EXPECT_EQ(st.code, kInvalidArgument);
}

// GEMM path (d > 16, more centroids than one column tile) and the direct
// path (small d) agree with a double-precision brute force.
TEST(AssignNearest, MatchesBruteForce) {
    for (int d : {5, 40}) {
        const int k = 1100, n = 700;
        auto cents = gpuivf_test::random_vectors(k, d, 20 + d);
        auto x = gpuivf_test::random_vectors(n, d, 30 + d);
        std::vector<int32_t> labels(n);
        std::vector<float> dists(n);
        ASSERT_TRUE(ok(assign_nearest(cents.data(), nullptr, k, d, x.data(), n, labels.data(), dists.data(), nullptr)));
        for (int i = 0; i < n; i++) {
            double best;
            nearest(cents, k, d, &x[i * d], &best);
            double got = gpuivf_test::reference_score(Metric::L2, &x[i * d], &cents[labels[i] * d], d);
            // The chosen centroid is the nearest up to float rounding.
            EXPECT_LE(got, best + 1e-4 * (1 + best)) << "d=" << d << " i=" << i;
            EXPECT_NEAR(dists[i], got, 1e-4 * (1 + got));
        }
    }
}

TEST(AssignNearest, UsesGivenCentroidNorms) {
    const int k = 50, d = 32, n = 100;
    auto cents = gpuivf_test::random_vectors(k, d, 1);
    auto x = gpuivf_test::random_vectors(n, d, 2);
    std::vector<float> norms(k);
    row_norms(cents.data(), k, d, norms.data());
    std::vector<int32_t> a(n), b(n);
    ASSERT_TRUE(ok(assign_nearest(cents.data(), norms.data(), k, d, x.data(), n, a.data(), nullptr, nullptr)));
    ASSERT_TRUE(ok(assign_nearest(cents.data(), nullptr, k, d, x.data(), n, b.data(), nullptr, nullptr)));
    EXPECT_EQ(a, b);
}

// Training refuses values outside +-kMaxComponent (NaN, infinities, 1e19),
// and on values at the bound gives finite centroids and codebooks, and
// finite distances and ADC scores (no float32 overflow anywhere).
TEST(ValueRange, TrainingRejectsOutOfRangeInput) {
    const int d = 8, n = 64, k = 4;
    const float bad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                         1e19f, -3e38f, 1.0001e15f};
    for (float b : bad) {
        std::vector<float> x(n * d, 0.5f);
        x[13] = b;
        std::vector<float> cents(k * d);
        Status st = kmeans_train(x.data(), n, d, k, kmeans_default_params(), cents.data(), nullptr);
        EXPECT_EQ(st.code, kInvalidArgument) << b;
        std::vector<float> cb(2 * 256 * (d / 2));
        x[13] = b > 0 ? 2 * b : b;  // residuals may reach 2 * kMaxComponent, no more
        st = pq_train(x.data(), n, d, 2, 8, 1, cb.data(), nullptr);
        EXPECT_EQ(st.code, kInvalidArgument) << b;
    }
    EXPECT_TRUE(components_within(std::vector<float>(3, -kMaxComponent).data(), 3, kMaxComponent));
    EXPECT_FALSE(components_within(std::vector<float>(3, 1.0001e15f).data(), 3, kMaxComponent));
}

TEST(ValueRange, ExtremeValuesTrainAndScoreFinitely) {
    const int d = 2000, n = 300, k = 8, m = 4;
    // every component at +-kMaxComponent, signs at random
    std::vector<float> x = gpuivf_test::random_vectors(n, d, 7);
    for (auto &v : x) v = v < 0 ? -kMaxComponent : kMaxComponent;
    std::vector<float> cents(static_cast<size_t>(k) * d);
    ASSERT_TRUE(ok(kmeans_train(x.data(), n, d, k, kmeans_default_params(), cents.data(), nullptr)));
    EXPECT_TRUE(all_finite(cents));
    // the largest squared distance at the bound: 4 d B^2 (8e33 here)
    EXPECT_TRUE(std::isfinite(l2_squared(&x[0], &x[d], d)));
    std::vector<float> far(d, -kMaxComponent), near(d, kMaxComponent);
    EXPECT_TRUE(std::isfinite(l2_squared(far.data(), near.data(), d)));
    EXPECT_TRUE(std::isfinite(inner_product(far.data(), near.data(), d)));

    std::vector<float> norms(k);
    row_norms(cents.data(), k, d, norms.data());
    std::vector<int32_t> labels(n);
    ASSERT_TRUE(ok(assign_nearest(cents.data(), norms.data(), k, d, x.data(), n, labels.data(), nullptr, nullptr)));
    std::vector<float> resid(x);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d; j++) resid[static_cast<size_t>(i) * d + j] -= cents[static_cast<size_t>(labels[i]) * d + j];
    std::vector<float> cb(static_cast<size_t>(m) * 256 * (d / m));
    Status pst = pq_train(resid.data(), n, d, m, 8, 1, cb.data(), nullptr);
    ASSERT_TRUE(ok(pst)) << pst.message;
    EXPECT_TRUE(all_finite(cb));

    IvfPqModel model{Metric::L2, d, k, m, 8, cents.data(), norms.data(), cb.data()};
    std::vector<int32_t> lists(n);
    std::vector<uint8_t> codes(static_cast<size_t>(n) * m);
    ASSERT_TRUE(ok(ivfpq_encode(model, x.data(), n, lists.data(), codes.data(), nullptr)));
    std::vector<float> lut(ivfpq_lut_size(model));
    float bias = 0;
    ivfpq_build_lut(model, far.data(), lists[0], lut.data(), &bias);
    std::vector<float> scores(n);
    ivfpq_adc_scores(model, lut.data(), bias, codes.data(), n, scores.data());
    for (float s : scores) EXPECT_TRUE(std::isfinite(s));
}
