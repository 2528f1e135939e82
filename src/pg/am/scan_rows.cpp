/*
 * am/scan_rows.cpp — the rows an index scan holds: the results (exact mode
 * sorts them lazily, chunk by chunk), the candidates collected from lists
 * past round 1, the set of list entries already handed out, and the
 * re-rank that turns a chunk of candidates into sorted results.  All in
 * palloc'd arrays of the scan's query_ctx (scan.cpp's file comment).
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

/*
 * The growth of the scan's arrays (results, candidates, done ids): at least
 * need elements, doubling, never fewer than min_cap; an array of cap
 * elements of elem bytes in query_ctx (a new one when p is NULL).
 */
static int64
GrownCapacity(int64 cap, int64 need, int64 min_cap)
{
    return Max(Max(cap * 2, need), min_cap);
}

static void *
GrowArray(GpuivfScanOpaque so, void *p, Size elem, int64 cap)
{
    if (p == NULL)
        return MemoryContextAllocHuge(so->query_ctx, elem * cap);
    return repalloc_huge(p, elem * cap);
}

/*
 * Exact mode computes every distance but sorts lazily: before results[pos]
 * is returned, the next chunk of the unsorted tail is selected
 * (nth_element, linear) and sorted.  Chunks double from 1024 rows, so a
 * query that stops early sorts O(rows read) instead of all N rows, and a
 * full read still costs O(N log N).
 */
void
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
void
GpuivfReserveResults(GpuivfScanOpaque so, int64 n)
{
    if (so->nresults + n <= so->results_cap)
        return;
    int64       cap = GrownCapacity(so->results_cap, so->nresults + n, 64);

    so->results = (GpuivfResult *) GrowArray(so, so->results, sizeof(GpuivfResult), cap);
    so->results_cap = cap;
}

/* GpuivfForEachRow visitor of exact scans: one more result. */
void
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
void
GpuivfReserveCandidates(GpuivfScanOpaque so, int64 n)
{
    if (so->ncand + n <= so->cand_cap)
        return;
    int64       cap = GrownCapacity(so->cand_cap, so->ncand + n, 1024);

    so->cand_ids = (uint64 *) GrowArray(so, so->cand_ids, sizeof(uint64), cap);
    so->cand_scores = (float *) GrowArray(so, so->cand_scores, sizeof(float), cap);
    so->cand_cap = cap;
}

/* Remembers that n list-entry ids were handed to a chunk. */
void
GpuivfAddDone(GpuivfScanOpaque so, const uint64 *ids, int64 n)
{
    if (so->ndone + n > so->done_cap)
    {
        int64       cap = GrownCapacity(so->done_cap, so->ndone + n, 256);

        so->done_ids = (uint64 *) GrowArray(so, so->done_ids, sizeof(uint64), cap);
        so->done_cap = cap;
    }
    memcpy(so->done_ids + so->ndone, ids, sizeof(uint64) * n);
    so->ndone += n;
}

/* Sorts the done set so that GpuivfIsDone can binary-search it. */
void
GpuivfSortDone(GpuivfScanOpaque so)
{
    if (so->ndone > so->ndone_sorted)
        qsort(so->done_ids, so->ndone, sizeof(uint64), GpuivfCompareUint64);
    so->ndone_sorted = so->ndone;
}

/* Was this list-entry id handed out before the current round? */
bool
GpuivfIsDone(GpuivfScanOpaque so, uint64 id)
{
    return GpuivfSortedIdsContain(so->done_ids, so->ndone_sorted, id);
}

/* -------------------------------------------------------------- re-rank */

/*
 * Turns n candidates (list-entry ids with ADC scores) into sorted results:
 * exact distances from their vector tuples, or from the table's rows
 * (entries hold heap TIDs), when the index re-ranks, else the ADC distance.
 * Candidates whose vector tuple or heap row is gone (VACUUM freed it after
 * we read the list page) are dropped.
 */
void
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
