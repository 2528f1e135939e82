/*
 * fake_engine.cpp — a CPU stand-in for the GPU engine module (gpuivf_gpu.so),
 * for testing the GPU worker on machines without a GPU.
 *
 * It implements the part of cuda/include/gpuivf_cuda.h that the worker calls,
 * with src/core (the CPU engine the GPU engine is tested against), so the
 * whole worker protocol — queue, batching, loading and catching up with the
 * index pages, eviction, errors, restarts — runs in CI.  The worker loads it
 * when gpuivf.engine_library names it (test/t/102_worker_fake_gpu.pl).
 * Build: `make fake-gpu-engine` (build/gpuivf_fake_gpu.so).
 *
 * Test hooks (environment of the postmaster, inherited by the worker):
 *   GPUIVF_FAKE_DELAY_FILE=path  while path exists, every search first sleeps
 *                                the milliseconds written in it (a busy GPU)
 *   GPUIVF_FAKE_FAIL_FILE=path   when path exists, the next search or exact
 *                                kNN fails with a device error and the file
 *                                is removed
 *   GPUIVF_FAKE_MEMORY_MB=n      "device memory" reported (default 1024)
 *   GPUIVF_FAKE_OOM_FILE=path    while path exists, every device allocation
 *                                fails: index_create, index_add_encoded,
 *                                searches and exact kNN return
 *                                GPUIVF_CUDA_OUT_OF_MEMORY, as a full GPU
 *                                does (test/t/613_worker_gpu_oom.pl)
 *   GPUIVF_FAKE_ADD_DELAY_MS=n   every append of entries to an index copy
 *                                (index_add_encoded: loading, catching up)
 *                                first sleeps n ms (default 0), so that a
 *                                test can act while the worker loads
 *                                (test/t/104_worker_kill_load.pl)
 *   GPUIVF_FAKE_ENCODE_DELAY_MS=n  every encoding request first sleeps n ms
 *                                (default 0): a build's scan then runs while
 *                                its previous batch is being encoded
 *                                (test/t/105_worker_build_overlap.pl)
 *   GPUIVF_FAKE_DEVICES=n        devices reported (default 1), so that
 *                                gpuivf.devices = '0,1' starts two workers
 *                                (test/t/103_worker_shards.pl)
 *   GPUIVF_FAKE_INSTANT=1        searches answer at once, without searching:
 *                                each query gets k rows of the index from a
 *                                list chosen by its bytes (wrong answers on
 *                                purpose).  A measurement, not a test hook:
 *                                test/gpu/worker_end_to_end.sh's "instant" row is the
 *                                worker path with a search that costs nothing
 */
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <tuple>
#include <unistd.h>
#include <unordered_map>
#include <vector>

#include "gpuivf_core.h"
#include "gpuivf_cuda.h"

using gpuivf::Metric;

struct gpuivf_cuda_resources {
    int device = 0;
    gpuivf_cuda_cancel_fn cancel = nullptr;
    void *cancel_arg = nullptr;
    /* index_search_async runs the search at once and keeps its status for
     * search_wait (errors surface where the real engine reports them) */
    bool search_pending = false;
    gpuivf_cuda_status pending_status{};
};

struct FakeList {
    std::vector<uint8_t> codes;
    std::vector<uint64_t> ids;
    std::vector<uint8_t> vectors;  /* vec_bytes per entry: float32 or IEEE halves */
};

struct gpuivf_cuda_index {
    Metric metric = Metric::L2;
    int d = 0, nlist = 0, m = 0, nbits = 8, code_size = 0;
    bool store_vectors = false;
    bool half = false;             /* GPUIVF_CUDA_VECTORS_FLOAT16 */
    size_t vec_bytes = 0;          /* stored bytes of one vector */
    std::vector<float> centroids, norms, codebook;
    std::vector<FakeList> lists;
    std::unordered_map<uint64_t, std::pair<int, size_t>> where;  /* id -> (list, position) */
    int64_t count = 0;
    gpuivf::IvfPqModel model() const {
        gpuivf::IvfPqModel mm;
        mm.metric = metric;
        mm.d = d;
        mm.nlist = nlist;
        mm.m = m;
        mm.nbits = nbits;
        mm.centroids = centroids.data();
        mm.centroid_norms = norms.data();
        mm.codebook = codebook.data();
        return mm;
    }
};

static gpuivf_cuda_status make_status(int code, const char *fmt, ...) {
    gpuivf_cuda_status s;
    s.code = code;
    s.message[0] = '\0';
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(s.message, sizeof(s.message), fmt, ap);
        va_end(ap);
    }
    return s;
}
static gpuivf_cuda_status ok() { return make_status(GPUIVF_CUDA_OK, nullptr); }
static gpuivf_cuda_status from_core(const gpuivf::Status &st) {
    return gpuivf::ok(st) ? ok() : make_status(st.code, "%s", st.message);
}

/* GPUIVF_FAKE_OOM_FILE: is "device memory" exhausted now? */
static bool device_full() {
    const char *oom = getenv("GPUIVF_FAKE_OOM_FILE");
    return oom && access(oom, F_OK) == 0;
}
#define RETURN_IF_DEVICE_FULL(what)                                                                     \
    do {                                                                                                \
        if (device_full())                                                                              \
            return make_status(GPUIVF_CUDA_OUT_OF_MEMORY, "out of device memory allocating %s (fake)", \
                               what);                                                                   \
    } while (0)

static bool cancel_now(gpuivf_cuda_resources *res) { return res->cancel && res->cancel(res->cancel_arg); }
static bool core_cancel(void *arg) { return cancel_now(static_cast<gpuivf_cuda_resources *>(arg)); }

extern "C" {

static int32_t fake_devices() {
    const char *n = getenv("GPUIVF_FAKE_DEVICES");
    int v = n ? atoi(n) : 1;
    return v < 1 ? 1 : (v > 16 ? 16 : v);
}

gpuivf_cuda_status gpuivf_cuda_device_count(int32_t *count) noexcept {
    *count = fake_devices();
    return ok();
}

gpuivf_cuda_status gpuivf_cuda_resources_create(int32_t device, int64_t, gpuivf_cuda_resources **out) noexcept {
    if (device < 0 || device >= fake_devices())
        return make_status(GPUIVF_CUDA_NO_DEVICE, "fake engine has devices 0..%d only", fake_devices() - 1);
    gpuivf::init_blas_single_threaded();
    *out = new (std::nothrow) gpuivf_cuda_resources();
    return *out ? ok() : make_status(GPUIVF_CUDA_OUT_OF_MEMORY, "out of host memory");
}

gpuivf_cuda_status gpuivf_cuda_resources_destroy(gpuivf_cuda_resources *res) noexcept {
    delete res;
    return ok();
}

gpuivf_cuda_status gpuivf_cuda_set_cancel_hook(gpuivf_cuda_resources *res, gpuivf_cuda_cancel_fn fn,
                                               void *arg) noexcept {
    res->cancel = fn;
    res->cancel_arg = arg;
    return ok();
}

gpuivf_cuda_status gpuivf_cuda_get_device_info(gpuivf_cuda_resources *, gpuivf_cuda_device_info *out) noexcept {
    const char *mb = getenv("GPUIVF_FAKE_MEMORY_MB");
    int64_t bytes = (mb ? atoll(mb) : 1024) << 20;
    memset(out, 0, sizeof(*out));
    snprintf(out->name, sizeof(out->name), "fake GPU (CPU engine)");
    out->compute_major = 9;
    out->total_memory = bytes;
    out->free_memory = bytes;
    return ok();
}

/* The GPU engine's defaults are src/core's (cuda/src/api.cu). */
gpuivf_cuda_kmeans_params gpuivf_cuda_kmeans_default_params(void) noexcept {
    const gpuivf::KMeansParams core = gpuivf::kmeans_default_params();
    gpuivf_cuda_kmeans_params p;
    p.niter = core.niter;
    p.seed = core.seed;
    p.max_points_per_centroid = core.max_points_per_centroid;
    return p;
}

gpuivf_cuda_status gpuivf_cuda_ivfpq_train(gpuivf_cuda_resources *res, int32_t metric, const float *x, int64_t n,
                                           int32_t d, int32_t nlist, int32_t m, int32_t nbits,
                                           const gpuivf_cuda_kmeans_params *params, float *centroids,
                                           float *codebook) noexcept {
    try {
        std::vector<float> prep(static_cast<size_t>(n) * d), norms(nlist);
        std::vector<int32_t> labels(n);
        for (int64_t i = 0; i < n; i++)
            gpuivf::prepare_vector(static_cast<Metric>(metric), x + i * d, prep.data() + i * d, d);
        gpuivf::KMeansParams kp = gpuivf::kmeans_default_params();
        kp.seed = params ? params->seed : 1234;
        gpuivf::CancelHook hook{core_cancel, res};
        gpuivf::Status st = gpuivf::kmeans_train(prep.data(), n, d, nlist, kp, centroids, &hook);
        if (!gpuivf::ok(st)) return from_core(st);
        gpuivf::row_norms(centroids, nlist, d, norms.data());
        st = gpuivf::assign_nearest(centroids, norms.data(), nlist, d, prep.data(), n, labels.data(), nullptr, &hook);
        if (!gpuivf::ok(st)) return from_core(st);
        for (int64_t i = 0; i < n; i++)
            for (int j = 0; j < d; j++) prep[i * d + j] -= centroids[static_cast<int64_t>(labels[i]) * d + j];
        return from_core(gpuivf::pq_train(prep.data(), n, d, m, nbits, kp.seed, codebook, &hook));
    } catch (...) {
        return make_status(GPUIVF_CUDA_OUT_OF_MEMORY, "out of host memory");
    }
}

gpuivf_cuda_status gpuivf_cuda_ivfpq_encode(gpuivf_cuda_resources *res, const gpuivf_cuda_model *model,
                                            const float *x, int64_t n, int32_t *lists, uint8_t *codes) noexcept {
    const char *delay = getenv("GPUIVF_FAKE_ENCODE_DELAY_MS");
    if (delay && atoi(delay) > 0) usleep(static_cast<useconds_t>(atoi(delay)) * 1000);
    try {
        int d = model->d;
        std::vector<float> prep(static_cast<size_t>(n) * d), norms(model->nlist);
        for (int64_t i = 0; i < n; i++)
            gpuivf::prepare_vector(static_cast<Metric>(model->metric), x + i * d, prep.data() + i * d, d);
        gpuivf::row_norms(model->centroids, model->nlist, d, norms.data());
        gpuivf::IvfPqModel mm{static_cast<Metric>(model->metric), d, model->nlist, model->m, model->nbits,
                              model->centroids, norms.data(), model->codebook};
        gpuivf::CancelHook hook{core_cancel, res};
        return from_core(gpuivf::ivfpq_encode(mm, prep.data(), n, lists, codes, &hook));
    } catch (...) {
        return make_status(GPUIVF_CUDA_OUT_OF_MEMORY, "out of host memory");
    }
}

gpuivf_cuda_status gpuivf_cuda_index_create(gpuivf_cuda_resources *, const gpuivf_cuda_model *model,
                                            int32_t store_vectors, gpuivf_cuda_index **out) noexcept {
    RETURN_IF_DEVICE_FULL("an index");
    try {
        auto *ix = new gpuivf_cuda_index();
        ix->metric = static_cast<Metric>(model->metric);
        ix->d = model->d;
        ix->nlist = model->nlist;
        ix->m = model->m;
        ix->nbits = model->nbits;
        ix->code_size = gpuivf::pq_code_size(model->m, model->nbits);
        if (store_vectors < GPUIVF_CUDA_VECTORS_NONE || store_vectors > GPUIVF_CUDA_VECTORS_FLOAT16) {
            delete ix;
            return make_status(GPUIVF_CUDA_INVALID_ARGUMENT, "store_vectors %d is not a GPUIVF_CUDA_VECTORS_* value",
                               store_vectors);
        }
        ix->store_vectors = store_vectors != GPUIVF_CUDA_VECTORS_NONE;
        ix->half = store_vectors == GPUIVF_CUDA_VECTORS_FLOAT16;
        ix->vec_bytes = ix->store_vectors ? static_cast<size_t>(model->d) * (ix->half ? 2 : 4) : 0;
        ix->centroids.assign(model->centroids, model->centroids + static_cast<size_t>(model->nlist) * model->d);
        ix->norms.resize(model->nlist);
        gpuivf::row_norms(ix->centroids.data(), model->nlist, model->d, ix->norms.data());
        size_t cb = static_cast<size_t>(model->m) * (1u << model->nbits) * (model->d / model->m);
        ix->codebook.assign(model->codebook, model->codebook + cb);
        ix->lists.resize(model->nlist);
        *out = ix;
        return ok();
    } catch (...) {
        return make_status(GPUIVF_CUDA_OUT_OF_MEMORY, "out of host memory");
    }
}

gpuivf_cuda_status gpuivf_cuda_index_destroy(gpuivf_cuda_index *index) noexcept {
    delete index;
    return ok();
}

gpuivf_cuda_status gpuivf_cuda_index_add_encoded(gpuivf_cuda_resources *, gpuivf_cuda_index *ix, int64_t n,
                                                 const int32_t *lists, const uint8_t *codes, const uint64_t *ids,
                                                 const void *vectors) noexcept {
    const char *add_delay = getenv("GPUIVF_FAKE_ADD_DELAY_MS");
    int add_delay_ms = add_delay ? atoi(add_delay) : 0;
    if (add_delay_ms > 0) usleep(static_cast<useconds_t>(add_delay_ms) * 1000);
    RETURN_IF_DEVICE_FULL("list entries");
    try {
        for (int64_t i = 0; i < n; i++) {
            if (lists[i] < 0 || lists[i] >= ix->nlist)
                return make_status(GPUIVF_CUDA_INVALID_ARGUMENT, "list %d out of range", lists[i]);
            FakeList &l = ix->lists[lists[i]];
            l.codes.insert(l.codes.end(), codes + i * ix->code_size, codes + (i + 1) * ix->code_size);
            ix->where[ids[i]] = {lists[i], l.ids.size()};
            l.ids.push_back(ids[i]);
            if (ix->store_vectors) {
                const uint8_t *v = static_cast<const uint8_t *>(vectors) + i * ix->vec_bytes;
                l.vectors.insert(l.vectors.end(), v, v + ix->vec_bytes);
            }
        }
        ix->count += n;
        return ok();
    } catch (...) {
        return make_status(GPUIVF_CUDA_OUT_OF_MEMORY, "out of host memory");
    }
}

gpuivf_cuda_status gpuivf_cuda_index_add(gpuivf_cuda_resources *, gpuivf_cuda_index *, int64_t, const float *,
                                         const uint64_t *) noexcept {
    return make_status(GPUIVF_CUDA_INVALID_ARGUMENT, "fake engine: index_add is not implemented");
}

gpuivf_cuda_status gpuivf_cuda_index_remove(gpuivf_cuda_resources *, gpuivf_cuda_index *ix, int64_t n,
                                            const uint64_t *ids, int64_t *removed) noexcept {
    try {
        std::vector<uint64_t> drop(ids, ids + n);
        std::sort(drop.begin(), drop.end());
        int64_t count = 0;
        for (FakeList &l : ix->lists) {
            size_t w = 0;
            for (size_t r = 0; r < l.ids.size(); r++) {
                if (std::binary_search(drop.begin(), drop.end(), l.ids[r])) {
                    count++;
                    continue;
                }
                if (w != r) {
                    l.ids[w] = l.ids[r];
                    memmove(&l.codes[w * ix->code_size], &l.codes[r * ix->code_size], ix->code_size);
                    if (ix->store_vectors)
                        memmove(&l.vectors[w * ix->vec_bytes], &l.vectors[r * ix->vec_bytes], ix->vec_bytes);
                }
                w++;
            }
            l.ids.resize(w);
            l.codes.resize(w * ix->code_size);
            if (ix->store_vectors) l.vectors.resize(w * ix->vec_bytes);
        }
        ix->count -= count;
        ix->where.clear();
        for (int li = 0; li < ix->nlist; li++)
            for (size_t i = 0; i < ix->lists[li].ids.size(); i++) ix->where[ix->lists[li].ids[i]] = {li, i};
        if (removed) *removed = count;
        return ok();
    } catch (...) {
        return make_status(GPUIVF_CUDA_OUT_OF_MEMORY, "out of host memory");
    }
}

gpuivf_cuda_status gpuivf_cuda_index_get_stats(gpuivf_cuda_index *ix, gpuivf_cuda_index_stats *out) noexcept {
    memset(out, 0, sizeof(*out));
    out->vectors = ix->count;
    out->nlist = ix->nlist;
    out->code_size = ix->code_size;
    int64_t per = ix->code_size + 8 + static_cast<int64_t>(ix->vec_bytes);
    out->device_bytes = ix->count * per + static_cast<int64_t>(ix->centroids.size() + ix->codebook.size()) * 4;
    return ok();
}

/* The test hooks: a failure armed by GPUIVF_FAKE_FAIL_FILE (true: fail now),
 * then the delay of GPUIVF_FAKE_DELAY_FILE. */
static bool fail_or_delay() {
    const char *fail = getenv("GPUIVF_FAKE_FAIL_FILE");
    const char *delay_file = getenv("GPUIVF_FAKE_DELAY_FILE");
    if (fail && access(fail, F_OK) == 0) {
        unlink(fail);
        return true;
    }
    if (delay_file) {
        FILE *f = fopen(delay_file, "r");
        int ms = 0;
        if (f) {
            if (fscanf(f, "%d", &ms) != 1) ms = 0;
            fclose(f);
        }
        if (ms > 0) usleep(static_cast<useconds_t>(ms) * 1000);
    }
    return false;
}

/* Exact kNN: src/core's exact_knn is the GPU engine's reference (the engine
 * re-scores its GEMM shortlist with the same functions). */
gpuivf_cuda_status gpuivf_cuda_exact_knn(gpuivf_cuda_resources *res, int32_t metric, const float *base, int64_t n,
                                         const float *queries, int64_t nq, int32_t d, int32_t k, int32_t,
                                         float *out_scores, uint64_t *out_ids) noexcept {
    RETURN_IF_DEVICE_FULL("exact kNN buffers");
    if (fail_or_delay())
        return make_status(GPUIVF_CUDA_DEVICE_ERROR, "an illegal memory access was encountered (fake)");
    if (k < 1 || k > GPUIVF_CUDA_MAX_K || d < 1 || d > GPUIVF_CUDA_MAX_DIMS || n < 0 || nq < 0)
        return make_status(GPUIVF_CUDA_INVALID_ARGUMENT, "exact_knn: k %d, d %d out of range", k, d);
    if (nq == 0) return ok();
    gpuivf::CancelHook hook{core_cancel, res};
    return from_core(gpuivf::exact_knn(static_cast<Metric>(metric), base, n, queries, nq, d, k, out_scores,
                                       out_ids, &hook));
}

/* GPUIVF_FAKE_INSTANT: k rows of the index for each query, from the list
 * its bytes hash to onwards, without any search. */
static void instant_answers(const gpuivf_cuda_index *ix, const float *queries, int64_t nq,
                            const gpuivf_cuda_search_params *p, double *out_distances, uint64_t *out_ids) {
    for (int64_t q = 0; q < nq; q++) {
        uint32_t h = 2166136261u;
        const unsigned char *b = reinterpret_cast<const unsigned char *>(queries + q * ix->d);
        for (size_t i = 0; i < sizeof(float) * static_cast<size_t>(ix->d); i++) h = (h ^ b[i]) * 16777619u;
        int k = p->query_k ? p->query_k[q] : p->k;
        int j = 0;
        for (int l = 0; l < ix->nlist && j < k; l++) {
            const FakeList &list = ix->lists[(h + static_cast<uint32_t>(l)) % static_cast<uint32_t>(ix->nlist)];
            for (size_t i = 0; i < list.ids.size() && j < k; i++, j++) {
                out_distances[q * p->k + j] = j;
                out_ids[q * p->k + j] = list.ids[i];
            }
        }
        for (; j < p->k; j++) {
            out_distances[q * p->k + j] = __builtin_inf();
            out_ids[q * p->k + j] = UINT64_MAX;
        }
        /* no ADC order here: the "ADC distances" are the distances */
        if (p->out_adc_distances)
            memcpy(p->out_adc_distances + q * p->k, out_distances + q * p->k, sizeof(double) * p->k);
    }
}

gpuivf_cuda_status gpuivf_cuda_index_search(gpuivf_cuda_resources *, gpuivf_cuda_index *ix, const float *queries,
                                            int64_t nq, const gpuivf_cuda_search_params *p, double *out_distances,
                                            uint64_t *out_ids) noexcept {
    static const bool instant = getenv("GPUIVF_FAKE_INSTANT") != nullptr;
    RETURN_IF_DEVICE_FULL("search buffers");
    if (fail_or_delay())
        return make_status(GPUIVF_CUDA_DEVICE_ERROR, "an illegal memory access was encountered (fake)");
    if (p->k < 1 || p->k > GPUIVF_CUDA_MAX_K || p->rerank_candidates > GPUIVF_CUDA_MAX_K)
        return make_status(GPUIVF_CUDA_INVALID_ARGUMENT, "k %d or candidates %d out of range", p->k,
                           p->rerank_candidates);
    if (instant) {
        instant_answers(ix, queries, nq, p, out_distances, out_ids);
        return ok();
    }
    try {
        gpuivf::IvfPqModel mm = ix->model();
        int d = ix->d;
        std::vector<float> qp(d), vec(d), lut(gpuivf::ivfpq_lut_size(mm));
        const auto &where = ix->where;
        for (int64_t q = 0; q < nq; q++) {
            int k = p->query_k ? p->query_k[q] : p->k;
            int np = std::min(p->query_nprobe ? p->query_nprobe[q] : p->nprobe, ix->nlist);
            int r = p->rerank_candidates > 0 ? std::max(p->rerank_candidates, k) : k;
            const float *raw = queries + q * d;
            gpuivf::prepare_vector(ix->metric, raw, qp.data(), d);
            std::vector<int32_t> probe(np);
            std::vector<float> pscore(np), vals(r);
            std::vector<uint64_t> ids(r);
            gpuivf::ivfpq_probe_lists(mm, qp.data(), np, probe.data(), pscore.data());
            gpuivf::TopK topk;
            gpuivf::topk_init(&topk, vals.data(), ids.data(), r);
            for (int j = 0; j < np; j++) {
                if (probe[j] < 0) continue;
                const FakeList &l = ix->lists[probe[j]];
                float bias;
                gpuivf::ivfpq_build_lut(mm, qp.data(), probe[j], lut.data(), &bias);
                gpuivf::ivfpq_adc_scan(mm, lut.data(), bias, l.codes.data(), l.ids.data(),
                                       static_cast<int64_t>(l.ids.size()), &topk);
            }
            gpuivf::topk_sort(&topk);
            /* (distance, id, ADC distance): each result carries the ADC
             * distance it was selected by (out_adc_distances) */
            std::vector<std::tuple<double, uint64_t, double>> res;
            for (int j = 0; j < topk.size; j++) {
                const double adc = gpuivf::ivfpq_score_to_distance(ix->metric, topk.vals[j]);
                if (p->rerank_candidates > 0) {
                    auto it = where.find(topk.ids[j]);
                    const FakeList &l = ix->lists[it->second.first];
                    /* the stored values, halves widened exactly (as the GPU does) */
                    const uint8_t *v = &l.vectors[it->second.second * ix->vec_bytes];
                    if (ix->half)
                        gpuivf::half_to_float_n(reinterpret_cast<const uint16_t *>(v), vec.data(), d);
                    else
                        memcpy(vec.data(), v, sizeof(float) * d);
                    res.emplace_back(gpuivf::metric_distance(ix->metric, raw, vec.data(), d), topk.ids[j], adc);
                } else {
                    res.emplace_back(adc, topk.ids[j], adc);
                }
            }
            std::sort(res.begin(), res.end());
            for (int j = 0; j < p->k; j++) {
                bool have = j < k && j < static_cast<int>(res.size());
                out_distances[q * p->k + j] = have ? std::get<0>(res[j]) : __builtin_inf();
                out_ids[q * p->k + j] = have ? std::get<1>(res[j]) : UINT64_MAX;
                if (p->out_adc_distances)
                    p->out_adc_distances[q * p->k + j] = have ? std::get<2>(res[j]) : __builtin_inf();
            }
        }
        return ok();
    } catch (...) {
        return make_status(GPUIVF_CUDA_OUT_OF_MEMORY, "out of host memory");
    }
}

/* Asynchronous searches: the search runs here and now; its status waits
 * for search_wait.  One at a time per resources object, as on the GPU. */
gpuivf_cuda_status gpuivf_cuda_index_search_async(gpuivf_cuda_resources *res, gpuivf_cuda_index *ix,
                                                  const float *queries, int64_t nq,
                                                  const gpuivf_cuda_search_params *p, double *out_distances,
                                                  uint64_t *out_ids) noexcept {
    if (res->search_pending)
        return make_status(GPUIVF_CUDA_INVALID_ARGUMENT, "the search started on these resources was not waited for");
    gpuivf_cuda_status st = gpuivf_cuda_index_search(res, ix, queries, nq, p, out_distances, out_ids);
    if (st.code == GPUIVF_CUDA_INVALID_ARGUMENT) return st; /* refused before starting, as on the GPU */
    res->search_pending = true;
    res->pending_status = st;
    return ok();
}

gpuivf_cuda_status gpuivf_cuda_search_done(gpuivf_cuda_resources *, int32_t *done) noexcept {
    *done = 1;
    return ok();
}

gpuivf_cuda_status gpuivf_cuda_search_wait(gpuivf_cuda_resources *res) noexcept {
    if (!res->search_pending) return ok();
    res->search_pending = false;
    return res->pending_status;
}

}  // extern "C"
