/*
 * select.cu — run-time dispatch to the k-buckets, and the row-selection
 * algorithms built on select_rows (splitting long rows when rows are few,
 * merging partial results, turning keys into values and ids).
 */
#include <algorithm>
#include <type_traits>

#include "select.h"

namespace gpuivf_cuda {

namespace {

/* f(std::integral_constant<int, W>()) for the k-bucket W == w. */
template <typename F>
auto with_bucket(int w, F &&f) {
    switch (w) {
        case 32: return f(std::integral_constant<int, 32>());
        case 64: return f(std::integral_constant<int, 64>());
        case 128: return f(std::integral_constant<int, 128>());
        case 256: return f(std::integral_constant<int, 256>());
        case 512: return f(std::integral_constant<int, 512>());
        case 1024: return f(std::integral_constant<int, 1024>());
        default: throw Error(GPUIVF_CUDA_INTERNAL, "no k-selection bucket %d", w);
    }
}

}  // namespace

void launch_select_rows(int w, const SelectRowsArgs &a, int splits, cudaStream_t stream) {
    if (a.rows <= 0) return;
    with_bucket(w, [&](auto b) { KBucket<decltype(b)::value>::launch_select_rows(a, splits, stream); });
}

void launch_ivfpq_scan(int w, const IvfPqScanArgs &a, size_t smem_bytes, cudaStream_t stream) {
    if (a.nq <= 0) return;
    with_bucket(w, [&](auto b) { KBucket<decltype(b)::value>::launch_ivfpq_scan(a, smem_bytes, stream); });
}

size_t ivfpq_scan_merge_bytes(int w) { return static_cast<size_t>(kScanThreads / 32) * w * sizeof(Key); }

size_t ivfpq_scan_queue_bytes(int w) {
    return with_bucket(w, [](auto b) { return KBucket<decltype(b)::value>::ivfpq_scan_queue_bytes(); });
}

/* One warp per row once there are enough rows to give every multiprocessor
 * several blocks of four rows. */
bool use_warp_rows(const Resources &res, int64_t rows) { return rows >= 16 * static_cast<int64_t>(res.sm_count); }

namespace {

/* Sorted runs merge_sorted_runs_kernel takes: the row's runs twice in
 * shared memory. */
constexpr int kMergeRunsThreads = 512;
constexpr int kMergeRunsMax = 128;
/* its static shared memory (len and bound below), with room to spare */
constexpr size_t kMergeRunsStaticBytes = 2 * sizeof(int) * kMergeRunsMax + 64;

/* Keys of run[0, n) below x (or at most x when or_equal), by bisection. */
__device__ __forceinline__ int count_below(const Key *run, int n, Key x, bool or_equal) {
    int lo = 0;
    while (n > 0) {
        const int half = n >> 1;
        const Key v = run[lo + half];
        if (v < x || (or_equal && v == x)) {
            lo += half + 1;
            n -= half + 1;
        } else {
            n = half;
        }
    }
    return lo;
}

/*
 * The best keys of each row's sorted runs (the splits of a scan or of a long
 * row, ascending, sentinels after the valid ones): one block per row, the
 * runs in shared memory, merged in pairs level by level (log2(runs)
 * barriers).  No key above the smallest k-th of the runs can be among the
 * row's k best (that run alone has k keys at or below it), so each run is
 * cut there first, and a merged run keeps its k best.  In a pair merge an
 * element's place is its place in its own run plus, by bisection, the keys
 * of the other run before it (ties to the first run, so places are
 * distinct): every element of a level at once, no compare-exchange network.
 * It serves long rows split over blocks, and a scan's runs the re-rank
 * cannot take itself (rescore_takes_runs; the GPU worker's calls do not come
 * here).  The output is the select kernel's: the row's k best ascending,
 * then sentinels, out_count keys.
 */
__global__ void __launch_bounds__(kMergeRunsThreads) merge_sorted_runs_kernel(const Key *keys, int64_t ld, int runs,
                                                                              int run_len, const int32_t *row_k,
                                                                              int k, Key *out, int64_t out_ld,
                                                                              int out_count) {
    extern __shared__ Key merge_smem[];
    __shared__ int len[2][kMergeRunsMax];
    __shared__ Key bound;
    const int total = runs * run_len;
    Key *src = merge_smem, *dst = merge_smem + total; /* one level's runs, the next level's */
    const int64_t row = blockIdx.x;
    int kr = row_k ? row_k[row] : k;
    kr = kr < 1 ? 1 : (kr > k ? k : kr);
    kr = kr > run_len ? run_len : kr;

    const Key *rp = keys + row * ld;
    for (int e = threadIdx.x; e < total; e += blockDim.x) src[e] = rp[e];
    if (threadIdx.x == 0) bound = kSentinelKey;
    __syncthreads();
    for (int r = threadIdx.x; r < runs; r += blockDim.x) atomicMin(&bound, src[r * run_len + kr - 1]);
    __syncthreads();
    /* each run cut at the bound (and before its sentinels) */
    const Key limit = bound == kSentinelKey ? kSentinelKey - 1 : bound;
    for (int r = threadIdx.x; r < runs; r += blockDim.x)
        len[0][r] = min(kr, count_below(src + r * run_len, run_len, limit, true));
    __syncthreads();

    int cur = 0;
    for (int n = runs; n > 1; n = (n + 1) / 2, cur ^= 1) {
        for (int e = threadIdx.x; e < n * run_len; e += blockDim.x) {
            const int r = e / run_len, i = e - r * run_len;
            if (i >= len[cur][r]) continue;
            const Key x = src[e];
            const int p = r >> 1, o = r ^ 1;
            const int place = o < n ? i + count_below(src + o * run_len, len[cur][o], x, o < r) : i;
            if (place < kr) dst[p * run_len + place] = x;
        }
        for (int p = threadIdx.x; p < (n + 1) / 2; p += blockDim.x)
            len[cur ^ 1][p] = min(kr, len[cur][2 * p] + (2 * p + 1 < n ? len[cur][2 * p + 1] : 0));
        __syncthreads();
        Key *t = src;
        src = dst;
        dst = t;
    }
    const int kept = runs > 0 ? min(len[cur][0], out_count) : 0;
    for (int e = threadIdx.x; e < out_count; e += blockDim.x) out[row * out_ld + e] = e < kept ? src[e] : kSentinelKey;
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
    if (run_len > 0 && cols % run_len == 0 && cols / run_len <= kMergeRunsMax && ld >= cols) {
        /* The kernel's limit is set to all the shared memory a block can
         * have, never to this call's size: a recorded search (a CUDA graph)
         * replays its launch later, after calls of other sizes. */
        const size_t smem = 2 * sizeof(Key) * static_cast<size_t>(cols);
        const size_t smem_max = res.smem_optin - kMergeRunsStaticBytes;
        if (smem <= smem_max) {
            /* static + dynamic: past 48 KB only with the limit raised */
            if (smem + kMergeRunsStaticBytes > 48 * 1024)
                GPUIVF_CUDA_TRY(cudaFuncSetAttribute(merge_sorted_runs_kernel,
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     static_cast<int>(smem_max)));
            merge_sorted_runs_kernel<<<static_cast<unsigned>(rows), kMergeRunsThreads, smem, res.stream>>>(
                keys, ld, static_cast<int>(cols / run_len), run_len, row_k, k, out, out_ld, out_count);
            GPUIVF_CUDA_CHECK_LAUNCH();
            return;
        }
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
