// GPU training: k-means (quality against the CPU engine's k-means, empty
// clusters, n <= k), PQ codebooks (reconstruction error against the CPU's),
// a whole model end to end, and the cancel hook.
#include "cuda_test_util.h"

namespace {

// Mean squared distance of each point to its nearest centroid.
double inertia(const std::vector<float> &x, int d, const std::vector<float> &c, int k) {
    const int64_t n = static_cast<int64_t>(x.size()) / d;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float best = INFINITY;
        for (int j = 0; j < k; j++) best = std::min(best, gpuivf::l2_squared(&x[i * d], &c[j * d], d));
        sum += best;
    }
    return sum / n;
}

TEST(KMeans, AsGoodAsTheCpu) {
    REQUIRE_GPU();
    const int d = 24, k = 50;
    const std::vector<float> x = gt::clustered_vectors(20000, d, 60, 3);
    std::vector<float> cpu_c(k * d), gpu_c(k * d);
    gpuivf::KMeansParams cp = gpuivf::kmeans_default_params();
    ASSERT_TRUE(gpuivf::ok(gpuivf::kmeans_train(x.data(), 20000, d, k, cp, cpu_c.data(), nullptr)));
    gpuivf_cuda_kmeans_params gp = gpuivf_cuda_kmeans_default_params();
    gp.max_points_per_centroid = 0; // every point
    gt::poison_nan(gpu_c);
    EXPECT_GPU_OK(gpuivf_cuda_kmeans(gt::gpu(), x.data(), 20000, d, k, &gp, gpu_c.data()));
    for (float v : gpu_c) ASSERT_TRUE(std::isfinite(v));
    const double ci = inertia(x, d, cpu_c, k), gi = inertia(x, d, gpu_c, k);
    std::printf("k-means inertia: cpu %.5f gpu %.5f\n", ci, gi);
    EXPECT_LE(gi, ci * 1.05);
}

TEST(KMeans, EmptyClustersAndFewPoints) {
    REQUIRE_GPU();
    const int d = 8;
    // 600 points on only 5 distinct positions, 40 clusters: most start empty.
    std::vector<float> x = gt::random_vectors(600, d, 9);
    for (int i = 0; i < 600; i++) std::copy(&x[(i % 5) * d], &x[(i % 5) * d] + d, &x[i * d]);
    std::vector<float> c(40 * d);
    gpuivf_cuda_kmeans_params p = gpuivf_cuda_kmeans_default_params();
    EXPECT_GPU_OK(gpuivf_cuda_kmeans(gt::gpu(), x.data(), 600, d, 40, &p, c.data()));
    for (float v : c) ASSERT_TRUE(std::isfinite(v));
    // Every position has a centroid on it (up to the tiny split perturbation
    // the last iteration leaves on the split clusters).
    EXPECT_LT(inertia(x, d, c, 40), 1e-3);
    // n <= k: every point is a centroid.
    std::vector<float> few = gt::random_vectors(7, d, 10), c2(10 * d);
    EXPECT_GPU_OK(gpuivf_cuda_kmeans(gt::gpu(), few.data(), 7, d, 10, &p, c2.data()));
    for (int i = 0; i < 7 * d; i++) EXPECT_EQ(c2[i], few[i]);
    for (float v : c2) ASSERT_TRUE(std::isfinite(v));
}

TEST(PqTrain, ReconstructionAsGoodAsTheCpu) {
    REQUIRE_GPU();
    for (int nbits : {8, 4}) {
        const int d = 32, m = 8, n = 20000;
        const std::vector<float> x = gt::clustered_vectors(n, d, 30, 4 + nbits);
        const int ksub = 1 << nbits;
        std::vector<float> cpu_cb(m * ksub * (d / m)), gpu_cb(cpu_cb.size());
        ASSERT_TRUE(gpuivf::ok(gpuivf::pq_train(x.data(), n, d, m, nbits, 7, cpu_cb.data(), nullptr)));
        gpuivf_cuda_kmeans_params p = gpuivf_cuda_kmeans_default_params();
        gt::poison_nan(gpu_cb);
        EXPECT_GPU_OK(gpuivf_cuda_pq_train(gt::gpu(), x.data(), n, d, m, nbits, &p, gpu_cb.data()));
        auto mse = [&](const std::vector<float> &cb) {
            const int cs = gpuivf::pq_code_size(m, nbits);
            std::vector<uint8_t> codes(static_cast<size_t>(n) * cs);
            std::vector<float> rec(x.size());
            gpuivf::pq_encode(cb.data(), d, m, nbits, x.data(), n, codes.data());
            gpuivf::pq_decode(cb.data(), d, m, nbits, codes.data(), n, rec.data());
            double s = 0.0;
            for (size_t i = 0; i < x.size(); i++) s += (x[i] - rec[i]) * (x[i] - rec[i]);
            return s / n;
        };
        for (float v : gpu_cb) ASSERT_TRUE(std::isfinite(v));
        const double ce = mse(cpu_cb), ge = mse(gpu_cb);
        std::printf("pq %d-bit reconstruction error: cpu %.5f gpu %.5f\n", nbits, ce, ge);
        EXPECT_LE(ge, ce * 1.05);
    }
}

TEST(IvfPqTrain, EndToEndOnTheGpu) {
    REQUIRE_GPU();
    const int d = 64, nlist = 64, m = 16;
    const int64_t n = 30000, nq = 100;
    const std::vector<float> x = gt::clustered_vectors(n, d, 100, 5);
    const std::vector<float> q = gt::clustered_vectors(nq, d, 100, 6);
    for (int metric : {1, 2, 3}) {
        std::vector<float> cent(nlist * d), cb(m * 256 * (d / m));
        gpuivf_cuda_kmeans_params p = gpuivf_cuda_kmeans_default_params();
        EXPECT_GPU_OK(gpuivf_cuda_ivfpq_train(gt::gpu(), metric, x.data(), n, d, nlist, m, 8, &p, cent.data(),
                                              cb.data()));
        gpuivf_cuda_model model{metric, d, nlist, m, 8, cent.data(), cb.data()};
        gpuivf_cuda_index *ix = nullptr;
        EXPECT_GPU_OK(gpuivf_cuda_index_create(gt::gpu(), &model, 1, &ix));
        std::vector<uint64_t> ids(n);
        for (int64_t i = 0; i < n; i++) ids[i] = i;
        EXPECT_GPU_OK(gpuivf_cuda_index_add(gt::gpu(), ix, n, x.data(), ids.data()));
        const int k = 10;
        gpuivf_cuda_search_params sp{k, 16, 100, 0, nullptr, nullptr};
        std::vector<double> dist(nq * k);
        std::vector<uint64_t> got(nq * k);
        EXPECT_GPU_OK(gpuivf_cuda_index_search(gt::gpu(), ix, q.data(), nq, &sp, dist.data(), got.data()));
        std::vector<float> tv(nq * k);
        std::vector<uint64_t> ti(nq * k);
        ASSERT_TRUE(gpuivf::ok(gpuivf::exact_knn(static_cast<gpuivf::Metric>(metric), x.data(), n, q.data(), nq, d,
                                                 k, tv.data(), ti.data(), nullptr)));
        int64_t hit = 0;
        for (int64_t i = 0; i < nq; i++)
            for (int j = 0; j < k; j++)
                for (int t = 0; t < k; t++) hit += got[i * k + j] == ti[i * k + t];
        const double recall = static_cast<double>(hit) / (nq * k);
        std::printf("metric %d: GPU-trained IVF-PQ recall@10 %.3f (nprobe 16 of 64, re-rank 100)\n", metric, recall);
        EXPECT_GE(recall, 0.8);
        EXPECT_GPU_OK(gpuivf_cuda_index_destroy(ix));
    }
}

int cancel_now(void *) { return 1; }

TEST(Cancel, KMeansStopsWithCanceled) {
    REQUIRE_GPU();
    const std::vector<float> x = gt::random_vectors(5000, 16, 2);
    std::vector<float> c(100 * 16);
    EXPECT_GPU_OK(gpuivf_cuda_set_cancel_hook(gt::gpu(), cancel_now, nullptr));
    gpuivf_cuda_status st = gpuivf_cuda_kmeans(gt::gpu(), x.data(), 5000, 16, 100, nullptr, c.data());
    EXPECT_GPU_OK(gpuivf_cuda_set_cancel_hook(gt::gpu(), nullptr, nullptr));
    EXPECT_EQ(st.code, GPUIVF_CUDA_CANCELED);
    EXPECT_STREQ(st.message, "canceled");
    // The resources still work afterwards.
    EXPECT_GPU_OK(gpuivf_cuda_kmeans(gt::gpu(), x.data(), 5000, 16, 100, nullptr, c.data()));
}

// Vector values beyond GPUIVF_CUDA_MAX_COMPONENT (NaN, infinities, 1e19) are
// refused by every training entry point; values at the bound train to
// finite centroids and codebooks.
TEST(ValueRange, TrainingRefusesOutOfRangeAndStaysFiniteAtTheBound) {
    REQUIRE_GPU();
    const int d = 16, n = 2000, k = 8, m = 4;
    gpuivf_cuda_kmeans_params p = gpuivf_cuda_kmeans_default_params();
    std::vector<float> c(k * d), cb(static_cast<size_t>(m) * 256 * (d / m));
    for (float bad : {NAN, INFINITY, 1e19f, -3e38f}) {
        std::vector<float> x = gt::random_vectors(n, d, 5);
        x[77] = bad;
        EXPECT_EQ(gpuivf_cuda_kmeans(gt::gpu(), x.data(), n, d, k, &p, c.data()).code, GPUIVF_CUDA_INVALID_ARGUMENT);
        EXPECT_EQ(gpuivf_cuda_pq_train(gt::gpu(), x.data(), n, d, m, 8, &p, cb.data()).code,
                  GPUIVF_CUDA_INVALID_ARGUMENT);
        EXPECT_EQ(gpuivf_cuda_ivfpq_train(gt::gpu(), 1, x.data(), n, d, k, m, 8, &p, c.data(), cb.data()).code,
                  GPUIVF_CUDA_INVALID_ARGUMENT);
    }
    std::vector<float> x = gt::random_vectors(n, d, 6);
    for (float &v : x) v = v < 0 ? -GPUIVF_CUDA_MAX_COMPONENT : GPUIVF_CUDA_MAX_COMPONENT;
    for (int metric : {1, 2, 3}) {
        gt::poison_nan(c);
        gt::poison_nan(cb);
        EXPECT_GPU_OK(gpuivf_cuda_ivfpq_train(gt::gpu(), metric, x.data(), n, d, k, m, 8, &p, c.data(), cb.data()));
        for (float v : c) ASSERT_TRUE(std::isfinite(v));
        for (float v : cb) ASSERT_TRUE(std::isfinite(v));
    }
}

TEST(Resources, BadDeviceIsAnErrorNotACrash) {
    REQUIRE_GPU();
    gpuivf_cuda_resources *r = nullptr;
    gpuivf_cuda_status st = gpuivf_cuda_resources_create(4096, 0, &r);
    EXPECT_EQ(st.code, GPUIVF_CUDA_INVALID_ARGUMENT);
    EXPECT_EQ(r, nullptr);
    EXPECT_GPU_OK(gpuivf_cuda_resources_destroy(nullptr));
}

} // namespace
