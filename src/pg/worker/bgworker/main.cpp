/*
 * worker/bgworker/main.cpp — the GPU background worker's process: start-up
 * (its CUDA context), the main loop (adaptive batching) and its exit.
 *
 * A worker with no usable GPU (no driver, no device, CPU-only build) says
 * why once in the log and in gpuivf_stat, then sleeps: no crash loop, and
 * backends answer on the CPU.  A CUDA device error ends the worker after its
 * batch is answered (the context may be unusable); the postmaster starts it
 * again after bgw_restart_time.
 *
 * Batching: the worker takes every request waiting in the queue, groups them
 * by index, and makes one engine call per group and candidate count (each
 * query keeps its own k, nprobe and re-rank candidates).  Requests that
 * arrive while the GPU works wait in the queue and form the next batch, so
 * batches grow with the load and a lone query goes at once.
 * gpuivf.batch_delay (µs) optionally waits before taking a batch.
 */
#include "gpuivf.h"
#include "worker/worker.h"
#include "worker/protocol.h"
#include "worker/bgworker/bgworker.h"

int         GpuivfMyWorker = -1;
gpuivf_cuda_resources *GpuivfCudaRes = NULL;

static int64 AutoMemoryLimit = 0;       /* 90% of the free memory at start */
#define GPUIVF_MAX_TAKE         4096    /* requests in one batch */

/* Load the engine and create this worker's CUDA context on its device. */
static bool
StartEngine(GpuivfWorkerSlot *w, int device, char *why, Size whylen)
{
    gpuivf_cuda_status st;
    gpuivf_cuda_device_info info;
    int32       count = 0;
    int64       limit;

    if (!LoadEngine(why, whylen))
        return false;
    st = GpuivfCuda.gpuivf_cuda_device_count(&count);
    if (st.code != GPUIVF_CUDA_OK)
    {
        snprintf(why, whylen, "%s", st.message);
        return false;
    }
    if (count == 0)
    {
        snprintf(why, whylen, "no CUDA device is visible (no NVIDIA driver or GPU)");
        return false;
    }
    if (device >= count)
    {
        snprintf(why, whylen, "CUDA device %d does not exist (%d visible)", device, (int) count);
        return false;
    }
    st = GpuivfCuda.gpuivf_cuda_resources_create(device, 0, &GpuivfCudaRes);
    if (st.code != GPUIVF_CUDA_OK)
    {
        snprintf(why, whylen, "cannot use CUDA device %d: %s", device, st.message);
        return false;
    }
    /* before measuring the free memory: the streams take some */
    GpuivfSearchStreamsStart(device, gpuivf_search_streams);
    memset(&info, 0, sizeof(info));
    st = GpuivfCuda.gpuivf_cuda_get_device_info(GpuivfCudaRes, &info);
    if (st.code != GPUIVF_CUDA_OK)
    {
        snprintf(why, whylen, "cannot query CUDA device %d: %s", device, st.message);
        return false;
    }
    AutoMemoryLimit = (int64) ((double) Max(info.free_memory, (int64) 0) * 0.9);
    limit = gpuivf_gpu_memory_limit > 0 ? (int64) gpuivf_gpu_memory_limit * 1024
        : AutoMemoryLimit;
    SpinLockAcquire(&w->mutex);
    strlcpy(w->device_name, info.name, sizeof(w->device_name));
    w->memory_limit = limit;
    SpinLockRelease(&w->mutex);
    return true;
}

/* ---------------------------------------------------------- main loop */

/* before_shmem_exit: answer what we hold and mark the slot stopped. */
static void
WorkerExit(int code, Datum arg)
{
    int         worker = DatumGetInt32(arg);
    GpuivfWorkerSlot *w = &GpuivfShmem->workers[worker];
    uint64      incarnation;

    SpinLockAcquire(&w->mutex);
    incarnation = w->incarnation;
    w->state = GPUIVF_WORKER_STOPPED;
    w->pid = 0;
    w->latch = NULL;
    w->nindexes = 0;
    w->bytes_cached = 0;
    SpinLockRelease(&w->mutex);
    GpuivfFailTakenRequests(worker, incarnation, "the gpuivf GPU worker exited");
    /* after the last answers: the thread sets their latches, then ends */
    GpuivfWakerStop();
    /* the process and its CUDA context go away with it */
}

static void
SetWorkerState(GpuivfWorkerSlot *w, int state, const char *message)
{
    SpinLockAcquire(&w->mutex);
    w->state = state;
    if (message != NULL)
        strlcpy(w->message, message, sizeof(w->message));
    SpinLockRelease(&w->mutex);
}

/* Same search group: searches of one index, served together (one engine
 * call per candidate count, GpuivfServeSearchGroup). */
static bool
SameGroup(const GpuivfRequestSlot *a, const GpuivfRequestSlot *b)
{
    return a->kind == GPUIVF_KIND_SEARCH && b->kind == GPUIVF_KIND_SEARCH &&
        a->dboid == b->dboid && RelFileNodeEquals(a->node, b->node) &&
        a->indexoid == b->indexoid && a->train_id == b->train_id &&
        a->dims == b->dims && a->permanent == b->permanent &&
        a->nshards == b->nshards && a->shard == b->shard;
}

/*
 * Serve one group (or one build request) inside a transaction, so that
 * buffer pins and locks are released on error; an error becomes the answer
 * of every request of the group.  A search group whose GPU copy is loaded
 * and current reads no page, and is served without one (a transaction's
 * start and commit cost the worker's one thread about a microsecond a
 * search, a tenth of what it spends on one under load).
 */
static void
ServeGroup(int worker, int *slotnos, int n, MemoryContext batchcxt)
{
    GpuivfRequestSlot *first = &GpuivfShmem->slots[slotnos[0]];
    volatile bool later = false;
    bool        xact = true;

    if (first->kind == GPUIVF_KIND_SEARCH)
        xact = !GpuivfCopyIsCurrent(first, GpuivfGroupVersion(slotnos, n));

    PG_TRY();
    {
        if (xact)
            StartTransactionCommand();
        if (first->kind == GPUIVF_KIND_SEARCH)
            later = GpuivfServeSearchGroup(worker, slotnos, n);
        else
        {
            /* builds, exact kNN and loads use the main resources, which
             * the search streams share */
            GpuivfDrainSearches();
            if (first->kind == GPUIVF_KIND_EXACT_KNN)
                GpuivfServeExactKnn(worker, slotnos[0]);
            else if (first->kind == GPUIVF_KIND_LOAD)
                GpuivfServeLoad(worker, slotnos[0]);
            else
                GpuivfServeBuild(worker, slotnos[0]);
        }
        if (xact)
            CommitTransactionCommand();
    }
    PG_CATCH();
    {
        ErrorData  *edata;

        MemoryContextSwitchTo(batchcxt);
        edata = CopyErrorData();
        FlushErrorState();
        AbortCurrentTransaction();
        for (int i = 0; i < n; i++)
        {
            GpuivfRequestSlot *slot = &GpuivfShmem->slots[slotnos[i]];

            slot->result = GPUIVF_RESULT_ERROR;
            slot->sqlerrcode = edata->sqlerrcode;
            slot->fallback_ok = true;
            strlcpy(slot->message, edata->message ? edata->message : "unknown error",
                    sizeof(slot->message));
            strlcpy(slot->detail, edata->detail ? edata->detail : "", sizeof(slot->detail));
        }
        ereport(LOG,
                (errmsg("gpuivf GPU worker %d could not serve %d request(s): %s",
                        worker, n, edata->message ? edata->message : "unknown error")));
        FreeErrorData(edata);
        later = false;
    }
    PG_END_TRY();
    /* a group on a search stream is answered when the stream is done */
    if (!later)
        for (int i = 0; i < n; i++)
            GpuivfFinishRequest(worker, slotnos[i]);
}

/* Group the taken requests by index and serve each group. */
static void
ServeBatch(int worker, int *slotnos, int n, MemoryContext batchcxt)
{
    bool       *done = (bool *) palloc0(sizeof(bool) * n);
    int        *group = (int *) palloc(sizeof(int) * n);

    for (int i = 0; i < n; i++)
    {
        GpuivfRequestSlot *a = &GpuivfShmem->slots[slotnos[i]];
        int         g = 0;

        if (done[i])
            continue;
        group[g++] = slotnos[i];
        done[i] = true;
        if (a->kind == GPUIVF_KIND_SEARCH)
        {
            for (int j = i + 1; j < n; j++)
            {
                if (!done[j] && SameGroup(a, &GpuivfShmem->slots[slotnos[j]]))
                {
                    group[g++] = slotnos[j];
                    done[j] = true;
                }
            }
        }
        ServeGroup(worker, group, g, batchcxt);
        if (GpuivfCudaBroken)
        {
            /* the context may be unusable: answer the rest "gone" and restart */
            for (int j = 0; j < n; j++)
            {
                if (done[j])
                    continue;
                done[j] = true;
                GpuivfShmem->slots[slotnos[j]].result = GPUIVF_RESULT_WORKER_GONE;
                GpuivfShmem->slots[slotnos[j]].fallback_ok = true;
                strlcpy(GpuivfShmem->slots[slotnos[j]].message,
                        "the gpuivf GPU worker hit a CUDA error and restarts",
                        GPUIVF_MESSAGE_LEN);
                GpuivfFinishRequest(worker, slotnos[j]);
            }
            return;
        }
    }
}

/* A worker without a usable GPU: say why once, then sleep until stopped. */
static void
IdleWithoutGpu(int worker, const char *why)
{
    ereport(LOG,
            (errmsg("gpuivf GPU worker %d has no usable GPU: %s", worker, why),
             errdetail("gpuivf scans and index builds run on the CPU.")));
    pgstat_report_activity(STATE_IDLE, NULL);
    for (;;)
    {
        (void) WaitLatch(MyLatch, WL_LATCH_SET | WL_EXIT_ON_PM_DEATH, -1L, PG_WAIT_EXTENSION);
        ResetLatch(MyLatch);
        CHECK_FOR_INTERRUPTS();
        if (ConfigReloadPending)
        {
            ConfigReloadPending = false;
            ProcessConfigFile(PGC_SIGHUP);
        }
    }
}

/* SIGHUP: the settings again, and the memory limit they give. */
static void
ReloadConfigIfPending(GpuivfWorkerSlot *w)
{
    if (!ConfigReloadPending)
        return;
    ConfigReloadPending = false;
    ProcessConfigFile(PGC_SIGHUP);
    SpinLockAcquire(&w->mutex);
    w->memory_limit = gpuivf_gpu_memory_limit > 0
        ? (int64) gpuivf_gpu_memory_limit * 1024 : AutoMemoryLimit;
    SpinLockRelease(&w->mutex);
}

/* ------------------------------------------------ time breakdown */

GpuivfWorkerTimes GpuivfTimes;
static instr_time t_loop;       /* the main loop's clock */
static instr_time t_report;     /* the last report */

#define GPUIVF_TIMES_REPORT_S   2.0

/* The DEBUG1 breakdown, about every GPUIVF_TIMES_REPORT_S while busy. */
static void
ReportTimes(int worker, instr_time *last)
{
    instr_time  now;
    instr_time  d;
    double      s;
    GpuivfWorkerTimes *t = &GpuivfTimes;

    INSTR_TIME_SET_CURRENT(now);
    d = now;
    INSTR_TIME_SUBTRACT(d, *last);
    s = INSTR_TIME_GET_DOUBLE(d);
    if (s < GPUIVF_TIMES_REPORT_S)
        return;
    if (t->batches > 0)
        elog(DEBUG1, "gpuivf GPU worker %d in %.1f s: %lld searches of %lld requests; "
             "take %.0f ms, prepare %.0f ms, engine start %.0f ms, waiting for the GPU %.0f ms, "
             "answer %.0f ms, polling %.0f ms, idle %.0f ms",
             worker, s, (long long) t->batches, (long long) t->requests, 1000 * t->take,
             1000 * t->prepare, 1000 * t->enqueue, 1000 * t->gpu_wait, 1000 * t->answer,
             1000 * t->poll, 1000 * t->idle);
    memset(t, 0, sizeof(*t));
    *last = now;
}

/* What pg_stat_activity was last told (true: so that the first idle is) */
static bool reported_running = true;

/* The background worker's entry point. */
void
GpuivfWorkerMain(Datum main_arg)
{
    int         worker = DatumGetInt32(main_arg);
    GpuivfWorkerSlot *w;
    int         device;
    char        why[GPUIVF_MESSAGE_LEN];
    int        *slotnos;
    MemoryContext batchcxt;
    sigjmp_buf  local_sigjmp_buf;

    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    pqsignal(SIGTERM, die);
    BackgroundWorkerUnblockSignals();
    /* no database: the worker reads pages of every database by relfilenode */
    BackgroundWorkerInitializeConnection(NULL, NULL, 0);

    if (GpuivfShmem == NULL || worker < 0 || worker >= GpuivfShmem->nworkers)
        proc_exit(0);
    GpuivfMyWorker = worker;
    w = &GpuivfShmem->workers[worker];
    device = WorkerDevice(worker);
    SpinLockAcquire(&w->mutex);
    w->incarnation++;
    w->state = GPUIVF_WORKER_STARTING;
    w->pid = MyProcPid;
    w->latch = MyLatch;
    w->device = device;
    w->message[0] = '\0';
    w->device_name[0] = '\0';
    w->nindexes = 0;
    w->bytes_cached = 0;
    w->started_at = GetCurrentTimestamp();
    SpinLockRelease(&w->mutex);
    before_shmem_exit(WorkerExit, Int32GetDatum(worker));

    if (!StartEngine(w, device, why, sizeof(why)))
    {
        SetWorkerState(w, GPUIVF_WORKER_NO_GPU, why);
        IdleWithoutGpu(worker, why);
    }
    ereport(LOG,
            (errmsg("gpuivf GPU worker %d serves CUDA device %d (%s), index cache limit %lld MB",
                    worker, device, w->device_name, (long long) (w->memory_limit >> 20))));
    GpuivfGpuCacheInit();
    (void) GpuivfWakerStart();
    slotnos = (int *) MemoryContextAlloc(TopMemoryContext, sizeof(int) * GPUIVF_MAX_TAKE);
    batchcxt = AllocSetContextCreate(TopMemoryContext, "gpuivf worker batch",
                                     ALLOCSET_DEFAULT_SIZES);
    SetWorkerState(w, GPUIVF_WORKER_READY, "");

    /* an error outside a group (e.g. a cancel) is logged and the loop goes on */
    if (sigsetjmp(local_sigjmp_buf, 1) != 0)
    {
        HOLD_INTERRUPTS();
        EmitErrorReport();
        AbortOutOfAnyTransaction();
        FlushErrorState();
        GpuivfForgetSearches();
        GpuivfFailTakenRequests(worker, w->incarnation, "the gpuivf GPU worker hit an error");
        MemoryContextSwitchTo(TopMemoryContext);
        MemoryContextReset(batchcxt);
        RESUME_INTERRUPTS();
        if (GpuivfCudaBroken)
            proc_exit(1);
    }
    PG_exception_stack = &local_sigjmp_buf;

    INSTR_TIME_SET_CURRENT(t_loop);
    INSTR_TIME_SET_CURRENT(t_report);
    for (;;)
    {
        int         n;
        bool        in_flight = GpuivfSearchesInFlight() > 0;

        ReportTimes(worker, &t_report);

        /* idle before the last look, so a submitter that finds us idle
         * wakes us (with searches in flight we look again anyway) */
        if (!in_flight)
        {
            pg_atomic_write_u32(&w->idle, 1);
            pg_memory_barrier();
        }
        INSTR_TIME_SET_CURRENT(t_loop);
        n = GpuivfTakeRequests(worker, slotnos, GPUIVF_MAX_TAKE);
        if (n == 0 && in_flight)
        {
            /* the GPU works: answer what it finished, else look again */
            if (!GpuivfFinishSearches(false))
            {
                pg_spin_delay();
                GpuivfAddSeconds(&GpuivfTimes.poll, &t_loop);
            }
            if (GpuivfCudaBroken)
            {
                ereport(LOG,
                        (errmsg("gpuivf GPU worker %d restarts after a CUDA error", worker)));
                proc_exit(1);
            }
            CHECK_FOR_INTERRUPTS();
            ReloadConfigIfPending(w);
            continue;
        }
        if (n == 0)
        {
            if (reported_running)
                pgstat_report_activity(STATE_IDLE, NULL);
            reported_running = false;
            (void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 10000L,
                             PG_WAIT_EXTENSION);
            ResetLatch(MyLatch);
            GpuivfAddSeconds(&GpuivfTimes.idle, &t_loop);
            CHECK_FOR_INTERRUPTS();
            ReloadConfigIfPending(w);
            continue;
        }
        /* written only when it changes: backends read idle at every
         * submit, and a store dirties their copies of the line */
        if (pg_atomic_read_u32(&w->idle) != 0)
            pg_atomic_write_u32(&w->idle, 0);
        GpuivfAddSeconds(&GpuivfTimes.take, &t_loop);
        if (gpuivf_batch_delay > 0 && n < GPUIVF_MAX_TAKE)
        {
            pg_usleep(gpuivf_batch_delay);
            n += GpuivfTakeRequests(worker, slotnos + n, GPUIVF_MAX_TAKE - n);
        }
        /* reported when it changes: the report writes the backend status
         * entry (a clock read and its change count) */
        if (!reported_running)
            pgstat_report_activity(STATE_RUNNING, "gpuivf batch");
        reported_running = true;
        MemoryContextSwitchTo(batchcxt);
        ServeBatch(worker, slotnos, n, batchcxt);
        MemoryContextSwitchTo(TopMemoryContext);
        MemoryContextReset(batchcxt);
        if (GpuivfCudaBroken)
        {
            ereport(LOG,
                    (errmsg("gpuivf GPU worker %d restarts after a CUDA error", worker)));
            proc_exit(1);
        }
        CHECK_FOR_INTERRUPTS();
    }
}
