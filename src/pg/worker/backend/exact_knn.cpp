/*
 * worker/backend/exact_knn.cpp — exact kNN on the GPU worker: ANALYZE's
 * ground truth (GpuivfExactKnnForCalibration) hands batches of rows over in
 * a DSM segment and gets their exact top-k back.
 */
#include "gpuivf.h"
#include "worker/worker.h"
#include "worker/protocol.h"
#include "worker/backend/backend.h"

/* ------------------------------------------------- exact kNN (ANALYZE) */

/* Larger jobs stay on the CPU (a DSM segment of that size is unusual). */
#define GPUIVF_EXACT_KNN_MAX_BYTES  ((Size) 512 * 1024 * 1024)

struct GpuivfExactKnnJob
{
    Relation    index;
    dsm_segment *seg;
    GpuivfExactKnnLayout layout;
    gpuivf::Metric metric;
    int         dims;
    int         nq;
    int         kk;
    int64       batch_cap;
    bool        dead;           /* a request failed: the CPU finishes */
};

/* Starts an exact kNN job on the GPU worker, or NULL (worker.h). */
GpuivfExactKnnJob *
GpuivfWorkerExactKnnBegin(Relation index, gpuivf::Metric metric, int dims, int nq,
                          const float4 *queries, int kk, int64 batch_cap, float4 **base)
{
    GpuivfExactKnnJob *job;
    GpuivfExactKnnLayout l;
    dsm_segment *seg;

    if (!GpuivfWorkerAvailable() || nq < 1 || dims < 1 || dims > GPUIVF_CUDA_MAX_DIMS ||
        kk < 1 || kk > GPUIVF_CUDA_MAX_K || batch_cap < 1 || GpuivfMySlot() == NULL)
        return NULL;
    l = GpuivfExactKnnPayloadLayout(nq, dims, kk, batch_cap);
    if (l.total > GPUIVF_EXACT_KNN_MAX_BYTES)
        return NULL;
    seg = dsm_create(l.total, DSM_CREATE_NULL_IF_MAXSEGMENTS);
    if (seg == NULL)
        return NULL;
    job = (GpuivfExactKnnJob *) palloc0(sizeof(GpuivfExactKnnJob));
    job->index = index;
    job->seg = seg;
    job->layout = l;
    job->metric = metric;
    job->dims = dims;
    job->nq = nq;
    job->kk = kk;
    job->batch_cap = batch_cap;
    memcpy((char *) dsm_segment_address(seg) + l.queries_off, queries,
           sizeof(float4) * (Size) nq * dims);
    *base = (float4 *) ((char *) dsm_segment_address(seg) + l.base_off);
    return job;
}

/* Exact top-kk of the job's queries among the n rows of its base (worker.h). */
bool
GpuivfWorkerExactKnnRun(GpuivfExactKnnJob *job, int64 n, float *scores, uint64 *ids)
{
    GpuivfRequestSlot *slot;
    char       *data;
    bool        answered;

    if (job == NULL || job->dead || n < 0 || n > job->batch_cap)
        return false;
    if (GpuivfReadyWorkers() == 0 || (slot = GpuivfMySlot()) == NULL)
    {
        /* the worker went away between two batches */
        if (gpuivf_device == GPUIVF_DEVICE_GPU)
            RaiseNoWorker();
        job->dead = true;
        GpuivfCountCpuFallbacks(-1, 1);
        return false;
    }
    slot->kind = GPUIVF_KIND_EXACT_KNN;
    SetIndexIdentity(slot, job->index, NULL, 0);
    slot->dims = job->dims;
    slot->metric = (int) job->metric;
    slot->nq = job->nq;
    slot->kmax = job->kk;
    slot->dsm = dsm_segment_handle(job->seg);
    slot->arg[0] = n;
    slot->arg[1] = job->kk;
    slot->arg[2] = job->batch_cap;
    slot->arg[3] = 0;
    /* like an index build: no time limit (the answer may be big), cancel works */
    answered = SubmitAndWaitUnlimited(slot);
    if (!answered || slot->result != GPUIVF_RESULT_OK)
    {
        job->dead = true;
        RequestFailed(job->index, slot, answered, "compute exact neighbours for", 1);
        return false;
    }
    GpuivfReleaseSlot(slot);
    data = (char *) dsm_segment_address(job->seg);
    memcpy(scores, data + job->layout.scores_off, sizeof(float) * (Size) job->nq * job->kk);
    memcpy(ids, data + job->layout.ids_off, sizeof(uint64) * (Size) job->nq * job->kk);
    return true;
}

/* Did a Run of the job fail (the CPU finished it)? */
bool
GpuivfWorkerExactKnnDead(const GpuivfExactKnnJob *job)
{
    return job == NULL || job->dead;
}

/* Ends a job (NULL is fine); its DSM segment goes away. */
void
GpuivfWorkerExactKnnEnd(GpuivfExactKnnJob *job)
{
    if (job == NULL)
        return;
    if (job->seg != NULL)
        dsm_detach(job->seg);
    pfree(job);
}
