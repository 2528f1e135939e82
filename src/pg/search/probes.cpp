/*
 * search/probes.cpp — how many lists a query probes and how deep it
 * re-ranks, decided here and only here (GpuivfChooseProbes): gpuivf.probes
 * and gpuivf.rerank_candidates when set, else the cheapest (depth, nprobe)
 * of the recall curves for the query's LIMIT that ANALYZE measured
 * (calibration/curve.cpp: one set of curves per re-rank depth) that meets
 * the index's recall target (its target_recall option, else
 * gpuivf.target_recall), else the automatic ceil(sqrt(lists)) at the
 * default depth; the probes raised for a filter above the scan.  Scans, the
 * batched kNN join, the planner's costs, EXPLAIN (through the scan's
 * statistics), gpuivf_index_info and gpuivf_worker_search all ask this
 * function.
 */
#include "gpuivf.h"
#include "calibration/calibration.h"
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
 * Recall@k at point j of curve set d (a re-rank depth) as a scan of k rows
 * counts on it: the mean and the lower end of its one-sided 95% interval.
 * For a measured k its own curve; between two measured k the lower of the
 * two curves' values (recall@k at one nprobe falls as k grows, so the value
 * for k lies between them, and the lower is never above it); below the
 * smallest measured k the smallest's, above the largest the largest's.
 */
static void
PointRecall(const GpuivfMetaPageData *meta, int d, int lo, int hi, int j, double *recall,
            double *bound)
{
    const GpuivfRecallPoint *a = &GpuivfCalibPoints(meta, d, lo)[j];
    const GpuivfRecallPoint *b = &GpuivfCalibPoints(meta, d, hi)[j];

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

/*
 * The cost model of the (depth, nprobe) choice (search.h), in scalar
 * operations per query: the ADC scan of nprobe lists, each of mean size
 * vectors / lists, costs pq_m table look-ups per code; the exact re-rank
 * of GpuivfRerankCount(depth, k) candidates costs dims multiply-adds each.
 * It leaves out what both choices share (the probe order, the top-k
 * selections) and what differs by engine (on the GPU a candidate's vector
 * is a gather from memory, on the CPU a buffer read), which makes the
 * re-rank look cheaper than it is; but at the dimensions where a deeper
 * re-rank is measured at all (calibration/curve.cpp) one probe saved is
 * worth far more: at 5M x 768 with 2,236 lists and pq_m 96 a probe scans
 * ~2,236 codes (215k look-ups), while 200 more candidates cost 154k
 * multiply-adds.  So a deeper depth wins when it saves a few probes, and
 * the default depth when both need about as many.
 */
double
GpuivfSearchCost(const GpuivfMetaPageData *meta, int k, int nprobe, int depth)
{
    double      list_size = meta->lists > 0 ? (double) meta->vectors / meta->lists : 0;
    double      scan = (double) nprobe * list_size * Max((int) meta->pq_m, 1);
    double      rerank = 0;

    if (GpuivfMetaReranks(meta))
        rerank = (double) GpuivfRerankCount(depth, k > 0 ? k : GPUIVF_CALIBRATION_K) *
            meta->dims;
    return scan + rerank;
}

/* The curve set a scan at an explicit re-rank depth reads: the deepest
 * measured at or below it (its recall is never above what the scan gets:
 * deeper keeps a superset of the candidates), else the shallowest. */
static int
CurveSetFor(const GpuivfMetaPageData *meta, int depth)
{
    int         best = 0;

    for (int d = 1; d < GpuivfCalibDepthCount(meta); d++)
        if (GpuivfCalibDepthAt(meta, d) <= depth)
            best = d;
    return best;
}

/* The curves' choice for target at k rows (search.h). */
int
GpuivfCurveProbes(const GpuivfMetaPageData *meta, int k, double target, int depth,
                  int *curve_depth, double *curve_recall, bool *reached)
{
    int         n = Min((int) meta->calib_npoints, GPUIVF_CURVE_POINTS);
    int         nd = GpuivfCalibDepthCount(meta);
    int         first = 0;
    int         lo;
    int         hi;
    int         met_d = -1;
    int         met_j = -1;
    double      met_cost = 0;
    double      met_recall = 0;
    int         best_d = -1;
    int         best_j = -1;
    double      best_recall = -1;

    *reached = false;
    *curve_depth = 0;
    *curve_recall = 0;
    if (!GpuivfMetaIsTrained(meta) || nd == 0 || n == 0)
        return 0;
    CurvesFor(meta, k > 0 ? k : GPUIVF_CALIBRATION_K, &lo, &hi);
    if (lo < 0)
        return 0;
    if (depth > 0)
    {
        first = CurveSetFor(meta, depth);
        nd = first + 1;
    }
    for (int d = first; d < nd; d++)
    {
        for (int j = 0; j < n; j++)
        {
            double      recall;
            double      bound;

            PointRecall(meta, d, lo, hi, j, &recall, &bound);
            if (BoundMeets(bound, target))
            {
                /* the first point of a depth meeting it is its cheapest */
                double      cost = GpuivfSearchCost(meta, k, (int) meta->calib_nprobe[j],
                                                    GpuivfCalibDepthAt(meta, d));

                if (met_d < 0 || cost < met_cost)
                {
                    met_d = d;
                    met_j = j;
                    met_cost = cost;
                    met_recall = recall;
                }
                break;
            }
            /* the best recall: on a tie the shallower depth, the fewer probes */
            if (recall > best_recall)
            {
                best_d = d;
                best_j = j;
                best_recall = recall;
            }
        }
    }
    if (met_d >= 0)
    {
        *reached = true;
        best_d = met_d;
        best_j = met_j;
        best_recall = met_recall;
    }
    *curve_depth = GpuivfCalibDepthAt(meta, best_d);
    *curve_recall = best_recall;
    return (int) Min(Max(meta->calib_nprobe[best_j], (uint32) 1), meta->lists);
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

/*
 * The NOTICE a scan gives, once per backend and calibration, when no curve
 * reaches the target and the best point is used instead.  The hint says
 * what will help: without re-rank, re-ranking; with a re-rank depth set,
 * leaving the depth to the calibration; a calibration that measured one
 * depth (its target was met, or it is from before depths were measured),
 * measuring again under this target; else (the deepest re-rank ANALYZE
 * measured still falls short: the PQ codes order the true neighbours too
 * far down) finer PQ codes, or a rebuild when the rows drifted since
 * training.
 */
static void
NoticeTargetNotReached(Relation index, const GpuivfMetaPageData *meta, int k,
                       const GpuivfProbeChoice *choice, int nprobe)
{
    int         depth_set = gpuivf_rerank_candidates;
    int         at_depth = choice->curve_depth;
    double      best = choice->curve_recall;    /* the best point's: target not reached */

    if (!FirstWarning(meta))
        return;
    ereport(NOTICE,
            (errmsg("recall target %.3f of index \"%s\" (%s) is above the best recall ANALYZE measured",
                    choice->target, RelationGetRelationName(index),
                    GpuivfTargetSourceName(choice->target_source)),
             !GpuivfMetaReranks(meta)
             ? errdetail("The best measured recall@%d is %.3f at %d of %u lists, without re-ranking; scans use that.",
                         k > 0 ? k : GPUIVF_CALIBRATION_K, best, nprobe, meta->lists)
             : errdetail("The best measured recall@%d is %.3f at %d of %u lists, re-ranking %d candidates for up to 10 rows; scans use that.",
                         k > 0 ? k : GPUIVF_CALIBRATION_K, best, nprobe, meta->lists, at_depth),
             !GpuivfMetaReranks(meta)
             ? errhint("Rebuild the index with the option rerank = true, so that candidates are re-ranked with exact distances, or with a larger pq_m.")
             : depth_set > 0 && depth_set < gpuivf::kMaxK
             ? errhint("Reset gpuivf.rerank_candidates so that scans use the deeper re-ranks ANALYZE measures, or raise it and run ANALYZE.")
             : GpuivfCalibDepthCount(meta) == 1 && at_depth < gpuivf::kMaxK
             ? errhint("Run ANALYZE on the table with this recall target in force: it measures deeper re-ranks when the default depth cannot meet the target.")
             : errhint("Rebuild the index with a larger pq_m (finer PQ codes rank the true neighbours among fewer candidates), or REINDEX it if its rows changed much since it was built.")));
}

/* How many lists a query probes, how deep it re-ranks (search.h). */
void
GpuivfChooseProbes(Relation index, const GpuivfMetaPageData *meta, int k, double filter_sel,
                   bool notice, GpuivfProbeChoice *choice)
{
    int         lists = (int) meta->lists;
    int         nprobe;

    memset(choice, 0, sizeof(*choice));
    choice->target = GpuivfTargetRecall(index, &choice->target_source);
    /* an explicit gpuivf.rerank_candidates is taken as it is */
    choice->depth = gpuivf_rerank_candidates > 0 ? gpuivf_rerank_candidates
        : GPUIVF_DEFAULT_RERANK_DEPTH;
    choice->depth_source = gpuivf_rerank_candidates > 0 ? GPUIVF_DEPTH_SETTING
        : GPUIVF_DEPTH_DEFAULT;
    if (!GpuivfMetaIsTrained(meta) || lists == 0)
    {
        choice->source = GPUIVF_PROBES_UNTRAINED;
        return;                 /* nprobe 0: the exact scan */
    }
    choice->curve_nprobe = GpuivfCurveProbes(meta, k, choice->target, gpuivf_rerank_candidates,
                                             &choice->curve_depth, &choice->curve_recall,
                                             &choice->target_reached);
    /* the depth of the curves' choice (also under gpuivf.probes: the depth
     * the target needs); one measured depth is the default's */
    if (choice->curve_nprobe > 0 && gpuivf_rerank_candidates <= 0 && GpuivfMetaReranks(meta))
    {
        choice->depth = choice->curve_depth;
        choice->depth_source = GpuivfCalibDepthCount(meta) > 1 ? GPUIVF_DEPTH_CURVE
            : GPUIVF_DEPTH_DEFAULT;
    }
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

/* The name of a GPUIVF_DEPTH_* source: in EXPLAIN's "Re-rank Depth From",
 * or (json) as gpuivf_index_info's "rerank_source". */
const char *
GpuivfDepthSourceName(int source, bool json)
{
    switch (source)
    {
        case GPUIVF_DEPTH_SETTING:
            return json ? "setting" : "gpuivf.rerank_candidates";
        case GPUIVF_DEPTH_CURVE:
            return json ? "curve" : "tuned curve";
        default:
            return "default";
    }
}
