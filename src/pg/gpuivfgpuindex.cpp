/*
 * gpuivfgpuindex.cpp — the GPU-resident copies of gpuivf indexes held by one
 * GPU worker: loading them from the index pages, keeping them current, LRU
 * eviction (the searches themselves: gpuivfgpusearch.cpp).  Every change
 * of a copy first drains the searches in flight on the worker's search
 * streams (GpuivfDrainSearches), which may still read it.
 *
 * Pages.  The worker serves every database but is connected to none: it
 * reads an index's pages through shared buffers by relfilenode
 * (ReadBufferWithoutRelcache), one share lock at a time, like a scan.  The
 * requesting backend holds AccessShareLock on the index while it waits, so
 * the index cannot be dropped under a request.
 *
 * What is on the GPU: the model (centroids, codebooks) and, per list, every
 * entry's PQ code and its heap TID (the engine's 64-bit id), plus the raw
 * vector when the index stores vectors (exact re-rank on the GPU).  Host
 * side, a mirror remembers for every list page its LSN and the entries it
 * held (page-order entry TIDs and heap ids).
 *
 * Never stale.  A request carries the metapage generation its backend saw
 * after taking its snapshot.  A copy is labelled with the generation read
 * *before* it was (re)loaded, so it holds every entry that existed then: a
 * request is served only by a copy whose label is at least the request's,
 * otherwise the copy catches up first.  Catching up walks every list chain
 * and compares page LSNs (every WAL-logged change of a page moves its LSN);
 * only changed pages are read.  When nothing but inserts happened since the
 * last walk (the generation moved exactly as much as the row count plus the
 * new pages: every other record moves it more), a changed page whose old
 * entries are a prefix of its new ones only appends its new entries;
 * otherwise the page's old entries are removed from the GPU and all its
 * entries added again.  Indexes without reliable LSNs (unlogged, or new in
 * this transaction under wal_level = minimal) are reloaded whenever they
 * changed.  Entries that vanished meanwhile (VACUUM) can only point at rows
 * invisible to the request's snapshot, which the executor filters.
 * A new train_id (REINDEX writes a new relfilenode anyway) is another index.
 */
#include "gpuivf.h"
#include "gpuivfworker.h"

#include "utils/float.h"
#include "utils/memutils.h"

#define GPUIVF_MAX_CACHED       64
#define GPUIVF_ADD_CHUNK_BYTES  ((Size) 64 * 1024 * 1024)

typedef struct PageMirror
{
    BlockNumber blkno;          /* hash key */
    XLogRecPtr  lsn;
    int32       list;
    int32       nentries;
    uint64     *tids;           /* entry TIDs as on the page, page order */
    uint64     *ids;            /* heap ids on the GPU; UINT64_MAX: not added */
} PageMirror;

typedef struct GpuIndex
{
    bool        in_use;
    Oid         dboid;
    Oid         indexoid;
    RelFileNode node;
    bool        permanent;
    uint64      train_id;
    int         nshards;        /* 1, or this copy holds only the lists of */
    int         shard;          /* shard `shard` (gpuivfworker.h, "Sharding") */
    GpuivfMetaPageData meta;    /* shape of the model */
    uint64      generation;     /* every change up to it is on the GPU */
    uint64      end_generation; /* metapage after the last walk */
    uint64      end_vectors;
    gpuivf_cuda_index *gindex;
    MemoryContext cxt;          /* mirror */
    HTAB       *pages;
    int64       entries;
    int64       device_bytes;
    uint64      last_used;
    TimestampTz loaded_at;
    TimestampTz last_used_at;
} GpuIndex;

static GpuIndex Cache[GPUIVF_MAX_CACHED];
static uint64 UseTick = 0;

/* A list page read during a walk whose entries differ from the mirror. */
typedef struct ChangedPage
{
    BlockNumber blkno;
    XLogRecPtr  lsn;
    int32       list;
    PageMirror *old;
    int64       start;          /* into the walk's entry arrays */
    int32       n;
    int32       keep;           /* old entries kept (append-only change) */
} ChangedPage;

typedef struct Walk
{
    ChangedPage *pages;
    int         npages, cappages;
    uint64     *tids;
    uint8      *codes;
    int64       n, cap;
    int         code_size;
    /* where a load's time went, in seconds (the DEBUG1 line of SyncCopy) */
    double      t_vectors;      /* reading vector tuples for the entries */
    double      t_device;       /* handing entries to the engine */
} Walk;

/* ------------------------------------------------------------- pages */

static Buffer
ReadIndexPage(const GpuIndex *ix, BlockNumber blkno)
{
    return ReadBufferWithoutRelcache(ix->node, MAIN_FORKNUM, blkno, RBM_NORMAL, NULL,
                                     ix->permanent);
}

static void
Corrupted(const GpuIndex *ix, BlockNumber blkno, const char *what)
{
    ereport(ERROR,
            (errcode(ERRCODE_INDEX_CORRUPTED),
             errmsg("gpuivf index %u has an unexpected page at block %u", ix->indexoid, blkno),
             errdetail("A %s page was expected.", what)));
}

static void
ReadMetaPage(const GpuIndex *ix, GpuivfMetaPageData *meta)
{
    Buffer      buf = ReadIndexPage(ix, GPUIVF_METAPAGE_BLKNO);
    Page        page;

    LockBuffer(buf, BUFFER_LOCK_SHARE);
    page = BufferGetPage(buf);
    if (!GpuivfPageIsType(page, GPUIVF_PAGE_META))
    {
        UnlockReleaseBuffer(buf);
        Corrupted(ix, GPUIVF_METAPAGE_BLKNO, "meta");
    }
    memcpy(meta, GpuivfPageGetMeta(page), sizeof(GpuivfMetaPageData));
    UnlockReleaseBuffer(buf);
    if (meta->magic != GPUIVF_MAGIC || meta->version != GPUIVF_FORMAT_VERSION)
        ereport(ERROR,
                (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                 errmsg("gpuivf index %u has a format the GPU worker does not read",
                        ix->indexoid)));
}

/* A raw array (model, directory) from consecutive pages. */
static void
ReadRawPages(const GpuIndex *ix, BlockNumber start, uint32 npages, uint16 type,
             void *data, Size bytes)
{
    char       *out = (char *) data;
    Size        left = bytes;

    for (uint32 i = 0; i < npages && left > 0; i++)
    {
        Buffer      buf = ReadIndexPage(ix, start + i);
        Page        page;
        Size        chunk = Min(left, (Size) GPUIVF_PAGE_CAPACITY);

        LockBuffer(buf, BUFFER_LOCK_SHARE);
        page = BufferGetPage(buf);
        if (!GpuivfPageIsType(page, type) ||
            ((PageHeader) page)->pd_lower < MAXALIGN(SizeOfPageHeaderData) + chunk)
        {
            UnlockReleaseBuffer(buf);
            Corrupted(ix, start + i, "model or directory");
        }
        memcpy(out, PageGetContents(page), chunk);
        UnlockReleaseBuffer(buf);
        out += chunk;
        left -= chunk;
    }
    if (left > 0)
        Corrupted(ix, start, "model or directory");
}

/* ------------------------------------------------------------- cache */

/* Publish what this worker holds (gpuivf_stat, gpuivf_index_info). */
static void
PublishCache(void)
{
    GpuivfWorkerSlot *w = &GpuivfShmem->workers[GpuivfMyWorker];
    int         n = 0;
    int64       bytes = 0;

    SpinLockAcquire(&w->mutex);
    for (int i = 0; i < GPUIVF_MAX_CACHED; i++)
    {
        GpuIndex   *ix = &Cache[i];

        if (!ix->in_use || ix->gindex == NULL)
            continue;
        bytes += ix->device_bytes;
        if (n < GPUIVF_MAX_SHOWN_INDEXES)
        {
            GpuivfShownIndex *s = &w->shown[n];

            s->dboid = ix->dboid;
            s->relnode = ix->node.relNode;
            s->indexoid = ix->indexoid;
            s->generation = ix->generation;
            s->vectors = ix->entries;
            s->bytes = ix->device_bytes;
            s->loaded_at = ix->loaded_at;
            s->last_used = ix->last_used_at;
            s->nshards = ix->nshards;
            s->shard = ix->shard;
        }
        n++;
    }
    w->nindexes = n;
    w->bytes_cached = bytes;
    SpinLockRelease(&w->mutex);
}

static void
DropCopy(GpuIndex *ix)
{
    GpuivfDrainSearches();
    if (ix->gindex != NULL)
        (void) GpuivfCuda.gpuivf_cuda_index_destroy(ix->gindex);
    ix->gindex = NULL;
    if (ix->cxt != NULL)
        MemoryContextDelete(ix->cxt);
    ix->cxt = NULL;
    ix->pages = NULL;
    ix->entries = 0;
    ix->device_bytes = 0;
}

void
GpuivfGpuCacheInit(void)
{
    memset(Cache, 0, sizeof(Cache));
}

void
GpuivfGpuCacheReset(void)
{
    for (int i = 0; i < GPUIVF_MAX_CACHED; i++)
    {
        DropCopy(&Cache[i]);
        Cache[i].in_use = false;
    }
    PublishCache();
}

/* Evict the least recently used copy other than keep; false when none. */
static bool
EvictOne(const GpuIndex *keep)
{
    GpuIndex   *victim = NULL;

    for (int i = 0; i < GPUIVF_MAX_CACHED; i++)
    {
        GpuIndex   *ix = &Cache[i];

        if (ix->in_use && ix != keep && (victim == NULL || ix->last_used < victim->last_used))
            victim = ix;
    }
    if (victim == NULL)
        return false;
    DropCopy(victim);
    victim->in_use = false;
    pg_atomic_fetch_add_u64(&GpuivfShmem->workers[GpuivfMyWorker].evictions, 1);
    PublishCache();
    return true;
}

static int64
CachedBytes(const GpuIndex *except)
{
    int64       sum = 0;

    for (int i = 0; i < GPUIVF_MAX_CACHED; i++)
        if (Cache[i].in_use && &Cache[i] != except)
            sum += Cache[i].device_bytes;
    return sum;
}

/* Make room for need bytes under the limit, evicting LRU copies. */
static void
MakeRoom(const GpuIndex *keep, int64 need)
{
    int64       limit = GpuivfShmem->workers[GpuivfMyWorker].memory_limit;

    if (need > limit)
        ereport(ERROR,
                (errcode(ERRCODE_OUT_OF_MEMORY),
                 errmsg("gpuivf index %u needs about %lld MB of GPU memory, more than the %lld MB the GPU worker may use",
                        keep->indexoid, (long long) (need >> 20), (long long) (limit >> 20)),
                 errhint("Raise gpuivf.gpu_memory_limit, or use a GPU with more memory.")));
    while (CachedBytes(keep) + need > limit && EvictOne(keep))
        ;
}

/* Engine call that may run out of memory: evict LRU copies and retry. */
#define WITH_EVICTION(ix, call, what) \
    do { \
        gpuivf_cuda_status st_ = (call); \
        while (st_.code == GPUIVF_CUDA_OUT_OF_MEMORY && EvictOne(ix)) \
            st_ = (call); \
        GpuivfCheckCuda(st_, what); \
    } while (0)

static void
UpdateDeviceBytes(GpuIndex *ix)
{
    gpuivf_cuda_index_stats stats;

    memset(&stats, 0, sizeof(stats));
    GpuivfCheckCuda(GpuivfCuda.gpuivf_cuda_index_get_stats(ix->gindex, &stats), "read index statistics");
    ix->device_bytes = stats.device_bytes;
    ix->entries = stats.vectors;
}

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
 * Walk every list chain; pages whose LSN differs from the mirror (or all
 * pages, when LSNs are not reliable or there is no mirror) have their live
 * entries copied into wk.  Returns the number of pages the mirror lacked.
 */
static int
WalkLists(GpuIndex *ix, const GpuivfMetaPageData *meta, bool use_lsn, Walk *wk)
{
    GpuivfListDirEntry *dir;
    int         new_pages = 0;
    int         code_size = meta->code_size;
    Size        esize = offsetof(GpuivfListEntry, code) + code_size;
    BlockNumber guard = (BlockNumber) (meta->vectors + 2 * meta->lists + 1024);

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

                WalkReserve(wk, maxoff);
                for (OffsetNumber off = FirstOffsetNumber; off <= maxoff; off++)
                {
                    ItemId      iid = PageGetItemId(page, off);
                    GpuivfListEntry *e;

                    if (!ItemIdIsNormal(iid))
                        continue;
                    if (ItemIdGetLength(iid) < esize)
                    {
                        UnlockReleaseBuffer(buf);
                        Corrupted(ix, blkno, "well-formed list");
                    }
                    e = (GpuivfListEntry *) PageGetItem(page, iid);
                    wk->tids[wk->n] = GpuivfTidToId(&e->tid);
                    memcpy(wk->codes + (Size) wk->n * code_size, e->code, code_size);
                    wk->n++;
                    cp->n++;
                }
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
 * their vector tuples; an entry whose tuple is gone gets UINT64_MAX.  Each
 * run of entries on one vector page costs one page read, so callers pass
 * the TIDs in ascending order (AddEntries sorts them): then every page is
 * read once.
 */
static void
ResolveVectors(const GpuIndex *ix, const uint64 *tids, int64 n, int dims, uint64 *ids,
               float *vectors)
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
                ItemIdGetLength(iid) < offsetof(GpuivfVectorTuple, x) + sizeof(float4) * dims)
                continue;
            vt = (GpuivfVectorTuple *) PageGetItem(page, iid);
            ids[i] = GpuivfTidToId(&vt->heaptid);
            memcpy(vectors + (Size) i * dims, vt->x, sizeof(float4) * dims);
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
static void
AddEntries(GpuIndex *ix, const GpuivfMetaPageData *meta, Walk *wk, uint64 *ids_out)
{
    bool        rerank = (meta->flags & GPUIVF_META_RERANK) != 0;
    int         dims = meta->dims;
    int         code_size = meta->code_size;
    Size        per = (Size) code_size + 8 + 8 + 4 + (rerank ? sizeof(float) * dims : 0);
    int64       chunk = Max((int64) 1024, (int64) (GPUIVF_ADD_CHUNK_BYTES / per));
    int64       total = 0;
    int32      *lists;
    uint8      *codes;
    uint64     *tids;
    uint64     *ids;
    uint64     *keep_ids;
    float      *vectors = NULL;
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
        vectors = (float *) palloc_extended(sizeof(float) * dims * chunk, MCXT_ALLOC_HUGE);

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
            ResolveVectors(ix, tids, n, dims, ids, vectors);
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
                    memcpy(vectors + (Size) kept * dims, vectors + (Size) j * dims,
                           sizeof(float) * dims);
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
static void
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

/* ------------------------------------------------------- load / sync */

/* Create the device index and an empty mirror for meta's model. */
static void
CreateCopy(GpuIndex *ix, const GpuivfMetaPageData *meta)
{
    Size        ncent = (Size) meta->lists * meta->dims;
    Size        ncode = (Size) meta->pq_m * ((Size) 1 << meta->pq_bits) * (meta->dims / meta->pq_m);
    float      *centroids = (float *) palloc_extended(sizeof(float) * ncent, MCXT_ALLOC_HUGE);
    float      *codebook = (float *) palloc_extended(sizeof(float) * ncode, MCXT_ALLOC_HUGE);
    gpuivf_cuda_model model;
    HASHCTL     ctl;

    ReadRawPages(ix, meta->centroid_start, meta->centroid_pages, GPUIVF_PAGE_CENTROIDS,
                 centroids, sizeof(float) * ncent);
    ReadRawPages(ix, meta->codebook_start, meta->codebook_pages, GPUIVF_PAGE_CODEBOOK,
                 codebook, sizeof(float) * ncode);
    MakeRoom(ix, GpuivfEstimateGpuBytes(meta, ix->nshards));

    memset(&model, 0, sizeof(model));
    model.metric = meta->metric;
    model.d = (int32) meta->dims;
    model.nlist = (int32) meta->lists;
    model.m = meta->pq_m;
    model.nbits = meta->pq_bits;
    model.centroids = centroids;
    model.codebook = codebook;
    WITH_EVICTION(ix, GpuivfCuda.gpuivf_cuda_index_create(GpuivfCudaRes, &model,
                                                          (meta->flags & GPUIVF_META_RERANK) != 0,
                                                          &ix->gindex),
                  "create a GPU index");
    pfree(centroids);
    pfree(codebook);

    ix->cxt = AllocSetContextCreate(TopMemoryContext, "gpuivf GPU index mirror",
                                    ALLOCSET_DEFAULT_SIZES);
    memset(&ctl, 0, sizeof(ctl));
    ctl.keysize = sizeof(BlockNumber);
    ctl.entrysize = sizeof(PageMirror);
    ctl.hcxt = ix->cxt;
    ix->pages = hash_create("gpuivf page mirror", 1024, &ctl,
                            HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
    ix->meta = *meta;
    ix->end_generation = 0;
    ix->end_vectors = 0;
    ix->loaded_at = GetCurrentTimestamp();
}

/*
 * Bring ix up to date (see the file comment).  full: drop and reload
 * everything.  Returns false when the copy must be reloaded (the caller
 * calls again with full).
 */
static bool
SyncCopy(GpuIndex *ix, const GpuivfRequestSlot *req, bool full)
{
    GpuivfMetaPageData meta1;
    GpuivfMetaPageData meta2;
    Walk        wk;
    int         new_pages;
    bool        pure;
    uint64     *ids_out;
    uint64     *remove = NULL;
    int64       nremove = 0;
    bool        fresh;
    instr_time  t0;
    double      t_walk = 0.0;   /* seconds until the walk ended */
    double      t_rest = 0.0;   /* and after it */

    /* the copy changes: no search in flight may still read it */
    GpuivfDrainSearches();
    INSTR_TIME_SET_CURRENT(t0);

    ReadMetaPage(ix, &meta1);
    if (!GpuivfMetaIsTrained(&meta1) || meta1.train_id != req->train_id ||
        meta1.dims != (uint32) req->dims)
        ereport(ERROR,
                (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                 errmsg("gpuivf index %u changed while the GPU worker loaded it", ix->indexoid)));
    if (ix->gindex != NULL &&
        (full || !req->lsn_reliable || ix->meta.lists != meta1.lists ||
         ix->meta.code_size != meta1.code_size || ix->meta.flags != meta1.flags))
        DropCopy(ix);
    fresh = ix->gindex == NULL;
    if (fresh)
        CreateCopy(ix, &meta1);
    else
        MakeRoom(ix, GpuivfEstimateGpuBytes(&meta1, ix->nshards));

    memset(&wk, 0, sizeof(wk));
    wk.code_size = meta1.code_size;
    new_pages = WalkLists(ix, &meta1, req->lsn_reliable && !fresh, &wk);
    ReadMetaPage(ix, &meta2);
    GpuivfAddSeconds(&t_walk, &t0);

    /* only inserts since the last walk: the generation moved by rows + pages */
    /* (a shard does not walk the other shards' lists, so it cannot count
     * their new pages: it always takes the general path below) */
    pure = !fresh && ix->nshards == 1 &&
        (int64) (meta2.generation - ix->end_generation) ==
        (int64) (meta2.vectors - ix->end_vectors) + new_pages;

    for (int i = 0; i < wk.npages; i++)
    {
        ChangedPage *p = &wk.pages[i];
        PageMirror *old = p->old;

        if (old == NULL)
            continue;
        if (pure && old->nentries <= p->n &&
            memcmp(old->tids, wk.tids + p->start, sizeof(uint64) * old->nentries) == 0)
        {
            p->keep = old->nentries;
            continue;
        }
        if (remove == NULL)
            remove = (uint64 *) palloc(sizeof(uint64) * Max(old->nentries, 64));
        else
            remove = (uint64 *) repalloc(remove, sizeof(uint64) * (nremove + old->nentries));
        for (int j = 0; j < old->nentries; j++)
            if (old->ids[j] != UINT64_MAX)
                remove[nremove++] = old->ids[j];
    }
    if (nremove > 0)
    {
        int64       removed = 0;

        GpuivfCheckCuda(GpuivfCuda.gpuivf_cuda_index_remove(GpuivfCudaRes, ix->gindex, nremove,
                                                            remove, &removed),
                        "remove entries from a GPU index");
        /* an id on the GPU twice (a heap TID reused during a load): reload */
        if (removed != nremove)
            return false;
    }

    ids_out = (uint64 *) palloc_extended(sizeof(uint64) * Max(wk.n, (int64) 1), MCXT_ALLOC_HUGE);
    AddEntries(ix, &meta1, &wk, ids_out);
    for (int i = 0; i < wk.npages; i++)
        UpdateMirror(ix, &wk, &wk.pages[i], ids_out);

    UpdateDeviceBytes(ix);
    ix->meta = meta1;
    ix->generation = meta1.generation;
    ix->end_generation = meta2.generation;
    ix->end_vectors = meta2.vectors;
    GpuivfAddSeconds(&t_rest, &t0);
    elog(DEBUG1, "gpuivf GPU worker %s index %u: %lld entries of %d list pages in %.0f ms "
         "(walking the lists %.0f ms, reading vectors %.0f ms, to the engine %.0f ms)",
         fresh ? "loaded" : "caught up", ix->indexoid, (long long) wk.n, wk.npages,
         1000 * (t_walk + t_rest), 1000 * t_walk, 1000 * wk.t_vectors, 1000 * wk.t_device);
    pg_atomic_fetch_add_u64(fresh ? &GpuivfShmem->workers[GpuivfMyWorker].loads
                            : &GpuivfShmem->workers[GpuivfMyWorker].refreshes, 1);
    return true;
}

/* The cached copy of the request's index (or shard), or NULL. */
static GpuIndex *
FindCopy(const GpuivfRequestSlot *req)
{
    for (int i = 0; i < GPUIVF_MAX_CACHED; i++)
    {
        GpuIndex   *c = &Cache[i];

        if (c->in_use && c->dboid == req->dboid && RelFileNodeEquals(c->node, req->node) &&
            c->indexoid == req->indexoid && c->train_id == req->train_id &&
            c->nshards == req->nshards && c->shard == req->shard)
            return c;
    }
    return NULL;
}

/* An unused cache entry, or NULL. */
static GpuIndex *
FreeCacheEntry(void)
{
    for (int i = 0; i < GPUIVF_MAX_CACHED; i++)
        if (!Cache[i].in_use)
            return &Cache[i];
    return NULL;
}

/* Whether copy ix is loaded and at least at `generation` (else GetCopy
 * loads or catches it up, reading pages). */
static bool
CopyIsCurrent(const GpuIndex *ix, uint64 generation)
{
    return ix->gindex != NULL && ix->generation >= generation;
}

/* The copy of req's index, loaded or brought up to req's generation. */
static GpuIndex *
GetCopy(const GpuivfRequestSlot *req, uint64 generation)
{
    GpuIndex   *ix = FindCopy(req);

    if (ix == NULL)
    {
        ix = FreeCacheEntry();
        if (ix == NULL)
        {
            EvictOne(NULL);
            ix = FreeCacheEntry();
        }
        memset(ix, 0, sizeof(*ix));
        ix->in_use = true;
        ix->dboid = req->dboid;
        ix->indexoid = req->indexoid;
        ix->node = req->node;
        ix->permanent = req->permanent;
        ix->train_id = req->train_id;
        ix->nshards = Max(req->nshards, 1);
        ix->shard = req->shard;
    }
    ix->last_used = ++UseTick;
    ix->last_used_at = GetCurrentTimestamp();

    /* the limit may have been lowered since (reload): evict down to it */
    if (ix->gindex != NULL)
    {
        int64       limit = GpuivfShmem->workers[GpuivfMyWorker].memory_limit;

        while (CachedBytes(NULL) > limit && EvictOne(ix))
            ;
        if (ix->device_bytes > limit)
        {
            int64       need = ix->device_bytes;

            DropCopy(ix);
            ix->in_use = false;
            PublishCache();
            MakeRoom(ix, need);     /* raises the "needs about" error */
        }
    }

    if (!CopyIsCurrent(ix, generation))
    {
        PG_TRY();
        {
            if (!SyncCopy(ix, req, false))
                (void) SyncCopy(ix, req, true);
        }
        PG_CATCH();
        {
            /* a half-synchronised copy is never served */
            DropCopy(ix);
            ix->in_use = false;
            PublishCache();
            PG_RE_THROW();
        }
        PG_END_TRY();
        PublishCache();
    }
    return ix;
}

/*
 * The GPU copy that serves a search request of at least `generation`
 * (loaded, or caught up, first), published in gpuivf_stat.
 */
GpuivfCopyRef
GpuivfGetCopyFor(const GpuivfRequestSlot *req, uint64 generation)
{
    GpuIndex   *ix = GetCopy(req, generation);
    GpuivfCopyRef ref;

    ref.gindex = ix->gindex;
    ref.stores_vectors = (ix->meta.flags & GPUIVF_META_RERANK) != 0;
    ref.entries = ix->entries;
    return ref;
}

/*
 * Whether the request's copy is loaded and at least at `generation`: then
 * serving it reads no page (GetCopy neither loads nor catches up), and the
 * worker serves it outside a transaction.
 */
bool
GpuivfCopyIsCurrent(const GpuivfRequestSlot *req, uint64 generation)
{
    GpuIndex   *ix = FindCopy(req);

    return ix != NULL && CopyIsCurrent(ix, generation);
}

/*
 * LOAD: load the request's index, or bring its copy up to the request's
 * generation, and answer nothing (a build asks before it logs its pages, so
 * that the load overlaps that and its calibration's searches find the copy
 * ready: GpuivfWorkerPrefetchBegin).
 */
void
GpuivfServeLoad(int worker, int slotno)
{
    GpuivfRequestSlot *r = &GpuivfShmem->slots[slotno];

    (void) worker;
    (void) GpuivfGetCopyFor(r, r->generation);
    r->result = GPUIVF_RESULT_OK;
}

/* Publish this worker's cache after a search (last-use times). */
void
GpuivfPublishCache(void)
{
    PublishCache();
}
