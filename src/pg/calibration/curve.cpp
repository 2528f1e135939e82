/*
 * calibration/curve.cpp — ANALYZE calibrates nprobe to a recall target.
 *
 * A calibration measures, for one index, the recall@10 of its own search as a
 * function of nprobe, and stores that curve in the metapage
 * (GpuivfLogCalibration: one GenericXLog record, so it survives restarts and
 * reaches standbys).  Scans with gpuivf.probes = 0 then use the smallest
 * measured nprobe whose recall meets gpuivf.target_recall with 95% confidence
 * (GpuivfChooseProbes, search/probes.cpp), so changing the target takes
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
#include "calibration/calibration.h"
#include "calibration/sample.h"
#include "search/search.h"
#include "storage/storage.h"
#include "worker/worker.h"

#include <cmath>

#define GPUIVF_CALIB_DENSE      16      /* every nprobe up to this is a point */

#define GPUIVF_STALE_FRACTION   0.10
#define GPUIVF_PLATEAU_FRACTION 0.10

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
    int         code_size = sw->meta.code_size;
    int         n = GpuivfReadListPage(sw->index, blkno, code_size, sw->page_cap, sw->page_ids,
                                       sw->page_codes, next);
    int         kept = 0;

    for (int i = 0; i < n; i++)
    {
        if (sw->page_ids[i] == skip_id)
            continue;
        if (kept != i)
        {
            sw->page_ids[kept] = sw->page_ids[i];
            memcpy(sw->page_codes + (Size) kept * code_size,
                   sw->page_codes + (Size) i * code_size, code_size);
        }
        kept++;
    }
    return kept;
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
CalibrateViaSearch(Relation index, const GpuivfMetaPageData *meta)
{
#ifdef GPUIVF_CALIBRATE_VIA_SEARCH
    return true;
#else
    /* every point within the GPU engine's nprobe limit: none falls back */
    return gpuivf_device != GPUIVF_DEVICE_CPU && GpuivfWorkerAvailable() &&
        GpuivfWorkerCanRead(index) && meta->lists <= GPUIVF_GPU_MAX_NPROBE;
#endif
}

/* The calibration's searches go to the GPU worker (calibration.h). */
bool
GpuivfCalibrationSearchesOnGpu(Relation index, const GpuivfMetaPageData *meta)
{
    return gpuivf_analyze_sample > 0 && CalibrateViaSearch(index, meta);
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
    bool        via_search = CalibrateViaSearch(index, meta);

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
    sw.page_cap = GPUIVF_LIST_PAGE_CAPACITY(meta->code_size);
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

/* Measure the curve of an index and store it (calibration.h). */
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

/* VACUUM re-measures a missing or stale curve (calibration.h). */
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
