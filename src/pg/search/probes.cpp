/*
 * search/probes.cpp — how many lists a query probes: gpuivf.probes when
 * set, else the smallest point of the recall curve ANALYZE measured
 * (calibration/curve.cpp) that meets gpuivf.target_recall, else the
 * automatic ceil(sqrt(lists)).
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

/* Probes used when gpuivf.probes = 0: ceil(sqrt(lists)). */
int
GpuivfAutoProbes(int lists)
{
    if (lists <= 1)
        return 1;
    return (int) ceil(sqrt((double) lists));
}

/* The number of lists round 1 probes: the setting or the automatic value,
 * within [1, lists]. */
int
GpuivfScanProbes(int lists)
{
    int         nprobe = gpuivf_probes > 0 ? gpuivf_probes : GpuivfAutoProbes(lists);

    if (nprobe > lists)
        nprobe = lists;
    if (nprobe < 1)
        nprobe = 1;
    return nprobe;
}

/* ------------------------------------------------------- choosing nprobe */

/* The curve's choice for target (search.h). */
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

/* The nprobe a scan uses when gpuivf.probes = 0 (search.h). */
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
