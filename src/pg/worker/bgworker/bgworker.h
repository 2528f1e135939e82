/*
 * worker/bgworker/bgworker.h — private to the GPU worker process's files:
 * the engine's function table (engine.cpp), the GPU-resident copies of
 * indexes (gpu_cache.cpp, gpu_sync.cpp), the search streams (streams.cpp),
 * the wake-up thread (waker.cpp), the build and exact-kNN answers
 * (serve_build.cpp) and the main loop's time breakdown (main.cpp).
 */
#ifndef GPUIVF_BGWORKER_H
#define GPUIVF_BGWORKER_H

#include "gpuivf.h"
#include "worker/protocol.h"
/*
 * engine.cpp: the engine, loaded in the worker only.  The functions of the
 * engine's C API the worker calls, listed once: the table's members and the
 * names LoadEngine resolves with dlsym both come from this list.
 */
#define GPUIVF_CUDA_FUNCTIONS(X) \
    X(gpuivf_cuda_device_count) \
    X(gpuivf_cuda_resources_create) \
    X(gpuivf_cuda_set_cancel_hook) \
    X(gpuivf_cuda_get_device_info) \
    X(gpuivf_cuda_ivfpq_train) \
    X(gpuivf_cuda_ivfpq_encode) \
    X(gpuivf_cuda_kmeans_default_params) \
    X(gpuivf_cuda_index_create) \
    X(gpuivf_cuda_index_destroy) \
    X(gpuivf_cuda_index_add_encoded) \
    X(gpuivf_cuda_index_remove) \
    X(gpuivf_cuda_index_get_stats) \
    X(gpuivf_cuda_index_search) \
    X(gpuivf_cuda_index_search_async) \
    X(gpuivf_cuda_search_done) \
    X(gpuivf_cuda_search_wait) \
    X(gpuivf_cuda_exact_knn)

typedef struct GpuivfCudaApi
{
#define GPUIVF_CUDA_MEMBER(name) decltype(&::name) name;
    GPUIVF_CUDA_FUNCTIONS(GPUIVF_CUDA_MEMBER)
#undef GPUIVF_CUDA_MEMBER
} GpuivfCudaApi;

extern GpuivfCudaApi GpuivfCuda;            /* valid in a READY worker */
extern gpuivf_cuda_resources *GpuivfCudaRes;
extern int  GpuivfMyWorker;                 /* worker number, -1 elsewhere */

/* registration.cpp: gpuivf.engine_library, and the CUDA device ordinal of
 * worker i (gpuivf.devices, else i) */
extern char *gpuivf_engine_library;
int         WorkerDevice(int worker);
/* A CUDA status as an ERROR; device errors also end the worker after the
 * current batch (the context may be unusable). */
void        GpuivfCheckCuda(const gpuivf_cuda_status &st, const char *what);
/* Its SQLSTATE (a device error marks the context lost), for errors
 * answered as data. */
int         GpuivfCudaErrcode(const gpuivf_cuda_status &st);
extern bool GpuivfCudaBroken;
/* engine.cpp: dlopen the engine and resolve its functions; false with
 * *why on failure */
bool        LoadEngine(char *why, Size whylen);
/* gpu_cache.cpp: the GPU-resident indexes of this worker */
typedef struct GpuivfCopyRef
{
    gpuivf_cuda_index *gindex;
    bool        stores_vectors; /* exact re-rank possible */
    int64       entries;
} GpuivfCopyRef;
void        GpuivfGpuCacheInit(void);
GpuivfCopyRef GpuivfGetCopyFor(const GpuivfRequestSlot *req, uint64 version);
bool        GpuivfCopyIsCurrent(const GpuivfRequestSlot *req, uint64 version);
/* LOAD: the request's index's copy, brought up to the request's version */
void        GpuivfServeLoad(int worker, int slotno);
void        GpuivfPublishCache(void);
/* waker.cpp: backends woken by a thread of the worker, not its main
 * thread (SetLatch is the one PostgreSQL call that thread makes) */
extern bool gpuivf_wake_thread;        /* gpuivf.wake_thread */
bool        GpuivfWakerStart(void);
void        GpuivfWakerStop(void);
void        GpuivfWakeBackend(Latch *latch);
/* streams.cpp: searches, on search streams when they can */
extern int  gpuivf_search_streams;      /* gpuivf.search_streams */
extern int  gpuivf_busy_codes_per_candidate;  /* gpuivf.busy_codes_per_candidate */
void        GpuivfSearchStreamsStart(int device, int nstreams);
bool        GpuivfServeSearchGroup(int worker, int *slotnos, int n);   /* true: answered later */
/* the newest version of the index's rows a search group's requests saw:
 * its copy must have reached it */
uint64      GpuivfGroupVersion(const int *slotnos, int n);
int         GpuivfSearchesInFlight(void);
bool        GpuivfFinishSearches(bool wait);
void        GpuivfDrainSearches(void);
void        GpuivfForgetSearches(void);

/*
 * Where a GPU worker's thread spends its time (seconds since the last
 * report), logged at DEBUG1 about every 2 s while it serves searches:
 * the worker's thread is what takes, starts and answers every backend's
 * requests, so this says what bounds its throughput.
 */
typedef struct GpuivfWorkerTimes
{
    double      take;           /* taking requests off the queue */
    double      prepare;        /* grouping, packing the queries */
    double      enqueue;        /* starting engine searches */
    double      gpu_wait;       /* blocked until a search finished */
    double      answer;         /* writing answers, waking backends */
    double      poll;           /* looking again while searches ran */
    double      idle;           /* nothing to do */
    int64       batches;
    int64       requests;
} GpuivfWorkerTimes;
extern GpuivfWorkerTimes GpuivfTimes;  /* added to by GpuivfAddSeconds */
/* serve_build.cpp: TRAIN and ENCODE (CREATE INDEX) */
void        GpuivfServeBuild(int worker, int slotno);
/* serve_build.cpp: EXACT_KNN (ANALYZE ground truth) */
void        GpuivfServeExactKnn(int worker, int slotno);

#endif                          /* GPUIVF_BGWORKER_H */
