/*
 * am/info.cpp — the SQL function gpuivf_index_info(regclass): the metapage,
 * list sizes, where GPU workers hold the index, the recall curve and the
 * probes scans use now, as jsonb (one object per partition for a partitioned
 * index).  Also the checks and locks of the index argument every SQL
 * function taking an index shares (GpuivfCheckIndexArg,
 * GpuivfOpenCheckedIndex, GpuivfLockPartitionIndexes).
 */
#include "gpuivf.h"
#include "am/am.h"
#include "calibration/calibration.h"
#include "search/search.h"
#include "storage/storage.h"
#include "worker/worker.h"

extern "C" {
PG_FUNCTION_INFO_V1(gpuivf_index_info);
}

/* ------------------------------------------- the index of an SQL function */

/*
 * See am.h.  Everything is read from the syscache without a lock, so a role
 * without rights learns nothing and never waits for (or blocks) the lockers
 * of a table it may not read; GpuivfOpenCheckedIndex re-checks after locking
 * that the index still belongs to that table.
 */
Oid
GpuivfCheckIndexArg(Oid relid, bool *partitioned)
{
    HeapTuple   tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
    Form_pg_class form;
    char        relkind;
    Oid         relam;
    char        name[NAMEDATALEN];
    Oid         heapid;

    if (!HeapTupleIsValid(tuple))
        ereport(ERROR,
                (errcode(ERRCODE_UNDEFINED_OBJECT),
                 errmsg("relation with OID %u does not exist", relid)));
    form = (Form_pg_class) GETSTRUCT(tuple);
    relkind = form->relkind;
    relam = form->relam;
    strlcpy(name, NameStr(form->relname), sizeof(name));
    ReleaseSysCache(tuple);
    if ((relkind != RELKIND_INDEX && relkind != RELKIND_PARTITIONED_INDEX) ||
        relam != get_index_am_oid("gpuivf", false))
        ereport(ERROR,
                (errcode(ERRCODE_WRONG_OBJECT_TYPE),
                 errmsg("\"%s\" is not a gpuivf index", name)));
    heapid = IndexGetRelation(relid, true);
    if (!OidIsValid(heapid))
        ereport(ERROR,
                (errcode(ERRCODE_UNDEFINED_OBJECT),
                 errmsg("index \"%s\" has no table", name)));
    if (pg_class_aclcheck(heapid, GetUserId(), ACL_SELECT) != ACLCHECK_OK)
        ereport(ERROR,
                (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                 errmsg("permission denied for table %s", get_rel_name(heapid)),
                 errdetail("Functions of gpuivf that take an index require SELECT on its table.")));
    *partitioned = relkind == RELKIND_PARTITIONED_INDEX;
    return heapid;
}

/* See am.h; heapid comes from GpuivfCheckIndexArg. */
Relation
GpuivfOpenCheckedIndex(Oid relid, Oid heapid, Relation *heap)
{
    return GpuivfOpenCheckedIndexLocked(relid, heapid, AccessShareLock, AccessShareLock, heap);
}

/* See am.h. */
Relation
GpuivfOpenCheckedIndexLocked(Oid relid, Oid heapid, LOCKMODE heaplock, LOCKMODE indexlock,
                             Relation *heap)
{
    Relation    heaprel = table_open(heapid, heaplock);
    Relation    index = index_open(relid, indexlock);

    /* dropped and its OID reused meanwhile: not the index that was checked */
    if (IndexGetRelation(relid, true) != heapid ||
        index->rd_rel->relam != get_index_am_oid("gpuivf", false))
        ereport(ERROR,
                (errcode(ERRCODE_UNDEFINED_OBJECT),
                 errmsg("index \"%s\" changed while it was being opened",
                        RelationGetRelationName(index))));
    if (heap)
        *heap = heaprel;
    else
        table_close(heaprel, NoLock);
    return index;
}

/*
 * See am.h.  The partitioned table's lock keeps its set of partitions (DROP
 * and DETACH of a partition lock the parent exclusively); each leaf index is
 * opened later through GpuivfOpenCheckedIndex, which locks its table first.
 * A role that may read the partitioned table reads every partition through
 * it, so the leaves need no privilege check of their own.
 */
List *
GpuivfLockPartitionIndexes(Oid relid, Oid heapid)
{
    List       *all;
    List       *leaves = NIL;
    ListCell   *lc;

    LockRelationOid(heapid, AccessShareLock);
    LockRelationOid(relid, AccessShareLock);
    all = find_all_inheritors(relid, NoLock, NULL);
    foreach(lc, all)
    {
        Oid         child = lfirst_oid(lc);

        if (get_rel_relkind(child) == RELKIND_INDEX)
            leaves = lappend_oid(leaves, child);
    }
    return leaves;
}

/* ------------------------------------------------------ gpuivf_index_info */

/*
 * The calibration (calibration/info.cpp: "calibration", "recorded_queries")
 * and the nprobe scans use now: "probes" {"in_use" (a LIMIT of 10),
 * "by_limit" {"1", "10", "100": nprobe}, "source": "setting" | "curve" |
 * "automatic" | "exact", "target_recall", "target_source": "index option" |
 * "gpuivf.target_recall", "target_reached", "rerank_candidates" (the
 * re-rank depth in use, a LIMIT of 10; null without re-rank),
 * "rerank_source": "setting" | "curve" | "default"}.
 */
static void
AppendCalibration(StringInfo json, Relation index, const GpuivfMetaPageData *meta)
{
    static const int limits[] = {1, GPUIVF_CALIBRATION_K, 100};
    GpuivfProbeChoice by_limit[lengthof(limits)];
    const GpuivfProbeChoice *probes = &by_limit[1];

    for (int i = 0; i < (int) lengthof(limits); i++)
        GpuivfChooseProbes(index, meta, limits[i], 1.0, false, &by_limit[i]);
    GpuivfAppendCalibrationInfo(json, index, meta);
    appendStringInfo(json, "\"probes\": {\"in_use\": %d, \"by_limit\": {\"%d\": %d, \"%d\": %d, \"%d\": %d}, "
                     "\"source\": \"%s\", \"target_recall\": %.4f, \"target_source\": \"%s\", "
                     "\"target_reached\": %s, \"rerank_candidates\": %s, \"rerank_source\": \"%s\"}",
                     probes->nprobe, limits[0], by_limit[0].nprobe, limits[1], by_limit[1].nprobe,
                     limits[2], by_limit[2].nprobe, GpuivfProbeSourceName(probes->source, true),
                     probes->target, GpuivfTargetSourceName(probes->target_source),
                     probes->curve_nprobe > 0 ? (probes->target_reached ? "true" : "false") : "null",
                     GpuivfMetaReranks(meta) ? psprintf("%d", probes->depth) : "null",
                     GpuivfDepthSourceName(probes->depth_source, true));
}

/* The fields of gpuivf_index_info's object for one index (no braces). */
static void
AppendIndexInfo(StringInfo json, Relation index)
{
    GpuivfMetaPageData meta;
    BlockNumber pages = RelationGetNumberOfBlocks(index);
    bool        trained;
    uint64      version;

    GpuivfReadMeta(index, &meta);
    version = GpuivfReadRows(index, &meta);
    trained = GpuivfMetaIsTrained(&meta);
    appendStringInfo(json, "\"dims\": %u, \"metric\": \"%s\", \"lists\": %u, \"pq_m\": %u, "
                     "\"pq_bits\": %u, \"code_size\": %u, \"rerank\": %s, \"trained\": %s, "
                     "\"vectors\": " UINT64_FORMAT ", \"pages\": %u, ",
                     meta.dims, GpuivfMetricName(meta.metric), meta.lists, meta.pq_m,
                     meta.pq_bits, meta.code_size,
                     (meta.flags & GPUIVF_META_RERANK) ? "true" : "false",
                     trained ? "true" : "false", meta.vectors, pages);
    /* the column type, how the index keeps vector values, where re-ranking
     * reads them */
    appendStringInfo(json, "\"type\": \"%s\", \"storage\": \"%s\", \"rerank_from\": %s, ",
                     GpuivfVectorTypeName(GpuivfGetOpclassInfo(index).type),
                     meta.storage == GPUIVF_STORAGE_FLOAT16 ? "float16" : "float4",
                     !GpuivfMetaReranks(&meta) ? "null"
                     : GpuivfMetaRerankFromTable(&meta) ? "\"table\"" : "\"index\"");
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
        appendStringInfo(json, "\"list_size\": {\"min\": %u, \"avg\": %.3f, \"max\": %u}, ",
                         lo, (double) total / meta.lists, hi);
        pfree(dir);
    }
    else
        appendStringInfoString(json, "\"list_size\": null, ");
    /* which GPU workers hold the index */
    GpuivfAppendCacheInfo(json, index);
    appendStringInfo(json, "\"format_version\": %u, \"generation\": " UINT64_FORMAT
                     ", \"version\": " UINT64_FORMAT ", \"train_id\": " UINT64_FORMAT ", ",
                     meta.version, meta.generation, version, meta.train_id);
    AppendCalibration(json, index, &meta);
}

/*
 * gpuivf_index_info(regclass) returns jsonb: the metapage and list sizes.
 * For a partitioned index: {"partitioned": true, "vectors": the sum,
 * "partitions": [one object per partition's index, with its "index" and
 * "table" names]}.
 */
Datum
gpuivf_index_info(PG_FUNCTION_ARGS)
{
    Oid         relid = PG_GETARG_OID(0);
    bool        partitioned;
    Oid         heapid = GpuivfCheckIndexArg(relid, &partitioned);
    StringInfoData json;
    Oid         typinput;
    Oid         typioparam;

    initStringInfo(&json);
    if (!partitioned)
    {
        Relation    index = GpuivfOpenCheckedIndex(relid, heapid, NULL);

        appendStringInfoChar(&json, '{');
        AppendIndexInfo(&json, index);
        appendStringInfoChar(&json, '}');
        index_close(index, AccessShareLock);
    }
    else
    {
        List       *leaves = GpuivfLockPartitionIndexes(relid, heapid);
        ListCell   *lc;
        uint64      vectors = 0;
        StringInfoData parts;

        initStringInfo(&parts);
        foreach(lc, leaves)
        {
            Oid         leaf = lfirst_oid(lc);
            Oid         leafheap = IndexGetRelation(leaf, false);
            Relation    index = GpuivfOpenCheckedIndex(leaf, leafheap, NULL);
            GpuivfMetaPageData meta;

            GpuivfReadMeta(index, &meta);
            (void) GpuivfReadRows(index, &meta);
            vectors += meta.vectors;
            appendStringInfoString(&parts, foreach_current_index(lc) > 0 ? ", {\"index\": " : "{\"index\": ");
            escape_json(&parts, RelationGetRelationName(index));
            appendStringInfoString(&parts, ", \"table\": ");
            escape_json(&parts, get_rel_name(leafheap));
            appendStringInfoString(&parts, ", ");
            AppendIndexInfo(&parts, index);
            appendStringInfoChar(&parts, '}');
            index_close(index, AccessShareLock);
        }
        appendStringInfo(&json, "{\"partitioned\": true, \"vectors\": " UINT64_FORMAT
                         ", \"partitions\": [%s]}", vectors, parts.data);
    }
    /* through the type's input function: fmgrprotos.h has C++ linkage here */
    getTypeInputInfo(JSONBOID, &typinput, &typioparam);
    PG_RETURN_DATUM(OidInputFunctionCall(typinput, json.data, typioparam, -1));
}
