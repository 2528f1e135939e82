/*
 * ivfpq_scan8.cuh — the list scan for 8-bit codes with decomposed (query)
 * look-up tables, arranged so that table look-ups never conflict on a
 * shared-memory bank.
 *
 * Why.  In ivfpq_scan.cuh each lane scores one code, and at a given step all
 * 32 lanes look up the same sub-quantizer's row of 256 floats at random
 * code bytes: the 32 addresses fall on random banks, so one warp-wide
 * look-up costs the most-loaded bank's count of distinct words, about 3.3
 * shared-memory wavefronts (NOTES.md).  That bound was the scan's ceiling.
 *
 * How.  The table is stored transposed, entry (j, c) at c * 64 + j (in
 * slabs of 64 sub-quantizers), so that its bank is j mod 32 whatever the
 * code byte c is; and at every step
 * the 32 lanes look up 32 different sub-quantizers j.  Eight lanes share a
 * code: lane (g, t) = (lane / 8, lane % 8) reads word t (+ 8u) of the code,
 * i.e. sub-quantizers 4t .. 4t + 3 (+ 32u), and at step s takes byte
 * (s ^ g) & 3 of it, so the 32 lanes cover j mod 32 = 4t + ((s ^ g) & 3)
 * exactly once: one wavefront per warp-wide look-up.  A warp scores a tile
 * of 32 codes (a list's positions 32i .. 32i + 31) in eight rounds; in
 * round i the group g works on code 4i + g, and each lane ends with partial
 * sums of eight codes.  A butterfly over the eight lanes of a group (7
 * shuffles) transposes and adds them, leaving lane (g, t) with code 4t + g.
 * Then the usual compute-then-filter selection (warp_select.cuh).
 *
 * Instructions.  Profiling the first version (nsight compute) showed the
 * scan issue-bound (83 % of issue slots, ALU pipe first) rather than bound
 * by shared memory or L2: the address arithmetic per look-up (extract the
 * byte, multiply by the row length, add the column, scale, add the base)
 * cost more than the look-up.  Rows of 64 floats (256 bytes) at the start
 * of shared memory make the byte offset c * 256 + column * 4 a single
 * __byte_perm of the code word and a per-lane column byte, so a look-up is
 * three instructions: permute, load (constant base and half-slab offset as
 * immediates), add.  Tables of m <= 32 leave half of each row unused (64 KB
 * instead of 32 KB of shared memory: three blocks per multiprocessor
 * instead of four).
 *
 * The code words of a round are two runs of 64 contiguous bytes (the
 * interleaved layout of index.h); the per-entry term is read coalesced.
 * Scores equal ivfpq_scan.cuh's decomposed scores up to the order of the
 * ADC sum (float rounding), so the CPU-identical per-list mode and the
 * 4-bit codes (16-float rows: no conflicts to begin with) keep that kernel.
 */
#ifndef GPUIVF_CUDA_IVFPQ_SCAN8_CUH
#define GPUIVF_CUDA_IVFPQ_SCAN8_CUH

#include "ivfpq_scan.cuh"

namespace gpuivf_cuda {

/* Butterfly over the eight lanes of a group: acc[i] is this lane's partial
 * of round i; returns the full sum of round t (t = lane % 8). */
__device__ __forceinline__ float transpose_reduce8(const float (&acc)[8], int t) {
    float r4[4], r2[2];
    const bool h4 = (t & 4) != 0, h2 = (t & 2) != 0, h1 = (t & 1) != 0;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const float send = h4 ? acc[r] : acc[r + 4];
        const float keep = h4 ? acc[r + 4] : acc[r];
        r4[r] = keep + __shfl_xor_sync(kFullMask, send, 4);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float send = h2 ? r4[r] : r4[r + 2];
        const float keep = h2 ? r4[r + 2] : r4[r];
        r2[r] = keep + __shfl_xor_sync(kFullMask, send, 2);
    }
    const float send = h1 ? r2[0] : r2[1];
    const float keep = h1 ? r2[1] : r2[0];
    return keep + __shfl_xor_sync(kFullMask, send, 1);
}

/* Blocks per multiprocessor: the 64 KB table allows three (with the small
 * queues), so the registers may grow to that. */
template <int W>
struct Scan8MinBlocks {
    static constexpr int value = W <= 64 ? 3 : (W <= 256 ? 2 : 1);
};

/* One probe of a block: its first tile in the block's tile stream, the
 * list's first position and size, the coarse term (one 16-byte load). */
struct Scan8Probe {
    int tile_start;
    uint32_t offset;
    int size;
    float bias;
};

/* Where the scan is: a tile's probe, first position, codes in it, bias. */
struct Scan8Tile {
    int probe;
    uint32_t base;
    int nvalid;
    float bias;
};

template <int W, int T, int kThreads>
__global__ void __launch_bounds__(kThreads, Scan8MinBlocks<W>::value) ivfpq_scan8_kernel(const IvfPqScanArgs a) {
    constexpr int kWarps = kThreads / 32;
    using WS = WarpSelect<W, T>;
    extern __shared__ __align__(16) unsigned char scan_smem[];
    __shared__ Key block_threshold;

    /* [table slabs | later the queue merge][query][thread queues][probes].
     * The table comes first so that its address is a constant: a look-up
     * is then byte-permute, load, add. */
    const int slabs = (a.m_pad + 63) >> 6;
    float *qs = reinterpret_cast<float *>(scan_smem + slabs * kScan8SlabBytes);
    Key *queues = reinterpret_cast<Key *>(qs + ((a.d + 3) & ~3));
    Scan8Probe *probes = reinterpret_cast<Scan8Probe *>(queues + kWarps * WS::kSmemKeys);

    const int q = blockIdx.y;
    const int split = blockIdx.x;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    int k = a.query_k ? a.query_k[q] : a.k;
    k = k < 1 ? 1 : (k > W ? W : k);
    const int nprobe = a.query_nprobe ? min(a.query_nprobe[q], a.nprobe) : a.nprobe;
    const int p0 = split * a.probes_per_split;
    const int np = max(0, min(nprobe, p0 + a.probes_per_split) - p0);
    const bool ip = a.metric == static_cast<int>(Metric::InnerProduct);
    const float *term2 = ip ? nullptr : a.term2;

    for (int t = threadIdx.x; t < a.d; t += kThreads) qs[t] = a.queries[static_cast<int64_t>(q) * a.d + t];
    if (threadIdx.x == 0) block_threshold = kSentinelKey;
    /* The probed lists as one stream of 32-code tiles (probes[np] ends it). */
    for (int i = threadIdx.x; i < np; i += kThreads) {
        const int64_t slot = static_cast<int64_t>(q) * a.probe_ld + p0 + i;
        const int list = a.probe_lists[slot];
        const int size = list < 0 ? 0 : a.list_size[list];
        probes[i].tile_start = (size + 31) >> 5; /* tiles, summed below */
        probes[i].offset = list < 0 ? 0u : a.list_offset[list];
        probes[i].size = size;
        probes[i].bias = a.probe_bias[slot];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int sum = 0;
        for (int i = 0; i < np; ++i) {
            const int tiles = probes[i].tile_start;
            probes[i].tile_start = sum;
            sum += tiles;
        }
        probes[np].tile_start = sum;
    }
    /* The query's table, transposed: entry (j, c) at float
     * (j / 64) * 16384 + c * 64 + j % 64.  Consecutive threads write
     * consecutive words (no conflicts) and read consecutive codewords of the
     * transposed codebook; four entries per thread in flight.
     * Sub-quantizers past m score 0 (their code bytes are 0); columns past
     * m_pad are never read and stay unwritten. */
    if (np > 0) {
        float *lut = reinterpret_cast<float *>(scan_smem);
        const int total = slabs * 16384;
#pragma unroll 4
        for (int i = threadIdx.x; i < total; i += kThreads) {
            const int c = (i >> 6) & 255;
            const int j = ((i >> 14) << 6) | (i & 63);
            if (j >= a.m_pad) continue;
            float v = 0.0f;
            if (j < a.m) {
                const float *qj = qs + j * a.dsub;
                const float *cw = a.codebook_t + (static_cast<int64_t>(c) * a.m + j) * a.dsub;
                if (ip) {
                    v = core_table_entry(qj, cw, a.dsub, true);
                } else {
                    float acc = 0.0f;
                    for (int t = 0; t < a.dsub; ++t) acc = fmaf(qj[t], __ldg(cw + t), acc);
                    v = -2.0f * acc;
                }
            }
            lut[i] = v;
        }
    }
    __syncthreads();

    WS ws;
    ws.init(k, queues + warp * WS::kSmemKeys, &block_threshold);

    /* Step s takes byte (s ^ g) & 3 of a word and looks up column
     * 4t + that byte: one __byte_perm builds the byte offset
     * c * 256 + column * 4 from the code word (byte 1 <- the code byte, by
     * selector sel0 ^ (s << 4)) and the column bytes (byte 0 <- colb0 ^ 4s). */
    const int g = lane >> 3, t = lane & 7;
    const uint32_t sel0 = 0x7604u | (static_cast<uint32_t>(g) << 4);
    const uint32_t colb0 = static_cast<uint32_t>(4 * t + g) * 4u;
    const int words = a.m_pad >> 2; /* 32-bit words per code */
    const uint32_t *codes32 = reinterpret_cast<const uint32_t *>(a.codes);
    const uint32_t tile_words = static_cast<uint32_t>(a.code_chunks) * 128u;
    const int ntiles = probes[np].tile_start;

    /* tile -> its probe (the cursor only moves forward), first position,
     * codes in it, coarse term */
    auto locate = [&](int tile, Scan8Tile &st) {
        while (probes[st.probe + 1].tile_start <= tile) ++st.probe; /* the same for the whole warp */
        const Scan8Probe pr = probes[st.probe];
        const int local = tile - pr.tile_start;
        st.base = pr.offset + 32u * static_cast<uint32_t>(local);
        st.nvalid = pr.size - 32 * local;
        st.bias = pr.bias;
    };
    /* word w of codes 4i + g (i = 0..7) of the tile at base: chunk w / 4,
     * entry, word in the chunk */
    auto load_words = [&](uint32_t base, int w, uint32_t(&word)[8]) {
        const uint32_t *wc = codes32 + static_cast<size_t>(base >> 5) * tile_words +
                             static_cast<uint32_t>((w >> 2) * 128 + 4 * g + (w & 3));
#pragma unroll
        for (int i = 0; i < 8; ++i) word[i] = __ldg(wc + 16 * i);
    };

    /* One tile: word t of the codes (sub-quantizers 4t .. 4t + 3: all of
     * them when m <= 32) was loaded one tile ahead into cur; load the next
     * tile's into nxt now, so its L2 latency overlaps these look-ups. */
    auto scan_tile = [&](int tile, const uint32_t(&cur)[8], uint32_t(&nxt)[8], const Scan8Tile &cs, Scan8Tile &ns) {
        const int next = tile + kWarps;
        if (next < ntiles) {
            ns.probe = cs.probe;
            locate(next, ns);
            if (t < words) load_words(ns.base, t, nxt);
        }
        float acc[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
        auto lookups = [&](const unsigned char *slab, int half, const uint32_t(&word)[8]) {
#pragma unroll
            for (int s = 0; s < 4; ++s) {
                const uint32_t sel = sel0 ^ (static_cast<uint32_t>(s) << 4);
                const uint32_t colb = colb0 ^ (static_cast<uint32_t>(s) << 2);
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const uint32_t off = __byte_perm(word[i], colb, sel);
                    acc[i] += *reinterpret_cast<const float *>(slab + 128 * half + off);
                }
            }
        };
        if (t < words) lookups(scan_smem, 0, cur);
        /* the rest of a code wider than 32 sub-quantizers */
        for (int w = 8 + t, sb = 0, half = 1; w - t < words; w += 8) {
            if (w < words) {
                uint32_t word[8];
                load_words(cs.base, w, word);
                if (half)
                    lookups(scan_smem + sb * kScan8SlabBytes, 1, word);
                else
                    lookups(scan_smem + sb * kScan8SlabBytes, 0, word);
            }
            sb += half;
            half ^= 1;
        }
        const float sum = transpose_reduce8(acc, t);

        const int e = 4 * t + g; /* the code this lane now holds */
        const bool valid = e < cs.nvalid;
        const uint32_t pos = cs.base + static_cast<uint32_t>(e);
        float score = 0.0f;
        if (valid) score = term2 ? (cs.bias + __ldg(term2 + pos)) + sum : cs.bias + sum;
        const bool pass = valid && ws.may_pass(score);
        if (__any_sync(kFullMask, pass)) {
            ws.reserve(1);
            if (pass) ws.offer(score, pos);
        }
        ws.refresh();
    };

    uint32_t wa[8], wb[8];
    Scan8Tile ta{0, 0u, 0, 0.0f}, tb{0, 0u, 0, 0.0f};
    if (warp < ntiles) {
        locate(warp, ta);
        if (t < words) load_words(ta.base, t, wa);
    }
    /* One call site: two (buffers swapped) would double the inlined
     * selection code of the loop, which measured slower than these copies. */
    for (int tile = warp; tile < ntiles; tile += kWarps) {
        scan_tile(tile, wa, wb, ta, tb);
#pragma unroll
        for (int i = 0; i < 8; ++i) wa[i] = wb[i];
        ta = tb;
    }

    ws.flush();
    __syncthreads(); /* the table is dead: its memory holds the queue merge */
    block_merge_queues<W, T, kWarps>(ws, reinterpret_cast<Key *>(scan_smem));
    if (warp == 0) {
        Key *o = a.out + (static_cast<int64_t>(q) * gridDim.x + split) * a.out_ld;
#pragma unroll
        for (int r = 0; r < W / 32; ++r) {
            const int e = r * 32 + lane;
            if (e < a.out_count) o[e] = e < k ? ws.queue[r] : kSentinelKey;
        }
    }
}

}  // namespace gpuivf_cuda

#endif /* GPUIVF_CUDA_IVFPQ_SCAN8_CUH */
