/*
 * am/scan.cpp — index scans: ORDER BY col <op> constant, answered in
 * rounds.
 *
 *  round 1   GpuivfSearchBatch with nq = 1 (search/dispatch.cpp: the GPU worker
 *            or the CPU engine): the nprobe best lists, ADC k-selection of
 *            GpuivfRerankCount(depth, k) candidates (the re-rank depth,
 *            search/probes.cpp), exact re-rank, the k best.  k is the rows
 *            the query needs when the planner integration knows it
 *            (limit_hint: LIMIT + OFFSET, raised for a filter above the
 *            scan, planner/knn_node.cpp), else the depth.  A batched kNN join may have
 *            computed it ahead of time (GpuivfTakeRoundOne).
 *  revisit   when the executor wants more: all entries of the round-1 lists
 *            in ADC order, minus those already returned, in chunks, each
 *            chunk re-ranked and sorted.
 *  more      further rounds over the remaining lists in probe order, each
 *            round as many lists as all rounds before it (nprobe doubles),
 *            until every list was visited (every indexed row is reachable)
 *            or gpuivf.max_probes lists were.
 *  exact     when nprobe covers every list and the index stores vectors, or
 *            the index is untrained: with a limit hint round 1 is the exact
 *            top k (a bounded heap) and, only if the executor wants more,
 *            the rest; without a hint every distance at once.  Either way
 *            the rows are sorted lazily in doubling chunks — the same order
 *            as a sequential scan.
 *
 * Round 1 returns heap TIDs; later rounds skip rows round 1 returned by heap
 * TID, and list entries they already handed out by entry id.  Without stored
 * vectors (rerank = false) rows come in ADC order with the ADC distance.
 * Returned distances are the order-by values; the executor does not recheck
 * them.  Order: exact within round 1 and within each later chunk; a later
 * chunk may hold a row closer than the last one of the chunk before (see
 * README.md, "Ordering").
 *
 * Memory: everything lives in palloc'd plain arrays, in a context of the
 * scan (scan_ctx) and a child reset at every rescan (query_ctx).  The model
 * (rd_amcache) is fetched again in each phase that needs it, because a
 * relcache flush between two gettuple calls may free it.
 *
 * This file: the AM callbacks, the start of a (re)scan, round 1 and exact
 * scans; the rows a scan holds and re-ranking: scan_rows.cpp; the rounds
 * past round 1: scan_deepen.cpp (the map: scan.h).
 */
#include "gpuivf.h"
#include "am/am.h"
#include "am/scan.h"
#include "calibration/calibration.h"
#include "search/search.h"
#include "storage/storage.h"

#include <algorithm>
#include <cmath>

#include "access/relscan.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/bufmgr.h"
#include "utils/array.h"
#include "utils/memutils.h"
#include "utils/rel.h"

/* the pending limit hint of the next scan descriptor (am.h) */
int64       gpuivf_pending_limit_hint = 0;
double      gpuivf_pending_filter_sel = 1.0;
Oid         gpuivf_pending_limit_index = InvalidOid;

/* ------------------------------------------------------------- phases */

/*
 * Exact mode: the distance of every row (search/rows.cpp: the vector
 * tuples, or the table's rows), sorted lazily by GpuivfEnsureSorted.
 * Memory: one 16-byte GpuivfResult per row (MemoryContextAllocHuge, 16 MB
 * per million rows), not bounded by work_mem: bounding it would mean
 * reading every row again for each chunk of rows; the LIMIT case never gets
 * here before round 1 returned the exact top k with O(k) memory
 * (search/cpu.cpp, SearchExact).
 */
void
GpuivfScanExact(Relation index, GpuivfScanOpaque so)
{
    if (so->bas == NULL)
    {
        /* made here, not at beginscan: only exact scans read every page */
        MemoryContext oldcxt = MemoryContextSwitchTo(so->scan_ctx);

        so->bas = GetAccessStrategy(BAS_BULKREAD);
        MemoryContextSwitchTo(oldcxt);
    }
    if (so->rd_exact.widened == NULL)
        GpuivfRowDistanceInit(&so->rd_exact, index, &so->meta, so->query, true);
    GpuivfForEachRow(index, &so->meta, so->bas, GpuivfAddExactResult, so);
    /* sorted lazily, chunk by chunk (GpuivfEnsureSorted) */
    so->nsorted = 0;
}

/*
 * Round 1 (see the file comment): one GpuivfSearchBatch query, or the hits
 * a batched kNN join computed for exactly this query.
 */
static void
GpuivfScanRoundOne(Relation index, GpuivfScanOpaque so)
{
    GpuivfHit  *hits = NULL;
    int         nhits = 0;
    GpuivfSearchStats st;

    if (GpuivfTakeRoundOne(index, &so->meta, &so->q, (int) so->meta.dims, &hits, &nhits, &st))
    {
        /* the batch's engine time and re-ranks are the batch node's */
        so->stats.precomputed++;
        so->stats.on_gpu += st.on_gpu ? 1 : 0;
        so->stats.batch_sum += st.batch_size;
    }
    else
    {
        GpuivfSearchBatch(index, 1, &so->q, &hits, &nhits, &st, &so->meta);
        so->stats.on_gpu += st.on_gpu ? 1 : 0;
        so->stats.batch_sum += st.batch_size;
        so->stats.gpu_ms += st.gpu_ms;
        so->stats.queue_ms += st.queue_ms;
        so->stats.reranked += st.reranked;
    }

    GpuivfReserveResults(so, nhits);
    so->round1_ids = (uint64 *) palloc(sizeof(uint64) * Max(nhits, 1));
    for (int i = 0; i < nhits; i++)
    {
        GpuivfResult *r = &so->results[so->nresults++];

        r->distance = hits[i].distance;
        r->heapid = GpuivfTidToId(&hits[i].tid);
        so->round1_ids[i] = r->heapid;
    }
    so->nround1 = nhits;
    so->nsorted = so->nresults;     /* hits come sorted */
    /* std::sort, not qsort: inlined comparisons; every statement sorts its
     * k ids here */
    std::sort(so->round1_ids, so->round1_ids + nhits);
    pfree(hits);
}

/*
 * The work of the first gettuple after a (re)scan: read the metapage,
 * choose the mode and produce the first results.
 */
static void
GpuivfStartScan(IndexScanDesc scan)
{
    Relation    index = scan->indexRelation;
    GpuivfScanOpaque so = (GpuivfScanOpaque) scan->opaque;
    GpuivfProbeChoice choice;

    GpuivfCheckDevice();
    GpuivfReadMeta(index, &so->meta);     /* checks the format too */
    pgstat_count_index_scan(index);
    so->phase = GPUIVF_PHASE_DONE;
    if (so->no_rows || so->meta.dims == 0 ||
        !GpuivfQueryMatchesIndex(index, &so->meta, so->query_dims))
        return;

    so->metric = (gpuivf::Metric) so->meta.metric;
    so->rerank = GpuivfMetaIsTrained(&so->meta) && (so->meta.flags & GPUIVF_META_RERANK) != 0;
    so->rerank_table = so->rerank && GpuivfMetaRerankFromTable(&so->meta);
    so->nlist = GpuivfMetaIsTrained(&so->meta) ? (int) so->meta.lists : 0;
    GpuivfRowDistanceInit(&so->rd, index, &so->meta, so->query, false);

    GpuivfMakeQuery(index, &so->meta, so->limit_hint, so->filter_sel, so->query, &so->q, &choice);
    so->depth = choice.depth;
    so->stats.target_recall = GpuivfTargetRecall(index, &so->stats.target_source);
    /* the workload ANALYZE calibrates on (calibration/recorded.cpp) */
    GpuivfRecordQuery(index, &so->meta, so->query, so->query_dims);
    so->exact = GpuivfQueryIsExact(&so->meta, &so->q);
    so->stats.scans++;
    so->stats.k_sum += so->q.k;
    so->stats.probes_sum += so->exact ? so->nlist : so->q.nprobe;
    so->stats.probe_source = choice.source;
    so->stats.depth = so->rerank ? choice.depth : 0;
    so->stats.depth_source = choice.depth_source;
    so->stats.lists_max = Max(so->stats.lists_max, (int64) (so->exact ? so->nlist : so->q.nprobe));
    if (so->exact)
        so->stats.exact++;

    if (so->exact && so->limit_hint <= 0)
    {
        /* no LIMIT known: every row, sorted at once */
        GpuivfScanExact(index, so);
        so->stats.reranked += so->nresults;
        return;
    }

    GpuivfScanRoundOne(index, so);
    so->phase = so->exact ? GPUIVF_PHASE_EXACT_REST : GPUIVF_PHASE_START;
}

/*
 * Tells a scan how many rows its query needs (0 = unknown), before the
 * next rescan: round 1 then asks the engine for that many rows.  The
 * planner integration (planner/knn_node.cpp) sets it from the LIMIT;
 * PostgreSQL itself never passes a LIMIT down.
 */
void
GpuivfScanSetLimitHint(IndexScanDesc scan, int64 rows)
{
    GpuivfScanOpaque so = (GpuivfScanOpaque) scan->opaque;

    so->limit_hint = Max(rows, 0);
}

/* Tells a scan the selectivity of the filter applied to its rows (1 = none),
 * before the next rescan: round 1 probes more lists (GpuivfMakeQuery). */
void
GpuivfScanSetFilterSelectivity(IndexScanDesc scan, double sel)
{
    GpuivfScanOpaque so = (GpuivfScanOpaque) scan->opaque;

    so->filter_sel = (sel > 0 && sel < 1) ? sel : 1.0;
}

/* What the scans of this descriptor did (EXPLAIN ANALYZE). */
const GpuivfScanStats *
GpuivfScanGetStats(IndexScanDesc scan)
{
    GpuivfScanOpaque so = (GpuivfScanOpaque) scan->opaque;

    return so != NULL ? &so->stats : NULL;
}

/* ------------------------------------------------------- AM callbacks */

/* Starts a scan: the scan's memory contexts and the order-by value slots. */
IndexScanDesc
gpuivfbeginscan(Relation index, int nkeys, int norderbys)
{
    IndexScanDesc scan = RelationGetIndexScan(index, nkeys, norderbys);
    MemoryContext scan_ctx;
    GpuivfScanOpaque so;

    scan_ctx = AllocSetContextCreate(CurrentMemoryContext, "gpuivf scan",
                                     ALLOCSET_DEFAULT_SIZES);
    so = (GpuivfScanOpaque) MemoryContextAllocZero(scan_ctx, sizeof(GpuivfScanOpaqueData));
    so->scan_ctx = scan_ctx;
    so->query_ctx = AllocSetContextCreate(scan_ctx, "gpuivf scan query",
                                          ALLOCSET_DEFAULT_SIZES);
    so->bas = NULL;             /* the first exact scan makes it */
    so->phase = GPUIVF_PHASE_DONE;
    so->no_rows = true;
    so->filter_sel = 1.0;
    if (gpuivf_pending_limit_index == RelationGetRelid(index))
    {
        so->limit_hint = Max(gpuivf_pending_limit_hint, 0);
        so->filter_sel = gpuivf_pending_filter_sel;
        gpuivf_pending_limit_index = InvalidOid;
        gpuivf_pending_limit_hint = 0;
        gpuivf_pending_filter_sel = 1.0;
    }

    scan->xs_orderbyvals = (Datum *) MemoryContextAllocZero(scan_ctx, sizeof(Datum) * Max(norderbys, 1));
    scan->xs_orderbynulls = (bool *) MemoryContextAlloc(scan_ctx, sizeof(bool) * Max(norderbys, 1));
    memset(scan->xs_orderbynulls, true, sizeof(bool) * Max(norderbys, 1));
    scan->opaque = so;
    return scan;
}

/*
 * (Re)starts a scan with new keys: forgets everything of the previous
 * query and keeps a checked copy of the query vector.  The work itself
 * happens at the first gettuple.
 */
void
gpuivfrescan(IndexScanDesc scan, ScanKey keys, int nkeys, ScanKey orderbys, int norderbys)
{
    GpuivfScanOpaque so = (GpuivfScanOpaque) scan->opaque;
    MemoryContext oldcxt;
    int64       limit_hint = so->limit_hint;
    double      filter_sel = so->filter_sel;
    GpuivfScanStats stats = so->stats;

    if (keys && scan->numberOfKeys > 0)
        memmove(scan->keyData, keys, scan->numberOfKeys * sizeof(ScanKeyData));
    if (orderbys && scan->numberOfOrderBys > 0)
        memmove(scan->orderByData, orderbys, scan->numberOfOrderBys * sizeof(ScanKeyData));

    MemoryContextReset(so->query_ctx);
    {
        /* everything after the fixed part of the struct starts over */
        MemoryContext scan_ctx = so->scan_ctx;
        MemoryContext query_ctx = so->query_ctx;
        BufferAccessStrategy bas = so->bas;

        memset(so, 0, sizeof(GpuivfScanOpaqueData));
        so->scan_ctx = scan_ctx;
        so->query_ctx = query_ctx;
        so->bas = bas;
        so->limit_hint = limit_hint;
        so->filter_sel = filter_sel;
        so->stats = stats;
    }
    so->phase = GPUIVF_PHASE_DONE;
    so->no_rows = true;

    if (scan->numberOfOrderBys == 0)
        ereport(ERROR,
                (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                 errmsg("gpuivf index scans require an ORDER BY distance operator")));
    if (scan->orderByData[0].sk_flags & SK_ISNULL)
        return;                 /* ORDER BY col <op> NULL: no rows */

    oldcxt = MemoryContextSwitchTo(so->query_ctx);
    so->query = GpuivfDatumGetVector(GpuivfGetOpclassInfo(scan->indexRelation).type,
                                     scan->orderByData[0].sk_argument, &so->query_dims);
    MemoryContextSwitchTo(oldcxt);
    so->no_rows = false;
    so->phase = GPUIVF_PHASE_START;
    so->results_pos = -1;       /* not started */
}

/* Returns the next row in distance order, with its distance. */
bool
gpuivfgettuple(IndexScanDesc scan, ScanDirection dir)
{
    GpuivfScanOpaque so = (GpuivfScanOpaque) scan->opaque;
    MemoryContext oldcxt;
    GpuivfResult *r;

    if (!ScanDirectionIsForward(dir))
        elog(ERROR, "gpuivf index scans only go forward");

    oldcxt = MemoryContextSwitchTo(so->query_ctx);
    if (so->results_pos < 0)
    {
        so->results_pos = 0;
        GpuivfStartScan(scan);
    }
    while (so->results_pos >= so->nresults)
    {
        if (so->phase == GPUIVF_PHASE_DONE || !GpuivfLoadNextChunk(scan->indexRelation, so))
        {
            so->phase = GPUIVF_PHASE_DONE;
            MemoryContextSwitchTo(oldcxt);
            return false;
        }
    }
    GpuivfEnsureSorted(so, so->results_pos);
    MemoryContextSwitchTo(oldcxt);

    r = &so->results[so->results_pos++];
    GpuivfIdToTid(r->heapid, &scan->xs_heaptid);
    scan->xs_recheck = false;
    scan->xs_recheckorderby = false;
    scan->xs_orderbyvals[0] = Float8GetDatum(r->distance);
    scan->xs_orderbynulls[0] = false;
    return true;
}

/* Ends a scan: all its memory goes with its context. */
void
gpuivfendscan(IndexScanDesc scan)
{
    GpuivfScanOpaque so = (GpuivfScanOpaque) scan->opaque;

    FreeAccessStrategy(so->bas);  /* NULL is allowed */
    MemoryContextDelete(so->scan_ctx);
    scan->opaque = NULL;
    scan->xs_orderbyvals = NULL;
    scan->xs_orderbynulls = NULL;
}
