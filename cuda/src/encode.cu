/*
 * encode.cu — IVF-PQ encoding of many vectors: nearest list by the exact
 * kNN (k = 1, shortlist re-scored with the CPU's arithmetic), then the PQ
 * code of the residual with exactly the CPU's arithmetic (pq.cpp): the
 * squared distance to each codeword accumulated component by component
 * without FMA (or in 16 lanes for long sub-vectors), the first minimum wins.
 * So codes are the CPU's bytes whenever the list is.
 */
#include <algorithm>

#include "knn.h"
#include "train.h"
#include "vectors.h"

namespace gpuivf_cuda {

int pq_code_size(int m, int nbits) { return nbits == 4 ? (m + 1) / 2 : m; }

namespace {

/* Below this many floats per sub-codebook the CPU scans codewords with the
 * transposed, component-by-component loop (pq.cpp kStackCodebookFloats). */
constexpr int kTransposedMaxFloats = 16384;

constexpr int kEncodeThreads = 128;

/* Nearest codeword of sub-quantizer j for the residual of vector i. */
__device__ __forceinline__ int nearest_codeword(const float *xp, const float *cent, const float *cb, int dsub,
                                                int ksub, bool transposed) {
    float best = 0.0f;
    int arg = 0;
    for (int c = 0; c < ksub; ++c) {
        const float *cw = cb + c * dsub;
        float acc;
        if (transposed) {
            float diff = __fsub_rn(__fsub_rn(xp[0], cent[0]), cw[0]);
            acc = __fmul_rn(diff, diff);
            for (int t = 1; t < dsub; ++t) {
                diff = __fsub_rn(__fsub_rn(xp[t], cent[t]), cw[t]);
                acc = __fadd_rn(acc, __fmul_rn(diff, diff));
            }
        } else {
            /* core_serial_sum of (x - c - cw)^2, written out: through that
             * helper the compiler orders this kernel's instructions
             * differently (same results) */
            float lanes[kCoreLanes];
#pragma unroll
            for (int l = 0; l < kCoreLanes; l++) lanes[l] = 0.0f;
            for (int t0 = 0; t0 < dsub; t0 += kCoreLanes) {
#pragma unroll
                for (int l = 0; l < kCoreLanes; l++) {
                    const bool in = t0 + l < dsub;
                    const float diff = in ? __fsub_rn(__fsub_rn(xp[t0 + l], cent[t0 + l]), cw[t0 + l]) : 0.0f;
                    lanes[l] = __fadd_rn(lanes[l], __fmul_rn(diff, diff));
                }
            }
            acc = core_lane_reduce(lanes);
        }
        if (c == 0 || acc < best) {
            best = acc;
            arg = c;
        }
    }
    return arg;
}

/* blockIdx.y = code byte: sub-quantizer j (8-bit) or j = 2b, 2b + 1 (4-bit). */
__global__ void __launch_bounds__(kEncodeThreads)
    pq_encode_kernel(const float *xp, const int32_t *lists, int64_t n, int d, int m, int nbits,
                     const float *centroids, const float *codebook, uint8_t *codes, int code_size) {
    extern __shared__ float scb[];
    const int b = blockIdx.y;
    const int dsub = d / m;
    const int ksub = 1 << nbits;
    const int j0 = nbits == 8 ? b : 2 * b;
    const int nsub = (nbits == 8 || j0 + 1 >= m) ? 1 : 2;
    const int floats = ksub * dsub;
    const bool in_smem = floats * nsub * static_cast<int>(sizeof(float)) <= 48 * 1024;
    if (in_smem) {
        for (int t = threadIdx.x; t < floats * nsub; t += blockDim.x)
            scb[t] = codebook[static_cast<int64_t>(j0) * floats + t];
        __syncthreads();
    }
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float *x = xp + i * d;
    const float *c = centroids + static_cast<int64_t>(lists[i]) * d;
    const bool transposed = floats <= kTransposedMaxFloats;
    uint8_t byte = 0;
    for (int s = 0; s < nsub; ++s) {
        const int j = j0 + s;
        const float *cb = in_smem ? scb + s * floats : codebook + static_cast<int64_t>(j) * floats;
        const int code = nearest_codeword(x + j * dsub, c + j * dsub, cb, dsub, ksub, transposed);
        byte |= static_cast<uint8_t>(nbits == 8 ? code : (s == 0 ? code : code << 4));
    }
    codes[i * code_size + b] = byte;
}

}  // namespace

void assign_lists(Resources &res, const ModelView &model, const float *xp, int64_t n, int32_t *lists) {
    if (n <= 0) return;
    TempBuffer<float> scores(res, n);
    TempBuffer<uint64_t> ids(res, n);
    KnnOptions o;
    o.exact_rescore = true;
    o.queries_prepared = true;
    o.out_lists = lists; /* never -1: there is always a nearest list */
    exact_knn(res, Metric::L2, model.centroids, model.nlist, xp, n, model.d, 1, o, scores.data(), ids.data());
}

void pq_encode_with_lists(Resources &res, const ModelView &model, const float *xp, const int32_t *lists, int64_t n,
                          uint8_t *codes) {
    if (n <= 0) return;
    const int code_size = pq_code_size(model.m, model.nbits);
    const int ksub = 1 << model.nbits;
    const int dsub = model.d / model.m;
    const int nsub = model.nbits == 8 ? 1 : 2;
    const size_t floats = static_cast<size_t>(ksub) * dsub * nsub;
    const size_t smem = floats * sizeof(float) <= 48 * 1024 ? floats * sizeof(float) : 0;
    for (int64_t r0 = 0; r0 < n; r0 += int64_t(65535) * kEncodeThreads) {
        const int64_t rows = std::min<int64_t>(n - r0, int64_t(65535) * kEncodeThreads);
        const dim3 grid(static_cast<unsigned>(ceil_div(rows, kEncodeThreads)), static_cast<unsigned>(code_size));
        pq_encode_kernel<<<grid, kEncodeThreads, smem, res.stream>>>(xp + r0 * model.d, lists + r0, rows, model.d,
                                                                      model.m, model.nbits, model.centroids,
                                                                      model.codebook, codes + r0 * code_size,
                                                                      code_size);
        GPUIVF_CUDA_CHECK_LAUNCH();
    }
}

void ivfpq_encode(Resources &res, const ModelView &model, const float *x, int64_t n, int32_t *lists, uint8_t *codes) {
    const int code_size = pq_code_size(model.m, model.nbits);
    /* Batches bound the prepared copy and the kNN's temporary memory. */
    const int64_t batch = std::min<int64_t>(n, std::max<int64_t>(4096, (int64_t(256) << 20) / (4 * model.d)));
    TempBuffer<float> xp;
    if (model.metric == Metric::Cosine) xp.allocate(res, batch * model.d);
    for (int64_t r0 = 0; r0 < n; r0 += batch) {
        check_cancel(res);
        const int64_t rows = std::min(batch, n - r0);
        const float *px = x + r0 * model.d;
        if (model.metric == Metric::Cosine) {
            prepare_rows(res, model.metric, px, rows, model.d, xp.data());
            px = xp.data();
        }
        assign_lists(res, model, px, rows, lists + r0);
        pq_encode_with_lists(res, model, px, lists + r0, rows, codes + r0 * code_size);
    }
}

}  // namespace gpuivf_cuda
