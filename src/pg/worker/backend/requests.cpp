/*
 * worker/backend/requests.cpp — what every request a backend sends to the
 * GPU worker shares: whether a worker can be asked, what happens when it
 * cannot answer, the identity of the index a request is about, and how many
 * shards a search of an index uses.
 *
 * gpuivf.device decides:
 *   cpu   never asks the worker (every function returns false at once);
 *   auto  asks when a worker is ready; any failure (no worker, worker error,
 *         timeout, worker exit) returns false and the caller answers on the
 *         CPU, counted in gpuivf_stat.cpu_fallbacks (per query for searches,
 *         per request for build and ANALYZE work);
 *   gpu   raises a clear error instead of falling back.
 * Searches the GPU engine does not take by design (a temporary or untrained
 * index, exact mode — nprobe covering every list of an index with stored
 * vectors) are routed to the CPU by GpuivfSearchBatch under every setting;
 * searches above the engine's limits (GpuivfGpuLimitExceeded) run on the
 * CPU under auto and raise GpuivfRaiseGpuLimit under gpu.
 */
#include "gpuivf.h"
#include "worker/worker.h"
#include "worker/protocol.h"
#include "worker/backend/backend.h"

/* Why no worker can serve, as a DETAIL sentence. */
static void
NoWorkerDetail(char *buf, Size len)
{
    if (GpuivfShmem == NULL)
    {
        snprintf(buf, len, "The gpuivf library is not in shared_preload_libraries, so no GPU worker was started.");
        return;
    }
    for (int i = 0; i < GpuivfShmem->nworkers; i++)
    {
        GpuivfWorkerSlot *w = &GpuivfShmem->workers[i];
        int         state;
        char        message[GPUIVF_MESSAGE_LEN];

        SpinLockAcquire(&w->mutex);
        state = w->state;
        strlcpy(message, w->message, sizeof(message));
        SpinLockRelease(&w->mutex);
        if (state == GPUIVF_WORKER_NO_GPU)
        {
            snprintf(buf, len, "GPU worker %d has no usable GPU: %s.", i, message);
            return;
        }
    }
    snprintf(buf, len, "No GPU worker is ready (starting, or restarting after an exit).");
}

/* worker.h: the SQL function asking the worker itself, or NULL */
const char *GpuivfWorkerOnlyCaller = NULL;

/* No ready worker where one is required: under gpuivf.device = gpu, or by
 * an SQL function that only asks the worker (GpuivfWorkerOnlyCaller). */
void
RaiseNoWorker(void)
{
    char        detail[GPUIVF_MESSAGE_LEN + 64];

    NoWorkerDetail(detail, sizeof(detail));
    if (GpuivfWorkerOnlyCaller != NULL)
        ereport(ERROR,
                (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                 errmsg("%s needs a gpuivf GPU worker, but none is running", GpuivfWorkerOnlyCaller),
                 /* the reason depends on the machine: log it, keep client output stable */
                 errdetail_log("%s", detail),
                 errhint("%s only asks the GPU worker; the query itself runs on the CPU under gpuivf.device = \"auto\" or \"cpu\".",
                         GpuivfWorkerOnlyCaller)));
    ereport(ERROR,
            (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
             errmsg("gpuivf.device is set to \"gpu\" but no gpuivf GPU worker is running"),
             errdetail_log("%s", detail),
             errhint("Set gpuivf.device to \"auto\" or \"cpu\" to run gpuivf scans on the CPU.")));
}

/* n queries or requests answered on the CPU although gpuivf is preloaded
 * (worker.h); worker -1: none was asked, shown in worker 0's row. */
void
GpuivfCountCpuFallbacks(int worker, int64 n)
{
    if (GpuivfShmem == NULL || n <= 0)
        return;
    if (worker >= 0 && worker < GpuivfShmem->nworkers)
        pg_atomic_fetch_add_u64(&GpuivfShmem->workers[worker].cpu_fallbacks, (uint64) n);
    else
        pg_atomic_fetch_add_u64(&GpuivfShmem->fallbacks_no_worker, (uint64) n);
}

/* See worker.h.  Requests that carry their data (training, encoding,
 * exact kNN) may come from a temporary index; searches and loads may not. */
bool
GpuivfWorkerCanRead(Relation index)
{
    return !RelationUsesLocalBuffers(index);
}

/* Is a GPU worker with a usable GPU up to take requests? */
bool
GpuivfWorkerAvailable(void)
{
    if (gpuivf_device == GPUIVF_DEVICE_CPU)
        return false;
    return GpuivfReadyWorkers() > 0;
}

/*
 * Can the worker be asked at all?  false under cpu; under gpu without a
 * ready worker, raises; under auto, counts `count` fallbacks.
 */
bool
WorkerUsable(int64 count)
{
    if (gpuivf_device == GPUIVF_DEVICE_CPU)
        return false;
    if (GpuivfReadyWorkers() > 0)
        return true;
    if (gpuivf_device == GPUIVF_DEVICE_GPU)
        RaiseNoWorker();
    GpuivfCountCpuFallbacks(-1, count);
    return false;
}

/*
 * A request that did not succeed: raise under gpu, else count `count`
 * fallbacks (queries, or 1 for a build or exact kNN request) on the worker
 * that failed and let the caller answer on the CPU.  Releases the slot
 * (when answered).
 */
void
RequestFailed(Relation index, GpuivfRequestSlot *slot, bool answered, const char *what,
              int64 count)
{
    char        message[GPUIVF_MESSAGE_LEN];
    char        detail[GPUIVF_MESSAGE_LEN];
    int         sqlerrcode = ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE;
    int         worker = -1;

    if (answered)
    {
        strlcpy(message, slot->message, sizeof(message));
        strlcpy(detail, slot->detail, sizeof(detail));
        if (slot->result == GPUIVF_RESULT_ERROR && slot->sqlerrcode != 0)
            sqlerrcode = slot->sqlerrcode;
        worker = slot->taken_by;
        GpuivfReleaseSlot(slot);
    }
    else
    {
        snprintf(message, sizeof(message), "no answer within gpuivf.worker_timeout (%d ms)",
                 gpuivf_worker_timeout);
        detail[0] = '\0';
    }
    if (gpuivf_device == GPUIVF_DEVICE_GPU)
        ereport(ERROR,
                (errcode(sqlerrcode),
                 errmsg("gpuivf GPU worker could not %s index \"%s\": %s", what,
                        RelationGetRelationName(index), message),
                 detail[0] ? errdetail("%s", detail) : 0,
                 GpuivfWorkerOnlyCaller
                 ? errhint("%s only asks the GPU worker; the query itself runs on the CPU under gpuivf.device = \"auto\" when the GPU cannot.",
                           GpuivfWorkerOnlyCaller)
                 : errhint("Set gpuivf.device to \"auto\" to answer on the CPU when the GPU cannot.")));
    ereport(DEBUG1,
            (errmsg("gpuivf: %s of index \"%s\" runs on the CPU: %s", what,
                    RelationGetRelationName(index), message)));
    GpuivfCountCpuFallbacks(worker, count);
}

/* Fill the identity of index into a request. */
void
SetIndexIdentity(GpuivfRequestSlot *slot, Relation index, const GpuivfMetaPageData *meta,
                 uint64 version)
{
    slot->dboid = MyDatabaseId;
    slot->indexoid = RelationGetRelid(index);
    slot->node = index->rd_node;
    slot->permanent = index->rd_rel->relpersistence == RELPERSISTENCE_PERMANENT;
    slot->lsn_reliable = RelationNeedsWAL(index);
    slot->train_id = meta ? meta->train_id : 0;
    slot->version = meta ? version : 0;
    slot->dims = meta ? (int) meta->dims : 0;
    slot->codes_only = false;
    slot->reranked = 0;
}

/* ----------------------------------------------------- sharded search */

/*
 * The placement of an index of meta's shape (backend.h).  An index that
 * re-ranks from the table has copies of its codes alone, always.  Copies
 * with the re-rank vectors come first: one worker's, else the fewest shards that
 * fit; then, for an index that stores vectors, copies of the codes alone
 * (about a fifth of the bytes for 128 dimensions and 32-byte codes): one
 * worker's, else the fewest shards.  "Fit": within the smallest
 * gpuivf.gpu_memory_limit of the ready workers.  gpuivf.shards = 1 allows
 * no shards, n >= 2 forces min(n, workers).  When nothing fits, the largest
 * placement is tried and the workers say so (the error names the sizes).
 */
GpuivfPlacement
GpuivfPlaceIndex(const GpuivfMetaPageData *meta)
{
    int         nworkers = GpuivfShmem->nworkers;
    int64       limit = -1;
    bool        reranks = (meta->flags & GPUIVF_META_RERANK) != 0;
    /* re-rank from the table: the copies hold codes alone, and the
     * backends re-rank their ADC candidates from the table's rows */
    bool        host_only = reranks && !GpuivfMetaStoresVectors(meta);
    int         most;
    GpuivfPlacement pl;

    /*
     * Read without the workers' spinlocks, like GpuivfReadyWorkers: every
     * search passes here.  A worker sets its limit before it turns READY
     * (the read barrier keeps that order); a limit changing under us is a
     * reload, seen a moment early or late, which the locked read did not
     * prevent either.  The placement never changes a search's rows, only
     * which workers answer and where the re-rank runs.
     */
    for (int i = 0; i < nworkers; i++)
    {
        volatile GpuivfWorkerSlot *w = &GpuivfShmem->workers[i];
        int64       wlimit;

        if (!GpuivfWorkerReady(i))
            continue;
        pg_read_barrier();
        wlimit = w->memory_limit;
        if (wlimit > 0 && (limit < 0 || wlimit < limit))
            limit = wlimit;
    }
    pl.nshards = 1;
    pl.codes_only = host_only;
    if (nworkers >= 2 && gpuivf_shards >= 2)
    {
        pl.nshards = Min(gpuivf_shards, nworkers);
        pl.codes_only = host_only || (reranks && limit > 0 &&
                                      GpuivfEstimateGpuBytes(meta, pl.nshards, false) > limit);
        return pl;
    }
    if (limit <= 0)
        return pl;
    most = nworkers >= 2 && gpuivf_shards == 0 ? nworkers : 1;
    for (int codes_only = host_only ? 1 : 0; codes_only <= (reranks ? 1 : 0); codes_only++)
        for (int s = 1; s <= most; s++)
            if (GpuivfEstimateGpuBytes(meta, s, codes_only) <= limit)
            {
                pl.nshards = s;
                pl.codes_only = codes_only;
                return pl;
            }
    pl.nshards = most;
    pl.codes_only = reranks;
    return pl;
}

/* ------------------------------------------------------------- build */

/*
 * Submits a filled request and waits for it with no time limit (index
 * builds and exact-kNN answers are long); cancel still works.  True when
 * answered.
 */
bool
SubmitAndWaitUnlimited(GpuivfRequestSlot *slot)
{
    GpuivfSubmit(slot);
    return GpuivfWaitAnswer(slot, 0);
}
