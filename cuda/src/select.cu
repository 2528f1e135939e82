/*
 * select.cu — run-time dispatch to the k-buckets, and the row-selection
 * algorithms built on select_rows (splitting long rows when rows are few,
 * merging partial results, turning keys into values and ids).
 */
#include <algorithm>

#include "select.h"

namespace gpuivf_cuda {

void launch_select_rows(int w, const SelectRowsArgs &a, int splits, cudaStream_t stream) {
    if (a.rows <= 0) return;
    switch (w) {
        case 32: launch_select_rows_w32(a, splits, stream); break;
        case 64: launch_select_rows_w64(a, splits, stream); break;
        case 128: launch_select_rows_w128(a, splits, stream); break;
        case 256: launch_select_rows_w256(a, splits, stream); break;
        case 512: launch_select_rows_w512(a, splits, stream); break;
        case 1024: launch_select_rows_w1024(a, splits, stream); break;
        default: throw Error(GPUIVF_CUDA_INTERNAL, "no k-selection bucket %d", w);
    }
}

void launch_ivfpq_scan(int w, const IvfPqScanArgs &a, size_t smem_bytes, cudaStream_t stream) {
    if (a.nq <= 0) return;
    switch (w) {
        case 32: launch_ivfpq_scan_w32(a, smem_bytes, stream); break;
        case 64: launch_ivfpq_scan_w64(a, smem_bytes, stream); break;
        case 128: launch_ivfpq_scan_w128(a, smem_bytes, stream); break;
        case 256: launch_ivfpq_scan_w256(a, smem_bytes, stream); break;
        case 512: launch_ivfpq_scan_w512(a, smem_bytes, stream); break;
        case 1024: launch_ivfpq_scan_w1024(a, smem_bytes, stream); break;
        default: throw Error(GPUIVF_CUDA_INTERNAL, "no k-selection bucket %d", w);
    }
}

size_t ivfpq_scan_merge_bytes(int w) { return static_cast<size_t>(kScanThreads / 32) * w * sizeof(Key); }

size_t ivfpq_scan_queue_bytes(int w) {
    switch (w) {
        case 32: return ivfpq_scan_queue_bytes_w32();
        case 64: return ivfpq_scan_queue_bytes_w64();
        case 128: return ivfpq_scan_queue_bytes_w128();
        case 256: return ivfpq_scan_queue_bytes_w256();
        case 512: return ivfpq_scan_queue_bytes_w512();
        case 1024: return ivfpq_scan_queue_bytes_w1024();
        default: throw Error(GPUIVF_CUDA_INTERNAL, "no k-selection bucket %d", w);
    }
}

/* One warp per row once there are enough rows to give every multiprocessor
 * several blocks of four rows. */
bool use_warp_rows(const Resources &res, int64_t rows) { return rows >= 16 * static_cast<int64_t>(res.sm_count); }

namespace {

/* Sorted runs a tree of warp merges takes (more, or longer, go to the
 * select kernel). */
constexpr int kMergeRunsMax = 64;
constexpr int kMergeRunLen = 64;

/*
 * The best keys of each row's sorted runs (the splits of a scan, at most 64
 * runs of at most 64 keys, ascending): one block per row, a warp per pair
 * of runs, then a tree of pair merges through shared memory (merge_runs64),
 * log2(runs) barriers.  The GPU worker's calls end in this step (32 probes'
 * runs of 40): the select kernel took ~9 µs of serial merging for it.  The
 * output is the select kernel's: the row's k best ascending, then
 * sentinels, out_count keys.
 */
__global__ void __launch_bounds__(kMergeRunsMax / 2 * 32) merge_sorted_runs_kernel(const Key *keys, int64_t ld, int runs,
                                                                                  int run_len, const int32_t *row_k,
                                                                                  int k, Key *out, int64_t out_ld,
                                                                                  int out_count) {
    __shared__ Key merged[kMergeRunsMax / 2][kMergeRunLen];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int64_t row = blockIdx.x;
    const Key *rp = keys + row * ld;
    auto at = [&](int r, int e) { return r < runs && e < run_len ? rp[static_cast<int64_t>(r) * run_len + e] : kSentinelKey; };
    Key v0, v1;
    merge_runs64(at(2 * warp, lane), at(2 * warp, 32 + lane), at(2 * warp + 1, 63 - lane), at(2 * warp + 1, 31 - lane),
                 v0, v1);
    merged[warp][lane] = v0;
    merged[warp][32 + lane] = v1;
    __syncthreads();
    for (int n = warps; n > 1; n >>= 1) {
        if (warp < n / 2) {
            const Key *a = merged[2 * warp], *b = merged[2 * warp + 1];
            merge_runs64(a[lane], a[32 + lane], b[63 - lane], b[31 - lane], v0, v1);
        }
        __syncthreads();
        if (warp < n / 2) {
            merged[warp][lane] = v0;
            merged[warp][32 + lane] = v1;
        }
        __syncthreads();
    }
    if (warp == 0) {
        int kr = row_k ? row_k[row] : k;
        kr = kr < 1 ? 1 : (kr > kMergeRunLen ? kMergeRunLen : kr);
        for (int e = lane; e < out_count; e += 32) out[row * out_ld + e] = e < kr ? merged[0][e] : kSentinelKey;
    }
}

__global__ void keys_to_results_kernel(const Key *keys, int64_t key_ld, int64_t rows, int k, int negate,
                                       const uint64_t *ids, int64_t ids_ld, float pad_value, float *out_values,
                                       uint64_t *out_ids) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= rows * k) return;
    const int64_t row = t / k;
    const int e = static_cast<int>(t - row * k);
    const Key key = keys[row * key_ld + e];
    const uint32_t idx = key_index(key);
    if (idx == kNoIndex) {
        out_values[t] = pad_value;
        out_ids[t] = UINT64_MAX;
        return;
    }
    const float v = key_score(key);
    out_values[t] = negate ? -v : v;
    out_ids[t] = ids ? ids[row * ids_ld + idx] : static_cast<uint64_t>(idx);
}

/* How many blocks to split each row over so that a few long rows still fill
 * the GPU: about four blocks per multiprocessor in all, at least 2048 columns
 * per block. */
int row_splits(const Resources &res, int64_t rows, int64_t cols) {
    const int64_t target = 4 * static_cast<int64_t>(res.sm_count);
    if (rows >= target || cols < 4096) return 1;
    int64_t s = std::min<int64_t>(ceil_div(target, rows), ceil_div(cols, 2048));
    return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(s, 65535)));
}

}  // namespace

void keys_to_results(Resources &res, const Key *keys, int64_t key_ld, int64_t rows, int k, int negate,
                     const uint64_t *ids, int64_t ids_ld, float pad_value, float *out_values, uint64_t *out_ids) {
    const int64_t total = rows * k;
    if (total <= 0) return;
    const int threads = 256;
    keys_to_results_kernel<<<static_cast<unsigned>(ceil_div(total, threads)), threads, 0, res.stream>>>(
        keys, key_ld, rows, k, negate, ids, ids_ld, pad_value, out_values, out_ids);
    GPUIVF_CUDA_CHECK_LAUNCH();
}

void select_keys(Resources &res, const Key *keys, int64_t rows, int64_t cols, int64_t ld, const int32_t *row_k,
                 int k, Key *out, int64_t out_ld, int out_count, int run_len) {
    if (rows <= 0) return;
    if (run_len > 0 && run_len <= kMergeRunLen && cols % run_len == 0 && cols / run_len <= kMergeRunsMax &&
        k <= kMergeRunLen && out_count <= kMergeRunLen && ld >= cols) {
        const int runs = static_cast<int>(cols / run_len);
        int warps = 1;
        while (2 * warps < runs) warps *= 2;
        merge_sorted_runs_kernel<<<static_cast<unsigned>(rows), 32 * warps, 0, res.stream>>>(
            keys, ld, runs, run_len, row_k, k, out, out_ld, out_count);
        GPUIVF_CUDA_CHECK_LAUNCH();
        return;
    }
    SelectRowsArgs a;
    a.run_len = run_len;
    a.keys = keys;
    a.ld = ld;
    a.rows = rows;
    a.cols = cols;
    a.split_cols = round_up(std::max<int64_t>(cols, 1), 4);
    a.row_k = row_k;
    a.k = k;
    a.out = out;
    a.out_ld = out_ld;
    a.out_count = out_count;
    a.warp_rows = use_warp_rows(res, rows) ? 1 : 0;
    launch_select_rows(select_bucket(k), a, 1, res.stream);
}

void select_rows_to_keys(Resources &res, const float *values, int64_t rows, int64_t cols, int64_t ld, int k,
                         int negate, Key *out, int64_t out_ld) {
    if (rows <= 0) return;
    const int w = select_bucket(k);
    int splits = row_splits(res, rows, cols);
    SelectRowsArgs a;
    a.values = values;
    a.ld = ld;
    a.rows = rows;
    a.cols = cols;
    a.negate = negate;
    a.k = k;
    a.out_count = k;
    if (splits == 1) {
        a.split_cols = round_up(std::max<int64_t>(cols, 1), 4);
        a.out = out;
        a.out_ld = out_ld;
        a.warp_rows = use_warp_rows(res, rows) ? 1 : 0;
        launch_select_rows(w, a, 1, res.stream);
        return;
    }
    a.split_cols = round_up(ceil_div(cols, splits), 4);
    splits = static_cast<int>(ceil_div(cols, a.split_cols));
    TempBuffer<Key> partial(res, rows * splits * k);
    a.out = partial.data();
    a.out_ld = k;
    launch_select_rows(w, a, splits, res.stream);
    select_keys(res, partial.data(), rows, static_cast<int64_t>(splits) * k, static_cast<int64_t>(splits) * k,
                nullptr, k, out, out_ld, k, k);
}

}  // namespace gpuivf_cuda
