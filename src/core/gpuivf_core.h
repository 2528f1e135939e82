/*
 * gpuivf_core.h — the CPU engine of gpuivf: the one public header of src/core.
 *
 * Plain C++17, no PostgreSQL header, no exceptions across this interface:
 * every function is noexcept; those that can fail return a Status.  All
 * buffers are owned by the caller unless said otherwise, so src/pg can hand in
 * palloc'd memory and PostgreSQL frees it.  Temporary memory the engine takes
 * itself is released before the function returns, also on failure.
 *
 * The same functions are the reference the GPU engine (cuda/) is tested
 * against, and they define the on-disk meaning of centroids, codebooks and
 * codes: see src/pg/README.md ("Formats") for the byte layout in pages.
 *
 * Conventions
 *  - d: dimensions; n: number of vectors; vectors are row-major float32.
 *  - Metric: what the SQL operators compute.  Internally every score is
 *    "smaller is better":
 *      L2            score = squared L2 distance
 *      InnerProduct  score = -(inner product)
 *      Cosine        vectors are normalized first (prepare_vector), then L2
 *  - ids are opaque 64-bit values chosen by the caller (src/pg packs an
 *    ItemPointer as block << 16 | offset); ties are broken by smaller id so
 *    every selection is deterministic.
 */
#ifndef GPUIVF_CORE_H
#define GPUIVF_CORE_H

#include <cstddef>
#include <cstdint>

namespace gpuivf {

/* ---------------------------------------------------------------- status */

enum class Metric : int32_t { L2 = 1, InnerProduct = 2, Cosine = 3 };

enum StatusCode : int32_t {
    kOk = 0,
    kInvalidArgument = 1,
    kOutOfMemory = 2,
    kCanceled = 3,
    kInternal = 4,
};

struct Status {
    int32_t code;       /* StatusCode */
    char message[256];  /* NUL-terminated, lower case, no period */
};

inline bool ok(const Status &s) noexcept { return s.code == kOk; }
Status status_ok() noexcept;
Status status_error(int32_t code, const char *fmt, ...) noexcept
    __attribute__((format(printf, 2, 3)));

/*
 * Long operations poll a cancel hook (src/pg points it at a check of
 * InterruptPending that does not longjmp) and return kCanceled when it says
 * so; the caller then raises the interrupt itself.  Either hook may be null.
 */
struct CancelHook {
    bool (*should_cancel)(void *arg);
    void *arg;
};
struct ProgressHook {
    void (*report)(void *arg, int64_t done, int64_t total);
    void *arg;
};

/* Limits shared by every layer. */
constexpr int kMaxDims = 16000;      /* pgvector's limit for vector and halfvec */
constexpr int kMaxLists = 65536;
constexpr int kMaxPqM = 1024;
constexpr int kMaxK = 1024;          /* k-selection bound (GPU WarpSelect too) */

/*
 * The largest magnitude of a vector component.  src/pg rejects larger values
 * at input (operators, index rows, queries), as it rejects NaN and
 * infinities, and training rejects them, so that no sum either engine forms
 * can overflow float32, up to 16,000 dimensions (d) and B = kMaxComponent:
 * a squared L2 distance is at most 4 d B^2 = 6.4e34; the GEMM form
 * ||x||^2 + ||c||^2 - 2 x.c at most 4 d B^2; PQ residuals lie within 2B and
 * an ADC score sums look-ups of at most 16 d B^2 = 2.6e35 in total; a k-means
 * sum over 2^31 points stays below 2.2e24 — all at least 1,000 times below
 * FLT_MAX (3.4e38).  Real embeddings are many orders of magnitude smaller.
 */
constexpr float kMaxComponent = 1e15f;
/* The bound of a trained model's values: centroids are means of vectors,
 * codebooks means of residuals (within 2 kMaxComponent), both moved by the
 * tiny perturbations that split empty clusters.  Training returns an error
 * rather than a model value outside it (or not finite). */
constexpr float kMaxModelComponent = 4 * kMaxComponent;

/* Is every x[0..n) finite with |x| <= bound? */
bool components_within(const float *x, int64_t n, float bound) noexcept;

/* Call once per process before the first GEMM: OpenBLAS stays single-threaded
 * inside a PostgreSQL backend (no helper threads receiving signals).  The
 * engine also calls it itself before its first GEMM.  Note: Debian's pthread
 * OpenBLAS starts its idle helper threads when the library is loaded; this
 * only stops it from using them. */
void init_blas_single_threaded() noexcept;

/* ------------------------------------------------------------- distances */

/* Exactly what the SQL functions return; the index's exact re-rank calls the
 * same functions so index order equals sequential-scan order bit for bit. */
float l2_squared(const float *a, const float *b, int d) noexcept;
float inner_product(const float *a, const float *b, int d) noexcept;
double l2_distance(const float *a, const float *b, int d) noexcept;       /* sqrt(l2_squared) */
double negative_inner_product(const float *a, const float *b, int d) noexcept;
double cosine_distance(const float *a, const float *b, int d) noexcept;   /* 1 - cos; NaN if a norm is 0 */
/* The SQL-visible distance of metric m (the three functions above). */
double metric_distance(Metric m, const float *a, const float *b, int d) noexcept;

/* The vector the index trains on and encodes: a copy for L2 and IP, the unit
 * vector for cosine.  Returns false (and copies) when the norm is zero. */
bool prepare_vector(Metric m, const float *in, float *out, int d) noexcept;

/* ------------------------------------------------------- half precision */

/*
 * IEEE binary16 ("half", pgvector's halfvec element) as raw uint16 bits.
 * Widening is exact, so the distance of half vectors is the float32 distance
 * of the widened values (one definition for every engine).  Narrowing rounds
 * to nearest, ties to even; a value that came from a half narrows back to
 * itself.  The _n forms convert arrays (F16C where the CPU has it, the same
 * bits).
 */
float half_to_float(uint16_t h) noexcept;
uint16_t float_to_half(float f) noexcept;
void half_to_float_n(const uint16_t *in, float *out, int64_t n) noexcept;
void float_to_half_n(const float *in, uint16_t *out, int64_t n) noexcept;

/* ------------------------------------------------------------ k-selection */

/*
 * Bounded max-heap that keeps the k smallest (score, id) pairs seen; the
 * caller owns vals/ids (capacity k), so it can live in palloc'd memory.
 * Order: smaller score first, then smaller id; NaN sorts after every number
 * (as PostgreSQL orders float8), so the result never depends on push order.
 */
struct TopK {
    float *vals;
    uint64_t *ids;
    int k;
    int size;
};
void topk_init(TopK *t, float *vals, uint64_t *ids, int k) noexcept;
/* Score that a new candidate must beat once the heap is full (+inf before).
 * A candidate equal to it can still enter on a smaller id, so filter with
 * "score <= threshold" before pushing. */
float topk_threshold(const TopK *t) noexcept;
void topk_push(TopK *t, float val, uint64_t id) noexcept;
/* Sorts the kept pairs ascending in place (the heap is spent afterwards). */
void topk_sort(TopK *t) noexcept;

/* Sort n (val, id) pairs ascending by (val, id) in place (TopK's order;
 * allocates nothing). */
void sort_pairs(float *vals, uint64_t *ids, int64_t n) noexcept;

/* -------------------------------------------------------------- k-means */

struct KMeansParams {
    int niter;                   /* Lloyd iterations, default 20 */
    uint64_t seed;
    int max_points_per_centroid; /* subsample above k * this, default 256 */
};
KMeansParams kmeans_default_params() noexcept;

/*
 * Lloyd k-means with k-means++ initialisation and GEMM assignment (OpenBLAS).
 * Empty clusters are re-seeded by splitting the largest one.  n < k is
 * allowed: the surplus centroids duplicate points with a tiny perturbation.
 * centroids: k * d floats out.
 */
Status kmeans_train(const float *x, int64_t n, int d, int k, const KMeansParams &params,
                    float *centroids, const CancelHook *cancel) noexcept;

/*
 * The same k-means one Lloyd step at a time, for a caller that labels the
 * rows itself (a parallel CREATE INDEX shares each labelling out among its
 * processes):
 *
 *   KMeansRun *run = kmeans_begin(x, n, d, k, params, centroids, cancel, &st);
 *   while (kmeans_wants_labels(run, &rows, &rows_n))
 *       label every row against centroids (assign_nearest, whole or in
 *       parts that start at multiples of kAssignRowBlock), kmeans_step;
 *   kmeans_end(run);
 *
 * kmeans_train is this loop with one assign_nearest of all the rows, so both
 * give the same centroids.  kmeans_begin returns null (and *status) on
 * failure; otherwise the caller must call kmeans_end, also after a failed
 * step.  rows: x, or the subsample the run trains on (owned by the run).
 * The centroids are checked (as kmeans_train does) when the run is done.
 */
struct KMeansRun;
KMeansRun *kmeans_begin(const float *x, int64_t n, int d, int k, const KMeansParams &params,
                        float *centroids, const CancelHook *cancel, Status *status) noexcept;
bool kmeans_wants_labels(const KMeansRun *run, const float **rows, int64_t *n) noexcept;
Status kmeans_step(KMeansRun *run, const int32_t *labels) noexcept;
void kmeans_end(KMeansRun *run) noexcept;

/*
 * assign_nearest works through its rows in blocks of this many: a row's
 * label depends only on the block it is in, so calls over parts of the rows
 * that start at multiples of it give the labels of one call over them all.
 */
constexpr int64_t kAssignRowBlock = 1024;

/* Squared L2 norm of each of n rows. */
void row_norms(const float *x, int64_t n, int d, float *norms) noexcept;

/*
 * Nearest centroid by L2 for each of n vectors (GEMM-tiled).  labels[n] out;
 * dists[n] (squared L2) out when not null.  centroid_norms may be null.
 */
Status assign_nearest(const float *centroids, const float *centroid_norms, int k, int d,
                      const float *x, int64_t n, int32_t *labels, float *dists,
                      const CancelHook *cancel) noexcept;

/*
 * Exact k nearest of nq queries among n base vectors under metric m
 * (scores as above, ascending; ids are row numbers).  out_vals/out_ids:
 * nq * k; rows with fewer than k candidates are padded with +inf / UINT64_MAX.
 * Used for ANALYZE ground truth and as the GPU exact-kNN reference.
 * 1 <= k <= kMaxK.  The GEMM shortlist is re-scored with l2_squared /
 * inner_product, so scores are exactly those functions' values.  For cosine
 * a zero vector is scored as prepared (left as zeros), not as NaN.
 */
Status exact_knn(Metric m, const float *base, int64_t n, const float *queries, int64_t nq,
                 int d, int k, float *out_vals, uint64_t *out_ids,
                 const CancelHook *cancel) noexcept;

/* --------------------------------------------------- product quantization */

/* Bytes per code: m at 8 bits, (m + 1) / 2 at 4 bits (sub-quantizer j in
 * byte j/2, low nibble for even j, high nibble for odd j). */
int pq_code_size(int m, int nbits) noexcept;

/* pq_m = 0 means automatic: the largest divisor of d not above
 * min(96, max(1, d / 4)). */
int pq_auto_m(int d) noexcept;

/* lists = 0 means automatic from the row count: rows / 1000 up to 1M rows,
 * sqrt(rows) above, clamped to [1, kMaxLists]. */
int auto_lists(int64_t rows) noexcept;

/*
 * Train m codebooks of 2^nbits centroids on residuals (n x d).
 * codebook layout: [m][ksub][dsub] floats, dsub = d / m, ksub = 1 << nbits.
 */
Status pq_train(const float *residuals, int64_t n, int d, int m, int nbits, uint64_t seed,
                float *codebook, const CancelHook *cancel) noexcept;

/*
 * pq_train for processes that share the sub-quantizers out: each trains the
 * sub-quantizers j that claim->next(claim->arg) hands it (until it returns a
 * negative number) into their place in codebook; a null claim trains them
 * all (pq_train).  Sub-quantizer j's codebook depends only on the residuals,
 * the seed and j, so whoever trains it, the codebook is pq_train's.
 */
struct WorkClaim {
    int64_t (*next)(void *arg);
    void *arg;
};
Status pq_train_claimed(const float *residuals, int64_t n, int d, int m, int nbits, uint64_t seed,
                        float *codebook, const WorkClaim *claim, const CancelHook *cancel) noexcept;

/* Encode n residuals into n * pq_code_size(m, nbits) bytes. */
void pq_encode(const float *codebook, int d, int m, int nbits, const float *residuals,
               int64_t n, uint8_t *codes) noexcept;
/* Reconstruct n residuals from codes. */
void pq_decode(const float *codebook, int d, int m, int nbits, const uint8_t *codes,
               int64_t n, float *residuals) noexcept;

/* -------------------------------------------------------- IVF-PQ model */

/* Read-only view of a trained index: everything a search or an encode needs. */
struct IvfPqModel {
    Metric metric;
    int d;
    int nlist;
    int m;
    int nbits;
    const float *centroids;      /* nlist * d (prepared space) */
    const float *centroid_norms; /* nlist squared norms */
    const float *codebook;       /* m * 2^nbits * (d / m) */
};

/*
 * Assign n prepared vectors to lists (L2 nearest centroid) and encode their
 * residuals: lists[n] and codes[n * code_size] out.  Batched through GEMM.
 */
Status ivfpq_encode(const IvfPqModel &model, const float *x, int64_t n, int32_t *lists,
                    uint8_t *codes, const CancelHook *cancel) noexcept;

/*
 * The nprobe lists to visit for prepared query q, best first: nearest
 * centroids by L2 (L2, cosine) or largest q.c (inner product).  Both output
 * arrays hold nprobe entries (they serve as the selection heap, nothing is
 * allocated); scores_out is the squared L2 distance or -q.c; when nprobe >
 * nlist the surplus entries are -1 / +inf.  Ties go to the smaller list.
 */
void ivfpq_probe_lists(const IvfPqModel &model, const float *q, int nprobe,
                       int32_t *lists_out, float *scores_out) noexcept;

/* Size in floats of one look-up table: m * 2^nbits. */
int ivfpq_lut_size(const IvfPqModel &model) noexcept;

/*
 * Look-up table of prepared query q for one list: the ADC score of a code is
 * bias + sum_j lut[j * ksub + code_j].  For inner product the table does not
 * depend on the list (only bias does).
 */
void ivfpq_build_lut(const IvfPqModel &model, const float *q, int list, float *lut,
                     float *bias) noexcept;

/* ADC score of n codes (scores[n] out). */
void ivfpq_adc_scores(const IvfPqModel &model, const float *lut, float bias,
                      const uint8_t *codes, int64_t n, float *scores) noexcept;

/* ADC scan of n codes with ids, pushing every code that beats the heap's
 * threshold into topk (compute, then filter against the running k-th). */
void ivfpq_adc_scan(const IvfPqModel &model, const float *lut, float bias,
                    const uint8_t *codes, const uint64_t *ids, int64_t n,
                    TopK *topk) noexcept;

/* SQL-scale distance from an ADC score (used only when the index has no
 * full vectors): sqrt for L2, as is for IP, score / 2 for cosine. */
double ivfpq_score_to_distance(Metric m, float score) noexcept;

}  // namespace gpuivf

#endif /* GPUIVF_CORE_H */
