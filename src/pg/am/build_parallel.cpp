/*
 * am/build_parallel.cpp — the build's heap scans run by several processes.
 *
 * PostgreSQL 15 has no amcanbuildparallel: like btree and pgvector's
 * ivfflat, ambuild itself asks plan_create_index_workers how many workers
 * the table deserves (max_parallel_maintenance_workers, the table's
 * parallel_workers, its size), creates a ParallelContext, and the workers
 * and the leader share one parallel heap scan (table_beginscan_parallel).
 * Each of the build's two scans gets a context of its own, and so does the
 * training on the CPU in between:
 *
 *   sampling: every participant offers its rows to the sample area in the
 *             context's shared memory (build_sample.cpp), sized before the
 *             launch from the dims of the first vector;
 *   training: the sample and the model being trained are in shared memory;
 *             every participant labels blocks of rows for each k-means
 *             iteration and trains PQ sub-quantizers, as the leader asks
 *             (build_train.cpp);
 *   encoding: the model is in shared memory; every participant encodes its
 *             rows (CPU engine, or its own GPU worker job), writes and logs
 *             its own vector pages, hands its entries to its part of a
 *             shared tuplesort (merged by the leader, as btree's and
 *             ivfflat's builds do) and flattens its calibration sample;
 *   truth:    the calibration's queries are in shared memory; every
 *             participant computes the exact top-k of the rows of the vector
 *             pages it claims (build_truth.cpp).
 *
 * Training on the GPU worker is the leader's alone.  maintenance_work_mem is shared
 * out as PostgreSQL's parallel builds do: each participant gets
 * maintenance_work_mem / (workers + 1).  When no worker can be launched the
 * build runs serially (the caller's path).
 */
#include "gpuivf.h"
#include "am/build.h"
#include "calibration/calibration.h"

#define PARALLEL_KEY_SHARED         UINT64CONST(0xB1F0000000000001)
#define PARALLEL_KEY_SAMPLE         UINT64CONST(0xB1F0000000000002)
#define PARALLEL_KEY_MODEL          UINT64CONST(0xB1F0000000000003)
#define PARALLEL_KEY_TUPLESORT      UINT64CONST(0xB1F0000000000004)
#define PARALLEL_KEY_CALIB          UINT64CONST(0xB1F0000000000005)
#define PARALLEL_KEY_QUERY_TEXT     UINT64CONST(0xB1F0000000000006)
#define PARALLEL_KEY_TRAIN          UINT64CONST(0xB1F0000000000007)
#define PARALLEL_KEY_TRUTH          UINT64CONST(0xB1F0000000000008)

#define PHASE_SAMPLE    1
#define PHASE_TRAIN     2
#define PHASE_ENCODE    3
#define PHASE_TRUTH     4

/* The context's shared state; a ParallelTableScanDesc follows it. */
typedef struct GpuivfBuildShared
{
    /* set before the launch */
    int         phase;
    Oid         heaprelid;
    Oid         indexrelid;
    bool        isconcurrent;
    int         participant_slots;  /* workers asked + the leader */
    GpuivfEncodeSpec spec;      /* encoding */
    Size        calib_bytes;    /* per participant, 0: no calibration sample */
    /* mutable, under mutex */
    slock_t     mutex;
    ConditionVariable donecv;
    int         participants_done;
    int         next_participant;
    double      reltuples;
    int64       encoded;
    bool        on_gpu;
    pg_atomic_uint64 progress;  /* rows encoded so far, every participant */
} GpuivfBuildShared;

#define ParallelScanOf(shared) \
    ((ParallelTableScanDesc) ((char *) (shared) + BUFFERALIGN(sizeof(GpuivfBuildShared))))

struct GpuivfParallelBuild
{
    ParallelContext *pcxt;
    Snapshot    snapshot;
    int         participants;   /* launched workers + the leader */
    GpuivfBuildShared *shared;
    Sharedsort *sharedsort;
};

int
GpuivfBuildWorkers(Relation heap, Relation index)
{
    /* a temporary table's pages are in the leader's local buffers */
    if (RELATION_IS_LOCAL(heap) && heap->rd_rel->relpersistence == RELPERSISTENCE_TEMP)
        return 0;
    return plan_create_index_workers(RelationGetRelid(heap), RelationGetRelid(index));
}

/* ------------------------------------------------------- the contexts */

/* Sizes of a context's chunks, besides the shared state. */
typedef struct ContextChunks
{
    Size        sample;
    Size        model;
    Size        sort;
    Size        calib;
    Size        area;           /* training's or the exact top-k's */
} ContextChunks;

/*
 * Create a context for nworkers, its shared state initialized for `phase`,
 * and launch the workers after init() filled the phase's chunks; NULL when
 * no DSM segment or no worker could be had (nothing is left behind).
 */
static GpuivfParallelBuild *
BeginParallel(Relation heap, Relation index, bool isconcurrent, int nworkers, int phase,
              const ContextChunks *chunks, const GpuivfEncodeSpec *spec,
              void (*init) (GpuivfParallelBuild *pb, shm_toc *toc, void *arg), void *arg)
{
    GpuivfParallelBuild *pb = (GpuivfParallelBuild *) palloc0(sizeof(GpuivfParallelBuild));
    ParallelContext *pcxt;
    Snapshot    snapshot;
    Size        est_shared;
    int         nkeys = 1;
    int         querylen = debug_query_string != NULL ? (int) strlen(debug_query_string) : 0;
    GpuivfBuildShared *shared;

    EnterParallelMode();
    pcxt = CreateParallelContext("gpuivf", "GpuivfParallelBuildMain", nworkers);
    snapshot = isconcurrent ? RegisterSnapshot(GetTransactionSnapshot()) : SnapshotAny;
    est_shared = add_size(BUFFERALIGN(sizeof(GpuivfBuildShared)),
                          table_parallelscan_estimate(heap, snapshot));
    shm_toc_estimate_chunk(&pcxt->estimator, est_shared);
    {
        const Size  bytes[] = {chunks->sample, chunks->model, chunks->sort, chunks->calib,
                               chunks->area};

        for (Size b : bytes)
            if (b > 0)
            {
                shm_toc_estimate_chunk(&pcxt->estimator, b);
                nkeys++;
            }
    }
    if (querylen > 0)
    {
        shm_toc_estimate_chunk(&pcxt->estimator, querylen + 1);
        nkeys++;
    }
    shm_toc_estimate_keys(&pcxt->estimator, nkeys);
    InitializeParallelDSM(pcxt);
    if (pcxt->seg == NULL)
    {
        if (IsMVCCSnapshot(snapshot))
            UnregisterSnapshot(snapshot);
        DestroyParallelContext(pcxt);
        ExitParallelMode();
        pfree(pb);
        return NULL;
    }

    shared = (GpuivfBuildShared *) shm_toc_allocate(pcxt->toc, est_shared);
    memset(shared, 0, sizeof(GpuivfBuildShared));
    shared->phase = phase;
    shared->heaprelid = RelationGetRelid(heap);
    shared->indexrelid = RelationGetRelid(index);
    shared->isconcurrent = isconcurrent;
    shared->participant_slots = nworkers + 1;
    if (spec != NULL)
        shared->spec = *spec;
    SpinLockInit(&shared->mutex);
    ConditionVariableInit(&shared->donecv);
    pg_atomic_init_u64(&shared->progress, 0);
    table_parallelscan_initialize(heap, ParallelScanOf(shared), snapshot);
    shm_toc_insert(pcxt->toc, PARALLEL_KEY_SHARED, shared);
    if (querylen > 0)
    {
        char       *q = (char *) shm_toc_allocate(pcxt->toc, querylen + 1);

        memcpy(q, debug_query_string, querylen + 1);
        shm_toc_insert(pcxt->toc, PARALLEL_KEY_QUERY_TEXT, q);
    }
    pb->pcxt = pcxt;
    pb->snapshot = snapshot;
    pb->shared = shared;
    init(pb, pcxt->toc, arg);

    LaunchParallelWorkers(pcxt);
    pb->participants = pcxt->nworkers_launched + 1;
    if (pcxt->nworkers_launched == 0)
    {
        GpuivfParallelEnd(pb);
        return NULL;
    }
    ereport(DEBUG1, (errmsg("gpuivf build of \"%s\" uses %d parallel workers",
                            RelationGetRelationName(index), pcxt->nworkers_launched)));
    return pb;
}

/* Every participant has reported (the leader counts as one). */
static void
WaitParticipants(GpuivfParallelBuild *pb)
{
    GpuivfBuildShared *shared = pb->shared;

    for (;;)
    {
        bool        done;

        SpinLockAcquire(&shared->mutex);
        done = shared->participants_done == pb->participants;
        SpinLockRelease(&shared->mutex);
        if (done)
            break;
        ConditionVariableSleep(&shared->donecv, WAIT_EVENT_PARALLEL_CREATE_INDEX_SCAN);
    }
    ConditionVariableCancelSleep();
}

static void
ReportDone(GpuivfBuildShared *shared, double reltuples, int64 encoded, bool on_gpu)
{
    SpinLockAcquire(&shared->mutex);
    shared->participants_done++;
    shared->reltuples += reltuples;
    shared->encoded += encoded;
    shared->on_gpu = shared->on_gpu || on_gpu;
    SpinLockRelease(&shared->mutex);
    ConditionVariableSignal(&shared->donecv);
}

void
GpuivfParallelEnd(GpuivfParallelBuild *pb)
{
    if (pb == NULL)
        return;
    WaitForParallelWorkersToFinish(pb->pcxt);
    if (IsMVCCSnapshot(pb->snapshot))
        UnregisterSnapshot(pb->snapshot);
    DestroyParallelContext(pb->pcxt);
    ExitParallelMode();
    pfree(pb);
}

/* ----------------------------------------------------------- sampling */

typedef struct SampleInit
{
    int         dims;
    int64       k;
    gpuivf::Metric metric;
    Size        bytes;
    GpuivfSampleArea *area;
} SampleInit;

static void
InitSampleChunks(GpuivfParallelBuild *pb, shm_toc *toc, void *arg)
{
    SampleInit *si = (SampleInit *) arg;

    si->area = GpuivfSampleAreaInit(shm_toc_allocate(toc, si->bytes), si->dims, si->k, si->metric,
                                    true);
    shm_toc_insert(toc, PARALLEL_KEY_SAMPLE, si->area);
}

bool
GpuivfParallelSample(Relation heap, Relation index, IndexInfo *indexInfo, int nworkers, int dims,
                     int64 k, gpuivf::Metric metric, double *reltuples, int64 *rows, float **sample,
                     int64 *sample_n)
{
    ContextChunks chunks;
    SampleInit  si;
    GpuivfParallelBuild *pb;
    TableScanDesc scan;
    double      mine;

    memset(&chunks, 0, sizeof(chunks));
    si.dims = dims;
    si.k = k;
    si.metric = metric;
    si.bytes = chunks.sample = GpuivfSampleAreaSize(dims, k);
    pb = BeginParallel(heap, index, indexInfo->ii_Concurrent, nworkers, PHASE_SAMPLE, &chunks, NULL,
                       InitSampleChunks, &si);
    if (pb == NULL)
        return false;

    /* the leader scans too */
    scan = table_beginscan_parallel(heap, ParallelScanOf(pb->shared));
    mine = GpuivfSampleScan(si.area, heap, index, indexInfo, scan, true);
    ReportDone(pb->shared, mine, 0, false);
    /* a worker that failed to start would never report: raise instead */
    WaitForParallelWorkersToAttach(pb->pcxt);
    WaitParticipants(pb);

    *reltuples = pb->shared->reltuples;
    *rows = GpuivfSampleAreaRows(si.area);
    *sample_n = GpuivfSampleAreaTake(si.area, sample);
    GpuivfParallelEnd(pb);
    return true;
}

/* ------------------------------------------------ training, exact top-k */

/* A context whose shared memory is one area (filled by init before the
 * workers start) that the leader has them work on by commands. */
typedef struct AreaInit
{
    Size        bytes;
    uint64      key;
    void        (*init) (void *mem, void *arg);
    void       *arg;
} AreaInit;

static void
InitAreaChunk(GpuivfParallelBuild *pb, shm_toc *toc, void *arg)
{
    AreaInit   *ai = (AreaInit *) arg;
    void       *mem = shm_toc_allocate(toc, ai->bytes);

    ai->init(mem, ai->arg);
    shm_toc_insert(toc, ai->key, mem);
}

static GpuivfParallelBuild *
BeginAreaContext(Relation heap, Relation index, bool isconcurrent, int nworkers, int phase,
                 uint64 key, Size bytes, void (*init) (void *mem, void *arg), void *arg,
                 int *participants)
{
    ContextChunks chunks;
    AreaInit    ai;
    GpuivfParallelBuild *pb;

    memset(&chunks, 0, sizeof(chunks));
    chunks.area = ai.bytes = bytes;
    ai.key = key;
    ai.init = init;
    ai.arg = arg;
    pb = BeginParallel(heap, index, isconcurrent, nworkers, phase, &chunks, NULL, InitAreaChunk,
                       &ai);
    *participants = pb != NULL ? pb->participants : 1;
    return pb;
}

typedef struct TrainInit
{
    GpuivfTrainArea *(*init) (void *mem, void *arg);
    void       *arg;
    GpuivfTrainArea *area;
} TrainInit;

static void
InitTrainArea(void *mem, void *arg)
{
    TrainInit  *ti = (TrainInit *) arg;

    ti->area = ti->init(mem, ti->arg);
}

GpuivfParallelBuild *
GpuivfParallelTrainBegin(Relation heap, Relation index, IndexInfo *indexInfo, int nworkers,
                         Size bytes, GpuivfTrainArea *(*init) (void *mem, void *arg), void *arg,
                         GpuivfTrainArea **area, int *participants)
{
    TrainInit   ti = {init, arg, NULL};
    GpuivfParallelBuild *pb;

    pb = BeginAreaContext(heap, index, indexInfo->ii_Concurrent, nworkers, PHASE_TRAIN,
                          PARALLEL_KEY_TRAIN, bytes, InitTrainArea, &ti, participants);
    *area = pb != NULL ? ti.area : NULL;
    return pb;
}

GpuivfParallelBuild *
GpuivfParallelTruthBegin(Relation heap, Relation index, bool isconcurrent, int nworkers,
                         Size bytes, void (*init) (void *mem, void *arg), void *arg,
                         int *participants)
{
    return BeginAreaContext(heap, index, isconcurrent, nworkers, PHASE_TRUTH, PARALLEL_KEY_TRUTH,
                            bytes, init, arg, participants);
}

/* ----------------------------------------------------------- encoding */

/* The model in shared memory: centroids, their norms, the codebook. */
static Size
ModelBytes(const GpuivfEncodeSpec *spec)
{
    return sizeof(float) * ((Size) spec->lists * spec->dims + spec->lists +
                            GpuivfCodebookFloats(spec->dims, spec->pq_m, spec->pq_bits));
}

static gpuivf::IvfPqModel
ModelIn(const GpuivfEncodeSpec *spec, const float *base)
{
    gpuivf::IvfPqModel m;

    m.metric = spec->metric;
    m.d = spec->dims;
    m.nlist = spec->lists;
    m.m = spec->pq_m;
    m.nbits = spec->pq_bits;
    m.centroids = base;
    m.centroid_norms = base + (Size) spec->lists * spec->dims;
    m.codebook = m.centroid_norms + spec->lists;
    return m;
}

typedef struct EncodeInit
{
    const gpuivf::IvfPqModel *model;
    ContextChunks chunks;
    char       *calib;
} EncodeInit;

static void
InitEncodeChunks(GpuivfParallelBuild *pb, shm_toc *toc, void *arg)
{
    EncodeInit *ei = (EncodeInit *) arg;
    const GpuivfEncodeSpec *spec = &pb->shared->spec;
    float      *m = (float *) shm_toc_allocate(toc, ei->chunks.model);
    Size        codebook = GpuivfCodebookFloats(spec->dims, spec->pq_m, spec->pq_bits);

    memcpy(m, ei->model->centroids, sizeof(float) * (Size) spec->lists * spec->dims);
    memcpy(m + (Size) spec->lists * spec->dims, ei->model->centroid_norms,
           sizeof(float) * spec->lists);
    memcpy(m + (Size) spec->lists * (spec->dims + 1), ei->model->codebook, sizeof(float) * codebook);
    shm_toc_insert(toc, PARALLEL_KEY_MODEL, m);

    pb->sharedsort = (Sharedsort *) shm_toc_allocate(toc, ei->chunks.sort);
    tuplesort_initialize_shared(pb->sharedsort, pb->shared->participant_slots, pb->pcxt->seg);
    shm_toc_insert(toc, PARALLEL_KEY_TUPLESORT, pb->sharedsort);

    if (ei->chunks.calib > 0)
    {
        ei->calib = (char *) shm_toc_allocate(toc, ei->chunks.calib);
        shm_toc_insert(toc, PARALLEL_KEY_CALIB, ei->calib);
        pb->shared->calib_bytes = ei->chunks.calib / pb->shared->participant_slots;
    }
    else
        ei->calib = NULL;
}

/*
 * One participant's encoding: its part of the heap, its vector pages, its
 * run of the shared tuplesort, its calibration sample flattened into its
 * slot.  The leader's part runs here too.
 */
static void
ParticipateEncode(GpuivfBuildShared *shared, Relation heap, Relation index, IndexInfo *indexInfo,
                  const gpuivf::IvfPqModel &model, Sharedsort *sharedsort, char *calib_area,
                  bool leader, GpuivfParallelEncodeResult *result)
{
    SortCoordinate coordinate = (SortCoordinate) palloc0(sizeof(SortCoordinateData));
    GpuivfEncoder *enc;
    TableScanDesc scan;
    double      reltuples;
    int64       n;
    const int32 *lists;
    const uint64 *ids;
    const uint8 *codes;
    Tuplesortstate *sort;
    int         me;

    coordinate->isWorker = true;
    coordinate->nParticipants = -1;
    coordinate->sharedsort = sharedsort;
    enc = GpuivfEncoderBegin(heap, index, MAIN_FORKNUM, &shared->spec, model, 0, coordinate);
    scan = table_beginscan_parallel(heap, ParallelScanOf(shared));
    reltuples = GpuivfEncoderScan(enc, indexInfo, scan, leader, &shared->progress);
    GpuivfEncoderFinish(enc);
    (void) GpuivfEncoderEntries(enc, &n, &lists, &ids, &codes, &sort);     /* performs its run */
    if (calib_area != NULL && GpuivfEncoderCalibSample(enc) != NULL)
    {
        SpinLockAcquire(&shared->mutex);
        me = shared->next_participant++;
        SpinLockRelease(&shared->mutex);
        GpuivfCalibSampleFlatten(GpuivfEncoderCalibSample(enc),
                                 calib_area + (Size) me * shared->calib_bytes);
    }
    if (result != NULL)
    {
        result->engine_seconds = GpuivfEncoderEngineSeconds(enc);
        result->last_vector_page = GpuivfEncoderLastVectorPage(enc);
    }
    ReportDone(shared, reltuples, GpuivfEncoderRows(enc), GpuivfEncoderOnGpu(enc));
    GpuivfEncoderEnd(enc);
}

bool
GpuivfParallelEncode(Relation heap, Relation index, IndexInfo *indexInfo, int nworkers,
                     const GpuivfEncodeSpec *spec, const gpuivf::IvfPqModel &model,
                     GpuivfCalibSample *calib, GpuivfParallelEncodeResult *result)
{
    EncodeInit  ei;
    GpuivfEncodeSpec s = *spec;
    GpuivfParallelBuild *pb;
    SortCoordinate coordinate;
    TupleDesc   desc;

    memset(&ei, 0, sizeof(ei));
    ei.model = &model;
    s.mem_bytes = (Size) maintenance_work_mem * 1024 / (nworkers + 1);
    s.calibrate = calib != NULL;
    ei.chunks.model = ModelBytes(&s);
    ei.chunks.sort = tuplesort_estimate_shared(nworkers + 1);
    ei.chunks.calib = calib != NULL ? GpuivfCalibSampleBytes(s.dims) * (nworkers + 1) : 0;
    pb = BeginParallel(heap, index, indexInfo->ii_Concurrent, nworkers, PHASE_ENCODE, &ei.chunks,
                       &s, InitEncodeChunks, &ei);
    if (pb == NULL)
        return false;

    ParticipateEncode(pb->shared, heap, index, indexInfo, model, pb->sharedsort, ei.calib, true,
                      result);
    WaitForParallelWorkersToAttach(pb->pcxt);
    /* progress: the leader's scan reports blocks; rows here */
    for (;;)
    {
        bool        done;

        pgstat_progress_update_param(PROGRESS_CREATEIDX_TUPLES_DONE,
                                     (int64) pg_atomic_read_u64(&pb->shared->progress));
        SpinLockAcquire(&pb->shared->mutex);
        done = pb->shared->participants_done == pb->participants;
        SpinLockRelease(&pb->shared->mutex);
        if (done)
            break;
        ConditionVariableTimedSleep(&pb->shared->donecv, 1000,
                                    WAIT_EVENT_PARALLEL_CREATE_INDEX_SCAN);
    }
    ConditionVariableCancelSleep();
    pgstat_progress_update_param(PROGRESS_CREATEIDX_TUPLES_DONE, pb->shared->encoded);

    for (int i = 0; ei.calib != NULL && i < pb->shared->next_participant; i++)
        GpuivfCalibSampleMerge(calib, ei.calib + (Size) i * pb->shared->calib_bytes);

    coordinate = (SortCoordinate) palloc0(sizeof(SortCoordinateData));
    coordinate->isWorker = false;
    coordinate->nParticipants = pb->participants;
    coordinate->sharedsort = pb->sharedsort;
    result->sort = GpuivfBeginEntrySort(s.code_size, maintenance_work_mem, coordinate, &desc);
    tuplesort_performsort(result->sort);

    result->participants = pb->participants;
    result->reltuples = pb->shared->reltuples;
    result->encoded = pb->shared->encoded;
    result->on_gpu = pb->shared->on_gpu;
    result->pb = pb;
    return true;
}

/* ----------------------------------------------------------- workers */

void
GpuivfParallelBuildMain(dsm_segment *seg, shm_toc *toc)
{
    GpuivfBuildShared *shared;
    const char *query;
    Relation    heap;
    Relation    index;
    LOCKMODE    heap_lock;
    LOCKMODE    index_lock;
    IndexInfo  *indexInfo;

    query = (const char *) shm_toc_lookup(toc, PARALLEL_KEY_QUERY_TEXT, true);
    debug_query_string = query;
    pgstat_report_activity(STATE_RUNNING, debug_query_string);
    gpuivf::init_blas_single_threaded();

    shared = (GpuivfBuildShared *) shm_toc_lookup(toc, PARALLEL_KEY_SHARED, false);
    /* the lock modes index.c holds for the leader */
    heap_lock = shared->isconcurrent ? ShareUpdateExclusiveLock : ShareLock;
    index_lock = shared->isconcurrent ? RowExclusiveLock : AccessExclusiveLock;
    heap = table_open(shared->heaprelid, heap_lock);
    index = index_open(shared->indexrelid, index_lock);
    indexInfo = BuildIndexInfo(index);
    indexInfo->ii_Concurrent = shared->isconcurrent;

    if (shared->phase == PHASE_SAMPLE)
    {
        GpuivfSampleArea *area = (GpuivfSampleArea *) shm_toc_lookup(toc, PARALLEL_KEY_SAMPLE,
                                                                     false);
        TableScanDesc scan = table_beginscan_parallel(heap, ParallelScanOf(shared));
        double      reltuples = GpuivfSampleScan(area, heap, index, indexInfo, scan, false);

        ReportDone(shared, reltuples, 0, false);
    }
    else if (shared->phase == PHASE_TRAIN)
        GpuivfTrainWorker((GpuivfTrainArea *) shm_toc_lookup(toc, PARALLEL_KEY_TRAIN, false));
    else if (shared->phase == PHASE_TRUTH)
        GpuivfTruthWorker((GpuivfTruthArea *) shm_toc_lookup(toc, PARALLEL_KEY_TRUTH, false), index);
    else
    {
        const float *m = (const float *) shm_toc_lookup(toc, PARALLEL_KEY_MODEL, false);
        Sharedsort *sharedsort = (Sharedsort *) shm_toc_lookup(toc, PARALLEL_KEY_TUPLESORT, false);
        char       *calib = (char *) shm_toc_lookup(toc, PARALLEL_KEY_CALIB, true);

        tuplesort_attach_shared(sharedsort, seg);
        ParticipateEncode(shared, heap, index, indexInfo, ModelIn(&shared->spec, m), sharedsort,
                          calib, false, NULL);
    }
    index_close(index, index_lock);
    table_close(heap, heap_lock);
}
