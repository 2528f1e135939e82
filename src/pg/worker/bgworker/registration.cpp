/*
 * worker/bgworker/registration.cpp — the GPU worker's settings and its
 * registration: one background worker per GPU, registered by _PG_init when
 * the library is preloaded (shared_preload_libraries).  The postmaster never
 * touches CUDA: it counts GPUs from gpuivf.devices, CUDA_VISIBLE_DEVICES and
 * the driver's /proc entries only.
 */
#include "gpuivf.h"
#include "worker/worker.h"
#include "worker/protocol.h"
#include "worker/bgworker/bgworker.h"

#include <dirent.h>
#include <unistd.h>

/* settings */
char       *gpuivf_devices = NULL;
int         gpuivf_batch_delay = 0;
int         gpuivf_gpu_memory_limit = 0;
int         gpuivf_worker_timeout = 60000;
int         gpuivf_request_buffer = 128;
int         gpuivf_shards = 0;
int         gpuivf_search_streams = 16;
int         gpuivf_busy_codes_per_candidate = 16;
int         gpuivf_answer_spin = 150;
char       *gpuivf_engine_library = NULL;

int         GpuivfRegisteredWorkers = 0;

#define GPUIVF_RESTART_SECONDS  5

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
int
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
    DefineCustomIntVariable("gpuivf.busy_codes_per_candidate",
                            "Under load, codes a GPU scan block may scan for each candidate it keeps (0 = off: lists spread as on an idle GPU).",
                            "When other searches already run on the GPU, a search gives each scan block as many probed lists as keep its codes within this many per re-rank candidate: fewer, longer blocks where each keeps many candidates.  A search on an idle GPU spreads its lists over as many blocks as fill it.  The answers are the same.",
                            &gpuivf_busy_codes_per_candidate, 16, 0, 1000000, PGC_SIGHUP, 0,
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
                            "With more than one, the worker prepares and starts the next batch while the GPU still searches the previous ones; small batches only fill a large GPU together.  Each stream holds 256 MB of GPU memory.",
                            &gpuivf_search_streams, 16, 1, 32, PGC_POSTMASTER, 0,
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
