/*
 * core_internal.h — helpers shared by the files of src/core; not installed,
 * not included by src/pg or cuda/.
 */
#ifndef GPUIVF_CORE_INTERNAL_H
#define GPUIVF_CORE_INTERNAL_H

#include <cstdint>
#include <vector>

#include "gpuivf_core.h"
#include "random.h"

namespace gpuivf {
namespace detail {

/* True when the caller asked to stop (a null hook never does). */
inline bool canceled(const CancelHook *hook) noexcept {
    return hook != nullptr && hook->should_cancel != nullptr && hook->should_cancel(hook->arg);
}

Status canceled_status() noexcept;
Status out_of_memory_status(const char *what) noexcept;
Status internal_error_status(const char *what) noexcept;

/* The engine's deterministic random numbers (random.h): xoshiro256**. */
using Rng = Xoshiro256;

/* Row indices of a uniform sample of `count` rows out of n (sorted, so the
 * copied rows are read in memory order), drawn by Rng(seed). */
std::vector<int64_t> sample_rows(int64_t n, int64_t count, uint64_t seed);

/* Copy the listed rows of x into a contiguous array. */
std::vector<float> gather_rows(const float *x, int d, const std::vector<int64_t> &rows);

/*
 * Lloyd k-means (kmeans_train's work) without its argument checks, for
 * pq_train, whose residuals may reach twice kmeans_train's value bound;
 * throws std::bad_alloc (callers catch it).
 */
Status kmeans_run(const float *x, int64_t n, int d, int k, const KMeansParams &params,
                  float *centroids, const CancelHook *cancel);

/*
 * C = A * B^T for row-major A (rows x d) and B (cols x d): C is rows x cols.
 * Single-threaded OpenBLAS sgemm.
 */
void gemm_abt(const float *a, int64_t rows, const float *b, int64_t cols, int d, float *c) noexcept;

/* Tile sizes of the GEMM-shaped loops: a tile of distances is
 * kRowTile x kColTile floats (4 MiB), small enough for L2/L3 reuse. */
constexpr int64_t kRowTile = kAssignRowBlock;
constexpr int64_t kColTile = 1024;

/*
 * Squared L2 distances of a tile: out[i * cols + j] = |x_i|^2 + |c_j|^2 -
 * 2 x_i.c_j for rows x (with norms xn) and cols c (with norms cn), clamped at
 * 0 (the GEMM form can round below it).
 */
void l2_sq_tile(const float *x, const float *xn, int64_t rows, const float *c, const float *cn,
                int64_t cols, int d, float *out) noexcept;

/*
 * Nearest of k centroids stored transposed (ct[t * k + j] = component t of
 * centroid j) for one vector x: vectorises over the centroids, which beats a
 * GEMM when d is small (PQ sub-spaces).  Ties go to the smaller index;
 * best_dist (squared L2) may be null.
 */
int32_t nearest_transposed(const float *x, const float *ct, int k, int d, float *best_dist) noexcept;
/* ct = transpose of c (k x d). */
void transpose(const float *c, int k, int d, float *ct) noexcept;

/*
 * Nearest centroid for each of n vectors (labels, and squared distances when
 * dists is not null).  xnorms (only used for dists) and cnorms may be null:
 * they are computed on the fly.
 * Allocates (may throw std::bad_alloc: callers catch).
 */
Status assign_rows(const float *c, const float *cnorms, int k, int d, const float *x,
                   const float *xnorms, int64_t n, int32_t *labels, float *dists,
                   const CancelHook *cancel);

/* Sub-quantizer j's code in a packed code (layout: see pq_code_size). */
inline int pq_get_code(const uint8_t *code, int j, int nbits) noexcept {
    if (nbits == 8) return code[j];
    const uint8_t byte = code[j >> 1];
    return (j & 1) ? (byte >> 4) : (byte & 0x0f);
}
/* Store sub-quantizer j's code; 4-bit codes must start from zeroed bytes. */
inline void pq_set_code(uint8_t *code, int j, int nbits, int value) noexcept {
    if (nbits == 8) {
        code[j] = static_cast<uint8_t>(value);
        return;
    }
    code[j >> 1] |= static_cast<uint8_t>((j & 1) ? (value << 4) : value);
}

/*
 * Total order of (score, id) pairs used by every selection: smaller score
 * first, NaN after everything (as PostgreSQL sorts float8), then smaller id.
 */
template <typename Id>
inline bool pair_less(float av, Id aid, float bv, Id bid) noexcept {
    if (av < bv) return true;
    if (bv < av) return false;
    const bool an = av != av, bn = bv != bv;
    if (an != bn) return bn; /* the non-NaN one is smaller */
    return aid < bid;
}

/*
 * Bounded max-heap over caller-owned arrays keeping the k smallest pairs;
 * TopK (uint64 ids) and the probe selection (int32 list numbers) share it.
 */
template <typename Id>
void heap_push(float *vals, Id *ids, int k, int *size, float v, Id id) noexcept;
template <typename Id>
void heap_sort(float *vals, Id *ids, int size) noexcept;

}  // namespace detail
}  // namespace gpuivf

#endif /* GPUIVF_CORE_INTERNAL_H */
