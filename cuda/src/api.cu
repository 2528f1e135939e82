/*
 * api.cu — the C interface: argument checks, host/device staging, and the
 * one place where every exception becomes a status (cuVS style).  Nothing
 * thrown inside the engine gets past these functions.
 */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "gpuivf_cuda.h"
#include "index.h"
#include "knn.h"
#include "resources.h"
#include "select.h"
#include "train.h"
#include "vectors.h"

using namespace gpuivf_cuda;

namespace {

/* A host array of vector or model values against a bound (the header's
 * GPUIVF_CUDA_MAX_COMPONENT contract); device arrays are the caller's to
 * check.  NaN fails the comparison too. */
void require_host_within(const float *p, int64_t count, float bound, int32_t code, const char *what) {
    if (p == nullptr || count <= 0 || is_device_pointer(p)) return;
    for (int64_t i = 0; i < count; i++)
        if (!(std::fabs(p[i]) <= bound))
            throw Error(code, "%s value %lld is not finite or exceeds %g in magnitude", what,
                        static_cast<long long>(i), static_cast<double>(bound));
}

gpuivf_cuda_status ok_status() {
    gpuivf_cuda_status s;
    s.code = GPUIVF_CUDA_OK;
    s.message[0] = '\0';
    return s;
}

gpuivf_cuda_status to_status(const Error &e) {
    static_assert(sizeof(gpuivf_cuda_status::message) >= sizeof(Error::Message), "status messages are shorter");
    gpuivf_cuda_status s;
    s.code = e.code();
    std::snprintf(s.message, sizeof(s.message), "%s", e.what());
    return s;
}

#define API_BEGIN try {
#define API_END                                                                                           \
    }                                                                                                     \
    catch (const Error &e) {                                                                              \
        return to_status(e);                                                                              \
    }                                                                                                     \
    catch (const std::bad_alloc &) {                                                                      \
        return to_status(Error(GPUIVF_CUDA_OUT_OF_MEMORY, "out of host memory"));                         \
    }                                                                                                     \
    catch (const std::exception &e) {                                                                     \
        return to_status(Error(GPUIVF_CUDA_INTERNAL, "unexpected internal error: %s", e.what()));         \
    }                                                                                                     \
    catch (...) {                                                                                         \
        return to_status(Error(GPUIVF_CUDA_INTERNAL, "unexpected internal error"));                       \
    }                                                                                                     \
    return ok_status();

Metric check_metric(int32_t metric) {
    GPUIVF_REQUIRE(metric >= 1 && metric <= 3, "unknown metric %d", metric);
    return static_cast<Metric>(metric);
}

Resources &check_res(gpuivf_cuda_resources *res) {
    GPUIVF_REQUIRE(res != nullptr, "resources must not be null");
    use_device(*res);
    return *res;
}

KMeansParams to_params(const gpuivf_cuda_kmeans_params *p) {
    KMeansParams k;
    if (p) {
        k.niter = p->niter;
        k.seed = p->seed;
        k.max_points_per_centroid = p->max_points_per_centroid;
    }
    return k;
}

void check_model(const gpuivf_cuda_model *model) {
    GPUIVF_REQUIRE(model != nullptr, "model must not be null");
    check_metric(model->metric);
    GPUIVF_REQUIRE(model->d >= 1 && model->d <= kMaxDims, "dimension %d is out of range 1..%d", model->d, kMaxDims);
    GPUIVF_REQUIRE(model->nlist >= 1 && model->nlist <= GPUIVF_CUDA_MAX_LISTS, "lists %d is out of range 1..%d",
                   model->nlist, GPUIVF_CUDA_MAX_LISTS);
    GPUIVF_REQUIRE(model->m >= 1 && model->m <= 1024 && model->d % model->m == 0 &&
                       (model->nbits == 4 || model->nbits == 8),
                   "invalid product quantizer shape: %d dimensions, %d sub-quantizers, %d bits", model->d, model->m,
                   model->nbits);
    GPUIVF_REQUIRE(model->centroids != nullptr && model->codebook != nullptr, "model arrays must not be null");
}

/* Release and free a resources object (null: nothing); never throws. */
void destroy_resources(Resources *res) noexcept {
    if (res == nullptr) return;
    resources_release(*res);
    delete res;
}

int64_t codebook_floats(int d, int m, int nbits) { return static_cast<int64_t>(m) * (1 << nbits) * (d / m); }

}  // namespace

extern "C" {

gpuivf_cuda_status gpuivf_cuda_device_count(int32_t *count) noexcept {
    API_BEGIN
    GPUIVF_REQUIRE(count != nullptr, "count must not be null");
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        n = 0;
    }
    *count = n;
    API_END
}

gpuivf_cuda_status gpuivf_cuda_resources_create(int32_t device, int64_t temp_bytes,
                                                gpuivf_cuda_resources **out) noexcept {
    API_BEGIN
    GPUIVF_REQUIRE(out != nullptr, "out must not be null");
    GPUIVF_REQUIRE(temp_bytes >= 0, "temporary memory size must not be negative");
    *out = nullptr;
    std::unique_ptr<Resources, void (*)(Resources *)> res(new Resources(), destroy_resources);
    resources_init(*res, device, temp_bytes);
    *out = res.release();
    API_END
}

gpuivf_cuda_status gpuivf_cuda_resources_destroy(gpuivf_cuda_resources *res) noexcept {
    destroy_resources(res);
    return ok_status();
}

gpuivf_cuda_status gpuivf_cuda_set_cancel_hook(gpuivf_cuda_resources *res, gpuivf_cuda_cancel_fn fn,
                                               void *arg) noexcept {
    API_BEGIN
    GPUIVF_REQUIRE(res != nullptr, "resources must not be null");
    res->cancel_fn = fn;
    res->cancel_arg = arg;
    API_END
}

gpuivf_cuda_status gpuivf_cuda_set_search_graphs(gpuivf_cuda_resources *res, int32_t enabled) noexcept {
    API_BEGIN
    Resources &r = check_res(res);
    GPUIVF_REQUIRE(!r.search_pending, "the search started on these resources was not waited for");
    r.search_graphs_enabled = enabled != 0;
    if (!enabled) drop_search_graphs(r);
    API_END
}

gpuivf_cuda_status gpuivf_cuda_get_device_info(gpuivf_cuda_resources *res, gpuivf_cuda_device_info *out) noexcept {
    API_BEGIN
    Resources &r = check_res(res);
    GPUIVF_REQUIRE(out != nullptr, "out must not be null");
    std::memset(out, 0, sizeof(*out));
    std::snprintf(out->name, sizeof(out->name), "%s", r.name);
    out->compute_major = r.cc_major;
    out->compute_minor = r.cc_minor;
    out->multiprocessors = r.sm_count;
    size_t free_b = 0, total_b = 0;
    GPUIVF_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    out->free_memory = static_cast<int64_t>(free_b);
    out->total_memory = static_cast<int64_t>(total_b);
    out->temp_bytes = static_cast<int64_t>(r.arena_size);
    API_END
}

gpuivf_cuda_status gpuivf_cuda_malloc(gpuivf_cuda_resources *res, int64_t bytes, void **ptr) noexcept {
    API_BEGIN
    check_res(res);
    GPUIVF_REQUIRE(ptr != nullptr && bytes >= 0, "invalid arguments to gpuivf_cuda_malloc");
    *ptr = nullptr;
    *ptr = device_malloc(static_cast<size_t>(bytes));
    API_END
}

gpuivf_cuda_status gpuivf_cuda_free(gpuivf_cuda_resources *res, void *ptr) noexcept {
    API_BEGIN
    check_res(res);
    if (ptr) GPUIVF_CUDA_TRY(cudaFree(ptr));
    API_END
}

gpuivf_cuda_status gpuivf_cuda_memcpy(gpuivf_cuda_resources *res, void *dst, const void *src,
                                      int64_t bytes) noexcept {
    API_BEGIN
    Resources &r = check_res(res);
    GPUIVF_REQUIRE(bytes >= 0 && (bytes == 0 || (dst && src)), "invalid arguments to gpuivf_cuda_memcpy");
    if (bytes > 0) {
        GPUIVF_CUDA_TRY(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault, r.stream));
        sync(r);
    }
    API_END
}

gpuivf_cuda_status gpuivf_cuda_select_k(gpuivf_cuda_resources *res, const float *values, int64_t rows, int64_t cols,
                                        int64_t ld, const uint64_t *ids, int32_t k, int32_t select_largest,
                                        float *out_values, uint64_t *out_ids) noexcept {
    API_BEGIN
    Resources &r = check_res(res);
    GPUIVF_REQUIRE(k >= 1 && k <= kMaxK, "k %d is out of range 1..%d", k, kMaxK);
    GPUIVF_REQUIRE(rows >= 0 && cols >= 0 && ld >= cols, "invalid matrix shape %lld x %lld (stride %lld)",
                   static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(ld));
    GPUIVF_REQUIRE(cols < static_cast<int64_t>(kNoIndex), "too many columns: %lld", static_cast<long long>(cols));
    if (rows == 0) return ok_status();
    GPUIVF_REQUIRE(out_values != nullptr && out_ids != nullptr && (cols == 0 || values != nullptr),
                   "select_k arrays must not be null");
    const int64_t in_count = cols == 0 ? 0 : (rows - 1) * ld + cols;
    Input<float> in(r, values, in_count);
    Input<uint64_t> in_ids(r, ids, ids ? in_count : 0);
    Output<float> ov(r, out_values, rows * k);
    Output<uint64_t> oi(r, out_ids, rows * k);
    TempBuffer<Key> keys(r, rows * k);
    const float inf = __builtin_huge_valf();
    select_rows_to_keys(r, in.get(), rows, cols, ld, k, select_largest ? 1 : 0, keys.data(), k);
    keys_to_results(r, keys.data(), k, rows, k, select_largest ? 1 : 0, in_ids.get(), ld,
                    select_largest ? -inf : inf, ov.get(), oi.get());
    ov.finish();
    oi.finish();
    sync(r);
    API_END
}

gpuivf_cuda_status gpuivf_cuda_exact_knn(gpuivf_cuda_resources *res, int32_t metric, const float *base, int64_t n,
                                         const float *queries, int64_t nq, int32_t d, int32_t k, int32_t flags,
                                         float *out_scores, uint64_t *out_ids) noexcept {
    API_BEGIN
    Resources &r = check_res(res);
    const Metric m = check_metric(metric);
    GPUIVF_REQUIRE(d >= 1 && d <= kMaxDims, "dimension %d is out of range 1..%d", d, kMaxDims);
    GPUIVF_REQUIRE(k >= 1 && k <= kMaxK, "k %d is out of range 1..%d", k, kMaxK);
    GPUIVF_REQUIRE(n >= 0 && nq >= 0, "invalid arguments to exact_knn");
    if (nq == 0) return ok_status();
    GPUIVF_REQUIRE(queries && out_scores && out_ids && (n == 0 || base), "exact_knn arrays must not be null");
    Input<float> b(r, base, n * d);
    Input<float> q(r, queries, nq * d);
    Output<float> os(r, out_scores, nq * k);
    Output<uint64_t> oi(r, out_ids, nq * k);
    KnnOptions o;
    o.exact_rescore = (flags & GPUIVF_CUDA_KNN_GEMM_SCORES) == 0;
    exact_knn(r, m, b.get(), n, q.get(), nq, d, k, o, os.get(), oi.get());
    os.finish();
    oi.finish();
    sync(r);
    API_END
}

/* src/core's kmeans_default_params (the engine links no src/core code) */
gpuivf_cuda_kmeans_params gpuivf_cuda_kmeans_default_params(void) noexcept {
    gpuivf_cuda_kmeans_params p;
    p.niter = 20;
    p.seed = 1234;
    p.max_points_per_centroid = 256;
    return p;
}

gpuivf_cuda_status gpuivf_cuda_kmeans(gpuivf_cuda_resources *res, const float *x, int64_t n, int32_t d, int32_t k,
                                      const gpuivf_cuda_kmeans_params *params, float *centroids) noexcept {
    API_BEGIN
    Resources &r = check_res(res);
    GPUIVF_REQUIRE(x != nullptr && centroids != nullptr, "k-means needs input and output arrays");
    GPUIVF_REQUIRE(d >= 1 && d <= kMaxDims, "k-means dimension %d is out of range 1..%d", d, kMaxDims);
    GPUIVF_REQUIRE(k >= 1 && k <= GPUIVF_CUDA_MAX_LISTS, "k-means cluster count %d is out of range", k);
    GPUIVF_REQUIRE(n >= 1, "k-means needs at least one training vector");
    require_host_within(x, n * d, GPUIVF_CUDA_MAX_COMPONENT, GPUIVF_CUDA_INVALID_ARGUMENT, "k-means input");
    Input<float> in(r, x, n * d);
    Output<float> out(r, centroids, static_cast<int64_t>(k) * d);
    kmeans(r, in.get(), n, d, k, to_params(params), out.get());
    out.finish();
    sync(r);
    require_host_within(centroids, static_cast<int64_t>(k) * d, GPUIVF_CUDA_MAX_MODEL_COMPONENT,
                        GPUIVF_CUDA_INTERNAL, "k-means centroid");
    API_END
}

gpuivf_cuda_status gpuivf_cuda_pq_train(gpuivf_cuda_resources *res, const float *residuals, int64_t n, int32_t d,
                                        int32_t m, int32_t nbits, const gpuivf_cuda_kmeans_params *params,
                                        float *codebook) noexcept {
    API_BEGIN
    Resources &r = check_res(res);
    GPUIVF_REQUIRE(residuals != nullptr && codebook != nullptr, "product quantizer training needs arrays");
    GPUIVF_REQUIRE(d >= 1 && d <= kMaxDims && m >= 1 && m <= 1024 && d % m == 0 && (nbits == 4 || nbits == 8),
                   "invalid product quantizer shape: %d dimensions, %d sub-quantizers, %d bits", d, m, nbits);
    GPUIVF_REQUIRE(n >= 1, "product quantizer training needs at least one vector");
    /* residuals of vectors and centroids within the bound lie within twice it */
    require_host_within(residuals, n * d, 2 * GPUIVF_CUDA_MAX_COMPONENT, GPUIVF_CUDA_INVALID_ARGUMENT,
                        "product quantizer input");
    Input<float> in(r, residuals, n * d);
    Output<float> out(r, codebook, codebook_floats(d, m, nbits));
    pq_train(r, in.get(), n, d, m, nbits, to_params(params), out.get());
    out.finish();
    sync(r);
    require_host_within(codebook, codebook_floats(d, m, nbits), GPUIVF_CUDA_MAX_MODEL_COMPONENT,
                        GPUIVF_CUDA_INTERNAL, "product quantizer codebook");
    API_END
}

gpuivf_cuda_status gpuivf_cuda_ivfpq_train(gpuivf_cuda_resources *res, int32_t metric, const float *x, int64_t n,
                                           int32_t d, int32_t nlist, int32_t m, int32_t nbits,
                                           const gpuivf_cuda_kmeans_params *params, float *centroids,
                                           float *codebook) noexcept {
    API_BEGIN
    Resources &r = check_res(res);
    const Metric mt = check_metric(metric);
    GPUIVF_REQUIRE(x != nullptr && centroids != nullptr && codebook != nullptr, "training needs arrays");
    GPUIVF_REQUIRE(d >= 1 && d <= kMaxDims && m >= 1 && m <= 1024 && d % m == 0 && (nbits == 4 || nbits == 8),
                   "invalid product quantizer shape: %d dimensions, %d sub-quantizers, %d bits", d, m, nbits);
    GPUIVF_REQUIRE(nlist >= 1 && nlist <= GPUIVF_CUDA_MAX_LISTS, "lists %d is out of range 1..%d", nlist,
                   GPUIVF_CUDA_MAX_LISTS);
    GPUIVF_REQUIRE(n >= 1, "training needs at least one vector");
    require_host_within(x, n * d, GPUIVF_CUDA_MAX_COMPONENT, GPUIVF_CUDA_INVALID_ARGUMENT, "training input");
    Input<float> in(r, x, n * d);
    Output<float> oc(r, centroids, static_cast<int64_t>(nlist) * d);
    Output<float> ob(r, codebook, codebook_floats(d, m, nbits));
    ivfpq_train(r, mt, in.get(), n, d, nlist, m, nbits, to_params(params), oc.get(), ob.get());
    oc.finish();
    ob.finish();
    sync(r);
    require_host_within(centroids, static_cast<int64_t>(nlist) * d, GPUIVF_CUDA_MAX_MODEL_COMPONENT,
                        GPUIVF_CUDA_INTERNAL, "trained centroid");
    require_host_within(codebook, codebook_floats(d, m, nbits), GPUIVF_CUDA_MAX_MODEL_COMPONENT,
                        GPUIVF_CUDA_INTERNAL, "trained codebook");
    API_END
}

gpuivf_cuda_status gpuivf_cuda_ivfpq_encode(gpuivf_cuda_resources *res, const gpuivf_cuda_model *model,
                                            const float *x, int64_t n, int32_t *lists, uint8_t *codes) noexcept {
    API_BEGIN
    Resources &r = check_res(res);
    check_model(model);
    GPUIVF_REQUIRE(n >= 0, "invalid arguments to ivfpq_encode");
    if (n == 0) return ok_status();
    GPUIVF_REQUIRE(x && lists && codes, "ivfpq_encode arrays must not be null");
    const int d = model->d;
    const int code_size = pq_code_size(model->m, model->nbits);
    Input<float> cent(r, model->centroids, static_cast<int64_t>(model->nlist) * d);
    Input<float> cb(r, model->codebook, codebook_floats(d, model->m, model->nbits));
    ModelView mv{static_cast<Metric>(model->metric), d, model->nlist, model->m, model->nbits, cent.get(), cb.get()};
    /* Host inputs are staged in batches so memory stays bounded. */
    const int64_t batch = std::min<int64_t>(n, int64_t(1) << 18);
    for (int64_t r0 = 0; r0 < n; r0 += batch) {
        const int64_t rows = std::min(batch, n - r0);
        Input<float> in(r, x + r0 * d, rows * d);
        Output<int32_t> ol(r, lists + r0, rows);
        Output<uint8_t> oc(r, codes + r0 * code_size, rows * code_size);
        ivfpq_encode(r, mv, in.get(), rows, ol.get(), oc.get());
        ol.finish();
        oc.finish();
        sync(r);
    }
    API_END
}

gpuivf_cuda_status gpuivf_cuda_index_create(gpuivf_cuda_resources *res, const gpuivf_cuda_model *model,
                                            int32_t store_vectors, gpuivf_cuda_index **out) noexcept {
    API_BEGIN
    Resources &r = check_res(res);
    check_model(model);
    GPUIVF_REQUIRE(out != nullptr, "out must not be null");
    GPUIVF_REQUIRE(store_vectors >= GPUIVF_CUDA_VECTORS_NONE && store_vectors <= GPUIVF_CUDA_VECTORS_FLOAT16,
                   "store_vectors %d is not a GPUIVF_CUDA_VECTORS_* value", store_vectors);
    *out = nullptr;
    std::unique_ptr<Index> ix(new Index());
    Input<float> cent(r, model->centroids, static_cast<int64_t>(model->nlist) * model->d);
    Input<float> cb(r, model->codebook, codebook_floats(model->d, model->m, model->nbits));
    index_init(r, *ix, static_cast<Metric>(model->metric), model->d, model->nlist, model->m, model->nbits, cent.get(),
               cb.get(), store_vectors);
    *out = ix.release();
    API_END
}

gpuivf_cuda_status gpuivf_cuda_index_destroy(gpuivf_cuda_index *index) noexcept {
    API_BEGIN
    if (index == nullptr) return ok_status();
    if (index->res) cudaSetDevice(index->res->device);
    delete index;
    API_END
}

gpuivf_cuda_status gpuivf_cuda_index_add_encoded(gpuivf_cuda_resources *res, gpuivf_cuda_index *index, int64_t n,
                                                 const int32_t *lists, const uint8_t *codes, const uint64_t *ids,
                                                 const void *vectors) noexcept {
    API_BEGIN
    Resources &r = check_res(res);
    GPUIVF_REQUIRE(index != nullptr, "index must not be null");
    GPUIVF_REQUIRE(n >= 0, "invalid entry count");
    if (n == 0) return ok_status();
    GPUIVF_REQUIRE(lists && codes && ids, "index entries need lists, codes and ids");
    GPUIVF_REQUIRE(!index->store_vectors || vectors, "this index stores vectors: they must be given");
    const int vw = index->vector_words;  /* the stored vector's 16-bit words, as given */
    const int cs = index->code_size;
    const int64_t batch = std::min<int64_t>(n, int64_t(1) << 18);
    std::vector<int32_t> hl(static_cast<size_t>(batch));
    for (int64_t r0 = 0; r0 < n; r0 += batch) {
        const int64_t rows = std::min(batch, n - r0);
        copy_to_host_sync(r, hl.data(), lists + r0, rows);
        Input<int32_t> dl(r, lists + r0, rows);
        Input<uint8_t> dc(r, codes + r0 * cs, rows * cs);
        Input<uint64_t> di(r, ids + r0, rows);
        Input<uint16_t> dv(r, index->store_vectors ? static_cast<const uint16_t *>(vectors) + r0 * vw : nullptr,
                           index->store_vectors ? rows * vw : 0);
        index_add_encoded(r, *index, rows, hl.data(), dl.get(), dc.get(), di.get(), dv.get());
    }
    API_END
}

gpuivf_cuda_status gpuivf_cuda_index_add(gpuivf_cuda_resources *res, gpuivf_cuda_index *index, int64_t n,
                                         const float *vectors, const uint64_t *ids) noexcept {
    API_BEGIN
    Resources &r = check_res(res);
    GPUIVF_REQUIRE(index != nullptr, "index must not be null");
    GPUIVF_REQUIRE(n >= 0, "invalid entry count");
    if (n == 0) return ok_status();
    GPUIVF_REQUIRE(vectors && ids, "vectors and ids must not be null");
    const int d = index->d;
    const ModelView mv = index_model(*index);
    const int64_t batch = std::min<int64_t>(n, int64_t(1) << 18);
    std::vector<int32_t> hl(static_cast<size_t>(batch));
    for (int64_t r0 = 0; r0 < n; r0 += batch) {
        check_cancel(r);
        const int64_t rows = std::min(batch, n - r0);
        Input<float> dv(r, vectors + r0 * d, rows * d);
        Input<uint64_t> di(r, ids + r0, rows);
        TempBuffer<int32_t> dl(r, rows);
        TempBuffer<uint8_t> dc(r, rows * index->code_size);
        ivfpq_encode(r, mv, dv.get(), rows, dl.data(), dc.data());
        copy_to_host_sync(r, hl.data(), dl.data(), rows);
        TempBuffer<uint16_t> halves(r, index->half_vectors ? rows * d : 0);
        if (index->half_vectors) narrow_to_halves(r, dv.get(), rows * d, halves.data());
        const uint16_t *stored = index->half_vectors ? halves.data() : reinterpret_cast<const uint16_t *>(dv.get());
        index_add_encoded(r, *index, rows, hl.data(), dl.data(), dc.data(), di.get(), stored);
    }
    API_END
}

gpuivf_cuda_status gpuivf_cuda_index_remove(gpuivf_cuda_resources *res, gpuivf_cuda_index *index, int64_t n,
                                            const uint64_t *ids, int64_t *removed) noexcept {
    API_BEGIN
    Resources &r = check_res(res);
    GPUIVF_REQUIRE(index != nullptr, "index must not be null");
    GPUIVF_REQUIRE(n >= 0 && (n == 0 || ids), "invalid arguments to index_remove");
    std::vector<uint64_t> h(static_cast<size_t>(n));
    copy_to_host_sync(r, h.data(), ids, n);
    const int64_t count = index_remove(r, *index, n, h.data());
    if (removed) *removed = count;
    API_END
}

gpuivf_cuda_status gpuivf_cuda_index_get_stats(gpuivf_cuda_index *index, gpuivf_cuda_index_stats *out) noexcept {
    API_BEGIN
    GPUIVF_REQUIRE(index != nullptr && out != nullptr, "invalid arguments to index_get_stats");
    out->vectors = index->count;
    out->nlist = index->nlist;
    out->code_size = index->code_size;
    out->min_list = index->nlist > 0 ? *std::min_element(index->size.begin(), index->size.end()) : 0;
    out->max_list = index->nlist > 0 ? *std::max_element(index->size.begin(), index->size.end()) : 0;
    out->device_bytes = index_device_bytes(*index);
    API_END
}

gpuivf_cuda_status gpuivf_cuda_index_get_list(gpuivf_cuda_resources *res, gpuivf_cuda_index *index, int32_t list,
                                              int64_t capacity, int64_t *count, uint64_t *ids,
                                              uint8_t *codes) noexcept {
    API_BEGIN
    Resources &r = check_res(res);
    GPUIVF_REQUIRE(index != nullptr && count != nullptr, "invalid arguments to index_get_list");
    GPUIVF_REQUIRE(list >= 0 && list < index->nlist, "list %d is out of range 0..%d", list, index->nlist - 1);
    const int64_t size = index->size[list];
    *count = size;
    const int64_t n = std::min(size, std::max<int64_t>(capacity, 0));
    Output<uint64_t> oi(r, ids, ids ? n : 0);
    Output<uint8_t> oc(r, codes, codes ? n * index->code_size : 0);
    index_get_list(r, *index, list, n, oi.get(), oc.get());
    oi.finish();
    oc.finish();
    sync(r);
    API_END
}

}  // extern "C"

namespace {

/* gpuivf_cuda_index_search(_async): everything but the final wait is the
 * same.  Outputs go through pinned memory when they fit, so that nothing
 * but the wait blocks the host. */
gpuivf_cuda_status index_search_call(gpuivf_cuda_resources *res, gpuivf_cuda_index *index, const float *queries,
                                     int64_t nq, const gpuivf_cuda_search_params *params, double *out_distances,
                                     uint64_t *out_ids, bool async) noexcept {
    API_BEGIN
    Resources &r = check_res(res);
    GPUIVF_REQUIRE(!r.search_pending, "the search started on these resources was not waited for");
    GPUIVF_REQUIRE(index != nullptr && params != nullptr, "index and params must not be null");
    const gpuivf_cuda_search_params &p = *params;
    GPUIVF_REQUIRE(p.k >= 1 && p.k <= kMaxK, "k %d is out of range 1..%d", p.k, kMaxK);
    GPUIVF_REQUIRE(p.nprobe >= 1 && p.nprobe <= GPUIVF_CUDA_MAX_NPROBE, "nprobe %d is out of range 1..%d", p.nprobe,
                   GPUIVF_CUDA_MAX_NPROBE);
    GPUIVF_REQUIRE(p.rerank_candidates >= 0 && p.rerank_candidates <= kMaxK,
                   "re-rank candidates %d is out of range 0..%d", p.rerank_candidates, kMaxK);
    GPUIVF_REQUIRE(p.rerank_candidates == 0 || index->store_vectors,
                   "re-ranking needs an index that stores vectors");
    GPUIVF_REQUIRE(p.lut_mode >= 0 && p.lut_mode <= 2, "unknown look-up table mode %d", p.lut_mode);
    GPUIVF_REQUIRE(p.min_probes_per_block >= 0 && p.min_probes_per_block <= GPUIVF_CUDA_MAX_NPROBE,
                   "probes a block %d is out of range 0..%d", p.min_probes_per_block, GPUIVF_CUDA_MAX_NPROBE);
    GPUIVF_REQUIRE(p.block_codes_per_candidate >= 0, "block codes per candidate %d is negative",
                   p.block_codes_per_candidate);
    GPUIVF_REQUIRE(nq >= 0, "invalid query count");
    if (nq == 0) return ok_status();
    GPUIVF_REQUIRE(queries && out_distances && out_ids, "search arrays must not be null");

    /* host arrays: promised by the caller, or asked of the driver */
    const bool host = p.host_arrays != 0;
    auto copy_in = [&](int32_t *dst, const int32_t *src) {
        if (host)
            std::memcpy(dst, src, sizeof(int32_t) * static_cast<size_t>(nq));
        else
            copy_in_host(r, dst, src, nq);
    };
    std::vector<int32_t> qk, qnp;
    SearchParams sp;
    sp.k = p.k;
    sp.nprobe = p.nprobe;
    sp.rerank = p.rerank_candidates;
    sp.lut_mode = p.lut_mode;
    sp.min_probes_per_block = std::max(1, p.min_probes_per_block);
    if (p.block_codes_per_candidate > 0 && index->count > 0) {
        /* probes whose codes stay within C a kept candidate, at the mean list size */
        const double per_list = static_cast<double>(index->count) / index->nlist;
        const double probes = static_cast<double>(p.block_codes_per_candidate) *
                              std::max(p.k, p.rerank_candidates) / per_list;
        sp.min_probes_per_block = std::max(
            sp.min_probes_per_block, static_cast<int>(std::min<double>(probes, GPUIVF_CUDA_MAX_NPROBE)));
    }
    if (p.query_k) {
        qk.resize(static_cast<size_t>(nq));
        copy_in(qk.data(), p.query_k);
        for (int32_t v : qk) GPUIVF_REQUIRE(v >= 1 && v <= p.k, "per-query k %d is out of range 1..%d", v, p.k);
        sp.query_k = qk.data();
    }
    if (p.query_nprobe) {
        qnp.resize(static_cast<size_t>(nq));
        copy_in(qnp.data(), p.query_nprobe);
        for (int32_t v : qnp)
            GPUIVF_REQUIRE(v >= 1 && v <= p.nprobe, "per-query nprobe %d is out of range 1..%d", v, p.nprobe);
        sp.query_nprobe = qnp.data();
    }
    /* from host arrays: a recorded graph of the whole search when it can */
    double *out_adc = p.out_adc_distances;
    double *pinned_d = nullptr, *pinned_a = nullptr;
    uint64_t *pinned_i = nullptr;
    if ((host || (!is_device_pointer(queries) && !is_device_pointer(out_distances) && !is_device_pointer(out_ids) &&
                  (!out_adc || !is_device_pointer(out_adc)))) &&
        search_recorded(r, *index, queries, nq, sp, out_adc != nullptr, &pinned_d, &pinned_i, &pinned_a)) {
        const size_t nd = sizeof(double) * static_cast<size_t>(nq) * p.k;
        const size_t ni = sizeof(uint64_t) * static_cast<size_t>(nq) * p.k;
        if (async) {
            r.pending_copies[0] = {out_distances, pinned_d, nd};
            r.pending_copies[1] = {out_ids, pinned_i, ni};
            r.npending_copies = 2;
            if (out_adc) r.pending_copies[r.npending_copies++] = {out_adc, pinned_a, nd};
            r.search_pending = true;
            return ok_status();
        }
        sync(r);
        std::memcpy(out_distances, pinned_d, nd);
        std::memcpy(out_ids, pinned_i, ni);
        if (out_adc) std::memcpy(out_adc, pinned_a, nd);
        return ok_status();
    }
    r.pinned_top = 0; /* the previous call is over: its pinned bytes are free */
    Input<float> q(r, queries, nq * index->d, true);
    Output<double> od(r, out_distances, nq * p.k, true);
    Output<uint64_t> oi(r, out_ids, nq * p.k, true);
    Output<double> oa(r, out_adc, out_adc ? nq * p.k : 0, true);
    sp.out_adc = oa.get();
    try {
        index_search(r, *index, q.get(), nq, sp, od.get(), oi.get());
        od.finish();
        oi.finish();
        oa.finish();
    } catch (...) {
        /* nothing queued may outlive this call's pinned and arena memory */
        cudaStreamSynchronize(r.stream);
        throw;
    }
    if (async) {
        r.npending_copies = 0;
        od.deliver_at_wait();
        oi.deliver_at_wait();
        oa.deliver_at_wait();
        r.search_pending = true;
        return ok_status();
    }
    sync(r);
    od.deliver();
    oi.deliver();
    oa.deliver();
    API_END
}

}  // namespace

extern "C" {

gpuivf_cuda_status gpuivf_cuda_index_search(gpuivf_cuda_resources *res, gpuivf_cuda_index *index,
                                            const float *queries, int64_t nq, const gpuivf_cuda_search_params *params,
                                            double *out_distances, uint64_t *out_ids) noexcept {
    return index_search_call(res, index, queries, nq, params, out_distances, out_ids, false);
}

gpuivf_cuda_status gpuivf_cuda_index_search_async(gpuivf_cuda_resources *res, gpuivf_cuda_index *index,
                                                  const float *queries, int64_t nq,
                                                  const gpuivf_cuda_search_params *params, double *out_distances,
                                                  uint64_t *out_ids) noexcept {
    return index_search_call(res, index, queries, nq, params, out_distances, out_ids, true);
}

gpuivf_cuda_status gpuivf_cuda_search_done(gpuivf_cuda_resources *res, int32_t *done) noexcept {
    API_BEGIN
    Resources &r = check_res(res);
    GPUIVF_REQUIRE(done != nullptr, "done must not be null");
    *done = 1;
    if (!r.search_pending) return ok_status();
    const cudaError_t err = cudaStreamQuery(r.stream);
    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        *done = 0;
        return ok_status();
    }
    GPUIVF_CUDA_TRY(err);
    API_END
}

gpuivf_cuda_status gpuivf_cuda_search_wait(gpuivf_cuda_resources *res) noexcept {
    API_BEGIN
    Resources &r = check_res(res);
    if (!r.search_pending) return ok_status();
    r.search_pending = false;
    sync(r);
    for (int i = 0; i < r.npending_copies; i++)
        std::memcpy(r.pending_copies[i].user, r.pending_copies[i].bounce, r.pending_copies[i].bytes);
    r.npending_copies = 0;
    API_END
}

}  // extern "C"
