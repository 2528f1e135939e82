/*
 * worker/bgworker/gpu_sync.cpp — bringing a GPU copy up to date with the
 * index pages (gpu_cache.cpp says when): walking every list chain and
 * comparing page LSNs with the mirror, resolving entries to heap ids and
 * vectors, adding them to the engine's index and updating the mirror.
 */
#include "gpuivf.h"
#include "worker/worker.h"
#include "worker/protocol.h"
#include "worker/bgworker/bgworker.h"
#include "worker/bgworker/gpu_cache.h"
#include "storage/storage.h"

/* ------------------------------------------------------------- walk */

static void
WalkAddPage(Walk *wk, BlockNumber blkno, XLogRecPtr lsn, int list, PageMirror *old)
{
    ChangedPage *p;

    if (wk->npages == wk->cappages)
    {
        wk->cappages = Max(64, wk->cappages * 2);
        wk->pages = wk->pages == NULL
            ? (ChangedPage *) palloc(sizeof(ChangedPage) * wk->cappages)
            : (ChangedPage *) repalloc(wk->pages, sizeof(ChangedPage) * wk->cappages);
    }
    p = &wk->pages[wk->npages++];
    p->blkno = blkno;
    p->lsn = lsn;
    p->list = list;
    p->old = old;
    p->start = wk->n;
    p->n = 0;
    p->keep = 0;
}

static void
WalkReserve(Walk *wk, int64 more)
{
    if (wk->n + more <= wk->cap)
        return;
    wk->cap = Max(wk->n + more, Max((int64) 4096, wk->cap * 2));
    if (wk->tids == NULL)
    {
        wk->tids = (uint64 *) palloc_extended(sizeof(uint64) * wk->cap, MCXT_ALLOC_HUGE);
        wk->codes = (uint8 *) palloc_extended((Size) wk->code_size * wk->cap, MCXT_ALLOC_HUGE);
    }
    else
    {
        wk->tids = (uint64 *) repalloc_huge(wk->tids, sizeof(uint64) * wk->cap);
        wk->codes = (uint8 *) repalloc_huge(wk->codes, (Size) wk->code_size * wk->cap);
    }
}

/*
 * Walk the list chains; pages whose LSN differs from the mirror (or all
 * pages, when LSNs are not reliable or there is no mirror) have their live
 * entries copied into wk.  Each list's change count (list_changes.cpp) is
 * read before its pages and stored in counts[list]; with seen (the counts of
 * the previous walk, trusted), a list whose count is settled and equal to
 * seen's is skipped: none of its pages changed since that walk read them.
 *
 * starts (with seen, only when nothing but inserts can have changed a list
 * since the last walk began): the first page of the list that had room for
 * an entry when the last walk read it (else its last page).  Inserts only
 * fill pages, and only a change that removes entries (VACUUM) frees room: so
 * every page before it was full then and is as that walk (or an earlier one)
 * read it, and the walk begins there instead of at the head: a catch-up
 * after a few inserts into a long list reads its last page or two, not the
 * whole chain.  (Not the directory's insert_page: an insert that read it
 * before it moved on may still fill room that a VACUUM freed before it.)
 * A start that is not a list page of that list in the mirror is not trusted
 * (the head is).  The caller walks again without starts when a removal
 * began during the walk.  new_starts[list] gets each walked list's first
 * page with room (else its last page).  Returns the number of pages the
 * mirror lacked.
 */
int
WalkLists(GpuIndex *ix, const GpuivfMetaPageData *meta, bool use_lsn, const uint64 *seen,
          const BlockNumber *starts, uint64 *counts, BlockNumber *new_starts, Walk *wk)
{
    GpuivfListDirEntry *dir;
    int         new_pages = 0;
    int         code_size = meta->code_size;
    BlockNumber guard = (BlockNumber) (meta->vectors + 2 * meta->lists + 1024);
    Size        entry_size = GPUIVF_LIST_ENTRY_SIZE(code_size);

    dir = (GpuivfListDirEntry *) palloc_extended(sizeof(GpuivfListDirEntry) * meta->lists,
                                                 MCXT_ALLOC_HUGE);
    ReadRawPages(ix, meta->directory_start, meta->directory_pages, GPUIVF_PAGE_DIRECTORY, dir,
                 sizeof(GpuivfListDirEntry) * meta->lists);
    for (uint32 l = 0; l < meta->lists; l++)
    {
        BlockNumber blkno = dir[l].head;
        BlockNumber steps = 0;

        if (GpuivfListShard(l, ix->nshards) != ix->shard)
            continue;           /* another shard's list */
        counts[l] = GpuivfListChangeCount(&ix->node, (int) l);
        wk->lists_total++;
        if (seen != NULL && counts[l] != GPUIVF_LIST_UNSETTLED && counts[l] == seen[l])
            continue;           /* unchanged since the last walk */
        wk->lists_walked++;
        new_starts[l] = InvalidBlockNumber;
        if (use_lsn && seen != NULL && starts != NULL && BlockNumberIsValid(starts[l]) &&
            starts[l] != blkno)
        {
            PageMirror *m = (PageMirror *) hash_search(ix->pages, &starts[l], HASH_FIND, NULL);

            if (m != NULL && m->list == (int32) l)
            {
                blkno = starts[l];
                wk->lists_from_start++;
            }
        }

        while (BlockNumberIsValid(blkno))
        {
            Buffer      buf = ReadIndexPage(ix, blkno);
            Page        page;
            XLogRecPtr  lsn;
            BlockNumber next;
            PageMirror *old;
            bool        found;

            LockBuffer(buf, BUFFER_LOCK_SHARE);
            page = BufferGetPage(buf);
            if (!GpuivfPageIsType(page, GPUIVF_PAGE_LIST) || ++steps > guard)
            {
                UnlockReleaseBuffer(buf);
                Corrupted(ix, blkno, "list");
            }
            lsn = PageGetLSN(page);
            next = GpuivfPageGetOpaque(page)->nextblkno;
            if (!BlockNumberIsValid(new_starts[l]) &&
                (GpuivfPageHasRoom(page, entry_size) || !BlockNumberIsValid(next)))
                new_starts[l] = blkno;
            old = (PageMirror *) hash_search(ix->pages, &blkno, HASH_FIND, &found);
            if (old != NULL && use_lsn && old->lsn == lsn && old->list == (int32) l)
            {
                UnlockReleaseBuffer(buf);
                blkno = next;
                continue;
            }
            if (old == NULL)
                new_pages++;
            WalkAddPage(wk, blkno, lsn, (int) l, old);
            {
                OffsetNumber maxoff = PageGetMaxOffsetNumber(page);
                ChangedPage *cp = &wk->pages[wk->npages - 1];
                const char *bad;
                int         n;

                WalkReserve(wk, maxoff);
                bad = GpuivfDecodeListPage(page, code_size, maxoff, wk->tids + wk->n,
                                           wk->codes + (Size) wk->n * code_size, &n);
                if (bad != NULL)
                {
                    UnlockReleaseBuffer(buf);
                    Corrupted(ix, blkno, bad);
                }
                wk->n += n;
                cp->n += n;
            }
            UnlockReleaseBuffer(buf);
            blkno = next;
            CHECK_FOR_INTERRUPTS();
        }
    }
    pfree(dir);
    return new_pages;
}

/* ---------------------------------------------------- adding entries */

/*
 * Resolve n entries (vector TIDs) to heap ids and raw vectors by reading
 * their vector tuples (the stored values as they are: float4, or IEEE
 * halves, which the engine keeps as halves); an entry whose tuple is gone
 * gets UINT64_MAX.  Each
 * run of entries on one vector page costs one page read, so callers pass
 * the TIDs in ascending order (AddEntries sorts them): then every page is
 * read once.
 */
static void
ResolveVectors(const GpuIndex *ix, const uint64 *tids, int64 n, Size row_bytes, uint64 *ids,
               char *vectors)
{
    int64       i = 0;

    for (int64 j = 0; j < n; j++)
        ids[j] = UINT64_MAX;
    while (i < n)
    {
        BlockNumber blkno = (BlockNumber) (tids[i] >> 16);
        Buffer      buf = ReadIndexPage(ix, blkno);
        Page        page;
        OffsetNumber maxoff;

        LockBuffer(buf, BUFFER_LOCK_SHARE);
        page = BufferGetPage(buf);
        if (!GpuivfPageIsType(page, GPUIVF_PAGE_VECTOR))
        {
            UnlockReleaseBuffer(buf);
            Corrupted(ix, blkno, "vector");
        }
        maxoff = PageGetMaxOffsetNumber(page);
        for (; i < n && (BlockNumber) (tids[i] >> 16) == blkno; i++)
        {
            OffsetNumber off = (OffsetNumber) (tids[i] & 0xFFFF);
            ItemId      iid;
            GpuivfVectorTuple *vt;

            if (off < FirstOffsetNumber || off > maxoff)
                continue;
            iid = PageGetItemId(page, off);
            if (!ItemIdIsNormal(iid) ||
                ItemIdGetLength(iid) < offsetof(GpuivfVectorTuple, x) + row_bytes)
                continue;
            vt = (GpuivfVectorTuple *) PageGetItem(page, iid);
            ids[i] = GpuivfTidToId(&vt->heaptid);
            memcpy(vectors + (Size) i * row_bytes, vt->x, row_bytes);
        }
        UnlockReleaseBuffer(buf);
        CHECK_FOR_INTERRUPTS();
    }
}

/* One new entry of a walk: its vector TID, position in the walk, list. */
typedef struct AddItem
{
    uint64      tid;
    int64       pos;
    int32       list;
} AddItem;

/*
 * Sort items by TID: least significant digit first, 11 bits a pass, only
 * as many passes as the largest TID needs (three for a few million rows).
 * With qsort here and again per chunk, a 1M-entry load took 626 ms instead
 * of 550 ms (H200 machine, DEBUG1 line of SyncCopy).
 */
static void
SortAddItemsByTid(AddItem *items, int64 n)
{
    const int   kBits = 11;
    const int   kBuckets = 1 << kBits;
    uint64      all = 0;
    AddItem    *tmp;
    AddItem    *from = items;
    AddItem    *to;
    int64      *pos;

    if (n < 2)
        return;
    for (int64 i = 0; i < n; i++)
        all |= items[i].tid;
    tmp = (AddItem *) palloc_extended(sizeof(AddItem) * n, MCXT_ALLOC_HUGE);
    pos = (int64 *) palloc(sizeof(int64) * kBuckets);
    to = tmp;
    for (int shift = 0; shift < 64 && (all >> shift) != 0; shift += kBits)
    {
        int64       sum = 0;

        memset(pos, 0, sizeof(int64) * kBuckets);
        for (int64 i = 0; i < n; i++)
            pos[(from[i].tid >> shift) & (kBuckets - 1)]++;
        for (int b = 0; b < kBuckets; b++)
        {
            int64       c = pos[b];

            pos[b] = sum;
            sum += c;
        }
        for (int64 i = 0; i < n; i++)
            to[pos[(from[i].tid >> shift) & (kBuckets - 1)]++] = from[i];
        {
            AddItem    *t = from;

            from = to;
            to = t;
        }
    }
    if (from != items)
        memcpy(items, from, sizeof(AddItem) * n);
    pfree(tmp);
    pfree(pos);
}

/*
 * Add the entries [p->start + p->keep, p->start + p->n) of every changed
 * page to the GPU, in chunks; heap ids land in ids_out (indexed like wk).
 * With re-rank vectors the entries go in the order of their vector tuples:
 * vectors are stored in heap order, not by list, so chunks taken in list
 * order each touched nearly every vector page (a 1M-row load read the
 * vector pages once per 64 MB chunk, nine times); in TID order each page is
 * read once.  The order of entries on the GPU does not matter: results are
 * sorted by (distance, id).
 */
void
AddEntries(GpuIndex *ix, const GpuivfMetaPageData *meta, Walk *wk, uint64 *ids_out)
{
    bool        rerank = CopyStoresVectors(ix, meta);   /* else ids: entry TIDs */
    Size        row_bytes = rerank ? GpuivfVectorValueBytes(meta) : 0;
    int         code_size = meta->code_size;
    Size        per = (Size) code_size + 8 + 8 + 4 + row_bytes;
    int64       chunk = Max((int64) 1024, (int64) (GPUIVF_ADD_CHUNK_BYTES / per));
    int64       total = 0;
    int32      *lists;
    uint8      *codes;
    uint64     *tids;
    uint64     *ids;
    uint64     *keep_ids;
    char       *vectors = NULL;
    int64      *where;
    AddItem    *items;
    int64       e = 0;
    instr_time  t0;

    for (int i = 0; i < wk->npages; i++)
        total += wk->pages[i].n - wk->pages[i].keep;
    if (total == 0)
        return;
    items = (AddItem *) palloc_extended(sizeof(AddItem) * total, MCXT_ALLOC_HUGE);
    for (int i = 0; i < wk->npages; i++)
    {
        const ChangedPage *p = &wk->pages[i];

        for (int64 from = p->start + p->keep; from < p->start + p->n; from++)
        {
            items[e].tid = wk->tids[from];
            items[e].pos = from;
            items[e].list = p->list;
            e++;
        }
    }
    if (rerank)
        SortAddItemsByTid(items, total);

    chunk = Min(chunk, total);
    lists = (int32 *) palloc(sizeof(int32) * chunk);
    codes = (uint8 *) palloc_extended((Size) code_size * chunk, MCXT_ALLOC_HUGE);
    tids = (uint64 *) palloc(sizeof(uint64) * chunk);
    ids = (uint64 *) palloc(sizeof(uint64) * chunk);
    keep_ids = (uint64 *) palloc(sizeof(uint64) * chunk);
    where = (int64 *) palloc(sizeof(int64) * chunk);
    if (rerank)
        vectors = (char *) palloc_extended(row_bytes * chunk, MCXT_ALLOC_HUGE);

    for (int64 c0 = 0; c0 < total; c0 += chunk)
    {
        int64       n = Min(chunk, total - c0);
        int64       kept = 0;

        for (int64 j = 0; j < n; j++)
        {
            const AddItem *it = &items[c0 + j];

            lists[j] = it->list;
            tids[j] = it->tid;
            where[j] = it->pos;
            memcpy(codes + (Size) j * code_size, wk->codes + (Size) it->pos * code_size, code_size);
        }
        INSTR_TIME_SET_CURRENT(t0);
        if (rerank)
            ResolveVectors(ix, tids, n, row_bytes, ids, vectors);
        else
            memcpy(ids, tids, sizeof(uint64) * n);
        GpuivfAddSeconds(&wk->t_vectors, &t0);
        for (int64 j = 0; j < n; j++)
            ids_out[where[j]] = ids[j];

        /* entries whose vector tuple vanished (VACUUM) are left out */
        for (int64 j = 0; j < n; j++)
        {
            if (ids[j] == UINT64_MAX)
                continue;
            if (kept != j)
            {
                lists[kept] = lists[j];
                memcpy(codes + (Size) kept * code_size, codes + (Size) j * code_size, code_size);
                if (rerank)
                    memcpy(vectors + (Size) kept * row_bytes, vectors + (Size) j * row_bytes,
                           row_bytes);
            }
            keep_ids[kept++] = ids[j];
        }
        INSTR_TIME_SET_CURRENT(t0);
        if (kept > 0)
            WITH_EVICTION(ix, GpuivfCuda.gpuivf_cuda_index_add_encoded(GpuivfCudaRes, ix->gindex, kept,
                                                                       lists, codes, keep_ids,
                                                                       vectors),
                          "add entries to a GPU index");
        GpuivfAddSeconds(&wk->t_device, &t0);
        CHECK_FOR_INTERRUPTS();
    }
    pfree(items);
    pfree(lists);
    pfree(codes);
    pfree(tids);
    pfree(ids);
    pfree(keep_ids);
    pfree(where);
    if (vectors)
        pfree(vectors);
}

/* Replace a page's mirror by what the walk read; ids of kept entries stay. */
void
UpdateMirror(GpuIndex *ix, const Walk *wk, const ChangedPage *p, const uint64 *ids_out)
{
    PageMirror *m;
    bool        found;
    uint64     *tids;
    uint64     *ids;

    tids = (uint64 *) MemoryContextAlloc(ix->cxt, sizeof(uint64) * Max(p->n, 1));
    ids = (uint64 *) MemoryContextAlloc(ix->cxt, sizeof(uint64) * Max(p->n, 1));
    memcpy(tids, wk->tids + p->start, sizeof(uint64) * p->n);
    if (p->keep > 0)
        memcpy(ids, p->old->ids, sizeof(uint64) * p->keep);
    for (int i = p->keep; i < p->n; i++)
        ids[i] = ids_out[p->start + i];
    m = (PageMirror *) hash_search(ix->pages, &p->blkno, HASH_ENTER, &found);
    if (found)
    {
        pfree(m->tids);
        pfree(m->ids);
    }
    m->lsn = p->lsn;
    m->list = p->list;
    m->nentries = p->n;
    m->tids = tids;
    m->ids = ids;
}
