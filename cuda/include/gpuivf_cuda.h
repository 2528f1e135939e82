/*
 * gpuivf_cuda.h — the GPU engine of gpuivf: its one public header.
 *
 * A plain C interface (usable from C and from C++ built without exceptions):
 * every function returns a gpuivf_cuda_status (code + message) and never
 * throws, aborts or exits; every CUDA, cuBLAS or allocation failure inside is
 * caught and reported.  Nothing happens at library load: the caller creates a
 * resources object (device, streams, cuBLAS handle, temporary-memory arena)
 * when it wants the GPU, in the one process that owns the GPU (the gpuivf GPU
 * worker), and destroys it when done.
 *
 * Semantics are those of src/core (gpuivf_core.h), which is the reference the
 * GPU engine is tested against:
 *  - metrics: 1 = L2, 2 = inner product, 3 = cosine (gpuivf::Metric numbers);
 *  - internal scores are "smaller is better": squared L2, -(inner product),
 *    and for cosine the squared L2 of the unit vectors;
 *  - model layout: centroids [nlist][d] (prepared space), codebook
 *    [m][2^nbits][d/m]; codes of pq_code_size(m, nbits) bytes, 4-bit codes
 *    with sub-quantizer j in byte j/2, low nibble for even j;
 *  - ties are broken by the smaller id wherever a result is sorted.
 *
 * Pointers.  Every array argument may be host memory or device memory (the
 * engine looks at the pointer with cudaPointerGetAttributes and stages host
 * arrays through the arena), so a caller that never includes a CUDA header can
 * use the engine with plain malloc'd buffers, and a benchmark can keep
 * everything on the device.
 *
 * Completion.  Every function is synchronous (its results are in place when
 * it returns) except gpuivf_cuda_index_search_async, which starts a search
 * on a resources object's stream and returns; gpuivf_cuda_search_done polls
 * it and gpuivf_cuda_search_wait delivers its outputs.
 *
 * Threads.  A resources object and the indexes created with it must be used
 * by one thread at a time.
 */
#ifndef GPUIVF_CUDA_H
#define GPUIVF_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define GPUIVF_CUDA_NOEXCEPT noexcept
extern "C" {
#else
#define GPUIVF_CUDA_NOEXCEPT
#endif

/* ---------------------------------------------------------------- status */

/* Codes 0..4 are the same numbers as gpuivf::StatusCode of src/core. */
enum {
    GPUIVF_CUDA_OK = 0,
    GPUIVF_CUDA_INVALID_ARGUMENT = 1,
    GPUIVF_CUDA_OUT_OF_MEMORY = 2, /* device memory (or pinned/host staging) */
    GPUIVF_CUDA_CANCELED = 3,
    GPUIVF_CUDA_INTERNAL = 4,
    GPUIVF_CUDA_NO_DEVICE = 5,     /* no CUDA device, or no usable driver */
    GPUIVF_CUDA_DEVICE_ERROR = 6   /* a CUDA or cuBLAS call failed */
};

typedef struct gpuivf_cuda_status {
    int32_t code;      /* GPUIVF_CUDA_* */
    char message[256]; /* NUL-terminated, lower case, no period */
} gpuivf_cuda_status;

enum {
    GPUIVF_CUDA_METRIC_L2 = 1,
    GPUIVF_CUDA_METRIC_INNER_PRODUCT = 2,
    GPUIVF_CUDA_METRIC_COSINE = 3
};

/* Limits (the same as src/core's). */
#define GPUIVF_CUDA_MAX_DIMS 16000
#define GPUIVF_CUDA_MAX_K 1024      /* k-selection bound */
#define GPUIVF_CUDA_MAX_LISTS 65536
#define GPUIVF_CUDA_MAX_NPROBE 1024
/*
 * Vector values: finite, of magnitude at most GPUIVF_CUDA_MAX_COMPONENT
 * (gpuivf::kMaxComponent, whose comment shows that no sum overflows float32
 * below it); gpuivf rejects other values at input.  The training functions
 * check host arrays: a vector value outside the bound is
 * GPUIVF_CUDA_INVALID_ARGUMENT, and a trained centroid or codebook value that
 * is not finite or beyond GPUIVF_CUDA_MAX_MODEL_COMPONENT is
 * GPUIVF_CUDA_INTERNAL rather than a result.
 */
#define GPUIVF_CUDA_MAX_COMPONENT 1e15f
#define GPUIVF_CUDA_MAX_MODEL_COMPONENT 4e15f

/* ------------------------------------------------------------- resources */

typedef struct gpuivf_cuda_resources gpuivf_cuda_resources;

/* Number of CUDA devices (0 when there is no device or no driver: that is
 * not an error, so callers can skip GPU work cleanly). */
gpuivf_cuda_status gpuivf_cuda_device_count(int32_t *count) GPUIVF_CUDA_NOEXCEPT;

/*
 * Create the resources for one device: two streams, a cuBLAS handle and a
 * temporary-memory arena of temp_bytes (0 = automatic: a quarter of the free
 * device memory, at most 2 GiB).  Work that needs more temporary memory than
 * the arena has left falls back to cudaMalloc.
 */
gpuivf_cuda_status gpuivf_cuda_resources_create(int32_t device, int64_t temp_bytes,
                                                gpuivf_cuda_resources **out) GPUIVF_CUDA_NOEXCEPT;
gpuivf_cuda_status gpuivf_cuda_resources_destroy(gpuivf_cuda_resources *res) GPUIVF_CUDA_NOEXCEPT;

/* Long operations (k-means, encoding, exact kNN over many tiles) poll this
 * hook between steps and return GPUIVF_CUDA_CANCELED when it says so. */
typedef int (*gpuivf_cuda_cancel_fn)(void *arg);
gpuivf_cuda_status gpuivf_cuda_set_cancel_hook(gpuivf_cuda_resources *res, gpuivf_cuda_cancel_fn fn,
                                               void *arg) GPUIVF_CUDA_NOEXCEPT;

/* Searches of few queries from host arrays (nq <= 512, lists <= 4096) are
 * recorded as a CUDA graph on the first search of each shape (index
 * version, nq, k, nprobe, re-rank, table mode, largest scan k, which
 * per-query arrays, whether ADC distances are asked) and replayed after:
 * one launch instead of a dozen.  On by default; 0 turns it off and drops
 * the recorded ones (same results either way: tests and benchmarks compare
 * both). */
gpuivf_cuda_status gpuivf_cuda_set_search_graphs(gpuivf_cuda_resources *res, int32_t enabled) GPUIVF_CUDA_NOEXCEPT;

typedef struct gpuivf_cuda_device_info {
    char name[128];
    int32_t compute_major, compute_minor;
    int32_t multiprocessors;
    int64_t total_memory, free_memory;
    int64_t temp_bytes; /* the arena's size */
} gpuivf_cuda_device_info;
gpuivf_cuda_status gpuivf_cuda_get_device_info(gpuivf_cuda_resources *res,
                                               gpuivf_cuda_device_info *out) GPUIVF_CUDA_NOEXCEPT;

/* Device memory for callers that keep data on the GPU (benchmarks, the
 * worker's staging buffers); copies go in any direction and are synchronous. */
gpuivf_cuda_status gpuivf_cuda_malloc(gpuivf_cuda_resources *res, int64_t bytes,
                                      void **ptr) GPUIVF_CUDA_NOEXCEPT;
gpuivf_cuda_status gpuivf_cuda_free(gpuivf_cuda_resources *res, void *ptr) GPUIVF_CUDA_NOEXCEPT;
gpuivf_cuda_status gpuivf_cuda_memcpy(gpuivf_cuda_resources *res, void *dst, const void *src,
                                      int64_t bytes) GPUIVF_CUDA_NOEXCEPT;

/* ------------------------------------------------------------ k-selection */

/*
 * The k smallest (or, with select_largest, largest) of each row of a
 * rows x cols float matrix with row stride ld, sorted best first.  ids: the
 * id of each element (rows x ld, same layout), or NULL for column numbers.
 * out_values / out_ids: rows x k.  Rows with fewer than k columns are padded
 * with +inf (-inf when largest) and UINT64_MAX.  NaN ranks after every number
 * in both directions.  Ties are broken by the smaller column.  k <= 1024.
 */
gpuivf_cuda_status gpuivf_cuda_select_k(gpuivf_cuda_resources *res, const float *values, int64_t rows,
                                        int64_t cols, int64_t ld, const uint64_t *ids, int32_t k,
                                        int32_t select_largest, float *out_values,
                                        uint64_t *out_ids) GPUIVF_CUDA_NOEXCEPT;

/* ---------------------------------------------------------------- exact kNN */

/* Skip the exact re-scoring of exact_knn: return the GEMM-form scores (a few
 * bits less precise, near-ties may swap) and save one pass. */
#define GPUIVF_CUDA_KNN_GEMM_SCORES 1

/*
 * Exact k nearest of nq queries among n base vectors (both raw, n x d and
 * nq x d), by cuBLAS GEMM tiles and a fused norm-add + k-select kernel.
 * Same result as gpuivf::exact_knn: internal scores ascending, ids = base
 * row numbers, padding +inf / UINT64_MAX when n < k.  Like the CPU engine it
 * keeps a wider GEMM shortlist per query and re-scores it with the exact
 * functions (same summation order as src/core), so scores are bit-identical
 * to the CPU's unless flags has GPUIVF_CUDA_KNN_GEMM_SCORES.
 */
gpuivf_cuda_status gpuivf_cuda_exact_knn(gpuivf_cuda_resources *res, int32_t metric, const float *base,
                                         int64_t n, const float *queries, int64_t nq, int32_t d,
                                         int32_t k, int32_t flags, float *out_scores,
                                         uint64_t *out_ids) GPUIVF_CUDA_NOEXCEPT;

/* ------------------------------------------------- training and encoding */

typedef struct gpuivf_cuda_kmeans_params {
    int32_t niter;                   /* Lloyd iterations (default 20) */
    uint64_t seed;
    int32_t max_points_per_centroid; /* subsample above k * this; <= 0: use all points */
} gpuivf_cuda_kmeans_params;
gpuivf_cuda_kmeans_params gpuivf_cuda_kmeans_default_params(void) GPUIVF_CUDA_NOEXCEPT;

/*
 * Lloyd k-means of n x d points into k centroids (out: k x d): random
 * distinct points as the start, GEMM assignment, empty clusters re-seeded by
 * splitting the largest one, n <= k handled as src/core does.
 */
gpuivf_cuda_status gpuivf_cuda_kmeans(gpuivf_cuda_resources *res, const float *x, int64_t n, int32_t d,
                                      int32_t k, const gpuivf_cuda_kmeans_params *params,
                                      float *centroids) GPUIVF_CUDA_NOEXCEPT;

/* PQ codebooks ([m][2^nbits][d/m], out) trained on n x d residuals. */
gpuivf_cuda_status gpuivf_cuda_pq_train(gpuivf_cuda_resources *res, const float *residuals, int64_t n,
                                        int32_t d, int32_t m, int32_t nbits,
                                        const gpuivf_cuda_kmeans_params *params,
                                        float *codebook) GPUIVF_CUDA_NOEXCEPT;

/* The model of a trained IVF-PQ index (arrays in host or device memory). */
typedef struct gpuivf_cuda_model {
    int32_t metric;
    int32_t d;
    int32_t nlist;
    int32_t m;
    int32_t nbits;           /* 4 or 8 */
    const float *centroids;  /* nlist x d, prepared space */
    const float *codebook;   /* m x 2^nbits x (d / m) */
} gpuivf_cuda_model;

/*
 * Train a whole model on n x d raw vectors: prepare (unit vectors for
 * cosine), coarse k-means into nlist lists, residuals, PQ codebooks.
 * centroids (nlist x d) and codebook (m x 2^nbits x d/m) out.
 */
gpuivf_cuda_status gpuivf_cuda_ivfpq_train(gpuivf_cuda_resources *res, int32_t metric, const float *x,
                                           int64_t n, int32_t d, int32_t nlist, int32_t m,
                                           int32_t nbits, const gpuivf_cuda_kmeans_params *params,
                                           float *centroids, float *codebook) GPUIVF_CUDA_NOEXCEPT;

/*
 * Encode n raw vectors: their list (nearest centroid by L2 in prepared space)
 * and PQ code of the residual, byte-for-byte what gpuivf::ivfpq_encode writes
 * (the PQ step uses the CPU's arithmetic; a vector at an exact float tie
 * between two centroids may go to either).  lists: n; codes: n x code_size.
 */
gpuivf_cuda_status gpuivf_cuda_ivfpq_encode(gpuivf_cuda_resources *res, const gpuivf_cuda_model *model,
                                            const float *x, int64_t n, int32_t *lists,
                                            uint8_t *codes) GPUIVF_CUDA_NOEXCEPT;

/* ----------------------------------------------------------- device index */

typedef struct gpuivf_cuda_index gpuivf_cuda_index;

/* How a device index keeps the raw vectors of its exact re-rank. */
enum {
    GPUIVF_CUDA_VECTORS_NONE = 0,    /* none: searches return ADC order */
    GPUIVF_CUDA_VECTORS_FLOAT32 = 1,
    GPUIVF_CUDA_VECTORS_FLOAT16 = 2  /* IEEE binary16 (pgvector's halfvec): half the memory;
                                        the re-rank's distances are those of the exactly
                                        widened values (src/core's) */
};

/*
 * A device copy of an IVF-PQ index: the model, and per list its codes, 64-bit
 * ids and (store_vectors: GPUIVF_CUDA_VECTORS_*) raw vectors for exact
 * re-ranking, in CSR form.  The model arrays are copied; the caller's may be
 * freed afterwards.
 */
gpuivf_cuda_status gpuivf_cuda_index_create(gpuivf_cuda_resources *res, const gpuivf_cuda_model *model,
                                            int32_t store_vectors,
                                            gpuivf_cuda_index **out) GPUIVF_CUDA_NOEXCEPT;
gpuivf_cuda_status gpuivf_cuda_index_destroy(gpuivf_cuda_index *index) GPUIVF_CUDA_NOEXCEPT;

/*
 * Append n entries that are already encoded (as the index pages hold them):
 * list numbers, codes (n x code_size, the CPU format), ids, and the raw
 * vectors as the index keeps them (n x d float32, or n x d IEEE halves as
 * uint16 for GPUIVF_CUDA_VECTORS_FLOAT16) when it stores vectors (NULL
 * otherwise).
 */
gpuivf_cuda_status gpuivf_cuda_index_add_encoded(gpuivf_cuda_resources *res, gpuivf_cuda_index *index,
                                                 int64_t n, const int32_t *lists, const uint8_t *codes,
                                                 const uint64_t *ids,
                                                 const void *vectors) GPUIVF_CUDA_NOEXCEPT;
/* Append n raw float32 vectors, encoding them on the GPU (a half-precision
 * index keeps them rounded to nearest half). */
gpuivf_cuda_status gpuivf_cuda_index_add(gpuivf_cuda_resources *res, gpuivf_cuda_index *index, int64_t n,
                                         const float *vectors, const uint64_t *ids) GPUIVF_CUDA_NOEXCEPT;
/* Drop every entry whose id is among ids[n]; *removed (may be NULL) counts them. */
gpuivf_cuda_status gpuivf_cuda_index_remove(gpuivf_cuda_resources *res, gpuivf_cuda_index *index,
                                            int64_t n, const uint64_t *ids,
                                            int64_t *removed) GPUIVF_CUDA_NOEXCEPT;

typedef struct gpuivf_cuda_index_stats {
    int64_t vectors;
    int32_t nlist;
    int32_t code_size;
    int64_t min_list, max_list;
    int64_t device_bytes; /* memory held by the index */
} gpuivf_cuda_index_stats;
gpuivf_cuda_status gpuivf_cuda_index_get_stats(gpuivf_cuda_index *index,
                                               gpuivf_cuda_index_stats *out) GPUIVF_CUDA_NOEXCEPT;

/* Read one list back (in storage order) in the CPU's code format: *count
 * entries; ids and codes may be NULL; capacity bounds what is written. */
gpuivf_cuda_status gpuivf_cuda_index_get_list(gpuivf_cuda_resources *res, gpuivf_cuda_index *index,
                                              int32_t list, int64_t capacity, int64_t *count,
                                              uint64_t *ids, uint8_t *codes) GPUIVF_CUDA_NOEXCEPT;

enum {
    /* Look-up tables by the term decomposition of Jégou et al.: one table per
     * query (list independent) plus a per-entry term stored at add time; the
     * fastest, scores differ from the CPU's in the last bits. */
    GPUIVF_CUDA_LUT_AUTO = 0,
    GPUIVF_CUDA_LUT_DECOMPOSED = 1,
    /* One residual table per (query, list) with the CPU's arithmetic: ADC
     * scores bit-identical to gpuivf::ivfpq_build_lut + ivfpq_adc_scores. */
    GPUIVF_CUDA_LUT_PER_LIST = 2
};

typedef struct gpuivf_cuda_search_params {
    int32_t k;                 /* results per query, 1..1024 */
    int32_t nprobe;            /* lists per query, 1..1024 (capped at nlist) */
    int32_t rerank_candidates; /* 0: return ADC order; R > 0: take the R best by ADC and
                                  re-rank them exactly on the stored vectors (R >= k) */
    int32_t lut_mode;          /* GPUIVF_CUDA_LUT_* */
    const int32_t *query_k;      /* optional, nq values: per-query k (<= k) */
    const int32_t *query_nprobe; /* optional, nq values: per-query nprobe (<= nprobe) */
    int32_t host_arrays;       /* 1: the caller promises that queries, outputs and the
                                  per-query arrays are host memory (the engine then skips
                                  asking the driver about each pointer: ~5 driver calls
                                  of a small search's host time); 0: any memory */
    double *out_adc_distances; /* optional, nq x k like out_distances: the SQL-scale distance of the
                                  ADC score each returned entry was selected by
                                  (gpuivf::ivfpq_score_to_distance), +inf for padding; without
                                  re-rank the same as out_distances.  Host or device memory as
                                  the other outputs (host with host_arrays).  The GPU worker's
                                  shard merge needs both of a re-ranked entry's distances; one
                                  search gives them (asynchronously too) instead of two */
    int32_t min_probes_per_block; /* 0 or 1: a query's probes are split over as many blocks as fill
                                     the GPU, the lowest latency of a lone search; P > 1: at least P
                                     probes a block, fewer and longer blocks, which can give more
                                     throughput when many searches run at once on several
                                     resources objects (same results either way) */
    int32_t block_codes_per_candidate; /* 0: off; C > 0: at least as many probes a block as keep
                                          its codes (at the index's mean list size) within C for
                                          each candidate it keeps (max(k, rerank_candidates)),
                                          when that is more than min_probes_per_block: longer
                                          blocks where each keeps many candidates (the GPU
                                          worker's choice under load; same results either way) */
} gpuivf_cuda_search_params;

/*
 * Batched IVF-PQ search of nq raw queries (nq x d).  Outputs are nq x k (the
 * params' k is the row stride), best first: out_distances are the SQL-scale
 * distances (with re-rank: gpuivf::metric_distance of the raw vectors, the
 * same bits as the CPU; without: gpuivf::ivfpq_score_to_distance of the ADC
 * score), out_ids the entries' ids; unused slots +inf / UINT64_MAX.  With
 * the params' out_adc_distances, also each returned entry's ADC distance
 * (delivered with the other outputs; by gpuivf_cuda_search_wait when
 * asynchronous).
 */
gpuivf_cuda_status gpuivf_cuda_index_search(gpuivf_cuda_resources *res, gpuivf_cuda_index *index,
                                            const float *queries, int64_t nq,
                                            const gpuivf_cuda_search_params *params,
                                            double *out_distances,
                                            uint64_t *out_ids) GPUIVF_CUDA_NOEXCEPT;

/*
 * The same search, started on res's stream and left running: the queries
 * and the params' arrays are read before it returns, the outputs are valid
 * after gpuivf_cuda_search_wait(res).  One search at a time per resources
 * object; searches on different resources objects run concurrently (their
 * own streams), and the index must not change until they are waited for.
 */
gpuivf_cuda_status gpuivf_cuda_index_search_async(gpuivf_cuda_resources *res, gpuivf_cuda_index *index,
                                                  const float *queries, int64_t nq,
                                                  const gpuivf_cuda_search_params *params,
                                                  double *out_distances,
                                                  uint64_t *out_ids) GPUIVF_CUDA_NOEXCEPT;
/* *done = 1 when res's started search has finished on the GPU (or none is
 * pending), else 0; does not wait. */
gpuivf_cuda_status gpuivf_cuda_search_done(gpuivf_cuda_resources *res, int32_t *done) GPUIVF_CUDA_NOEXCEPT;
/* Waits for res's started search and delivers its outputs (its errors are
 * reported here); a no-op when none is pending. */
gpuivf_cuda_status gpuivf_cuda_search_wait(gpuivf_cuda_resources *res) GPUIVF_CUDA_NOEXCEPT;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GPUIVF_CUDA_H */
