/*
 * am/worker_search.cpp — the SQL function gpuivf_worker_search:
 * one query answered by the GPU worker, whatever gpuivf.device says (a
 * diagnostic that compares the worker's answer with the CPU's).
 */
#include "gpuivf.h"
#include "am/am.h"
#include "search/search.h"
#include "storage/storage.h"
#include "worker/worker.h"

/* ------------------------------------------------- gpuivf_worker_search */

extern "C" {
PG_FUNCTION_INFO_V1(gpuivf_worker_search);
}

/*
 * gpuivf_worker_search(index, query, k, nprobe) -> (heap_tid, distance):
 * the k nearest rows as the GPU worker answers them (a diagnostic: compare
 * with the CPU's answer of ORDER BY ... LIMIT k under the same probes).
 * Always asks the worker, whatever gpuivf.device says.
 */
Datum
gpuivf_worker_search(PG_FUNCTION_ARGS)
{
    ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
    Oid         relid = PG_GETARG_OID(0);
    int         k = PG_GETARG_INT32(2);
    int         nprobe = PG_GETARG_INT32(3);
    bool        partitioned;
    Oid         heapid;
    Relation    index;
    GpuivfMetaPageData meta;
    GpuivfQuery query;
    GpuivfProbeChoice probes;
    GpuivfHit  *hits = NULL;
    int         nhits = 0;
    int         dims;
    int         saved_device = gpuivf_device;
    bool        served;

    InitMaterializedSRF(fcinfo, 0);
    heapid = GpuivfCheckIndexArg(relid, &partitioned);
    if (partitioned)
    {
        char       *name = get_rel_name(relid);

        ereport(ERROR,
                (errcode(ERRCODE_WRONG_OBJECT_TYPE),
                 errmsg("\"%s\" is a partitioned index", name),
                 errdetail("gpuivf_worker_search searches one index, and a partitioned index has one for each partition."),
                 errhint("Call gpuivf_worker_search on each partition's index; SELECT relid FROM pg_partition_tree('%s') WHERE isleaf lists them.",
                         name)));
    }
    index = GpuivfOpenCheckedIndex(relid, heapid, NULL);
    if (k < 1 || k > GPUIVF_GPU_MAX_K)
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                 errmsg("k must be between 1 and %d", GPUIVF_GPU_MAX_K)));
    GpuivfReadMeta(index, &meta);
    /* real[] whatever the column's type: vector and halfvec cast to it */
    query.vector = GpuivfDatumGetVector(GPUIVF_TYPE_REAL_ARRAY, PG_GETARG_DATUM(1), &dims);
    /* what a scan of this index would probe (unless nprobe is given) and
     * how deep it would re-rank */
    GpuivfChooseProbes(index, &meta, k, 1.0, false, &probes);
    if (nprobe <= 0)
        nprobe = probes.nprobe;
    query.k = k;
    query.nprobe = nprobe;
    query.rerank = (meta.flags & GPUIVF_META_RERANK) ? GpuivfRerankCount(probes.depth, k) : 0;

    /* what the worker never takes, said precisely */
    if (!GpuivfWorkerCanRead(index) || !GpuivfMetaIsTrained(&meta) ||
        GpuivfQueryIsExact(&meta, &query))
        ereport(ERROR,
                (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                 errmsg("the gpuivf GPU worker does not search index \"%s\" this way",
                        RelationGetRelationName(index)),
                 !GpuivfWorkerCanRead(index)
                 ? errdetail("A temporary index is searched by its own backend, on the CPU.")
                 : !GpuivfMetaIsTrained(&meta)
                 ? errdetail("An untrained index is searched exactly, on the CPU.")
                 : errdetail("Probing all %u lists of an index that stores vectors is an exact scan, which runs on the CPU.",
                             meta.lists),
                 errhint("Compare with the query itself under gpuivf.device = \"cpu\".")));
    if (!GpuivfQueryMatchesIndex(index, &meta, dims))
    {
        index_close(index, AccessShareLock);
        return (Datum) 0;       /* the index holds no vector */
    }
    GpuivfRaiseGpuLimit(index, &query);

    gpuivf_device = GPUIVF_DEVICE_GPU;
    GpuivfWorkerOnlyCaller = "gpuivf_worker_search";
    PG_TRY();
    {
        served = GpuivfSearchOnWorker(index, 1, &query, &hits, &nhits, NULL, &meta);
    }
    PG_FINALLY();
    {
        gpuivf_device = saved_device;
        GpuivfWorkerOnlyCaller = NULL;
    }
    PG_END_TRY();
    if (!served)                /* cannot happen: raised above or inside */
        elog(ERROR, "the gpuivf GPU worker did not serve a search of index \"%s\"",
             RelationGetRelationName(index));
    for (int i = 0; i < nhits; i++)
    {
        Datum       values[2];
        bool        nulls[2] = {false, false};
        ItemPointer tid = (ItemPointer) palloc(sizeof(ItemPointerData));

        *tid = hits[i].tid;
        values[0] = PointerGetDatum(tid);
        values[1] = Float8GetDatum(hits[i].distance);
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
    index_close(index, AccessShareLock);
    return (Datum) 0;
}
