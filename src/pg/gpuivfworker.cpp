/*
 * gpuivfworker.cpp — the GPU background worker: settings, registration, the
 * engine loader, the main loop (adaptive batching), and the gpuivf_stat view.
 *
 * One worker per GPU, registered by _PG_init when the library is preloaded
 * (shared_preload_libraries).  The postmaster never touches CUDA: it counts
 * GPUs from gpuivf.devices, CUDA_VISIBLE_DEVICES and the driver's /proc
 * entries only.  Each worker dlopen()s $libdir/gpuivf_gpu.so (the GPU
 * engine, linked with the CUDA runtime and cuBLAS) and creates the one CUDA
 * context of its GPU; backends and the postmaster never load it.
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
#include "gpuivfworker.h"

#include <dirent.h>
#include <dlfcn.h>
#include <unistd.h>

#include "access/xact.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

/* settings */
char       *gpuivf_devices = NULL;
int         gpuivf_batch_delay = 0;
int         gpuivf_gpu_memory_limit = 0;
int         gpuivf_worker_timeout = 60000;
int         gpuivf_request_buffer = 128;
int         gpuivf_shards = 0;
int         gpuivf_search_streams = 4;
int         gpuivf_answer_spin = 150;
char       *gpuivf_engine_library = NULL;

int         GpuivfRegisteredWorkers = 0;
int         GpuivfMyWorker = -1;
GpuivfCudaApi GpuivfCuda;
gpuivf_cuda_resources *GpuivfCudaRes = NULL;
bool        GpuivfCudaBroken = false;

#define GPUIVF_RESTART_SECONDS  5

static int64 AutoMemoryLimit = 0;       /* 90% of the free memory at start */
#define GPUIVF_MAX_TAKE         4096    /* requests in one batch */

/* ------------------------------------------------------- registration */

/* Parse gpuivf.devices ("0,2,3"); returns how many, devices[] out. */
static int
ParseDeviceList(const char *list, int *devices, int max)
{
    int         n = 0;
    const char *p = list;

    while (p != NULL && *p != '\0' && n < max)
    {
        char       *end;
        long        v;

        while (*p == ' ' || *p == ',')
            p++;
        if (*p == '\0')
            break;
        v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 1024)
            ereport(ERROR,
                    (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                     errmsg("invalid value for parameter \"gpuivf.devices\": \"%s\"", list),
                     errhint("List CUDA device numbers separated by commas, e.g. '0,1', or leave it empty for all visible GPUs.")));
        devices[n++] = (int) v;
        p = end;
    }
    return n;
}

/* Count GPUs without CUDA: the driver's /proc entries (or /dev nodes),
 * bounded by CUDA_VISIBLE_DEVICES when it is set. */
static int
CountVisibleGpus(void)
{
    int         n = 0;
    DIR        *dir = opendir("/proc/driver/nvidia/gpus");
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");

    if (dir != NULL)
    {
        struct dirent *de;

        while ((de = readdir(dir)) != NULL)
            if (de->d_name[0] != '.')
                n++;
        closedir(dir);
    }
    if (n == 0)
    {
        char        path[32];

        for (int i = 0; i < GPUIVF_MAX_WORKERS; i++)
        {
            snprintf(path, sizeof(path), "/dev/nvidia%d", i);
            if (access(path, F_OK) == 0)
                n = i + 1;
        }
    }
    if (visible != NULL)
    {
        int         listed = 0;

        if (visible[0] != '\0' && strncmp(visible, "-1", 2) != 0)
        {
            listed = 1;
            for (const char *c = visible; *c; c++)
                if (*c == ',')
                    listed++;
        }
        n = Min(n, listed);
    }
    return Min(n, GPUIVF_MAX_WORKERS);
}

/* The CUDA device ordinal of worker i. */
static int
WorkerDevice(int worker)
{
    int         devices[GPUIVF_MAX_WORKERS];
    int         n = ParseDeviceList(gpuivf_devices, devices, GPUIVF_MAX_WORKERS);

    return worker < n ? devices[worker] : worker;
}

static void
RegisterWorkers(void)
{
    int         devices[GPUIVF_MAX_WORKERS];
    int         n = ParseDeviceList(gpuivf_devices, devices, GPUIVF_MAX_WORKERS);

    if (n == 0)
        n = CountVisibleGpus();
    /* with no GPU one worker still runs: it says so and answers nothing */
    n = Max(n, 1);
    GpuivfRegisteredWorkers = n;
    for (int i = 0; i < n; i++)
    {
        BackgroundWorker bgw;

        memset(&bgw, 0, sizeof(bgw));
        bgw.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
        bgw.bgw_start_time = BgWorkerStart_ConsistentState;
        bgw.bgw_restart_time = GPUIVF_RESTART_SECONDS;
        strlcpy(bgw.bgw_library_name, "gpuivf", BGW_MAXLEN);
        strlcpy(bgw.bgw_function_name, "GpuivfWorkerMain", BGW_MAXLEN);
        snprintf(bgw.bgw_name, BGW_MAXLEN, "gpuivf gpu worker %d", i);
        strlcpy(bgw.bgw_type, "gpuivf gpu worker", BGW_MAXLEN);
        bgw.bgw_main_arg = Int32GetDatum(i);
        RegisterBackgroundWorker(&bgw);
    }
}

/* _PG_init: settings everywhere; shared memory and workers when preloading. */
void
GpuivfWorkerInit(void)
{
    DefineCustomIntVariable("gpuivf.batch_delay",
                            "Microseconds the GPU worker waits for more queries before searching a batch.",
                            "0 (the default) searches at once; batches still grow under load.",
                            &gpuivf_batch_delay, 0, 0, 100000, PGC_SIGHUP, 0,
                            NULL, NULL, NULL);
    DefineCustomIntVariable("gpuivf.gpu_memory_limit",
                            "GPU memory the gpuivf index cache of each GPU worker may use (0 = 90% of the free memory).",
                            "Least recently used indexes are evicted to stay under it.",
                            &gpuivf_gpu_memory_limit, 0, 0, INT_MAX, PGC_SIGHUP, GUC_UNIT_KB,
                            NULL, NULL, NULL);
    DefineCustomIntVariable("gpuivf.worker_timeout",
                            "Longest wait for the GPU worker's answer (0 = no limit).",
                            "After it the query runs on the CPU (gpuivf.device = auto) or fails (gpu).",
                            &gpuivf_worker_timeout, 60000, 0, INT_MAX, PGC_USERSET, GUC_UNIT_MS,
                            NULL, NULL, NULL);

    DefineCustomIntVariable("gpuivf.answer_spin",
                            "Microseconds a backend looks for the GPU worker's answer, yielding its core between looks, before it sleeps.",
                            "0 sleeps on the latch at once.  Under load an answer takes a few hundred microseconds; longer looks only use CPU.",
                            &gpuivf_answer_spin, 150, 0, 1000000, PGC_USERSET, 0,
                            NULL, NULL, NULL);
    DefineCustomIntVariable("gpuivf.shards",
                            "Shards an index is split into across the GPU workers (0 = only when it does not fit one GPU, 1 = never).",
                            "A sharded index has list l on worker l % shards; every search asks every shard.",
                            &gpuivf_shards, 0, 0, GPUIVF_MAX_WORKERS, PGC_USERSET, 0,
                            NULL, NULL, NULL);

    /* the rest exists only with shared_preload_libraries: PostgreSQL
     * refuses PGC_POSTMASTER settings defined after start-up */
    if (!process_shared_preload_libraries_in_progress)
        return;
    DefineCustomStringVariable("gpuivf.devices",
                               "CUDA devices the gpuivf GPU workers use (empty = all visible).",
                               "One background worker runs per listed device, e.g. '0,1'.",
                               &gpuivf_devices, "", PGC_POSTMASTER, 0, NULL, NULL, NULL);
    DefineCustomIntVariable("gpuivf.request_buffer",
                            "Shared memory per backend for GPU worker requests.",
                            "Larger batches of queries are sent in several requests; a search of an index sharded over n GPUs gives each shard's request 1/n of it.",
                            &gpuivf_request_buffer, 128, 64, 65536, PGC_POSTMASTER, GUC_UNIT_KB,
                            NULL, NULL, NULL);
    DefineCustomIntVariable("gpuivf.search_streams",
                            "Searches each GPU worker keeps running on the GPU at once.",
                            "With more than one, the worker prepares and starts the next batch while the GPU still searches the previous ones.",
                            &gpuivf_search_streams, 4, 1, 8, PGC_POSTMASTER, 0,
                            NULL, NULL, NULL);
    DefineCustomBoolVariable("gpuivf.wake_thread",
                             "Whether a second thread of each GPU worker wakes the backends it answered.",
                             "Off: the worker's main thread makes the wake-up system calls itself, between searches.",
                             &gpuivf_wake_thread, true, PGC_POSTMASTER, 0, NULL, NULL, NULL);
    DefineCustomStringVariable("gpuivf.engine_library",
                               "GPU engine module the GPU workers load (empty = $libdir/gpuivf_gpu).",
                               "Tests point it at a CPU stand-in (test/gpu/fake_engine.cpp).",
                               &gpuivf_engine_library, "", PGC_POSTMASTER, GUC_NOT_IN_SAMPLE,
                               NULL, NULL, NULL);
    RegisterWorkers();
    GpuivfShmemRequest();
    GpuivfShmemStartup();
}

/* ------------------------------------------------------------- engine */

/* The SQLSTATE of a failed engine call; a device error also marks the
 * context lost. */
int
GpuivfCudaErrcode(const gpuivf_cuda_status &st)
{
    int         code;

    switch (st.code)
    {
        case GPUIVF_CUDA_OUT_OF_MEMORY:
            code = ERRCODE_OUT_OF_MEMORY;
            break;
        case GPUIVF_CUDA_CANCELED:
            code = ERRCODE_QUERY_CANCELED;
            break;
        case GPUIVF_CUDA_DEVICE_ERROR:
        case GPUIVF_CUDA_NO_DEVICE:
            GpuivfCudaBroken = true;
            code = ERRCODE_SYSTEM_ERROR;
            break;
        default:
            code = ERRCODE_INTERNAL_ERROR;
            break;
    }
    return code;
}

/* Raise a failed engine call; a device error also marks the context lost. */
void
GpuivfCheckCuda(const gpuivf_cuda_status &st, const char *what)
{
    int         code;

    if (st.code == GPUIVF_CUDA_OK)
        return;
    code = GpuivfCudaErrcode(st);
    ereport(ERROR,
            (errcode(code),
             errmsg("gpuivf GPU engine failed to %s: %s", what, st.message)));
}

/* dlopen the engine and resolve its functions; false with *why on failure. */
static bool
LoadEngine(char *why, Size whylen)
{
    char        path[MAXPGPATH];
    void       *handle;

    if (gpuivf_engine_library != NULL && gpuivf_engine_library[0] != '\0')
        strlcpy(path, gpuivf_engine_library, sizeof(path));
    else
        snprintf(path, sizeof(path), "%s/gpuivf_gpu%s", pkglib_path, DLSUFFIX);
    if (access(path, F_OK) != 0)
    {
        snprintf(why, whylen, "gpuivf was built without CUDA (%s does not exist)", path);
        return false;
    }
    handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL)
    {
        const char *err = dlerror();

        snprintf(why, whylen, "cannot load the GPU engine: %s", err ? err : path);
        return false;
    }
#define GPUIVF_RESOLVE(name) \
    do { \
        void *fn = dlsym(handle, #name); \
        if (fn == NULL) { \
            snprintf(why, whylen, "the GPU engine %s has no function %s", path, #name); \
            return false; \
        } \
        GpuivfCuda.name = (decltype(GpuivfCuda.name)) fn; \
    } while (0)
    GPUIVF_RESOLVE(gpuivf_cuda_device_count);
    GPUIVF_RESOLVE(gpuivf_cuda_resources_create);
    GPUIVF_RESOLVE(gpuivf_cuda_resources_destroy);
    GPUIVF_RESOLVE(gpuivf_cuda_set_cancel_hook);
    GPUIVF_RESOLVE(gpuivf_cuda_get_device_info);
    GPUIVF_RESOLVE(gpuivf_cuda_ivfpq_train);
    GPUIVF_RESOLVE(gpuivf_cuda_ivfpq_encode);
    GPUIVF_RESOLVE(gpuivf_cuda_kmeans_default_params);
    GPUIVF_RESOLVE(gpuivf_cuda_index_create);
    GPUIVF_RESOLVE(gpuivf_cuda_index_destroy);
    GPUIVF_RESOLVE(gpuivf_cuda_index_add_encoded);
    GPUIVF_RESOLVE(gpuivf_cuda_index_remove);
    GPUIVF_RESOLVE(gpuivf_cuda_index_get_stats);
    GPUIVF_RESOLVE(gpuivf_cuda_index_search);
    GPUIVF_RESOLVE(gpuivf_cuda_index_search_async);
    GPUIVF_RESOLVE(gpuivf_cuda_search_done);
    GPUIVF_RESOLVE(gpuivf_cuda_search_wait);
    GPUIVF_RESOLVE(gpuivf_cuda_exact_knn);
#undef GPUIVF_RESOLVE
    return true;
}

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
        xact = !GpuivfCopyIsCurrent(first, GpuivfGroupGeneration(slotnos, n));

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

/* ------------------------------------------------------- gpuivf_stat */

static const char *
WorkerStateName(int state)
{
    switch (state)
    {
        case GPUIVF_WORKER_STARTING:
            return "starting";
        case GPUIVF_WORKER_READY:
            return "ready";
        case GPUIVF_WORKER_NO_GPU:
            return "no gpu";
        case GPUIVF_WORKER_STOPPED:
            return "stopped";
        default:
            return "not started";
    }
}

extern "C" {
PG_FUNCTION_INFO_V1(gpuivf_stat);
}

/* gpuivf_stat(): one row per GPU worker (none when not preloaded). */
Datum
gpuivf_stat(PG_FUNCTION_ARGS)
{
    ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

    InitMaterializedSRF(fcinfo, 0);
    if (GpuivfShmem == NULL)
        return (Datum) 0;
    for (int i = 0; i < GpuivfShmem->nworkers; i++)
    {
        GpuivfWorkerSlot *w = &GpuivfShmem->workers[i];
        Datum       values[23];
        bool        nulls[23];
        int         state, pid, device, nindexes;
        int64       bytes;
        char        name[128];
        char        message[GPUIVF_MESSAGE_LEN];
        TimestampTz started;
        uint64      requests = pg_atomic_read_u64(&w->requests);
        uint64      queries = pg_atomic_read_u64(&w->queries);
        uint64      batches = pg_atomic_read_u64(&w->batches);
        uint64      fallbacks = pg_atomic_read_u64(&w->cpu_fallbacks);
        int         c = 0;

        SpinLockAcquire(&w->mutex);
        state = w->state;
        pid = w->pid;
        device = w->device;
        nindexes = w->nindexes;
        bytes = w->bytes_cached;
        started = w->started_at;
        strlcpy(name, w->device_name, sizeof(name));
        strlcpy(message, w->message, sizeof(message));
        SpinLockRelease(&w->mutex);
        if (i == 0)
            fallbacks += pg_atomic_read_u64(&GpuivfShmem->fallbacks_no_worker);

        memset(nulls, 0, sizeof(nulls));
        values[c++] = Int32GetDatum(i);
        values[c] = Int32GetDatum(pid);
        nulls[c++] = pid == 0;
        values[c++] = CStringGetTextDatum(WorkerStateName(state));
        values[c] = Int32GetDatum(device);
        nulls[c++] = device < 0;
        values[c] = CStringGetTextDatum(name);
        nulls[c++] = name[0] == '\0';
        values[c++] = Int64GetDatum((int64) requests);
        values[c++] = Int64GetDatum((int64) queries);
        values[c++] = Int64GetDatum((int64) batches);
        values[c] = Float8GetDatum(batches > 0 ? (double) queries / batches : 0.0);
        nulls[c++] = batches == 0;
        values[c++] = Int64GetDatum((int64) pg_atomic_read_u64(&w->max_batch));
        values[c] = Float8GetDatum(requests > 0 ?
                                   (double) pg_atomic_read_u64(&w->queue_us) / 1000.0 / requests : 0.0);
        nulls[c++] = requests == 0;
        values[c++] = Float8GetDatum((double) pg_atomic_read_u64(&w->gpu_us) / 1000.0);
        values[c++] = Int32GetDatum(nindexes);
        values[c++] = Int64GetDatum(bytes);
        values[c++] = Int64GetDatum((int64) fallbacks);
        values[c++] = Int64GetDatum((int64) pg_atomic_read_u64(&w->errors));
        values[c++] = Int64GetDatum((int64) pg_atomic_read_u64(&w->loads));
        values[c++] = Int64GetDatum((int64) pg_atomic_read_u64(&w->refreshes));
        values[c++] = Int64GetDatum((int64) pg_atomic_read_u64(&w->evictions));
        values[c++] = Int64GetDatum((int64) pg_atomic_read_u64(&w->builds));
        values[c++] = Int64GetDatum((int64) pg_atomic_read_u64(&w->exact_knn));
        values[c] = CStringGetTextDatum(message);
        nulls[c++] = message[0] == '\0';
        values[c] = TimestampTzGetDatum(started);
        nulls[c++] = started == 0;
        Assert(c == 23);
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
    return (Datum) 0;
}
