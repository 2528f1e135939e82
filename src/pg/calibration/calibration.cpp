/*
 * calibration/calibration.cpp — ANALYZE calibrates nprobe to a recall target,
 * on the queries the index answers.
 *
 * A calibration measures, for one index, recall@k of its own search for
 * k = 1, 10, 100 as functions of nprobe (calibration/curve.cpp) and stores
 * the curves in the metapage, with the queries it measured on when they
 * are not rows of the index (calibration/stored.cpp: WAL-logged pages, so
 * restarts and standbys keep them).  Scans with gpuivf.probes = 0 then use
 * the smallest measured nprobe whose recall at their LIMIT meets the
 * index's recall target with 95% confidence (search/probes.cpp), so
 * changing the target takes effect at once, without measuring again.
 *
 * When: ANALYZE (amvacuumcleanup with analyze_only: plain ANALYZE and
 * autovacuum's auto-analyze), the end of CREATE INDEX / REINDEX, a VACUUM
 * that finds the curves missing or stale (VACUUM ANALYZE never calls the AM
 * with analyze_only, so autovacuum's combined runs would otherwise never
 * re-measure), and gpuivf_calibrate (calibration/given.cpp).
 *
 * The queries, N = gpuivf.analyze_sample of them:
 *   - workload: the queries recorded since the last calibration on them
 *     (calibration/recorded.cpp), newest set first, then the stored set of
 *     the last calibration, up to N: when there are N together.  So a
 *     calibration on few new queries mixes them with the last one's, and the
 *     oldest fall out first;
 *   - given: the stored set, when gpuivf_calibrate gave it, is measured on
 *     again (with any recorded queries first) even when it has fewer than
 *     N; gpuivf_calibrate(index, NULL) goes back to rows;
 *   - rows: otherwise a sample of the index's rows (calibration/sample.cpp),
 *     each query's own row left out of its truth and its candidates.
 * Their ground truth is their exact top 100 among all rows
 * (GpuivfExactKnnForCalibration), on the GPU worker when one is up, else
 * on the CPU: at the end of a parallel build shared by its workers and the
 * leader (am/build_truth.cpp), with the same result.
 *
 * Alongside, the queries' mean L2 distance to their nearest list centre
 * (and its spread) is stored: recorded queries that lie much farther from
 * (or nearer to) the centres are a drift the curves may not cover
 * (calibration/recorded.cpp says so, once).
 */
#include "gpuivf.h"
#include "calibration/calibration.h"
#include "calibration/sample.h"
#include "storage/storage.h"

#include <cmath>

#define GPUIVF_STALE_FRACTION   0.10
#define GPUIVF_CALIB_TRUTH_K    100

/* The k measured: recall@1, @10, @100 (calibration.h). */
const int   GpuivfCalibKs[GPUIVF_CURVE_KS] = {1, 10, GPUIVF_CALIB_TRUTH_K};

StaticAssertDecl(GPUIVF_CURVE_KS == 3, "GpuivfCalibKs lists one k per curve");

/* "rows", "workload", "given" (calibration.h) */
const char *
GpuivfCalibSourceName(int source)
{
    switch (source)
    {
        case GPUIVF_CALIB_ROWS:
            return "rows";
        case GPUIVF_CALIB_WORKLOAD:
            return "workload";
        case GPUIVF_CALIB_GIVEN:
            return "given";
    }
    return "none";
}

/*
 * The re-rank depth of a stored calibration's curve set d (calibration.h).
 * A calibration stored before depths were recorded (calib_depth 0) kept
 * calib_rerank = the most candidates any k kept, GpuivfRerankCount(R, 100)
 * = min(max(10 R, 100), kMaxK) at its depth R: strictly between 100 and
 * kMaxK that gives R back; at either bound it was most likely measured at
 * the default depth (R >= 103 reaches kMaxK), which is what scans assumed
 * of it then.
 */
int
GpuivfCalibDepthAt(const GpuivfMetaPageData *meta, int d)
{
    uint32      kept = meta->calib_rerank;

    if (d > 0 && d <= (int) GPUIVF_CALIB_DEEPER)
        return (int) meta->calib_deep_depth[d - 1];
    if (meta->calib_depth > 0)
        return (int) meta->calib_depth;
    if (kept > 100 && kept < (uint32) gpuivf::kMaxK)
        return (int) (kept / 10);
    return GPUIVF_DEFAULT_RERANK_DEPTH;
}

/* A sample of query vectors that are not rows of the index (no own row):
 * na of a, then nb of b. */
static void
QuerySample(CalibSample *s, const float4 *a, int na, const float4 *b, int nb, int dims)
{
    int         nq = na + nb;

    CalibSampleInit(s, Max(nq, 1), dims);
    if (na > 0)
        memcpy(s->queries, a, sizeof(float4) * (Size) na * dims);
    if (nb > 0)
        memcpy(s->queries + (Size) na * dims, b, sizeof(float4) * (Size) nb * dims);
    for (int q = 0; q < nq; q++)
        s->self_ids[q] = s->self_heap_ids[q] = PG_UINT64_MAX;
    s->nq = nq;
    s->seen = nq;
    s->finished = true;         /* in the order given, not by hash */
}

/*
 * The workload queries of a calibration by ANALYZE: recorded ones first,
 * then the stored set, N at most; false (rows) when they are fewer than N
 * and the stored set was not given.  *ticket: what to mark consumed (0:
 * no recorded query is used).
 */
static bool
WorkloadQueries(Relation index, const GpuivfMetaPageData *meta, CalibSample *s, int *source,
                uint64 *ticket)
{
    int         N = gpuivf_analyze_sample;
    int         dims = (int) meta->dims;
    float4     *recorded;
    int         nrec = GpuivfRecordedTake(index, dims, N, &recorded, ticket);
    float4     *stored = NULL;
    int         nstored = 0;
    bool        given = meta->calib_source == GPUIVF_CALIB_GIVEN;

    if (nrec < N && meta->calib_query_count > 0)
        stored = GpuivfReadStoredQueries(index, meta, &nstored);
    if ((nrec + nstored < N && !(stored != NULL && given)) || nrec + nstored < 2)
    {
        *ticket = 0;
        return false;
    }
    QuerySample(s, recorded, nrec, stored, Min(nstored, N - nrec), dims);
    *source = nrec > 0 ? GPUIVF_CALIB_WORKLOAD : (int) meta->calib_source;
    if (nrec == 0)
        *ticket = 0;
    return true;
}

/* Mean and standard deviation of the queries' L2 distance to their nearest
 * list centre (in the space the centres live in). */
static void
NearestCentreStats(Relation index, const CalibSample *s, float4 *mean, float4 *sd)
{
    GpuivfIndexState *st = GpuivfGetIndexState(index);
    int         dims = s->dims;
    float      *prep = (float *) palloc_extended(sizeof(float) * (Size) s->nq * dims, MCXT_ALLOC_HUGE);
    int32      *labels = (int32 *) palloc(sizeof(int32) * s->nq);
    float      *dists = (float *) palloc(sizeof(float) * s->nq);
    gpuivf::CancelHook cancel = {GpuivfShouldCancel, NULL};
    double      sum = 0;
    double      sumsq = 0;

    *mean = *sd = 0;
    for (int q = 0; q < s->nq; q++)
        gpuivf::prepare_vector((gpuivf::Metric) st->meta.metric, s->queries + (Size) q * dims,
                               prep + (Size) q * dims, dims);
    GpuivfRaiseStatus(gpuivf::assign_nearest(st->centroids, st->centroid_norms,
                                             (int) st->meta.lists, dims, prep, s->nq, labels,
                                             dists, &cancel));
    for (int q = 0; q < s->nq; q++)
    {
        double      d = sqrt(Max((double) dists[q], 0.0));

        sum += d;
        sumsq += d * d;
    }
    if (s->nq > 0)
    {
        double      m = sum / s->nq;

        *mean = (float4) m;
        *sd = (float4) sqrt(Max(sumsq / s->nq - m * m, 0.0));
    }
}

/*
 * GpuivfCalibrate / GpuivfCalibrateOn in the calibration's memory context.
 * given: the queries (with source GIVEN), or NULL to choose (workload, else
 * rows); rows_only: rows, forgetting stored queries.
 */
static bool
CalibrateIn(Relation index, Relation heap, const GpuivfMetaPageData *meta,
            const CalibSample *drawn, GpuivfTruthHelpers *helpers, const float4 *given,
            int ngiven, bool rows_only)
{
    int         K = GPUIVF_CALIB_TRUTH_K;
    int         dims = (int) meta->dims;
    CalibSample sample;
    int         source = GPUIVF_CALIB_ROWS;
    uint64      ticket = 0;
    uint64     *truth;
    float      *truth_scores;
    GpuivfMetaPageData calib;
    bool        stored;
    TimestampTz t_start = GetCurrentTimestamp();
    TimestampTz t_sample;
    TimestampTz t_truth;
    bool        truth_on_gpu = false;
    bool        measured;
    const char *how = "";

    if (given != NULL)
    {
        QuerySample(&sample, given, ngiven, NULL, 0, dims);
        source = GPUIVF_CALIB_GIVEN;
    }
    else if (!rows_only && WorkloadQueries(index, meta, &sample, &source, &ticket))
        how = ticket != 0 ? " (recorded and stored queries)" : " (stored queries)";
    else if (drawn != NULL && drawn->dims == dims && (uint64) drawn->seen == meta->vectors)
    {
        /* a sample drawn over all the index's rows (the rows a walk would
         * draw: the sample is chosen by hash, whatever the order of the rows) */
        sample = *drawn;
        how = " (drawn by the build's encoding scan)";
    }
    else
    {
        CalibSampleInit(&sample, (int) Min((uint64) gpuivf_analyze_sample, meta->vectors), dims);
        WalkIndexedRows(index, heap, meta, SampleSink, &sample);
    }
    CalibSampleFinish(&sample);
    if (sample.nq < 2)
        return false;

    t_sample = GetCurrentTimestamp();
    truth = (uint64 *) palloc(sizeof(uint64) * (Size) sample.nq * K);
    truth_scores = (float *) palloc(sizeof(float) * (Size) sample.nq * K);
    GpuivfExactKnnForCalibration(index, heap, meta, sample.nq, sample.queries, sample.self_ids,
                                 K, truth, truth_scores, &truth_on_gpu, helpers);
    t_truth = GetCurrentTimestamp();

    memset(&calib, 0, sizeof(calib));
    measured = MeasureCurves(index, meta, &sample, truth, GpuivfCalibKs, GPUIVF_CURVE_KS, helpers,
                             &calib);
    if (helpers != NULL)
        helpers->end(helpers);
    if (!measured)
        return false;
    NearestCentreStats(index, &sample, &calib.calib_nn_mean, &calib.calib_nn_sd);
    elog(DEBUG1, "gpuivf index \"%s\" calibrated on %d queries from %s%s: sample %.0f ms, exact top-%d on the %s%s %.0f ms, "
         "%d points up to nprobe %u of %u lists%s %.0f ms",
         RelationGetRelationName(index), sample.nq, GpuivfCalibSourceName(source), how,
         TimestampDifferenceMilliseconds(t_start, t_sample) * 1.0, K,
         truth_on_gpu ? "GPU" : "CPU",
         helpers != NULL && helpers->participants > 1 ?
         psprintf(" (%d processes)", helpers->participants) : "",
         TimestampDifferenceMilliseconds(t_sample, t_truth) * 1.0, (int) calib.calib_npoints,
         calib.calib_nprobe[Max(calib.calib_npoints, 1) - 1], meta->lists,
         helpers != NULL && helpers->swept ?
         psprintf(" (%d processes)", helpers->participants) : "",
         TimestampDifferenceMilliseconds(t_truth, GetCurrentTimestamp()) * 1.0);
    calib.calib_sample = (uint32) sample.nq;
    calib.calib_vectors = meta->vectors;
    calib.calib_time = GetCurrentTimestamp();
    calib.calib_source = (uint16) source;

    /* rows are not stored: the next calibration draws rows again */
    stored = GpuivfStoreCalibration(index, meta->train_id, &calib,
                                    source == GPUIVF_CALIB_ROWS ? NULL : sample.queries,
                                    sample.nq, dims);
    if (stored && ticket != 0)
        GpuivfRecordedConsumed(ticket);
    return stored;
}

/* The work of GpuivfCalibrate and GpuivfCalibrateOn. */
static bool
Calibrate(Relation index, Relation heap, const GpuivfCalibSample *drawn,
          GpuivfTruthHelpers *helpers, const float4 *given, int ngiven, bool rows_only)
{
    GpuivfMetaPageData meta;
    MemoryContext ctx;
    MemoryContext old;
    bool        own_heap = false;
    bool        stored;

    GpuivfReadMeta(index, &meta);
    (void) GpuivfReadRows(index, &meta);
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
    stored = CalibrateIn(index, heap, &meta, drawn, helpers, given, ngiven, rows_only);
    MemoryContextSwitchTo(old);
    MemoryContextDelete(ctx);
    if (own_heap)
        table_close(heap, AccessShareLock);
    return stored;
}

/* Measure the curves of an index and store them (calibration.h). */
bool
GpuivfCalibrate(Relation index, Relation heap, const GpuivfCalibSample *drawn,
                GpuivfTruthHelpers *helpers)
{
    if (gpuivf_analyze_sample <= 0)
        return false;
    return Calibrate(index, heap, drawn, helpers, NULL, 0, false);
}

/* The same on given queries, or on rows (calibration.h). */
bool
GpuivfCalibrateOn(Relation index, Relation heap, const float4 *queries, int nq)
{
    return Calibrate(index, heap, NULL, NULL, queries, nq, queries == NULL);
}

/* VACUUM re-measures a missing or stale curve (calibration.h). */
bool
GpuivfCalibrationIsStale(const GpuivfMetaPageData *meta)
{
    double      then;

    if (!GpuivfMetaIsTrained(meta) || gpuivf_analyze_sample <= 0 || meta->vectors < 2)
        return false;
    if (meta->calib_sample == 0 || meta->calib_npoints == 0)
        return true;
    then = (double) meta->calib_vectors;
    return fabs((double) meta->vectors - then) >= GPUIVF_STALE_FRACTION * Max(then, 1.0);
}
