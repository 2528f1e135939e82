/*
 * am/build.cpp — ambuild and ambuildempty.
 *
 * CREATE INDEX / REINDEX:
 *   1. metapage placeholder at block 0;
 *   2. scan the heap once, keeping a reservoir sample of prepared vectors
 *      (dims come from the first non-NULL vector, every later one must match);
 *   3. no rows: write an untrained metapage (NOTICE with HINT) and stop;
 *   4. k-means on the sample (coarse centroids), residuals against the
 *      nearest centroid, PQ codebooks on the residuals; raw pages for both;
 *   5. scan the heap again, encoding batches (ivfpq_encode, GEMM, or the GPU
 *      worker through one DSM segment) and writing vector tuples in heap
 *      order; the (list, id, code) entries stay in memory when they fit in
 *      half of maintenance_work_mem, else (or once they outgrow it) they go
 *      to a tuplesort;
 *   6. order the entries by (list, id) (a counting sort on the list, or the
 *      tuplesort), write each list's entries as one chain of consecutive
 *      pages, then the directory, then the final metapage;
 *   7. log every page with log_newpage_range when the index needs WAL.
 * Pages are written without WAL through storage/page.cpp's build writer.
 * The engine runs with no buffer lock held; it polls GpuivfShouldCancel and
 * returns kCanceled, after which we let CHECK_FOR_INTERRUPTS raise.
 */
#include "gpuivf.h"
#include "am/am.h"
#include "calibration/calibration.h"
#include "storage/storage.h"
#include "worker/worker.h"

#include <cmath>

#include "access/relscan.h"
#include "access/tableam.h"
#include "catalog/index.h"
#include "catalog/pg_operator_d.h"
#include "catalog/pg_type_d.h"
#include "commands/progress.h"
#include "common/pg_prng.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "optimizer/plancat.h"
#include "port.h"
#include "utils/backend_progress.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/timestamp.h"
#include "utils/tuplesort.h"

/* Fixed seeds: the same heap and options always give the same index. */
#define GPUIVF_SAMPLE_SEED  UINT64CONST(0x6770756976660001)
#define GPUIVF_TRAIN_SEED   UINT64CONST(0x6770756976660002)

#define GPUIVF_MIN_SAMPLE           25600   /* rows, whatever the lists */
#define GPUIVF_SAMPLE_PER_LIST      50
#define GPUIVF_ENCODE_BATCH         4096    /* rows per ivfpq_encode call */

typedef struct GpuivfBuildState
{
    Relation    heap;
    Relation    index;
    ForkNumber  forknum;
    gpuivf::Metric metric;
    GpuivfOptions *opts;
    int         dims;           /* 0 until the first non-NULL vector */

    /* sampling scan */
    int64       rows;           /* non-NULL vectors seen */
    int64       sample_target;
    int64       sample_cap;     /* target bounded by maintenance_work_mem */
    int64       sample_n;
    float      *sample;         /* sample_cap * dims, prepared space */
    pg_prng_state prng;

    /* model */
    int         lists;
    int         pq_m;
    int         pq_bits;
    int         code_size;
    float      *centroids;
    float      *centroid_norms;
    float      *codebook;
    gpuivf::IvfPqModel model;

    /* encoding scan */
    bool        stores_vectors; /* rerank: vector tuples + entries point at them */
    int         batch_cap;
    int         batch_n;        /* rows in the area being filled */
    int         cur;            /* the area the scan fills */
    float      *area_raw[2];    /* as given; with the GPU worker, in its DSM segment */
    ItemPointerData *area_tids[2];
    int         pending_n;      /* > 0: area 1 - cur (that many rows) is being
                                 * encoded by the worker */
    float      *batch_prep;     /* prepared, for the CPU engine */
    int32      *labels;         /* the CPU engine's answer */
    uint8      *codes;
    GpuivfVectorTuple *vtuple;  /* one reusable vector tuple */
    GpuivfEncodeJob *encode_job; /* encoding on the GPU worker, or NULL */
    GpuivfCalibSample *calib;   /* calibration's queries, drawn from the
                                 * encoded rows (NULL: calibration off) */

    /* the (list, id, code) entries: in memory when they fit (sorted by a
     * counting sort on the list), else in a tuplesort */
    bool        mem_entries;
    int64       mem_n;
    int64       mem_cap;
    Size        mem_budget;
    int32      *mem_lists;
    uint64     *mem_ids;
    uint8      *mem_codes;
    bytea      *code_datum;     /* one reusable code for the sort */
    Tuplesortstate *sort;
    TupleDesc   sortdesc;
    TupleTableSlot *putslot;
    GpuivfPageWriter vecw;
    int64       encoded;

    /* seconds per phase, for the DEBUG1 summary (GpuivfAddSeconds from
     * phase_start, which each phase's end moves on) */
    instr_time  phase_start;
    double      t_sample, t_train, t_encode, t_engine, t_lists, t_wal, t_calibrate;
    double      t_load_wait;    /* of t_wal: waiting for the worker's load */
    bool        engine_on_gpu;

    MemoryContext rowctx;       /* reset after every row */
} GpuivfBuildState;

/* The cancel hook every long engine call gets. */
static gpuivf::CancelHook
BuildCancelHook(void)
{
    gpuivf::CancelHook hook;

    hook.should_cancel = GpuivfShouldCancel;
    hook.arg = NULL;
    return hook;
}

/* pg_stat_progress_create_index.subphase names. */
char *
gpuivfbuildphasename(int64 phasenum)
{
    switch (phasenum)
    {
        case PROGRESS_CREATEIDX_SUBPHASE_INITIALIZE:
            return (char *) "initializing";
        case GPUIVF_PHASE_SAMPLE:
            return (char *) "sampling table";
        case GPUIVF_PHASE_KMEANS:
            return (char *) "training coarse quantizer";
        case GPUIVF_PHASE_PQ:
            return (char *) "training product quantizer";
        case GPUIVF_PHASE_ENCODE:
            return (char *) "encoding vectors";
        case GPUIVF_PHASE_WRITE:
            return (char *) "writing lists";
        default:
            return NULL;
    }
}

/* pq_m for dims: the option when it divides dims, automatic when 0. */
int
GpuivfResolvePqM(Relation index, int pq_m_option, int dims)
{
    if (pq_m_option == 0)
        return gpuivf::pq_auto_m(dims);
    if (pq_m_option > dims || dims % pq_m_option != 0 || pq_m_option > gpuivf::kMaxPqM)
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                 errmsg("pq_m must divide the number of dimensions"),
                 errdetail("Index \"%s\" has pq_m = %d and its vectors have %d dimensions.",
                           RelationGetRelationName(index), pq_m_option, dims),
                 errhint("Choose a divisor of %d for pq_m, or set pq_m = 0 to choose one automatically.",
                         dims)));
    return pq_m_option;
}

/* A metapage with nothing trained: dims 0 until a first row fixes them. */
static void
FillUntrainedMeta(Relation index, GpuivfOptions *opts, GpuivfMetaPageData *meta)
{
    memset(meta, 0, sizeof(*meta));
    meta->magic = GPUIVF_MAGIC;
    meta->version = GPUIVF_FORMAT_VERSION;
    meta->metric = (uint16) GpuivfGetMetric(index);
    meta->flags = opts->rerank ? GPUIVF_META_RERANK : 0;
    meta->pq_bits = (uint16) opts->pq_bits;
    meta->generation = 1;
    meta->centroid_start = InvalidBlockNumber;
    meta->codebook_start = InvalidBlockNumber;
    meta->directory_start = InvalidBlockNumber;
    meta->vector_insert_page = InvalidBlockNumber;
}

/* A fresh, non-zero identifier of one trained model (caches key on it). */
static uint64
NewTrainId(void)
{
    uint64      id = 0;

    if (!pg_strong_random(&id, sizeof(id)))
        id = (uint64) GetCurrentTimestamp() ^ ((uint64) MyProcPid << 32);
    return id != 0 ? id : 1;
}

/* ------------------------------------------------------------ sampling */

/* Fix dims on the first vector and size the reservoir for them. */
static void
AcceptFirstDims(GpuivfBuildState *bs, int dims)
{
    Size        budget = (Size) maintenance_work_mem * 1024 / 2;
    int64       cap = (int64) (budget / ((Size) dims * sizeof(float)));

    GpuivfCheckMaxDims(dims);
    bs->dims = dims;
    bs->sample_cap = Max((int64) 1, Min(bs->sample_target, cap));
    bs->sample = (float *) palloc_extended((Size) bs->sample_cap * dims * sizeof(float),
                                           MCXT_ALLOC_HUGE);
}

/* table_index_build_scan callback of the sampling scan (Algorithm R). */
static void
SampleCallback(Relation index, ItemPointer tid, Datum *values, bool *isnull,
               bool tupleIsAlive, void *arg)
{
    GpuivfBuildState *bs = (GpuivfBuildState *) arg;
    const float4 *x;
    int         dims;
    int64       slot;

    x = GpuivfRowVector(values, isnull, bs->rowctx, &dims);
    if (x == NULL)
        return;
    if (bs->dims == 0)
        AcceptFirstDims(bs, dims);
    else
        GpuivfCheckDims(bs->dims, dims);

    slot = GpuivfReservoirSlot(&bs->prng, bs->sample_n, bs->sample_cap, bs->rows);
    if (slot == bs->sample_n)
        bs->sample_n++;
    if (slot >= 0)
        gpuivf::prepare_vector(bs->metric, x, bs->sample + slot * bs->dims, bs->dims);
    bs->rows++;
    MemoryContextReset(bs->rowctx);
}

/* Rows the planner would guess for the heap, to size the sample. */
static double
EstimateHeapRows(Relation heap)
{
    BlockNumber pages;
    double      tuples;
    double      allvisfrac;

    estimate_rel_size(heap, NULL, &pages, &tuples, &allvisfrac);
    return tuples;
}

/* ------------------------------------------------------------ training */

/* k-means, residuals, PQ codebooks; frees the sample. */
static void
TrainModel(GpuivfBuildState *bs)
{
    gpuivf::CancelHook cancel = BuildCancelHook();
    gpuivf::KMeansParams params = gpuivf::kmeans_default_params();
    int64       n = bs->sample_n;
    int         d = bs->dims;
    int32      *labels;
    Size        codebook_floats;

    pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, GPUIVF_PHASE_KMEANS);
    params.seed = GPUIVF_TRAIN_SEED;
    bs->centroids = (float *) palloc_extended((Size) bs->lists * d * sizeof(float),
                                              MCXT_ALLOC_HUGE);
    bs->centroid_norms = (float *) palloc((Size) bs->lists * sizeof(float));
    codebook_floats = GpuivfCodebookFloats(d, bs->pq_m, bs->pq_bits);
    bs->codebook = (float *) palloc_extended(codebook_floats * sizeof(float), MCXT_ALLOC_HUGE);

    /* k-means + PQ on the GPU worker when one can;
     * same format, the CPU below otherwise (gpuivf.device decides) */
    if (GpuivfWorkerTrain(bs->index, bs->metric, bs->sample, n, d, bs->lists, bs->pq_m,
                          bs->pq_bits, bs->centroids, bs->codebook))
    {
        gpuivf::row_norms(bs->centroids, bs->lists, d, bs->centroid_norms);
        pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, GPUIVF_PHASE_PQ);
    }
    else
    {
        GpuivfRaiseStatus(gpuivf::kmeans_train(bs->sample, n, d, bs->lists, params, bs->centroids,
                                               &cancel));
        gpuivf::row_norms(bs->centroids, bs->lists, d, bs->centroid_norms);

        pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, GPUIVF_PHASE_PQ);
        labels = (int32 *) palloc_extended((Size) n * sizeof(int32), MCXT_ALLOC_HUGE);
        GpuivfRaiseStatus(gpuivf::assign_nearest(bs->centroids, bs->centroid_norms, bs->lists, d,
                                                 bs->sample, n, labels, NULL, &cancel));
        for (int64 i = 0; i < n; i++)
        {
            float      *x = bs->sample + i * d;
            const float *c = bs->centroids + (int64) labels[i] * d;

            for (int j = 0; j < d; j++)
                x[j] -= c[j];
        }
        GpuivfRaiseStatus(gpuivf::pq_train(bs->sample, n, d, bs->pq_m, bs->pq_bits, GPUIVF_TRAIN_SEED,
                                           bs->codebook, &cancel));
        pfree(labels);
    }
    pfree(bs->sample);
    bs->sample = NULL;
    /* the engines check this themselves; whichever trained, an index never
     * gets a centroid or codebook value a search cannot use */
    if (!gpuivf::components_within(bs->centroids, (int64) bs->lists * d, gpuivf::kMaxModelComponent) ||
        !gpuivf::components_within(bs->codebook, (int64) codebook_floats, gpuivf::kMaxModelComponent))
        ereport(ERROR,
                (errcode(ERRCODE_INTERNAL_ERROR),
                 errmsg("training gpuivf index \"%s\" produced a centroid or codebook value that is not finite",
                        RelationGetRelationName(bs->index))));

    bs->model.metric = bs->metric;
    bs->model.d = d;
    bs->model.nlist = bs->lists;
    bs->model.m = bs->pq_m;
    bs->model.nbits = bs->pq_bits;
    bs->model.centroids = bs->centroids;
    bs->model.centroid_norms = bs->centroid_norms;
    bs->model.codebook = bs->codebook;
}

/* ------------------------------------------------------------ encoding */

/* Sort (list, id) with the code as payload. */
static void
StartSort(GpuivfBuildState *bs)
{
    AttrNumber  attnums[2] = {1, 2};
    Oid         sortops[2] = {Int4LessOperator, Int8LessOperator};
    Oid         collations[2] = {InvalidOid, InvalidOid};
    bool        nullsfirst[2] = {false, false};

    bs->sortdesc = CreateTemplateTupleDesc(3);
    TupleDescInitEntry(bs->sortdesc, (AttrNumber) 1, "list", INT4OID, -1, 0);
    TupleDescInitEntry(bs->sortdesc, (AttrNumber) 2, "id", INT8OID, -1, 0);
    TupleDescInitEntry(bs->sortdesc, (AttrNumber) 3, "code", BYTEAOID, -1, 0);
    bs->sort = tuplesort_begin_heap(bs->sortdesc, 2, attnums, sortops, collations, nullsfirst,
                                    maintenance_work_mem, NULL, TUPLESORT_NONE);
    bs->putslot = MakeSingleTupleTableSlot(bs->sortdesc, &TTSOpsVirtual);
}

/* Hand one entry to the tuplesort. */
static void
SortPut(GpuivfBuildState *bs, int32 list, uint64 id, const uint8 *code)
{
    TupleTableSlot *slot = bs->putslot;

    memcpy(VARDATA(bs->code_datum), code, bs->code_size);
    ExecClearTuple(slot);
    slot->tts_values[0] = Int32GetDatum(list);
    slot->tts_values[1] = Int64GetDatum((int64) id);
    slot->tts_values[2] = PointerGetDatum(bs->code_datum);
    slot->tts_isnull[0] = slot->tts_isnull[1] = slot->tts_isnull[2] = false;
    ExecStoreVirtualTuple(slot);
    tuplesort_puttupleslot(bs->sort, slot);
}

/* Bytes per in-memory entry: list, id, code, and WriteLists' order. */
static Size
MemEntryBytes(const GpuivfBuildState *bs)
{
    return sizeof(int32) + sizeof(uint64) + (Size) bs->code_size + sizeof(int64);
}

/* Room for n entries in memory (within the budget), else false. */
static bool
MemReserve(GpuivfBuildState *bs, int64 n)
{
    int64       cap;

    if (n <= bs->mem_cap)
        return true;
    cap = Max(n, bs->mem_cap + bs->mem_cap / 4);
    if ((Size) cap * MemEntryBytes(bs) > bs->mem_budget)
        cap = n;
    if ((Size) cap * MemEntryBytes(bs) > bs->mem_budget)
        return false;
    if (bs->mem_lists == NULL)
    {
        bs->mem_lists = (int32 *) palloc_extended(sizeof(int32) * cap, MCXT_ALLOC_HUGE);
        bs->mem_ids = (uint64 *) palloc_extended(sizeof(uint64) * cap, MCXT_ALLOC_HUGE);
        bs->mem_codes = (uint8 *) palloc_extended((Size) bs->code_size * cap, MCXT_ALLOC_HUGE);
    }
    else
    {
        bs->mem_lists = (int32 *) repalloc_huge(bs->mem_lists, sizeof(int32) * cap);
        bs->mem_ids = (uint64 *) repalloc_huge(bs->mem_ids, sizeof(uint64) * cap);
        bs->mem_codes = (uint8 *) repalloc_huge(bs->mem_codes, (Size) bs->code_size * cap);
    }
    bs->mem_cap = cap;
    return true;
}

/* The entries outgrew the budget: move them into a tuplesort. */
static void
SpillToSort(GpuivfBuildState *bs)
{
    StartSort(bs);
    for (int64 i = 0; i < bs->mem_n; i++)
        SortPut(bs, bs->mem_lists[i], bs->mem_ids[i], bs->mem_codes + (Size) i * bs->code_size);
    pfree(bs->mem_lists);
    pfree(bs->mem_ids);
    pfree(bs->mem_codes);
    bs->mem_lists = NULL;
    bs->mem_ids = NULL;
    bs->mem_codes = NULL;
    bs->mem_entries = false;
}

/* Buffers of the encoding batches, bounded by a quarter of
 * maintenance_work_mem (raw and prepared rows; with the GPU worker two
 * areas of raw rows);
 * the entries stay in memory when the rows seen by the sampling scan fit in
 * half of it (the sample is gone by now).  With the GPU worker the raw rows
 * go straight into its DSM segment's two areas. */
static void
StartEncoding(GpuivfBuildState *bs)
{
    bool        worker = GpuivfWorkerAvailable();
    Size        per_row = (Size) bs->dims * sizeof(float) * (worker ? 3 : 2) + bs->code_size + 16;
    Size        budget = (Size) maintenance_work_mem * 1024 / 4;
    int64       cap = (int64) (budget / per_row);

    /* the GPU worker wants bigger batches */
    bs->batch_cap = (int) Max((int64) 64, Min(worker ? (int64) 65536 : (int64) GPUIVF_ENCODE_BATCH, cap));
    bs->batch_n = 0;
    bs->cur = 0;
    bs->pending_n = 0;
    bs->encode_job = GpuivfWorkerEncodeBegin(bs->model, bs->batch_cap);
    if (bs->encode_job != NULL)
    {
        for (int a = 0; a < 2; a++)
        {
            bs->area_raw[a] = GpuivfWorkerEncodeArea(bs->encode_job, a);
            bs->area_tids[a] = (ItemPointerData *) palloc((Size) bs->batch_cap * sizeof(ItemPointerData));
        }
    }
    else
    {
        bs->area_raw[0] = (float *) palloc((Size) bs->batch_cap * bs->dims * sizeof(float));
        bs->area_tids[0] = (ItemPointerData *) palloc((Size) bs->batch_cap * sizeof(ItemPointerData));
        bs->area_raw[1] = NULL;
        bs->area_tids[1] = NULL;
    }
    bs->batch_prep = (float *) palloc((Size) bs->batch_cap * bs->dims * sizeof(float));
    bs->labels = (int32 *) palloc((Size) bs->batch_cap * sizeof(int32));
    bs->codes = (uint8 *) palloc((Size) bs->batch_cap * bs->code_size);
    bs->vtuple = (GpuivfVectorTuple *) palloc0(GPUIVF_VECTOR_TUPLE_SIZE(bs->dims));
    bs->code_datum = (bytea *) palloc0(VARHDRSZ + bs->code_size);
    SET_VARSIZE(bs->code_datum, VARHDRSZ + bs->code_size);
    GpuivfWriterInit(&bs->vecw, bs->index, bs->forknum, GPUIVF_PAGE_VECTOR, false);
    bs->encoded = 0;
    bs->calib = GpuivfCalibSampleBegin(bs->dims);

    bs->mem_budget = (Size) maintenance_work_mem * 1024 / 2;
    bs->mem_n = bs->mem_cap = 0;
    bs->mem_lists = NULL;
    bs->mem_ids = NULL;
    bs->mem_codes = NULL;
    bs->mem_entries = MemReserve(bs, Max(bs->rows + bs->rows / 16, (int64) 64));
    if (!bs->mem_entries)
        StartSort(bs);
}

/* Encode n raw rows with the CPU engine into bs->labels / bs->codes
 * (prepared: bs->batch_prep already holds their prepared copies). */
static void
EncodeOnCpu(GpuivfBuildState *bs, const float *raw, int n, bool prepared)
{
    gpuivf::CancelHook cancel = BuildCancelHook();

    if (!prepared)
        for (int i = 0; i < n; i++)
            gpuivf::prepare_vector(bs->metric, raw + (Size) i * bs->dims,
                                   bs->batch_prep + (Size) i * bs->dims, bs->dims);
    GpuivfRaiseStatus(gpuivf::ivfpq_encode(bs->model, bs->batch_prep, n, bs->labels, bs->codes,
                                           &cancel));
}

/* Write an encoded batch's vector tuples and keep or sort its entries. */
static void
ProcessBatch(GpuivfBuildState *bs, const float *raw, const ItemPointerData *tids, int n,
             const int32 *labels, const uint8 *codes)
{
    Size        vsize = GPUIVF_VECTOR_TUPLE_SIZE(bs->dims);

    if (bs->mem_entries && !MemReserve(bs, bs->mem_n + n))
        SpillToSort(bs);
    for (int i = 0; i < n; i++)
    {
        ItemPointerData id_tid = tids[i];
        const uint8 *code = codes + (Size) i * bs->code_size;

        if (bs->stores_vectors)
        {
            bs->vtuple->heaptid = tids[i];
            memcpy(bs->vtuple->x, raw + (Size) i * bs->dims, sizeof(float) * bs->dims);
            GpuivfWriterAdd(&bs->vecw, bs->vtuple, vsize, &id_tid);
        }
        if (bs->calib != NULL)
        {
            ItemPointerData heap_tid = tids[i];

            GpuivfCalibSampleAdd(bs->calib, raw + (Size) i * bs->dims, GpuivfTidToId(&id_tid),
                                 GpuivfTidToId(&heap_tid));
        }
        if (bs->mem_entries)
        {
            bs->mem_lists[bs->mem_n] = labels[i];
            bs->mem_ids[bs->mem_n] = GpuivfTidToId(&id_tid);
            memcpy(bs->mem_codes + (Size) bs->mem_n * bs->code_size, code, bs->code_size);
            bs->mem_n++;
        }
        else
            SortPut(bs, labels[i], GpuivfTidToId(&id_tid), code);
    }
    GpuivfWriterPause(&bs->vecw);
    bs->encoded += n;
    pgstat_progress_update_param(PROGRESS_CREATEIDX_TUPLES_DONE, bs->encoded);
}

/* Wait for the batch the GPU worker is encoding and process it (encoded on
 * the CPU instead when the worker failed under gpuivf.device = auto). */
static void
FinishPending(GpuivfBuildState *bs)
{
    int         area = 1 - bs->cur;
    const int32 *labels;
    const uint8 *codes;
    instr_time  t0;
    int         n = bs->pending_n;

    if (n == 0)
        return;
    bs->pending_n = 0;
    INSTR_TIME_SET_CURRENT(t0);
    if (GpuivfWorkerEncodeWait(bs->encode_job, bs->index, &labels, &codes))
        bs->engine_on_gpu = true;
    else
    {
        EncodeOnCpu(bs, bs->area_raw[area], n, false);
        labels = bs->labels;
        codes = bs->codes;
    }
    GpuivfAddSeconds(&bs->t_engine, &t0);
    ProcessBatch(bs, bs->area_raw[area], bs->area_tids[area], n, labels, codes);
}

/*
 * The area being filled is full (or the scan ended).  With the GPU worker:
 * wait for the other area's batch and process it, then hand this one to
 * the worker and let the scan fill the other area meanwhile; the batches
 * are processed in scan order either way, so the pages are the same.
 * Without it: encode on the CPU and process.  No lock is held.
 */
static void
FlushBatch(GpuivfBuildState *bs)
{
    int         n = bs->batch_n;
    instr_time  t0;

    if (n == 0)
        return;
    if (bs->encode_job != NULL)
    {
        bool        submitted;

        FinishPending(bs);
        INSTR_TIME_SET_CURRENT(t0);
        submitted = GpuivfWorkerEncodeSubmit(bs->encode_job, bs->index, bs->cur, n);
        GpuivfAddSeconds(&bs->t_engine, &t0);
        if (submitted)
        {
            bs->pending_n = n;
            bs->cur = 1 - bs->cur;
            bs->batch_n = 0;
            return;
        }
    }
    INSTR_TIME_SET_CURRENT(t0);
    EncodeOnCpu(bs, bs->area_raw[bs->cur], n, bs->encode_job == NULL);
    GpuivfAddSeconds(&bs->t_engine, &t0);
    ProcessBatch(bs, bs->area_raw[bs->cur], bs->area_tids[bs->cur], n, bs->labels, bs->codes);
    bs->batch_n = 0;
}

/* table_index_build_scan callback of the encoding scan. */
static void
EncodeCallback(Relation index, ItemPointer tid, Datum *values, bool *isnull,
               bool tupleIsAlive, void *arg)
{
    GpuivfBuildState *bs = (GpuivfBuildState *) arg;
    const float4 *x;
    int         dims;
    int         i;

    x = GpuivfRowVector(values, isnull, bs->rowctx, &dims);
    if (x == NULL)
        return;
    GpuivfCheckDims(bs->dims, dims);
    i = bs->batch_n++;
    memcpy(bs->area_raw[bs->cur] + (Size) i * bs->dims, x, sizeof(float) * bs->dims);
    /* the CPU engine's prepared copy (the GPU worker prepares its own) */
    if (bs->encode_job == NULL)
        gpuivf::prepare_vector(bs->metric, x, bs->batch_prep + (Size) i * bs->dims, bs->dims);
    bs->area_tids[bs->cur][i] = *tid;
    MemoryContextReset(bs->rowctx);
    if (bs->batch_n == bs->batch_cap)
        FlushBatch(bs);
}

/* Where WriteLists is: the chain being written and its list. */
typedef struct ListWriter
{
    GpuivfPageWriter pw;
    GpuivfListEntry *entry;
    Size        esize;
    int         cur;            /* list of the chain being written, or -1 */
    int64       written;
} ListWriter;

/* Append one entry; entries come in (list, id) order. */
static void
ListWriterAdd(ListWriter *w, GpuivfListDirEntry *dir, int list, uint64 id, const uint8 *code,
              int code_size)
{
    if (list != w->cur)
    {
        if (w->cur >= 0)
            dir[w->cur].tail = dir[w->cur].insert_page = w->pw.blkno;
        GpuivfWriterNewChain(&w->pw);
        w->cur = list;
    }
    GpuivfIdToTid(id, &w->entry->tid);
    memcpy(w->entry->code, code, code_size);
    GpuivfWriterAdd(&w->pw, w->entry, w->esize, NULL);
    if (dir[list].head == InvalidBlockNumber)
        dir[list].head = w->pw.chain_head;
    dir[list].count++;
    if (++w->written % 4096 == 0)
        CHECK_FOR_INTERRUPTS();
}

/* qsort_arg comparator: entry positions by id. */
static int
CompareEntryIds(const void *a, const void *b, void *arg)
{
    const uint64 *ids = (const uint64 *) arg;
    uint64      x = ids[*(const int64 *) a];
    uint64      y = ids[*(const int64 *) b];

    return x < y ? -1 : (x > y ? 1 : 0);
}

/* The in-memory entries in (list, id) order: a counting sort on the list
 * (stable, so each list keeps scan order, which is id order unless a
 * synchronized scan started mid-table; then that list is sorted). */
static int64 *
OrderMemEntries(GpuivfBuildState *bs)
{
    int64      *start = (int64 *) palloc0(sizeof(int64) * (bs->lists + 1));
    int64      *order = (int64 *) palloc_extended(sizeof(int64) * Max(bs->mem_n, (int64) 1),
                                                  MCXT_ALLOC_HUGE);

    for (int64 i = 0; i < bs->mem_n; i++)
    {
        int32       l = bs->mem_lists[i];

        if (l < 0 || l >= bs->lists)
            elog(ERROR, "gpuivf build encoded an entry into list %d of %d", l, bs->lists);
        start[l + 1]++;
    }
    for (int l = 0; l < bs->lists; l++)
        start[l + 1] += start[l];
    {
        int64      *next = (int64 *) palloc(sizeof(int64) * bs->lists);

        memcpy(next, start, sizeof(int64) * bs->lists);
        for (int64 i = 0; i < bs->mem_n; i++)
            order[next[bs->mem_lists[i]]++] = i;
        pfree(next);
    }
    for (int l = 0; l < bs->lists; l++)
    {
        for (int64 i = start[l] + 1; i < start[l + 1]; i++)
        {
            if (bs->mem_ids[order[i]] < bs->mem_ids[order[i - 1]])
            {
                qsort_arg(order + start[l], start[l + 1] - start[l], sizeof(int64),
                          CompareEntryIds, bs->mem_ids);
                break;
            }
        }
    }
    pfree(start);
    return order;
}

/* Write every list as one chain, in list order; fills dir[lists]. */
static void
WriteLists(GpuivfBuildState *bs, GpuivfListDirEntry *dir)
{
    ListWriter  w;

    pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, GPUIVF_PHASE_WRITE);
    for (int l = 0; l < bs->lists; l++)
    {
        dir[l].head = dir[l].tail = dir[l].insert_page = InvalidBlockNumber;
        dir[l].count = 0;
    }
    w.esize = GPUIVF_LIST_ENTRY_SIZE(bs->code_size);
    w.entry = (GpuivfListEntry *) palloc0(w.esize);
    w.cur = -1;
    w.written = 0;
    GpuivfWriterInit(&w.pw, bs->index, bs->forknum, GPUIVF_PAGE_LIST, true);
    if (bs->mem_entries)
    {
        int64      *order = OrderMemEntries(bs);

        for (int64 i = 0; i < bs->mem_n; i++)
        {
            int64       e = order[i];

            ListWriterAdd(&w, dir, bs->mem_lists[e], bs->mem_ids[e],
                          bs->mem_codes + (Size) e * bs->code_size, bs->code_size);
        }
        pfree(order);
    }
    else
    {
        TupleTableSlot *slot = MakeSingleTupleTableSlot(bs->sortdesc, &TTSOpsMinimalTuple);

        tuplesort_performsort(bs->sort);
        while (tuplesort_gettupleslot(bs->sort, true, false, slot, NULL))
        {
            bool        isnull;
            int         list = DatumGetInt32(slot_getattr(slot, 1, &isnull));
            uint64      id = (uint64) DatumGetInt64(slot_getattr(slot, 2, &isnull));
            bytea      *code = DatumGetByteaPP(slot_getattr(slot, 3, &isnull));

            if (list < 0 || list >= bs->lists || VARSIZE_ANY_EXHDR(code) != (Size) bs->code_size)
                elog(ERROR, "gpuivf build sorted an invalid entry");
            ListWriterAdd(&w, dir, list, id, (const uint8 *) VARDATA_ANY(code), bs->code_size);
        }
        ExecDropSingleTupleTableSlot(slot);
        tuplesort_end(bs->sort);
        bs->sort = NULL;
    }
    if (w.cur >= 0)
        dir[w.cur].tail = dir[w.cur].insert_page = w.pw.blkno;
    GpuivfWriterFinish(&w.pw);
    pfree(w.entry);
}

/* ------------------------------------------------------------ the build */

/* Pick lists and pq_m for the rows seen; NOTICE when lists outnumber rows. */
static void
ResolveModelShape(GpuivfBuildState *bs)
{
    bs->lists = bs->opts->lists > 0 ? bs->opts->lists : gpuivf::auto_lists(bs->rows);
    bs->lists = Min(bs->lists, gpuivf::kMaxLists);
    bs->pq_m = GpuivfResolvePqM(bs->index, bs->opts->pq_m, bs->dims);
    bs->pq_bits = bs->opts->pq_bits;
    bs->code_size = gpuivf::pq_code_size(bs->pq_m, bs->pq_bits);
    if (bs->rows < bs->lists)
        ereport(NOTICE,
                (errmsg("gpuivf index \"%s\" has fewer rows than lists",
                        RelationGetRelationName(bs->index)),
                 errdetail("The table has %lld rows with a vector for %d lists, so some lists stay empty and recall suffers.",
                           (long long) bs->rows, bs->lists),
                 errhint("Create the index after loading the data, or choose fewer lists.")));
}

/* Build a trained index: model pages, vectors, lists, directory, meta. */
static void
BuildTrained(GpuivfBuildState *bs, IndexInfo *indexInfo, double *reltuples)
{
    GpuivfMetaPageData meta;
    GpuivfListDirEntry *dir;
    Size        codebook_floats;

    ResolveModelShape(bs);
    TrainModel(bs);
    GpuivfAddSeconds(&bs->t_train, &bs->phase_start);

    FillUntrainedMeta(bs->index, bs->opts, &meta);
    meta.flags |= GPUIVF_META_TRAINED;
    meta.dims = (uint32) bs->dims;
    meta.lists = (uint32) bs->lists;
    meta.pq_m = (uint16) bs->pq_m;
    meta.pq_bits = (uint16) bs->pq_bits;
    meta.code_size = (uint16) bs->code_size;
    meta.train_id = NewTrainId();
    codebook_floats = GpuivfCodebookFloats(bs->dims, bs->pq_m, bs->pq_bits);
    GpuivfWriteRawPages(bs->index, bs->forknum, GPUIVF_PAGE_CENTROIDS, bs->centroids,
                        (Size) bs->lists * bs->dims * sizeof(float), &meta.centroid_start,
                        &meta.centroid_pages);
    GpuivfWriteRawPages(bs->index, bs->forknum, GPUIVF_PAGE_CODEBOOK, bs->codebook,
                        codebook_floats * sizeof(float), &meta.codebook_start,
                        &meta.codebook_pages);

    pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, GPUIVF_PHASE_ENCODE);
    pgstat_progress_update_param(PROGRESS_CREATEIDX_TUPLES_TOTAL, bs->rows);
    bs->stores_vectors = bs->opts->rerank;
    StartEncoding(bs);
    *reltuples = table_index_build_scan(bs->heap, bs->index, indexInfo, true, true,
                                        EncodeCallback, (void *) bs, NULL);
    FlushBatch(bs);
    FinishPending(bs);
    GpuivfWorkerEncodeEnd(bs->encode_job);
    bs->encode_job = NULL;
    meta.vector_insert_page = bs->vecw.blkno;
    GpuivfWriterFinish(&bs->vecw);
    GpuivfAddSeconds(&bs->t_encode, &bs->phase_start);

    dir = (GpuivfListDirEntry *) palloc_extended((Size) bs->lists * sizeof(GpuivfListDirEntry),
                                                 MCXT_ALLOC_HUGE);
    WriteLists(bs, dir);
    GpuivfWriteRawPages(bs->index, bs->forknum, GPUIVF_PAGE_DIRECTORY, dir,
                        (Size) bs->lists * sizeof(GpuivfListDirEntry), &meta.directory_start,
                        &meta.directory_pages);
    meta.vectors = (uint64) bs->encoded;
    GpuivfBuildPutMeta(bs->index, bs->forknum, &meta);
    /* the writers' unused pages are in the FSM: make them findable */
    if (bs->forknum == MAIN_FORKNUM)
        FreeSpaceMapVacuum(bs->index);
    GpuivfAddSeconds(&bs->t_lists, &bs->phase_start);
}

/*
 * Is the table a Citus distributed or reference table (a row of Citus's
 * pg_dist_partition)?  Its rows live in shards on the workers, each with its
 * own index, and the coordinator's table stays empty: the empty index there
 * is no reason for a NOTICE.  Read without depending on Citus: nothing is
 * found where the catalog does not exist.
 */
static bool
IsCitusTable(Oid relid)
{
    Oid         catalog = get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE);
    Relation    rel;
    ScanKeyData key;
    SysScanDesc scan;
    bool        found;

    if (!OidIsValid(catalog))
        return false;
    rel = table_open(catalog, AccessShareLock);
    /* its first column, logicalrelid, is the table's regclass */
    if (RelationGetDescr(rel)->natts < 1 ||
        TupleDescAttr(RelationGetDescr(rel), 0)->atttypid != REGCLASSOID)
    {
        table_close(rel, AccessShareLock);
        return false;
    }
    ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(relid));
    scan = systable_beginscan(rel, InvalidOid, false, NULL, 1, &key);
    found = HeapTupleIsValid(systable_getnext(scan));
    systable_endscan(scan);
    table_close(rel, AccessShareLock);
    return found;
}

/* The heap has no vector: an untrained index that REINDEX will train. */
static void
BuildUntrained(GpuivfBuildState *bs)
{
    GpuivfMetaPageData meta;

    FillUntrainedMeta(bs->index, bs->opts, &meta);
    GpuivfBuildPutMeta(bs->index, bs->forknum, &meta);
    if (IsCitusTable(RelationGetRelid(bs->heap)))
        return;
    ereport(NOTICE,
            (errmsg("gpuivf index \"%s\" is not trained because the table has no vectors",
                    RelationGetRelationName(bs->index)),
             errdetail("Until it is rebuilt, the index stores every vector and answers queries by exact search."),
             errhint("Run REINDEX INDEX %s after loading representative data.",
                     RelationGetRelationName(bs->index))));
}

/* ambuild: see the file comment. */
IndexBuildResult *
gpuivfbuild(Relation heap, Relation index, IndexInfo *indexInfo)
{
    IndexBuildResult *result = (IndexBuildResult *) palloc0(sizeof(IndexBuildResult));
    MemoryContext buildctx;
    MemoryContext old;
    GpuivfBuildState *bs;
    GpuivfMetaPageData placeholder;
    double      reltuples;
    int         lists_guess;

    if (RelationGetNumberOfBlocks(index) != 0)
        elog(ERROR, "index \"%s\" already contains data", RelationGetRelationName(index));
    gpuivf::init_blas_single_threaded();

    buildctx = AllocSetContextCreate(CurrentMemoryContext, "gpuivf build",
                                     ALLOCSET_DEFAULT_SIZES);
    old = MemoryContextSwitchTo(buildctx);
    bs = (GpuivfBuildState *) palloc0(sizeof(GpuivfBuildState));
    bs->heap = heap;
    bs->index = index;
    bs->forknum = MAIN_FORKNUM;
    bs->metric = GpuivfGetMetric(index);
    bs->opts = GpuivfGetOptions(index);
    bs->rowctx = AllocSetContextCreate(buildctx, "gpuivf build row", ALLOCSET_DEFAULT_SIZES);
    pg_prng_seed(&bs->prng, GPUIVF_SAMPLE_SEED);
    INSTR_TIME_SET_CURRENT(bs->phase_start);

    /* the metapage must be block 0; it is rewritten at the end */
    FillUntrainedMeta(index, bs->opts, &placeholder);
    GpuivfBuildPutMeta(index, bs->forknum, &placeholder);

    pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, GPUIVF_PHASE_SAMPLE);
    lists_guess = bs->opts->lists > 0 ? bs->opts->lists
        : gpuivf::auto_lists((int64) Max(EstimateHeapRows(heap), 0.0));
    bs->sample_target = Max((int64) GPUIVF_MIN_SAMPLE,
                            (int64) GPUIVF_SAMPLE_PER_LIST * lists_guess);
    reltuples = table_index_build_scan(heap, index, indexInfo, true, true, SampleCallback,
                                       (void *) bs, NULL);
    GpuivfAddSeconds(&bs->t_sample, &bs->phase_start);

    if (bs->rows == 0)
        BuildUntrained(bs);
    else
        BuildTrained(bs, indexInfo, &reltuples);

    /*
     * The calibration below searches the fresh index on the GPU worker, which
     * must load it first (half a second for 1M rows): it loads it while the
     * pages are logged here instead.
     */
    if (bs->rows > 0 && bs->engine_on_gpu)
    {
        GpuivfMetaPageData meta;

        GpuivfReadMeta(index, &meta);
        if (GpuivfCalibrationSearchesOnGpu(index, &meta))
            (void) GpuivfWorkerLoadStart(index, &meta);
    }
    GpuivfBuildLogPages(index, bs->forknum);
    {
        instr_time  t0;

        INSTR_TIME_SET_CURRENT(t0);
        GpuivfWorkerLoadWait(index);
        GpuivfAddSeconds(&bs->t_load_wait, &t0);
    }
    GpuivfAddSeconds(&bs->t_wal, &bs->phase_start);
    /* a fresh index is tuned before its first ANALYZE */
    if (bs->rows > 0)
        GpuivfCalibrate(index, heap, bs->calib);
    GpuivfAddSeconds(&bs->t_calibrate, &bs->phase_start);
    elog(DEBUG1, "gpuivf build of \"%s\": %lld rows; sample scan %.3f s, training %.3f s, "
         "encoding scan %.3f s (waiting for the engine %.3f s, on the %s), lists %.3f s (entries sorted %s), "
         "WAL %.3f s (then waiting for the GPU worker's load %.3f s), calibration %.3f s",
         RelationGetRelationName(index), (long long) bs->rows, bs->t_sample, bs->t_train,
         bs->t_encode, bs->t_engine, bs->engine_on_gpu ? "GPU" : "CPU", bs->t_lists,
         bs->mem_entries ? "in memory" : "by a tuplesort", bs->t_wal, bs->t_load_wait,
         bs->t_calibrate);
    result->heap_tuples = reltuples;
    result->index_tuples = (double) (bs->rows == 0 ? 0 : bs->encoded);

    MemoryContextSwitchTo(old);
    MemoryContextDelete(buildctx);
    return result;
}

/* ambuildempty: an unlogged index's init fork is an untrained metapage. */
void
gpuivfbuildempty(Relation index)
{
    GpuivfMetaPageData meta;

    FillUntrainedMeta(index, GpuivfGetOptions(index), &meta);
    GpuivfBuildPutMeta(index, INIT_FORKNUM, &meta);
    GpuivfBuildLogPages(index, INIT_FORKNUM);
}
