/*
 * knn.h — exact k nearest neighbours: cuBLAS GEMM tiles for the inner
 * products and a fused norm-add + k-select kernel, then (by default) an exact
 * re-score of a wider shortlist with the CPU's arithmetic.  Serves the
 * coarse quantizer, encoding, k-means assignment and exact ground truth.
 * Small batches (<= 512 queries) against small bases (<= 4096 rows: the
 * centroids) skip the GEMM: every score exact, one sort per query.
 */
#ifndef GPUIVF_CUDA_KNN_H
#define GPUIVF_CUDA_KNN_H

#include "resources.h"

namespace gpuivf_cuda {

struct KnnOptions {
    bool exact_rescore = true;     /* shortlist k + max(k, 16), re-scored exactly */
    bool queries_prepared = false; /* cosine: queries are unit vectors already */
    bool gemm_only = false;        /* benchmark: the GEMM tiles alone, no selection */
    /* also the ids as int32, -1 for none (an IVF-PQ search's probed lists):
     * written by the direct path's sort itself, one launch less */
    int32_t *out_lists = nullptr;
};

/*
 * Device arrays: base (n x d raw), queries (nq x d raw unless prepared);
 * out_scores / out_ids nq x k, the internal scores ascending (see
 * gpuivf::exact_knn), padded with +inf / UINT64_MAX.  n < 2^32 - 1.
 */
void exact_knn(Resources &res, Metric metric, const float *base, int64_t n, const float *queries, int64_t nq, int d,
               int k, const KnnOptions &opts, float *out_scores, uint64_t *out_ids);

/* The direct path (no GEMM, one stream): exact re-score wanted, not cosine,
 * at most this many base rows and queries. */
constexpr int64_t kKnnDirectMaxBase = 4096;
constexpr int64_t kKnnDirectMaxQueries = 512;

}  // namespace gpuivf_cuda

#endif /* GPUIVF_CUDA_KNN_H */
