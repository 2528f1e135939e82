// Shared helpers of the unit tests of both engines (test/unit for src/core,
// cuda/test for the GPU engine, which adds its own in cuda_test_util.h):
// generated data, brute-force references, the texmex file readers, where
// real data lives, and an IVF-PQ model trained with src/core.
#ifndef GPUIVF_TEST_UTIL_H
#define GPUIVF_TEST_UTIL_H

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpuivf_core.h"

namespace gpuivf {
// Readable parameter names in test output.
inline const char *metric_name(Metric m) {
    return m == Metric::L2 ? "L2" : m == Metric::InnerProduct ? "IP" : "Cosine";
}
inline void PrintTo(Metric m, std::ostream *os) { *os << metric_name(m); }
}  // namespace gpuivf

namespace gpuivf_test {

// n x d floats, uniform in [lo, hi).
inline std::vector<float> random_vectors(int64_t n, int d, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> x(static_cast<size_t>(n) * d);
    for (float &v : x) v = u(gen);
    return x;
}

// n points around k centres spread far apart (centres in [-scale, scale),
// points within +-spread of their centre); labels[i] is the true cluster.
struct Clustered {
    std::vector<float> centres;
    std::vector<float> points;
    std::vector<int> labels;
};
inline Clustered clustered(int64_t n, int d, int k, float scale, float spread, uint32_t seed) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    Clustered c;
    c.centres.resize(static_cast<size_t>(k) * d);
    for (float &v : c.centres) v = scale * u(gen);
    c.points.resize(static_cast<size_t>(n) * d);
    c.labels.resize(n);
    for (int64_t i = 0; i < n; i++) {
        int label = static_cast<int>(i % k);
        c.labels[i] = label;
        for (int t = 0; t < d; t++) c.points[i * d + t] = c.centres[label * d + t] + spread * u(gen);
    }
    return c;
}

// Double-precision reference of the internal score of two prepared vectors.
inline double reference_score(gpuivf::Metric m, const float *a, const float *b, int d) {
    double s = 0.0;
    for (int t = 0; t < d; t++) {
        if (m == gpuivf::Metric::InnerProduct)
            s -= static_cast<double>(a[t]) * b[t];
        else
            s += (static_cast<double>(a[t]) - b[t]) * (static_cast<double>(a[t]) - b[t]);
    }
    return s;
}

// Full sort of (score, id) pairs: the reference for every k-selection.
inline std::vector<std::pair<float, uint64_t>> sorted_pairs(const std::vector<float> &vals,
                                                           const std::vector<uint64_t> &ids) {
    std::vector<std::pair<float, uint64_t>> p(vals.size());
    for (size_t i = 0; i < vals.size(); i++) p[i] = {vals[i], ids[i]};
    std::sort(p.begin(), p.end());
    return p;
}

// Where ../shared/data lives: $GPUIVF_DATA_DIR, else next to the checkout.
inline std::string data_dir() {
    if (const char *env = std::getenv("GPUIVF_DATA_DIR")) return env;
    return std::string(GPUIVF_SOURCE_DIR) + "/../shared/data";
}

// texmex .fvecs / .ivecs: per row an int32 dimension, then that many values.
template <typename T>
inline bool read_vecs(const std::string &path, std::vector<T> *out, int *dim, int64_t *rows) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return false;
    out->clear();
    *rows = 0;
    int32_t d;
    while (in.read(reinterpret_cast<char *>(&d), sizeof d)) {
        *dim = d;
        size_t old = out->size();
        out->resize(old + d);
        if (!in.read(reinterpret_cast<char *>(out->data() + old), sizeof(T) * d)) return false;
        (*rows)++;
    }
    return *rows > 0;
}

// siftsmall (SIFT10K) and its official ground truth (truth_k ids a query).
struct SiftSmall {
    std::vector<float> base, queries;
    std::vector<int32_t> truth;
    int d = 0, truth_k = 0;
    int64_t n = 0, nq = 0;
};

// Loads siftsmall from data_dir(), or returns false (the caller skips the
// test and says why).
inline bool load_siftsmall(SiftSmall *s) {
    const std::string dir = data_dir() + "/siftsmall/";
    int64_t nt = 0;
    int dq = 0;
    return read_vecs(dir + "siftsmall_base.fvecs", &s->base, &s->d, &s->n) &&
           read_vecs(dir + "siftsmall_query.fvecs", &s->queries, &dq, &s->nq) &&
           read_vecs(dir + "siftsmall_groundtruth.ivecs", &s->truth, &s->truth_k, &nt) && dq == s->d && nt == s->nq;
}

// An IVF-PQ model trained with the core functions on prepared vectors, and
// the vectors' lists and codes.
struct TrainedIvfPq {
    std::vector<float> prepared, centroids, norms, codebook;
    std::vector<int32_t> lists;
    std::vector<uint8_t> codes;
    gpuivf::IvfPqModel model;
};
inline void train_ivfpq(gpuivf::Metric metric, const float *x, int64_t n, int d, int nlist, int m,
                        int nbits, TrainedIvfPq *t) {
    using namespace gpuivf;
    t->prepared.resize(static_cast<size_t>(n) * d);
    for (int64_t i = 0; i < n; i++) prepare_vector(metric, x + i * d, &t->prepared[i * d], d);
    t->centroids.resize(static_cast<size_t>(nlist) * d);
    Status s = kmeans_train(t->prepared.data(), n, d, nlist, kmeans_default_params(), t->centroids.data(), nullptr);
    if (!ok(s)) std::abort();
    t->norms.resize(nlist);
    row_norms(t->centroids.data(), nlist, d, t->norms.data());
    t->lists.resize(n);
    if (!ok(assign_nearest(t->centroids.data(), t->norms.data(), nlist, d, t->prepared.data(), n,
                           t->lists.data(), nullptr, nullptr)))
        std::abort();
    std::vector<float> residuals(t->prepared);
    for (int64_t i = 0; i < n; i++)
        for (int c = 0; c < d; c++) residuals[i * d + c] -= t->centroids[t->lists[i] * d + c];
    t->codebook.resize(static_cast<size_t>(m) * (1 << nbits) * (d / m));
    if (!ok(pq_train(residuals.data(), n, d, m, nbits, 7, t->codebook.data(), nullptr))) std::abort();
    t->model = IvfPqModel{metric, d, nlist, m, nbits, t->centroids.data(), t->norms.data(), t->codebook.data()};
    t->codes.resize(static_cast<size_t>(n) * pq_code_size(m, nbits));
    if (!ok(ivfpq_encode(t->model, t->prepared.data(), n, t->lists.data(), t->codes.data(), nullptr)))
        std::abort();
}

}  // namespace gpuivf_test

#endif
