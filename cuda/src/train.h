/*
 * train.h — GPU training and encoding: k-means (coarse quantizer), PQ
 * codebooks (a batch of small k-means, one per sub-space), the IVF-PQ
 * encoding of many vectors, and the per-entry term of the decomposed
 * look-up tables.  All arrays are device arrays.
 */
#ifndef GPUIVF_CUDA_TRAIN_H
#define GPUIVF_CUDA_TRAIN_H

#include "resources.h"

namespace gpuivf_cuda {

struct KMeansParams {
    int niter = 20;
    uint64_t seed = 1234;
    int max_points_per_centroid = 256; /* <= 0: every point */
};

/* Lloyd k-means of n x d points into k centroids (k x d out). */
void kmeans(Resources &res, const float *x, int64_t n, int d, int k, const KMeansParams &p, float *centroids);

/* m codebooks of 2^nbits codewords on n x d residuals: [m][ksub][d/m] out. */
void pq_train(Resources &res, const float *residuals, int64_t n, int d, int m, int nbits, const KMeansParams &p,
              float *codebook);

/* The device view of a model (prepared-space centroids). */
struct ModelView {
    Metric metric;
    int d, nlist, m, nbits;
    const float *centroids;
    const float *codebook;
};

/* Whole model from raw vectors: prepare, k-means, residual PQ. */
void ivfpq_train(Resources &res, Metric metric, const float *x, int64_t n, int d, int nlist, int m, int nbits,
                 const KMeansParams &p, float *centroids, float *codebook);

/* Lists and codes (CPU format, n x code_size) of n raw vectors. */
void ivfpq_encode(Resources &res, const ModelView &model, const float *x, int64_t n, int32_t *lists, uint8_t *codes);

/* PQ codes of prepared vectors whose lists are known (CPU arithmetic). */
void pq_encode_with_lists(Resources &res, const ModelView &model, const float *xp, const int32_t *lists, int64_t n,
                          uint8_t *codes);

/* Nearest list (L2, exact re-score) of n prepared vectors. */
void assign_lists(Resources &res, const ModelView &model, const float *xp, int64_t n, int32_t *lists);

int pq_code_size(int m, int nbits);

}  // namespace gpuivf_cuda

#endif /* GPUIVF_CUDA_TRAIN_H */
