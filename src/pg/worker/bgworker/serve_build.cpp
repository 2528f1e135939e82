/*
 * worker/bgworker/serve_build.cpp — the worker's answers to CREATE INDEX
 * (TRAIN, ENCODE) and to ANALYZE's ground truth (EXACT_KNN): the data is in
 * the request's DSM segment, the answer goes back there.
 */
#include "gpuivf.h"
#include "worker/worker.h"
#include "worker/protocol.h"
#include "worker/bgworker/bgworker.h"

/* ------------------------------------------------------ index builds */

/* Engine cancel hook of a build: its backend gave up, or we must exit. */
static int
BuildCanceled(void *arg)
{
    volatile GpuivfRequestSlot *slot = (volatile GpuivfRequestSlot *) arg;

    return slot->abandoned || ProcDiePending;
}

#define GPUIVF_GPU_TRAIN_SEED   UINT64CONST(0x6770756976660002)

/*
 * TRAIN: [sample n x d][centroids out][codebook out] in the request's DSM
 * (arg = n, lists, pq_m, pq_bits).  ENCODE: one area of the build's
 * segment (GpuivfEncodePayloadLayout; arg = n, area).
 */
void
GpuivfServeBuild(int worker, int slotno)
{
    GpuivfRequestSlot *r = &GpuivfShmem->slots[slotno];
    dsm_segment *seg = dsm_attach(r->dsm);
    char       *base;
    int         d = r->dims;
    gpuivf_cuda_status st;

    if (seg == NULL)
        ereport(ERROR,
                (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                 errmsg("the data of an index build request is gone")));
    base = (char *) dsm_segment_address(seg);
    GpuivfCheckCuda(GpuivfCuda.gpuivf_cuda_set_cancel_hook(GpuivfCudaRes, BuildCanceled, r),
                    "set a cancel hook");
    if (r->kind == GPUIVF_KIND_TRAIN)
    {
        int64       n = r->arg[0];
        int         lists = (int) r->arg[1];
        int         pq_m = (int) r->arg[2];
        int         pq_bits = (int) r->arg[3];
        Size        xb = sizeof(float) * (Size) n * d;
        Size        cb = sizeof(float) * (Size) lists * d;
        gpuivf_cuda_kmeans_params params = GpuivfCuda.gpuivf_cuda_kmeans_default_params();

        params.seed = GPUIVF_GPU_TRAIN_SEED;
        st = GpuivfCuda.gpuivf_cuda_ivfpq_train(GpuivfCudaRes, r->metric, (const float *) base, n,
                                                d, lists, pq_m, pq_bits, &params,
                                                (float *) (base + xb),
                                                (float *) (base + xb + cb));
    }
    else
    {
        const GpuivfEncodeHeader *h = (const GpuivfEncodeHeader *) base;
        int64       n = r->arg[0];
        int64       area = r->arg[1];
        GpuivfEncodeLayout l;
        char       *a;
        gpuivf_cuda_model model;

        if (h->cap < 1 || n < 1 || n > h->cap || area < 0 || area > 1 || h->lists < 1 ||
            h->pq_m < 1 || d % h->pq_m != 0 || (h->pq_bits != 4 && h->pq_bits != 8) ||
            h->code_size != (int32) gpuivf::pq_code_size(h->pq_m, h->pq_bits) ||
            (l = GpuivfEncodePayloadLayout(h, d)).total > dsm_segment_map_length(seg))
            elog(ERROR, "gpuivf GPU worker got a malformed encode request (%lld rows, area %lld)",
                 (long long) n, (long long) area);
        a = base + l.area_off[area];
        memset(&model, 0, sizeof(model));
        model.metric = r->metric;
        model.d = d;
        model.nlist = h->lists;
        model.m = h->pq_m;
        model.nbits = h->pq_bits;
        model.centroids = (const float *) (base + l.centroids_off);
        model.codebook = (const float *) (base + l.codebook_off);
        st = GpuivfCuda.gpuivf_cuda_ivfpq_encode(GpuivfCudaRes, &model, (const float *) (a + l.raw_off),
                                                 n, (int32 *) (a + l.lists_off),
                                                 (uint8 *) (a + l.codes_off));
    }
    (void) GpuivfCuda.gpuivf_cuda_set_cancel_hook(GpuivfCudaRes, NULL, NULL);
    GpuivfCheckCuda(st, r->kind == GPUIVF_KIND_TRAIN ? "train an index" : "encode vectors");
    dsm_detach(seg);
    pg_atomic_fetch_add_u64(&GpuivfShmem->workers[worker].builds, 1);
    r->result = GPUIVF_RESULT_OK;
}

/*
 * EXACT_KNN: the exact top-kk of the request's queries among the base rows
 * of its DSM segment (GpuivfExactKnnLayout), for ANALYZE's ground truth.
 * The engine's exact_knn re-scores its GEMM shortlist with the CPU's exact
 * functions, so scores and ties are those of core exact_knn.
 */
void
GpuivfServeExactKnn(int worker, int slotno)
{
    GpuivfRequestSlot *r = &GpuivfShmem->slots[slotno];
    int64       n = r->arg[0];
    int         kk = (int) r->arg[1];
    int64       batch_cap = r->arg[2];
    int         d = r->dims;
    int         nq = r->nq;
    dsm_segment *seg;
    char       *base;
    GpuivfExactKnnLayout l;
    gpuivf_cuda_status st;

    if (nq < 1 || kk < 1 || kk > GPUIVF_CUDA_MAX_K || d < 1 || d > GPUIVF_CUDA_MAX_DIMS ||
        n < 0 || n > batch_cap)
        elog(ERROR, "gpuivf GPU worker got a malformed exact kNN request (%d queries, k %d, %d dimensions, %lld rows)",
             nq, kk, d, (long long) n);
    seg = dsm_attach(r->dsm);
    if (seg == NULL)
        ereport(ERROR,
                (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                 errmsg("the data of an exact kNN request is gone")));
    l = GpuivfExactKnnPayloadLayout(nq, d, kk, batch_cap);
    if (dsm_segment_map_length(seg) < l.total)
        elog(ERROR, "gpuivf GPU worker got an exact kNN request with a short data segment");
    base = (char *) dsm_segment_address(seg);
    GpuivfCheckCuda(GpuivfCuda.gpuivf_cuda_set_cancel_hook(GpuivfCudaRes, BuildCanceled, r),
                    "set a cancel hook");
    st = GpuivfCuda.gpuivf_cuda_exact_knn(GpuivfCudaRes, r->metric,
                                          (const float *) (base + l.base_off), n,
                                          (const float *) (base + l.queries_off), nq, d, kk, 0,
                                          (float *) (base + l.scores_off),
                                          (uint64_t *) (base + l.ids_off));
    (void) GpuivfCuda.gpuivf_cuda_set_cancel_hook(GpuivfCudaRes, NULL, NULL);
    GpuivfCheckCuda(st, "compute exact nearest neighbours");
    dsm_detach(seg);
    pg_atomic_fetch_add_u64(&GpuivfShmem->workers[worker].exact_knn, 1);
    r->result = GPUIVF_RESULT_OK;
}
