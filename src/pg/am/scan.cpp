/*
 * am/scan.cpp — index scans: ORDER BY col <op> constant, answered in
 * rounds.
 *
 *  round 1   GpuivfSearchBatch with nq = 1 (search/dispatch.cpp: the GPU worker
 *            or the CPU engine): the nprobe best lists, ADC k-selection of
 *            max(k, R) candidates (R = gpuivf.rerank_candidates), exact
 *            re-rank, the k best.  k is the rows the query needs when the
 *            planner integration knows it (limit_hint: LIMIT + OFFSET, raised
 *            for a filter above the scan, planner/knn_node.cpp), else R.  A batched kNN join may have
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
 */
#include "gpuivf.h"
#include "am/am.h"
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

/* where a scan stands */
typedef enum GpuivfScanPhase
{
    GPUIVF_PHASE_START,         /* round 1 returned, nothing deeper yet */
    GPUIVF_PHASE_REVISIT,       /* chunks from the round-1 lists */
    GPUIVF_PHASE_MORE,          /* chunks from later rounds of lists */
    GPUIVF_PHASE_EXACT_REST,    /* exact round 1 returned: the rest, sorted */
    GPUIVF_PHASE_DONE           /* nothing more to load */
} GpuivfScanPhase;


typedef struct GpuivfScanOpaqueData
{
    MemoryContext scan_ctx;     /* lives as long as the scan */
    MemoryContext query_ctx;    /* reset at every rescan */
    BufferAccessStrategy bas;   /* for exact scans over all pages (made by the first) */

    /* the query, set by rescan (in query_ctx) */
    bool        no_rows;        /* ORDER BY col <op> NULL */
    float4     *query;          /* raw query vector */
    int         query_dims;
    int64       limit_hint;     /* rows the query needs, 0 = unknown (kept) */
    double      filter_sel;     /* selectivity of the filter above (kept) */
    GpuivfScanStats stats;      /* summed over rescans (kept) */

    /* fixed at the first gettuple of a (re)scan */
    GpuivfScanPhase phase;
    GpuivfMetaPageData meta;    /* metapage as the scan started */
    gpuivf::Metric metric;
    bool        rerank;         /* candidates are re-ranked exactly: */
    bool        rerank_table;   /* from the table (entries hold heap TIDs), else
                                 * from the vector tuples entries point at */
    GpuivfRowDistance rd;       /* the re-rank's distance */
    GpuivfRowDistance rd_exact; /* an exact scan's (search/rows.cpp) */
    int         nlist;
    GpuivfQuery q;              /* round 1 */
    bool        exact;          /* round 1 was exact */
    int         rerank_k;       /* candidates per later chunk */
    float4     *query_prepared; /* the vector that is ADC-scored */

    /* heap ids round 1 returned, sorted */
    uint64     *round1_ids;
    int         nround1;

    /* lists: probe order and which were visited */
    int32      *list_order;     /* best first */
    int         list_order_len;
    int         list_order_pos; /* next entry of list_order to consider */
    bool       *visited;        /* nlist flags */
    int         lists_visited;

    /* per-page buffers of list entries */
    int         page_capacity;
    uint8      *page_codes;
    uint64     *page_ids;
    float      *lut;

    /* all entries of the current revisit/more round, ADC order */
    float      *cand_scores;
    uint64     *cand_ids;
    int64       ncand;
    int64       cand_cap;
    int64       cand_pos;

    /* list-entry ids already handed to a chunk: [0, ndone_sorted) sorted */
    uint64     *done_ids;
    int64       ndone;
    int64       ndone_sorted;
    int64       done_cap;

    /* rows to return, in order */
    GpuivfResult *results;
    int64       nresults;
    int64       results_cap;
    int64       results_pos;
    int64       nsorted;        /* results[0, nsorted) are in final order */

    /* scratch for one chunk */
    uint64     *chunk_ids;
    float      *chunk_scores;
} GpuivfScanOpaqueData;

/* the pending limit hint of the next scan descriptor (am.h) */
int64       gpuivf_pending_limit_hint = 0;
double      gpuivf_pending_filter_sel = 1.0;
Oid         gpuivf_pending_limit_index = InvalidOid;

/* ------------------------------------------------------------ helpers */

/*
 * Exact mode computes every distance but sorts lazily: before results[pos]
 * is returned, the next chunk of the unsorted tail is selected
 * (nth_element, linear) and sorted.  Chunks double from 1024 rows, so a
 * query that stops early sorts O(rows read) instead of all N rows, and a
 * full read still costs O(N log N).
 */
static void
GpuivfEnsureSorted(GpuivfScanOpaque so, int64 pos)
{
    while (pos >= so->nsorted && so->nsorted < so->nresults)
    {
        GpuivfResult *first = so->results + so->nsorted;
        GpuivfResult *end = so->results + so->nresults;
        int64       chunk = Max(so->nsorted, (int64) 1024);
        GpuivfResult *mid = (end - first > chunk) ? first + chunk : end;

        if (mid != end)
            std::nth_element(first, mid, end, GpuivfResultLess);
        std::sort(first, mid, GpuivfResultLess);
        so->nsorted = mid - so->results;
        CHECK_FOR_INTERRUPTS();
    }
}

/* Makes room for n more results (query_ctx). */
static void
GpuivfReserveResults(GpuivfScanOpaque so, int64 n)
{
    if (so->nresults + n <= so->results_cap)
        return;
    int64       cap = Max(so->results_cap * 2, so->nresults + n);

    cap = Max(cap, 64);
    if (so->results == NULL)
        so->results = (GpuivfResult *)
            MemoryContextAllocHuge(so->query_ctx, sizeof(GpuivfResult) * cap);
    else
        so->results = (GpuivfResult *) repalloc_huge(so->results, sizeof(GpuivfResult) * cap);
    so->results_cap = cap;
}

/* GpuivfForEachRow visitor of exact scans: one more result. */
static void
GpuivfAddExactResult(void *arg, const GpuivfRow *row)
{
    GpuivfScanOpaque so = (GpuivfScanOpaque) arg;
    GpuivfResult *r;

    GpuivfReserveResults(so, 1);
    r = &so->results[so->nresults++];
    r->distance = GpuivfRowDistanceOf(&so->rd_exact, row);
    r->heapid = row->heapid;
}

/* Makes room for n more collected candidates (query_ctx). */
static void
GpuivfReserveCandidates(GpuivfScanOpaque so, int64 n)
{
    if (so->ncand + n <= so->cand_cap)
        return;
    int64       cap = Max(so->cand_cap * 2, so->ncand + n);

    cap = Max(cap, 1024);
    if (so->cand_ids == NULL)
    {
        so->cand_ids = (uint64 *) MemoryContextAllocHuge(so->query_ctx, sizeof(uint64) * cap);
        so->cand_scores = (float *) MemoryContextAllocHuge(so->query_ctx, sizeof(float) * cap);
    }
    else
    {
        so->cand_ids = (uint64 *) repalloc_huge(so->cand_ids, sizeof(uint64) * cap);
        so->cand_scores = (float *) repalloc_huge(so->cand_scores, sizeof(float) * cap);
    }
    so->cand_cap = cap;
}

/* Remembers that n list-entry ids were handed to a chunk. */
static void
GpuivfAddDone(GpuivfScanOpaque so, const uint64 *ids, int64 n)
{
    if (so->ndone + n > so->done_cap)
    {
        int64       cap = Max(Max(so->done_cap * 2, so->ndone + n), 256);

        if (so->done_ids == NULL)
            so->done_ids = (uint64 *) MemoryContextAllocHuge(so->query_ctx, sizeof(uint64) * cap);
        else
            so->done_ids = (uint64 *) repalloc_huge(so->done_ids, sizeof(uint64) * cap);
        so->done_cap = cap;
    }
    memcpy(so->done_ids + so->ndone, ids, sizeof(uint64) * n);
    so->ndone += n;
}

/* Sorts the done set so that GpuivfIsDone can binary-search it. */
static void
GpuivfSortDone(GpuivfScanOpaque so)
{
    if (so->ndone > so->ndone_sorted)
        qsort(so->done_ids, so->ndone, sizeof(uint64), GpuivfCompareUint64);
    so->ndone_sorted = so->ndone;
}

/* Was this list-entry id handed out before the current round? */
static bool
GpuivfIsDone(GpuivfScanOpaque so, uint64 id)
{
    return GpuivfSortedIdsContain(so->done_ids, so->ndone_sorted, id);
}

/* ------------------------------------------------------- list reading */

/*
 * ADC-scores every entry of one list into the collected candidates (the
 * deeper rounds; round 1 is GpuivfSearchBatch's).
 */
static void
GpuivfScanList(Relation index, GpuivfScanOpaque so, const gpuivf::IvfPqModel &model, int list)
{
    GpuivfListDirEntry dir = GpuivfReadDirEntry(index, &so->meta, list);
    BlockNumber blkno = dir.head;
    float       bias;

    if (!BlockNumberIsValid(blkno))
        return;
    gpuivf::ivfpq_build_lut(model, so->query_prepared, list, so->lut, &bias);

    while (BlockNumberIsValid(blkno))
    {
        BlockNumber next;
        int         n = GpuivfReadListPage(index, blkno, so->meta.code_size, so->page_capacity,
                                               so->page_ids, so->page_codes, &next);

        if (n > 0)
        {
            GpuivfReserveCandidates(so, n);
            gpuivf::ivfpq_adc_scores(model, so->lut, bias, so->page_codes, n,
                                     so->cand_scores + so->ncand);
            memcpy(so->cand_ids + so->ncand, so->page_ids, sizeof(uint64) * n);
            so->ncand += n;
        }
        blkno = next;
        CHECK_FOR_INTERRUPTS();
    }
}

/* -------------------------------------------------------------- re-rank */

/*
 * Turns n candidates (list-entry ids with ADC scores) into sorted results:
 * exact distances from their vector tuples, or from the table's rows
 * (entries hold heap TIDs), when the index re-ranks, else the ADC distance.
 * Candidates whose vector tuple or heap row is gone (VACUUM freed it after
 * we read the list page) are dropped.
 */
static void
GpuivfRerank(Relation index, GpuivfScanOpaque so, const uint64 *ids, const float *scores, int n)
{
    int64       first = so->nresults;

    GpuivfReserveResults(so, n);
    if (!so->rerank)
    {
        for (int i = 0; i < n; i++)
        {
            GpuivfResult *r = &so->results[so->nresults++];

            r->distance = gpuivf::ivfpq_score_to_distance(so->metric, scores[i]);
            r->heapid = ids[i];
        }
    }
    else if (so->rerank_table)
    {
        /* the table's rows in heap order */
        uint64     *sorted = so->chunk_ids;
        GpuivfTableRows *tr = GpuivfTableRowsBegin(index, (int) so->meta.dims);

        if (sorted != ids)
            memcpy(sorted, ids, sizeof(uint64) * n);
        qsort(sorted, n, sizeof(uint64), GpuivfCompareUint64);
        for (int i = 0; i < n; i++)
        {
            bool        found;
            double      d = GpuivfTableRowDistance(&so->rd, tr, sorted[i], &found);

            if (found)
            {
                GpuivfResult *r = &so->results[so->nresults++];

                r->distance = d;
                r->heapid = sorted[i];
            }
            CHECK_FOR_INTERRUPTS();
        }
        GpuivfTableRowsEnd(tr);
    }
    else
    {
        /* visit the vector tuples in block order, each page once */
        uint64     *sorted = so->chunk_ids;
        int         i = 0;
        Size        value_bytes = GpuivfVectorValueBytes(&so->meta);

        if (sorted != ids)
            memcpy(sorted, ids, sizeof(uint64) * n);
        qsort(sorted, n, sizeof(uint64), GpuivfCompareUint64);
        while (i < n)
        {
            BlockNumber blkno = (BlockNumber) (sorted[i] >> 16);
            Buffer      buf;
            Page        page;

            buf = ReadBufferExtended(index, MAIN_FORKNUM, blkno, RBM_NORMAL, NULL);
            LockBuffer(buf, BUFFER_LOCK_SHARE);
            page = BufferGetPage(buf);
            if (!GpuivfPageIsType(page, GPUIVF_PAGE_VECTOR))
                GpuivfBadPage(index, blkno, "vector");
            for (; i < n && (BlockNumber) (sorted[i] >> 16) == blkno; i++)
            {
                OffsetNumber off = (OffsetNumber) (sorted[i] & 0xFFFF);
                GpuivfVectorTuple *vt = GpuivfPageVectorTuple(index, page, blkno, off, value_bytes);
                GpuivfResult *r;

                if (vt == NULL)
                    continue;
                r = &so->results[so->nresults++];
                r->distance = gpuivf::metric_distance(so->metric, so->query,
                                                      GpuivfTupleValues(&so->rd, vt), so->rd.dims);
                r->heapid = GpuivfTidToId(&vt->heaptid);
            }
            UnlockReleaseBuffer(buf);
            CHECK_FOR_INTERRUPTS();
        }
    }
    std::sort(so->results + first, so->results + so->nresults, GpuivfResultLess);
}

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
static void
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

/* Is this heap id among those round 1 returned? */
static bool
GpuivfInRoundOne(GpuivfScanOpaque so, uint64 heapid)
{
    return GpuivfSortedIdsContain(so->round1_ids, so->nround1, heapid);
}

/* Drops results[from..] that round 1 returned already, keeping the order. */
static void
GpuivfDropRoundOneRows(GpuivfScanOpaque so, int64 from)
{
    int64       out = from;

    if (so->nround1 == 0)
        return;
    for (int64 i = from; i < so->nresults; i++)
        if (!GpuivfInRoundOne(so, so->results[i].heapid))
            so->results[out++] = so->results[i];
    so->nresults = out;
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

    if (GpuivfTakeRoundOne(RelationGetRelid(index), so->meta.generation, &so->q,
                           (int) so->meta.dims, &hits, &nhits, &st))
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
 * Before the first chunk past round 1: the prepared query, the buffers and
 * the round-1 lists in probe order (computed again: the probe order is
 * deterministic), marked visited.
 */
static void
GpuivfPrepareDeepen(Relation index, GpuivfScanOpaque so)
{
    GpuivfIndexState *state = GpuivfGetIndexState(index);
    const gpuivf::IvfPqModel &model = state->model;
    int         nprobe = Min(Max(so->q.nprobe, 1), so->nlist);
    float      *probe_scores;

    so->rerank_k = Max(Max(so->q.rerank, so->q.k), Max(gpuivf_rerank_candidates, 1));
    so->query_prepared = (float4 *) palloc(sizeof(float4) * so->meta.dims);
    gpuivf::prepare_vector(so->metric, so->query, so->query_prepared, so->meta.dims);
    so->visited = (bool *) palloc0(sizeof(bool) * so->nlist);
    so->lists_visited = 0;

    so->page_capacity = GPUIVF_LIST_PAGE_CAPACITY(so->meta.code_size);
    so->page_codes = (uint8 *) palloc(so->meta.code_size * (Size) so->page_capacity + 1);
    so->page_ids = (uint64 *) palloc(sizeof(uint64) * so->page_capacity);
    so->chunk_ids = (uint64 *) palloc(sizeof(uint64) * so->rerank_k);
    so->chunk_scores = (float *) palloc(sizeof(float) * so->rerank_k);
    so->lut = (float *) palloc(sizeof(float) * gpuivf::ivfpq_lut_size(model));

    so->list_order = (int32 *) palloc(sizeof(int32) * nprobe);
    probe_scores = (float *) palloc(sizeof(float) * nprobe);
    gpuivf::ivfpq_probe_lists(model, so->query_prepared, nprobe, so->list_order, probe_scores);
    pfree(probe_scores);
    so->list_order_len = nprobe;
    for (int i = 0; i < nprobe; i++)
    {
        int         list = so->list_order[i];

        if (list >= 0 && list < so->nlist && !so->visited[list])
        {
            so->visited[list] = true;
            so->lists_visited++;
        }
    }
}

/* May the scan visit another list (gpuivf.max_probes, 0 = no bound)?  The
 * bound never cuts round 1's own lists. */
static bool
GpuivfMayVisitMore(GpuivfScanOpaque so)
{
    if (so->lists_visited >= so->nlist)
        return false;
    if (gpuivf_max_probes > 0 && so->lists_visited >= Max(gpuivf_max_probes, so->q.nprobe))
        return false;
    return true;
}

/*
 * Collects every entry of the next round of lists in ADC order: the round-1
 * lists again (revisit), then each later round as many unvisited lists as
 * were visited so far.  Returns false when every list was visited.
 */
static bool
GpuivfCollectRound(Relation index, GpuivfScanOpaque so)
{
    GpuivfIndexState *state = GpuivfGetIndexState(index);
    const gpuivf::IvfPqModel &model = state->model;

    so->ncand = 0;
    so->cand_pos = 0;
    GpuivfSortDone(so);

    if (so->phase == GPUIVF_PHASE_START)
    {
        /* revisit the lists of round 1, all their entries this time */
        so->phase = GPUIVF_PHASE_REVISIT;
        for (int i = 0; i < so->list_order_len; i++)
        {
            int         list = so->list_order[i];

            if (list >= 0 && list < so->nlist)
                GpuivfScanList(index, so, model, list);
        }
    }
    else
    {
        int         batch;
        int         taken = 0;

        if (!GpuivfMayVisitMore(so))
            return false;
        if (so->phase != GPUIVF_PHASE_MORE)
        {
            /* the full probe order, once */
            float      *scores = (float *) palloc(sizeof(float) * so->nlist);

            so->phase = GPUIVF_PHASE_MORE;
            pfree(so->list_order);
            so->list_order = (int32 *) palloc(sizeof(int32) * so->nlist);
            gpuivf::ivfpq_probe_lists(model, so->query_prepared, so->nlist, so->list_order,
                                      scores);
            pfree(scores);
            so->list_order_len = so->nlist;
            so->list_order_pos = 0;
        }
        batch = Max(so->lists_visited, 1);
        if (gpuivf_max_probes > 0)
            batch = Min(batch, Max(gpuivf_max_probes, so->q.nprobe) - so->lists_visited);
        while (taken < batch && so->list_order_pos < so->list_order_len)
        {
            int         list = so->list_order[so->list_order_pos++];

            if (list < 0 || list >= so->nlist || so->visited[list])
                continue;
            so->visited[list] = true;
            so->lists_visited++;
            taken++;
            GpuivfScanList(index, so, model, list);
        }
        /* lists the probe order missed (it should cover all): visit them too */
        if (so->list_order_pos >= so->list_order_len && so->lists_visited < so->nlist)
        {
            for (int list = 0; list < so->nlist && GpuivfMayVisitMore(so); list++)
            {
                if (so->visited[list])
                    continue;
                so->visited[list] = true;
                so->lists_visited++;
                GpuivfScanList(index, so, model, list);
            }
        }
    }
    so->stats.lists_max = Max(so->stats.lists_max, (int64) so->lists_visited);
    gpuivf::sort_pairs(so->cand_scores, so->cand_ids, so->ncand);
    return true;
}

/*
 * Loads the next chunk of rows not returned yet: after an exact round 1 all
 * other rows sorted; else up to rerank_k collected candidates, moving on to
 * the next round of lists when they run out.  Returns false when the scan
 * has nothing more.
 */
static bool
GpuivfLoadNextChunk(Relation index, GpuivfScanOpaque so)
{
    so->nresults = 0;
    so->results_pos = 0;

    if (so->phase == GPUIVF_PHASE_EXACT_REST)
    {
        so->stats.deepened++;
        so->phase = GPUIVF_PHASE_DONE;
        GpuivfScanExact(index, so);
        so->stats.reranked += so->nresults;
        GpuivfDropRoundOneRows(so, 0);
        return so->nresults > 0;
    }
    if (so->phase == GPUIVF_PHASE_START)
    {
        so->stats.deepened++;
        GpuivfPrepareDeepen(index, so);
    }

    while (so->phase != GPUIVF_PHASE_DONE)
    {
        int         n = 0;

        while (n < so->rerank_k && so->cand_pos < so->ncand)
        {
            uint64      id = so->cand_ids[so->cand_pos];

            if (!GpuivfIsDone(so, id))
            {
                so->chunk_ids[n] = id;
                so->chunk_scores[n] = so->cand_scores[so->cand_pos];
                n++;
            }
            so->cand_pos++;
        }
        if (n > 0)
        {
            GpuivfAddDone(so, so->chunk_ids, n);
            GpuivfRerank(index, so, so->chunk_ids, so->chunk_scores, n);
            if (so->rerank)
                so->stats.reranked += n;
            GpuivfDropRoundOneRows(so, 0);
            so->nsorted = so->nresults;     /* GpuivfRerank sorted them */
            if (so->nresults > 0)
                return true;
            continue;
        }
        if (!GpuivfCollectRound(index, so))
            so->phase = GPUIVF_PHASE_DONE;
    }
    return false;
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
    int         source;

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

    source = GpuivfMakeQuery(index, &so->meta, so->limit_hint, so->filter_sel, so->query, &so->q);
    so->stats.target_recall = GpuivfTargetRecall(index, &so->stats.target_source);
    /* the workload ANALYZE calibrates on (calibration/recorded.cpp) */
    GpuivfRecordQuery(index, &so->meta, so->query, so->query_dims);
    so->exact = GpuivfQueryIsExact(&so->meta, &so->q);
    so->stats.scans++;
    so->stats.k_sum += so->q.k;
    so->stats.probes_sum += so->exact ? so->nlist : so->q.nprobe;
    so->stats.probe_source = source;
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
