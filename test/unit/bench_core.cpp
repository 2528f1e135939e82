// bench_core — micro-benchmarks of the CPU engine on generated clustered
// data (100k x 128 by default): k-means training, PQ training, encoding, the
// ADC scan, look-up tables and exact distances.  Not run by ctest:
//   build/test/unit/bench_core [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "gpuivf_core.h"

using namespace gpuivf;

namespace {

constexpr int kDims = 128;
constexpr int64_t kRows = 100000;

// Clustered data shaped like real embeddings (decaying spectrum, overlapping
// clusters of Zipf-like sizes, a random rotation): see ../shared/data/README.md.
std::vector<float> clustered_data(int64_t n, int d, uint32_t seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> uniform(0.5f, 1.5f);
    // Random rotation by Gram-Schmidt on a Gaussian matrix.
    std::vector<double> rot(static_cast<size_t>(d) * d);
    for (double &v : rot) v = normal(gen);
    for (int i = 0; i < d; i++) {
        for (int j = 0; j < i; j++) {
            double dot = 0;
            for (int t = 0; t < d; t++) dot += rot[i * d + t] * rot[j * d + t];
            for (int t = 0; t < d; t++) rot[i * d + t] -= dot * rot[j * d + t];
        }
        double norm = 0;
        for (int t = 0; t < d; t++) norm += rot[i * d + t] * rot[i * d + t];
        for (int t = 0; t < d; t++) rot[i * d + t] /= std::sqrt(norm);
    }
    const int clusters = static_cast<int>(std::max<int64_t>(1, n / 100));
    std::vector<float> scale(d), centres(static_cast<size_t>(clusters) * d), spread(clusters);
    for (int t = 0; t < d; t++) scale[t] = 1.0f / std::sqrt(static_cast<float>(t + 1));
    for (int c = 0; c < clusters; c++) {
        for (int t = 0; t < d; t++) centres[c * d + t] = 1.5f * scale[t] * normal(gen);
        spread[c] = uniform(gen);
    }
    // Zipf-like sizes: cluster c drawn with weight 1 / (c + 1).
    std::vector<double> cdf(clusters);
    double total = 0;
    for (int c = 0; c < clusters; c++) cdf[c] = (total += 1.0 / (c + 1));
    std::uniform_real_distribution<double> pick(0.0, total);
    std::vector<float> raw(d), x(static_cast<size_t>(n) * d);
    for (int64_t i = 0; i < n; i++) {
        int c = static_cast<int>(std::lower_bound(cdf.begin(), cdf.end(), pick(gen)) - cdf.begin());
        for (int t = 0; t < d; t++) raw[t] = centres[c * d + t] + spread[c] * scale[t] * normal(gen);
        for (int t = 0; t < d; t++) {
            double s = 0;
            for (int u = 0; u < d; u++) s += rot[t * d + u] * raw[u];
            x[i * d + t] = static_cast<float>(s);
        }
    }
    return x;
}

const std::vector<float> &data() {
    static const std::vector<float> x = clustered_data(kRows, kDims, 1);
    return x;
}

// A trained model on data(): 316 lists (auto_lists of 316k rows' worth), m = 32.
struct Model {
    std::vector<float> centroids, norms, codebook;
    std::vector<int32_t> lists;
    std::vector<uint8_t> codes;
    IvfPqModel model;
};
const Model &model(int nbits) {
    static Model models[2];
    Model &md = models[nbits == 4 ? 0 : 1];
    if (!md.codes.empty()) return md;
    const int nlist = 316, m = 32;
    const auto &x = data();
    md.centroids.resize(nlist * kDims);
    kmeans_train(x.data(), kRows, kDims, nlist, kmeans_default_params(), md.centroids.data(), nullptr);
    md.norms.resize(nlist);
    row_norms(md.centroids.data(), nlist, kDims, md.norms.data());
    md.lists.resize(kRows);
    assign_nearest(md.centroids.data(), md.norms.data(), nlist, kDims, x.data(), kRows, md.lists.data(), nullptr, nullptr);
    std::vector<float> res(x);
    for (int64_t i = 0; i < kRows; i++)
        for (int t = 0; t < kDims; t++) res[i * kDims + t] -= md.centroids[md.lists[i] * kDims + t];
    md.codebook.resize(static_cast<size_t>(m) * (1 << nbits) * (kDims / m));
    pq_train(res.data(), kRows, kDims, m, nbits, 3, md.codebook.data(), nullptr);
    md.model = IvfPqModel{Metric::L2, kDims, nlist, m, nbits, md.centroids.data(), md.norms.data(), md.codebook.data()};
    md.codes.resize(kRows * pq_code_size(m, nbits));
    ivfpq_encode(md.model, x.data(), kRows, md.lists.data(), md.codes.data(), nullptr);
    return md;
}

void BM_KMeans(benchmark::State &state) {
    const int k = static_cast<int>(state.range(0));
    const auto &x = data();
    std::vector<float> c(static_cast<size_t>(k) * kDims);
    for (auto _ : state) {
        Status s = kmeans_train(x.data(), kRows, kDims, k, kmeans_default_params(), c.data(), nullptr);
        if (!ok(s)) state.SkipWithError(s.message);
    }
    state.SetLabel("100k x 128, 20 iterations, sample 256/centroid");
}
BENCHMARK(BM_KMeans)->Arg(316)->Unit(benchmark::kMillisecond)->Iterations(1);

void BM_PqTrain(benchmark::State &state) {
    const int nbits = static_cast<int>(state.range(0));
    const int m = 32;
    const auto &x = data();
    std::vector<float> cb(m * (1 << nbits) * (kDims / m));
    for (auto _ : state) pq_train(x.data(), kRows, kDims, m, nbits, 1, cb.data(), nullptr);
    // Quality: mean squared reconstruction error relative to the data's energy.
    const int64_t check = 20000;
    std::vector<uint8_t> codes(check * pq_code_size(m, nbits));
    std::vector<float> y(check * kDims);
    pq_encode(cb.data(), kDims, m, nbits, x.data(), check, codes.data());
    pq_decode(cb.data(), kDims, m, nbits, codes.data(), check, y.data());
    double err = 0, energy = 0;
    for (int64_t i = 0; i < check * kDims; i++) {
        err += (x[i] - y[i]) * static_cast<double>(x[i] - y[i]);
        energy += x[i] * static_cast<double>(x[i]);
    }
    state.counters["rel_mse"] = err / energy;
    state.SetLabel("m=32");
}
BENCHMARK(BM_PqTrain)->Arg(8)->Arg(4)->Unit(benchmark::kMillisecond)->Iterations(1);

void BM_IvfPqEncode(benchmark::State &state) {
    const Model &md = model(static_cast<int>(state.range(0)));
    const auto &x = data();
    std::vector<int32_t> lists(kRows);
    std::vector<uint8_t> codes(md.codes.size());
    for (auto _ : state) ivfpq_encode(md.model, x.data(), kRows, lists.data(), codes.data(), nullptr);
    state.SetItemsProcessed(state.iterations() * kRows);
}
BENCHMARK(BM_IvfPqEncode)->Arg(8)->Arg(4)->Unit(benchmark::kMillisecond);

// ADC scan of 100k codes (one long list) into a heap of 200 candidates.
void BM_AdcScan(benchmark::State &state) {
    const int nbits = static_cast<int>(state.range(0));
    const Model &md = model(nbits);
    std::vector<float> lut(ivfpq_lut_size(md.model));
    float bias;
    ivfpq_build_lut(md.model, data().data() + 7 * kDims, md.lists[7], lut.data(), &bias);
    std::vector<uint64_t> ids(kRows);
    for (int64_t i = 0; i < kRows; i++) ids[i] = i;
    std::vector<float> hv(200);
    std::vector<uint64_t> hi(200);
    for (auto _ : state) {
        TopK top;
        topk_init(&top, hv.data(), hi.data(), 200);
        ivfpq_adc_scan(md.model, lut.data(), bias, md.codes.data(), ids.data(), kRows, &top);
        benchmark::DoNotOptimize(top.size);
    }
    state.SetItemsProcessed(state.iterations() * kRows);
    state.SetLabel("codes, m=32");
}
BENCHMARK(BM_AdcScan)->Arg(8)->Arg(4);

void BM_BuildLut(benchmark::State &state) {
    const Model &md = model(static_cast<int>(state.range(0)));
    std::vector<float> lut(ivfpq_lut_size(md.model));
    float bias;
    int list = 0;
    for (auto _ : state) {
        ivfpq_build_lut(md.model, data().data(), list, lut.data(), &bias);
        list = (list + 1) % md.model.nlist;
        benchmark::DoNotOptimize(lut.data());
    }
    state.SetItemsProcessed(state.iterations());
    state.SetLabel("tables, m=32");
}
BENCHMARK(BM_BuildLut)->Arg(8)->Arg(4);

void BM_ProbeLists(benchmark::State &state) {
    const Model &md = model(8);
    int32_t lists[18];
    float scores[18];
    for (auto _ : state) {
        ivfpq_probe_lists(md.model, data().data() + 3 * kDims, 18, lists, scores);
        benchmark::DoNotOptimize(lists[0]);
    }
    state.SetLabel("316 lists, nprobe 18");
}
BENCHMARK(BM_ProbeLists);

void BM_L2Squared(benchmark::State &state) {
    const auto &x = data();
    int64_t i = 0;
    float sink = 0;
    for (auto _ : state) {
        sink += l2_squared(x.data() + (i % 1000) * kDims, x.data() + ((i + 1) % 1000) * kDims, kDims);
        i++;
    }
    benchmark::DoNotOptimize(sink);
    state.SetItemsProcessed(state.iterations());
    state.SetLabel("d=128");
}
BENCHMARK(BM_L2Squared);

void BM_ExactKnn(benchmark::State &state) {
    const auto &x = data();
    const int nq = static_cast<int>(state.range(0));
    std::vector<float> vals(nq * 10);
    std::vector<uint64_t> ids(nq * 10);
    for (auto _ : state)
        exact_knn(Metric::L2, x.data(), kRows, x.data(), nq, kDims, 10, vals.data(), ids.data(), nullptr);
    state.SetItemsProcessed(state.iterations() * nq);
    state.SetLabel("queries over 100k x 128, k=10");
}
BENCHMARK(BM_ExactKnn)->Arg(100)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char **argv) {
    init_blas_single_threaded();
    data();  // generate once, outside every timing
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
