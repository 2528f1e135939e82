// Shared helpers of the GPU engine's tests: the device check that skips
// without a GPU, one resources object for the whole binary, random and
// clustered data, poisoned outputs, the texmex readers, and a CPU reference
// IVF-PQ search built from src/core's functions.
#ifndef GPUIVF_CUDA_TEST_UTIL_H
#define GPUIVF_CUDA_TEST_UTIL_H

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpuivf_core.h"
#include "gpuivf_cuda.h"

namespace gt {

// The resources of the whole test binary (null when there is no device).
gpuivf_cuda_resources *gpu();

// Skip the test, visibly, when there is no CUDA device.
#define REQUIRE_GPU()                                                      \
    do {                                                                   \
        if (::gt::gpu() == nullptr) GTEST_SKIP() << "skipped: no CUDA device"; \
    } while (0)

#define EXPECT_GPU_OK(expr)                                                \
    do {                                                                   \
        gpuivf_cuda_status st_ = (expr);                                   \
        ASSERT_EQ(st_.code, GPUIVF_CUDA_OK) << #expr << ": " << st_.message; \
    } while (0)

inline std::vector<float> random_vectors(int64_t n, int d, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> x(static_cast<size_t>(n) * d);
    for (float &v : x) v = u(gen);
    return x;
}

// n points around `clusters` centres with a decaying spectrum (so IVF and PQ
// behave like on real data rather than on isotropic noise).
inline std::vector<float> clustered_vectors(int64_t n, int d, int clusters, uint32_t seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> centres(static_cast<size_t>(clusters) * d);
    for (int c = 0; c < clusters; c++)
        for (int t = 0; t < d; t++) centres[c * d + t] = 1.5f * g(gen) / std::sqrt(1.0f + t);
    std::vector<float> x(static_cast<size_t>(n) * d);
    std::uniform_int_distribution<int> pick(0, clusters - 1);
    for (int64_t i = 0; i < n; i++) {
        const int c = pick(gen);
        const float spread = 0.5f + 0.1f * (c % 11);
        for (int t = 0; t < d; t++) x[i * d + t] = centres[c * d + t] + spread * g(gen) / std::sqrt(1.0f + t);
    }
    return x;
}

// Fill with a byte pattern no result ever has (NaN floats, odd ids).
template <typename T>
inline void poison(std::vector<T> &v) {
    std::memset(v.data(), 0xA5, v.size() * sizeof(T));
}
inline void poison_nan(std::vector<float> &v) { std::memset(v.data(), 0xFF, v.size() * sizeof(float)); }
inline void poison_nan(std::vector<double> &v) { std::memset(v.data(), 0xFF, v.size() * sizeof(double)); }

inline bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }
inline bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Where ../shared/data lives: $GPUIVF_DATA_DIR, else next to the checkout.
inline std::string data_dir() {
    if (const char *env = std::getenv("GPUIVF_DATA_DIR")) return env;
    return std::string(GPUIVF_SOURCE_DIR) + "/../shared/data";
}

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

// An IVF-PQ model trained with src/core on prepared vectors, the vectors'
// lists and codes, and a CPU reference search over it.
struct CpuIvfPq {
    gpuivf::Metric metric;
    int d = 0, nlist = 0, m = 0, nbits = 8, code_size = 0;
    std::vector<float> raw, prepared, centroids, norms, codebook;
    std::vector<int32_t> lists;
    std::vector<uint8_t> codes;
    std::vector<uint64_t> ids;
    gpuivf::IvfPqModel model;
    std::vector<std::vector<int64_t>> members; // rows of each list, in insertion order

    void train(gpuivf::Metric mt, const std::vector<float> &x, int dims, int nl, int pq_m, int bits) {
        using namespace gpuivf;
        metric = mt;
        d = dims;
        nlist = nl;
        m = pq_m;
        nbits = bits;
        code_size = pq_code_size(m, nbits);
        const int64_t n = static_cast<int64_t>(x.size()) / d;
        raw = x;
        prepared.resize(x.size());
        for (int64_t i = 0; i < n; i++) prepare_vector(mt, &x[i * d], &prepared[i * d], d);
        centroids.resize(static_cast<size_t>(nlist) * d);
        ASSERT_TRUE(ok(kmeans_train(prepared.data(), n, d, nlist, kmeans_default_params(), centroids.data(), nullptr)));
        norms.resize(nlist);
        row_norms(centroids.data(), nlist, d, norms.data());
        lists.resize(n);
        ASSERT_TRUE(ok(assign_nearest(centroids.data(), norms.data(), nlist, d, prepared.data(), n, lists.data(),
                                      nullptr, nullptr)));
        std::vector<float> residuals(prepared);
        for (int64_t i = 0; i < n; i++)
            for (int t = 0; t < d; t++) residuals[i * d + t] -= centroids[static_cast<size_t>(lists[i]) * d + t];
        codebook.resize(static_cast<size_t>(m) * (1 << nbits) * (d / m));
        ASSERT_TRUE(ok(pq_train(residuals.data(), n, d, m, nbits, 7, codebook.data(), nullptr)));
        model = IvfPqModel{mt, d, nlist, m, nbits, centroids.data(), norms.data(), codebook.data()};
        codes.resize(static_cast<size_t>(n) * code_size);
        ASSERT_TRUE(ok(ivfpq_encode(model, prepared.data(), n, lists.data(), codes.data(), nullptr)));
        ids.resize(n);
        for (int64_t i = 0; i < n; i++) ids[i] = static_cast<uint64_t>(i) * 7 + 3; // not row numbers
        rebuild_members(n);
    }
    void rebuild_members(int64_t n) {
        members.assign(nlist, {});
        for (int64_t i = 0; i < n; i++) members[lists[i]].push_back(i);
    }
    int64_t size() const { return static_cast<int64_t>(lists.size()); }
    gpuivf_cuda_model gpu_model() const {
        return gpuivf_cuda_model{static_cast<int32_t>(metric), d, nlist, m, nbits, centroids.data(), codebook.data()};
    }

    // Round 1 of the CPU index scan: nprobe lists, ADC top max(R, k) (R = 0:
    // no re-rank), re-ranked exactly on the raw vectors when R > 0.
    std::vector<std::pair<double, uint64_t>> search(const float *q_raw, int k, int nprobe, int rerank,
                                                    const std::vector<bool> *removed = nullptr) const {
        using namespace gpuivf;
        std::vector<float> q(d);
        prepare_vector(metric, q_raw, q.data(), d);
        std::vector<int32_t> probe(nprobe);
        std::vector<float> pscores(nprobe);
        ivfpq_probe_lists(model, q.data(), nprobe, probe.data(), pscores.data());
        const int cap = rerank > 0 ? std::max(rerank, k) : k;
        std::vector<float> tv(cap);
        std::vector<uint64_t> ti(cap);
        TopK top;
        topk_init(&top, tv.data(), ti.data(), cap);
        std::vector<float> lut(ivfpq_lut_size(model));
        std::vector<uint8_t> lc;
        std::vector<uint64_t> li;
        for (int p = 0; p < nprobe; p++) {
            if (probe[p] < 0) continue;
            float bias;
            ivfpq_build_lut(model, q.data(), probe[p], lut.data(), &bias);
            lc.clear();
            li.clear();
            for (int64_t row : members[probe[p]]) {
                if (removed && (*removed)[row]) continue;
                lc.insert(lc.end(), codes.begin() + row * code_size, codes.begin() + (row + 1) * code_size);
                li.push_back(ids[row]);
            }
            ivfpq_adc_scan(model, lut.data(), bias, lc.data(), li.data(), static_cast<int64_t>(li.size()), &top);
        }
        topk_sort(&top);
        std::vector<std::pair<double, uint64_t>> out;
        for (int i = 0; i < top.size; i++) {
            if (rerank > 0) {
                const int64_t row = static_cast<int64_t>((ti[i] - 3) / 7);
                out.push_back({metric_distance(metric, q_raw, &raw[row * d], d), ti[i]});
            } else {
                out.push_back({ivfpq_score_to_distance(metric, tv[i]), ti[i]});
            }
        }
        if (rerank > 0) {
            std::sort(out.begin(), out.end(), [](const auto &a, const auto &b) {
                if (a.first < b.first) return true;
                if (b.first < a.first) return false;
                const bool an = a.first != a.first, bn = b.first != b.first;
                if (an != bn) return bn;
                return a.second < b.second;
            });
            if (static_cast<int>(out.size()) > k) out.resize(k);
        }
        return out;
    }
};

} // namespace gt

#endif
