/*
 * vectors.h — per-row helpers: squared norms and prepared (cosine: unit)
 * vectors, with src/core's arithmetic so prepared vectors are the CPU's bits.
 */
#ifndef GPUIVF_CUDA_VECTORS_H
#define GPUIVF_CUDA_VECTORS_H

#include "resources.h"

namespace gpuivf_cuda {

/*
 * norms[i] = |x_i|^2 in the CPU's summation order (may be null).  With scale,
 * also what prepare_vector(Cosine) multiplies row i by (1/|x_i|, or 1 when
 * the norm is 0), and with prep_norms the squared norm of the prepared row.
 */
void row_norms(Resources &res, const float *x, int64_t n, int d, float *norms, float *scale, float *prep_norms);

/* out = prepare_vector(m, x_i) for every row: unit vectors for cosine, a copy
 * otherwise.  out may equal x. */
void prepare_rows(Resources &res, Metric m, const float *x, int64_t n, int d, float *out);

/* out[i] = a[i] - b[lists[i]] (rows of d floats): residuals. */
void residuals(Resources &res, const float *x, const int32_t *lists, const float *centroids, int64_t n, int d,
               float *out);

}  // namespace gpuivf_cuda

#endif /* GPUIVF_CUDA_VECTORS_H */
