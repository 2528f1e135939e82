/*
 * blas.cpp — the one place that talks to OpenBLAS.
 */
#include <cblas.h>

#include "core_internal.h"

namespace gpuivf {

void init_blas_single_threaded() noexcept {
    /* A PostgreSQL backend is single-threaded: helper threads would compete
     * with other backends for the cores and could receive its signals. */
    openblas_set_num_threads(1);
}

namespace detail {

void gemm_abt(const float *a, int64_t rows, const float *b, int64_t cols, int d, float *c) noexcept {
    if (rows == 0 || cols == 0) return;
    /* Also when the caller forgot init_blas_single_threaded(). */
    static const bool single_threaded = (init_blas_single_threaded(), true);
    (void) single_threaded;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                static_cast<int>(cols), d, 1.0f, a, d, b, d, 0.0f, c, static_cast<int>(cols));
}

}  // namespace detail
}  // namespace gpuivf
