/*
 * gpuivf_ivfcurve — recall@k of a plain IVF-flat partition (k-means lists,
 * exact distances inside the probed lists) as a function of the number of
 * probed lists.  It checks that generated data is as hard for an IVF index as
 * real data: run it on ../shared/data/siftsmall and on gpuivf_gen output of
 * the same size and compare the two curves (the recipe in
 * ../shared/data/README.md was matched within +-0.04 at 100 rows per list).
 *
 * Standalone on purpose (no src/core), so it says something about the data
 * and not about the engine under test.
 *
 * Usage: gpuivf_ivfcurve --base B.fvecs --query Q.fvecs --gt GT.ivecs [--lists L] [--k 10]
 */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "rng.h"
#include "vecio.h"

namespace {

float l2sq(const float *a, const float *b, int d) {
    float s = 0;
    for (int i = 0; i < d; i++) {
        float t = a[i] - b[i];
        s += t * t;
    }
    return s;
}

int nearest(const std::vector<float> &cent, int nlist, int d, const float *x) {
    int best = 0;
    float bd = std::numeric_limits<float>::infinity();
    for (int c = 0; c < nlist; c++) {
        float dd = l2sq(x, &cent[(size_t)c * d], d);
        if (dd < bd) bd = dd, best = c;
    }
    return best;
}

/* k-means++ seeding then Lloyd iterations; empty lists take a random point. */
std::vector<float> kmeans(const vecio::Matrix &m, int nlist, int iters, uint64_t seed) {
    const int d = m.d;
    testrng::Rng rng(seed, 7);
    std::vector<float> cent((size_t)nlist * d);
    std::vector<float> mind(m.n, std::numeric_limits<float>::infinity());
    int64_t first = (int64_t)(rng.uniform() * m.n);
    std::copy(m.row(first), m.row(first) + d, cent.begin());
    for (int c = 1; c < nlist; c++) {
        double total = 0;
        for (int64_t r = 0; r < m.n; r++) {
            mind[r] = std::min(mind[r], l2sq(m.row(r), &cent[(size_t)(c - 1) * d], d));
            total += mind[r];
        }
        double u = rng.uniform() * total, acc = 0;
        int64_t pick = m.n - 1;
        for (int64_t r = 0; r < m.n; r++) {
            acc += mind[r];
            if (acc >= u) {
                pick = r;
                break;
            }
        }
        std::copy(m.row(pick), m.row(pick) + d, cent.begin() + (size_t)c * d);
    }
    std::vector<double> sum((size_t)nlist * d);
    std::vector<int64_t> count(nlist);
    for (int it = 0; it < iters; it++) {
        std::fill(sum.begin(), sum.end(), 0.0);
        std::fill(count.begin(), count.end(), 0);
        for (int64_t r = 0; r < m.n; r++) {
            int c = nearest(cent, nlist, d, m.row(r));
            count[c]++;
            for (int i = 0; i < d; i++) sum[(size_t)c * d + i] += m.row(r)[i];
        }
        for (int c = 0; c < nlist; c++) {
            if (count[c] == 0) {
                int64_t r = (int64_t)(rng.uniform() * m.n);
                std::copy(m.row(r), m.row(r) + d, cent.begin() + (size_t)c * d);
                continue;
            }
            for (int i = 0; i < d; i++) cent[(size_t)c * d + i] = (float)(sum[(size_t)c * d + i] / count[c]);
        }
    }
    return cent;
}

}  // namespace

int main(int argc, char **argv) {
    std::string base_path, query_path, gt_path;
    int nlist = 0, k = 10, iters = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string a = argv[i], v = argv[i + 1];
        if (a == "--base") base_path = v;
        else if (a == "--query") query_path = v;
        else if (a == "--gt") gt_path = v;
        else if (a == "--lists") nlist = std::atoi(v.c_str());
        else if (a == "--k") k = std::atoi(v.c_str());
        else if (a == "--iters") iters = std::atoi(v.c_str());
        else {
            std::fprintf(stderr, "gpuivf_ivfcurve: unknown option %s\n", a.c_str());
            return 2;
        }
    }
    if (base_path.empty() || query_path.empty() || gt_path.empty()) {
        std::fprintf(stderr, "usage: gpuivf_ivfcurve --base B.fvecs --query Q.fvecs --gt GT.ivecs [--lists L] [--k 10]\n");
        return 2;
    }
    vecio::Matrix base, queries;
    std::vector<int32_t> gt;
    int gk;
    int64_t gn;
    std::string err;
    if (!vecio::read_vectors(base_path, &base, 0, &err) || !vecio::read_vectors(query_path, &queries, 0, &err) ||
        !vecio::read_ivecs(gt_path, &gt, &gk, &gn, &err)) {
        std::fprintf(stderr, "gpuivf_ivfcurve: %s\n", err.c_str());
        return 1;
    }
    if (gn != queries.n || gk < k) {
        std::fprintf(stderr, "gpuivf_ivfcurve: ground truth does not match the queries\n");
        return 1;
    }
    if (nlist <= 0) nlist = (int)std::max<int64_t>(1, base.n / 100);
    const int d = base.d;
    std::vector<float> cent = kmeans(base, nlist, iters, 1);
    std::vector<int> label(base.n);
    for (int64_t r = 0; r < base.n; r++) label[r] = nearest(cent, nlist, d, base.row(r));

    std::printf("# %lld rows, %d dims, %d lists, recall@%d over %lld queries\n", (long long)base.n, d, nlist, k,
                (long long)queries.n);
    std::printf("probes\trecall\n");
    std::vector<int> probe_counts;
    for (int p = 1; p < nlist; p *= 2) probe_counts.push_back(p);
    probe_counts.push_back(nlist);
    for (int probes : probe_counts) {
        double hits = 0;
        for (int64_t q = 0; q < queries.n; q++) {
            const float *qv = queries.row(q);
            std::vector<std::pair<float, int>> order(nlist);
            for (int c = 0; c < nlist; c++) order[c] = {l2sq(qv, &cent[(size_t)c * d], d), c};
            std::partial_sort(order.begin(), order.begin() + probes, order.end());
            std::vector<char> probed(nlist, 0);
            for (int p = 0; p < probes; p++) probed[order[p].second] = 1;
            /* the true neighbours found are exactly those in probed lists
             * (distances inside a list are exact) */
            for (int j = 0; j < k; j++) hits += probed[label[gt[(size_t)q * gk + j]]];
        }
        std::printf("%d\t%.3f\n", probes, hits / (queries.n * (double)k));
    }
    return 0;
}
