/*
 * gpuivf_bench — the GPU engine's benchmark (run on the device machine, not
 * by ctest).  Measures, with medians of repeated runs after a warm-up:
 *   copy    device-to-device copy bandwidth (bytes read + written): the ceiling
 *   select  k = 100 over 10,000 x 128,000 fp32: GB/s and % of copy bandwidth
 *   knn     1M x 128 base, 10,000 queries, k = 100: GEMM tiles alone, with the
 *           fused selection (GEMM scores), with the exact re-score
 *   ivfpq   1M x 128 clustered (the realistic recipe of shared/data/README),
 *           1024 lists, pq_m 32, nprobe 32, 10,000 queries, k = 10: QPS and
 *           recall@10 against exact ground truth
 *   train   k-means 1M x 128 -> 1024 centroids, 20 iterations; PQ codebooks;
 *           encoding of 1M vectors
 *   large   the GPU worker's calls on a 5M x 768 halfvec-sized index (large_*;
 *           --large-only runs these alone)
 * Writes results.json and the IVF-PQ model/codes/queries/ground truth (for the
 * PyTorch baseline, torch_baseline.py) into the output directory.
 *
 * usage: gpuivf_bench [--out DIR] [--quick] [--select-only | --knn-only | --ivfpq-only | --worker-only |
 *                      --large-only]
 */
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gpuivf_cuda.h"
#include "knn.h"
#include "resources.h"

namespace {

#define CHECK_CUDA(x)                                                                            \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(1);                                                                        \
        }                                                                                        \
    } while (0)
#define CHECK_GPU(x)                                                                             \
    do {                                                                                         \
        gpuivf_cuda_status s_ = (x);                                                             \
        if (s_.code != GPUIVF_CUDA_OK) {                                                         \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, s_.message);         \
            std::exit(1);                                                                        \
        }                                                                                        \
    } while (0)

double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/* Median wall time of `reps` runs of a synchronous call, after one warm-up. */
double median_ms(int reps, const std::function<void()> &fn) {
    fn();
    std::vector<double> t;
    for (int i = 0; i < reps; i++) {
        const double t0 = now_ms();
        fn();
        CHECK_CUDA(cudaDeviceSynchronize());
        t.push_back(now_ms() - t0);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
__device__ __forceinline__ float uniform01(uint64_t seed, uint64_t i) {
    return (static_cast<float>(mix64(seed * 0x9e3779b97f4a7c15ULL + i) >> 40) + 0.5f) * (1.0f / 16777216.0f);
}
__device__ __forceinline__ float gaussian(uint64_t seed, uint64_t i) {
    const float u1 = uniform01(seed, 2 * i), u2 = uniform01(seed, 2 * i + 1);
    return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

__global__ void fill_uniform(float *x, int64_t n, uint64_t seed) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        x[i] = uniform01(seed, i);
}

/* Pre-rotation points: centre_pre[c] + spread[c] * scale[t] * N(0, 1). */
__global__ void mixture_points(float *z, int64_t n, int d, const int32_t *cluster, const float *centres,
                               const float *spread, uint64_t seed) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n * d;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t row = i / d;
        const int t = static_cast<int>(i - row * d);
        const int c = cluster[row];
        const float scale = rsqrtf(static_cast<float>(t + 1));
        z[i] = centres[static_cast<int64_t>(c) * d + t] + spread[c] * scale * gaussian(seed, i);
    }
}

/*
 * The realistic generator of shared/data/README.md: a fixed random rotation,
 * component scales (i+1)^-0.5, about N/100 clusters with centres drawn with
 * the same scales x 1.5, Zipf-like cluster sizes (weights (j+1)^-0.5),
 * per-cluster spread uniform in [0.5, 1.5]; queries from the same mixture.
 */
struct Mixture {
    int d;
    std::vector<float> rotation;     /* d x d orthonormal */
    std::vector<float> centres;      /* pre-rotation */
    std::vector<float> spread;
    std::vector<double> cumulative;  /* cluster sampling */
};

Mixture make_mixture(int64_t n, int d, uint64_t seed) {
    Mixture mx;
    mx.d = d;
    std::mt19937_64 gen(seed);
    std::normal_distribution<double> g(0.0, 1.0);
    std::uniform_real_distribution<double> u(0.5, 1.5);
    /* Gram-Schmidt on a Gaussian matrix. */
    std::vector<double> r(static_cast<size_t>(d) * d);
    for (double &v : r) v = g(gen);
    for (int i = 0; i < d; i++) {
        for (int j = 0; j < i; j++) {
            double dot = 0;
            for (int t = 0; t < d; t++) dot += r[i * d + t] * r[j * d + t];
            for (int t = 0; t < d; t++) r[i * d + t] -= dot * r[j * d + t];
        }
        double nrm = 0;
        for (int t = 0; t < d; t++) nrm += r[i * d + t] * r[i * d + t];
        nrm = std::sqrt(nrm);
        for (int t = 0; t < d; t++) r[i * d + t] /= nrm;
    }
    mx.rotation.assign(r.begin(), r.end());
    const int clusters = static_cast<int>(std::max<int64_t>(1, n / 100));
    mx.centres.resize(static_cast<size_t>(clusters) * d);
    for (int c = 0; c < clusters; c++)
        for (int t = 0; t < d; t++) mx.centres[c * d + t] = static_cast<float>(1.5 * g(gen) / std::sqrt(t + 1.0));
    mx.spread.resize(clusters);
    for (float &s : mx.spread) s = static_cast<float>(u(gen));
    mx.cumulative.resize(clusters);
    double acc = 0;
    for (int c = 0; c < clusters; c++) mx.cumulative[c] = (acc += 1.0 / std::sqrt(c + 1.0));
    for (double &v : mx.cumulative) v /= acc;
    return mx;
}

/* n points of the mixture into device memory (n x d). */
void sample_mixture(const Mixture &mx, int64_t n, uint64_t seed, cublasHandle_t blas, float *out) {
    const int d = mx.d;
    std::mt19937_64 gen(seed);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::vector<int32_t> cluster(n);
    for (int64_t i = 0; i < n; i++)
        cluster[i] = static_cast<int32_t>(std::lower_bound(mx.cumulative.begin(), mx.cumulative.end(), u(gen)) -
                                          mx.cumulative.begin());
    int32_t *dc;
    float *dcent, *dspread, *drot, *dz;
    CHECK_CUDA(cudaMalloc(&dc, sizeof(int32_t) * n));
    CHECK_CUDA(cudaMalloc(&dcent, sizeof(float) * mx.centres.size()));
    CHECK_CUDA(cudaMalloc(&dspread, sizeof(float) * mx.spread.size()));
    CHECK_CUDA(cudaMalloc(&drot, sizeof(float) * d * d));
    CHECK_CUDA(cudaMalloc(&dz, sizeof(float) * n * d));
    CHECK_CUDA(cudaMemcpy(dc, cluster.data(), sizeof(int32_t) * n, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dcent, mx.centres.data(), sizeof(float) * mx.centres.size(), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dspread, mx.spread.data(), sizeof(float) * mx.spread.size(), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(drot, mx.rotation.data(), sizeof(float) * d * d, cudaMemcpyHostToDevice));
    mixture_points<<<4096, 256>>>(dz, n, d, dc, dcent, dspread, seed);
    CHECK_CUDA(cudaGetLastError());
    /* out (row-major n x d) = z R^T: column-major out^T (d x n) = R (d x d) z^T. */
    const float one = 1.0f, zero = 0.0f;
    cublasSetStream(blas, 0);
    if (cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, d, static_cast<int>(n), d, &one, drot, d, dz, d, &zero, out, d) !=
        CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "cublasSgemm failed\n");
        std::exit(1);
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    for (void *p : {static_cast<void *>(dc), static_cast<void *>(dcent), static_cast<void *>(dspread),
                    static_cast<void *>(drot), static_cast<void *>(dz)})
        cudaFree(p);
}

struct Results {
    std::vector<std::pair<std::string, double>> v;
    void add(const std::string &k, double x) {
        v.push_back({k, x});
        std::printf("  %-40s %14.4f\n", k.c_str(), x);
        std::fflush(stdout);
    }
    void write(const std::string &path) const {
        FILE *f = std::fopen(path.c_str(), "w");
        if (!f) return;
        std::fprintf(f, "{\n");
        for (size_t i = 0; i < v.size(); i++)
            std::fprintf(f, "  \"%s\": %.6f%s\n", v[i].first.c_str(), v[i].second, i + 1 < v.size() ? "," : "");
        std::fprintf(f, "}\n");
        std::fclose(f);
    }
};

/*
 * The GPU worker's throughput without PostgreSQL: ns resources objects (the
 * worker's search streams) kept busy, each restarted with the next batch of
 * b queries as soon as its search is answered, oldest first, as
 * GpuivfFinishSearches does; start(s, seq) starts batch seq on stream s.
 * Every stream records its graph once first.  Queries a second over about
 * `seconds`.
 */
double closed_loop_qps(const std::vector<gpuivf_cuda_resources *> &streams, int ns, int64_t b, double seconds,
                       const std::function<void(int, int64_t)> &start) {
    for (int s = 0; s < ns; s++) {
        start(s, s);
        CHECK_GPU(gpuivf_cuda_search_wait(streams[s]));
    }
    int64_t seq = 0, answered = 0;
    for (int s = 0; s < ns; s++) start(s, seq++);
    const auto t0 = std::chrono::steady_clock::now();
    double el = 0.0;
    for (int s = 0;; s = (s + 1) % ns) {
        CHECK_GPU(gpuivf_cuda_search_wait(streams[s]));
        answered += b;
        el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (el > seconds) break;
        start(s, seq++);
    }
    for (int s = 0; s < ns; s++) CHECK_GPU(gpuivf_cuda_search_wait(streams[s]));
    return answered / el;
}

__global__ void fill_half(uint16_t *x, int64_t n, uint64_t seed) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        x[i] = __half_as_ushort(__float2half_rn(gaussian(seed, i)));
}

/*
 * The GPU worker's calls at the scale of the 768-dimension goal: a synthetic
 * IVF-PQ index (L2) of 5M x 768 (--quick: 1M), pq_m 96, 2,236 lists of equal
 * size, 43 probes, half-precision vectors for the re-rank (pgvector's
 * halfvec), random codebook and codes, queries near centroids; k 10 with R
 * candidates re-ranked (the calibration chose 800 at 43 probes for the
 * 5M x 768 table of test/bench/scale_on_gpu.sh).  What it measures:
 *   large_r{R}_b{B}[_mpb{P}|_auto]_us   one call of B queries (median of 15)
 *   large_tput_r{R}_s{S}_b{B}[...]_qps  S searches in flight, each restarted
 *                                       with a new batch of B as soon as it is
 *                                       answered (the worker's closed loop)
 * GPUIVF_BENCH_PROFILE_LARGE=1: one more call of 4 queries, 800 candidates,
 * per-list tables, inside a profiler range (ncu --profile-from-start off).
 */
void bench_worker_large(gpuivf_cuda_resources *res, bool quick, Results &R) {
    const int64_t n = quick ? 1000000 : 5000000;
    const int d = 768, m = 96, nlist = quick ? 1000 : 2236, nprobe = 43, k = 10;
    const int64_t nq = 1024;
    std::mt19937_64 gen(43);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> cent(static_cast<size_t>(nlist) * d), cb(static_cast<size_t>(m) * 256 * (d / m));
    for (float &x : cent) x = g(gen);
    for (float &x : cb) x = 0.3f * g(gen);
    std::vector<uint64_t> words(static_cast<size_t>((n * m + 7) / 8));
    for (uint64_t &w : words) w = gen();
    std::vector<int32_t> lists(n);
    std::vector<uint64_t> ids(n);
    for (int64_t i = 0; i < n; i++) {
        lists[i] = static_cast<int32_t>(i % nlist);
        ids[i] = static_cast<uint64_t>(i);
    }
    std::vector<float> q(static_cast<size_t>(nq) * d);
    for (int64_t i = 0; i < nq; i++) {
        const int64_t c = static_cast<int64_t>(gen() % nlist);
        for (int t = 0; t < d; t++) q[i * d + t] = cent[c * d + t] + 0.5f * g(gen);
    }
    uint16_t *vec;
    CHECK_CUDA(cudaMalloc(&vec, sizeof(uint16_t) * n * d));
    fill_half<<<4096, 256>>>(vec, n * d, 47);
    CHECK_CUDA(cudaDeviceSynchronize());
    gpuivf_cuda_model model{1, d, nlist, m, 8, cent.data(), cb.data()};
    gpuivf_cuda_index *ix;
    const double t0 = now_ms();
    CHECK_GPU(gpuivf_cuda_index_create(res, &model, GPUIVF_CUDA_VECTORS_FLOAT16, &ix));
    CHECK_GPU(gpuivf_cuda_index_add_encoded(res, ix, n, lists.data(), reinterpret_cast<const uint8_t *>(words.data()),
                                            ids.data(), vec));
    CHECK_CUDA(cudaFree(vec));
    R.add("large_index_load_s", (now_ms() - t0) / 1000.0);

    std::vector<int32_t> hk(nq, k), hnp(nq, nprobe);
    const int kStreams = 16;
    std::vector<gpuivf_cuda_resources *> streams{res};
    for (int s = 1; s < kStreams; s++) {
        gpuivf_cuda_resources *r2 = nullptr;
        CHECK_GPU(gpuivf_cuda_resources_create(0, int64_t(256) << 20, &r2));
        streams.push_back(r2);
    }
    std::vector<std::vector<double>> sd(kStreams, std::vector<double>(static_cast<size_t>(nq) * k));
    std::vector<std::vector<uint64_t>> si(kStreams, std::vector<uint64_t>(static_cast<size_t>(nq) * k));
    auto params = [&](int rr, int mpb, bool per_list) {
        gpuivf_cuda_search_params sp{k, nprobe, rr, per_list ? GPUIVF_CUDA_LUT_PER_LIST : GPUIVF_CUDA_LUT_AUTO,
                                     hk.data(), hnp.data()};
        sp.min_probes_per_block = mpb;
        sp.host_arrays = 1; /* as the worker */
        return sp;
    };
    auto suffix = [](int mpb, bool per_list) {
        return (mpb ? "_mpb" + std::to_string(mpb) : std::string()) + (per_list ? "" : "_auto");
    };
    auto latency = [&](int rr, int64_t b, int mpb, bool per_list) {
        const gpuivf_cuda_search_params sp = params(rr, mpb, per_list);
        int64_t call = 0; /* other queries each call */
        const double ms = median_ms(15, [&] {
            const int64_t q0 = (call++ * b) % (nq - b + 1);
            CHECK_GPU(gpuivf_cuda_index_search(res, ix, q.data() + q0 * d, b, &sp, sd[0].data(), si[0].data()));
        });
        R.add("large_r" + std::to_string(rr) + "_b" + std::to_string(b) + suffix(mpb, per_list) + "_us", ms * 1000.0);
    };
    auto throughput = [&](int rr, int ns, int64_t b, int mpb, bool per_list) {
        const gpuivf_cuda_search_params sp = params(rr, mpb, per_list);
        auto start = [&](int s, int64_t seq) {
            const int64_t q0 = (seq * b) % (nq - b + 1);
            CHECK_GPU(gpuivf_cuda_index_search_async(streams[s], ix, q.data() + q0 * d, b, &sp, sd[s].data(),
                                                     si[s].data()));
        };
        R.add("large_tput_r" + std::to_string(rr) + "_s" + std::to_string(ns) + "_b" + std::to_string(b) +
                  suffix(mpb, per_list) + "_qps",
              closed_loop_qps(streams, ns, b, 0.4, start));
    };
    for (int rr : {200, 400, 800})
        for (int64_t b : {1, 4, 8}) latency(rr, b, 0, true);
    for (int mpb : {2, 5, 8})
        for (int64_t b : {1, 4}) latency(800, b, mpb, true);
    latency(800, 4, 0, false);
    for (int rr : {200, 800}) throughput(rr, kStreams, 4, 0, true);
    for (int mpb : {2, 5, 8}) throughput(800, kStreams, 4, mpb, true);
    throughput(800, kStreams, 4, 0, false);
    throughput(800, 4, 4, 0, true);
    throughput(800, kStreams, 8, 0, true);
    if (std::getenv("GPUIVF_BENCH_PROFILE_LARGE")) {
        for (int mpb : {0, 5}) {
            const gpuivf_cuda_search_params sp = params(800, mpb, true);
            CHECK_CUDA(cudaProfilerStart());
            CHECK_GPU(gpuivf_cuda_index_search(res, ix, q.data(), 4, &sp, sd[0].data(), si[0].data()));
            CHECK_CUDA(cudaProfilerStop());
        }
    }
    for (size_t s = 1; s < streams.size(); s++) CHECK_GPU(gpuivf_cuda_resources_destroy(streams[s]));
    CHECK_GPU(gpuivf_cuda_index_destroy(ix));
}

template <typename T>
void dump(const std::string &path, const T *dev_or_host, size_t count, bool device) {
    std::vector<T> h(count);
    if (device)
        CHECK_CUDA(cudaMemcpy(h.data(), dev_or_host, sizeof(T) * count, cudaMemcpyDeviceToHost));
    else
        std::copy(dev_or_host, dev_or_host + count, h.begin());
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f) {
        std::fprintf(stderr, "cannot write %s\n", path.c_str());
        std::exit(1);
    }
    std::fwrite(h.data(), sizeof(T), count, f);
    std::fclose(f);
}

}  // namespace

int main(int argc, char **argv) {
    std::string out = ".";
    bool quick = false, select_only = false, knn_only = false, ivfpq_only = false, worker_only = false,
         large_only = false;
    for (int i = 1; i < argc; i++) {
        if (!std::strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        if (!std::strcmp(argv[i], "--quick")) quick = true;
        if (!std::strcmp(argv[i], "--select-only")) select_only = true;
        if (!std::strcmp(argv[i], "--knn-only")) knn_only = true;
        if (!std::strcmp(argv[i], "--ivfpq-only")) ivfpq_only = true; /* for profilers */
        if (!std::strcmp(argv[i], "--worker-only")) ivfpq_only = worker_only = true;
        if (!std::strcmp(argv[i], "--large-only")) large_only = true;
    }
    int32_t ndev = 0;
    CHECK_GPU(gpuivf_cuda_device_count(&ndev));
    if (ndev == 0) {
        std::printf("skipped: no CUDA device\n");
        return 0;
    }
    gpuivf_cuda_resources *res = nullptr;
    CHECK_GPU(gpuivf_cuda_resources_create(0, int64_t(4) << 30, &res));
    gpuivf_cuda_device_info info;
    CHECK_GPU(gpuivf_cuda_get_device_info(res, &info));
    std::printf("device: %s, %d SMs, %.1f GiB\n", info.name, info.multiprocessors, info.total_memory / 1073741824.0);
    Results R;
    cublasHandle_t blas;
    cublasCreate(&blas);
    const int reps = quick ? 3 : 7;
    if (large_only) {
        bench_worker_large(res, quick, R);
        R.write(out + "/results.json");
        cublasDestroy(blas);
        CHECK_GPU(gpuivf_cuda_resources_destroy(res));
        return 0;
    }

    /* ---------------------------------------------------------- copy */
    {
        const size_t bytes = size_t(4) << 30;
        void *a, *b;
        CHECK_CUDA(cudaMalloc(&a, bytes));
        CHECK_CUDA(cudaMalloc(&b, bytes));
        CHECK_CUDA(cudaMemset(a, 1, bytes));
        const double ms = median_ms(reps, [&] { CHECK_CUDA(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice)); });
        R.add("copy_GBps", 2.0 * bytes / ms / 1e6);
        cudaFree(a);
        cudaFree(b);
    }
    const double copy_gbps = R.v.back().second;

    /* -------------------------------------------------------- select */
    if (!ivfpq_only && !knn_only) {
        const int64_t rows = 10000, cols = 128000;
        float *x;
        float *vals;
        uint64_t *ids;
        CHECK_CUDA(cudaMalloc(&x, sizeof(float) * rows * cols));
        CHECK_CUDA(cudaMalloc(&vals, sizeof(float) * rows * 1024));
        CHECK_CUDA(cudaMalloc(&ids, sizeof(uint64_t) * rows * 1024));
        fill_uniform<<<8192, 256>>>(x, rows * cols, 42);
        CHECK_CUDA(cudaDeviceSynchronize());
        for (int k : {100, 10, 1000}) {
            if (quick && k != 100) continue;
            const double ms = median_ms(reps, [&] {
                CHECK_GPU(gpuivf_cuda_select_k(res, x, rows, cols, cols, nullptr, k, 0, vals, ids));
            });
            const double gbps = 4.0 * rows * cols / ms / 1e6;
            R.add("select_k" + std::to_string(k) + "_ms", ms);
            R.add("select_k" + std::to_string(k) + "_GBps", gbps);
            R.add("select_k" + std::to_string(k) + "_pct_copy", 100.0 * gbps / copy_gbps);
        }
        cudaFree(x);
        cudaFree(vals);
        cudaFree(ids);
    }

    if (select_only) {
        CHECK_GPU(gpuivf_cuda_resources_destroy(res));
        return 0;
    }

    /* ----------------------------------------------------------- knn */
    if (!ivfpq_only) {
        const int64_t n = 1000000, nq = 10000;
        const int d = 128, k = 100;
        float *base, *q, *scores;
        uint64_t *ids;
        CHECK_CUDA(cudaMalloc(&base, sizeof(float) * n * d));
        CHECK_CUDA(cudaMalloc(&q, sizeof(float) * nq * d));
        CHECK_CUDA(cudaMalloc(&scores, sizeof(float) * nq * k));
        CHECK_CUDA(cudaMalloc(&ids, sizeof(uint64_t) * nq * k));
        fill_uniform<<<8192, 256>>>(base, n * d, 1);
        fill_uniform<<<8192, 256>>>(q, nq * d, 2);
        CHECK_CUDA(cudaDeviceSynchronize());
        gpuivf_cuda::KnnOptions gemm;
        gemm.gemm_only = true;
        gemm.exact_rescore = false;
        const double t_gemm = median_ms(reps, [&] {
            gpuivf_cuda::exact_knn(*res, gpuivf_cuda::Metric::L2, base, n, q, nq, d, k, gemm, scores, ids);
            gpuivf_cuda::sync(*res);
        });
        const double t_sel = median_ms(reps, [&] {
            CHECK_GPU(gpuivf_cuda_exact_knn(res, 1, base, n, q, nq, d, k, GPUIVF_CUDA_KNN_GEMM_SCORES, scores, ids));
        });
        const double t_exact = median_ms(reps, [&] {
            CHECK_GPU(gpuivf_cuda_exact_knn(res, 1, base, n, q, nq, d, k, 0, scores, ids));
        });
        R.add("knn_gemm_only_ms", t_gemm);
        R.add("knn_gemm_select_ms", t_sel);
        R.add("knn_exact_rescore_ms", t_exact);
        R.add("knn_select_overhead_pct", 100.0 * (t_sel - t_gemm) / t_gemm);
        R.add("knn_gemm_TFLOPs", 2.0 * n * nq * d / t_gemm / 1e9);
        cudaFree(base);
        cudaFree(q);
        cudaFree(scores);
        cudaFree(ids);
    }

    /* --------------------------------------------- IVF-PQ + training */
    if (!knn_only) {
        const int64_t n = quick ? 200000 : 1000000, nq = 10000;
        const int d = 128, nlist = 1024, m = 32, k = 10, nprobe = 32;
        const Mixture mx = make_mixture(n, d, 7);
        float *base, *q;
        CHECK_CUDA(cudaMalloc(&base, sizeof(float) * n * d));
        CHECK_CUDA(cudaMalloc(&q, sizeof(float) * nq * d));
        sample_mixture(mx, n, 11, blas, base);
        sample_mixture(mx, nq, 12, blas, q);

        /* k-means on all 1M points (no subsampling), 20 iterations. */
        float *cent, *cb;
        CHECK_CUDA(cudaMalloc(&cent, sizeof(float) * nlist * d));
        CHECK_CUDA(cudaMalloc(&cb, sizeof(float) * m * 256 * (d / m)));
        gpuivf_cuda_kmeans_params kp = gpuivf_cuda_kmeans_default_params();
        kp.max_points_per_centroid = 0;
        kp.niter = 20;
        double t0 = now_ms();
        CHECK_GPU(gpuivf_cuda_kmeans(res, base, n, d, nlist, &kp, cent));
        R.add("kmeans_1M_1024_20it_s", (now_ms() - t0) / 1000.0);
        /* The whole model as an index build trains it (k-means on a 256 x
         * lists sample, PQ on 65,536 residuals). */
        gpuivf_cuda_kmeans_params tp = gpuivf_cuda_kmeans_default_params();
        t0 = now_ms();
        CHECK_GPU(gpuivf_cuda_ivfpq_train(res, 1, base, n, d, nlist, m, 8, &tp, cent, cb));
        R.add("ivfpq_train_default_s", (now_ms() - t0) / 1000.0);
        gpuivf_cuda_model model{1, d, nlist, m, 8, cent, cb};
        int32_t *lists;
        uint8_t *codes;
        CHECK_CUDA(cudaMalloc(&lists, sizeof(int32_t) * n));
        CHECK_CUDA(cudaMalloc(&codes, n * m));
        const double t_enc = median_ms(quick ? 1 : 3, [&] {
            CHECK_GPU(gpuivf_cuda_ivfpq_encode(res, &model, base, n, lists, codes));
        });
        R.add("encode_1M_s", t_enc / 1000.0);

        gpuivf_cuda_index *ix;
        CHECK_GPU(gpuivf_cuda_index_create(res, &model, 1, &ix));
        std::vector<uint64_t> hid(n);
        for (int64_t i = 0; i < n; i++) hid[i] = i;
        uint64_t *did;
        CHECK_CUDA(cudaMalloc(&did, sizeof(uint64_t) * n));
        CHECK_CUDA(cudaMemcpy(did, hid.data(), sizeof(uint64_t) * n, cudaMemcpyHostToDevice));
        t0 = now_ms();
        CHECK_GPU(gpuivf_cuda_index_add_encoded(res, ix, n, lists, codes, did, base));
        R.add("index_load_s", (now_ms() - t0) / 1000.0);
        gpuivf_cuda_index_stats st;
        CHECK_GPU(gpuivf_cuda_index_get_stats(ix, &st));
        R.add("list_size_min", static_cast<double>(st.min_list));
        R.add("list_size_max", static_cast<double>(st.max_list));

        /* Ground truth. */
        float *gts;
        uint64_t *gti;
        CHECK_CUDA(cudaMalloc(&gts, sizeof(float) * nq * k));
        CHECK_CUDA(cudaMalloc(&gti, sizeof(uint64_t) * nq * k));
        CHECK_GPU(gpuivf_cuda_exact_knn(res, 1, base, n, q, nq, d, k, 0, gts, gti));
        std::vector<uint64_t> truth(nq * k);
        CHECK_CUDA(cudaMemcpy(truth.data(), gti, sizeof(uint64_t) * nq * k, cudaMemcpyDeviceToHost));

        double *dist;
        uint64_t *rid;
        CHECK_CUDA(cudaMalloc(&dist, sizeof(double) * nq * k));
        CHECK_CUDA(cudaMalloc(&rid, sizeof(uint64_t) * nq * k));
        auto recall = [&]() {
            std::vector<uint64_t> got(nq * k);
            CHECK_CUDA(cudaMemcpy(got.data(), rid, sizeof(uint64_t) * nq * k, cudaMemcpyDeviceToHost));
            int64_t hit = 0;
            for (int64_t i = 0; i < nq; i++)
                for (int j = 0; j < k; j++)
                    for (int t = 0; t < k; t++) hit += got[i * k + j] == truth[i * k + t];
            return static_cast<double>(hit) / (nq * k);
        };
        struct Variant {
            const char *name;
            int rerank, lut;
            int64_t batch;
        } variants[] = {{"ivfpq", 0, GPUIVF_CUDA_LUT_AUTO, nq},
                        {"ivfpq_perlist_lut", 0, GPUIVF_CUDA_LUT_PER_LIST, nq},
                        {"ivfpq_rerank40", 40, GPUIVF_CUDA_LUT_AUTO, nq},
                        {"ivfpq_batch100", 0, GPUIVF_CUDA_LUT_AUTO, 100}};
        for (const Variant &v : variants) {
            if (worker_only) break;
            gpuivf_cuda_search_params sp{k, nprobe, v.rerank, v.lut, nullptr, nullptr};
            const double ms = median_ms(reps, [&] {
                CHECK_GPU(gpuivf_cuda_index_search(res, ix, q, v.batch, &sp, dist, rid));
            });
            R.add(std::string(v.name) + "_ms", ms);
            R.add(std::string(v.name) + "_QPS", v.batch / ms * 1000.0);
            if (v.batch == nq) R.add(std::string(v.name) + "_recall10", recall());
        }

        /* The GPU worker's calls: host arrays in and out, per-query k and
         * nprobe, 40 candidates re-ranked, small batches (the batch is what
         * the worker drained from the queue).  Latency per call in µs. */
        {
            const int64_t bmax = std::min<int64_t>(nq, 256);
            std::vector<float> hq(static_cast<size_t>(bmax) * d);
            CHECK_CUDA(cudaMemcpy(hq.data(), q, sizeof(float) * hq.size(), cudaMemcpyDeviceToHost));
            std::vector<int32_t> hk(bmax, k), hnp(bmax, nprobe);
            std::vector<double> hd(static_cast<size_t>(bmax) * k);
            std::vector<uint64_t> hi(static_cast<size_t>(bmax) * k);
            /* candidates re-ranked: 40 here (the rows' history), 200 in the
             * throughput rows below too (gpuivf.rerank_candidates' default);
             * GPUIVF_BENCH_RERANK=200 for profiling that shape */
            const char *rr_env = std::getenv("GPUIVF_BENCH_RERANK");
            const int rr = rr_env ? std::atoi(rr_env) : 40;
            /* perlist_nograph: the same calls issued kernel by kernel
             * (search graphs off), the A/B of search_graph.cu */
            for (const char *mode : {"perlist", "perlist_nograph", "auto"}) {
                const int lut = mode[0] == 'p' ? GPUIVF_CUDA_LUT_PER_LIST : GPUIVF_CUDA_LUT_AUTO;
                CHECK_GPU(gpuivf_cuda_set_search_graphs(res, std::strcmp(mode, "perlist_nograph") ? 1 : 0));
                for (int64_t b : {1, 8, 16, 32, 64, 128, 256}) {
                    if (b > bmax) continue;
                    gpuivf_cuda_search_params sp{k, nprobe, rr, lut, hk.data(), hnp.data()};
                    const double ms = median_ms(quick ? 5 : 31, [&] {
                        CHECK_GPU(gpuivf_cuda_index_search(res, ix, hq.data(), b, &sp, hd.data(), hi.data()));
                    });
                    /* GPUIVF_BENCH_PROFILE_B=32: one more call inside a
                     * profiler range (ncu --profile-from-start off) */
                    const char *pb = std::getenv("GPUIVF_BENCH_PROFILE_B");
                    if (pb && std::atoll(pb) == b) {
                        CHECK_CUDA(cudaProfilerStart());
                        CHECK_GPU(gpuivf_cuda_index_search(res, ix, hq.data(), b, &sp, hd.data(), hi.data()));
                        CHECK_CUDA(cudaProfilerStop());
                    }
                    R.add(std::string("worker_") + mode + "_b" + std::to_string(b) + "_us", ms * 1000.0);
                }
            }
            /* A lone call with fewer, longer scan blocks (min_probes_per_block) */
            for (int mpb : {2, 4})
                for (int64_t b : {1, 8}) {
                    if (b > bmax) continue;
                    gpuivf_cuda_search_params sp{k, nprobe, rr, GPUIVF_CUDA_LUT_PER_LIST, hk.data(), hnp.data()};
                    sp.min_probes_per_block = mpb;
                    const double ms = median_ms(quick ? 5 : 31, [&] {
                        CHECK_GPU(gpuivf_cuda_index_search(res, ix, hq.data(), b, &sp, hd.data(), hi.data()));
                    });
                    R.add("worker_perlist_b" + std::to_string(b) + "_mpb" + std::to_string(mpb) + "_us", ms * 1000.0);
                }
            /* The host's share of a call: the time the worker's thread spends
             * in gpuivf_cuda_index_search_async (staging, launches) before it
             * can go back to its queue. */
            for (int64_t b : {1, 16, 64}) for (int graphs : {1, 0}) {
                if (b > bmax) continue;
                CHECK_GPU(gpuivf_cuda_set_search_graphs(res, graphs));
                gpuivf_cuda_search_params sp{k, nprobe, 40, GPUIVF_CUDA_LUT_PER_LIST, hk.data(), hnp.data()};
                std::vector<double> us;
                for (int r = 0; r < 31; r++) {
                    const auto t0 = std::chrono::steady_clock::now();
                    CHECK_GPU(gpuivf_cuda_index_search_async(res, ix, hq.data(), b, &sp, hd.data(), hi.data()));
                    const auto t1 = std::chrono::steady_clock::now();
                    CHECK_GPU(gpuivf_cuda_search_wait(res));
                    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
                }
                std::sort(us.begin(), us.end());
                R.add("worker_perlist" + std::string(graphs ? "" : "_nograph") + "_b" + std::to_string(b) +
                          "_enqueue_us",
                      us[us.size() / 2]);
            }
            CHECK_GPU(gpuivf_cuda_set_search_graphs(res, 1));

            /* The GPU worker's throughput without PostgreSQL
             * (closed_loop_qps, 0.3 s): what the GPU side can give the
             * worker at a given batch size, and how much streams overlap. */
            std::vector<gpuivf_cuda_resources *> streams{res};
            for (int s = 1; s < 8; s++) {
                gpuivf_cuda_resources *r2 = nullptr;
                CHECK_GPU(gpuivf_cuda_resources_create(0, int64_t(256) << 20, &r2));
                streams.push_back(r2);
            }
            std::vector<std::vector<double>> sd(streams.size(), std::vector<double>(hd.size()));
            std::vector<std::vector<uint64_t>> si(streams.size(), std::vector<uint64_t>(hi.size()));
            /* mpb: the search params' min_probes_per_block (0: the default) */
            auto throughput = [&](const char *mode, int ns, int64_t b, int mpb) {
                const int lut = mode[0] == 'p' ? GPUIVF_CUDA_LUT_PER_LIST : GPUIVF_CUDA_LUT_AUTO;
                const int rerank = std::strstr(mode, "r200") ? 200 : 40;
                gpuivf_cuda_search_params sp{k, nprobe, rerank, lut, hk.data(), hnp.data()};
                sp.min_probes_per_block = mpb;
                auto start = [&](int s, int64_t seq) {
                    const int64_t q0 = (seq * b) % (bmax - b + 1);
                    CHECK_GPU(gpuivf_cuda_index_search_async(streams[s], ix, hq.data() + q0 * d, b, &sp,
                                                             sd[s].data(), si[s].data()));
                };
                R.add(std::string("worker_tput_") + mode + "_s" + std::to_string(ns) + "_b" + std::to_string(b) +
                          (mpb ? "_mpb" + std::to_string(mpb) : std::string()) + "_qps",
                      closed_loop_qps(streams, ns, b, 0.3, start));
            };
            for (const char *mode : {"perlist", "perlist_r200", "auto_r200"})
                for (int ns : {2, 4, 8})
                    for (int64_t b : {4, 8, 16, 32})
                        if (b <= bmax) throughput(mode, ns, b, 0);
            /* fewer, longer scan blocks: more throughput with many streams,
             * more latency alone (gpuivf_cuda_search_params) */
            for (int mpb : {2, 4})
                for (int ns : {4, 8})
                    if (8 <= bmax) throughput("perlist_r200", ns, 8, mpb);
            for (size_t s = 1; s < streams.size(); s++) CHECK_GPU(gpuivf_cuda_resources_destroy(streams[s]));
        }

        /* Where the search time goes: the coarse quantizer alone. */
        {
            float *cs;
            uint64_t *ci;
            CHECK_CUDA(cudaMalloc(&cs, sizeof(float) * nq * nprobe));
            CHECK_CUDA(cudaMalloc(&ci, sizeof(uint64_t) * nq * nprobe));
            R.add("ivf_coarse_only_ms", median_ms(reps, [&] {
                      CHECK_GPU(gpuivf_cuda_exact_knn(res, 1, cent, nlist, q, nq, d, nprobe, 0, cs, ci));
                  }));
            cudaFree(cs);
            cudaFree(ci);
        }

        /* For the PyTorch baseline. */
        dump(out + "/ivf_queries.f32", q, static_cast<size_t>(nq) * d, true);
        dump(out + "/ivf_centroids.f32", cent, static_cast<size_t>(nlist) * d, true);
        dump(out + "/ivf_codebook.f32", cb, static_cast<size_t>(m) * 256 * (d / m), true);
        dump(out + "/ivf_codes.u8", codes, static_cast<size_t>(n) * m, true);
        dump(out + "/ivf_lists.i32", lists, static_cast<size_t>(n), true);
        dump(out + "/ivf_truth.u64", truth.data(), truth.size(), false);
        R.add("ivf_n", static_cast<double>(n));
        CHECK_GPU(gpuivf_cuda_index_destroy(ix));
        for (void *p : {static_cast<void *>(base), static_cast<void *>(q), static_cast<void *>(cent),
                        static_cast<void *>(cb), static_cast<void *>(lists), static_cast<void *>(codes),
                        static_cast<void *>(did), static_cast<void *>(gts), static_cast<void *>(gti),
                        static_cast<void *>(dist), static_cast<void *>(rid)})
            cudaFree(p);
    }
    R.write(out + "/results.json");
    cublasDestroy(blas);
    CHECK_GPU(gpuivf_cuda_resources_destroy(res));
    return 0;
}
