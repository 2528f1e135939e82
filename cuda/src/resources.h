/*
 * resources.h — the resources object (device, streams, cuBLAS handle, the
 * temporary-memory arena, the cancel hook) and the buffers built on it.
 *
 * Every piece of work of one API call runs on res.stream (cuBLAS on
 * res.gemm_stream, joined back with events), and every API call ends with a
 * stream synchronisation, so arena memory freed by one call can be reused by
 * the next without further ordering.
 */
#ifndef GPUIVF_CUDA_RESOURCES_H
#define GPUIVF_CUDA_RESOURCES_H

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "common.cuh"

struct gpuivf_cuda_resources {
    int device = 0;
    int sm_count = 0;
    size_t smem_optin = 0;       /* largest dynamic shared memory per block */
    char name[128] = {};
    int cc_major = 0, cc_minor = 0;

    cudaStream_t stream = nullptr;       /* everything is ordered on this one */
    cudaStream_t gemm_stream = nullptr;  /* GEMM tiles overlap the k-selection */
    cudaEvent_t ev_fork = nullptr;
    cudaEvent_t ev_gemm[2] = {nullptr, nullptr};
    cudaEvent_t ev_select[2] = {nullptr, nullptr};
    cublasHandle_t cublas = nullptr;

    /* The arena: one cudaMalloc'd block handed out last-in first-out. */
    char *arena = nullptr;
    size_t arena_size = 0;
    size_t arena_top = 0;
    struct Block {
        size_t offset, size;
        bool freed;
    };
    std::vector<Block> blocks;

    /* Pinned host memory for the small copies of one search (queries in,
     * results out): a pageable copy costs the driver a staging round trip
     * each, which dominates a batch of a few queries.  Bump-allocated,
     * reset at the start of every search (every call ends synchronised). */
    char *pinned = nullptr;
    char *pinned_device = nullptr; /* `pinned` as kernels address it, or null */
    size_t pinned_size = 0;
    size_t pinned_top = 0;

    /* A search started by gpuivf_cuda_index_search_async: the outputs
     * still to copy from pinned memory when it is waited for (distances,
     * ids, and the ADC distances when asked). */
    struct PendingCopy {
        void *user;
        const void *bounce;
        size_t bytes;
    };
    static constexpr int kMaxPendingCopies = 3;
    bool search_pending = false;
    PendingCopy pending_copies[kMaxPendingCopies] = {};
    int npending_copies = 0;

    /* Recorded searches (api.cu): a search of a given shape on a given
     * index version is captured once as a CUDA graph and replayed — one
     * launch instead of about a dozen calls, the host's share of a small
     * search.  The graph's inputs and outputs live at fixed places in
     * `pinned`; its temporary memory at fixed places in the arena (free
     * between calls: every call releases all it took). */
    struct SearchGraphKey {
        const void *index;
        uint64_t version;
        int64_t nq;
        int32_t k, nprobe, rerank, lut_mode, kscan_max, min_probes_per_block;
        bool query_k, query_nprobe;
        bool adc; /* out_adc asked: the graph writes the ADC distances too */
        bool operator==(const SearchGraphKey &o) const {
            return index == o.index && version == o.version && nq == o.nq && k == o.k && nprobe == o.nprobe &&
                   rerank == o.rerank && lut_mode == o.lut_mode && kscan_max == o.kscan_max &&
                   min_probes_per_block == o.min_probes_per_block && query_k == o.query_k &&
                   query_nprobe == o.query_nprobe && adc == o.adc;
        }
    };
    struct SearchGraph {
        SearchGraphKey key;
        cudaGraphExec_t exec;
        float *queries;             /* pinned: written before each launch */
        int32_t *qk, *kscan, *qnp;  /* pinned: per-query k, scan k, nprobe */
        double *distances;          /* pinned: read after it ran */
        uint64_t *ids;
        double *adc;                /* pinned, when the key's adc */
        uint64_t last_use;
    };
    std::vector<SearchGraph> search_graphs;
    uint64_t search_graph_clock = 0;
    bool search_graphs_enabled = true;
    /* temporary buffers that did not fit the arena (cudaMalloc'd, freed at
     * the end of the call: a graph must not keep such memory) */
    uint64_t arena_misses = 0;

    gpuivf_cuda_cancel_fn cancel_fn = nullptr;
    void *cancel_arg = nullptr;
};

namespace gpuivf_cuda {

using Resources = gpuivf_cuda_resources;

/* Create / destroy (throw on failure; destroy never throws). */
void resources_init(Resources &res, int device, int64_t temp_bytes);
void resources_release(Resources &res) noexcept;
/* Destroy the recorded searches (search_graph.cu). */
void drop_search_graphs(Resources &res) noexcept;

/* Make res's device current for this thread. */
void use_device(Resources &res);
/* Throw Error(GPUIVF_CUDA_CANCELED) when the cancel hook says so. */
void check_cancel(Resources &res);
/* Wait for res.stream and surface asynchronous errors. */
void sync(Resources &res);

void *arena_alloc(Resources &res, size_t bytes);   /* nullptr when it does not fit */
void arena_free(Resources &res, void *p) noexcept;
size_t arena_available(const Resources &res) noexcept;

/* Pinned host bytes from res.pinned; nullptr when they do not fit. */
void *pinned_alloc(Resources &res, size_t bytes) noexcept;

/* True when kernels can read p directly (device or managed memory). */
bool is_device_pointer(const void *p);

/* cudaMalloc of at least one byte; throws Error(GPUIVF_CUDA_OUT_OF_MEMORY). */
void *device_malloc(size_t bytes);

/* Temporary device memory: from the arena when it fits, else cudaMalloc. */
template <typename T>
class TempBuffer {
public:
    TempBuffer() = default;
    TempBuffer(Resources &res, int64_t count) { allocate(res, count); }
    ~TempBuffer() { release(); }
    TempBuffer(const TempBuffer &) = delete;
    TempBuffer &operator=(const TempBuffer &) = delete;
    TempBuffer(TempBuffer &&o) noexcept { swap(o); }
    TempBuffer &operator=(TempBuffer &&o) noexcept {
        release();
        swap(o);
        return *this;
    }

    void allocate(Resources &res, int64_t count) {
        release();
        res_ = &res;
        count_ = count;
        size_t bytes = static_cast<size_t>(count > 0 ? count : 1) * sizeof(T);
        void *p = arena_alloc(res, bytes);
        from_arena_ = p != nullptr;
        if (!p) {
            res.arena_misses++;
            p = device_malloc(bytes);
        }
        ptr_ = static_cast<T *>(p);
    }
    void release() noexcept {
        if (ptr_) {
            if (from_arena_)
                arena_free(*res_, ptr_);
            else
                cudaFree(ptr_);
        }
        ptr_ = nullptr;
        count_ = 0;
    }
    T *data() const { return ptr_; }
    int64_t size() const { return count_; }

private:
    void swap(TempBuffer &o) noexcept {
        std::swap(res_, o.res_);
        std::swap(ptr_, o.ptr_);
        std::swap(count_, o.count_);
        std::swap(from_arena_, o.from_arena_);
    }
    Resources *res_ = nullptr;
    T *ptr_ = nullptr;
    int64_t count_ = 0;
    bool from_arena_ = false;
};

/* Long-lived device memory (an index's arrays): plain cudaMalloc. */
template <typename T>
class DeviceArray {
public:
    DeviceArray() = default;
    explicit DeviceArray(int64_t count) { allocate(count); }
    ~DeviceArray() { release(); }
    DeviceArray(const DeviceArray &) = delete;
    DeviceArray &operator=(const DeviceArray &) = delete;
    DeviceArray(DeviceArray &&o) noexcept { swap(o); }
    DeviceArray &operator=(DeviceArray &&o) noexcept {
        release();
        swap(o);
        return *this;
    }
    void allocate(int64_t count) {
        release();
        if (count <= 0) return;
        ptr_ = static_cast<T *>(device_malloc(static_cast<size_t>(count) * sizeof(T)));
        count_ = count;
    }
    void release() noexcept {
        if (ptr_) cudaFree(ptr_);
        ptr_ = nullptr;
        count_ = 0;
    }
    T *data() const { return ptr_; }
    int64_t size() const { return count_; }
    int64_t bytes() const { return count_ * static_cast<int64_t>(sizeof(T)); }
    void swap(DeviceArray &o) noexcept {
        std::swap(ptr_, o.ptr_);
        std::swap(count_, o.count_);
    }

private:
    T *ptr_ = nullptr;
    int64_t count_ = 0;
};

/* A caller's input array as a device pointer: itself, or a staged copy. */
template <typename T>
class Input {
public:
    /* via_pinned: host data goes through res.pinned when it fits */
    Input(Resources &res, const T *p, int64_t count, bool via_pinned = false) {
        if (p == nullptr || count <= 0 || is_device_pointer(p)) {
            ptr_ = p;
            return;
        }
        staged_.allocate(res, count);
        const void *src = p;
        void *bounce = via_pinned ? pinned_alloc(res, sizeof(T) * count) : nullptr;
        if (bounce) {
            std::memcpy(bounce, p, sizeof(T) * count);
            src = bounce;
        }
        GPUIVF_CUDA_TRY(cudaMemcpyAsync(staged_.data(), src, sizeof(T) * count, cudaMemcpyHostToDevice, res.stream));
        ptr_ = staged_.data();
    }
    const T *get() const { return ptr_; }

private:
    const T *ptr_ = nullptr;
    TempBuffer<T> staged_;
};

/* A caller's output array: written directly when on the device, else staged
 * and copied back by finish(). */
template <typename T>
class Output {
public:
    /* via_pinned: the copy back lands in res.pinned when it fits, and
     * deliver() (after the stream is synchronised) moves it to p */
    Output(Resources &res, T *p, int64_t count, bool via_pinned = false) : res_(res), user_(p), count_(count) {
        if (p == nullptr || count <= 0 || is_device_pointer(p)) {
            ptr_ = p;
            return;
        }
        staged_.allocate(res, count);
        ptr_ = staged_.data();
        if (via_pinned) bounce_ = static_cast<T *>(pinned_alloc(res, sizeof(T) * count));
    }
    T *get() const { return ptr_; }
    void finish() {
        if (staged_.data() && count_ > 0)
            GPUIVF_CUDA_TRY(cudaMemcpyAsync(bounce_ ? bounce_ : user_, staged_.data(), sizeof(T) * count_,
                                            cudaMemcpyDeviceToHost, res_.stream));
    }
    void deliver() {
        if (bounce_) std::memcpy(user_, bounce_, sizeof(T) * count_);
    }
    /* deliver() later, at gpuivf_cuda_search_wait (the stream still runs) */
    void deliver_at_wait() {
        if (bounce_ && res_.npending_copies < Resources::kMaxPendingCopies)
            res_.pending_copies[res_.npending_copies++] = {user_, bounce_, sizeof(T) * static_cast<size_t>(count_)};
    }

private:
    Resources &res_;
    T *user_;
    int64_t count_;
    T *ptr_ = nullptr;
    T *bounce_ = nullptr;
    TempBuffer<T> staged_;
};

/* Host <-> device helpers on res.stream. */
template <typename T>
void copy_to_device(Resources &res, T *dst, const T *src, int64_t count) {
    if (count > 0)
        GPUIVF_CUDA_TRY(cudaMemcpyAsync(dst, src, sizeof(T) * count, cudaMemcpyDefault, res.stream));
}
template <typename T>
void copy_to_host_sync(Resources &res, T *dst, const T *src, int64_t count) {
    if (count > 0) {
        GPUIVF_CUDA_TRY(cudaMemcpyAsync(dst, src, sizeof(T) * count, cudaMemcpyDefault, res.stream));
        sync(res);
    }
}
/* Host array src to device dst through res.pinned when it fits. */
template <typename T>
void stage_to_device(Resources &res, T *dst, const T *src, int64_t count) {
    if (count <= 0) return;
    void *bounce = pinned_alloc(res, sizeof(T) * count);
    if (bounce) {
        std::memcpy(bounce, src, sizeof(T) * count);
        src = static_cast<const T *>(bounce);
    }
    GPUIVF_CUDA_TRY(cudaMemcpyAsync(dst, src, sizeof(T) * count, cudaMemcpyDefault, res.stream));
}

/* A caller's array (host or device) into host memory dst: a plain memcpy
 * for host memory (no stream round trip), else copy_to_host_sync. */
template <typename T>
void copy_in_host(Resources &res, T *dst, const T *src, int64_t count) {
    if (count <= 0) return;
    if (is_device_pointer(src))
        copy_to_host_sync(res, dst, src, count);
    else
        std::memcpy(dst, src, sizeof(T) * count);
}

}  // namespace gpuivf_cuda

#endif /* GPUIVF_CUDA_RESOURCES_H */
