/*
 * ivfpq_scan8.cuh — the list scan for 8-bit codes with decomposed (query)
 * look-up tables, arranged so that table look-ups never conflict on a
 * shared-memory bank.
 *
 * Why.  In ivfpq_scan.cuh each lane scores one code, and at a given step all
 * 32 lanes look up the same sub-quantizer's row of 256 floats at random
 * code bytes: the 32 addresses fall on random banks, so one warp-wide
 * look-up costs the most-loaded bank's count of distinct words, about 3.3
 * shared-memory wavefronts (DESIGN.md).  That bound was the scan's ceiling.
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
 * Two queries a block, four lanes a code.  With m <= 32 the second
 * half of every row serves a second query, in a block of twice the warps:
 * 32 resident warps per multiprocessor instead of 24, registers capped at
 * 64.  There each code is scored by four lanes over a 64-code tile, so the
 * tile's fixed costs (locating it, the butterfly, the threshold refresh)
 * are shared by twice the codes; see the kQuad loop of the kernel.  Together:
 * 6.26 -> 4.72 ms for 10,000 queries on 1M codes (DESIGN.md).
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

/* One stage of a butterfly transpose: the lanes that differ in bit `mask`
 * (upper: this lane has it) swap halves of in[0 .. 2N) and add, so each
 * keeps N sums over both lanes: rounds 0 .. N - 1 in the lower lane,
 * N .. 2N - 1 in the upper. */
template <int N>
__device__ __forceinline__ void butterfly_stage(const float (&in)[2 * N], float (&out)[N], bool upper, int mask) {
#pragma unroll
    for (int r = 0; r < N; ++r) {
        const float send = upper ? in[r] : in[r + N];
        const float keep = upper ? in[r + N] : in[r];
        out[r] = keep + __shfl_xor_sync(kFullMask, send, mask);
    }
}

/* Butterfly over the eight lanes of a group: acc[i] is this lane's partial
 * of round i; returns the full sum of round t (t = lane % 8). */
__device__ __forceinline__ float transpose_reduce8(const float (&acc)[8], int t) {
    float r4[4], r2[2], r1[1];
    butterfly_stage<4>(acc, r4, (t & 4) != 0, 4);
    butterfly_stage<2>(r4, r2, (t & 2) != 0, 2);
    butterfly_stage<1>(r2, r1, (t & 1) != 0, 1);
    return r1[0];
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

/* Where the scan is: a tile's probe, first position, codes in it, bias,
 * the first tile past its probe, and the per-entry term of the code this
 * lane will hold (loaded a tile ahead, with the code words). */
struct Scan8Tile {
    int probe;
    uint32_t base;
    int nvalid;
    float bias;
    int end;
    float term;
};

/* A barrier of the threads that work on one query: the whole block when a
 * block holds one query; a named barrier (1 + h) of the query's warps when
 * it holds two, so that the two halves never wait for each other. */
template <int kQ, int kQueryThreads>
struct QueryBarrier {
    int id;
    __device__ __forceinline__ void operator()() const {
        if constexpr (kQ == 1)
            __syncthreads();
        else if (id == 1) /* constant ids: a register id would reserve all 16 barriers */
            asm volatile("bar.sync 1, %0;" ::"n"(kQueryThreads) : "memory");
        else
            asm volatile("bar.sync 2, %0;" ::"n"(kQueryThreads) : "memory");
    }
};

/*
 * kQ queries per block.  kQ = 1: one query (grid: splits x queries), its
 * table in as many slabs as m needs.  kQ = 2 (m_pad <= 32, small queues;
 * grid: 1 x half the (query, split) items): half h of block b (kWarps / 2
 * warps) scans item 2b + h, its table in columns 32h .. 32h + 31 of each
 * 64-float row of one slab (a table of m <= 32 leaves that half unused).
 * That is twice the warps per byte of table: 32 resident warps per
 * multiprocessor instead of 24 (registers capped at 64).  The halves
 * synchronise only within themselves (named barriers) and merge their
 * queues in memory of their own.  The column offset rides in the lane's
 * column byte: a look-up stays three instructions.
 *
 * Measured (DESIGN.md): a half that went on to further items (two
 * blocks per multiprocessor, items dealt round-robin) needed more than 64
 * registers and was 22 % slower than one item a half.
 */
template <int W, int T, int kThreads, int kQ>
__global__ void __launch_bounds__(kThreads, kQ == 1 ? Scan8MinBlocks<W>::value : 2)
    ivfpq_scan8_kernel(const IvfPqScanArgs a) {
    constexpr int kWarps = kThreads / 32;
    constexpr int kQueryWarps = kWarps / kQ;
    constexpr int kQueryThreads = kQueryWarps * 32;
    /* four lanes a code, 64-code tiles (kQ = 2 only; the kQuad loop below) */
    constexpr bool kQuad = kQ == 2;
    constexpr int kTileCodes = kQuad ? 64 : 32;
    using WS = WarpSelect<W, T>;
    extern __shared__ __align__(16) unsigned char scan_smem[];
    __shared__ Key block_threshold[kQ];

    /* [table slabs | later the queue merge (kQ = 1)][queries][thread
     * queues][probes of each half][queue merges of each half (kQ = 2)].
     * The table comes first so that its address is a constant: a look-up
     * is then byte-permute, load, add. */
    const int slabs = (a.m_pad + 63) >> 6;
    const int dpad = (a.d + 3) & ~3;
    float *qs_all = reinterpret_cast<float *>(scan_smem + slabs * kScan8SlabBytes);
    Key *queues = reinterpret_cast<Key *>(qs_all + kQ * dpad);
    Scan8Probe *probes_all = reinterpret_cast<Scan8Probe *>(queues + kWarps * WS::kSmemKeys);
    Key *merge_all = reinterpret_cast<Key *>(probes_all + kQ * (a.probes_per_split + 1));

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int half = warp / kQueryWarps; /* this warp's query in the block */
    const int qwarp = warp % kQueryWarps;
    const int qtid = threadIdx.x % kQueryThreads;
    const QueryBarrier<kQ, kQueryThreads> sync{1 + half};
    float *qs = qs_all + half * dpad;
    Scan8Probe *probes = probes_all + half * (a.probes_per_split + 1);
    const bool ip = a.metric == static_cast<int>(Metric::InnerProduct);
    const float *term2 = ip ? nullptr : a.term2;
    float *lut = reinterpret_cast<float *>(scan_smem);

    /* Step s takes byte (s ^ g) & 3 of a word and looks up column
     * 4t + that byte (+ 32 for half 1 of a pair): one __byte_perm builds
     * the byte offset c * 256 + column * 4 from the code word (byte 1 <- the
     * code byte, by selector sel0 ^ (s << 4)) and the column bytes (byte 0
     * <- colb0 ^ 4s). */
    const int g = lane >> 3, t = lane & 7;
    const uint32_t sel0 = 0x7604u | (static_cast<uint32_t>(g) << 4);
    const uint32_t colb0 = static_cast<uint32_t>(32 * half + 4 * t + g) * 4u;
    const int held = 4 * t + g; /* the code of a tile lane (g, t) holds after the butterfly */
    const int words = a.m_pad >> 2; /* 32-bit words per code */
    const uint32_t *codes32 = reinterpret_cast<const uint32_t *>(a.codes);
    const uint32_t tile_words = static_cast<uint32_t>(a.code_chunks) * 128u;

    /* the item (query, split) of this block or half; an odd count leaves the
     * last block's second half without one */
    const int item = kQ == 1 ? static_cast<int>(blockIdx.y) * a.splits + static_cast<int>(blockIdx.x)
                             : static_cast<int>(blockIdx.y) * 2 + half;
    if (item >= a.nq * a.splits) return; /* the other half synchronises without this one */
    const int q = item / a.splits;
    const int split = item % a.splits;
    int k = a.query_k ? a.query_k[q] : a.k;
    k = k < 1 ? 1 : (k > W ? W : k);
    const int nprobe = a.query_nprobe ? min(a.query_nprobe[q], a.nprobe) : a.nprobe;
    const int p0 = split * a.probes_per_split;
    const int np = max(0, min(nprobe, p0 + a.probes_per_split) - p0);

    for (int i = qtid; i < a.d; i += kQueryThreads) qs[i] = a.queries[static_cast<int64_t>(q) * a.d + i];
    if (qtid == 0) block_threshold[half] = kSentinelKey;
    /* The probed lists as one stream of kTileCodes-code tiles (probes[np] ends it). */
    for (int i = qtid; i < np; i += kQueryThreads) {
        const int64_t slot = static_cast<int64_t>(q) * a.probe_ld + p0 + i;
        const int list = a.probe_lists[slot];
        const int size = list < 0 ? 0 : a.list_size[list];
        probes[i].tile_start = (size + kTileCodes - 1) / kTileCodes; /* tiles, summed below */
        probes[i].offset = list < 0 ? 0u : a.list_offset[list];
        probes[i].size = size;
        probes[i].bias = a.probe_bias[slot];
    }
    sync();
    if (qtid == 0) {
        int sum = 0;
        for (int i = 0; i < np; ++i) {
            const int tiles = probes[i].tile_start;
            probes[i].tile_start = sum;
            sum += tiles;
        }
        probes[np].tile_start = sum;
    }
    /* The query's table, transposed: entry (j, c) at float
     * (j / 64) * 16384 + c * 64 + j % 64, or c * 64 + 32h + j for half
     * h of a pair.  Consecutive threads write consecutive words (no
     * conflicts) and read consecutive codewords of the transposed
     * codebook; four entries per thread in flight.  Sub-quantizers past
     * m score 0 (their code bytes are 0); columns past m_pad stay
     * unwritten, as they are never read, except in the kQuad loop, which
     * reads all 32 of its half (code words past m_pad read as 0). */
    const int total = kQ == 1 ? slabs * 16384 : 256 * 32;
#pragma unroll 4
    for (int i = qtid; i < total; i += kQueryThreads) {
        const int c = kQ == 1 ? (i >> 6) & 255 : i >> 5;
        const int j = kQ == 1 ? (((i >> 14) << 6) | (i & 63)) : (i & 31);
        if (j >= (kQuad ? 32 : a.m_pad)) continue; /* kQuad reads every column of its half */
        float v = 0.0f;
        if (j < a.m) {
            const float *qj = qs + j * a.dsub;
            const float *cw = a.codebook_t + (static_cast<int64_t>(c) * a.m + j) * a.dsub;
            if (ip) {
                v = core_table_entry(qj, cw, a.dsub, true);
            } else {
                float acc = 0.0f;
                for (int u = 0; u < a.dsub; ++u) acc = fmaf(qj[u], __ldg(cw + u), acc);
                v = -2.0f * acc;
            }
        }
        lut[kQ == 1 ? i : c * 64 + 32 * half + j] = v;
    }
    sync();

    WS ws;
    ws.init(k, queues + warp * WS::kSmemKeys, &block_threshold[half]);
    const int ntiles = probes[np].tile_start;

    /* tile -> its probe (the cursor only moves forward), first position,
     * codes in it, coarse term, the first tile of the next probe */
    auto locate = [&](int tile, Scan8Tile &st) {
        while (probes[st.probe + 1].tile_start <= tile) ++st.probe; /* the same for the whole warp */
        const Scan8Probe pr = probes[st.probe];
        const int local = tile - pr.tile_start;
        st.base = pr.offset + static_cast<uint32_t>(kTileCodes * local);
        st.nvalid = pr.size - kTileCodes * local;
        st.bias = pr.bias;
        st.end = probes[st.probe + 1].tile_start;
    };
    /* the next tile of a warp: kQueryWarps tiles on in the same probe
     * (the common case: lists are ~1,000 codes), else found by locate */
    auto advance = [&](int next, const Scan8Tile &cs, Scan8Tile &ns) {
        if (next < cs.end) {
            ns = cs;
            ns.base += static_cast<uint32_t>(kTileCodes * kQueryWarps);
            ns.nvalid -= kTileCodes * kQueryWarps;
        } else {
            ns.probe = cs.probe;
            locate(next, ns);
        }
    };
    /* a code's score: coarse term, per-entry term (L2, cosine), ADC sum */
    auto code_score = [&](float bias, float term, float sum) {
        return term2 ? (bias + term) + sum : bias + sum;
    };
    auto load_term = [&](Scan8Tile &st) {
        if (term2)
            st.term = held < st.nvalid ? __ldg(term2 + st.base + static_cast<uint32_t>(held)) : 0.0f;
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
     * them when m <= 32) was loaded one tile ahead into cur; load the
     * next tile's into nxt now, so its L2 latency overlaps these
     * look-ups. */
    auto scan_tile = [&](int tile, const uint32_t(&cur)[8], uint32_t(&nxt)[8], const Scan8Tile &cs,
                         Scan8Tile &ns) {
        const int next = tile + kQueryWarps;
        if (next < ntiles) {
            advance(next, cs, ns);
            if (t < words) load_words(ns.base, t, nxt);
            load_term(ns);
        }
        float acc[8];
        /* first: the first step of the first word starts the sums */
        auto lookups = [&](const unsigned char *slab, int hs, const uint32_t(&word)[8], bool first) {
#pragma unroll
            for (int s = 0; s < 4; ++s) {
                const uint32_t sel = sel0 ^ (static_cast<uint32_t>(s) << 4);
                const uint32_t colb = colb0 ^ (static_cast<uint32_t>(s) << 2);
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const uint32_t off = __byte_perm(word[i], colb, sel);
                    const float v = *reinterpret_cast<const float *>(slab + 128 * hs + off);
                    acc[i] = first && s == 0 ? v : acc[i] + v;
                }
            }
        };
        if (t < words)
            lookups(scan_smem, 0, cur, true);
        else
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
        /* the rest of a code wider than 32 sub-quantizers (kQ = 1 only) */
        for (int w = 8 + t, sb = 0, hs = 1; kQ == 1 && w - t < words; w += 8) {
            if (w < words) {
                uint32_t word[8];
                load_words(cs.base, w, word);
                if (hs)
                    lookups(scan_smem + sb * kScan8SlabBytes, 1, word, false);
                else
                    lookups(scan_smem + sb * kScan8SlabBytes, 0, word, false);
            }
            sb += hs;
            hs ^= 1;
        }
        const float sum = transpose_reduce8(acc, t);

        const bool valid = held < cs.nvalid;
        const uint32_t pos = cs.base + static_cast<uint32_t>(held);
        float score = 0.0f;
        if (valid) {
            score = code_score(cs.bias, cs.term, sum);
        }
        const bool pass = valid && ws.may_pass(score);
        if (__any_sync(kFullMask, pass)) {
            ws.reserve(1);
            if (pass) ws.offer(score, pos);
        }
        ws.refresh();
    };

    if constexpr (kQuad) {
        /*
         * The kQuad loop: four lanes a code, 64-code tiles (two tiles of
         * the index layout).
         * Lane (g, t) = (lane / 4, lane % 4) scores in round i (0..7) the
         * code 8i + g, holding two of its words: A = word t + 4 (g / 4) and
         * B = the other of t, t + 4 (loaded in that order, so choosing
         * costs nothing).  Step s (0..7) looks up byte (s ^ g) & 3 of A
         * (s < 4) or of B: sub-quantizer 4t + 16 ((g / 4) ^ (s / 4)) +
         * ((s ^ g) & 3), 32 different ones over the warp: one wavefront.
         * A butterfly over the four lanes of a group (6 shuffles) leaves
         * lane (g, t) with codes 16t + g and 16t + 8 + g.  Against eight
         * lanes a code, the tile's fixed costs (locating it, the butterfly
         * per code, the threshold refresh) are spread over twice the codes.
         */
        const int gq = lane >> 2, tq = lane & 3;
        const uint32_t qsel0 = 0x7604u | (static_cast<uint32_t>(gq & 3) << 4);
        const int wA = tq + 4 * (gq >> 2), wB = tq + 4 * (1 - (gq >> 2));
        const int e0 = 16 * tq + gq; /* this lane's codes after the butterfly: e0, e0 + 8 */
        Scan8Tile ts{0, 0u, 0, 0.0f, 0, 0.0f};
        if (qwarp < ntiles) locate(qwarp, ts);
        for (int tile = qwarp; tile < ntiles; tile += kQueryWarps) {
            /* words A and B of codes 8i + g (i = 0..7): 32-code index tile
             * i / 4 (the second only when the list has codes there), entry
             * 8 (i % 4) + g, chunk w / 4, word w % 4 */
            uint32_t wa8[8], wb8[8];
            {
                const uint32_t *tile0 = codes32 + static_cast<size_t>(ts.base >> 5) * tile_words +
                                        static_cast<uint32_t>(4 * gq);
                const bool second = ts.nvalid > 32;
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const uint32_t *c = tile0 + (i >> 2) * tile_words + 32 * (i & 3);
                    const bool have = i < 4 || second;
                    wa8[i] = have && wA < words ? __ldg(c + (wA >> 2) * 128 + (wA & 3)) : 0u;
                    wb8[i] = have && wB < words ? __ldg(c + (wB >> 2) * 128 + (wB & 3)) : 0u;
                }
            }
            const bool valid0 = e0 < ts.nvalid, valid1 = e0 + 8 < ts.nvalid;
            const uint32_t pos0 = ts.base + static_cast<uint32_t>(e0);
            float term0 = 0.0f, term1 = 0.0f;
            if (term2) {
                if (valid0) term0 = __ldg(term2 + pos0);
                if (valid1) term1 = __ldg(term2 + pos0 + 8u);
            }
            const float bias = ts.bias;
            const int next = tile + kQueryWarps;
            if (next < ntiles) advance(next, ts, ts);

            float acc[8];
#pragma unroll
            for (int s = 0; s < 8; ++s) {
                const uint32_t sel = qsel0 ^ (static_cast<uint32_t>(s & 3) << 4);
                const int h = (gq >> 2) ^ (s >> 2);
                const uint32_t colb = static_cast<uint32_t>(32 * half + 4 * tq + 16 * h + ((s ^ gq) & 3)) * 4u;
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const uint32_t off = __byte_perm(s < 4 ? wa8[i] : wb8[i], colb, sel);
                    const float v = *reinterpret_cast<const float *>(scan_smem + off);
                    acc[i] = s == 0 ? v : acc[i] + v;
                }
            }
            /* butterfly over the four lanes of the group: xor 2 keeps rounds
             * 0..3 or 4..7, xor 1 two of those */
            float r4[4], r2[2];
            butterfly_stage<4>(acc, r4, (tq & 2) != 0, 2);
            butterfly_stage<2>(r4, r2, (tq & 1) != 0, 1);
            /* r2[0]: round 2t (code 16t + g), r2[1]: round 2t + 1 */
            const float score0 = code_score(bias, term0, r2[0]);
            const float score1 = code_score(bias, term1, r2[1]);
            const bool pass0 = valid0 && ws.may_pass(score0);
            const bool pass1 = valid1 && ws.may_pass(score1);
            if (__any_sync(kFullMask, pass0 || pass1)) {
                ws.reserve(2);
                if (pass0) ws.offer(score0, pos0);
                if (pass1) ws.offer(score1, pos0 + 8u);
            }
            ws.refresh();
        }
    } else {
        uint32_t wa[8], wb[8];
        Scan8Tile ta{0, 0u, 0, 0.0f, 0, 0.0f}, tb{0, 0u, 0, 0.0f, 0, 0.0f};
        if (qwarp < ntiles) {
            locate(qwarp, ta);
            if (t < words) load_words(ta.base, t, wa);
            load_term(ta);
        }
        /* One call site: two (buffers swapped) would double the inlined
         * selection code of the loop, which measured slower than these
         * copies. */
        for (int tile = qwarp; tile < ntiles; tile += kQueryWarps) {
            scan_tile(tile, wa, wb, ta, tb);
#pragma unroll
            for (int i = 0; i < 8; ++i) wa[i] = wb[i];
            ta = tb;
        }
    }

    ws.flush();
    sync(); /* kQ = 1: the table is dead, its memory holds the queue merge */
    Key *merge = kQ == 1 ? reinterpret_cast<Key *>(scan_smem) : merge_all + half * kQueryWarps * W;
    block_merge_queues<W, T, kQueryWarps>(ws, merge, qwarp, sync);
    if (qwarp == 0) {
        Key *o = a.out + static_cast<int64_t>(item) * a.out_ld; /* row q * splits + split */
#pragma unroll
        for (int r = 0; r < W / 32; ++r) {
            const int e = r * 32 + lane;
            if (e < a.out_count) o[e] = e < k ? ws.queue[r] : kSentinelKey;
        }
    }
}

/* The two-queries-a-block kernel of bucket W (search.cu chooses it only for
 * buckets <= 64: larger queues do not fit 64 registers). */
template <int W, int T>
auto ivfpq_scan8_pairs_kernel() -> void (*)(const IvfPqScanArgs) {
    if constexpr (W <= 64)
        return ivfpq_scan8_kernel<W, T, 2 * kScanThreads, 2>;
    else
        return nullptr;
}

}  // namespace gpuivf_cuda

#endif /* GPUIVF_CUDA_IVFPQ_SCAN8_CUH */
