/*
 * index.cu — the device index: creation, appending encoded entries,
 * removing ids, re-laying out the CSR lists, reading a list back.
 */
#include <algorithm>
#include <atomic>
#include <vector>

#include <cuda_fp16.h>

#include "index.h"

namespace gpuivf_cuda {

namespace {

constexpr int kThreads = 256;

/* Chunk c of the code at position pos (interleaved by 32: ivfpq_scan.cuh). */
template <typename Chunk> /* uint4 or const uint4 */
__device__ __forceinline__ Chunk *code_chunk(Chunk *codes, int chunks, uint32_t pos, int c) {
    return codes + (static_cast<size_t>(pos >> 5) * chunks + c) * 32 + (pos & 31u);
}

/* Exclusive prefix sum over the block; *total gets the block's sum. */
__device__ int block_exclusive_scan(int v, int *total) {
    __shared__ int warp_totals[32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_totals[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < nwarps ? warp_totals[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        warp_totals[lane] = w;
    }
    __syncthreads();
    const int prefix = warp > 0 ? warp_totals[warp - 1] : 0;
    *total = warp_totals[nwarps - 1];
    __syncthreads();
    return prefix + x - v;
}

struct EntryArrays {
    uint4 *codes;
    uint64_t *ids;
    float *term2;
    uint16_t *vectors; /* vw 16-bit words an entry */
};

/* Block per list: copy the kept entries, in order, to the new layout. */
__global__ void __launch_bounds__(kThreads)
    relayout_kernel(EntryArrays from, const uint32_t *old_offset, const int32_t *old_size, const uint8_t *keep,
                    EntryArrays to, const uint32_t *new_offset, int32_t *new_size, int chunks, int vw) {
    __shared__ int written;
    const int list = blockIdx.x;
    const uint32_t src0 = old_offset[list];
    const uint32_t dst0 = new_offset[list];
    const int n = old_size[list];
    if (threadIdx.x == 0) written = 0;
    __syncthreads();
    for (int start = 0; start < n; start += kThreads) {
        const int i = start + threadIdx.x;
        const int kept = (i < n && (keep == nullptr || keep[src0 + i])) ? 1 : 0;
        int total;
        const int rank = block_exclusive_scan(kept, &total);
        if (kept) {
            const uint32_t src = src0 + i;
            const uint32_t dst = dst0 + written + rank;
            to.ids[dst] = from.ids[src];
            if (to.term2) to.term2[dst] = from.term2[src];
            for (int c = 0; c < chunks; ++c) *code_chunk(to.codes, chunks, dst, c) = *code_chunk(from.codes, chunks, src, c);
            if (to.vectors) {
                const uint16_t *vs = from.vectors + static_cast<int64_t>(src) * vw;
                uint16_t *vd = to.vectors + static_cast<int64_t>(dst) * vw;
                for (int t = 0; t < vw; ++t) vd[t] = vs[t];
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) written += total;
        __syncthreads();
    }
    if (threadIdx.x == 0) new_size[list] = written;
}

/* Sub-quantizer j's code in a CPU-format code. */
__device__ __forceinline__ int get_code(const uint8_t *code, int j, int nbits) {
    if (nbits == 8) return code[j];
    const int byte = code[j >> 1];
    return (j & 1) ? (byte >> 4) : (byte & 15);
}

struct ScatterArgs {
    int64_t n;
    const uint32_t *dest;
    const int32_t *lists;
    const uint8_t *codes;  /* CPU format */
    const uint64_t *ids;
    const uint16_t *vectors; /* raw, vw words each, or null */
    const float *centroids, *codebook;
    int d, m, nbits, ksub, dsub, code_size, chunks, vw;
    bool term2;
    EntryArrays to;
};

__global__ void scatter_kernel(const ScatterArgs a) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= a.n) return;
    const uint32_t dst = a.dest[i];
    const uint8_t *code = a.codes + i * a.code_size;
    a.to.ids[dst] = a.ids[i];
    for (int c = 0; c < a.chunks; ++c) {
        uint32_t w[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            uint32_t word = 0;
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const int idx = c * 16 + q * 4 + b;
                if (idx < a.code_size) word |= static_cast<uint32_t>(code[idx]) << (8 * b);
            }
            w[q] = word;
        }
        *code_chunk(a.to.codes, a.chunks, dst, c) = make_uint4(w[0], w[1], w[2], w[3]);
    }
    if (a.term2) {
        /* |r|^2 + 2 <c, r> of the decoded residual r. */
        const float *cent = a.centroids + static_cast<int64_t>(a.lists[i]) * a.d;
        float acc = 0.0f;
        for (int j = 0; j < a.m; ++j) {
            const float *cw = a.codebook + (static_cast<int64_t>(j) * a.ksub + get_code(code, j, a.nbits)) * a.dsub;
            for (int t = 0; t < a.dsub; ++t) {
                const float r = cw[t];
                acc = fmaf(r, r + 2.0f * cent[j * a.dsub + t], acc);
            }
        }
        a.to.term2[dst] = acc;
    }
    if (a.vectors) {
        const uint16_t *vs = a.vectors + i * a.vw;
        uint16_t *vd = a.to.vectors + static_cast<int64_t>(dst) * a.vw;
        for (int t = 0; t < a.vw; ++t) vd[t] = vs[t];
    }
}

/* Block per list: keep[pos] = 0 for entries whose id is in sorted_ids. */
__global__ void mark_removed_kernel(const uint64_t *ids, const uint32_t *offset, const int32_t *size,
                                    const uint64_t *sorted_ids, int64_t nremove, uint8_t *keep,
                                    unsigned long long *removed) {
    const int list = blockIdx.x;
    const uint32_t off = offset[list];
    for (int i = threadIdx.x; i < size[list]; i += blockDim.x) {
        const uint64_t id = ids[off + i];
        int64_t lo = 0, hi = nremove;
        while (lo < hi) {
            const int64_t mid = (lo + hi) >> 1;
            if (sorted_ids[mid] < id)
                lo = mid + 1;
            else
                hi = mid;
        }
        const bool gone = lo < nremove && sorted_ids[lo] == id;
        keep[off + i] = gone ? 0 : 1;
        if (gone) atomicAdd(removed, 1ull);
    }
}

__global__ void get_list_kernel(const uint4 *codes, const uint64_t *ids, uint32_t off, int64_t count, int chunks,
                                int code_size, uint64_t *out_ids, uint8_t *out_codes) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const uint32_t pos = off + static_cast<uint32_t>(i);
    if (out_ids) out_ids[i] = ids[pos];
    if (out_codes) {
        for (int c = 0; c < chunks; ++c) {
            const uint4 v = *code_chunk(codes, chunks, pos, c);
            const uint32_t w[4] = {v.x, v.y, v.z, v.w};
            for (int b = 0; b < 16; ++b) {
                const int idx = c * 16 + b;
                if (idx < code_size) out_codes[i * code_size + idx] = static_cast<uint8_t>(w[b >> 2] >> (8 * (b & 3)));
            }
        }
    }
}

EntryArrays arrays_of(Index &ix) {
    return EntryArrays{ix.codes.data(), ix.ids.data(), ix.term2.data(), ix.vectors.data()};
}

/* Re-lay out every list with the given capacities (multiples of 32), keeping
 * the entries whose keep flag is set (all when keep is null).  The new arrays
 * are allocated before the old ones are released: on failure the index is
 * unchanged. */
void relayout(Resources &res, Index &ix, const std::vector<int64_t> &new_capacity, const uint8_t *keep) {
    index_changed(ix);
    std::vector<int64_t> new_offset(ix.nlist);
    int64_t total = 0;
    for (int l = 0; l < ix.nlist; l++) {
        new_offset[l] = total;
        total += new_capacity[l];
    }
    GPUIVF_REQUIRE(total < static_cast<int64_t>(kNoIndex) - 32, "too many entries for one GPU index: %lld",
                   static_cast<long long>(total));
    DeviceArray<uint4> codes(std::max<int64_t>(total, 32) * ix.code_chunks);
    DeviceArray<uint64_t> ids(std::max<int64_t>(total, 32));
    DeviceArray<float> term2;
    if (ix.metric != Metric::InnerProduct) term2.allocate(std::max<int64_t>(total, 32));
    DeviceArray<uint16_t> vectors;
    if (ix.store_vectors) vectors.allocate(std::max<int64_t>(total, 32) * ix.vector_words);
    DeviceArray<uint32_t> d_offset(ix.nlist);
    DeviceArray<int32_t> d_size(ix.nlist);
    std::vector<uint32_t> off32(new_offset.begin(), new_offset.end());
    copy_to_device(res, d_offset.data(), off32.data(), ix.nlist);

    if (ix.total_capacity > 0) {
        EntryArrays to{codes.data(), ids.data(), term2.data(), vectors.data()};
        relayout_kernel<<<ix.nlist, kThreads, 0, res.stream>>>(arrays_of(ix), ix.d_offset.data(), ix.d_size.data(),
                                                               keep, to, d_offset.data(), d_size.data(),
                                                               ix.code_chunks, ix.vector_words);
        GPUIVF_CUDA_CHECK_LAUNCH();
    } else {
        GPUIVF_CUDA_TRY(cudaMemsetAsync(d_size.data(), 0, sizeof(int32_t) * ix.nlist, res.stream));
    }
    std::vector<int32_t> sizes(ix.nlist);
    copy_to_host_sync(res, sizes.data(), d_size.data(), ix.nlist);

    ix.codes = std::move(codes);
    ix.ids = std::move(ids);
    ix.term2 = std::move(term2);
    ix.vectors = std::move(vectors);
    ix.d_offset = std::move(d_offset);
    ix.d_size = std::move(d_size);
    ix.offset = new_offset;
    ix.capacity = new_capacity;
    ix.total_capacity = total;
    ix.count = 0;
    for (int l = 0; l < ix.nlist; l++) {
        ix.size[l] = sizes[l];
        ix.count += sizes[l];
    }
}

}  // namespace

void index_changed(Index &ix) {
    static std::atomic<uint64_t> next_version{1};
    ix.version = next_version.fetch_add(1);
}

ModelView index_model(const Index &ix) {
    return ModelView{ix.metric, ix.d, ix.nlist, ix.m, ix.nbits, ix.centroids.data(), ix.codebook.data()};
}

namespace {

/* [m][ksub][dsub] -> [ksub][m][dsub] */
__global__ void transpose_codebook_kernel(const float *in, int m, int ksub, int dsub, float *out) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= static_cast<int64_t>(m) * ksub * dsub) return;
    const int t = static_cast<int>(i % dsub);
    const int64_t jc = i / dsub;
    const int c = static_cast<int>(jc % ksub);
    const int j = static_cast<int>(jc / ksub);
    out[(static_cast<int64_t>(c) * m + j) * dsub + t] = in[i];
}

__global__ void narrow_to_halves_kernel(const float *src, int64_t n, uint16_t *dst) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        dst[i] = __half_as_ushort(__float2half_rn(src[i]));
}

}  // namespace

void narrow_to_halves(Resources &res, const float *src, int64_t n, uint16_t *dst) {
    if (n <= 0) return;
    const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65535);
    narrow_to_halves_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, res.stream>>>(src, n, dst);
    GPUIVF_CUDA_TRY(cudaGetLastError());
}

void index_init(Resources &res, Index &ix, Metric metric, int d, int nlist, int m, int nbits, const float *centroids,
                const float *codebook, int vectors_kind) {
    index_changed(ix);
    ix.res = &res;
    ix.metric = metric;
    ix.d = d;
    ix.nlist = nlist;
    ix.m = m;
    ix.nbits = nbits;
    ix.ksub = 1 << nbits;
    ix.dsub = d / m;
    ix.code_size = pq_code_size(m, nbits);
    ix.m_pad = static_cast<int>(round_up(m, nbits == 8 ? 16 : 32));
    ix.code_chunks = nbits == 8 ? ix.m_pad / 16 : ix.m_pad / 32;
    ix.store_vectors = vectors_kind != GPUIVF_CUDA_VECTORS_NONE;
    ix.half_vectors = vectors_kind == GPUIVF_CUDA_VECTORS_FLOAT16;
    ix.vector_words = ix.store_vectors ? (ix.half_vectors ? d : 2 * d) : 0;
    ix.centroids.allocate(static_cast<int64_t>(nlist) * d);
    ix.codebook.allocate(static_cast<int64_t>(m) * ix.ksub * ix.dsub);
    copy_to_device(res, ix.centroids.data(), centroids, static_cast<int64_t>(nlist) * d);
    copy_to_device(res, ix.codebook.data(), codebook, static_cast<int64_t>(m) * ix.ksub * ix.dsub);
    if (nbits == 8) {
        /* codeword c of every sub-quantizer side by side: the conflict-free
         * scan builds its transposed table from consecutive codewords */
        const int64_t total = static_cast<int64_t>(m) * ix.ksub * ix.dsub;
        ix.codebook_t.allocate(total);
        transpose_codebook_kernel<<<static_cast<unsigned>(ceil_div(total, 256)), 256, 0, res.stream>>>(
            ix.codebook.data(), m, ix.ksub, ix.dsub, ix.codebook_t.data());
        GPUIVF_CUDA_CHECK_LAUNCH();
    }
    ix.offset.assign(nlist, 0);
    ix.size.assign(nlist, 0);
    ix.capacity.assign(nlist, 0);
    ix.total_capacity = 0;
    ix.count = 0;
    ix.d_offset.allocate(nlist);
    ix.d_size.allocate(nlist);
    GPUIVF_CUDA_TRY(cudaMemsetAsync(ix.d_offset.data(), 0, sizeof(uint32_t) * nlist, res.stream));
    GPUIVF_CUDA_TRY(cudaMemsetAsync(ix.d_size.data(), 0, sizeof(int32_t) * nlist, res.stream));
    sync(res);
}

void index_add_encoded(Resources &res, Index &ix, int64_t n, const int32_t *lists_host, const int32_t *lists_dev,
                       const uint8_t *codes, const uint64_t *ids, const uint16_t *vectors) {
    if (n <= 0) return;
    std::vector<int64_t> add(ix.nlist, 0);
    for (int64_t i = 0; i < n; i++) {
        const int32_t l = lists_host[i];
        GPUIVF_REQUIRE(l >= 0 && l < ix.nlist, "list %d is out of range 0..%d", l, ix.nlist - 1);
        add[l]++;
    }
    bool grow = false;
    for (int l = 0; l < ix.nlist && !grow; l++) grow = ix.size[l] + add[l] > ix.capacity[l];
    if (grow) {
        /*
         * Laying the index out again copies every list's codes, ids and
         * vectors, so each list gets headroom then: one that must grow 25%
         * over what it needs (1/8 on its first fill), and every other list
         * left with less than 1/16 of its size free, 1/8.  Inserts spread over
         * all lists (a loaded index is full to the next 32 in each) then lay
         * the index out again once per ~1/8 of growth, not once per list that
         * fills.  No list exceeds 1.25 x its entries (+ 32): what
         * GpuivfEstimateGpuBytes counts.
         */
        std::vector<int64_t> cap = ix.capacity;
        for (int l = 0; l < ix.nlist; l++) {
            const int64_t need = ix.size[l] + add[l];
            if (need > cap[l])
                cap[l] = round_up(ix.size[l] == 0 ? need + need / 8 : need + need / 4, 32);
            else if (cap[l] - need < need / 16)
                cap[l] = round_up(need + need / 8, 32);
        }
        relayout(res, ix, cap, nullptr);
    }

    std::vector<uint32_t> dest(n);
    std::vector<int64_t> next(ix.nlist);
    for (int l = 0; l < ix.nlist; l++) next[l] = ix.offset[l] + ix.size[l];
    for (int64_t i = 0; i < n; i++) dest[i] = static_cast<uint32_t>(next[lists_host[i]]++);
    TempBuffer<uint32_t> d_dest(res, n);
    copy_to_device(res, d_dest.data(), dest.data(), n);

    ScatterArgs a;
    a.n = n;
    a.dest = d_dest.data();
    a.lists = lists_dev;
    a.codes = codes;
    a.ids = ids;
    a.vectors = ix.store_vectors ? vectors : nullptr;
    a.vw = ix.vector_words;
    a.centroids = ix.centroids.data();
    a.codebook = ix.codebook.data();
    a.d = ix.d;
    a.m = ix.m;
    a.nbits = ix.nbits;
    a.ksub = ix.ksub;
    a.dsub = ix.dsub;
    a.code_size = ix.code_size;
    a.chunks = ix.code_chunks;
    a.term2 = ix.metric != Metric::InnerProduct;
    a.to = arrays_of(ix);
    scatter_kernel<<<static_cast<unsigned>(ceil_div(n, kThreads)), kThreads, 0, res.stream>>>(a);
    GPUIVF_CUDA_CHECK_LAUNCH();

    for (int l = 0; l < ix.nlist; l++) ix.size[l] += add[l];
    ix.count += n;
    index_changed(ix);
    std::vector<int32_t> sizes(ix.size.begin(), ix.size.end());
    copy_to_device(res, ix.d_size.data(), sizes.data(), ix.nlist);
    sync(res);
}

int64_t index_remove(Resources &res, Index &ix, int64_t n, const uint64_t *ids_host) {
    if (n <= 0 || ix.count == 0) return 0;
    std::vector<uint64_t> sorted(ids_host, ids_host + n);
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
    TempBuffer<uint64_t> d_sorted(res, static_cast<int64_t>(sorted.size()));
    copy_to_device(res, d_sorted.data(), sorted.data(), static_cast<int64_t>(sorted.size()));
    TempBuffer<uint8_t> keep(res, ix.total_capacity);
    TempBuffer<unsigned long long> removed(res, 1);
    GPUIVF_CUDA_TRY(cudaMemsetAsync(removed.data(), 0, sizeof(unsigned long long), res.stream));
    mark_removed_kernel<<<ix.nlist, kThreads, 0, res.stream>>>(ix.ids.data(), ix.d_offset.data(), ix.d_size.data(),
                                                               d_sorted.data(), static_cast<int64_t>(sorted.size()),
                                                               keep.data(), removed.data());
    GPUIVF_CUDA_CHECK_LAUNCH();
    unsigned long long h_removed = 0;
    copy_to_host_sync(res, &h_removed, removed.data(), 1);
    if (h_removed == 0) return 0;
    relayout(res, ix, ix.capacity, keep.data());
    return static_cast<int64_t>(h_removed);
}

void index_get_list(Resources &res, const Index &ix, int list, int64_t count, uint64_t *ids, uint8_t *codes) {
    if (count <= 0) return;
    get_list_kernel<<<static_cast<unsigned>(ceil_div(count, kThreads)), kThreads, 0, res.stream>>>(
        ix.codes.data(), ix.ids.data(), static_cast<uint32_t>(ix.offset[list]), count, ix.code_chunks, ix.code_size,
        ids, codes);
    GPUIVF_CUDA_CHECK_LAUNCH();
}

int64_t index_device_bytes(const Index &ix) {
    return ix.centroids.bytes() + ix.codebook.bytes() + ix.codebook_t.bytes() + ix.d_offset.bytes() + ix.d_size.bytes() + ix.codes.bytes() +
           ix.ids.bytes() + ix.term2.bytes() + ix.vectors.bytes();
}

}  // namespace gpuivf_cuda
