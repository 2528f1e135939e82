/*
 * common.cuh — what every file of the GPU engine shares: the error type that
 * the C API turns into a status, CUDA/cuBLAS checking macros, the packed
 * (score, index) selection key, and device versions of src/core's arithmetic
 * with the same summation order (so the GPU can reproduce the CPU's bits).
 */
#ifndef GPUIVF_CUDA_COMMON_CUH
#define GPUIVF_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <exception>

#include "gpuivf_cuda.h"

namespace gpuivf_cuda {

/* ------------------------------------------------------------- errors */

/* Thrown inside the engine, caught by every C API function (api.cu). */
class Error : public std::exception {
public:
    Error(int32_t code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
    const char *what() const noexcept override { return message_; }
    int32_t code() const noexcept { return code_; }
    using Message = char[256];

private:
    int32_t code_;
    Message message_;
};

[[noreturn]] void throw_cuda_error(cudaError_t err, const char *what, const char *file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t err, const char *what, const char *file, int line);

#define GPUIVF_CUDA_TRY(expr)                                                              \
    do {                                                                                   \
        cudaError_t gpuivf_err_ = (expr);                                                  \
        if (gpuivf_err_ != cudaSuccess)                                                    \
            ::gpuivf_cuda::throw_cuda_error(gpuivf_err_, #expr, __FILE__, __LINE__);       \
    } while (0)
/* After every kernel launch: launch-configuration errors surface here. */
#define GPUIVF_CUDA_CHECK_LAUNCH() GPUIVF_CUDA_TRY(cudaGetLastError())
#define GPUIVF_CUBLAS_TRY(expr)                                                            \
    do {                                                                                   \
        cublasStatus_t gpuivf_err_ = (expr);                                               \
        if (gpuivf_err_ != CUBLAS_STATUS_SUCCESS)                                          \
            ::gpuivf_cuda::throw_cublas_error(gpuivf_err_, #expr, __FILE__, __LINE__);     \
    } while (0)

#define GPUIVF_REQUIRE(cond, ...)                                                          \
    do {                                                                                   \
        if (!(cond)) throw ::gpuivf_cuda::Error(GPUIVF_CUDA_INVALID_ARGUMENT, __VA_ARGS__); \
    } while (0)

/* ------------------------------------------------------------ helpers */

constexpr int kMaxK = GPUIVF_CUDA_MAX_K;
constexpr int kMaxDims = GPUIVF_CUDA_MAX_DIMS;

__host__ __device__ constexpr inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
__host__ __device__ constexpr inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

/* The k-bucket (warp queue length) serving k: 32, 64, ..., 1024. */
inline int select_bucket(int k) {
    int w = 32;
    while (w < k) w *= 2;
    return w;
}

enum class Metric : int32_t { L2 = 1, InnerProduct = 2, Cosine = 3 };

/* ------------------------------------------------- packed selection key */

/*
 * Every k-selection in the engine works on one 64-bit unsigned key per
 * candidate: the score mapped to an order-preserving 32-bit pattern in the
 * high half, the candidate's 32-bit index (column, CSR position) in the low
 * half.  This pays in the sorting networks, which are the hot part of
 * WarpSelect's merges: a compare-exchange is one 64-bit compare and two
 * selects, there is no separate tie-break on the index (the low half does
 * it), and a (value, index) pair moves through a warp shuffle as one 64-bit
 * register pair instead of a float plus an index.  The filtering fast path
 * still compares plain floats (the key is only built for candidates that
 * survive the running k-th), so packing costs nothing where bandwidth is
 * spent.  Order: smaller score first, NaN after every number, then smaller
 * index; -0 and +0 are the same score.
 */
using Key = unsigned long long;
constexpr Key kSentinelKey = ~0ull;          /* "no candidate": after everything */
/* Keys of shared memory one warp's WarpSelect (warp_select.cuh) with t
 * slots a lane needs: its thread queues and its compaction buffer; host
 * code sizes kernels' shared memory with it. */
constexpr int warp_select_smem_keys(int t) { return 2 * t * 32; }
constexpr uint32_t kNoIndex = 0xFFFFFFFFu;   /* never a real index */

__host__ __device__ __forceinline__ uint32_t float_to_ordered(float f) {
#ifdef __CUDA_ARCH__
    uint32_t u = __float_as_uint(f);
#else
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
#endif
    if (f != f) return 0xFFFFFFFFu;          /* every NaN: worst score */
    if (f == 0.0f) u = 0;                    /* -0 == +0 */
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__host__ __device__ __forceinline__ float ordered_to_float(uint32_t o) {
    uint32_t u = (o & 0x80000000u) ? (o & 0x7FFFFFFFu) : ~o;
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
#endif
}

__host__ __device__ __forceinline__ Key make_key(float score, uint32_t index) {
    return (static_cast<Key>(float_to_ordered(score)) << 32) | index;
}
__host__ __device__ __forceinline__ float key_score(Key k) { return ordered_to_float(static_cast<uint32_t>(k >> 32)); }
__host__ __device__ __forceinline__ uint32_t key_index(Key k) { return static_cast<uint32_t>(k); }
constexpr unsigned kFullMask = 0xffffffffu;

/* Ask L2 for the 128-byte lines of bytes [p, p + bytes). */
__device__ __forceinline__ void prefetch_l2(const void *p, size_t bytes) {
    const uintptr_t end = reinterpret_cast<uintptr_t>(p) + bytes;
    for (uintptr_t line = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(127); line < end; line += 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
}

/*
 * Phase clocks, for measurement only (cuda/bench/phase_clocks.sh): built
 * with -DGPUIVF_PHASE_CLOCKS, the collecting scan and the re-rank mark the
 * ends of five phases with clock64(), and one block of each prints the
 * cycles of each phase as "<label> c1 c2 c3 c4 c5".  A phase not marked (a
 * branch not taken) counts 0 and its time goes to the next one.  In a
 * normal build the clocks are empty and every call compiles to nothing (the
 * kernels' machine code is that of a build without them).
 */
#ifdef GPUIVF_PHASE_CLOCKS
struct PhaseClocks {
    long long at[6];
    __device__ __forceinline__ PhaseClocks() {
        at[0] = clock64();
        for (int i = 1; i < 6; i++) at[i] = at[0];
    }
    /* the end of phase 0 .. 4 */
    __device__ __forceinline__ void mark(int phase) {
        at[phase + 1] = clock64();
        for (int i = phase + 2; i < 6; i++) at[i] = at[phase + 1];
    }
    /* by one thread of the block that reports */
    __device__ __forceinline__ void print(const char *label) const {
        printf("%s %lld %lld %lld %lld %lld\n", label, at[1] - at[0], at[2] - at[1], at[3] - at[2], at[4] - at[3],
               at[5] - at[4]);
    }
};
#else
struct PhaseClocks {
    __device__ __forceinline__ void mark(int) {}
    __device__ __forceinline__ void print(const char *) const {}
};
#endif

__device__ __forceinline__ Key key_min(Key a, Key b) { return a < b ? a : b; }
__device__ __forceinline__ Key key_max(Key a, Key b) { return a < b ? b : a; }

/* Compare-exchange of one register row between lanes `lane` and
 * `lane ^ stride`: the lower lane of the pair keeps the smaller key when the
 * pair is to end ascending. */
__device__ __forceinline__ Key lane_exchange(Key v, int stride, bool ascending, int lane) {
    const Key other = __shfl_xor_sync(kFullMask, v, stride);
    const bool lower = (lane & stride) == 0;
    return (lower == ascending) ? key_min(v, other) : key_max(v, other);
}

/* The same step of a bitonic sort over elements i (this lane's) and
 * i ^ stride (stride < 32): ascending where the run of `size` holding i
 * ascends. */
__device__ __forceinline__ Key bitonic_exchange_lanes(Key v, int i, int size, int stride) {
    return lane_exchange(v, stride, (i & size) == 0, i);
}

/* -------------------------------------- src/core's arithmetic, on the GPU */

/*
 * src/core accumulates a distance in 16 float lanes (element i in lane
 * i % 16, in increasing i), then sums the lanes pairwise (width 8, 4, 2, 1),
 * compiled without FMA contraction.  These device functions do the same with
 * explicitly rounded operations (__fmul_rn / __fadd_rn are never contracted),
 * so the GPU gets the CPU's bits: exact re-ranking then orders candidates
 * exactly as the CPU index scan and a sequential scan do.
 */
constexpr int kCoreLanes = 16;

/* The 16 lanes summed pairwise (width 8, 4, 2, 1). */
__device__ __forceinline__ float core_lane_reduce(const float (&acc)[kCoreLanes]) {
    /* Written out: loops here get re-rolled into dynamic indexing. */
    const float a0 = __fadd_rn(acc[0], acc[8]), a1 = __fadd_rn(acc[1], acc[9]);
    const float a2 = __fadd_rn(acc[2], acc[10]), a3 = __fadd_rn(acc[3], acc[11]);
    const float a4 = __fadd_rn(acc[4], acc[12]), a5 = __fadd_rn(acc[5], acc[13]);
    const float a6 = __fadd_rn(acc[6], acc[14]), a7 = __fadd_rn(acc[7], acc[15]);
    const float b0 = __fadd_rn(a0, a4), b1 = __fadd_rn(a1, a5), b2 = __fadd_rn(a2, a6), b3 = __fadd_rn(a3, a7);
    const float c0 = __fadd_rn(b0, b2), c1 = __fadd_rn(b1, b3);
    return __fadd_rn(c0, c1);
}

/* One thread, whole vectors (short ones: PQ sub-vectors, dsub <= 16
 * mostly): term(in, i) of elements i = 0, 1, ... summed in the 16 lanes up
 * to a multiple of 16, where `in` says whether element i exists.  Past the
 * end term gives +0, which leaves a lane unchanged (an accumulator that
 * starts at +0 never becomes -0); selects instead of predicated stores keep
 * acc[] in registers. */
template <typename Term>
__device__ __forceinline__ float core_serial_sum(int d, Term term) {
    float acc[kCoreLanes];
#pragma unroll
    for (int l = 0; l < kCoreLanes; l++) acc[l] = 0.0f;
    for (int i = 0; i < d; i += kCoreLanes) {
#pragma unroll
        for (int l = 0; l < kCoreLanes; l++) acc[l] = __fadd_rn(acc[l], term(i + l < d, i + l));
    }
    return core_lane_reduce(acc);
}

__device__ __forceinline__ float core_l2_squared_serial(const float *a, const float *b, int d) {
    return core_serial_sum(d, [=](bool in, int i) {
        const float diff = in ? __fsub_rn(a[i], b[i]) : 0.0f;
        return __fmul_rn(diff, diff);
    });
}

__device__ __forceinline__ float core_inner_product_serial(const float *a, const float *b, int d) {
    return core_serial_sum(d, [=](bool in, int i) { return in ? __fmul_rn(a[i], b[i]) : 0.0f; });
}

/*
 * Half-warp versions for long vectors: lane l (0..15 of its half) holds the
 * CPU's accumulator l, and the pairwise lane sum is done with shuffles inside
 * the half.  All 32 lanes must call (each half works on its own vectors);
 * the result is valid in lane 0 of each half (lane & 15 == 0).
 */
__device__ __forceinline__ float core_lane_sum(float acc) {
#pragma unroll
    for (int lw = 3; lw >= 0; lw--) {
        const int w = 1 << lw;
        float other = __shfl_down_sync(0xffffffffu, acc, w, kCoreLanes);
        acc = __fadd_rn(acc, other);
    }
    return acc;
}

/* An element as float32: itself, or an IEEE half widened (exactly: the
 * distance of half vectors is the float32 distance of the widened values,
 * as src/core defines it). */
__device__ __forceinline__ float core_load(const float *p) { return *p; }
__device__ __forceinline__ float core_load(const __half *p) { return __half2float(*p); }

/* Lane l's partial sums over elements l, l+16, ... in order.  The loads of
 * U elements are issued before their adds (the adds stay in order): the loop
 * is latency-bound otherwise, one memory round trip per 16 elements.  Eight
 * at a time, then four, then one: a 128-float vector is one round trip.
 * A and B: float or __half elements. */
template <int U, typename A, typename B, typename Step>
__device__ __forceinline__ void core_partial_steps(const A *a, const B *b, int d, int &i, float &acc,
                                                   Step step) {
    for (; i + (U - 1) * kCoreLanes < d; i += U * kCoreLanes) {
        float x[U], y[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            x[u] = core_load(a + i + u * kCoreLanes);
            y[u] = core_load(b + i + u * kCoreLanes);
        }
#pragma unroll
        for (int u = 0; u < U; u++) acc = step(acc, x[u], y[u]);
    }
}

template <typename A, typename B, typename Step>
__device__ __forceinline__ float core_partial(const A *a, const B *b, int d, int l, Step step) {
    float acc = 0.0f;
    int i = l;
    core_partial_steps<8>(a, b, d, i, acc, step);
    core_partial_steps<4>(a, b, d, i, acc, step);
    core_partial_steps<1>(a, b, d, i, acc, step);
    return acc;
}

/* Lane l's partial sums of |a-b|^2 over elements l, l+16, ... */
template <typename A, typename B>
__device__ __forceinline__ float core_l2_partial(const A *a, const B *b, int d, int l) {
    return core_partial(a, b, d, l, [](float acc, float x, float y) {
        const float diff = __fsub_rn(x, y);
        return __fadd_rn(acc, __fmul_rn(diff, diff));
    });
}
template <typename A, typename B>
__device__ __forceinline__ float core_dot_partial(const A *a, const B *b, int d, int l) {
    return core_partial(a, b, d, l, [](float acc, float x, float y) { return __fadd_rn(acc, __fmul_rn(x, y)); });
}

/* The SQL distances of src/core (distance.cpp) from core-order float sums. */
__device__ __forceinline__ double core_cosine_distance(float dot, float na, float nb) {
    if (!(na > 0.0f) || !(nb > 0.0f)) return __longlong_as_double(0x7ff8000000000000ll);
    double sim = static_cast<double>(dot) / sqrt(static_cast<double>(na) * static_cast<double>(nb));
    if (sim > 1.0) sim = 1.0;
    if (sim < -1.0) sim = -1.0;
    return 1.0 - sim;
}

/* gpuivf::ivfpq_score_to_distance */
__host__ __device__ __forceinline__ double score_to_distance(Metric m, float score) {
    switch (m) {
        case Metric::L2: return sqrt(static_cast<double>(score < 0.0f ? 0.0f : score)); /* std::max(score, 0) */
        case Metric::InnerProduct: return static_cast<double>(score);
        case Metric::Cosine: return static_cast<double>(score) / 2.0;
    }
    return 0.0;
}

}  // namespace gpuivf_cuda

#endif /* GPUIVF_CUDA_COMMON_CUH */
