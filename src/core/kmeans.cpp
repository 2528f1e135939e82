/*
 * kmeans.cpp — coarse-quantizer and PQ codebook training: Lloyd iterations
 * seeded by k-means++ on a subsample, with GEMM assignment (assign.cpp).
 *
 * Everything is deterministic for a given seed: the sample, the k-means++
 * draws and the empty-cluster splits all come from detail::Rng, and the
 * centroid sums are accumulated in double in row order.
 */
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>

#include "core_internal.h"

namespace gpuivf {

namespace {

/* Relative size of the perturbation that separates a split centroid (or a
 * duplicated point when n < k) from its twin. */
constexpr float kSplitEps = 1.0f / 1024.0f;

/* k-means++ costs init_rows * k distance evaluations of d dimensions; above
 * this many multiply-adds the initial centroids are distinct random rows
 * instead (plain random init is what most IVF trainers use anyway). */
constexpr double kPlusPlusBudget = 8e9;

/* Root mean square of the components: the scale of the perturbations, so
 * they stay tiny relative to the data whatever its units. */
float component_rms(const float *x, int64_t n, int d) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += inner_product(x + i * d, x + i * d, d);
    double rms = std::sqrt(sum / (static_cast<double>(n) * d));
    return rms > 0.0 ? static_cast<float>(rms) : 1.0f;
}

/* Set a = src + delta and b = src - delta with a random-sign delta per component. */
void perturb_pair(const float *src, float *a, float *b, int d, float scale, detail::Rng &rng) {
    for (int t = 0; t < d; t++) {
        const float base = src[t];
        const float delta = kSplitEps * (std::fabs(base) + scale) * ((rng.next() >> 63) ? 1.0f : -1.0f);
        if (a) a[t] = base + delta;
        if (b) b[t] = base - delta;
    }
}

/* n <= k: every point is a centroid; surplus centroids repeat points, moved
 * by a tiny perturbation so no two are identical. */
void centroids_from_points(const float *x, int64_t n, int d, int k, uint64_t seed, float *centroids) {
    detail::Rng rng(seed);
    const float scale = component_rms(x, n, d);
    std::memcpy(centroids, x, sizeof(float) * n * d);
    for (int64_t j = n; j < k; j++)
        perturb_pair(x + (j % n) * d, centroids + j * d, nullptr, d, scale, rng);
}

/* k-means++ bookkeeping: nearest[i] = min(nearest[i], |p_i - c|^2) for points
 * stored transposed (pt[t * n + i]), so the loop runs along the points and
 * vectorises whatever d is. */
__attribute__((target_clones("avx2", "default")))
void update_nearest(const float *pt, int64_t n, int d, const float *c, float *nearest, float *scratch) {
    for (int64_t i = 0; i < n; i++) {
        float diff = pt[i] - c[0];
        scratch[i] = diff * diff;
    }
    for (int t = 1; t < d; t++) {
        const float *row = pt + t * n;
        const float ct = c[t];
        for (int64_t i = 0; i < n; i++) {
            float diff = row[i] - ct;
            scratch[i] += diff * diff;
        }
    }
    for (int64_t i = 0; i < n; i++) nearest[i] = scratch[i] < nearest[i] ? scratch[i] : nearest[i];
}

/* Initial centroids: k-means++ (D^2 sampling) on a subsample of at most
 * 16 k rows bounded by kPlusPlusBudget, or distinct random rows when even k
 * rows would exceed it. */
void init_centroids(const float *x, int64_t n, int d, int k, detail::Rng &rng, float *centroids,
                    const CancelHook *cancel, bool *was_canceled) {
    *was_canceled = false;
    const double per_row = static_cast<double>(k) * d;
    if (per_row * k > kPlusPlusBudget) {
        std::vector<int64_t> rows = detail::sample_rows(n, k, rng.next());
        for (int j = 0; j < k; j++) std::memcpy(centroids + static_cast<int64_t>(j) * d, x + rows[j] * d, sizeof(float) * d);
        return;
    }
    int64_t init_n = std::min<int64_t>(n, 16 * static_cast<int64_t>(k));
    init_n = std::max<int64_t>(std::min<int64_t>(init_n, static_cast<int64_t>(kPlusPlusBudget / per_row)), k);
    std::vector<int64_t> rows = detail::sample_rows(n, init_n, rng.next());
    std::vector<float> pt(static_cast<size_t>(init_n) * d);
    for (int64_t i = 0; i < init_n; i++)
        for (int t = 0; t < d; t++) pt[t * init_n + i] = x[rows[i] * d + t];
    std::vector<float> nearest(init_n, std::numeric_limits<float>::infinity());
    std::vector<float> scratch(init_n);

    int64_t pick = static_cast<int64_t>(rng.below(init_n));
    for (int j = 0; j < k; j++) {
        float *cj = centroids + static_cast<int64_t>(j) * d;
        std::memcpy(cj, x + rows[pick] * d, sizeof(float) * d);
        if (j + 1 == k) break;
        if ((j & 63) == 63 && detail::canceled(cancel)) {
            *was_canceled = true;
            return;
        }
        update_nearest(pt.data(), init_n, d, cj, nearest.data(), scratch.data());
        double total = 0.0;
        for (int64_t i = 0; i < init_n; i++) total += nearest[i];
        if (!(total > 0.0)) {
            /* Every point coincides with a centroid: any row will do; the
             * empty-cluster split separates the duplicates later. */
            pick = static_cast<int64_t>(rng.below(init_n));
            continue;
        }
        double target = rng.uniform() * total;
        pick = init_n - 1;
        for (int64_t i = 0; i < init_n; i++) {
            target -= nearest[i];
            if (target < 0.0 && nearest[i] > 0.0) {
                pick = i;
                break;
            }
        }
    }
}

/* Re-seed each empty cluster by splitting the currently largest one. */
void split_empty_clusters(float *centroids, std::vector<int64_t> &counts, int k, int d, float scale,
                          detail::Rng &rng) {
    for (int j = 0; j < k; j++) {
        if (counts[j] != 0) continue;
        int big = 0;
        for (int c = 1; c < k; c++)
            if (counts[c] > counts[big]) big = c;
        float *cb = centroids + static_cast<int64_t>(big) * d;
        float *cj = centroids + static_cast<int64_t>(j) * d;
        perturb_pair(cb, cj, cb, d, scale, rng);
        counts[j] = counts[big] / 2;
        counts[big] -= counts[j];
    }
}

/* Centroids = mean of their assigned rows (double sums); returns how many
 * centroids ended up empty. */
int update_centroids(const float *x, int64_t n, int d, int k, const int32_t *labels,
                     std::vector<double> &sums, std::vector<int64_t> &counts, float *centroids) {
    std::fill(sums.begin(), sums.end(), 0.0);
    std::fill(counts.begin(), counts.end(), 0);
    for (int64_t i = 0; i < n; i++) {
        const int32_t c = labels[i];
        double *s = &sums[static_cast<size_t>(c) * d];
        const float *xi = x + i * d;
        for (int t = 0; t < d; t++) s[t] += xi[t];
        counts[c]++;
    }
    int empty = 0;
    for (int c = 0; c < k; c++) {
        if (counts[c] == 0) {
            empty++;
            continue;
        }
        const double inv = 1.0 / static_cast<double>(counts[c]);
        const double *s = &sums[static_cast<size_t>(c) * d];
        float *cc = centroids + static_cast<int64_t>(c) * d;
        for (int t = 0; t < d; t++) cc[t] = static_cast<float>(s[t] * inv);
    }
    return empty;
}

}  // namespace

/*
 * One k-means run between kmeans_begin and kmeans_end: the rows it trains
 * on (x, or its subsample), the random stream, and the last labels (to see
 * convergence).  Lloyd's loop is kmeans_run below, or a caller's own
 * (kmeans_step).
 */
struct KMeansRun {
    const float *x = nullptr;
    int64_t n = 0;
    int d = 0;
    int k = 0;
    float *centroids = nullptr;
    const CancelHook *cancel = nullptr;
    detail::Rng rng{0};
    std::vector<float> sample;
    float scale = 1.0f;
    std::vector<int32_t> prev;
    std::vector<double> sums;
    std::vector<int64_t> counts;
    int iter = 0;
    int niter = 1;
    bool split = false;
    bool done = false;
    bool check_model = false; /* kmeans_step checks the centroids when done */
};

namespace {

/* Start a run: subsample, initial centroids (throws std::bad_alloc). */
Status run_begin(KMeansRun *run, const float *x, int64_t n, int d, int k, const KMeansParams &params,
                 float *centroids, const CancelHook *cancel) {
    run->d = d;
    run->k = k;
    run->centroids = centroids;
    run->cancel = cancel;
    if (n <= k) {
        centroids_from_points(x, n, d, k, params.seed, centroids);
        run->done = true;
        return status_ok();
    }
    run->rng = detail::Rng(params.seed);

    /* Train on a subsample when there are far more points than needed. */
    const int64_t max_points = static_cast<int64_t>(k) * std::max(1, params.max_points_per_centroid);
    if (params.max_points_per_centroid > 0 && n > max_points) {
        run->sample = detail::gather_rows(x, d, detail::sample_rows(n, max_points, run->rng.next()));
        x = run->sample.data();
        n = max_points;
    }
    run->x = x;
    run->n = n;

    bool was_canceled;
    init_centroids(x, n, d, k, run->rng, centroids, cancel, &was_canceled);
    if (was_canceled) return detail::canceled_status();

    run->scale = component_rms(x, n, d);
    run->prev.assign(n, -1);
    run->sums.resize(static_cast<size_t>(k) * d);
    run->counts.resize(k);
    run->niter = std::max(1, params.niter);
    return status_ok();
}

/* Lloyd's update from the labels of every row against the current
 * centroids; done when they did not change or after niter updates. */
Status run_step(KMeansRun *run, const int32_t *labels) {
    if (run->done) return status_ok();
    /* Converged: the means would not move. */
    if (run->iter > 0 && !run->split &&
        std::equal(run->prev.begin(), run->prev.end(), labels)) {
        run->done = true;
        return status_ok();
    }
    int empty = update_centroids(run->x, run->n, run->d, run->k, labels, run->sums, run->counts,
                                 run->centroids);
    run->split = empty > 0;
    if (run->split) split_empty_clusters(run->centroids, run->counts, run->k, run->d, run->scale, run->rng);
    std::copy(labels, labels + run->n, run->prev.begin());
    if (++run->iter >= run->niter) {
        run->done = true;
        return status_ok();
    }
    if (detail::canceled(run->cancel)) return detail::canceled_status();
    return status_ok();
}

}  // namespace

namespace detail {

Status kmeans_run(const float *x, int64_t n, int d, int k, const KMeansParams &params,
                  float *centroids, const CancelHook *cancel) {
    KMeansRun run;
    Status st = run_begin(&run, x, n, d, k, params, centroids, cancel);
    if (!ok(st) || run.done) return st;
    std::vector<float> cnorms(k);
    std::vector<int32_t> labels(run.n, -1);
    while (!run.done) {
        row_norms(centroids, k, d, cnorms.data());
        st = detail::assign_rows(centroids, cnorms.data(), k, d, run.x, nullptr, run.n,
                                 labels.data(), nullptr, cancel);
        if (!ok(st)) return st;
        st = run_step(&run, labels.data());
        if (!ok(st)) return st;
    }
    return status_ok();
}

}  // namespace detail

KMeansParams kmeans_default_params() noexcept {
    KMeansParams p;
    p.niter = 20;
    p.seed = 1234;
    p.max_points_per_centroid = 256;
    return p;
}

namespace {

Status check_kmeans_args(const float *x, int64_t n, int d, int k, const float *centroids) {
    if (x == nullptr || centroids == nullptr)
        return status_error(kInvalidArgument, "k-means needs input and output arrays");
    if (n < 1) return status_error(kInvalidArgument, "k-means needs at least one training vector");
    if (d < 1 || d > kMaxDims)
        return status_error(kInvalidArgument, "k-means dimension %d is out of range 1..%d", d, kMaxDims);
    if (k < 1 || k > kMaxLists)
        return status_error(kInvalidArgument, "k-means cluster count %d is out of range 1..%d", k, kMaxLists);
    if (!components_within(x, n * d, kMaxComponent))
        return status_error(kInvalidArgument,
                            "k-means training vectors must be finite with magnitudes up to %g",
                            static_cast<double>(kMaxComponent));
    return status_ok();
}

Status check_centroids(const float *centroids, int k, int d) {
    if (!components_within(centroids, static_cast<int64_t>(k) * d, kMaxModelComponent))
        return status_error(kInternal, "k-means produced a centroid that is not finite or out of range");
    return status_ok();
}

}  // namespace

Status kmeans_train(const float *x, int64_t n, int d, int k, const KMeansParams &params,
                    float *centroids, const CancelHook *cancel) noexcept {
    Status st = check_kmeans_args(x, n, d, k, centroids);
    if (!ok(st)) return st;
    try {
        st = detail::kmeans_run(x, n, d, k, params, centroids, cancel);
        if (ok(st)) st = check_centroids(centroids, k, d);
        return st;
    } catch (const std::bad_alloc &) {
        return detail::out_of_memory_status("k-means training");
    } catch (...) {
        return detail::internal_error_status("k-means training");
    }
}

KMeansRun *kmeans_begin(const float *x, int64_t n, int d, int k, const KMeansParams &params,
                        float *centroids, const CancelHook *cancel, Status *status) noexcept {
    *status = check_kmeans_args(x, n, d, k, centroids);
    if (!ok(*status)) return nullptr;
    KMeansRun *run = nullptr;
    try {
        run = new KMeansRun;
        run->check_model = true;
        *status = run_begin(run, x, n, d, k, params, centroids, cancel);
        if (ok(*status) && run->done) *status = check_centroids(centroids, k, d);
    } catch (const std::bad_alloc &) {
        *status = detail::out_of_memory_status("k-means training");
    } catch (...) {
        *status = detail::internal_error_status("k-means training");
    }
    if (!ok(*status)) {
        delete run;
        return nullptr;
    }
    return run;
}

bool kmeans_wants_labels(const KMeansRun *run, const float **rows, int64_t *n) noexcept {
    if (run->done) return false;
    *rows = run->x;
    *n = run->n;
    return true;
}

Status kmeans_step(KMeansRun *run, const int32_t *labels) noexcept {
    try {
        Status st = run_step(run, labels);
        if (ok(st) && run->done && run->check_model) st = check_centroids(run->centroids, run->k, run->d);
        return st;
    } catch (...) {
        return detail::internal_error_status("k-means training");
    }
}

void kmeans_end(KMeansRun *run) noexcept { delete run; }

}  // namespace gpuivf
