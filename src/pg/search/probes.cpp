/*
 * search/probes.cpp — how many lists a query probes, decided here and only
 * here (GpuivfChooseProbes): gpuivf.probes when set, else the smallest point
 * of the recall curve for the query's LIMIT that ANALYZE measured
 * (calibration/curve.cpp) that meets
 * the index's recall target (its target_recall option, else
 * gpuivf.target_recall), else the automatic ceil(sqrt(lists)); the last two
 * raised for a filter above the scan.  Scans, the batched kNN join, the
 * planner's costs, EXPLAIN (through the scan's statistics),
 * gpuivf_index_info and gpuivf_worker_search all ask this function.
 */
#include "gpuivf.h"
#include "search/search.h"

#include <cmath>

/*
 * A point meets a target when recall - z * standard error >= target, with z
 * of a one-sided 95% interval.  The sample is small (200 queries: the
 * standard error is about 0.006 at recall 0.95), and choosing the first
 * point whose mean happens to clear the target would, about half the time
 * at the boundary, land on one whose true recall is below it.  The cost is
 * usually one point more (a few lists).
 */
#define GPUIVF_CURVE_CONFIDENCE_Z 1.645

/* ceil(sqrt(lists)): the probes without a setting and without a curve. */
static int
GpuivfAutoProbes(int lists)
{
    if (lists <= 1)
        return 1;
    return (int) ceil(sqrt((double) lists));
}

/* The measured curves a scan of k rows reads: *lo the largest measured k
 * at or below k, *hi the smallest at or above it (indexes into calib_k);
 * both the smallest below the smallest measured k, both the largest above
 * the largest; -1 / -1 without a curve. */
static void
CurvesFor(const GpuivfMetaPageData *meta, int k, int *lo, int *hi)
{
    *lo = *hi = -1;
    for (int c = 0; c < GPUIVF_CURVE_KS; c++)
    {
        if (meta->calib_k[c] == 0)
            continue;
        if ((int) meta->calib_k[c] <= k)
            *lo = c;
        if (*hi < 0 && (int) meta->calib_k[c] >= k)
            *hi = c;
    }
    if (*lo < 0)
        *lo = *hi;
    if (*hi < 0)
        *hi = *lo;
}

/*
 * Recall@k at point j as a scan of k rows counts on it: the mean and the
 * lower end of its one-sided 95% interval.  For a measured k its own
 * curve; between two measured k the lower of the two curves' values
 * (recall@k at one nprobe falls as k grows, so the value for k lies between
 * them, and the lower is never above it); below the smallest measured k the
 * smallest's, above the largest the largest's.
 */
static void
PointRecall(const GpuivfMetaPageData *meta, int lo, int hi, int j, double *recall,
            double *bound)
{
    const GpuivfRecallPoint *a = &meta->calib_recall[lo][j];
    const GpuivfRecallPoint *b = &meta->calib_recall[hi][j];

    *recall = Min((double) a->recall, (double) b->recall);
    *bound = Min((double) a->recall - GPUIVF_CURVE_CONFIDENCE_Z * (double) a->recall_se,
                 (double) b->recall - GPUIVF_CURVE_CONFIDENCE_Z * (double) b->recall_se);
}

/* The lower end of a one-sided 95% interval meets the target; + 1e-6: the
 * float4 0.95f is below the float8 0.95.  The one rule of scans and of the
 * calibration's sweep. */
static bool
BoundMeets(double bound, double target)
{
    return bound + 1e-6 >= target;
}

/* Does a curve point of mean recall and standard error se meet target
 * (search.h)? */
bool
GpuivfCurvePointMeets(double recall, double se, double target)
{
    return BoundMeets(recall - GPUIVF_CURVE_CONFIDENCE_Z * se, target);
}

/* The curve's choice for target at k rows (search.h). */
int
GpuivfCurveProbes(const GpuivfMetaPageData *meta, int k, double target, bool *reached)
{
    int         best = -1;
    double      best_recall = -1;
    int         n = Min((int) meta->calib_npoints, GPUIVF_CURVE_POINTS);
    int         lo;
    int         hi;

    *reached = false;
    if (!GpuivfMetaIsTrained(meta) || meta->calib_sample == 0 || n == 0)
        return 0;
    CurvesFor(meta, k > 0 ? k : GPUIVF_CALIBRATION_K, &lo, &hi);
    if (lo < 0)
        return 0;
    for (int j = 0; j < n; j++)
    {
        double      recall;
        double      bound;

        PointRecall(meta, lo, hi, j, &recall, &bound);
        if (BoundMeets(bound, target))
        {
            *reached = true;
            return (int) Min(Max(meta->calib_nprobe[j], (uint32) 1), meta->lists);
        }
        if (recall > best_recall)
        {
            best = j;
            best_recall = recall;
        }
    }
    return (int) Min(Max(meta->calib_nprobe[best], (uint32) 1), meta->lists);
}

/* The best recall@k the curves promise: what a target above it gets. */
static double
CurveBestRecall(const GpuivfMetaPageData *meta, int k)
{
    double      best = 0;
    int         lo;
    int         hi;

    CurvesFor(meta, k > 0 ? k : GPUIVF_CALIBRATION_K, &lo, &hi);
    for (int j = 0; lo >= 0 && j < Min((int) meta->calib_npoints, GPUIVF_CURVE_POINTS); j++)
    {
        double      recall;
        double      bound;

        PointRecall(meta, lo, hi, j, &recall, &bound);
        best = Max(best, recall);
    }
    return best;
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

/* The NOTICE a scan gives, once per backend and curve, when the curve
 * cannot reach the target and its best point is used instead. */
static void
NoticeTargetNotReached(Relation index, const GpuivfMetaPageData *meta, int k,
                       const GpuivfProbeChoice *choice, int nprobe)
{
    if (!FirstWarning(meta))
        return;
    ereport(NOTICE,
            (errmsg("recall target %.3f of index \"%s\" (%s) is above the best recall ANALYZE measured",
                    choice->target, RelationGetRelationName(index),
                    GpuivfTargetSourceName(choice->target_source)),
             errdetail("The best measured recall@%d is %.3f at %d of %u lists; scans use that.",
                       k > 0 ? k : GPUIVF_CALIBRATION_K, CurveBestRecall(meta, k), nprobe,
                       meta->lists),
             errhint("Raise gpuivf.rerank_candidates and run ANALYZE, or REINDEX the index if its rows changed much since it was built.")));
}

/* How many lists a query probes (search.h). */
void
GpuivfChooseProbes(Relation index, const GpuivfMetaPageData *meta, int k, double filter_sel,
                   bool notice, GpuivfProbeChoice *choice)
{
    int         lists = (int) meta->lists;
    int         nprobe;

    memset(choice, 0, sizeof(*choice));
    choice->target = GpuivfTargetRecall(index, &choice->target_source);
    if (!GpuivfMetaIsTrained(meta) || lists == 0)
    {
        choice->source = GPUIVF_PROBES_UNTRAINED;
        return;                 /* nprobe 0: the exact scan */
    }
    choice->curve_nprobe = GpuivfCurveProbes(meta, k, choice->target, &choice->target_reached);
    if (gpuivf_probes > 0)
    {
        /* an explicit gpuivf.probes is taken as it is, filter or not */
        nprobe = gpuivf_probes;
        choice->source = GPUIVF_PROBES_SETTING;
    }
    else
    {
        if (choice->curve_nprobe > 0)
        {
            nprobe = choice->curve_nprobe;
            choice->source = GPUIVF_PROBES_CURVE;
            if (!choice->target_reached && notice)
                NoticeTargetNotReached(index, meta, k, choice, nprobe);
        }
        else
        {
            nprobe = GpuivfAutoProbes(lists);
            choice->source = GPUIVF_PROBES_AUTO;
        }

        /*
         * The nearest rows that pass a filter of selectivity s are about the
         * k/s nearest rows of all, which lie in more lists than the k
         * nearest: probe 1/sqrt(s) times as many (a measured compromise:
         * 1% filters reach recall@10 ~0.9 where the unraised probes gave
         * ~0.7).
         */
        if (filter_sel > 0 && filter_sel < 1)
            nprobe = (int) Min((double) lists, ceil(nprobe / sqrt(filter_sel)));
    }
    choice->nprobe = Min(Max(nprobe, 1), lists);
}

/* The name of a GPUIVF_PROBES_* source: in EXPLAIN's "Probes From", or
 * (json) as gpuivf_index_info's "source". */
const char *
GpuivfProbeSourceName(int source, bool json)
{
    switch (source)
    {
        case GPUIVF_PROBES_SETTING:
            return json ? "setting" : "gpuivf.probes";
        case GPUIVF_PROBES_CURVE:
            return json ? "curve" : "tuned curve";
        case GPUIVF_PROBES_AUTO:
            return "automatic";
        default:
            return json ? "exact" : "untrained index";
    }
}
