/*
 * worker/backend/build_jobs.cpp — CREATE INDEX's work on the GPU worker:
 * training (k-means + PQ) of the sample, encoding of the rows in batches
 * through one DSM segment (one per build process), and the load of the new
 * index's GPU copy before the build's calibration searches it.
 */
#include "gpuivf.h"
#include "worker/worker.h"
#include "worker/protocol.h"
#include "worker/backend/backend.h"
#include "storage/storage.h"

/*
 * Run a TRAIN or ENCODE request whose data is in seg; false when the CPU
 * must do it.  The wait has no time limit (a build is long); cancel works.
 */
static bool
BuildRequest(Relation index, dsm_segment *seg, int kind, int metric, int dims,
             const int64 *args)
{
    GpuivfRequestSlot *slot = GpuivfMySlot();
    bool        answered;

    if (slot == NULL)
        return false;
    slot->kind = kind;
    SetIndexIdentity(slot, index, NULL, 0);
    slot->dims = dims;
    slot->metric = metric;
    slot->nq = 0;
    slot->kmax = 0;
    slot->dsm = dsm_segment_handle(seg);
    for (int i = 0; i < 4; i++)
        slot->arg[i] = args[i];
    answered = SubmitAndWaitUnlimited(slot);
    if (!answered || slot->result != GPUIVF_RESULT_OK)
    {
        RequestFailed(index, slot, answered, kind == GPUIVF_KIND_TRAIN ? "train" : "encode", 1);
        return false;
    }
    GpuivfReleaseSlot(slot);
    return true;
}

/*
 * CREATE INDEX: k-means and PQ training of n sample vectors (prepared
 * space) on the GPU worker; centroids (lists x dims) and codebook out.
 */
bool
GpuivfWorkerTrain(Relation index, gpuivf::Metric metric, const float *sample, int64 n,
                  int dims, int lists, int pq_m, int pq_bits, float *centroids, float *codebook)
{
    Size        xb = sizeof(float) * (Size) n * dims;
    Size        cb = sizeof(float) * (Size) lists * dims;
    Size        bb = sizeof(float) * GpuivfCodebookFloats(dims, pq_m, pq_bits);
    dsm_segment *seg;
    char       *base;
    int64       args[4] = {n, lists, pq_m, pq_bits};
    bool        ok;

    if (!WorkerUsable(0))
        return false;
    seg = dsm_create(xb + cb + bb, DSM_CREATE_NULL_IF_MAXSEGMENTS);
    if (seg == NULL)
        return false;
    base = (char *) dsm_segment_address(seg);
    memcpy(base, sample, xb);
    ok = BuildRequest(index, seg, GPUIVF_KIND_TRAIN, (int) metric, dims, args);
    if (ok)
    {
        memcpy(centroids, base + xb, cb);
        memcpy(codebook, base + xb + cb, bb);
    }
    dsm_detach(seg);
    return ok;
}

/*
 * CREATE INDEX: lists and PQ codes of batches of raw vectors on the GPU
 * worker (the same bytes the CPU's ivfpq_encode writes, up to exact float
 * ties).  One DSM segment serves every batch of the build
 * (GpuivfEncodePayloadLayout): the model is copied once, and of its two
 * batch areas the backend's scan fills one while the worker encodes the
 * other, so the heap scan and the GPU overlap.  At most one request is in
 * flight (a backend has one request slot).
 */
struct GpuivfEncodeJob
{
    dsm_segment *seg;
    GpuivfEncodeLayout layout;
    gpuivf::IvfPqModel model;
    int64       cap;
    GpuivfRequestSlot *pending; /* submitted and not waited for, or NULL */
    int         pending_area;
};

/* Requests submitted now and waited for later, for the abort callbacks:
 * an encode job's batch in flight, a build's load request.  The slots, in
 * shared memory: the job itself may be gone when the callbacks run (it lives
 * in the build's memory, which an abort frees first, AtAbort_Portals). */
static GpuivfRequestSlot *PendingEncode = NULL;
static GpuivfRequestSlot *PendingLoad = NULL;
static bool pending_callbacks_registered = false;

/* An aborted (sub)transaction leaves no such request behind. */
static void
AbandonPendingRequests(void)
{
    if (PendingEncode != NULL)
        GpuivfAbandonRequest(PendingEncode);
    PendingEncode = NULL;
    if (PendingLoad != NULL)
        GpuivfAbandonRequest(PendingLoad);
    PendingLoad = NULL;
}

static void
PendingXactCallback(XactEvent event, void *arg)
{
    if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT)
        AbandonPendingRequests();
}

static void
PendingSubXactCallback(SubXactEvent event, SubTransactionId mySubid,
                       SubTransactionId parentSubid, void *arg)
{
    if (event == SUBXACT_EVENT_ABORT_SUB)
        AbandonPendingRequests();
}

static void
RegisterPendingCallbacks(void)
{
    if (pending_callbacks_registered)
        return;
    RegisterXactCallback(PendingXactCallback, NULL);
    RegisterSubXactCallback(PendingSubXactCallback, NULL);
    pending_callbacks_registered = true;
}

/* Starts encoding on the GPU worker (worker.h); NULL: the CPU encodes. */
GpuivfEncodeJob *
GpuivfWorkerEncodeBegin(const gpuivf::IvfPqModel &model, int64 batch_cap)
{
    GpuivfEncodeJob *job;
    GpuivfEncodeHeader h;
    GpuivfEncodeLayout l;
    dsm_segment *seg;
    char       *base;

    if (batch_cap <= 0 || !WorkerUsable(0))
        return NULL;
    h.cap = batch_cap;
    h.lists = model.nlist;
    h.pq_m = model.m;
    h.pq_bits = model.nbits;
    h.code_size = gpuivf::pq_code_size(model.m, model.nbits);
    l = GpuivfEncodePayloadLayout(&h, model.d);
    seg = dsm_create(l.total, DSM_CREATE_NULL_IF_MAXSEGMENTS);
    if (seg == NULL)
        return NULL;
    base = (char *) dsm_segment_address(seg);
    memcpy(base, &h, sizeof(h));
    memcpy(base + l.centroids_off, model.centroids, sizeof(float) * (Size) model.nlist * model.d);
    memcpy(base + l.codebook_off, model.codebook,
           sizeof(float) * GpuivfCodebookFloats(model.d, model.m, model.nbits));
    RegisterPendingCallbacks();
    job = (GpuivfEncodeJob *) palloc0(sizeof(GpuivfEncodeJob));
    job->seg = seg;
    job->layout = l;
    job->model = model;
    job->cap = batch_cap;
    job->pending = NULL;
    return job;
}

/* Area a's raw rows (cap x dims): the scan writes a batch there directly. */
float *
GpuivfWorkerEncodeArea(GpuivfEncodeJob *job, int area)
{
    return (float *) ((char *) dsm_segment_address(job->seg) + job->layout.area_off[area] +
                      job->layout.raw_off);
}

/*
 * Submit the n rows of area `area` for encoding and return at once; false
 * when the worker cannot take them (the caller encodes them on the CPU).
 * The previous batch must have been waited for.
 */
bool
GpuivfWorkerEncodeSubmit(GpuivfEncodeJob *job, Relation index, int area, int64 n)
{
    GpuivfRequestSlot *slot;

    Assert(job->pending == NULL);
    if (n <= 0 || n > job->cap || area < 0 || area > 1 || !WorkerUsable(0))
        return false;
    slot = GpuivfMySlot();
    if (slot == NULL)
        return false;
    slot->kind = GPUIVF_KIND_ENCODE;
    SetIndexIdentity(slot, index, NULL, 0);
    slot->dims = job->model.d;
    slot->metric = (int) job->model.metric;
    slot->nq = 0;
    slot->kmax = 0;
    slot->dsm = dsm_segment_handle(job->seg);
    slot->arg[0] = n;
    slot->arg[1] = area;
    slot->arg[2] = 0;
    slot->arg[3] = 0;
    job->pending = slot;
    job->pending_area = area;
    PendingEncode = slot;
    GpuivfSubmit(slot);
    return true;
}

/*
 * Wait for the submitted batch: true with *lists and *codes pointing at its
 * answer in the segment (valid until the area is submitted again); false
 * when the CPU must encode it (errors are raised under gpuivf.device = gpu).
 * No time limit (a batch of a large build is long); cancel works.
 */
bool
GpuivfWorkerEncodeWait(GpuivfEncodeJob *job, Relation index, const int32 **lists,
                       const uint8 **codes)
{
    GpuivfRequestSlot *slot = job->pending;
    char       *a;
    bool        answered;

    if (slot == NULL)
        return false;
    /* from here the wait owns the request: an error in it abandons it */
    job->pending = NULL;
    PendingEncode = NULL;
    answered = GpuivfWaitAnswer(slot, 0);
    if (!answered || slot->result != GPUIVF_RESULT_OK)
    {
        RequestFailed(index, slot, answered, "encode", 1);
        return false;
    }
    GpuivfReleaseSlot(slot);
    a = (char *) dsm_segment_address(job->seg) + job->layout.area_off[job->pending_area];
    *lists = (const int32 *) (a + job->layout.lists_off);
    *codes = (const uint8 *) (a + job->layout.codes_off);
    return true;
}

/* Ends the job (its segment goes; a request still in flight is abandoned). */
void
GpuivfWorkerEncodeEnd(GpuivfEncodeJob *job)
{
    if (job == NULL)
        return;
    if (job->pending != NULL)
    {
        GpuivfAbandonRequest(job->pending);
        if (PendingEncode == job->pending)
            PendingEncode = NULL;
    }
    dsm_detach(job->seg);
    pfree(job);
}

/*
 * A build's index, loaded by a GPU worker in the background (worker.h):
 * true when a LOAD request went out; GpuivfWorkerLoadWait waits for it.
 * Nothing is raised and nothing counts as a CPU fallback: without a worker
 * (or for a sharded index, whose shards load on their own workers) the
 * calibration's first search loads the copy as it always did.
 */
bool
GpuivfWorkerLoadStart(Relation index, const GpuivfMetaPageData *meta)
{
    GpuivfRequestSlot *slot;
    GpuivfPlacement pl;
    GpuivfMetaPageData now = *meta;
    uint64      version;

    Assert(PendingLoad == NULL);
    if (gpuivf_device == GPUIVF_DEVICE_CPU || GpuivfReadyWorkers() == 0 ||
        !GpuivfWorkerCanRead(index))
        return false;
    version = GpuivfReadRows(index, &now);
    pl = GpuivfPlaceIndex(&now);
    if (pl.nshards > 1 || (slot = GpuivfMySlot()) == NULL)
        return false;
    slot->kind = GPUIVF_KIND_LOAD;
    SetIndexIdentity(slot, index, &now, version);
    slot->codes_only = pl.codes_only;
    slot->nq = 0;
    slot->kmax = 0;
    RegisterPendingCallbacks();
    PendingLoad = slot;
    GpuivfSubmit(slot);
    return true;
}

/* Wait for the load GpuivfWorkerLoadStart sent (if any); a failed load is
 * only reported at DEBUG1 (the next search of the index loads it again). */
void
GpuivfWorkerLoadWait(Relation index)
{
    GpuivfRequestSlot *slot = PendingLoad;

    if (slot == NULL)
        return;
    /* from here the wait owns the request: an error in it abandons it */
    PendingLoad = NULL;
    if (!GpuivfWaitAnswer(slot, 0))
        return;
    if (slot->result != GPUIVF_RESULT_OK)
        ereport(DEBUG1,
                (errmsg("gpuivf GPU worker did not load index \"%s\" ahead of its calibration: %s",
                        RelationGetRelationName(index), slot->message)));
    else
        ereport(DEBUG1,
                (errmsg("gpuivf GPU worker %d loaded index \"%s\" before its calibration",
                        slot->taken_by, RelationGetRelationName(index))));
    GpuivfReleaseSlot(slot);
}
