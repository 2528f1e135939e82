/*
 * vectors.cu — row norms and prepared vectors.  Half a warp per row: lane l
 * of the half holds the CPU's accumulator l (elements l, l + 16, ...), then
 * the pairwise lane sum runs through shuffles (common.cuh).
 */
#include "vectors.h"

namespace gpuivf_cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / kCoreLanes;

/* Scale and squared norm of row `row` (valid in every lane of its half). */
__device__ __forceinline__ float half_warp_norm(const float *x, int64_t row, int64_t n, int d, int l) {
    float acc = 0.0f;
    if (row < n) acc = core_dot_partial(x + row * d, x + row * d, d, l);
    acc = core_lane_sum(acc);
    /* Broadcast lane 0 of the half to the whole half. */
    return __shfl_sync(0xffffffffu, acc, (threadIdx.x & 31) & ~(kCoreLanes - 1));
}

__device__ __forceinline__ float cosine_scale(float norm2) {
    return norm2 > 0.0f ? static_cast<float>(1.0 / sqrt(static_cast<double>(norm2))) : 1.0f;
}

__global__ void row_norms_kernel(const float *x, int64_t n, int d, float *norms, float *scale, float *prep_norms) {
    const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kCoreLanes;
    const int l = threadIdx.x & (kCoreLanes - 1);
    const float norm2 = half_warp_norm(x, row, n, d, l);
    if (row < n && l == 0) {
        if (norms) norms[row] = norm2;
        if (scale) {
            const float s = cosine_scale(norm2);
            scale[row] = s;
            if (prep_norms) prep_norms[row] = norm2 * s * s;
        }
    }
}

__global__ void prepare_cosine_kernel(const float *x, int64_t n, int d, float *out) {
    const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kCoreLanes;
    const int l = threadIdx.x & (kCoreLanes - 1);
    const float norm2 = half_warp_norm(x, row, n, d, l);
    if (row >= n) return;
    const float s = cosine_scale(norm2);
    for (int t = l; t < d; t += kCoreLanes) out[row * d + t] = __fmul_rn(x[row * d + t], s);
}

__global__ void residuals_kernel(const float *x, const int32_t *lists, const float *centroids, int64_t n, int d,
                                 float *out) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= n * d) return;
    const int64_t row = t / d;
    const int col = static_cast<int>(t - row * d);
    out[t] = __fsub_rn(x[t], centroids[static_cast<int64_t>(lists[row]) * d + col]);
}

}  // namespace

void row_norms(Resources &res, const float *x, int64_t n, int d, float *norms, float *scale, float *prep_norms) {
    if (n <= 0) return;
    row_norms_kernel<<<static_cast<unsigned>(ceil_div(n, kRowsPerBlock)), kThreads, 0, res.stream>>>(
        x, n, d, norms, scale, prep_norms);
    GPUIVF_CUDA_CHECK_LAUNCH();
}

void prepare_rows(Resources &res, Metric m, const float *x, int64_t n, int d, float *out) {
    if (n <= 0) return;
    if (m != Metric::Cosine) {
        if (out != x)
            GPUIVF_CUDA_TRY(cudaMemcpyAsync(out, x, sizeof(float) * n * d, cudaMemcpyDeviceToDevice, res.stream));
        return;
    }
    prepare_cosine_kernel<<<static_cast<unsigned>(ceil_div(n, kRowsPerBlock)), kThreads, 0, res.stream>>>(x, n, d,
                                                                                                         out);
    GPUIVF_CUDA_CHECK_LAUNCH();
}

void residuals(Resources &res, const float *x, const int32_t *lists, const float *centroids, int64_t n, int d,
               float *out) {
    const int64_t total = n * d;
    if (total <= 0) return;
    residuals_kernel<<<static_cast<unsigned>(ceil_div(total, 256)), 256, 0, res.stream>>>(x, lists, centroids, n, d,
                                                                                         out);
    GPUIVF_CUDA_CHECK_LAUNCH();
}

}  // namespace gpuivf_cuda
