// Helpers of the GPU engine's tests, on top of the unit tests' own
// (test/unit/test_util.h: random data, the texmex readers and siftsmall, an
// IVF-PQ model trained with src/core): the device check that skips without
// a GPU, one resources object for the whole binary, clustered data,
// poisoned outputs, and a CPU reference IVF-PQ search built from src/core's
// functions.
#ifndef GPUIVF_CUDA_TEST_UTIL_H
#define GPUIVF_CUDA_TEST_UTIL_H

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpuivf_core.h"
#include "gpuivf_cuda.h"
#include "test_util.h"

namespace gt {

using gpuivf_test::data_dir;
using gpuivf_test::load_siftsmall;
using gpuivf_test::random_vectors;
using gpuivf_test::read_vecs;
using gpuivf_test::SiftSmall;

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

// An IVF-PQ model trained with src/core on prepared vectors
// (gpuivf_test::train_ivfpq), the vectors' lists and codes, and a CPU
// reference search over it.
struct CpuIvfPq : gpuivf_test::TrainedIvfPq {
    gpuivf::Metric metric;
    int d = 0, nlist = 0, m = 0, nbits = 8, code_size = 0;
    std::vector<float> raw;
    std::vector<uint64_t> ids;
    std::vector<std::vector<int64_t>> members; // rows of each list, in insertion order

    void train(gpuivf::Metric mt, const std::vector<float> &x, int dims, int nl, int pq_m, int bits) {
        metric = mt;
        d = dims;
        nlist = nl;
        m = pq_m;
        nbits = bits;
        code_size = gpuivf::pq_code_size(m, nbits);
        const int64_t n = static_cast<int64_t>(x.size()) / d;
        raw = x;
        gpuivf_test::train_ivfpq(mt, x.data(), n, d, nlist, m, nbits, this);
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
