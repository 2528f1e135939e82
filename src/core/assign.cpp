/*
 * assign.cpp — nearest-centroid assignment, the GEMM-shaped core of k-means
 * training and of encoding many vectors: distances are formed tile by tile as
 * |x|^2 - 2 x.c + |c|^2 with one sgemm per tile.
 */
#include <algorithm>
#include <limits>
#include <new>

#include "core_internal.h"

/* The 32-byte vector types below never cross a non-inlined call, so the
 * AVX/SSE argument-passing difference GCC warns about cannot arise. */
#pragma GCC diagnostic ignored "-Wpsabi"

namespace gpuivf {
namespace detail {

void l2_sq_tile(const float *x, const float *xn, int64_t rows, const float *c, const float *cn,
                int64_t cols, int d, float *out) noexcept {
    gemm_abt(x, rows, c, cols, d, out);
    for (int64_t i = 0; i < rows; i++) {
        float *row = out + i * cols;
        const float xi = xn[i];
        for (int64_t j = 0; j < cols; j++) {
            float v = xi + cn[j] - 2.0f * row[j];
            row[j] = v > 0.0f ? v : 0.0f;
        }
    }
}

void transpose(const float *c, int k, int d, float *ct) noexcept {
    for (int j = 0; j < k; j++)
        for (int t = 0; t < d; t++) ct[static_cast<int64_t>(t) * k + j] = c[static_cast<int64_t>(j) * d + t];
}

namespace {

/* Eight floats or ints: GCC vector extensions give one AVX2 register in the
 * avx2 clone and two SSE registers in the baseline one, with no intrinsics. */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

__attribute__((always_inline)) inline v8f load8(const float *p) noexcept {
    v8f v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

/*
 * Arg-min over a row of values fed eight at a time: each lane keeps its own
 * first minimum (a select, so the loop vectorises); finish() picks the best
 * lane with ties to the smaller index.  Values fed one by one afterwards
 * (a row's tail) must have larger indices than every lane's.
 */
struct LaneArgMin {
    v8f min;
    v8i arg;
    float best_val;
    int32_t best;

    __attribute__((always_inline)) inline void init() noexcept {
        const float inf = std::numeric_limits<float>::infinity();
        min = v8f{inf, inf, inf, inf, inf, inf, inf, inf};
        arg = v8i{-1, -1, -1, -1, -1, -1, -1, -1};
    }
    __attribute__((always_inline)) inline void add8(v8f vals, int32_t j) noexcept {
        const v8i idx = v8i{0, 1, 2, 3, 4, 5, 6, 7} + j;
        const v8i better = vals < min;
        min = better ? vals : min;
        arg = better ? idx : arg;
    }
    __attribute__((always_inline)) inline void finish() noexcept {
        best_val = std::numeric_limits<float>::infinity();
        best = -1;
        for (int l = 0; l < 8; l++) {
            if (arg[l] >= 0 && (best < 0 || min[l] < best_val || (min[l] == best_val && arg[l] < best))) {
                best_val = min[l];
                best = arg[l];
            }
        }
    }
    __attribute__((always_inline)) inline void add1(float val, int32_t j) noexcept {
        if (best < 0 || val < best_val) {
            best_val = val;
            best = j;
        }
    }
};

/* The kernel of nearest_transposed; D > 0 fixes the dimension at compile
 * time so the loop over it unrolls (PQ sub-spaces are 2, 4, 8... wide). */
template <int D>
__attribute__((always_inline)) inline int32_t nearest_kernel(const float *x, const float *ct, int k,
                                                             int d, float *best_dist) noexcept {
    const int dims = D > 0 ? D : d;
    /* Eight centroids at a time: their distances accumulate in one vector, so
     * nothing is stored in between. */
    LaneArgMin am;
    am.init();
    int j = 0;
    for (; j + 8 <= k; j += 8) {
        v8f acc = {};
        for (int t = 0; t < dims; t++) {
            v8f diff = x[t] - load8(ct + static_cast<int64_t>(t) * k + j);
            acc += diff * diff;
        }
        am.add8(acc, j);
    }
    am.finish();
    for (; j < k; j++) {
        float acc = 0.0f;
        for (int t = 0; t < dims; t++) {
            float diff = x[t] - ct[static_cast<int64_t>(t) * k + j];
            acc += diff * diff;
        }
        am.add1(acc, j);
    }
    if (am.best < 0) { /* only NaN distances */
        if (best_dist) *best_dist = std::numeric_limits<float>::quiet_NaN();
        return 0;
    }
    if (best_dist) *best_dist = am.best_val;
    return am.best;
}

/*
 * Arg-min of |c_j|^2 - 2 x.c_j over one row of a GEMM tile (ip[j] = x.c_j):
 * the squared distance without the row's constant |x|^2.
 */
__attribute__((target_clones("avx2", "default")))
int32_t tile_row_argmin(const float *ip, const float *cn, int64_t cols, float *best_val) noexcept {
    LaneArgMin am;
    am.init();
    int64_t j = 0;
    for (; j + 8 <= cols; j += 8) am.add8(load8(cn + j) - 2.0f * load8(ip + j), static_cast<int32_t>(j));
    am.finish();
    for (; j < cols; j++) am.add1(cn[j] - 2.0f * ip[j], static_cast<int32_t>(j));
    *best_val = am.best_val;
    return am.best;
}

}  // namespace

__attribute__((target_clones("avx2", "default")))
int32_t nearest_transposed(const float *x, const float *ct, int k, int d, float *best_dist) noexcept {
    switch (d) {
        case 1: return nearest_kernel<1>(x, ct, k, d, best_dist);
        case 2: return nearest_kernel<2>(x, ct, k, d, best_dist);
        case 4: return nearest_kernel<4>(x, ct, k, d, best_dist);
        case 8: return nearest_kernel<8>(x, ct, k, d, best_dist);
        default: return nearest_kernel<0>(x, ct, k, d, best_dist);
    }
}

/* Below this dimension (and up to this many centroids) the transposed direct
 * kernel is faster than a GEMM whose inner dimension is tiny. */
constexpr int kDirectMaxDims = 16;
constexpr int kDirectMaxCentroids = 4096;

static Status assign_direct(const float *c, int k, int d, const float *x, int64_t n,
                            int32_t *labels, float *dists, const CancelHook *cancel) {
    std::vector<float> ct(static_cast<size_t>(k) * d);
    transpose(c, k, d, ct.data());
    for (int64_t i = 0; i < n; i++) {
        if ((i & 0xffff) == 0 && canceled(cancel)) return canceled_status();
        float dist;
        labels[i] = nearest_transposed(x + i * d, ct.data(), k, d, &dist);
        if (dists) dists[i] = dist;
    }
    return status_ok();
}

Status assign_rows(const float *c, const float *cnorms, int k, int d, const float *x,
                   const float *xnorms, int64_t n, int32_t *labels, float *dists,
                   const CancelHook *cancel) {
    if (n == 0) return status_ok();
    if (d <= kDirectMaxDims && k <= kDirectMaxCentroids)
        return assign_direct(c, k, d, x, n, labels, dists, cancel);

    std::vector<float> cn_buf;
    if (cnorms == nullptr) {
        cn_buf.resize(k);
        row_norms(c, k, d, cn_buf.data());
        cnorms = cn_buf.data();
    }
    const int64_t row_tile = std::min<int64_t>(n, kRowTile);
    const int64_t col_tile = std::min<int64_t>(k, kColTile);
    std::vector<float> tile(static_cast<size_t>(row_tile * col_tile));
    std::vector<float> best(row_tile);

    for (int64_t r0 = 0; r0 < n; r0 += row_tile) {
        if (canceled(cancel)) return canceled_status();
        const int64_t rows = std::min(row_tile, n - r0);
        const float *xr = x + r0 * d;
        std::fill(best.begin(), best.begin() + rows, std::numeric_limits<float>::infinity());
        for (int64_t i = 0; i < rows; i++) labels[r0 + i] = 0;
        for (int64_t c0 = 0; c0 < k; c0 += col_tile) {
            const int64_t cols = std::min<int64_t>(col_tile, k - c0);
            gemm_abt(xr, rows, c + c0 * d, cols, d, tile.data());
            for (int64_t i = 0; i < rows; i++) {
                float val;
                int32_t arg = tile_row_argmin(tile.data() + i * cols, cnorms + c0, cols, &val);
                /* Strict: on a tie the earlier tile's smaller index stays. */
                if (arg >= 0 && val < best[i]) {
                    best[i] = val;
                    labels[r0 + i] = static_cast<int32_t>(c0 + arg);
                }
            }
        }
        if (dists) {
            for (int64_t i = 0; i < rows; i++) {
                const float xn = xnorms ? xnorms[r0 + i] : inner_product(xr + i * d, xr + i * d, d);
                const float dist = xn + best[i];
                dists[r0 + i] = dist > 0.0f ? dist : 0.0f;
            }
        }
    }
    return status_ok();
}

}  // namespace detail

Status assign_nearest(const float *centroids, const float *centroid_norms, int k, int d,
                      const float *x, int64_t n, int32_t *labels, float *dists,
                      const CancelHook *cancel) noexcept {
    if (k < 1 || d < 1 || n < 0 || centroids == nullptr || (n > 0 && (x == nullptr || labels == nullptr)))
        return status_error(kInvalidArgument, "invalid arguments to assign_nearest");
    try {
        return detail::assign_rows(centroids, centroid_norms, k, d, x, nullptr, n, labels, dists,
                                   cancel);
    } catch (const std::bad_alloc &) {
        return detail::out_of_memory_status("assign_nearest");
    } catch (...) {
        return detail::internal_error_status("assign_nearest");
    }
}

}  // namespace gpuivf
