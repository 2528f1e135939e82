/*
 * select.h — the k-selection kernels and their launchers.
 *
 * Two kernels carry a WarpSelect and are therefore instantiated once per
 * k-bucket (32, 64, ..., 1024), each bucket in its own translation unit
 * (select_k32.cu ... select_k1024.cu) so the build parallelises and no file
 * grows huge; the bucket is chosen at run time from k:
 *  - select_rows: WarpSelect / BlockSelect over rows of floats (exact kNN
 *    tiles, select_k) or of packed keys (the second pass that merges
 *    partial results);
 *  - ivfpq_scan: the IVF-PQ list scan, with the look-up table in shared
 *    memory and the selection fused in (ivfpq_scan.cuh, and for 8-bit
 *    codes with query tables the conflict-free ivfpq_scan8.cuh).
 */
#ifndef GPUIVF_CUDA_SELECT_H
#define GPUIVF_CUDA_SELECT_H

#include "resources.h"

namespace gpuivf_cuda {

/* Block rows: one block per (row, column split): blockIdx.x = row,
 * blockIdx.y = split.  Warp rows (warp_rows = 1, one split): each warp of a
 * block selects its own row, blockIdx.x = row / 4. */
struct SelectRowsArgs {
    int32_t warp_rows = 0;
    const float *values = nullptr; /* float input, or */
    const Key *keys = nullptr;     /* packed keys (then scale/add/negate do not apply) */
    int64_t ld = 0;                /* input row stride, elements */
    int64_t rows = 0, cols = 0;
    int64_t split_cols = 0;        /* columns per split (a multiple of 4) */
    int32_t negate = 0;            /* select the largest: v = -v */
    uint32_t index_base = 0;       /* key index = index_base + column */
    const Key *init = nullptr;     /* previous best keys of each row (one split only) */
    int64_t init_ld = 0;
    const int32_t *row_k = nullptr; /* per-row k, or */
    int32_t k = 0;
    /* keys: the row is sorted runs of run_len keys, entries past the row's k
     * the sentinel (split results).  The k-th of every run bounds the row's
     * k-th from above, so the smallest of them starts the threshold: most
     * of each run is rejected at the first compare. */
    int32_t run_len = 0;
    Key *out = nullptr;            /* row (row * splits + split), out_count keys */
    int64_t out_ld = 0;
    int32_t out_count = 0;         /* <= the bucket; entries >= k are the sentinel */
};

/* One block per (probe split, query): blockIdx.x = split, blockIdx.y = query. */
struct IvfPqScanArgs {
    int32_t nq = 0, splits = 1, probes_per_split = 0;
    const float *queries = nullptr; /* prepared, nq x d */
    int32_t d = 0;
    const int32_t *probe_lists = nullptr; /* nq x probe_ld, -1 = none */
    const float *probe_bias = nullptr;    /* coarse score of each probe */
    int32_t probe_ld = 0;
    const int32_t *query_nprobe = nullptr;
    int32_t nprobe = 0;
    const int32_t *query_k = nullptr;
    int32_t k = 0;
    const uint4 *codes = nullptr;   /* interleaved: see index.h */
    int32_t code_chunks = 0;        /* 16-byte chunks per code */
    const float *term2 = nullptr;   /* decomposed L2/cosine: per-entry term */
    const uint32_t *list_offset = nullptr;
    const int32_t *list_size = nullptr;
    const float *codebook = nullptr;
    const float *centroids = nullptr;
    int32_t m = 0, nbits = 8, dsub = 0, ksub = 256, m_pad = 0;
    int32_t metric = 1;
    int32_t per_list_lut = 0;       /* residual LUT per (query, list), CPU arithmetic */
    /* the collecting scan with 2 x kScanThreads threads a block: set when a
     * block's shared memory leaves room for no second block on a
     * multiprocessor (ivfpq_scan_wide_blocks) */
    int32_t wide_blocks = 0;
    /* 8-bit codes, decomposed tables: the conflict-free scan of
     * ivfpq_scan8.cuh, its table built from the codebook transposed to
     * [ksub][m][dsub] */
    int32_t scan8 = 0;
    int32_t scan8_pairs = 0;        /* two queries a block (ivfpq_scan8_pairs) */
    const float *codebook_t = nullptr;
    Key *out = nullptr;             /* row (query * splits + split) */
    int64_t out_ld = 0;
    int32_t out_count = 0;
    /* Set when the runs go to the re-rank, which ranks them itself: a run's
     * keys may then be in any order (the collecting scan skips its sort),
     * and out_bound[query * splits + split] is a key at or above the run's
     * k-th (the sentinel when it has fewer than k keys).  Null: runs
     * ascending (select_keys merges them). */
    Key *out_bound = nullptr;
};

/* Threads per block of each kernel. */
constexpr int kSelectRowsThreads = 128;
constexpr int kScanThreads = 256;

/* ivfpq_scan.cuh selects the k-buckets kScanCollectMinW..kScanCollectMaxW
 * by collecting keys (up to ivfpq_scan_collect_capacity before a cut)
 * instead of WarpSelect (the GPU worker's 200-1,000 candidates: DESIGN.md).
 * Small k stays with WarpSelect: its running k-th forms within a warp's
 * first codes (k = 10 per-list search of 10k queries: 10.9 ms WarpSelect,
 * 11.5 ms collecting). */
constexpr int kScanCollectMinW = 128;
constexpr int kScanCollectMaxW = 1024;
constexpr bool ivfpq_scan_collects(int w) { return w >= kScanCollectMinW && w <= kScanCollectMaxW; }
/* keys collected before a cut: room for several steps of the block's
 * codes after a cut has kept k */
constexpr int ivfpq_scan_collect_capacity(int w) { return w <= 256 ? 2048 : 4 * w; }
/* its shared memory: the collected keys, then a cut's k best */
constexpr size_t ivfpq_scan_collect_bytes(int w) { return sizeof(Key) * (ivfpq_scan_collect_capacity(w) + w); }

/* Blocks that hold more than half a multiprocessor's shared memory (the
 * per-list tables of 96 sub-quantizers: 98 KB) run alone on it, and 8 warps
 * cannot hide the latency of the table's codebook reads and of the codes'
 * loads: such blocks of the collecting scan get twice the threads. */
inline bool ivfpq_scan_wide_blocks(int w, size_t smem_bytes, size_t smem_optin) {
    return ivfpq_scan_collects(w) && 2 * smem_bytes > smem_optin;
}

/* Launch one bucket (w = 32 ... 1024); grid as documented above. */
void launch_select_rows(int w, const SelectRowsArgs &a, int splits, cudaStream_t stream);
void launch_ivfpq_scan(int w, const IvfPqScanArgs &a, size_t smem_bytes, cudaStream_t stream);

/* Shared memory of the scan kernels: thread queues (first), the per-probe
 * arrays, then the larger of the look-up table and the final queue merge. */
size_t ivfpq_scan_queue_bytes(int w);
size_t ivfpq_scan_merge_bytes(int w);
/* ivfpq_scan.cuh's kernel (not scan8): its selection's bytes (thread
 * queues, or collected keys; when it collects it needs no merge area after
 * the table). */
inline size_t ivfpq_scan_select_bytes(int w) {
    return ivfpq_scan_collects(w) ? ivfpq_scan_collect_bytes(w) : ivfpq_scan_queue_bytes(w);
}

/* ivfpq_scan8.cuh: bytes of one table slab (256 code values x 64
 * sub-quantizers), and the kernel's dynamic shared memory (queue_bytes: its
 * thread queues); the queue merge reuses the table (>= 64 KB >= 8 warps x
 * 1024 keys). */
constexpr int kScan8SlabBytes = 256 * 64 * 4;
inline size_t ivfpq_scan8_smem_bytes(int m_pad, int d, int probes, size_t queue_bytes) {
    const size_t slabs = static_cast<size_t>((m_pad + 63) / 64);
    return slabs * kScan8SlabBytes + 4 * static_cast<size_t>((d + 3) & ~3) + queue_bytes +
           16 * static_cast<size_t>(probes + 1); /* Scan8Probe: 16 bytes */
}
/* Two halves a block of twice the threads, each with its own query,
 * sharing one slab (tables of m <= 32 fill half of it), when the queues are
 * small enough for the 64-register budget that this needs. */
inline bool ivfpq_scan8_pairs(int m_pad, int w) { return m_pad <= 32 && w <= 64; }
/* Thread-queue slots a lane in that kernel: it offers two keys a lane per
 * tile, and with two slots it would merge at every survivor (DESIGN.md). */
constexpr int kScan8PairSlots = 4;
inline size_t ivfpq_scan8_pairs_smem_bytes(int d, int probes, int w) {
    const size_t half_queues = sizeof(Key) * (kScanThreads / 32) * warp_select_smem_keys(kScan8PairSlots);
    return kScan8SlabBytes + 2 * (4 * static_cast<size_t>((d + 3) & ~3) + half_queues +
                                  16 * static_cast<size_t>(probes + 1) + sizeof(Key) * (kScanThreads / 32) * w);
}

/* Whether rows are many enough for one warp per row. */
bool use_warp_rows(const Resources &res, int64_t rows);

/* The launchers of k-bucket W, defined in bucket.cuh and instantiated once
 * per bucket, each in its own translation unit (select_k32.cu ...
 * select_k1024.cu: `template struct KBucket<32>;`). */
template <int W>
struct KBucket {
    static void launch_select_rows(const SelectRowsArgs &a, int splits, cudaStream_t stream);
    static void launch_ivfpq_scan(const IvfPqScanArgs &a, size_t smem_bytes, cudaStream_t stream);
    static size_t ivfpq_scan_queue_bytes();
};

/*
 * Convert selected keys to results: for each row, keys[row * key_ld + e]
 * (e < k) to a value (the key's score, negated back when `negate`) and an id
 * (ids[row * ids_ld + index] when ids is given, else the index itself);
 * sentinels become pad_value / UINT64_MAX.
 */
void keys_to_results(Resources &res, const Key *keys, int64_t key_ld, int64_t rows, int k, int negate,
                     const uint64_t *ids, int64_t ids_ld, float pad_value, float *out_values,
                     uint64_t *out_ids);

/*
 * The k best keys of each row of a rows x cols float matrix (device), into
 * out (rows x out_ld keys): splits long rows over several blocks when there
 * are few rows, merging the partial results in a second pass.
 */
void select_rows_to_keys(Resources &res, const float *values, int64_t rows, int64_t cols, int64_t ld, int k,
                         int negate, Key *out, int64_t out_ld);

/* Merge: the k best of each row of rows x cols packed keys (device).
 * run_len > 0: each row is sorted runs of run_len keys (SelectRowsArgs). */
void select_keys(Resources &res, const Key *keys, int64_t rows, int64_t cols, int64_t ld,
                 const int32_t *row_k, int k, Key *out, int64_t out_ld, int out_count, int run_len);

}  // namespace gpuivf_cuda

#endif /* GPUIVF_CUDA_SELECT_H */
