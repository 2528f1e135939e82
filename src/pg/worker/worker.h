/*
 * worker/worker.h — the GPU worker as the rest of src/pg sees it: its
 * registration, the requests a backend sends (searches, CREATE INDEX work,
 * exact kNN for ANALYZE) and what the workers publish.  Everything here runs
 * in a backend (worker/backend/) except GpuivfWorkerMain, the worker
 * process's entry (worker/bgworker/).  The shared-memory layout is private
 * (worker/protocol.h); the protocol is in README.md ("GPU worker").
 */
#ifndef GPUIVF_WORKER_H
#define GPUIVF_WORKER_H

#include "gpuivf.h"
/* _PG_init: the worker's settings; when preloading, its shared memory and
 * one background worker per GPU */
void        GpuivfWorkerInit(void);
/* the background worker's entry point (bgw_function_name) */
extern "C" {
PGDLLEXPORT void GpuivfWorkerMain(Datum main_arg);
Datum       gpuivf_stat(PG_FUNCTION_ARGS);
Datum       gpuivf_worker_search(PG_FUNCTION_ARGS);   /* worker_search.cpp */
}
/* gpuivf_index_info: appends "gpu_cache": [...] (where the index is cached) */
void        GpuivfAppendCacheInfo(StringInfo json, Relation index);
/* worker/backend/search.cpp */
bool        GpuivfWorkerAvailable(void);
/* may the GPU worker be asked to read this index's pages (search, load)?
 * Not a temporary one: its pages live in this backend's local buffers */
bool        GpuivfWorkerCanRead(Relation index);
/* The SQL function that asks the worker itself (gpuivf_worker_search), set
 * while it forces gpuivf.device = gpu for its own call: errors then name it
 * rather than the setting.  NULL otherwise. */
extern const char *GpuivfWorkerOnlyCaller;
/* false when no worker could serve (the caller falls back to the CPU under
 * gpuivf.device = auto); errors the worker reports are raised here.
 * Precisely: false under cpu; false for queries the GPU engine does not
 * take (GpuivfSearchBatch routes them to the CPU itself: untrained or
 * temporary index, exact mode = nprobe >= lists with stored vectors, k /
 * candidates / nprobe above GPUIVF_GPU_MAX_*); under auto also false when
 * no worker is ready or on any worker failure, and then its nq queries are
 * counted in gpuivf_stat.cpu_fallbacks; under gpu those raise here.  Each
 * query keeps its own k, nprobe and rerank on the worker, so its answer
 * never depends on the batch it rides in.  meta as for GpuivfSearchBatch
 * (NULL: read here).  *adc_candidates: the index's copies hold only codes
 * (it fits the GPUs no other way: README.md, "Larger than the GPU"); then
 * hits[i] are query i's max(k, rerank) best entries by ADC (their TIDs are
 * entry ids: vector tuple TIDs) for the caller to re-rank
 * (GpuivfRerankCandidates). */
bool        GpuivfWorkerSearch(Relation index, int nq, const GpuivfQuery *queries,
                               GpuivfHit **hits, int *nhits, GpuivfSearchStats *stats,
                               const GpuivfMetaPageData *meta, bool *adc_candidates);
/* CREATE INDEX on the GPU (worker/backend/build_jobs.cpp).  They return false (or NULL)
 * when no worker can do it (the build then runs on the CPU); errors are
 * raised.  Encoding runs in batches through one job (one DSM segment). */
bool        GpuivfWorkerTrain(Relation index, gpuivf::Metric metric, const float *sample,
                              int64 n, int dims, int lists, int pq_m, int pq_bits,
                              float *centroids, float *codebook);
typedef struct GpuivfEncodeJob GpuivfEncodeJob;
GpuivfEncodeJob *GpuivfWorkerEncodeBegin(const gpuivf::IvfPqModel &model, int64 batch_cap);
float      *GpuivfWorkerEncodeArea(GpuivfEncodeJob *job, int area);
bool        GpuivfWorkerEncodeSubmit(GpuivfEncodeJob *job, Relation index, int area, int64 n);
bool        GpuivfWorkerEncodeWait(GpuivfEncodeJob *job, Relation index, const int32 **lists,
                                   const uint8 **codes);
void        GpuivfWorkerEncodeEnd(GpuivfEncodeJob *job);
/* A GPU worker loads a fresh index's copy before the build's calibration
 * searches it; Start returns whether it asked, Wait waits for that answer.
 * Neither raises for a failed load. */
bool        GpuivfWorkerLoadStart(Relation index, const GpuivfMetaPageData *meta);
void        GpuivfWorkerLoadWait(Relation index);

/*
 * The GPU engine's limits per query (the same numbers as
 * cuda/include/gpuivf_cuda.h, checked there by worker/protocol.h).  Queries
 * above them run on the CPU under gpuivf.device = auto (counted in
 * gpuivf_stat.cpu_fallbacks) and raise GpuivfRaiseGpuLimit under gpu.
 */
#define GPUIVF_GPU_MAX_K        1024    /* rows, and re-rank candidates */
#define GPUIVF_GPU_MAX_NPROBE   1024    /* lists probed */

/* worker/backend/search.cpp: the name of the first GPU engine limit query exceeds
 * ("k", "candidates", "nprobe"), NULL when it fits */
const char *GpuivfGpuLimitExceeded(const GpuivfQuery *query);
/* ERROR (54000) naming that limit, for gpuivf.device = gpu */
void        GpuivfRaiseGpuLimit(Relation index, const GpuivfQuery *query);
/* worker/backend/requests.cpp: n queries (or GPU work requests) answered on the CPU
 * under gpuivf.device = auto because no worker could serve them; worker -1
 * when none was asked (shown in worker 0's row).  No-op unless preloaded. */
void        GpuivfCountCpuFallbacks(int worker, int64 n);

/*
 * worker/backend/exact_knn.cpp: exact kNN on the GPU worker (ANALYZE's ground truth,
 * GpuivfExactKnnForCalibration).  A job is a DSM segment holding the nq
 * queries and room for batch_cap base rows (*base: fill it, then Run).
 * Begin returns NULL when no worker can take it (gpuivf.device = cpu, no
 * ready worker, or the segment cannot be had): the caller computes on the
 * CPU.  Run computes the exact top-kk of every query among the n rows of
 * *base, in core exact_knn's format (internal scores ascending, base row
 * numbers, UINT64_MAX padding; the same bits: the engine re-scores with the
 * CPU's functions); false when the worker failed — under gpuivf.device =
 * gpu that raises instead — and the job is then dead (the caller finishes
 * on the CPU).
 */
typedef struct GpuivfExactKnnJob GpuivfExactKnnJob;
GpuivfExactKnnJob *GpuivfWorkerExactKnnBegin(Relation index, gpuivf::Metric metric, int dims,
                                             int nq, const float4 *queries, int kk,
                                             int64 batch_cap, float4 **base);
bool        GpuivfWorkerExactKnnRun(GpuivfExactKnnJob *job, int64 n, float *scores, uint64 *ids);
bool        GpuivfWorkerExactKnnDead(const GpuivfExactKnnJob *job);  /* a Run failed */
void        GpuivfWorkerExactKnnEnd(GpuivfExactKnnJob *job);
/*
 * worker/list_changes.cpp: a backend that changes a list page (an insert, a
 * new list page, VACUUM's deletions) calls Begin before its change and End
 * once it is done, so that the worker's catch-up walks only the lists that
 * changed (README.md, "Never stale").  No-ops without gpuivf's shared memory.
 */
/* removes: the change removes entries from the page (VACUUM) */
void        GpuivfListChangeBegin(Relation index, int list, bool removes);
void        GpuivfListChangeEnd(Relation index, int list, bool removes);
/* the worker: the list's change count when no change of it is under way,
 * else GPUIVF_LIST_UNSETTLED (read it before reading the list's pages);
 * the same for the index's changes that removed entries */
#define GPUIVF_LIST_UNSETTLED PG_UINT64_MAX
uint64      GpuivfListChangeCount(const RelFileNode *node, int list);
uint64      GpuivfListRemovalCount(const RelFileNode *node);
/* worker/queue.cpp's shared-memory hooks */
Size        GpuivfListChangesShmemBytes(void);
void        GpuivfListChangesShmemInit(void);

#endif                          /* GPUIVF_WORKER_H */
