/*
 * search_graph.cu — small searches recorded once as CUDA graphs, then
 * replayed.
 *
 * Why.  The GPU worker's searches are small (a few dozen queries) and come
 * in few shapes.  Issuing one costs the worker's thread about 50 µs of host
 * time (gpuivf_bench worker_perlist_b*_enqueue_us): a dozen kernel launches
 * and copies, each a driver call.  The worker's thread is what takes,
 * groups and answers the requests of every backend, so that time is lost
 * throughput.  A CUDA graph of the whole search is one launch.
 *
 * How.  The first search of a shape — index version, batch size, k, nprobe,
 * re-rank, table mode, probes a block, scan k-bucket, which per-query
 * arrays are given,
 * whether the ADC distances are asked (one more output) —
 * runs under stream capture: its queries and per-query arrays are staged
 * through places in the resources' pinned memory (one copy in), its
 * temporary buffers come from the arena, and the re-rank writes its
 * results into pinned memory directly (no copy out).  The captured
 * graph is instantiated, launched and kept (kMaxGraphs per resources object,
 * the least recently used dropped).  A later search of the same shape writes
 * its queries and per-query arrays to the same pinned places and launches
 * the graph; results are copied out of pinned memory once it has run.
 *
 * Why the fixed places are safe: a resources object runs one search at a
 * time (search_pending), and every call leaves the arena empty and reuses
 * the pinned buffer from its start, so the places a graph uses are free
 * whenever it is launched and everything else on the stream is ordered
 * before or after it; an index's version changes whenever its arrays move
 * or its lists change size (versions are never reused, so a dropped index
 * cannot match); a capture that needed device memory outside the arena
 * (freed at the end of the call) is thrown away and the search runs as
 * usual.  Only single-stream searches are recorded: batches the coarse
 * quantizer serves without GEMM (knn.h), no cancel hook set.
 */
#include <algorithm>
#include <cstring>
#include <vector>

#include "index.h"
#include "knn.h"
#include "select.h"

namespace gpuivf_cuda {

namespace {

constexpr size_t kMaxGraphs = 64;

template <typename T>
T *pinned_array(Resources &res, int64_t count) {
    return static_cast<T *>(pinned_alloc(res, sizeof(T) * static_cast<size_t>(count)));
}

/* A pinned array as kernels address it. */
template <typename T>
T *pinned_on_device(const Resources &res, T *p) {
    return reinterpret_cast<T *>(res.pinned_device + (reinterpret_cast<char *>(p) - res.pinned));
}

/* The pinned bytes of one search (64-byte rounded per array): queries,
 * distances, ids, the ADC distances when asked, per-query arrays. */
size_t pinned_need(int64_t nq, int d, int k, bool adc) {
    auto r = [](int64_t b) { return static_cast<size_t>(round_up(b, 64)); };
    return r(4 * nq * d) + r(8 * nq * k) * (adc ? 3 : 2) + r(4 * nq) * 3;
}

/* Record the search (stream capture) into g; false when it may not be kept
 * (then nothing was run and the caller searches as usual).  The graph has
 * one copy in (queries and per-query arrays, packed in pinned memory as on
 * the device) and none out: the re-rank writes the results into pinned
 * memory itself.  Each copy node costs a few microseconds of a search that
 * takes under a hundred. */
bool record(Resources &res, Index &ix, const float *queries, int64_t nq, const SearchParams &p,
            Resources::SearchGraph &g) {
    const int64_t misses = static_cast<int64_t>(res.arena_misses);
    res.pinned_top = 0;
    const size_t q_bytes = static_cast<size_t>(round_up(sizeof(float) * nq * ix.d, 64));
    const size_t a_bytes = static_cast<size_t>(round_up(sizeof(int32_t) * nq, 64));
    const size_t in_bytes = q_bytes + 3 * a_bytes;
    char *in = static_cast<char *>(pinned_alloc(res, in_bytes));
    g.queries = reinterpret_cast<float *>(in);
    g.qk = reinterpret_cast<int32_t *>(in + q_bytes);
    g.kscan = reinterpret_cast<int32_t *>(in + q_bytes + a_bytes);
    g.qnp = p.query_nprobe ? reinterpret_cast<int32_t *>(in + q_bytes + 2 * a_bytes) : nullptr;
    g.distances = pinned_array<double>(res, nq * p.k);
    g.ids = pinned_array<uint64_t>(res, nq * p.k);
    g.adc = g.key.adc ? pinned_array<double>(res, nq * p.k) : nullptr;
    std::memcpy(g.queries, queries, sizeof(float) * nq * ix.d);
    search_query_ks(p, nq, g.qk, g.kscan);
    if (g.qnp) std::memcpy(g.qnp, p.query_nprobe, sizeof(int32_t) * nq);

    cudaGraph_t graph = nullptr;
    GPUIVF_CUDA_TRY(cudaStreamBeginCapture(res.stream, cudaStreamCaptureModeRelaxed));
    try {
        TempBuffer<char> din(res, static_cast<int64_t>(in_bytes));
        GPUIVF_CUDA_TRY(cudaMemcpyAsync(din.data(), in, in_bytes, cudaMemcpyHostToDevice, res.stream));
        SearchParams sp = p;
        sp.staged_qk = reinterpret_cast<const int32_t *>(din.data() + q_bytes);
        sp.staged_kscan = reinterpret_cast<const int32_t *>(din.data() + q_bytes + a_bytes);
        if (g.qnp) sp.staged_qnp = reinterpret_cast<const int32_t *>(din.data() + q_bytes + 2 * a_bytes);
        sp.out_adc = g.adc ? pinned_on_device(res, g.adc) : nullptr;
        index_search(res, ix, reinterpret_cast<const float *>(din.data()), nq, sp, pinned_on_device(res, g.distances),
                     pinned_on_device(res, g.ids));
        /* end the capture while the buffers are still held: a miss's
         * cudaFree must not happen inside it */
        GPUIVF_CUDA_TRY(cudaStreamEndCapture(res.stream, &graph));
    } catch (...) {
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(res.stream, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
            cudaGraph_t partial = nullptr;
            if (cudaStreamEndCapture(res.stream, &partial) == cudaSuccess && partial) cudaGraphDestroy(partial);
        }
        if (graph) cudaGraphDestroy(graph);
        (void)cudaGetLastError();
        throw;
    }
    if (static_cast<int64_t>(res.arena_misses) != misses) {
        cudaGraphDestroy(graph);
        return false;
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    GPUIVF_CUDA_TRY(err);
    g.exec = exec;
    return true;
}

}  // namespace

bool search_recorded(Resources &res, Index &ix, const float *queries, int64_t nq, const SearchParams &p, bool adc,
                     double **pinned_distances, uint64_t **pinned_ids, double **pinned_adc) {
    if (!res.search_graphs_enabled || res.cancel_fn != nullptr || res.arena_top != 0 || nq > kKnnDirectMaxQueries ||
        ix.nlist > kKnnDirectMaxBase || res.pinned_device == nullptr ||
        pinned_need(nq, ix.d, p.k, adc) > res.pinned_size)
        return false;
    std::vector<int32_t> qk(nq), kscan(nq);
    Resources::SearchGraphKey key;
    key.index = &ix;
    key.version = ix.version;
    key.nq = nq;
    key.k = p.k;
    key.nprobe = p.nprobe;
    key.rerank = p.rerank;
    key.lut_mode = p.lut_mode;
    key.min_probes_per_block = p.min_probes_per_block;
    key.kscan_max = search_query_ks(p, nq, qk.data(), kscan.data());
    key.query_k = p.query_k != nullptr;
    key.query_nprobe = p.query_nprobe != nullptr;
    key.adc = adc;

    Resources::SearchGraph *g = nullptr;
    for (auto &e : res.search_graphs)
        if (e.key == key) g = &e;
    if (g) {
        /* replay: this search's inputs into the recorded places */
        std::memcpy(g->queries, queries, sizeof(float) * nq * ix.d);
        std::memcpy(g->qk, qk.data(), sizeof(int32_t) * nq);
        std::memcpy(g->kscan, kscan.data(), sizeof(int32_t) * nq);
        if (g->qnp) std::memcpy(g->qnp, p.query_nprobe, sizeof(int32_t) * nq);
    } else {
        Resources::SearchGraph fresh{};
        fresh.key = key;
        bool kept = false;
        try {
            kept = record(res, ix, queries, nq, p, fresh);
        } catch (const Error &) {
            /* this search cannot be recorded (a capture limit, or an error
             * the plain search reports again): no more recording here */
            res.search_graphs_enabled = false;
        }
        if (!kept) return false;
        if (res.search_graphs.size() >= kMaxGraphs) {
            auto lru = std::min_element(res.search_graphs.begin(), res.search_graphs.end(),
                                        [](const Resources::SearchGraph &a, const Resources::SearchGraph &b) {
                                            return a.last_use < b.last_use;
                                        });
            cudaGraphExecDestroy(lru->exec); /* freed once it has run, if it runs */
            res.search_graphs.erase(lru);
        }
        res.search_graphs.push_back(fresh);
        g = &res.search_graphs.back();
    }
    g->last_use = ++res.search_graph_clock;
    GPUIVF_CUDA_TRY(cudaGraphLaunch(g->exec, res.stream));
    *pinned_distances = g->distances;
    *pinned_ids = g->ids;
    *pinned_adc = g->adc;
    return true;
}

void drop_search_graphs(Resources &res) noexcept {
    for (auto &g : res.search_graphs)
        if (g.exec) cudaGraphExecDestroy(g.exec);
    res.search_graphs.clear();
}

}  // namespace gpuivf_cuda
