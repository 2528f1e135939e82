/*
 * gpuivfanalyze.cpp — ANALYZE calibrates nprobe to a recall target.
 *
 * A calibration measures, for one index, the recall@10 of its own search as a
 * function of nprobe, and stores that curve in the metapage
 * (GpuivfLogCalibration: one GenericXLog record, so it survives restarts and
 * reaches standbys).  Scans with gpuivf.probes = 0 then use the smallest
 * measured nprobe whose recall meets gpuivf.target_recall with 95% confidence
 * (GpuivfProbesForScan, GpuivfCurveProbes), so changing the target takes
 * effect at once, without measuring again.
 *
 * When: ANALYZE (amvacuumcleanup with analyze_only: plain ANALYZE and
 * autovacuum's auto-analyze), the end of CREATE INDEX / REINDEX, and a VACUUM
 * that finds the curve missing or stale (VACUUM ANALYZE never calls the AM
 * with analyze_only, so autovacuum's combined runs would otherwise never
 * re-measure).
 *
 * How:
 *   1. sample: gpuivf.analyze_sample rows of the index (a reservoir with a
 *      fixed seed) become the queries: vector tuples when the index stores
 *      vectors, else heap rows visible to a fresh snapshot;
 *   2. ground truth: exact top-10 of every query among all rows of the index,
 *      leaving out the query's own row (a self-match would inflate recall),
 *      by brute force in batches of rows: on the GPU worker when one is up
 *      (its engine's exact_knn, the same bits as core exact_knn), else with
 *      core exact_knn in this backend (GpuivfExactKnnForCalibration);
 *   3. sweep: for each query the lists are visited in probe order, feeding
 *      one ADC k-selection of R = max(gpuivf.rerank_candidates, 10)
 *      candidates, the query's own entry skipped; at every measured nprobe
 *      the candidates are exactly those a scan's first round keeps with that
 *      nprobe, so the recall of the scan follows without re-running it: with
 *      re-rank the exact top-10 of the candidates contains every true
 *      neighbour among them (they are the 10 nearest of all rows), so
 *      recall = |candidates ∩ truth| / 10; without re-rank the scan returns
 *      the 10 best ADC scores, compared with the truth directly.  One pass
 *      over the probe order gives every point (nprobe 1, 2, ..., 16, then
 *      about 64 points in all, geometric up to lists), in stages that double
 *      nprobe; the sweep stops when a doubling closes less than a tenth of
 *      the gap to recall 1 (a plateau), when recall is 1, or at lists (with
 *      re-rank nprobe = lists is the exact scan: 1).  When the GPU worker is
 *      up (and lists <= 1024, the engine's nprobe limit), each point is
 *      measured by one GpuivfSearchBatch of all queries instead
 *      (SearchStage): the same curve, computed by the engine that answers
 *      the queries.
 *
 * Cost on the CPU, for n rows of d dimensions, q sample queries, L lists,
 * m sub-quantizers of 2^b centroids: ground truth q * n * d multiply-adds
 * (GEMM) plus one read of the vector pages (or the heap); the sweep at most
 * q * (n * m table look-ups + L * d * 2^b for the look-up tables) — at most
 * one ADC pass over the whole index per query, less when it stops early.
 * Memory: the queries (q * d floats), one batch of at most 16 MB of base
 * vectors, q * R candidates.  No lock is held while computing: pages are read
 * under a share lock one at a time, and only the final write locks the
 * metapage (exclusively, briefly), so inserts and queries go on meanwhile.
 */
#include "gpuivf.h"

#include <cmath>

#define GPUIVF_CALIB_SEED       UINT64CONST(0x6770756976660005)
#define GPUIVF_CALIB_DENSE      16      /* every nprobe up to this is a point */
#define GPUIVF_TRUTH_BATCH_BYTES ((Size) 16 * 1024 * 1024)
#define GPUIVF_TRUTH_GPU_BATCH_BYTES ((Size) 32 * 1024 * 1024)  /* one DSM segment */
#define GPUIVF_STALE_FRACTION   0.10
#define GPUIVF_PLATEAU_FRACTION 0.10

/*
 * A point meets a target when recall - z * standard error >= target, with z
 * of a one-sided 95% interval.  The sample is small (200 queries: the
 * standard error is about 0.006 at recall 0.95), and choosing the first
 * point whose mean happens to clear the target would, about half the time
 * at the boundary, land on one whose true recall is below it.  The cost is
 * usually one point more (a few lists).
 */
#define GPUIVF_CURVE_CONFIDENCE_Z 1.645

/* ------------------------------------------------------------ row sources */

/* Receives the rows of the index one at a time: raw vector, entry id (what
 * list entries hold) and heap TID (the same without stored vectors). */
typedef void (*RowSinkFn) (void *arg, const float4 *x, uint64 id, uint64 heap_id);

/*
 * Every vector tuple of the index, in block order, as (vector, vector TID);
 * one page at a time under a share lock, the sink called after unlocking.
 */
static void
WalkVectorPages(Relation index, int dims, RowSinkFn sink, void *arg)
{
    BlockNumber nblocks = RelationGetNumberOfBlocks(index);
    BufferAccessStrategy bas = GetAccessStrategy(BAS_BULKREAD);
    int         cap = (int) (GPUIVF_PAGE_CAPACITY / GPUIVF_VECTOR_TUPLE_SIZE(dims)) + 1;
    float4     *x = (float4 *) palloc(sizeof(float4) * dims * (Size) cap);
    uint64     *ids = (uint64 *) palloc(sizeof(uint64) * cap);
    uint64     *heap_ids = (uint64 *) palloc(sizeof(uint64) * cap);

    for (BlockNumber blkno = GPUIVF_METAPAGE_BLKNO + 1; blkno < nblocks; blkno++)
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
                    ItemIdGetLength(iid) < offsetof(GpuivfVectorTuple, x) + sizeof(float4) * dims)
                    continue;
                vt = (GpuivfVectorTuple *) PageGetItem(page, iid);
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
    FreeAccessStrategy(bas);
    pfree(x);
    pfree(ids);
    pfree(heap_ids);
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

    x = GpuivfRowVector(values, isnull, hw->rowctx, &dims);
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

/* All rows of the index, from its vector pages or (no vectors) the heap. */
static void
WalkIndexedRows(Relation index, Relation heap, const GpuivfMetaPageData *meta,
                RowSinkFn sink, void *arg)
{
    if (GpuivfMetaStoresVectors(meta))
        WalkVectorPages(index, (int) meta->dims, sink, arg);
    else
        WalkHeapRows(heap, index, (int) meta->dims, sink, arg);
}

/* ---------------------------------------------------------------- sample */

/* The queries: a reservoir sample (Algorithm R, fixed seed) of the rows. */
struct CalibSample
{
    int         cap;
    int         nq;
    int         dims;
    int64       seen;
    float4     *queries;        /* cap * dims, raw */
    uint64     *self_ids;       /* entry id of each query's own row */
    uint64     *self_heap_ids;  /* and its heap TID */
    pg_prng_state prng;
};
typedef struct CalibSample CalibSample;

/* An empty sample of up to cap rows of dims (the current memory context). */
static void
CalibSampleInit(CalibSample *s, int cap, int dims)
{
    memset(s, 0, sizeof(*s));
    s->cap = cap;
    s->dims = dims;
    s->queries = (float4 *) palloc_extended(sizeof(float4) * (Size) cap * dims, MCXT_ALLOC_HUGE);
    s->self_ids = (uint64 *) palloc(sizeof(uint64) * cap);
    s->self_heap_ids = (uint64 *) palloc(sizeof(uint64) * cap);
    pg_prng_seed(&s->prng, GPUIVF_CALIB_SEED);
}

static void
SampleSink(void *arg, const float4 *x, uint64 id, uint64 heap_id)
{
    CalibSample *s = (CalibSample *) arg;
    int64       slot = GpuivfReservoirSlot(&s->prng, s->nq, s->cap, s->seen);

    if (slot == s->nq)
        s->nq++;
    if (slot >= 0)
    {
        memcpy(s->queries + (Size) slot * s->dims, x, sizeof(float4) * s->dims);
        s->self_ids[slot] = id;
        s->self_heap_ids[slot] = heap_id;
    }
    s->seen++;
}

/* A sample drawn by the caller (gpuivf.h): gpuivf.analyze_sample rows at
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

/* One row of the index, in the order a walk of its rows would give it. */
void
GpuivfCalibSampleAdd(GpuivfCalibSample *sample, const float4 *x, uint64 id, uint64 heap_id)
{
    if (sample != NULL)
        SampleSink(sample, x, id, heap_id);
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
    gpuivf::CancelHook cancel = {GpuivfShouldCancel, NULL};
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

/*
 * The seam for ground truth (gpuivf.h).  Every row is read once (vector
 * pages, or the heap when the index stores no vectors) in batches, and each
 * batch's exact top-(k+1) is merged per query.  With a GPU worker up
 * (gpuivf.device not cpu) a batch of at most GPUIVF_TRUTH_GPU_BATCH_BYTES is
 * gathered straight into a DSM segment and answered by the worker's exact
 * kNN (GpuivfWorkerExactKnnRun: the engine re-scores with the CPU's
 * functions, so the merged result is the CPU's); otherwise, or for the rest
 * after a worker failure under auto, batches of at most
 * GPUIVF_TRUTH_BATCH_BYTES go through core exact_knn here.  *on_gpu (may be
 * NULL) says whether the worker answered every batch.
 */
void
GpuivfExactKnnForCalibration(Relation index, Relation heap, const GpuivfMetaPageData *meta,
                             int nq, const float4 *queries, const uint64 *exclude_ids, int k,
                             uint64 *out_ids, float *out_scores, bool *on_gpu)
{
    TruthState  ts;
    float      *heap_vals;
    uint64     *heap_ids;
    Size        row_bytes = sizeof(float4) * meta->dims;

    ts.metric = (gpuivf::Metric) meta->metric;
    ts.dims = (int) meta->dims;
    ts.nq = nq;
    ts.k = k;
    ts.queries = queries;
    ts.exclude = exclude_ids;
    ts.batch_n = 0;
    ts.gpu_batches = 0;
    /* a segment no larger than the index needs (later rows: another batch) */
    ts.batch_cap = (int) Max((Size) 256, Min((Size) 262144, GPUIVF_TRUTH_GPU_BATCH_BYTES / row_bytes));
    ts.batch_cap = (int) Min((uint64) ts.batch_cap, Max(meta->vectors + meta->vectors / 8, (uint64) 256));
    ts.job = GpuivfWorkerExactKnnBegin(index, ts.metric, ts.dims, nq, queries, k + 1,
                                       ts.batch_cap, &ts.batch_x);
    if (ts.job == NULL)
    {
        ts.batch_cap = (int) Max((Size) 256, Min((Size) 65536, GPUIVF_TRUTH_BATCH_BYTES / row_bytes));
        ts.batch_x = (float4 *) palloc_extended(row_bytes * ts.batch_cap, MCXT_ALLOC_HUGE);
    }
    ts.batch_ids = (uint64 *) palloc(sizeof(uint64) * ts.batch_cap);
    ts.knn_vals = (float *) palloc(sizeof(float) * (Size) nq * (k + 1));
    ts.knn_ids = (uint64 *) palloc(sizeof(uint64) * (Size) nq * (k + 1));
    ts.heaps = (gpuivf::TopK *) palloc(sizeof(gpuivf::TopK) * nq);
    heap_vals = (float *) palloc(sizeof(float) * (Size) nq * k);
    heap_ids = (uint64 *) palloc(sizeof(uint64) * (Size) nq * k);
    for (int q = 0; q < nq; q++)
        gpuivf::topk_init(&ts.heaps[q], heap_vals + (Size) q * k, heap_ids + (Size) q * k, k);

    WalkIndexedRows(index, heap, meta, TruthSink, &ts);
    TruthFlush(&ts);
    if (on_gpu != NULL)
        *on_gpu = ts.job != NULL && ts.gpu_batches > 0 && !GpuivfWorkerExactKnnDead(ts.job);

    for (int q = 0; q < nq; q++)
    {
        gpuivf::TopK *h = &ts.heaps[q];

        gpuivf::topk_sort(h);
        for (int j = 0; j < k; j++)
        {
            out_ids[(Size) q * k + j] = j < h->size ? h->ids[j] : PG_UINT64_MAX;
            out_scores[(Size) q * k + j] = j < h->size ? h->vals[j] : INFINITY;
        }
    }
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

/* ----------------------------------------------------------------- sweep */

/* The nprobe values measured: every one up to 16, then geometric so that
 * at most GPUIVF_CURVE_POINTS points reach lists; ascending, last = lists. */
static int
SweepPoints(int lists, uint32 *points)
{
    int         n = 0;
    double      ratio = 1.0;
    int         p = 1;

    if (lists > GPUIVF_CALIB_DENSE)
        ratio = pow((double) lists / GPUIVF_CALIB_DENSE,
                    1.0 / (GPUIVF_CURVE_POINTS - GPUIVF_CALIB_DENSE - 2));
    while (p < lists && n < GPUIVF_CURVE_POINTS - 1)
    {
        points[n++] = (uint32) p;
        if (p < GPUIVF_CALIB_DENSE)
            p++;
        else
            p = Max(p + 1, (int) ceil(p * ratio));
    }
    points[n++] = (uint32) lists;
    return n;
}

/* Everything the sweep keeps between stages. */
typedef struct SweepState
{
    Relation    index;
    GpuivfMetaPageData meta;    /* as calibration began */
    BlockNumber nblocks;        /* of the index as the sweep began */
    bool        rerank;
    int         nq;
    int         k;
    int         R;              /* candidates per query */
    const CalibSample *sample;
    const uint64 *truth;        /* nq * k entry ids, UINT64_MAX padded */
    uint64     *truth_heap;     /* the same as heap TIDs (search path only) */
    gpuivf::TopK *cands;        /* nq selections of R */
    float      *query_prep;     /* dims */
    int32      *order;          /* probe order, lists */
    float      *order_scores;
    float      *lut;
    int         page_cap;
    uint8      *page_codes;
    uint64     *page_ids;
    float      *snap_vals;      /* R, for a sorted copy */
    uint64     *snap_ids;
    double     *sum;            /* per point: sum of per-query recall */
    double     *sumsq;
} SweepState;

/* Read one list page: its entries' ids and codes, the own row left out. */
static int
SweepReadListPage(SweepState *sw, BlockNumber blkno, uint64 skip_id, BlockNumber *next)
{
    Buffer      buf = ReadBuffer(sw->index, blkno);
    Page        page;
    int         n = 0;
    int         code_size = sw->meta.code_size;

    LockBuffer(buf, BUFFER_LOCK_SHARE);
    page = BufferGetPage(buf);
    *next = InvalidBlockNumber;
    if (GpuivfPageIsType(page, GPUIVF_PAGE_LIST))
    {
        OffsetNumber maxoff = PageGetMaxOffsetNumber(page);

        for (OffsetNumber off = FirstOffsetNumber; off <= maxoff && n < sw->page_cap; off++)
        {
            ItemId      iid = PageGetItemId(page, off);
            GpuivfListEntry *e;
            uint64      id;

            if (!ItemIdIsNormal(iid) ||
                ItemIdGetLength(iid) < offsetof(GpuivfListEntry, code) + code_size)
                continue;
            e = (GpuivfListEntry *) PageGetItem(page, iid);
            id = GpuivfTidToId(&e->tid);
            if (id == skip_id)
                continue;
            sw->page_ids[n] = id;
            memcpy(sw->page_codes + (Size) n * code_size, e->code, code_size);
            n++;
        }
        *next = GpuivfPageGetOpaque(page)->nextblkno;
    }
    UnlockReleaseBuffer(buf);
    return n;
}

/* ADC-score every entry of one list into the query's candidates. */
static void
SweepScanList(SweepState *sw, const gpuivf::IvfPqModel &model, int list, uint64 skip_id,
              gpuivf::TopK *cands)
{
    GpuivfListDirEntry dir = GpuivfReadDirEntry(sw->index, &sw->meta, list);
    BlockNumber blkno = dir.head;
    BlockNumber visited = 0;
    float       bias;

    if (!BlockNumberIsValid(blkno))
        return;
    gpuivf::ivfpq_build_lut(model, sw->query_prep, list, sw->lut, &bias);
    /* a chain longer than the index has pages is a cycle: stop (verify says why) */
    while (BlockNumberIsValid(blkno) && visited++ < sw->nblocks)
    {
        BlockNumber next;
        int         n = SweepReadListPage(sw, blkno, skip_id, &next);

        if (n > 0)
            gpuivf::ivfpq_adc_scan(model, sw->lut, bias, sw->page_codes, sw->page_ids, n, cands);
        blkno = next;
    }
}

/* Recall of query q's current candidates: re-ranked (truth among them) or
 * the k best ADC scores. */
static double
SweepRecall(SweepState *sw, int q)
{
    const uint64 *truth = sw->truth + (Size) q * sw->k;
    const gpuivf::TopK *c = &sw->cands[q];
    int         ntruth = 0;
    int         hits = 0;
    int         nres = c->size;
    const uint64 *res = c->ids;

    if (!sw->rerank)
    {
        memcpy(sw->snap_vals, c->vals, sizeof(float) * c->size);
        memcpy(sw->snap_ids, c->ids, sizeof(uint64) * c->size);
        gpuivf::sort_pairs(sw->snap_vals, sw->snap_ids, c->size);
        nres = Min(c->size, sw->k);
        res = sw->snap_ids;
    }
    for (int j = 0; j < sw->k; j++)
    {
        if (truth[j] == PG_UINT64_MAX)
            break;
        ntruth++;
        for (int i = 0; i < nres; i++)
        {
            if (res[i] == truth[j])
            {
                hits++;
                break;
            }
        }
    }
    return ntruth > 0 ? (double) hits / ntruth : 1.0;
}

/*
 * Continue every query's probe order from position `from` up to
 * points[last], recording the points first..last.  Returns false when the
 * index was rebuilt meanwhile (its model is gone).
 */
static bool
SweepStage(SweepState *sw, const uint32 *points, int first, int last, int from)
{
    int         to = (int) points[last];
    int         dims = (int) sw->meta.dims;

    for (int q = 0; q < sw->nq; q++)
    {
        GpuivfIndexState *state = GpuivfGetIndexState(sw->index);
        const gpuivf::IvfPqModel &model = state->model;
        int         next_point = first;
        uint64      self = sw->sample->self_ids[q];

        if (state->meta.train_id != sw->meta.train_id)
            return false;
        if (sw->lut == NULL)
            sw->lut = (float *) palloc(sizeof(float) * gpuivf::ivfpq_lut_size(model));
        gpuivf::prepare_vector((gpuivf::Metric) sw->meta.metric,
                               sw->sample->queries + (Size) q * dims, sw->query_prep, dims);
        gpuivf::ivfpq_probe_lists(model, sw->query_prep, to, sw->order, sw->order_scores);
        for (int pos = from; pos < to; pos++)
        {
            int         list = sw->order[pos];

            if (list >= 0 && list < (int) sw->meta.lists)
                SweepScanList(sw, model, list, self, &sw->cands[q]);
            while (next_point <= last && (int) points[next_point] == pos + 1)
            {
                double      r = SweepRecall(sw, q);

                sw->sum[next_point] += r;
                sw->sumsq[next_point] += r * r;
                next_point++;
            }
            vacuum_delay_point();
            CHECK_FOR_INTERRUPTS();
        }
    }
    return true;
}

/* Heap TIDs of n entry ids (vector TIDs when the index stores vectors);
 * UINT64_MAX for padding or a vector tuple freed meanwhile. */
static void
EntryIdsToHeapIds(Relation index, const GpuivfMetaPageData *meta, const uint64 *ids, int64 n,
                  uint64 *heap_ids)
{
    for (int64 i = 0; i < n; i++)
    {
        ItemPointerData tid;
        Buffer      buf;
        Page        page;
        OffsetNumber off;

        heap_ids[i] = ids[i];
        if (ids[i] == PG_UINT64_MAX || !GpuivfMetaStoresVectors(meta))
            continue;
        heap_ids[i] = PG_UINT64_MAX;
        GpuivfIdToTid(ids[i], &tid);
        buf = ReadBuffer(index, ItemPointerGetBlockNumber(&tid));
        LockBuffer(buf, BUFFER_LOCK_SHARE);
        page = BufferGetPage(buf);
        off = ItemPointerGetOffsetNumber(&tid);
        if (GpuivfPageIsType(page, GPUIVF_PAGE_VECTOR) && off <= PageGetMaxOffsetNumber(page) &&
            ItemIdIsNormal(PageGetItemId(page, off)))
            heap_ids[i] = GpuivfTidToId(&((GpuivfVectorTuple *)
                                          PageGetItem(page, PageGetItemId(page, off)))->heaptid);
        UnlockReleaseBuffer(buf);
    }
}

/*
 * The stage of SweepStage measured through GpuivfSearchBatch instead, one
 * batch of all queries per point: what the GPU worker answers when it is
 * up.  k + 1 rows (and R + 1 candidates) are asked so that the query's own
 * row can be dropped.
 */
static bool
SearchStage(SweepState *sw, const uint32 *points, int first, int last)
{
    int         dims = (int) sw->meta.dims;
    GpuivfQuery *queries = (GpuivfQuery *) palloc(sizeof(GpuivfQuery) * sw->nq);
    GpuivfHit **hits = (GpuivfHit **) palloc(sizeof(GpuivfHit *) * sw->nq);
    int        *nhits = (int *) palloc(sizeof(int) * sw->nq);

    for (int j = first; j <= last; j++)
    {
        GpuivfSearchStats stats;

        if (GpuivfGetIndexState(sw->index)->meta.train_id != sw->meta.train_id)
            return false;
        for (int q = 0; q < sw->nq; q++)
        {
            queries[q].vector = sw->sample->queries + (Size) q * dims;
            queries[q].k = sw->k + 1;
            queries[q].nprobe = (int) points[j];
            /* one more candidate too: the own row is almost surely among them */
            queries[q].rerank = sw->rerank ? Min(sw->R + 1, gpuivf::kMaxK) : 0;
        }
        /* NULL: the metapage as it is now, not as the calibration began */
        GpuivfSearchBatch(sw->index, sw->nq, queries, hits, nhits, &stats, NULL);
        for (int q = 0; q < sw->nq; q++)
        {
            const uint64 *truth = sw->truth_heap + (Size) q * sw->k;
            int         ntruth = 0;
            int         found = 0;
            int         taken = 0;

            for (int t = 0; t < sw->k && truth[t] != PG_UINT64_MAX; t++)
                ntruth++;
            for (int h = 0; h < nhits[q] && taken < sw->k; h++)
            {
                uint64      id = GpuivfTidToId(&hits[q][h].tid);

                if (id == sw->sample->self_heap_ids[q])
                    continue;
                taken++;
                for (int t = 0; t < ntruth; t++)
                    if (truth[t] == id)
                    {
                        found++;
                        break;
                    }
            }
            {
                double      r = ntruth > 0 ? (double) found / ntruth : 1.0;

                sw->sum[j] += r;
                sw->sumsq[j] += r * r;
            }
            pfree(hits[q]);
        }
        CHECK_FOR_INTERRUPTS();
    }
    pfree(queries);
    pfree(hits);
    pfree(nhits);
    return true;
}

/*
 * Measure through GpuivfSearchBatch when the GPU worker answers it (one
 * batched search per point is cheap there); on the CPU the single-pass
 * sweep costs one ADC pass per query instead of one per point.  Building
 * with -DGPUIVF_CALIBRATE_VIA_SEARCH forces the search path, to check that
 * both measure the same curve.
 */
static bool
CalibrateViaSearch(const GpuivfMetaPageData *meta)
{
#ifdef GPUIVF_CALIBRATE_VIA_SEARCH
    return true;
#else
    /* every point within the GPU engine's nprobe limit: none falls back */
    return gpuivf_device != GPUIVF_DEVICE_CPU && GpuivfWorkerAvailable() &&
        meta->lists <= GPUIVF_GPU_MAX_NPROBE;
#endif
}

/* The calibration's searches go to the GPU worker (gpuivf.h). */
bool
GpuivfCalibrationSearchesOnGpu(const GpuivfMetaPageData *meta)
{
    return gpuivf_analyze_sample > 0 && CalibrateViaSearch(meta);
}

/* Mean recall measured at point j. */
static double
SweepMean(const SweepState *sw, int j)
{
    return sw->sum[j] / sw->nq;
}

/*
 * Measure the curve into calib (calib_npoints, calib_curve).  Returns false
 * when the index was rebuilt meanwhile.
 */
static bool
MeasureCurve(Relation index, const GpuivfMetaPageData *meta, const CalibSample *sample,
             const uint64 *truth, int k, GpuivfMetaPageData *calib)
{
    SweepState  sw;
    uint32      points[GPUIVF_CURVE_POINTS];
    int         npoints = SweepPoints((int) meta->lists, points);
    int         lists = (int) meta->lists;
    int         measured = 0;   /* points[0 .. measured) are done */
    int         stage_end_prev = -1;
    float      *cand_vals;
    uint64     *cand_ids;
    bool        via_search = CalibrateViaSearch(meta);

    memset(&sw, 0, sizeof(sw));
    sw.index = index;
    sw.meta = *meta;
    sw.nblocks = RelationGetNumberOfBlocks(index);
    sw.rerank = (meta->flags & GPUIVF_META_RERANK) != 0;
    sw.nq = sample->nq;
    sw.k = k;
    sw.R = Min(Max(gpuivf_rerank_candidates, k), gpuivf::kMaxK);
    sw.sample = sample;
    sw.truth = truth;
    if (via_search)
    {
        sw.truth_heap = (uint64 *) palloc(sizeof(uint64) * (Size) sw.nq * k);
        EntryIdsToHeapIds(index, meta, truth, (int64) sw.nq * k, sw.truth_heap);
    }
    sw.cands = (gpuivf::TopK *) palloc(sizeof(gpuivf::TopK) * sw.nq);
    cand_vals = (float *) palloc_extended(sizeof(float) * (Size) sw.nq * sw.R, MCXT_ALLOC_HUGE);
    cand_ids = (uint64 *) palloc_extended(sizeof(uint64) * (Size) sw.nq * sw.R, MCXT_ALLOC_HUGE);
    for (int q = 0; q < sw.nq; q++)
        gpuivf::topk_init(&sw.cands[q], cand_vals + (Size) q * sw.R, cand_ids + (Size) q * sw.R,
                          sw.R);
    sw.query_prep = (float *) palloc(sizeof(float) * meta->dims);
    sw.order = (int32 *) palloc(sizeof(int32) * lists);
    sw.order_scores = (float *) palloc(sizeof(float) * lists);
    sw.page_cap = (int) (GPUIVF_PAGE_CAPACITY /
                         (sizeof(ItemIdData) + GPUIVF_LIST_ENTRY_SIZE(meta->code_size))) + 1;
    sw.page_codes = (uint8 *) palloc((Size) sw.page_cap * meta->code_size);
    sw.page_ids = (uint64 *) palloc(sizeof(uint64) * sw.page_cap);
    sw.snap_vals = (float *) palloc(sizeof(float) * sw.R);
    sw.snap_ids = (uint64 *) palloc(sizeof(uint64) * sw.R);
    sw.sum = (double *) palloc0(sizeof(double) * npoints);
    sw.sumsq = (double *) palloc0(sizeof(double) * npoints);

    /*
     * With re-rank, nprobe = lists is the exact scan (recall 1 by
     * construction), so the ADC sweep stops before it.
     */
    while (measured < npoints)
    {
        int         limit = stage_end_prev < 0 ? GPUIVF_CALIB_DENSE : 2 * (int) points[stage_end_prev];
        int         last = measured;
        int         from = measured == 0 ? 0 : (int) points[measured - 1];
        bool        exact_point = sw.rerank && (int) points[measured] == lists;

        if (exact_point)
        {
            sw.sum[measured] = sw.nq;
            sw.sumsq[measured] = sw.nq;
            measured++;
            break;
        }
        while (last + 1 < npoints && (int) points[last + 1] <= limit &&
               !(sw.rerank && (int) points[last + 1] == lists))
            last++;
        if (via_search ? !SearchStage(&sw, points, measured, last)
            : !SweepStage(&sw, points, measured, last, from))
            return false;
        measured = last + 1;

        /* stop at recall 1, or when doubling nprobe closed less than a
         * tenth of the remaining gap to 1 (a plateau: the candidates, not
         * the lists, limit recall) */
        if (SweepMean(&sw, last) >= 1.0 ||
            (stage_end_prev >= 0 &&
             SweepMean(&sw, last) - SweepMean(&sw, stage_end_prev) <=
             GPUIVF_PLATEAU_FRACTION * (1.0 - SweepMean(&sw, stage_end_prev))))
            break;
        stage_end_prev = last;
    }

    /* points after the first perfect one add nothing (never chosen) */
    for (int j = 0; j < measured; j++)
        if (SweepMean(&sw, j) >= 1.0)
        {
            measured = j + 1;
            break;
        }
    calib->calib_npoints = (uint16) measured;
    for (int j = 0; j < measured; j++)
    {
        double      mean = SweepMean(&sw, j);
        double      var = sw.nq > 1
            ? Max(0.0, (sw.sumsq[j] - sw.nq * mean * mean) / (sw.nq - 1)) : 0.0;

        calib->calib_curve[j].nprobe = points[j];
        calib->calib_curve[j].recall = (float4) mean;
        calib->calib_curve[j].recall_se = (float4) sqrt(var / sw.nq);
    }
    calib->calib_rerank = sw.rerank ? (uint32) sw.R : 0;
    return true;
}

/* ----------------------------------------------------------- calibration */

/* GpuivfCalibrate in the calibration's memory context. */
static bool
CalibrateIn(Relation index, Relation heap, const GpuivfMetaPageData *meta,
            const CalibSample *drawn)
{
    int         k = GPUIVF_CALIBRATION_K;
    int         dims = (int) meta->dims;
    CalibSample sample;
    uint64     *truth;
    float      *truth_scores;
    GpuivfMetaPageData calib;
    Buffer      metabuf;
    bool        stored = false;
    TimestampTz t_start = GetCurrentTimestamp();
    TimestampTz t_sample;
    TimestampTz t_truth;
    bool        truth_on_gpu = false;
    bool        walked = true;

    /* a sample drawn over all the index's rows (the same rows a walk would
     * draw: no random draw happens before the reservoir is full) */
    if (drawn != NULL && drawn->dims == dims && (uint64) drawn->seen == meta->vectors)
    {
        sample = *drawn;
        walked = false;
    }
    else
    {
        CalibSampleInit(&sample, (int) Min((uint64) gpuivf_analyze_sample, meta->vectors), dims);
        WalkIndexedRows(index, heap, meta, SampleSink, &sample);
    }
    if (sample.nq < 2)
        return false;

    t_sample = GetCurrentTimestamp();
    truth = (uint64 *) palloc(sizeof(uint64) * (Size) sample.nq * k);
    truth_scores = (float *) palloc(sizeof(float) * (Size) sample.nq * k);
    GpuivfExactKnnForCalibration(index, heap, meta, sample.nq, sample.queries, sample.self_ids,
                                 k, truth, truth_scores, &truth_on_gpu);
    t_truth = GetCurrentTimestamp();

    memset(&calib, 0, sizeof(calib));
    if (!MeasureCurve(index, meta, &sample, truth, k, &calib))
        return false;
    elog(DEBUG1, "gpuivf index \"%s\" calibrated on %d queries: sample %.0f ms%s, exact top-%d on the %s %.0f ms, "
         "%d points up to nprobe %u of %u lists %.0f ms",
         RelationGetRelationName(index), sample.nq,
         TimestampDifferenceMilliseconds(t_start, t_sample) * 1.0,
         walked ? "" : " (drawn by the build's encoding scan)", k,
         truth_on_gpu ? "GPU" : "CPU",
         TimestampDifferenceMilliseconds(t_sample, t_truth) * 1.0, (int) calib.calib_npoints,
         calib.calib_curve[Max(calib.calib_npoints, 1) - 1].nprobe, meta->lists,
         TimestampDifferenceMilliseconds(t_truth, GetCurrentTimestamp()) * 1.0);
    calib.calib_sample = (uint32) sample.nq;
    calib.calib_vectors = meta->vectors;
    calib.calib_time = GetCurrentTimestamp();
    calib.calib_k = (uint16) k;

    /* store it unless the index was rebuilt meanwhile */
    metabuf = ReadBuffer(index, GPUIVF_METAPAGE_BLKNO);
    LockBuffer(metabuf, BUFFER_LOCK_EXCLUSIVE);
    if (GpuivfPageIsType(BufferGetPage(metabuf), GPUIVF_PAGE_META) &&
        GpuivfPageGetMeta(BufferGetPage(metabuf))->train_id == meta->train_id)
    {
        GpuivfLogCalibration(index, metabuf, &calib);
        stored = true;
    }
    UnlockReleaseBuffer(metabuf);
    return stored;
}

/* Measure the curve of an index and store it (gpuivf.h). */
bool
GpuivfCalibrate(Relation index, Relation heap, const GpuivfCalibSample *drawn)
{
    GpuivfMetaPageData meta;
    MemoryContext ctx;
    MemoryContext old;
    bool        own_heap = false;
    bool        stored;

    if (gpuivf_analyze_sample <= 0)
        return false;
    GpuivfReadMeta(index, &meta);
    if (!GpuivfMetaIsTrained(&meta) || meta.lists == 0 || meta.dims == 0 || meta.vectors < 2)
        return false;
    gpuivf::init_blas_single_threaded();
    if (heap == NULL && !GpuivfMetaStoresVectors(&meta))
    {
        /* the caller (VACUUM/ANALYZE) holds a lock on the table already */
        heap = table_open(IndexGetRelation(RelationGetRelid(index), false), AccessShareLock);
        own_heap = true;
    }

    ctx = AllocSetContextCreate(CurrentMemoryContext, "gpuivf calibration",
                                ALLOCSET_DEFAULT_SIZES);
    old = MemoryContextSwitchTo(ctx);
    stored = CalibrateIn(index, heap, &meta, drawn);
    MemoryContextSwitchTo(old);
    MemoryContextDelete(ctx);
    if (own_heap)
        table_close(heap, AccessShareLock);
    return stored;
}

/* VACUUM re-measures a missing or stale curve (gpuivf.h). */
bool
GpuivfCalibrationIsStale(const GpuivfMetaPageData *meta)
{
    double      then;

    if (!GpuivfMetaIsTrained(meta) || gpuivf_analyze_sample <= 0 || meta->vectors < 2)
        return false;
    if (meta->calib_k == 0 || meta->calib_npoints == 0)
        return true;
    then = (double) meta->calib_vectors;
    return fabs((double) meta->vectors - then) >= GPUIVF_STALE_FRACTION * Max(then, 1.0);
}

/* ------------------------------------------------------- choosing nprobe */

/* The curve's choice for target (gpuivf.h). */
int
GpuivfCurveProbes(const GpuivfMetaPageData *meta, double target, bool *reached)
{
    int         best = -1;
    int         n = Min((int) meta->calib_npoints, GPUIVF_CURVE_POINTS);

    *reached = false;
    if (!GpuivfMetaIsTrained(meta) || meta->calib_k == 0 || n == 0)
        return 0;
    for (int j = 0; j < n; j++)
    {
        const GpuivfCurvePoint *p = &meta->calib_curve[j];

        /* the lower end of a one-sided 95% interval meets the target;
         * + 1e-6: the float4 0.95f is below the float8 0.95 */
        if ((double) p->recall - GPUIVF_CURVE_CONFIDENCE_Z * (double) p->recall_se + 1e-6 >= target)
        {
            *reached = true;
            return (int) Min(Max(p->nprobe, (uint32) 1), meta->lists);
        }
        if (best < 0 || p->recall > meta->calib_curve[best].recall)
            best = j;
    }
    return (int) Min(Max(meta->calib_curve[best].nprobe, (uint32) 1), meta->lists);
}

/* Indexes (train_id, measurement) this backend has said "target not
 * reached" about, so that it says so once. */
#define GPUIVF_WARNED_MAX 64
typedef struct WarnedCurve
{
    uint64      train_id;
    int64       calib_time;
} WarnedCurve;
static WarnedCurve warned[GPUIVF_WARNED_MAX];
static int  nwarned = 0;

/* True the first time for this curve in this backend. */
static bool
FirstWarning(const GpuivfMetaPageData *meta)
{
    for (int i = 0; i < nwarned; i++)
        if (warned[i].train_id == meta->train_id && warned[i].calib_time == meta->calib_time)
            return false;
    if (nwarned < GPUIVF_WARNED_MAX)
    {
        warned[nwarned].train_id = meta->train_id;
        warned[nwarned].calib_time = meta->calib_time;
        nwarned++;
    }
    return true;
}

/* The nprobe a scan uses when gpuivf.probes = 0 (gpuivf.h). */
int
GpuivfProbesForScan(const GpuivfMetaPageData *meta, int k, bool *from_curve)
{
    bool        reached;
    int         nprobe = GpuivfCurveProbes(meta, gpuivf_target_recall, &reached);

    (void) k;                   /* the curve is measured at calib_k */
    if (nprobe <= 0)
    {
        if (from_curve)
            *from_curve = false;
        return GpuivfAutoProbes((int) meta->lists);
    }
    if (from_curve)
        *from_curve = true;
    if (!reached && FirstWarning(meta))
    {
        float       best = 0;

        for (int j = 0; j < meta->calib_npoints; j++)
            best = Max(best, meta->calib_curve[j].recall);
        ereport(NOTICE,
                (errmsg("gpuivf.target_recall %.3f is above the best recall ANALYZE measured for this index",
                        gpuivf_target_recall),
                 errdetail("The best measured recall@%d is %.3f at %d of %u lists; scans use that.",
                           (int) meta->calib_k, (double) best, nprobe, meta->lists),
                 errhint("Raise gpuivf.rerank_candidates and run ANALYZE, or REINDEX the index if its rows changed much since it was built.")));
    }
    return nprobe;
}
