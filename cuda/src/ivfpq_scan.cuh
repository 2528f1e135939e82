/*
 * ivfpq_scan.cuh — the IVF-PQ list scan: one block per (query, share of its
 * probes), look-up table in shared memory, ADC score per code, selection
 * fused in (compute, then filter against the running k-th: most codes never
 * leave the registers).  The selection is WarpSelect, except for the
 * k-buckets 128 and 256: the block's collect-then-cut (below), because a
 * block that sees about a thousand codes for a k of 200 never fills a
 * warp's queue.
 *
 * Look-up tables.  With the term decomposition of Jégou et al. the squared
 * distance of query q to entry x = c + r (list centroid c, decoded residual
 * r) is
 *     |q - c - r|^2 = |q - c|^2  +  (|r|^2 + 2 <c, r>)  -  2 <q, r>
 *                     coarse       per entry, stored     query table
 * The first term comes out of the coarse quantizer, the second does not
 * depend on the query and is summed over the sub-quantizers once, when the
 * entry is added (4 bytes per entry instead of the paper's nlist x m x ksub
 * table), and the third is a table of the query alone: one table per query
 * serves every list it probes, so the block builds it once and then only
 * streams codes.  For inner product the table is list independent anyway
 * (-<q_j, codeword>, bias -<q, c>).  In per-list mode the block rebuilds the
 * CPU's residual table |(q - c)_j - codeword|^2 for every list with the
 * CPU's arithmetic, so scores are bit-identical to src/core.
 *
 * Summation order of the ADC sum follows src/core (adc.cpp): four running
 * sums over j mod 4 for 8-bit codes (tail into the first), two (even/odd j)
 * for 4-bit codes.
 *
 * Codes are stored interleaved by 32 entries: 16-byte chunk c of entry p is
 * at ((p / 32) * chunks + c) * 32 + p % 32 (in uint4 units), so the 32 lanes
 * of a warp reading chunk c of 32 consecutive entries read 512 contiguous
 * bytes.
 */
#ifndef GPUIVF_CUDA_IVFPQ_SCAN_CUH
#define GPUIVF_CUDA_IVFPQ_SCAN_CUH

#include "block_kth.cuh"
#include "select.h"
#include "warp_select.cuh"

namespace gpuivf_cuda {

/* Add the table value v of sub-quantizer j (j4 = j % 4) in src/core's
 * order: into s[j % 4] inside the full groups, into s0 in the tail. */
__device__ __forceinline__ void adc_add(float v, bool tail, int j4, float &s0, float &s1, float &s2, float &s3) {
    if (tail || j4 == 0)
        s0 += v;
    else if (j4 == 1)
        s1 += v;
    else if (j4 == 2)
        s2 += v;
    else
        s3 += v;
}

/* Sum of chunk c (16 sub-quantizers) of an 8-bit code into s0..s3.  src/core
 * sums groups of eight with s[j % 4] and the last m % 8 into s0. */
__device__ __forceinline__ void adc_chunk_8bit(const uint4 w, const float *lut, int c, int m, float &s0, float &s1,
                                               float &s2, float &s3) {
    const int m8 = m & ~7;
    const float *lc = lut + c * (16 * 256);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
    if ((c + 1) * 16 <= m8) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const uint32_t x = words[q];
            s0 += lc[(4 * q + 0) * 256 + (x & 0xffu)];
            s1 += lc[(4 * q + 1) * 256 + ((x >> 8) & 0xffu)];
            s2 += lc[(4 * q + 2) * 256 + ((x >> 16) & 0xffu)];
            s3 += lc[(4 * q + 3) * 256 + (x >> 24)];
        }
    } else {
#pragma unroll
        for (int b = 0; b < 16; ++b) {
            const int j = c * 16 + b;
            if (j < m) {
                const float v = lc[b * 256 + ((words[b >> 2] >> (8 * (b & 3))) & 0xffu)];
                adc_add(v, j >= m8, b & 3, s0, s1, s2, s3);
            }
        }
    }
}

/* ADC sum of one 8-bit code (chunks of 16 sub-quantizers), in src/core's
 * order.  The first two chunks (m <= 32: the whole code) are loaded before
 * either is summed: one memory round trip a code instead of one a chunk. */
__device__ __forceinline__ float adc_sum_8bit(const uint4 *cp, const float *lut, int chunks, int m) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    const uint4 w0 = __ldg(cp);
    const uint4 w1 = chunks > 1 ? __ldg(cp + 32) : make_uint4(0, 0, 0, 0);
    adc_chunk_8bit(w0, lut, 0, m, s0, s1, s2, s3);
    if (chunks > 1) adc_chunk_8bit(w1, lut, 1, m, s0, s1, s2, s3);
    for (int c = 2; c < chunks; ++c) adc_chunk_8bit(__ldg(cp + c * 32), lut, c, m, s0, s1, s2, s3);
    return (s0 + s1) + (s2 + s3);
}

/* ADC sum of one 4-bit code (chunks of 32 sub-quantizers, two per byte).
 * src/core sums groups of sixteen with s[j % 4] and the last m % 16 into s0. */
__device__ __forceinline__ float adc_sum_4bit(const uint4 *cp, const float *lut, int chunks, int m) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    const int m16 = m & ~15;
    for (int c = 0; c < chunks; ++c) {
        const uint4 w = __ldg(cp + c * 32);
        const float *lc = lut + c * (32 * 16);
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
        if ((c + 1) * 32 <= m16) {
#pragma unroll
            for (int b = 0; b < 16; b += 2) {
                const uint32_t lo = (words[b >> 2] >> (8 * (b & 3))) & 0xffu;
                const uint32_t hi = (words[b >> 2] >> (8 * ((b + 1) & 3))) & 0xffu;
                s0 += lc[(2 * b + 0) * 16 + (lo & 15u)];
                s1 += lc[(2 * b + 1) * 16 + (lo >> 4)];
                s2 += lc[(2 * b + 2) * 16 + (hi & 15u)];
                s3 += lc[(2 * b + 3) * 16 + (hi >> 4)];
            }
        } else {
#pragma unroll
            for (int b = 0; b < 16; ++b) {
                const uint32_t byte = (words[b >> 2] >> (8 * (b & 3))) & 0xffu;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int jr = 2 * b + h; /* in the chunk */
                    const int j = c * 32 + jr;
                    if (j < m) {
                        const float v = lc[jr * 16 + (h ? (byte >> 4) : (byte & 15u))];
                        adc_add(v, j >= m16, jr & 3, s0, s1, s2, s3);
                    }
                }
            }
        }
    }
    return (s0 + s1) + (s2 + s3);
}

/* One entry of a sub-space table with src/core's arithmetic (ivfpq.cpp):
 * sub-spaces of 1, 2, 4 or 8 dimensions are summed in order, others in the
 * 16 lanes of distance.cpp; inner product tables hold -r.c. */
__device__ __forceinline__ float core_table_entry(const float *r, const float *cw, int dsub, bool ip) {
    if (dsub == 1 || dsub == 2 || dsub == 4 || dsub == 8) {
        float s = 0.0f;
        for (int t = 0; t < dsub; ++t) {
            if (ip) {
                s = __fadd_rn(s, __fmul_rn(r[t], cw[t]));
            } else {
                const float diff = __fsub_rn(r[t], cw[t]);
                s = __fadd_rn(s, __fmul_rn(diff, diff));
            }
        }
        return ip ? -s : s;
    }
    return ip ? -core_inner_product_serial(r, cw, dsub) : core_l2_squared_serial(r, cw, dsub);
}

/* The query's table (list independent): -2 <q_j, cw> for L2/cosine (fast
 * arithmetic: the decomposed scores are not the CPU's bits anyway), or the
 * CPU's -inner_product(q_j, cw) for inner product. */
__device__ __forceinline__ void build_query_lut(const IvfPqScanArgs &a, const float *qs, float *lut, bool ip) {
    const int total = a.m * a.ksub;
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
        const int j = i / a.ksub;
        const float *qj = qs + j * a.dsub;
        const float *cw = a.codebook + static_cast<int64_t>(i) * a.dsub;
        if (ip) {
            lut[i] = core_table_entry(qj, cw, a.dsub, true);
        } else {
            float acc = 0.0f;
            for (int t = 0; t < a.dsub; ++t) acc = fmaf(qj[t], __ldg(cw + t), acc);
            lut[i] = -2.0f * acc;
        }
    }
}

/* The CPU's table of one list, |r_j - cw|^2 with r = q - c (rs, in shared
 * memory).  For 8-bit codes of 2, 4 or 8 dimensions per sub-quantizer the
 * codewords are read as whole vectors and four entries' loads are in flight
 * at once (the generic loop waits for one load at a time); the sums are
 * core_table_entry's, in the same order. */
template <int DSUB, int kThreads>
__device__ __forceinline__ void build_list_lut(const IvfPqScanArgs &a, const float *rs, float *lut) {
    const int total = a.m * a.ksub;
    if constexpr (DSUB == 0) {
        for (int i = threadIdx.x; i < total; i += kThreads) {
            const int j = i / a.ksub;
            lut[i] = core_table_entry(rs + j * a.dsub, a.codebook + static_cast<int64_t>(i) * a.dsub, a.dsub, false);
        }
    } else {
#pragma unroll 4
        for (int i = threadIdx.x; i < total; i += kThreads) {
            const float *r = rs + (i >> 8) * DSUB;
            const float *cwp = a.codebook + static_cast<int64_t>(i) * DSUB;
            float cw[DSUB];
            if constexpr (DSUB == 2) {
                const float2 v = __ldg(reinterpret_cast<const float2 *>(cwp));
                cw[0] = v.x;
                cw[1] = v.y;
            } else {
#pragma unroll
                for (int h = 0; h < DSUB / 4; ++h) {
                    const float4 v = __ldg(reinterpret_cast<const float4 *>(cwp) + h);
                    cw[4 * h + 0] = v.x;
                    cw[4 * h + 1] = v.y;
                    cw[4 * h + 2] = v.z;
                    cw[4 * h + 3] = v.w;
                }
            }
            float sum = 0.0f;
#pragma unroll
            for (int t = 0; t < DSUB; ++t) {
                const float diff = __fsub_rn(r[t], cw[t]);
                sum = __fadd_rn(sum, __fmul_rn(diff, diff));
            }
            lut[i] = sum;
        }
    }
}

/* Blocks per multiprocessor the register budget is sized for: small queues
 * leave room for more resident warps (latency hiding for the code loads).
 * Measured alternatives (DESIGN.md): the collecting scan at 2 (96
 * registers) was slower, the WarpSelect scan at 3 for W = 128..256 the
 * same within noise. */
template <int W, int kThreads = kScanThreads>
struct ScanMinBlocks {
    static constexpr int at256 = ivfpq_scan_collects(W) ? 4 : (W <= 64 ? 4 : (W <= 256 ? 2 : 1));
    /* the same registers a thread with wider blocks */
    static constexpr int value = at256 * kScanThreads / kThreads > 0 ? at256 * kScanThreads / kThreads : 1;
};

/* Thread-queue slots per lane in the scan (shared memory is shared with the
 * look-up table, so fewer than in select_rows). */
template <int W>
struct ScanQueueLength {
    static constexpr int value = W <= 64 ? 2 : (W <= 512 ? 4 : 8);
};

/*
 * Collect-then-select (k-buckets kScanCollectMinW..kScanCollectMaxW): the
 * block appends every code whose key beats its running bound to one shared
 * buffer, and when the buffer could overflow, and at the end, cuts it to
 * its k best: the k-th key by radix selection (block_kth.cuh), then the
 * keys at or below it.  Why: a block of the GPU worker's scan sees one
 * list (~1,000 codes) for a query that keeps 200 candidates, so each warp's
 * WarpSelect queue never filled, never had a threshold, and took every code
 * through its thread queue, bitonic merges and the block merge (measured:
 * that selection was 35-45 % of the scan's throughput at 200 candidates,
 * DESIGN.md).  The result is the same: the k best keys, ascending (or, for
 * the re-rank, in any order with the run's bound).
 */

/* Dynamic shared memory of the scan's selection (the host's
 * ivfpq_scan_select_bytes): the warps' thread queues, or the collected keys
 * and a cut's k best. */
template <int W, int T, int kThreads>
constexpr size_t ivfpq_scan_select_bytes() {
    return ivfpq_scan_collects(W) ? ivfpq_scan_collect_bytes(W)
                                  : sizeof(Key) * (kThreads / 32) * WarpSelect<W, T>::kSmemKeys;
}

/* Shared scratch of the collect selection. */
template <int kWarps>
struct CollectShared {
    /* keys appended by step s in added[s % 3]: a step's count is read by
     * every thread at the next step's barrier, and the counter of the step
     * after that is cleared meanwhile, so no barrier more is needed */
    int added[3];
    int kept;             /* keys gathered by a cut */
    Key bound;            /* a key at or above the k-th best so far */
    KthShared kth;
};

/* Append each lane's key that is below the bound after buf[0, n) (whole
 * warp; counter: this step's). */
__device__ __forceinline__ void collect_offer(bool valid, Key key, Key bound, Key *buf, int n, int *counter) {
    const int slot = warp_append_slot(valid && key < bound, counter);
    if (slot >= 0) buf[n + slot] = key;
}

/* Sort keys[0, n) ascending in shared memory (n a power of two; block-wide,
 * ends with a barrier). */
__device__ __forceinline__ void block_bitonic_sort(Key *keys, int n, int threads) {
    for (int size = 2; size <= n; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < (n >> 1); i += threads) {
                const int lo = 2 * stride * (i / stride) + (i % stride), hi = lo + stride;
                const bool up = (lo & size) == 0;
                const Key x = keys[lo], y = keys[hi];
                if ((x > y) == up) {
                    keys[lo] = y;
                    keys[hi] = x;
                }
            }
            __syncthreads();
        }
}

/* Cut buf[0, n) to its k best (block-wide, n > k): they go to out[0, k),
 * and the bound becomes the k-th. */
template <int kWarps>
__device__ void collect_cut(const Key *buf, int n, int k, Key *out, CollectShared<kWarps> &cs) {
    const Key t = block_kth_key(buf, n, k, cs.kth, kWarps);
    if (threadIdx.x == 0) cs.kept = 0;
    __syncthreads();
    block_take_at_or_below(buf, n, t, &cs.kept, kWarps * 32, [&](int at, Key key) {
        if (at < k) out[at] = key;
    });
    if (threadIdx.x == 0) cs.bound = t;
    __syncthreads();
}

template <int W, int T, int kThreads>
__global__ void __launch_bounds__(kThreads, ScanMinBlocks<W, kThreads>::value) ivfpq_scan_kernel(const IvfPqScanArgs a) {
    PhaseClocks clocks; /* measurement builds only (common.cuh) */
    constexpr int kWarps = kThreads / 32;
    constexpr bool kCollect = ivfpq_scan_collects(W);
    using WS = WarpSelect<W, T>;
    extern __shared__ __align__(16) unsigned char scan_smem[];
    __shared__ Key block_threshold;
    __shared__ CollectShared<kWarps> cs;

    /* [thread queues | collected keys, the cut's keys][probes: start,
     * offset, bias][table | later the queue merge] */
    Key *queues = reinterpret_cast<Key *>(scan_smem);
    constexpr int kCapacity = ivfpq_scan_collect_capacity(W);
    Key *collected = queues, *best = queues + kCapacity;
    int *pstart = reinterpret_cast<int *>(scan_smem + ivfpq_scan_select_bytes<W, T, kThreads>());
    uint32_t *poff = reinterpret_cast<uint32_t *>(pstart + a.probes_per_split + 1);
    float *pbias = reinterpret_cast<float *>(poff + a.probes_per_split);
    unsigned char *tail = reinterpret_cast<unsigned char *>(pbias + a.probes_per_split);
    tail += (16 - reinterpret_cast<uintptr_t>(tail) % 16) % 16;
    float *lut = reinterpret_cast<float *>(tail);
    const int lut_floats = a.m_pad * a.ksub;
    float *qs = lut + lut_floats;  /* the query */
    float *rs = qs + a.d;          /* residual q - c (per-list tables) */

    const int q = blockIdx.y;
    const int split = blockIdx.x;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    int k = a.query_k ? a.query_k[q] : a.k;
    k = k < 1 ? 1 : (k > W ? W : k);
    const int nprobe = a.query_nprobe ? min(a.query_nprobe[q], a.nprobe) : a.nprobe;
    const int p0 = split * a.probes_per_split;
    const int np = max(0, min(nprobe, p0 + a.probes_per_split) - p0); /* this block's probes */
    const bool ip = a.metric == static_cast<int>(Metric::InnerProduct);
    const bool list_lut = a.per_list_lut != 0 && !ip;
    const float *term2 = (!ip && !list_lut) ? a.term2 : nullptr;

    for (int t = threadIdx.x; t < a.d; t += kThreads) qs[t] = a.queries[static_cast<int64_t>(q) * a.d + t];
    /* Padding sub-quantizers (code bytes that are always 0) score 0. */
    for (int i = a.m * a.ksub + threadIdx.x; i < lut_floats; i += kThreads) lut[i] = 0.0f;
    if (threadIdx.x == 0) {
        block_threshold = kSentinelKey;
        cs.added[0] = cs.added[1] = cs.added[2] = 0;
        cs.bound = kSentinelKey;
    }
    /* The probed lists as one stream: pstart[i] = codes before probe i. */
    for (int i = threadIdx.x; i < np; i += kThreads) {
        const int64_t slot = static_cast<int64_t>(q) * a.probe_ld + p0 + i;
        const int list = a.probe_lists[slot];
        pstart[i + 1] = list < 0 ? 0 : a.list_size[list];
        poff[i] = list < 0 ? 0u : a.list_offset[list];
        pbias[i] = list_lut ? 0.0f : a.probe_bias[slot];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        pstart[0] = 0;
        for (int i = 0; i < np; ++i) pstart[i + 1] += pstart[i];
    }
    if (!list_lut && np > 0) build_query_lut(a, qs, lut, ip);
    __syncthreads();
    clocks.mark(0);

    WS ws;
    if constexpr (!kCollect) ws.init(k, queues + warp * WS::kSmemKeys, &block_threshold);
    Key bound = kSentinelKey; /* collect: cs.bound, read after each cut */
    int collected_n = 0, step = 0; /* collect: keys in the buffer before this step */

    /* Segments of the stream sharing one table: all probes, or (per-list
     * tables) one list at a time. */
    int pi = 0; /* this thread's probe cursor */
    for (int seg = 0; seg < np; seg = list_lut ? seg + 1 : np) {
        const int seg_end = list_lut ? seg + 1 : np;
        if (list_lut) {
            const int list = a.probe_lists[static_cast<int64_t>(q) * a.probe_ld + p0 + seg];
            if (list < 0) continue;
            /* The CPU's table for this list: |r_j - cw|^2 with r = q - c. */
            __syncthreads();
            const float *c = a.centroids + static_cast<int64_t>(list) * a.d;
            for (int t = threadIdx.x; t < a.d; t += kThreads) rs[t] = __fsub_rn(qs[t], c[t]);
            __syncthreads();
            if (a.ksub == 256 && a.dsub == 4)
                build_list_lut<4, kThreads>(a, rs, lut);
            else if (a.ksub == 256 && a.dsub == 2)
                build_list_lut<2, kThreads>(a, rs, lut);
            else if (a.ksub == 256 && a.dsub == 8)
                build_list_lut<8, kThreads>(a, rs, lut);
            else
                build_list_lut<0, kThreads>(a, rs, lut);
            __syncthreads();
            clocks.mark(1);
        }
        const int g0 = pstart[seg], g1 = pstart[seg_end];
        pi = seg;
        for (int b = g0; b < g1; b += kThreads) {
            if constexpr (kCollect) {
                /* room for this step's codes (every thread sees the same
                 * count after the barrier) */
                __syncthreads();
                if (step > 0) collected_n += cs.added[(step - 1) % 3];
                if (threadIdx.x == 0) cs.added[(step + 1) % 3] = 0;
                if (collected_n > kCapacity - kThreads) {
                    collect_cut<kWarps>(collected, collected_n, k, best, cs);
                    for (int i = threadIdx.x; i < k; i += kThreads) collected[i] = best[i];
                    collected_n = k;
                    __syncthreads();
                }
                bound = cs.bound;
            }
            const int g = b + threadIdx.x;
            const bool valid = g < g1;
            float score = 0.0f;
            uint32_t pos = 0;
            if (valid) {
                while (pstart[pi + 1] <= g) ++pi;
                pos = poff[pi] + static_cast<uint32_t>(g - pstart[pi]);
                const uint4 *cp = a.codes + static_cast<size_t>(pos >> 5) * a.code_chunks * 32 + (pos & 31u);
                const float sum = a.nbits == 8 ? adc_sum_8bit(cp, lut, a.code_chunks, a.m)
                                               : adc_sum_4bit(cp, lut, a.code_chunks, a.m);
                const float bias = pbias[pi];
                score = term2 ? (bias + __ldg(term2 + pos)) + sum : bias + sum;
            }
            if constexpr (kCollect) {
                collect_offer(valid, valid ? make_key(score, pos) : kSentinelKey, bound, collected, collected_n,
                              &cs.added[step % 3]);
                ++step;
            } else {
                const bool pass = valid && ws.may_pass(score);
                if (__any_sync(kFullMask, pass)) {
                    ws.reserve(1);
                    if (pass) ws.offer(score, pos);
                }
                ws.refresh();
            }
        }
    }

    clocks.mark(2);
    Key *o = a.out + (static_cast<int64_t>(q) * gridDim.x + split) * a.out_ld;
    Key *ob = a.out_bound ? a.out_bound + static_cast<int64_t>(q) * gridDim.x + split : nullptr;
    if constexpr (kCollect) {
        /* the k best of what was collected, ranked into place (or in any
         * order, with the cut as the run's bound, for the re-rank) */
        __syncthreads();
        int n = collected_n + (step > 0 ? cs.added[(step - 1) % 3] : 0);
        const Key *sel = collected;
        Key run_bound = kSentinelKey; /* the sentinel bounds nothing */
        if (n > k) {
            collect_cut<kWarps>(collected, n, k, best, cs);
            run_bound = cs.bound;
            sel = best;
            n = k;
        }
        clocks.mark(3);
        if (ob) {
            for (int i = threadIdx.x; i < n && i < a.out_count; i += kThreads) o[i] = sel[i];
            if (threadIdx.x == 0) *ob = run_bound;
        } else if constexpr (W <= 256) {
            for (int i = threadIdx.x; i < n; i += kThreads) {
                const Key key = sel[i];
                int rank = 0;
                for (int j = 0; j < n; ++j) rank += sel[j] < key;
                if (rank < a.out_count) o[rank] = key;
            }
        } else {
            /* ranking each key against all n costs n^2 / threads reads (2,500 a
             * thread at 800): a bitonic sort of the k best in place is cheaper */
            if (sel != best) {
                for (int i = threadIdx.x; i < n; i += kThreads) best[i] = sel[i];
            }
            const int p2 = n <= 1 ? 1 : 1 << (32 - __clz(n - 1));
            for (int i = n + threadIdx.x; i < p2; i += kThreads) best[i] = kSentinelKey;
            __syncthreads();
            block_bitonic_sort(best, p2, kThreads);
            for (int i = threadIdx.x; i < n && i < a.out_count; i += kThreads) o[i] = best[i];
        }
        for (int e = n + threadIdx.x; e < a.out_count; e += kThreads) o[e] = kSentinelKey;
        clocks.mark(4);
        if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) clocks.print("scan_phase_clocks");
    } else {
        ws.flush();
        __syncthreads(); /* the table is dead: its memory holds the queue merge */
        block_merge_queues<W, T, kWarps>(ws, reinterpret_cast<Key *>(tail));
        if (warp == 0) {
#pragma unroll
            for (int r = 0; r < W / 32; ++r) {
                const int e = r * 32 + lane;
                if (e < a.out_count) o[e] = e < k ? ws.queue[r] : kSentinelKey;
                if (ob && e == k - 1) *ob = ws.queue[r]; /* the run's k-th */
            }
        }
    }
}

}  // namespace gpuivf_cuda

#endif /* GPUIVF_CUDA_IVFPQ_SCAN_CUH */
