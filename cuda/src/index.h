/*
 * index.h — the device IVF-PQ index.
 *
 * Lists in CSR form over one set of arrays: list l owns the positions
 * [offset[l], offset[l] + capacity[l]) of which the first size[l] are used.
 * Offsets and capacities are multiples of 32 so codes can be stored
 * interleaved by groups of 32 entries (see ivfpq_scan.cuh).  Per position:
 *  - the code, as `code_chunks` 16-byte chunks (zero padded past code_size);
 *  - the 64-bit id (a heap TID packed by src/pg fits);
 *  - for L2 and cosine, the list-independent term |r|^2 + 2 <c, r> of the
 *    decomposed look-up tables (4 bytes);
 *  - with store_vectors, the raw vector for the exact re-rank: float32, or
 *    (half_vectors) IEEE halves, in 16-bit words either way.
 * Appending fills each list's spare capacity and re-lays out all lists (with
 * 25% headroom) only when some list is full; removing ids compacts the lists
 * the same way.  Positions are 32-bit (fewer than 2^32 - 1 entries).
 */
#ifndef GPUIVF_CUDA_INDEX_H
#define GPUIVF_CUDA_INDEX_H

#include <vector>

#include "resources.h"
#include "train.h"

struct gpuivf_cuda_index {
    gpuivf_cuda::Resources *res = nullptr;
    gpuivf_cuda::Metric metric = gpuivf_cuda::Metric::L2;
    int d = 0, nlist = 0, m = 0, nbits = 8;
    int ksub = 256, dsub = 0;
    int code_size = 0;   /* the CPU's bytes per code */
    int code_chunks = 0; /* 16-byte chunks per stored code */
    int m_pad = 0;       /* sub-quantizers covered by the chunks */
    bool store_vectors = false;
    bool half_vectors = false; /* stored as IEEE halves (GPUIVF_CUDA_VECTORS_FLOAT16) */
    int vector_words = 0;      /* 16-bit words of one stored vector: d (halves) or 2d */

    gpuivf_cuda::DeviceArray<float> centroids, codebook;
    gpuivf_cuda::DeviceArray<float> codebook_t; /* 8-bit: [ksub][m][dsub], for ivfpq_scan8.cuh */

    std::vector<int64_t> offset, size, capacity; /* host copies, per list */
    /* Unique over all indexes of the process, renewed by every change of the
     * arrays or list sizes: a recorded search (a CUDA graph, api.cu) is
     * replayed only for the version it was recorded on. */
    uint64_t version = 0;
    int64_t total_capacity = 0;
    int64_t count = 0;
    gpuivf_cuda::DeviceArray<uint32_t> d_offset;
    gpuivf_cuda::DeviceArray<int32_t> d_size;
    gpuivf_cuda::DeviceArray<uint4> codes;
    gpuivf_cuda::DeviceArray<uint64_t> ids;
    gpuivf_cuda::DeviceArray<float> term2;
    /* raw stored vectors, vector_words 16-bit words each (float32 pairs or halves) */
    gpuivf_cuda::DeviceArray<uint16_t> vectors;
};

namespace gpuivf_cuda {

using Index = gpuivf_cuda_index;

ModelView index_model(const Index &ix);

/* Give ix a new version (after any change of its arrays or sizes). */
void index_changed(Index &ix);

void index_init(Resources &res, Index &ix, Metric metric, int d, int nlist, int m, int nbits,
                const float *centroids, const float *codebook, int vectors_kind);

/* Append encoded entries (device arrays; lists also given on the host). */
void index_add_encoded(Resources &res, Index &ix, int64_t n, const int32_t *lists_host, const int32_t *lists_dev,
                       const uint8_t *codes, const uint64_t *ids, const uint16_t *vectors);

/* dst[i] = src[i] rounded to the nearest IEEE half (ties to even), on res's stream. */
void narrow_to_halves(Resources &res, const float *src, int64_t n, uint16_t *dst);

/* Remove entries by id (host array); returns how many were removed. */
int64_t index_remove(Resources &res, Index &ix, int64_t n, const uint64_t *ids_host);

/* One list back in the CPU's code format (device outputs). */
void index_get_list(Resources &res, const Index &ix, int list, int64_t count, uint64_t *ids, uint8_t *codes);

int64_t index_device_bytes(const Index &ix);

/* Search (search.cu). */
struct SearchParams {
    int k = 10;
    int nprobe = 1;
    int rerank = 0;
    int lut_mode = 0;
    int min_probes_per_block = 1;          /* gpuivf_cuda_search_params' */
    const int32_t *query_k = nullptr;      /* host, validated */
    const int32_t *query_nprobe = nullptr; /* host, validated */
    /* Device copies of the per-query arrays, when the caller staged them
     * (a recorded search, api.cu): search_query_ks's qk and kscan, and
     * query_nprobe (when given). */
    const int32_t *staged_qk = nullptr, *staged_kscan = nullptr, *staged_qnp = nullptr;
    /* Device output, nq x k, or null: each returned entry's ADC score as a
     * SQL-scale distance (gpuivf_cuda_search_params' out_adc_distances). */
    double *out_adc = nullptr;
};

/* Per-query k of the output (qk) and of the scan (kscan: the re-rank
 * shortlist when re-ranking), host arrays of nq; returns the largest kscan. */
int search_query_ks(const SearchParams &p, int64_t nq, int32_t *qk, int32_t *kscan);
void index_search(Resources &res, Index &ix, const float *queries, int64_t nq, const SearchParams &p,
                  double *out_distances, uint64_t *out_ids);

/* A small search from host arrays as a recorded CUDA graph
 * (search_graph.cu): recorded on the first search of its shape, replayed
 * after.  True when it was launched on res.stream; its results are then at
 * *pinned_distances / *pinned_ids (and, with adc, the ADC distances at
 * *pinned_adc; else null there) once the stream is done.  p.out_adc is
 * not used: the graph writes the ADC distances to pinned memory.  False:
 * search as usual (not recordable; nothing was queued). */
bool search_recorded(Resources &res, Index &ix, const float *queries, int64_t nq, const SearchParams &p, bool adc,
                     double **pinned_distances, uint64_t **pinned_ids, double **pinned_adc);

}  // namespace gpuivf_cuda

#endif /* GPUIVF_CUDA_INDEX_H */
