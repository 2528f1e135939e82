/*
 * kmeans.cu — Lloyd k-means on the GPU, for the coarse quantizer and (as a
 * batch of m small problems, one per sub-space) for the PQ codebooks.
 *
 * Assignment: the exact-kNN GEMM tiles with k = 1 for the coarse quantizer
 * (n x k x d multiply-adds: the only heavy part), a direct kernel for the
 * PQ sub-spaces (d / m is tiny, a GEMM would waste the tensor of zeros).
 * Update: atomic float sums per centroid component, then a division; empty
 * clusters are re-seeded on the host by splitting the largest cluster, as
 * src/core does.  Start: distinct random points (what Faiss does; src/core's
 * k-means++ is a sequential algorithm that would cost more than all the
 * iterations here).  Sums are atomic, so the last bits of a centroid may
 * differ between runs; the clustering does not depend on them in practice.
 */
#include <algorithm>
#include <cmath>
#include <vector>

#include "knn.h"
#include "random.h"
#include "train.h"
#include "vectors.h"

namespace gpuivf_cuda {

namespace {

/* The host side's deterministic random numbers (src/core/random.h). */
using HostRng = gpuivf::SplitMix64;
using gpuivf::sample_rows;

/* out[i] = x[rows[i]] (cols floats starting at column col0 of a row of ld). */
__global__ void gather_kernel(const float *x, int64_t ld, int col0, int cols, const int64_t *rows, int64_t count,
                              float *out, int64_t out_ld) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= count * cols) return;
    const int64_t i = t / cols;
    const int c = static_cast<int>(t - i * cols);
    out[i * out_ld + c] = x[rows[i] * ld + col0 + c];
}

/* Direct assignment for the batched small problems: point i of batch j
 * (x[i * ld + j * dsub ...]) to the nearest of k centroids cent[j][k][dsub]. */
__global__ void assign_small_kernel(const float *x, int64_t n, int64_t ld, int dsub, int k, const float *cent,
                                    int32_t *labels, int *changed) {
    extern __shared__ float sc[];
    const int j = blockIdx.y;
    const float *cj = cent + static_cast<int64_t>(j) * k * dsub;
    for (int t = threadIdx.x; t < k * dsub; t += blockDim.x) sc[t] = cj[t];
    __syncthreads();
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float *xi = x + i * ld + static_cast<int64_t>(j) * dsub;
    float best = __int_as_float(0x7f800000);
    int arg = 0;
    for (int c = 0; c < k; ++c) {
        float acc = 0.0f;
        for (int t = 0; t < dsub; ++t) {
            const float diff = xi[t] - sc[c * dsub + t];
            acc = fmaf(diff, diff, acc);
        }
        if (acc < best) {
            best = acc;
            arg = c;
        }
    }
    int32_t *lab = labels + static_cast<int64_t>(j) * n + i;
    if (*lab != arg) atomicAdd(changed, 1);
    *lab = arg;
}

__global__ void labels_from_ids_kernel(const uint64_t *ids, int64_t n, int32_t *labels, int *changed) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int32_t lab = ids[i] == UINT64_MAX ? 0 : static_cast<int32_t>(ids[i]);
    if (changed && labels[i] != lab) atomicAdd(changed, 1);
    labels[i] = lab;
}

/* sums[j][label][t] += x[i][j * dsub + t] for every element of the points. */
__global__ void accumulate_kernel(const float *x, int64_t n, int d, int dsub, int k, const int32_t *labels,
                                  float *sums, int *counts) {
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= n * d) return;
    const int64_t i = idx / d;
    const int col = static_cast<int>(idx - i * d);
    const int j = col / dsub;
    const int t = col - j * dsub;
    const int label = labels[static_cast<int64_t>(j) * n + i];
    atomicAdd(&sums[(static_cast<int64_t>(j) * k + label) * dsub + t], x[idx]);
    if (t == 0) atomicAdd(&counts[static_cast<int64_t>(j) * k + label], 1);
}

__global__ void divide_kernel(const float *sums, const int *counts, int64_t total, int dsub, float *cent) {
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    const int c = counts[idx / dsub];
    if (c > 0) cent[idx] = sums[idx] / static_cast<float>(c);
}

unsigned blocks_for(int64_t total, int threads) { return static_cast<unsigned>(ceil_div(total, threads)); }

/* a = src + delta, b = src - delta (the split of src src/core does). */
void perturb_pair(const float *src, float *a, float *b, int d, float scale, HostRng &rng) {
    const float eps = 1.0f / 1024.0f;
    for (int t = 0; t < d; t++) {
        const float base = src[t];
        const float delta = eps * (std::fabs(base) + scale) * ((rng.next() >> 63) ? 1.0f : -1.0f);
        if (a) a[t] = base + delta;
        if (b) b[t] = base - delta;
    }
}

/* Re-seed the empty clusters of every batch; returns how many there were. */
int split_empty(Resources &res, int batches, int k, int dsub, float *cent_dev, const int *counts_dev, float scale,
                HostRng &rng) {
    std::vector<int> counts(static_cast<size_t>(batches) * k);
    copy_to_host_sync(res, counts.data(), counts_dev, static_cast<int64_t>(counts.size()));
    int empty = 0;
    for (int c : counts) empty += c == 0;
    if (empty == 0) return 0;
    std::vector<float> cent(static_cast<size_t>(batches) * k * dsub);
    copy_to_host_sync(res, cent.data(), cent_dev, static_cast<int64_t>(cent.size()));
    for (int b = 0; b < batches; b++) {
        int *cb = &counts[static_cast<size_t>(b) * k];
        float *cc = &cent[static_cast<size_t>(b) * k * dsub];
        for (int j = 0; j < k; j++) {
            if (cb[j] != 0) continue;
            int big = 0;
            for (int c = 1; c < k; c++)
                if (cb[c] > cb[big]) big = c;
            perturb_pair(cc + static_cast<size_t>(big) * dsub, cc + static_cast<size_t>(j) * dsub,
                         cc + static_cast<size_t>(big) * dsub, dsub, scale, rng);
            cb[j] = cb[big] / 2;
            cb[big] -= cb[j];
        }
    }
    copy_to_device(res, cent_dev, cent.data(), static_cast<int64_t>(cent.size()));
    sync(res);
    return empty;
}

/* Root mean square of the components of the (sub)sample. */
float component_rms(Resources &res, const float *x, int64_t n, int d) {
    TempBuffer<float> norms(res, n);
    row_norms(res, x, n, d, norms.data(), nullptr, nullptr);
    std::vector<float> h(static_cast<size_t>(n));
    copy_to_host_sync(res, h.data(), norms.data(), n);
    double sum = 0.0;
    for (float v : h) sum += v;
    const double rms = std::sqrt(sum / (static_cast<double>(n) * d));
    return rms > 0.0 && std::isfinite(rms) ? static_cast<float>(rms) : 1.0f;
}

/*
 * The common Lloyd loop over `batches` problems of k centroids in dsub
 * dimensions; points are rows of x (ld = batches * dsub), problem j uses
 * columns j * dsub ... (batches == 1: the coarse quantizer).
 */
void lloyd(Resources &res, const float *x, int64_t n, int batches, int dsub, int k, const KMeansParams &p,
           HostRng &rng, float *cent) {
    const int d = batches * dsub;
    const float scale = component_rms(res, x, n, d);
    TempBuffer<int32_t> labels(res, static_cast<int64_t>(batches) * n);
    GPUIVF_CUDA_TRY(cudaMemsetAsync(labels.data(), 0xff, sizeof(int32_t) * batches * n, res.stream));
    TempBuffer<float> sums(res, static_cast<int64_t>(batches) * k * dsub);
    TempBuffer<int> counts(res, static_cast<int64_t>(batches) * k);
    TempBuffer<int> changed(res, 1);
    TempBuffer<float> knn_scores;
    TempBuffer<uint64_t> knn_ids;
    if (batches == 1) {
        knn_scores.allocate(res, n);
        knn_ids.allocate(res, n);
    }
    const size_t small_smem = sizeof(float) * k * dsub;
    GPUIVF_REQUIRE(batches == 1 || small_smem <= res.smem_optin,
                   "sub-quantizer codebooks of %d x %d floats do not fit in shared memory", k, dsub);
    if (batches > 1 && small_smem > 48 * 1024)
        GPUIVF_CUDA_TRY(cudaFuncSetAttribute(assign_small_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(small_smem)));

    bool split = false;
    const int niter = std::max(1, p.niter);
    for (int iter = 0; iter < niter; iter++) {
        check_cancel(res);
        GPUIVF_CUDA_TRY(cudaMemsetAsync(changed.data(), 0, sizeof(int), res.stream));
        if (batches == 1) {
            KnnOptions o;
            o.exact_rescore = false;
            o.queries_prepared = true;
            exact_knn(res, Metric::L2, cent, k, x, n, d, 1, o, knn_scores.data(), knn_ids.data());
            labels_from_ids_kernel<<<blocks_for(n, 256), 256, 0, res.stream>>>(knn_ids.data(), n, labels.data(),
                                                                             changed.data());
        } else {
            const dim3 grid(blocks_for(n, 128), batches);
            assign_small_kernel<<<grid, 128, small_smem, res.stream>>>(x, n, d, dsub, k, cent, labels.data(),
                                                                       changed.data());
        }
        GPUIVF_CUDA_CHECK_LAUNCH();
        int h_changed = 0;
        copy_to_host_sync(res, &h_changed, changed.data(), 1);
        if (iter > 0 && !split && h_changed == 0) break; /* converged */

        GPUIVF_CUDA_TRY(cudaMemsetAsync(sums.data(), 0, sizeof(float) * sums.size(), res.stream));
        GPUIVF_CUDA_TRY(cudaMemsetAsync(counts.data(), 0, sizeof(int) * counts.size(), res.stream));
        accumulate_kernel<<<blocks_for(n * d, 256), 256, 0, res.stream>>>(x, n, d, dsub, k, labels.data(),
                                                                          sums.data(), counts.data());
        GPUIVF_CUDA_CHECK_LAUNCH();
        divide_kernel<<<blocks_for(sums.size(), 256), 256, 0, res.stream>>>(sums.data(), counts.data(), sums.size(),
                                                                            dsub, cent);
        GPUIVF_CUDA_CHECK_LAUNCH();
        split = split_empty(res, batches, k, dsub, cent, counts.data(), scale, rng) > 0;
    }
    sync(res);
}

/* n <= k: every point is a centroid, the surplus repeats points slightly
 * moved (src/core's centroids_from_points), per batch. */
void centroids_from_points(Resources &res, const float *x, int64_t n, int batches, int dsub, int k, HostRng &rng,
                           float *cent) {
    const int d = batches * dsub;
    std::vector<float> hx(static_cast<size_t>(n) * d);
    copy_to_host_sync(res, hx.data(), x, n * d);
    double sum = 0.0;
    for (float v : hx) sum += static_cast<double>(v) * v;
    float scale = static_cast<float>(std::sqrt(sum / (static_cast<double>(n) * d)));
    if (!(scale > 0.0f) || !std::isfinite(scale)) scale = 1.0f;
    std::vector<float> hc(static_cast<size_t>(batches) * k * dsub);
    for (int b = 0; b < batches; b++) {
        float *cb = &hc[static_cast<size_t>(b) * k * dsub];
        for (int64_t j = 0; j < k; j++) {
            const float *src = &hx[static_cast<size_t>(j % n) * d + static_cast<size_t>(b) * dsub];
            if (j < n)
                std::copy(src, src + dsub, cb + j * dsub);
            else
                perturb_pair(src, cb + j * dsub, nullptr, dsub, scale, rng);
        }
    }
    copy_to_device(res, cent, hc.data(), static_cast<int64_t>(hc.size()));
    sync(res);
}

/* Train `batches` k-means problems on the rows of x (see lloyd). */
void kmeans_batched(Resources &res, const float *x, int64_t n, int batches, int dsub, int k, const KMeansParams &p,
                    float *cent) {
    HostRng rng(p.seed);
    const int d = batches * dsub;
    if (n <= k) {
        centroids_from_points(res, x, n, batches, dsub, k, rng, cent);
        return;
    }
    /* Subsample when there are far more points than needed. */
    TempBuffer<float> sample;
    const int64_t max_points = static_cast<int64_t>(k) * p.max_points_per_centroid;
    if (p.max_points_per_centroid > 0 && n > max_points) {
        std::vector<int64_t> rows = sample_rows(n, max_points, rng);
        TempBuffer<int64_t> drows(res, static_cast<int64_t>(rows.size()));
        copy_to_device(res, drows.data(), rows.data(), static_cast<int64_t>(rows.size()));
        sample.allocate(res, max_points * d);
        gather_kernel<<<blocks_for(max_points * d, 256), 256, 0, res.stream>>>(x, d, 0, d, drows.data(), max_points,
                                                                               sample.data(), d);
        GPUIVF_CUDA_CHECK_LAUNCH();
        sync(res);
        x = sample.data();
        n = max_points;
    }
    /* Start: k distinct random points per batch. */
    for (int b = 0; b < batches; b++) {
        std::vector<int64_t> rows = sample_rows(n, k, rng);
        /* Shuffle so the start does not follow row order. */
        for (int64_t i = static_cast<int64_t>(rows.size()) - 1; i > 0; i--)
            std::swap(rows[i], rows[rng.below(static_cast<uint64_t>(i + 1))]);
        TempBuffer<int64_t> drows(res, k);
        copy_to_device(res, drows.data(), rows.data(), k);
        gather_kernel<<<blocks_for(static_cast<int64_t>(k) * dsub, 256), 256, 0, res.stream>>>(
            x, d, b * dsub, dsub, drows.data(), k, cent + static_cast<int64_t>(b) * k * dsub, dsub);
        GPUIVF_CUDA_CHECK_LAUNCH();
        sync(res);
    }
    lloyd(res, x, n, batches, dsub, k, p, rng, cent);
}

}  // namespace

void kmeans(Resources &res, const float *x, int64_t n, int d, int k, const KMeansParams &p, float *centroids) {
    GPUIVF_REQUIRE(n >= 1, "k-means needs at least one training vector");
    GPUIVF_REQUIRE(d >= 1 && d <= kMaxDims, "k-means dimension %d is out of range 1..%d", d, kMaxDims);
    GPUIVF_REQUIRE(k >= 1 && k <= GPUIVF_CUDA_MAX_LISTS, "k-means cluster count %d is out of range 1..%d", k,
                   GPUIVF_CUDA_MAX_LISTS);
    kmeans_batched(res, x, n, 1, d, k, p, centroids);
}

void pq_train(Resources &res, const float *residuals, int64_t n, int d, int m, int nbits, const KMeansParams &p,
              float *codebook) {
    GPUIVF_REQUIRE(d >= 1 && d <= kMaxDims && m >= 1 && m <= 1024 && d % m == 0 && (nbits == 4 || nbits == 8),
                   "invalid product quantizer shape: %d dimensions, %d sub-quantizers, %d bits", d, m, nbits);
    GPUIVF_REQUIRE(n >= 1, "product quantizer training needs at least one vector");
    kmeans_batched(res, residuals, n, m, d / m, 1 << nbits, p, codebook);
}

void ivfpq_train(Resources &res, Metric metric, const float *x, int64_t n, int d, int nlist, int m, int nbits,
                 const KMeansParams &p, float *centroids, float *codebook) {
    GPUIVF_REQUIRE(n >= 1, "training needs at least one vector");
    GPUIVF_REQUIRE(nlist >= 1 && nlist <= GPUIVF_CUDA_MAX_LISTS, "lists %d is out of range", nlist);
    TempBuffer<float> xp;
    const float *px = x;
    if (metric == Metric::Cosine) {
        xp.allocate(res, n * d);
        prepare_rows(res, metric, x, n, d, xp.data());
        px = xp.data();
    }
    kmeans(res, px, n, d, nlist, p, centroids);

    /* Residuals of a sample of at most ksub * max_points_per_centroid rows. */
    HostRng rng(p.seed ^ 0x5eedULL);
    const int64_t per = p.max_points_per_centroid > 0 ? p.max_points_per_centroid : 256;
    const int64_t count = std::min<int64_t>(n, static_cast<int64_t>(1 << nbits) * per);
    std::vector<int64_t> rows = sample_rows(n, count, rng);
    TempBuffer<int64_t> drows(res, count);
    copy_to_device(res, drows.data(), rows.data(), count);
    TempBuffer<float> sample(res, count * d);
    gather_kernel<<<blocks_for(count * d, 256), 256, 0, res.stream>>>(px, d, 0, d, drows.data(), count,
                                                                      sample.data(), d);
    GPUIVF_CUDA_CHECK_LAUNCH();
    TempBuffer<int32_t> lists(res, count);
    ModelView mv{metric, d, nlist, m, nbits, centroids, codebook};
    assign_lists(res, mv, sample.data(), count, lists.data());
    gpuivf_cuda::residuals(res, sample.data(), lists.data(), centroids, count, d, sample.data());
    KMeansParams pp = p;
    pp.seed = p.seed + 7919ULL;
    pq_train(res, sample.data(), count, d, m, nbits, pp, codebook);
}

}  // namespace gpuivf_cuda
