/*
 * am/info.cpp — the SQL function gpuivf_index_info(regclass): the metapage,
 * list sizes, where GPU workers hold the index, the recall curve and the
 * probes scans use now, as jsonb.  Also the opening of an index that every
 * SQL function taking an index shares (OpenGpuivfIndex).
 */
#include "gpuivf.h"
#include "am/am.h"
#include "search/search.h"
#include "storage/storage.h"
#include "worker/worker.h"

extern "C" {
PG_FUNCTION_INFO_V1(gpuivf_index_info);
}

/* ------------------------------------------------------ opening an index */

/* Open relid as a gpuivf index under AccessShareLock; the table first (the
 * order every other path locks them in), returned in *heap when asked. */
Relation
OpenGpuivfIndex(Oid relid, Relation *heap)
{
    Oid         heapid;
    Relation    heaprel;
    Relation    index;
    Oid         amoid = get_index_am_oid("gpuivf", false);

    if (get_rel_relkind(relid) != RELKIND_INDEX)
        ereport(ERROR,
                (errcode(ERRCODE_WRONG_OBJECT_TYPE),
                 errmsg("\"%s\" is not a gpuivf index", get_rel_name(relid) ? get_rel_name(relid) : "?")));
    heapid = IndexGetRelation(relid, false);
    heaprel = table_open(heapid, AccessShareLock);
    index = index_open(relid, AccessShareLock);
    if (index->rd_rel->relam != amoid)
        ereport(ERROR,
                (errcode(ERRCODE_WRONG_OBJECT_TYPE),
                 errmsg("\"%s\" is not a gpuivf index", RelationGetRelationName(index))));
    if (IndexGetRelation(relid, false) != heapid)
        ereport(ERROR,
                (errcode(ERRCODE_UNDEFINED_TABLE),
                 errmsg("could not open the table of index \"%s\"", RelationGetRelationName(index))));
    if (pg_class_aclcheck(heapid, GetUserId(), ACL_SELECT) != ACLCHECK_OK)
        ereport(ERROR,
                (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                 errmsg("permission denied for table %s", RelationGetRelationName(heaprel))));
    if (heap)
        *heap = heaprel;
    else
        table_close(heaprel, AccessShareLock);
    return index;
}

/* ------------------------------------------------------ gpuivf_index_info */

/*
 * The recall curve ANALYZE measured and the nprobe
 * scans use now: "calibration" (null when never measured) and "probes"
 * {"in_use", "source": "setting" | "curve" | "automatic", "target_recall",
 * "target_source": "index option" | "gpuivf.target_recall", "target_reached"}.
 */
static void
AppendCalibration(StringInfo json, Relation index, const GpuivfMetaPageData *meta)
{
    GpuivfProbeChoice probes;

    GpuivfChooseProbes(index, meta, 0, 1.0, false, &probes);
    if (meta->calib_k == 0 || meta->calib_npoints == 0)
        appendStringInfoString(json, "\"calibration\": null, ");
    else
    {
        appendStringInfo(json, "\"calibration\": {\"k\": %u, \"sample\": %u, "
                         "\"rerank_candidates\": %u, \"vectors\": " UINT64_FORMAT ", "
                         "\"measured_at\": \"%s\", \"curve\": [",
                         meta->calib_k, meta->calib_sample, meta->calib_rerank,
                         meta->calib_vectors, timestamptz_to_str(meta->calib_time));
        for (int j = 0; j < Min((int) meta->calib_npoints, GPUIVF_CURVE_POINTS); j++)
            appendStringInfo(json, "%s{\"nprobe\": %u, \"recall\": %.4f, \"se\": %.4f}",
                             j > 0 ? ", " : "", meta->calib_curve[j].nprobe,
                             (double) meta->calib_curve[j].recall,
                             (double) meta->calib_curve[j].recall_se);
        appendStringInfoString(json, "]}, ");
    }
    appendStringInfo(json, "\"probes\": {\"in_use\": %d, \"source\": \"%s\", "
                     "\"target_recall\": %.4f, \"target_source\": \"%s\", \"target_reached\": %s}",
                     probes.nprobe, GpuivfProbeSourceName(probes.source, true), probes.target,
                     GpuivfTargetSourceName(probes.target_source),
                     probes.curve_nprobe > 0 ? (probes.target_reached ? "true" : "false") : "null");
}

/* gpuivf_index_info(regclass) returns jsonb: the metapage and list sizes. */
Datum
gpuivf_index_info(PG_FUNCTION_ARGS)
{
    Oid         relid = PG_GETARG_OID(0);
    Relation    index = OpenGpuivfIndex(relid, NULL);
    GpuivfMetaPageData meta;
    StringInfoData json;
    BlockNumber pages = RelationGetNumberOfBlocks(index);
    bool        trained;
    Oid         typinput;
    Oid         typioparam;

    GpuivfReadMeta(index, &meta);
    trained = GpuivfMetaIsTrained(&meta);
    initStringInfo(&json);
    appendStringInfo(&json, "{\"dims\": %u, \"metric\": \"%s\", \"lists\": %u, \"pq_m\": %u, "
                     "\"pq_bits\": %u, \"code_size\": %u, \"rerank\": %s, \"trained\": %s, "
                     "\"vectors\": " UINT64_FORMAT ", \"pages\": %u, ",
                     meta.dims, GpuivfMetricName(meta.metric), meta.lists, meta.pq_m,
                     meta.pq_bits, meta.code_size,
                     (meta.flags & GPUIVF_META_RERANK) ? "true" : "false",
                     trained ? "true" : "false", meta.vectors, pages);
    if (trained)
    {
        GpuivfListDirEntry *dir = (GpuivfListDirEntry *)
            palloc_extended((Size) meta.lists * sizeof(GpuivfListDirEntry), MCXT_ALLOC_HUGE);
        uint64      total = 0;
        uint32      lo = PG_UINT32_MAX;
        uint32      hi = 0;

        GpuivfReadRawPages(index, meta.directory_start, meta.directory_pages,
                           GPUIVF_PAGE_DIRECTORY, dir,
                           (Size) meta.lists * sizeof(GpuivfListDirEntry));
        for (uint32 l = 0; l < meta.lists; l++)
        {
            total += dir[l].count;
            lo = Min(lo, dir[l].count);
            hi = Max(hi, dir[l].count);
        }
        appendStringInfo(&json, "\"list_size\": {\"min\": %u, \"avg\": %.3f, \"max\": %u}, ",
                         lo, (double) total / meta.lists, hi);
    }
    else
        appendStringInfoString(&json, "\"list_size\": null, ");
    /* which GPU workers hold the index */
    GpuivfAppendCacheInfo(&json, index);
    appendStringInfo(&json, "\"format_version\": %u, \"generation\": " UINT64_FORMAT
                     ", \"train_id\": " UINT64_FORMAT ", ",
                     meta.version, meta.generation, meta.train_id);
    AppendCalibration(&json, index, &meta);
    appendStringInfoChar(&json, '}');
    index_close(index, AccessShareLock);
    /* through the type's input function: fmgrprotos.h has C++ linkage here */
    getTypeInputInfo(JSONBOID, &typinput, &typioparam);
    PG_RETURN_DATUM(OidInputFunctionCall(typinput, json.data, typioparam, -1));
}
