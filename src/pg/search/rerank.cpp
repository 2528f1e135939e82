/*
 * search/rerank.cpp — the exact re-rank of PQ candidates on the host: the
 * CPU path's (search/cpu.cpp) and that of a GPU search whose copy holds
 * only codes (an index larger than the GPU, or one that re-ranks from the
 * table: worker/backend/search.cpp).  The candidates are entry ids, what
 * list entries hold: vector tuple TIDs, or heap TIDs for an index that
 * re-ranks from the table.  Each candidate's exact distance is computed
 * from its vector tuple (halves widened), every vector page read once for
 * all the candidates of all the queries on it; or from the table's row
 * (search/rows.cpp), every row read once, in heap order.
 */
#include "gpuivf.h"
#include "search/search.h"
#include "search/results.h"
#include "storage/storage.h"

/* (entry id, query) pair of the re-rank, visited in entry (block) order */
typedef struct RerankItem
{
    uint64      entry;
    int32       query;
    int32       slot;           /* position in that query's candidate list */
} RerankItem;

/*
 * The re-rank reads one vector page per candidate group (candidates sorted
 * by block), scattered over the index: with pages already in shared
 * buffers its cost is the cache misses of each page's header, line pointers
 * and tuple, one after another.  So the pages are pinned RERANK_PIN_AHEAD
 * groups ahead: at the pin the header, special space and the needed line
 * pointers are prefetched, one group later the tuples they point at, and by
 * the time a page is locked and read its lines are in cache.  Reading line
 * pointers without the content lock only steers prefetches (which never
 * fault); the real read happens under the lock.
 */
#define RERANK_PIN_AHEAD 3

static Buffer
RerankPin(Relation index, const RerankItem *items, const int64 *gstart, int64 g)
{
    Buffer      buf = ReadBufferExtended(index, MAIN_FORKNUM,
                                         (BlockNumber) (items[gstart[g]].entry >> 16),
                                         RBM_NORMAL, NULL);
    char       *page = (char *) BufferGetPage(buf);

    __builtin_prefetch(page);
    __builtin_prefetch(page + BLCKSZ - 64);
    for (int64 i = gstart[g]; i < gstart[g + 1]; i++)
    {
        OffsetNumber off = (OffsetNumber) (items[i].entry & 0xFFFF);

        __builtin_prefetch(page + SizeOfPageHeaderData + (Size) (off - 1) * sizeof(ItemIdData));
    }
    return buf;
}

static void
RerankPrefetchTuples(Buffer buf, const RerankItem *items, int64 from, int64 to)
{
    char       *page = (char *) BufferGetPage(buf);

    for (int64 i = from; i < to; i++)
    {
        OffsetNumber off = (OffsetNumber) (items[i].entry & 0xFFFF);
        ItemIdData  iid;

        if (off < FirstOffsetNumber || off > MaxOffsetNumber)
            continue;
        memcpy(&iid, page + SizeOfPageHeaderData + (Size) (off - 1) * sizeof(ItemIdData),
               sizeof(ItemIdData));
        if (iid.lp_off == 0 || iid.lp_off >= BLCKSZ)
            continue;
        __builtin_prefetch(page + iid.lp_off);
        __builtin_prefetch(page + iid.lp_off + 64);
    }
}

/* Rows of the same heap TID (a candidate on the GPU twice while its copy
 * caught up) are returned once: keeps the first, up to k, of sorted r. */
static int
DropDuplicateRows(GpuivfResult *r, int n, int k)
{
    int         m = 0;

    for (int i = 0; i < n && m < k; i++)
    {
        bool        dup = false;

        for (int j = 0; j < m && !dup; j++)
            dup = r[j].heapid == r[i].heapid;
        if (!dup)
            r[m++] = r[i];
    }
    return m;
}

/*
 * The re-rank from the table: items (sorted by entry = heap TID) read from
 * the index's table, each row once for all the queries that want it, its
 * indexed column (or expression) computed by PostgreSQL; rows with no
 * version left are skipped.  A row twice among one query's candidates
 * counts once here already.
 */
static void
RerankTableRows(Relation index, const GpuivfMetaPageData *meta, GpuivfRowDistance *rd,
                const RerankItem *items, int64 nitems, GpuivfResult **res, int *nres)
{
    GpuivfTableRows *tr = GpuivfTableRowsBegin(index, (int) meta->dims);
    GpuivfRow   row;

    row.vt = NULL;
    row.values = NULL;
    for (int64 i = 0; i < nitems; i++)
    {
        int         j = items[i].query;
        GpuivfResult *r;

        if (i == 0 || items[i].entry != items[i - 1].entry)
        {
            row.heapid = items[i].entry;
            row.values = GpuivfTableRowValues(tr, row.heapid);
        }
        else if (items[i].query == items[i - 1].query)
            continue;
        if (row.values == NULL)
            continue;           /* every version of the row is gone */
        r = &res[j][nres[j]++];
        r->distance = GpuivfRowDistanceOf(&rd[j], &row);
        r->heapid = row.heapid;
        if (i % 64 == 0)
            CHECK_FOR_INTERRUPTS();
    }
    GpuivfTableRowsEnd(tr);
}

/*
 * The re-rank from the vector tuples: items (sorted by entry = vector
 * tuple TID) grouped by vector page, each page read once for all of them.
 */
static void
RerankVectorPages(Relation index, Size value_bytes, GpuivfRowDistance *rd,
                  const RerankItem *items, int64 nitems, GpuivfResult **res, int *nres)
{
    int64       i;
    int64      *gstart;
    int64       ngroups = 0;
    Buffer      pinned[RERANK_PIN_AHEAD];

    /* the candidates grouped by vector page: group g is items[gstart[g], gstart[g + 1]) */
    gstart = (int64 *) palloc_extended(sizeof(int64) * (nitems + 1), MCXT_ALLOC_HUGE);
    for (i = 0; i < nitems; i++)
        if (i == 0 || (items[i].entry >> 16) != (items[i - 1].entry >> 16))
            gstart[ngroups++] = i;
    gstart[ngroups] = nitems;

    for (int64 g = 0; g < ngroups; g++)
    {
        BlockNumber blkno = (BlockNumber) (items[gstart[g]].entry >> 16);
        Buffer      buf;
        Page        page;

        /* pin ahead and warm the caches (see RerankPrefetch) */
        if (g == 0)
            for (int64 a = 0; a < RERANK_PIN_AHEAD && a < ngroups; a++)
                pinned[a % RERANK_PIN_AHEAD] = RerankPin(index, items, gstart, a);
        else if (g + RERANK_PIN_AHEAD - 1 < ngroups)
            pinned[(g + RERANK_PIN_AHEAD - 1) % RERANK_PIN_AHEAD] =
                RerankPin(index, items, gstart, g + RERANK_PIN_AHEAD - 1);
        if (g + 1 < ngroups)
            RerankPrefetchTuples(pinned[(g + 1) % RERANK_PIN_AHEAD], items,
                                 gstart[g + 1], gstart[g + 2]);
        buf = pinned[g % RERANK_PIN_AHEAD];
        pinned[g % RERANK_PIN_AHEAD] = InvalidBuffer;

        LockBuffer(buf, BUFFER_LOCK_SHARE);
        page = BufferGetPage(buf);
        if (!GpuivfPageIsType(page, GPUIVF_PAGE_VECTOR))
            GpuivfBadPage(index, blkno, "vector");
        for (i = gstart[g]; i < gstart[g + 1]; i++)
        {
            OffsetNumber off = (OffsetNumber) (items[i].entry & 0xFFFF);
            GpuivfVectorTuple *vt = GpuivfPageVectorTuple(index, page, blkno, off, value_bytes);
            int         j = items[i].query;
            GpuivfResult *r;

            /* gone meanwhile (VACUUM freed it after we read the list) */
            if (vt == NULL)
                continue;
            r = &res[j][nres[j]++];
            r->distance = gpuivf::metric_distance(rd[j].metric, rd[j].query,
                                                  GpuivfTupleValues(&rd[j], vt), rd[j].dims);
            r->heapid = GpuivfTidToId(&vt->heaptid);
        }
        UnlockReleaseBuffer(buf);
        CHECK_FOR_INTERRUPTS();
    }
    pfree(gstart);
}

/* The exact re-rank (search.h). */
void
GpuivfRerankCandidates(Relation index, const GpuivfMetaPageData *meta, int n,
                       const GpuivfQuery *queries, const int *which, uint64 *const *cand,
                       const int *ncand, MemoryContext caller, GpuivfHit **hits, int *nhits,
                       int64 *reranked)
{
    GpuivfRowDistance *rd = (GpuivfRowDistance *) palloc(sizeof(GpuivfRowDistance) * Max(n, 1));
    int64       nitems = 0;
    RerankItem *items;
    GpuivfResult **res = (GpuivfResult **) palloc(sizeof(GpuivfResult *) * n);
    int        *nres = (int *) palloc0(sizeof(int) * n);

    for (int j = 0; j < n; j++)
    {
        nitems += ncand[j];
        res[j] = (GpuivfResult *) palloc(sizeof(GpuivfResult) * Max(ncand[j], 1));
        GpuivfRowDistanceInit(&rd[j], index, meta, queries[which ? which[j] : j].vector, false);
    }
    items = (RerankItem *) palloc_extended(sizeof(RerankItem) * Max(nitems, 1), MCXT_ALLOC_HUGE);
    nitems = 0;
    for (int j = 0; j < n; j++)
        for (int c = 0; c < ncand[j]; c++)
        {
            items[nitems].entry = cand[j][c];
            items[nitems].query = j;
            items[nitems].slot = c;
            nitems++;
        }
    std::sort(items, items + nitems, [](const RerankItem &x, const RerankItem &y) {
        return x.entry != y.entry ? x.entry < y.entry : x.query < y.query;
    });
    *reranked += nitems;

    if (GpuivfMetaRerankFromTable(meta))
        RerankTableRows(index, meta, rd, items, nitems, res, nres);
    else
        RerankVectorPages(index, GpuivfVectorValueBytes(meta), rd, items, nitems, res, nres);
    for (int j = 0; j < n; j++)
    {
        int         qi = which ? which[j] : j;

        SortResults(res[j], nres[j]);
        nres[j] = DropDuplicateRows(res[j], nres[j], queries[qi].k);
        hits[qi] = MakeHits(caller, res[j], nres[j], queries[qi].k, &nhits[qi]);
    }
    for (int j = 0; j < n; j++)
        pfree(res[j]);
    pfree(res);
    pfree(nres);
    pfree(items);
    pfree(rd);
}
