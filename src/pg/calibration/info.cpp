/*
 * calibration/info.cpp — what gpuivf_index_info and gpuivf_calibrate show
 * of a calibration: where its queries came from, how many, when, the curve
 * per k, and what the index has recorded since (with the drift test's
 * numbers).  Never the query vectors themselves.
 */
#include "gpuivf.h"
#include "calibration/calibration.h"

/* One curve (of depth set d, k index c) as [{"nprobe", "recall", "se"}, ...]. */
static void
AppendCurve(StringInfo json, const GpuivfMetaPageData *meta, int d, int c)
{
    const GpuivfRecallPoint *points = GpuivfCalibPoints(meta, d, c);

    appendStringInfoChar(json, '[');
    for (int j = 0; j < Min((int) meta->calib_npoints, GPUIVF_CURVE_POINTS); j++)
        appendStringInfo(json, "%s{\"nprobe\": %u, \"recall\": %.4f, \"se\": %.4f}",
                         j > 0 ? ", " : "", meta->calib_nprobe[j],
                         (double) points[j].recall, (double) points[j].recall_se);
    appendStringInfoChar(json, ']');
}

/* The curves of depth set d as [{"k", "curve"}, ...]. */
static void
AppendCurves(StringInfo json, const GpuivfMetaPageData *meta, int d)
{
    appendStringInfoChar(json, '[');
    for (int c = 0, n = 0; c < GPUIVF_CURVE_KS; c++)
    {
        if (meta->calib_k[c] == 0)
            continue;
        appendStringInfo(json, "%s{\"k\": %u, \"curve\": ", n++ > 0 ? ", " : "", meta->calib_k[c]);
        AppendCurve(json, meta, d, c);
        appendStringInfoChar(json, '}');
    }
    appendStringInfoChar(json, ']');
}

/* A double as JSON (null when not finite). */
static void
AppendNumber(StringInfo json, double v)
{
    if (std::isfinite(v))
        appendStringInfo(json, "%.4g", v);
    else
        appendStringInfoString(json, "null");
}

/*
 * "calibration": null, or {"source": "rows" | "workload" | "given",
 * "sample" (queries measured), "stored_queries", "vectors" (rows then),
 * "measured_at", "rerank_candidates" (the re-rank depth of these curves;
 * 0: no re-rank),
 * "nearest_centre_distance" {"mean", "sd"}, "k": 10 and "curve"
 * (recall@10), "curves": [{"k", "curve"}, ...], "depths" (every re-rank
 * depth measured, ascending; none without re-rank) and "deeper_curves": [{"rerank_candidates",
 * "curves"}, ...] (the depths after the first)};
 * then "recorded_queries": {"recording" (this server records: preloaded,
 * gpuivf.query_sample > 0, not a standby), "capacity",
 * "seen" (queries since the last calibration on them), "held",
 * "nearest_centre_distance" (their mean), "drifted"}.  Both followed by ", ".
 */
void
GpuivfAppendCalibrationInfo(StringInfo json, Relation index, const GpuivfMetaPageData *meta)
{
    GpuivfRecordedInfo rec;
    int         k10 = -1;

    if (meta->calib_sample == 0 || meta->calib_npoints == 0)
        appendStringInfoString(json, "\"calibration\": null, ");
    else
    {
        for (int c = 0; c < GPUIVF_CURVE_KS; c++)
            if (meta->calib_k[c] == GPUIVF_CALIBRATION_K)
                k10 = c;
        appendStringInfo(json, "\"calibration\": {\"source\": \"%s\", \"sample\": %u, "
                         "\"stored_queries\": %u, \"vectors\": " UINT64_FORMAT ", "
                         "\"measured_at\": \"%s\", \"rerank_candidates\": %u, "
                         "\"nearest_centre_distance\": {\"mean\": ",
                         GpuivfCalibSourceName(meta->calib_source), meta->calib_sample,
                         meta->calib_query_count, meta->calib_vectors,
                         timestamptz_to_str(meta->calib_time),
                         meta->calib_rerank == 0 ? 0 : GpuivfCalibDepthAt(meta, 0));
        AppendNumber(json, meta->calib_nn_mean);
        appendStringInfoString(json, ", \"sd\": ");
        AppendNumber(json, meta->calib_nn_sd);
        appendStringInfoString(json, "}, ");
        if (k10 >= 0)
        {
            appendStringInfo(json, "\"k\": %d, \"curve\": ", GPUIVF_CALIBRATION_K);
            AppendCurve(json, meta, 0, k10);
            appendStringInfoString(json, ", ");
        }
        appendStringInfoString(json, "\"curves\": ");
        AppendCurves(json, meta, 0);
        appendStringInfoString(json, ", \"depths\": [");
        for (int d = 0; d < GpuivfCalibDepthCount(meta) && meta->calib_rerank > 0; d++)
            appendStringInfo(json, "%s%d", d > 0 ? ", " : "", GpuivfCalibDepthAt(meta, d));
        appendStringInfoString(json, "], \"deeper_curves\": [");
        for (int d = 1; d < GpuivfCalibDepthCount(meta); d++)
        {
            appendStringInfo(json, "%s{\"rerank_candidates\": %d, \"curves\": ", d > 1 ? ", " : "",
                             GpuivfCalibDepthAt(meta, d));
            AppendCurves(json, meta, d);
            appendStringInfoChar(json, '}');
        }
        appendStringInfoString(json, "]}, ");
    }

    GpuivfRecordedStats(index, (int) meta->dims, &rec);
    appendStringInfo(json, "\"recorded_queries\": {\"recording\": %s, \"capacity\": %d, "
                     "\"seen\": " UINT64_FORMAT ", \"held\": %d, \"nearest_centre_distance\": ",
                     rec.available && gpuivf_query_sample > 0 && !RecoveryInProgress() ? "true" : "false",
                     rec.capacity,
                     rec.seen, rec.held);
    AppendNumber(json, rec.held > 0 ? rec.nn_mean : NAN);
    appendStringInfo(json, ", \"drifted\": %s}, ",
                     rec.drift_said != 0 && rec.drift_said == meta->calib_id + 1 ? "true" : "false");
}
