/*
 * calibration/sample.cpp — what a calibration measures against: the rows of
 * an index (its vector pages, or the heap when it stores no vectors), the
 * sample of them (by hash, order-independent) that becomes the queries, and the queries' exact
 * top-k among all rows (ground truth, on the GPU worker when one is up).
 * calibration/curve.cpp explains the whole procedure.
 */
#include "gpuivf.h"
#include "calibration/calibration.h"
#include "calibration/sample.h"
#include "worker/worker.h"

#include <cmath>

#define GPUIVF_CALIB_SEED       UINT64CONST(0x6770756976660005)

#define GPUIVF_TRUTH_BATCH_BYTES ((Size) 16 * 1024 * 1024)
#define GPUIVF_TRUTH_GPU_BATCH_BYTES ((Size) 32 * 1024 * 1024)  /* one DSM segment */

/* ------------------------------------------------------------ row sources */

/*
 * Every vector tuple of the index in blocks [first, end), in block order,
 * as (vector, vector TID); one page at a time under a share lock, the sink
 * called after unlocking.
 */
static void
WalkVectorPagesIn(Relation index, const GpuivfMetaPageData *meta, BlockNumber first,
                  BlockNumber end, BufferAccessStrategy bas, RowSinkFn sink, void *arg)
{
    int         dims = (int) meta->dims;
    Size        value_bytes = GpuivfVectorValueBytes(meta);
    int         cap = (int) (GPUIVF_PAGE_CAPACITY / GpuivfVectorTupleSize(meta)) + 1;
    float4     *x = (float4 *) palloc(sizeof(float4) * dims * (Size) cap);
    uint64     *ids = (uint64 *) palloc(sizeof(uint64) * cap);
    uint64     *heap_ids = (uint64 *) palloc(sizeof(uint64) * cap);

    for (BlockNumber blkno = first; blkno < end; blkno++)
    {
        Buffer      buf;
        Page        page;
        int         n = 0;

        vacuum_delay_point();
        buf = ReadBufferExtended(index, MAIN_FORKNUM, blkno, RBM_NORMAL, bas);
        LockBuffer(buf, BUFFER_LOCK_SHARE);
        page = BufferGetPage(buf);
        if (GpuivfPageIsType(page, GPUIVF_PAGE_VECTOR))
        {
            OffsetNumber maxoff = PageGetMaxOffsetNumber(page);

            for (OffsetNumber off = FirstOffsetNumber; off <= maxoff && n < cap; off++)
            {
                ItemId      iid = PageGetItemId(page, off);
                GpuivfVectorTuple *vt;
                ItemPointerData vtid;

                if (!ItemIdIsNormal(iid) ||
                    ItemIdGetLength(iid) < offsetof(GpuivfVectorTuple, x) + value_bytes)
                    continue;
                vt = (GpuivfVectorTuple *) PageGetItem(page, iid);
                if (meta->storage == GPUIVF_STORAGE_FLOAT16)
                    gpuivf::half_to_float_n((const uint16_t *) vt->x, x + (Size) n * dims, dims);
                else
                    memcpy(x + (Size) n * dims, vt->x, sizeof(float4) * dims);
                ItemPointerSet(&vtid, blkno, off);
                heap_ids[n] = GpuivfTidToId(&vt->heaptid);
                ids[n++] = GpuivfTidToId(&vtid);
            }
        }
        UnlockReleaseBuffer(buf);
        for (int i = 0; i < n; i++)
            sink(arg, x + (Size) i * dims, ids[i], heap_ids[i]);
    }
    pfree(x);
    pfree(ids);
    pfree(heap_ids);
}

/* Every vector tuple of the index. */
static void
WalkVectorPages(Relation index, const GpuivfMetaPageData *meta, RowSinkFn sink, void *arg)
{
    BufferAccessStrategy bas = GetAccessStrategy(BAS_BULKREAD);

    WalkVectorPagesIn(index, meta, GPUIVF_METAPAGE_BLKNO + 1, RelationGetNumberOfBlocks(index),
                      bas, sink, arg);
    FreeAccessStrategy(bas);
}

typedef struct HeapWalk
{
    RowSinkFn   sink;
    void       *arg;
    int         dims;
    MemoryContext rowctx;
} HeapWalk;

/* table_index_build_scan callback: one visible heap row with its root TID. */
static void
HeapWalkCallback(Relation index, ItemPointer tid, Datum *values, bool *isnull,
                 bool tupleIsAlive, void *arg)
{
    HeapWalk   *hw = (HeapWalk *) arg;
    const float4 *x;
    int         dims;

    x = GpuivfRowVector(GpuivfGetOpclassInfo(index).type, values, isnull, hw->rowctx, &dims);
    if (x == NULL)
        return;
    if (dims == hw->dims)
        hw->sink(hw->arg, x, GpuivfTidToId(tid), GpuivfTidToId(tid));
    MemoryContextReset(hw->rowctx);
}

/*
 * Every heap row the index covers (rerank = false: the index has no vectors),
 * as (vector, heap TID), for the rows visible to a fresh MVCC snapshot.
 */
static void
WalkHeapRows(Relation heap, Relation index, int dims, RowSinkFn sink, void *arg)
{
    IndexInfo  *indexInfo = BuildIndexInfo(index);
    Snapshot    snapshot = RegisterSnapshot(GetLatestSnapshot());
    TableScanDesc scan;
    HeapWalk    hw;

    hw.sink = sink;
    hw.arg = arg;
    hw.dims = dims;
    hw.rowctx = AllocSetContextCreate(CurrentMemoryContext, "gpuivf calibration row",
                                      ALLOCSET_DEFAULT_SIZES);
    indexInfo->ii_Concurrent = true;    /* rows visible to the snapshot only */
    scan = table_beginscan_strat(heap, snapshot, 0, NULL, true, false);
    table_index_build_scan(heap, index, indexInfo, true, false, HeapWalkCallback,
                           (void *) &hw, scan);
    UnregisterSnapshot(snapshot);
    MemoryContextDelete(hw.rowctx);
}

/* The index's rows are in its vector pages (not in the heap alone: rerank =
 * false, or re-rank from the table): their walk can be shared out. */
bool
GpuivfTruthCanShare(const GpuivfMetaPageData *meta)
{
    return GpuivfMetaStoresVectors(meta) && !GpuivfMetaRerankFromTable(meta);
}

/* All rows of the index, from its vector pages or (no vectors in the
 * index) the heap. */
void
WalkIndexedRows(Relation index, Relation heap, const GpuivfMetaPageData *meta,
                RowSinkFn sink, void *arg)
{
    if (GpuivfTruthCanShare(meta))
        WalkVectorPages(index, meta, sink, arg);
    else
        WalkHeapRows(heap, index, (int) meta->dims, sink, arg);
}

/* ---------------------------------------------------------------- sample */

/* An empty sample of up to cap rows of dims (the current memory context):
 * twice cap slots, so that the bookkeeping compacts rarely. */
void
CalibSampleInit(CalibSample *s, int cap, int dims)
{
    int64       slots = 2 * (int64) Max(cap, 1);

    memset(s, 0, sizeof(*s));
    s->cap = Max(cap, 1);
    s->dims = dims;
    s->queries = (float4 *) palloc_extended(sizeof(float4) * (Size) slots * dims, MCXT_ALLOC_HUGE);
    s->self_ids = (uint64 *) palloc(sizeof(uint64) * slots);
    s->self_heap_ids = (uint64 *) palloc(sizeof(uint64) * slots);
    s->keys = GpuivfBottomKInit(palloc(GpuivfBottomKSize(slots)), s->cap, slots);
}

/* One row offered: it is in the sample when its vector's hash is among the
 * cap smallest (utils.cpp), so the sample does not depend on the order of
 * the rows: a build's encoding scans, serial or parallel, draw the rows a
 * walk of the finished index draws. */
void
SampleSink(void *arg, const float4 *x, uint64 id, uint64 heap_id)
{
    CalibSample *s = (CalibSample *) arg;
    int64       slot;

    Assert(!s->finished);
    slot = GpuivfBottomKOffer(s->keys, GpuivfSampleHash(GPUIVF_CALIB_SEED, x, s->dims), heap_id);
    if (slot >= 0)
    {
        memcpy(s->queries + (Size) slot * s->dims, x, sizeof(float4) * s->dims);
        s->self_ids[slot] = id;
        s->self_heap_ids[slot] = heap_id;
    }
    s->seen++;
}

/* The sample's rows in key order at queries[0 .. nq) (the order, too,
 * depends on the rows alone); no row is offered after this. */
void
CalibSampleFinish(CalibSample *s)
{
    const GpuivfSampleKey *keys;
    int64       n;
    float4     *queries;
    uint64     *ids;
    uint64     *heap_ids;

    if (s->finished)
        return;
    n = GpuivfBottomKFinish(s->keys, &keys);
    queries = (float4 *) palloc_extended(sizeof(float4) * (Size) Max(n, 1) * s->dims,
                                         MCXT_ALLOC_HUGE);
    ids = (uint64 *) palloc(sizeof(uint64) * Max(n, 1));
    heap_ids = (uint64 *) palloc(sizeof(uint64) * Max(n, 1));
    for (int64 i = 0; i < n; i++)
    {
        int64       slot = keys[i].slot;

        memcpy(queries + (Size) i * s->dims, s->queries + (Size) slot * s->dims,
               sizeof(float4) * s->dims);
        ids[i] = s->self_ids[slot];
        heap_ids[i] = s->self_heap_ids[slot];
    }
    pfree(s->queries);
    pfree(s->self_ids);
    pfree(s->self_heap_ids);
    s->queries = queries;
    s->self_ids = ids;
    s->self_heap_ids = heap_ids;
    s->nq = (int) n;
    s->finished = true;
}

/* A sample drawn by the caller (calibration.h): gpuivf.analyze_sample rows at
 * most, NULL when calibration is off. */
GpuivfCalibSample *
GpuivfCalibSampleBegin(int dims)
{
    CalibSample *s;

    if (gpuivf_analyze_sample <= 0 || dims <= 0)
        return NULL;
    s = (CalibSample *) palloc(sizeof(CalibSample));
    CalibSampleInit(s, gpuivf_analyze_sample, dims);
    return s;
}

/* One row of the index (any order: see SampleSink). */
void
GpuivfCalibSampleAdd(GpuivfCalibSample *sample, const float4 *x, uint64 id, uint64 heap_id)
{
    if (sample != NULL)
        SampleSink(sample, x, id, heap_id);
}

/*
 * A sample drawn by another process (a parallel build's participants):
 * flattened into bytes (header, then per row: id, heap TID, dims floats),
 * then merged into the leader's, which is then the sample of all their rows.
 */
typedef struct CalibSampleBytes
{
    int64       nq;
    int64       seen;
} CalibSampleBytes;

Size
GpuivfCalibSampleBytes(int dims)
{
    return MAXALIGN(sizeof(CalibSampleBytes)) +
        (Size) Max(gpuivf_analyze_sample, 1) * (2 * sizeof(uint64) + sizeof(float4) * dims);
}

void
GpuivfCalibSampleFlatten(GpuivfCalibSample *sample, void *dst)
{
    CalibSampleBytes *h = (CalibSampleBytes *) dst;
    char       *p = (char *) dst + MAXALIGN(sizeof(CalibSampleBytes));

    CalibSampleFinish(sample);
    h->nq = sample->nq;
    h->seen = sample->seen;
    for (int i = 0; i < sample->nq; i++)
    {
        memcpy(p, &sample->self_ids[i], sizeof(uint64));
        memcpy(p + sizeof(uint64), &sample->self_heap_ids[i], sizeof(uint64));
        memcpy(p + 2 * sizeof(uint64), sample->queries + (Size) i * sample->dims,
               sizeof(float4) * sample->dims);
        p += 2 * sizeof(uint64) + sizeof(float4) * sample->dims;
    }
}

void
GpuivfCalibSampleMerge(GpuivfCalibSample *sample, const void *src)
{
    const CalibSampleBytes *h = (const CalibSampleBytes *) src;
    const char *p = (const char *) src + MAXALIGN(sizeof(CalibSampleBytes));

    for (int64 i = 0; i < h->nq; i++)
    {
        uint64      id;
        uint64      heap_id;

        memcpy(&id, p, sizeof(uint64));
        memcpy(&heap_id, p + sizeof(uint64), sizeof(uint64));
        SampleSink(sample, (const float4 *) (p + 2 * sizeof(uint64)), id, heap_id);
        p += 2 * sizeof(uint64) + sizeof(float4) * sample->dims;
    }
    sample->seen += h->seen - h->nq;    /* SampleSink counted nq of them */
}

/* ---------------------------------------------------------- ground truth */

/* Brute force over batches of rows: each batch's exact top-(k+1) is merged
 * into one k-selection per query, leaving out the query's own row. */
typedef struct TruthState
{
    gpuivf::Metric metric;
    int         dims;
    int         nq;
    int         k;
    const float4 *queries;
    const uint64 *exclude;
    int         batch_cap;
    int         batch_n;
    float4     *batch_x;
    uint64     *batch_ids;
    float      *knn_vals;       /* nq * (k + 1) */
    uint64     *knn_ids;
    gpuivf::TopK *heaps;        /* nq selections of k */
    GpuivfExactKnnJob *job;     /* the GPU worker's, or NULL: CPU; batch_x is
                                 * in its DSM segment */
    int64       gpu_batches;    /* batches the worker answered */
} TruthState;

static void
TruthFlush(TruthState *ts)
{
    gpuivf::CancelHook cancel = GpuivfCancelHook();
    int         kk = ts->k + 1;

    if (ts->batch_n == 0)
        return;
    /* the worker's answer has the CPU's bits, so a batch it fails (auto)
     * is simply computed here */
    if (ts->job != NULL &&
        GpuivfWorkerExactKnnRun(ts->job, ts->batch_n, ts->knn_vals, ts->knn_ids))
        ts->gpu_batches++;
    else
        GpuivfRaiseStatus(gpuivf::exact_knn(ts->metric, ts->batch_x, ts->batch_n, ts->queries, ts->nq,
                                            ts->dims, kk, ts->knn_vals, ts->knn_ids, &cancel));
    for (int q = 0; q < ts->nq; q++)
    {
        gpuivf::TopK *h = &ts->heaps[q];

        for (int j = 0; j < kk; j++)
        {
            uint64      row = ts->knn_ids[(Size) q * kk + j];
            float       val = ts->knn_vals[(Size) q * kk + j];
            uint64      id;

            if (row == PG_UINT64_MAX || row >= (uint64) ts->batch_n)
                continue;
            id = ts->batch_ids[row];
            if (id == ts->exclude[q])
                continue;
            if (val <= gpuivf::topk_threshold(h))
                gpuivf::topk_push(h, val, id);
        }
    }
    ts->batch_n = 0;
}

static void
TruthSink(void *arg, const float4 *x, uint64 id, uint64 heap_id)
{
    TruthState *ts = (TruthState *) arg;

    (void) heap_id;
    memcpy(ts->batch_x + (Size) ts->batch_n * ts->dims, x, sizeof(float4) * ts->dims);
    ts->batch_ids[ts->batch_n++] = id;
    if (ts->batch_n == ts->batch_cap)
        TruthFlush(ts);
}

/* ts's k-selections, one per query, kept in vals/ids (nq x k) */
static void
TruthHeapsInit(TruthState *ts, float *vals, uint64 *ids)
{
    ts->knn_vals = (float *) palloc(sizeof(float) * (Size) ts->nq * (ts->k + 1));
    ts->knn_ids = (uint64 *) palloc(sizeof(uint64) * (Size) ts->nq * (ts->k + 1));
    ts->heaps = (gpuivf::TopK *) palloc(sizeof(gpuivf::TopK) * ts->nq);
    for (int q = 0; q < ts->nq; q++)
        gpuivf::topk_init(&ts->heaps[q], vals + (Size) q * ts->k, ids + (Size) q * ts->k, ts->k);
}

/* Each query's selection sorted into out_ids/out_scores (padded with
 * UINT64_MAX/INFINITY). */
static void
TruthOut(TruthState *ts, uint64 *out_ids, float *out_scores)
{
    for (int q = 0; q < ts->nq; q++)
    {
        gpuivf::TopK *h = &ts->heaps[q];

        gpuivf::topk_sort(h);
        for (int j = 0; j < ts->k; j++)
        {
            out_ids[(Size) q * ts->k + j] = j < h->size ? h->ids[j] : PG_UINT64_MAX;
            out_scores[(Size) q * ts->k + j] = j < h->size ? h->vals[j] : INFINITY;
        }
    }
}

static void
TruthStateInit(TruthState *ts, const GpuivfMetaPageData *meta, int nq, const float4 *queries,
               const uint64 *exclude_ids, int k)
{
    ts->metric = (gpuivf::Metric) meta->metric;
    ts->dims = (int) meta->dims;
    ts->nq = nq;
    ts->k = k;
    ts->queries = queries;
    ts->exclude = exclude_ids;
    ts->batch_n = 0;
    ts->gpu_batches = 0;
    ts->job = NULL;
}

/* a batch on the CPU, of at most GPUIVF_TRUTH_BATCH_BYTES */
static void
TruthCpuBatch(TruthState *ts)
{
    Size        row_bytes = sizeof(float4) * ts->dims;

    ts->batch_cap = (int) Max((Size) 256, Min((Size) 65536, GPUIVF_TRUTH_BATCH_BYTES / row_bytes));
    ts->batch_x = (float4 *) palloc_extended(row_bytes * ts->batch_cap, MCXT_ALLOC_HUGE);
}

/*
 * The seam for ground truth (calibration.h).  Every row is read once (vector
 * pages, or the heap when the index stores no vectors) in batches, and each
 * batch's exact top-(k+1) is merged per query.  With a GPU worker up
 * (gpuivf.device not cpu) a batch of at most GPUIVF_TRUTH_GPU_BATCH_BYTES is
 * gathered straight into a DSM segment and answered by the worker's exact
 * kNN (GpuivfWorkerExactKnnRun: the engine re-scores with the CPU's
 * functions, so the merged result is the CPU's); otherwise, or for the rest
 * after a worker failure under auto, batches of at most
 * GPUIVF_TRUTH_BATCH_BYTES go through core exact_knn here, or, with a
 * parallel build's helpers, in its processes.  *on_gpu (may be NULL) says
 * whether the worker answered every batch.
 */
void
GpuivfExactKnnForCalibration(Relation index, Relation heap, const GpuivfMetaPageData *meta,
                             int nq, const float4 *queries, const uint64 *exclude_ids, int k,
                             uint64 *out_ids, float *out_scores, bool *on_gpu,
                             GpuivfTruthHelpers *helpers)
{
    TruthState  ts;
    float      *heap_vals;
    uint64     *heap_ids;
    Size        row_bytes = sizeof(float4) * meta->dims;

    if (on_gpu != NULL)
        *on_gpu = false;
    TruthStateInit(&ts, meta, nq, queries, exclude_ids, k);
    /* a segment no larger than the index needs (later rows: another batch) */
    ts.batch_cap = (int) Max((Size) 256, Min((Size) 262144, GPUIVF_TRUTH_GPU_BATCH_BYTES / row_bytes));
    ts.batch_cap = (int) Min((uint64) ts.batch_cap, Max(meta->vectors + meta->vectors / 8, (uint64) 256));
    ts.job = GpuivfWorkerExactKnnBegin(index, ts.metric, ts.dims, nq, queries, k + 1,
                                       ts.batch_cap, &ts.batch_x);
    if (ts.job == NULL)
    {
        if (helpers != NULL && GpuivfTruthCanShare(meta) &&
            helpers->run(helpers, index, meta, nq, queries, exclude_ids, k, out_ids, out_scores))
            return;
        TruthCpuBatch(&ts);
    }
    ts.batch_ids = (uint64 *) palloc(sizeof(uint64) * ts.batch_cap);
    heap_vals = (float *) palloc(sizeof(float) * (Size) nq * k);
    heap_ids = (uint64 *) palloc(sizeof(uint64) * (Size) nq * k);
    TruthHeapsInit(&ts, heap_vals, heap_ids);

    WalkIndexedRows(index, heap, meta, TruthSink, &ts);
    TruthFlush(&ts);
    if (on_gpu != NULL)
        *on_gpu = ts.job != NULL && ts.gpu_batches > 0 && !GpuivfWorkerExactKnnDead(ts.job);
    TruthOut(&ts, out_ids, out_scores);

    if (ts.job != NULL)
        GpuivfWorkerExactKnnEnd(ts.job);    /* batch_x was in its segment */
    else
        pfree(ts.batch_x);
    pfree(ts.batch_ids);
    pfree(ts.knn_vals);
    pfree(ts.knn_ids);
    pfree(ts.heaps);
    pfree(heap_vals);
    pfree(heap_ids);
}

/* Ranges of the vector pages a part claims (calibration.h). */
int64
GpuivfTruthRanges(BlockNumber nblocks)
{
    if (nblocks <= GPUIVF_METAPAGE_BLKNO + 1)
        return 0;
    return ((int64) nblocks - (GPUIVF_METAPAGE_BLKNO + 1) + GPUIVF_TRUTH_RANGE_BLOCKS - 1) /
        GPUIVF_TRUTH_RANGE_BLOCKS;
}

/*
 * One process's part of the exact top-k (calibration.h).  A part's rows
 * come in block order, so within each batch a row's position orders as its
 * id does, and exact_knn's top-(k+1) of a batch is the k+1 best (score, id)
 * of it, whichever batches the rows fall in: the parts merge into the
 * whole's result.
 */
void
GpuivfExactKnnPart(Relation index, const GpuivfMetaPageData *meta, BlockNumber nblocks, int nq,
                   const float4 *queries, const uint64 *exclude_ids, int k,
                   int64 (*claim) (void *claim_arg), void *claim_arg, float *vals, uint64 *ids)
{
    TruthState  ts;
    BufferAccessStrategy bas = GetAccessStrategy(BAS_BULKREAD);
    int64       r;

    TruthStateInit(&ts, meta, nq, queries, exclude_ids, k);
    TruthCpuBatch(&ts);
    ts.batch_ids = (uint64 *) palloc(sizeof(uint64) * ts.batch_cap);
    TruthHeapsInit(&ts, vals, ids);
    while ((r = claim(claim_arg)) >= 0)
    {
        BlockNumber first = (BlockNumber) (GPUIVF_METAPAGE_BLKNO + 1 + r * GPUIVF_TRUTH_RANGE_BLOCKS);

        WalkVectorPagesIn(index, meta, first,
                          Min(nblocks, first + GPUIVF_TRUTH_RANGE_BLOCKS), bas, TruthSink, &ts);
    }
    TruthFlush(&ts);
    for (int q = 0; q < nq; q++)
        for (int j = ts.heaps[q].size; j < k; j++)
        {
            vals[(Size) q * k + j] = INFINITY;
            ids[(Size) q * k + j] = PG_UINT64_MAX;
        }
    FreeAccessStrategy(bas);
    pfree(ts.batch_x);
    pfree(ts.batch_ids);
    pfree(ts.knn_vals);
    pfree(ts.knn_ids);
    pfree(ts.heaps);
}

/* The parts merged (calibration.h): TopK keeps the same pairs whatever the
 * order they come in. */
void
GpuivfExactKnnMerge(int nq, int k, int nparts, const float *vals, const uint64 *ids,
                    uint64 *out_ids, float *out_scores)
{
    TruthState  ts;
    float      *heap_vals = (float *) palloc(sizeof(float) * (Size) nq * k);
    uint64     *heap_ids = (uint64 *) palloc(sizeof(uint64) * (Size) nq * k);

    memset(&ts, 0, sizeof(ts));
    ts.nq = nq;
    ts.k = k;
    ts.heaps = (gpuivf::TopK *) palloc(sizeof(gpuivf::TopK) * nq);
    for (int q = 0; q < nq; q++)
        gpuivf::topk_init(&ts.heaps[q], heap_vals + (Size) q * k, heap_ids + (Size) q * k, k);
    for (int p = 0; p < nparts; p++)
        for (int q = 0; q < nq; q++)
        {
            gpuivf::TopK *h = &ts.heaps[q];
            Size        at = ((Size) p * nq + q) * k;

            for (int j = 0; j < k; j++)
                if (ids[at + j] != PG_UINT64_MAX && vals[at + j] <= gpuivf::topk_threshold(h))
                    gpuivf::topk_push(h, vals[at + j], ids[at + j]);
        }
    TruthOut(&ts, out_ids, out_scores);
    pfree(ts.heaps);
    pfree(heap_vals);
    pfree(heap_ids);
}
