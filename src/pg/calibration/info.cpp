/*
 * calibration/info.cpp — what gpuivf_index_info and gpuivf_calibrate show
 * of a calibration: where its queries came from, how many, when, the curve
 * per k, and what the index has recorded since (with the drift test's
 * numbers).  Never the query vectors themselves.
 */
#include "gpuivf.h"
#include "calibration/calibration.h"

/* One curve as [{"nprobe", "recall", "se"}, ...]. */
static void
AppendCurve(StringInfo json, const GpuivfMetaPageData *meta, int c)
{
    appendStringInfoChar(json, '[');
    for (int j = 0; j < Min((int) meta->calib_npoints, GPUIVF_CURVE_POINTS); j++)
        appendStringInfo(json, "%s{\"nprobe\": %u, \"recall\": %.4f, \"se\": %.4f}",
                         j > 0 ? ", " : "", meta->calib_nprobe[j],
                         (double) meta->calib_recall[c][j].recall,
                         (double) meta->calib_recall[c][j].recall_se);
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
 * "measured_at", "rerank_candidates", "nearest_centre_distance" {"mean",
 * "sd"}, "k": 10 and "curve" (recall@10), "curves": [{"k", "curve"}, ...]};
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
                         timestamptz_to_str(meta->calib_time), meta->calib_rerank);
        AppendNumber(json, meta->calib_nn_mean);
        appendStringInfoString(json, ", \"sd\": ");
        AppendNumber(json, meta->calib_nn_sd);
        appendStringInfoString(json, "}, ");
        if (k10 >= 0)
        {
            appendStringInfo(json, "\"k\": %d, \"curve\": ", GPUIVF_CALIBRATION_K);
            AppendCurve(json, meta, k10);
            appendStringInfoString(json, ", ");
        }
        appendStringInfoString(json, "\"curves\": [");
        for (int c = 0, n = 0; c < GPUIVF_CURVE_KS; c++)
        {
            if (meta->calib_k[c] == 0)
                continue;
            appendStringInfo(json, "%s{\"k\": %u, \"curve\": ", n++ > 0 ? ", " : "", meta->calib_k[c]);
            AppendCurve(json, meta, c);
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
