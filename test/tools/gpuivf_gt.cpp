/*
 * gpuivf_gt — exact k-nearest-neighbour ground truth for the tests and the
 * benchmark: brute force in double precision, independent of the engine it
 * checks (it shares no code with src/core).
 *
 * Distances are the SQL operators' (l2: <->, ip: <#> = -a.b, cosine: <=>);
 * ascending, ties broken by the smaller row number, vectors whose cosine
 * distance is undefined (zero norm) sort last.  Output: .ivecs of 0-based
 * base row numbers, optionally the distances as .fvecs.
 *
 * Usage: gpuivf_gt --base B.fvecs --query Q.fvecs --k 100 --metric l2 --out GT.ivecs
 */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "vecio.h"

namespace {

enum class Metric { L2, IP, Cosine };

struct Options {
    std::string base, query, out, dist_out, metric = "l2";
    int k = 100;
    int threads = 0;
};

void usage() {
    std::fputs(
        "usage: gpuivf_gt --base B.fvecs --query Q.fvecs --out GT.ivecs [options]\n"
        "Exact top-k of every query among the base rows (brute force, double precision).\n"
        "  --k K            neighbours per query (default 100, at most the base rows)\n"
        "  --metric M       l2 | ip | cosine (default l2): the SQL distances of <->, <#>, <=>\n"
        "  --dist PATH      also write the distances as .fvecs\n"
        "  --threads T      worker threads (default: hardware concurrency)\n"
        "Base and query files may be .fvecs or .bvecs.\n",
        stdout);
}

/* Partial sums in four accumulators: exact enough in double, and fast. */
inline double dot(const float *a, const float *b, int d) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int i = 0;
    for (; i + 4 <= d; i += 4) {
        s0 += (double)a[i] * b[i];
        s1 += (double)a[i + 1] * b[i + 1];
        s2 += (double)a[i + 2] * b[i + 2];
        s3 += (double)a[i + 3] * b[i + 3];
    }
    for (; i < d; i++) s0 += (double)a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

inline double l2sq(const float *a, const float *b, int d) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int i = 0;
    for (; i + 4 <= d; i += 4) {
        double t0 = (double)a[i] - b[i], t1 = (double)a[i + 1] - b[i + 1];
        double t2 = (double)a[i + 2] - b[i + 2], t3 = (double)a[i + 3] - b[i + 3];
        s0 += t0 * t0;
        s1 += t1 * t1;
        s2 += t2 * t2;
        s3 += t3 * t3;
    }
    for (; i < d; i++) {
        double t = (double)a[i] - b[i];
        s0 += t * t;
    }
    return (s0 + s1) + (s2 + s3);
}

using Pair = std::pair<double, int32_t>; /* (distance, row); NaN mapped to +inf */

/* The k best of one query: a bounded max-heap on (distance, row). */
void knn_one(Metric metric, const vecio::Matrix &base, const std::vector<double> &base_norms,
             const float *q, int k, Pair *out) {
    const int d = base.d;
    std::vector<Pair> heap;
    heap.reserve(k + 1);
    double qnorm = 0;
    if (metric == Metric::Cosine) qnorm = std::sqrt(dot(q, q, d));
    for (int64_t r = 0; r < base.n; r++) {
        const float *x = base.row(r);
        double dist;
        switch (metric) {
            case Metric::L2: dist = std::sqrt(l2sq(q, x, d)); break;
            case Metric::IP: dist = -dot(q, x, d); break;
            default: {
                double denom = qnorm * base_norms[r];
                dist = denom > 0 ? 1.0 - dot(q, x, d) / denom : std::numeric_limits<double>::infinity();
            }
        }
        Pair p{dist, (int32_t)r};
        if ((int)heap.size() < k) {
            heap.push_back(p);
            std::push_heap(heap.begin(), heap.end());
        } else if (p < heap.front()) {
            std::pop_heap(heap.begin(), heap.end());
            heap.back() = p;
            std::push_heap(heap.begin(), heap.end());
        }
    }
    std::sort_heap(heap.begin(), heap.end());
    std::copy(heap.begin(), heap.end(), out);
}

}  // namespace

int main(int argc, char **argv) {
    Options o;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            usage();
            return 0;
        }
        if (i + 1 >= argc) {
            std::fprintf(stderr, "gpuivf_gt: %s needs a value\n", a.c_str());
            return 2;
        }
        std::string v = argv[++i];
        if (a == "--base") o.base = v;
        else if (a == "--query") o.query = v;
        else if (a == "--out") o.out = v;
        else if (a == "--dist") o.dist_out = v;
        else if (a == "--metric") o.metric = v;
        else if (a == "--k") o.k = std::atoi(v.c_str());
        else if (a == "--threads") o.threads = std::atoi(v.c_str());
        else {
            std::fprintf(stderr, "gpuivf_gt: unknown option %s (see --help)\n", a.c_str());
            return 2;
        }
    }
    Metric metric;
    if (o.metric == "l2") metric = Metric::L2;
    else if (o.metric == "ip") metric = Metric::IP;
    else if (o.metric == "cosine") metric = Metric::Cosine;
    else {
        std::fprintf(stderr, "gpuivf_gt: --metric must be l2, ip or cosine\n");
        return 2;
    }
    if (o.base.empty() || o.query.empty() || o.out.empty() || o.k < 1) {
        std::fprintf(stderr, "gpuivf_gt: --base, --query, --out and a positive --k are required\n");
        return 2;
    }

    vecio::Matrix base, queries;
    std::string err;
    if (!vecio::read_vectors(o.base, &base, 0, &err) || !vecio::read_vectors(o.query, &queries, 0, &err)) {
        std::fprintf(stderr, "gpuivf_gt: %s\n", err.c_str());
        return 1;
    }
    if (base.d != queries.d) {
        std::fprintf(stderr, "gpuivf_gt: base has %d dimensions, queries %d\n", base.d, queries.d);
        return 1;
    }
    const int k = (int)std::min<int64_t>(o.k, base.n);

    std::vector<double> norms;
    if (metric == Metric::Cosine) {
        norms.resize(base.n);
        for (int64_t r = 0; r < base.n; r++) norms[r] = std::sqrt(dot(base.row(r), base.row(r), base.d));
    }

    std::vector<Pair> result((size_t)queries.n * k);
    int nthreads = o.threads > 0 ? o.threads : (int)std::max(1u, std::thread::hardware_concurrency());
    nthreads = (int)std::min<int64_t>(nthreads, queries.n);
    std::vector<std::thread> pool;
    for (int t = 0; t < nthreads; t++) {
        pool.emplace_back([&, t] {
            for (int64_t q = t; q < queries.n; q += nthreads)
                knn_one(metric, base, norms, queries.row(q), k, &result[(size_t)q * k]);
        });
    }
    for (auto &th : pool) th.join();

    std::vector<int32_t> ids(result.size());
    for (size_t i = 0; i < result.size(); i++) ids[i] = result[i].second;
    if (!vecio::write_ivecs(o.out, ids, k, queries.n, &err)) {
        std::fprintf(stderr, "gpuivf_gt: %s\n", err.c_str());
        return 1;
    }
    if (!o.dist_out.empty()) {
        vecio::VectorWriter w;
        if (!w.open(o.dist_out, vecio::Format::Fvecs, k, &err)) {
            std::fprintf(stderr, "gpuivf_gt: %s\n", err.c_str());
            return 1;
        }
        std::vector<float> row(k);
        for (int64_t q = 0; q < queries.n; q++) {
            for (int j = 0; j < k; j++) row[j] = (float)result[(size_t)q * k + j].first;
            w.write(q, row.data());
        }
        if (!w.close(&err)) {
            std::fprintf(stderr, "gpuivf_gt: %s\n", err.c_str());
            return 1;
        }
    }
    return 0;
}
