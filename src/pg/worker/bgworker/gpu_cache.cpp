/*
 * worker/bgworker/gpu_cache.cpp — the GPU-resident copies of gpuivf indexes held by one
 * GPU worker: loading them from the index pages, keeping them current, LRU
 * eviction (catching a copy up: gpu_sync.cpp; the searches themselves: streams.cpp).  Every change
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
 * vector when the index stores vectors (exact re-rank on the GPU).  A copy
 * of the codes alone (codes_only: the index with its vectors fits no
 * worker) holds each entry's code and its entry TID instead; its searches
 * return ADC candidates that the backend re-ranks from the vector pages.  Host
 * side, a mirror remembers for every list page its LSN and the entries it
 * held (page-order entry TIDs and heap ids).
 *
 * Never stale.  A request carries the version of the index's rows
 * (storage/storage.h: the newest directory-page LSN of a WAL-logged index,
 * else the metapage generation) its backend read after taking its
 * snapshot.  A copy is labelled with the version read *before* it was
 * (re)loaded, so it holds every entry that existed then: a request is
 * served only by a copy whose label is of the same kind and at least the
 * request's, otherwise the copy catches up first.  Catching up walks the
 * list chains whose change counters moved since the last walk
 * (list_changes.cpp; every chain during recovery, when replay moves no
 * counter) and compares page LSNs (every WAL-logged change of a page moves
 * its LSN); only changed pages are read.  When nothing but inserts happened since the last walk (no
 * change that removes entries was counted; untrusted counters: the metapage
 * generation, which every record that removes entries moves and no insert
 * into a trained WAL-logged index does, stood still since the last walk
 * began), a changed page whose old entries are a prefix of its new ones
 * only appends its new entries;
 * otherwise the page's old entries are removed from the GPU and all its
 * entries added again.  Indexes without reliable LSNs (unlogged, or new in
 * this transaction under wal_level = minimal) are reloaded whenever they
 * changed.  Entries that vanished meanwhile (VACUUM) can only point at rows
 * invisible to the request's snapshot, which the executor filters.
 * A new train_id (REINDEX writes a new relfilenode anyway) is another index.
 */
#include "gpuivf.h"
#include "worker/worker.h"
#include "worker/protocol.h"
#include "worker/bgworker/bgworker.h"
#include "worker/bgworker/gpu_cache.h"
#include "storage/storage.h"

#include "access/xlog.h"
#include "utils/memutils.h"

static GpuIndex Cache[GPUIVF_MAX_CACHED];
static uint64 UseTick = 0;

/* ------------------------------------------------------------- pages */

Buffer
ReadIndexPage(const GpuIndex *ix, BlockNumber blkno)
{
    return ReadBufferWithoutRelcache(ix->node, MAIN_FORKNUM, blkno, RBM_NORMAL, NULL,
                                     ix->permanent);
}

void
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

static Buffer
ReadCopyPage(const void *arg, BlockNumber blkno)
{
    return ReadIndexPage((const GpuIndex *) arg, blkno);
}

/* meta's rows now (its directory's counts) and their version, which is
 * returned (storage/storage.h). */
static uint64
ReadRows(const GpuIndex *ix, GpuivfMetaPageData *meta, bool lsn_reliable)
{
    uint64      rows;
    XLogRecPtr  lsn;
    BlockNumber bad = GpuivfCopyDirRows(ReadCopyPage, ix, meta, &rows, &lsn);

    if (bad != InvalidBlockNumber)
        Corrupted(ix, bad == meta->directory_start + meta->directory_pages
                  ? meta->directory_start : bad, "directory");
    meta->vectors = rows;
    return GpuivfRowsVersion(meta, lsn_reliable, lsn);
}

/* A raw array (model, directory) from consecutive pages. */
void
ReadRawPages(const GpuIndex *ix, BlockNumber start, uint32 npages, uint16 type,
             void *data, Size bytes)
{
    BlockNumber bad = GpuivfCopyRawPages(ReadCopyPage, ix, start, npages, type, data, bytes);

    if (bad != InvalidBlockNumber)
        Corrupted(ix, bad == start + npages ? start : bad, "model or directory");
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
            s->version = ix->version;
            s->vectors = ix->entries;
            s->bytes = ix->device_bytes;
            s->loaded_at = ix->loaded_at;
            s->last_used = ix->last_used_at;
            s->nshards = ix->nshards;
            s->shard = ix->shard;
            s->codes_only = ix->codes_only;
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
    ix->list_changes = NULL;
    ix->list_starts = NULL;
    ix->entries = 0;
    ix->device_bytes = 0;
}

void
GpuivfGpuCacheInit(void)
{
    memset(Cache, 0, sizeof(Cache));
}

/* Evict the least recently used copy other than keep; false when none. */
bool
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

static void
UpdateDeviceBytes(GpuIndex *ix)
{
    gpuivf_cuda_index_stats stats;

    memset(&stats, 0, sizeof(stats));
    GpuivfCheckCuda(GpuivfCuda.gpuivf_cuda_index_get_stats(ix->gindex, &stats), "read index statistics");
    ix->device_bytes = stats.device_bytes;
    ix->entries = stats.vectors;
}

/* ------------------------------------------------------- load / sync */

/* Does the copy hold the re-rank vectors (gpu_cache.h)? */
bool
CopyStoresVectors(const GpuIndex *ix, const GpuivfMetaPageData *meta)
{
    return GpuivfMetaStoresVectors(meta) && !ix->codes_only;
}

/* Create the device index and an empty mirror for meta's model. */
static void
CreateCopy(GpuIndex *ix, const GpuivfMetaPageData *meta)
{
    Size        ncent = (Size) meta->lists * meta->dims;
    Size        ncode = GpuivfCodebookFloats((int) meta->dims, meta->pq_m, meta->pq_bits);
    float      *centroids = (float *) palloc_extended(sizeof(float) * ncent, MCXT_ALLOC_HUGE);
    float      *codebook = (float *) palloc_extended(sizeof(float) * ncode, MCXT_ALLOC_HUGE);
    gpuivf_cuda_model model;
    HASHCTL     ctl;

    ReadRawPages(ix, meta->centroid_start, meta->centroid_pages, GPUIVF_PAGE_CENTROIDS,
                 centroids, sizeof(float) * ncent);
    ReadRawPages(ix, meta->codebook_start, meta->codebook_pages, GPUIVF_PAGE_CODEBOOK,
                 codebook, sizeof(float) * ncode);
    MakeRoom(ix, GpuivfEstimateGpuBytes(meta, ix->nshards, ix->codes_only));

    memset(&model, 0, sizeof(model));
    model.metric = meta->metric;
    model.d = (int32) meta->dims;
    model.nlist = (int32) meta->lists;
    model.m = meta->pq_m;
    model.nbits = meta->pq_bits;
    model.centroids = centroids;
    model.codebook = codebook;
    WITH_EVICTION(ix, GpuivfCuda.gpuivf_cuda_index_create(GpuivfCudaRes, &model,
                                                          !CopyStoresVectors(ix, meta) ? GPUIVF_CUDA_VECTORS_NONE
                                                          : meta->storage == GPUIVF_STORAGE_FLOAT16 ? GPUIVF_CUDA_VECTORS_FLOAT16
                                                          : GPUIVF_CUDA_VECTORS_FLOAT32,
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
    ix->list_changes = NULL;
    ix->list_starts = NULL;
    ix->meta = *meta;
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
    uint64      version1;
    int         new_pages;
    bool        pure;
    uint64     *ids_out;
    uint64     *remove = NULL;
    int64       nremove = 0;
    bool        fresh;
    instr_time  t0;
    double      t_walk = 0.0;   /* seconds until the walk ended */
    double      t_rest = 0.0;   /* and after it */
    bool        in_recovery;
    bool        by_generation;
    uint64      removals_start;
    uint64     *counts;
    const uint64 *seen;
    const BlockNumber *starts;
    BlockNumber *new_starts;

    /*
     * Before the metapage: changes replayed from WAL move no list change
     * counter, so a walk that begins during recovery walks every list, and
     * the next walk trusts the counters only if this one began after it.
     */
    in_recovery = RecoveryInProgress();
    removals_start = GpuivfListRemovalCount(&ix->node);
    INSTR_TIME_SET_CURRENT(t0);

    ReadMetaPage(ix, &meta1);
    if (!GpuivfMetaIsTrained(&meta1) || meta1.train_id != req->train_id ||
        meta1.dims != (uint32) req->dims)
        ereport(ERROR,
                (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                 errmsg("gpuivf index %u changed while the GPU worker loaded it", ix->indexoid)));
    /* the label: every change up to it is done, so the walk sees it */
    version1 = ReadRows(ix, &meta1, req->lsn_reliable);
    /* a copy made while LSNs did not move has a mirror of unmoved LSNs */
    if (ix->gindex != NULL &&
        (full || !req->lsn_reliable || !ix->version_is_lsn || ix->meta.lists != meta1.lists ||
         ix->meta.code_size != meta1.code_size || ix->meta.flags != meta1.flags))
        DropCopy(ix);
    fresh = ix->gindex == NULL;
    if (fresh)
        CreateCopy(ix, &meta1);
    else
        MakeRoom(ix, GpuivfEstimateGpuBytes(&meta1, ix->nshards, ix->codes_only));

    counts = (uint64 *) palloc_extended(sizeof(uint64) * meta1.lists, MCXT_ALLOC_HUGE);
    new_starts = (BlockNumber *) palloc_extended(sizeof(BlockNumber) * meta1.lists, MCXT_ALLOC_HUGE);
    seen = !fresh && req->lsn_reliable && !in_recovery ? ix->list_changes : NULL;
    /* begin lists at their start pages only when nothing but inserts can
     * have changed a list since the last walk began (WalkLists) */
    starts = seen != NULL && ix->removals_seen != GPUIVF_LIST_UNSETTLED &&
        removals_start == ix->removals_seen ? ix->list_starts : NULL;
    memset(&wk, 0, sizeof(wk));
    for (;;)
    {
        wk.code_size = meta1.code_size;
        memset(counts, 0xFF, sizeof(uint64) * meta1.lists);     /* GPUIVF_LIST_UNSETTLED */
        if (ix->list_starts != NULL)
            memcpy(new_starts, ix->list_starts, sizeof(BlockNumber) * meta1.lists);
        else
            memset(new_starts, 0xFF, sizeof(BlockNumber) * meta1.lists);   /* InvalidBlockNumber */
        new_pages = WalkLists(ix, &meta1, req->lsn_reliable && !fresh, seen, starts, counts,
                              new_starts, &wk);
        /* a removal began meanwhile: the pages before a start may have
         * changed, and the next walk would skip their list (its count
         * read settled): walk again from the heads */
        if (starts == NULL || GpuivfListRemovalCount(&ix->node) == removals_start)
            break;
        starts = NULL;
        if (wk.pages)
            pfree(wk.pages);
        if (wk.tids)
            pfree(wk.tids);
        if (wk.codes)
            pfree(wk.codes);
        memset(&wk, 0, sizeof(wk));
    }
    ReadMetaPage(ix, &meta2);
    GpuivfAddSeconds(&t_walk, &t0);

    /*
     * The walk only read pages: searches in flight ran meanwhile.  From here
     * the copy changes, so none may still read it.
     */
    GpuivfDrainSearches();

    /*
     * Only inserts since the last walk?  With trusted counters (seen): no
     * change that removes entries began since the last walk began, nor was
     * under way then (read after this walk's last page).  Else (a standby,
     * or the first walk after recovery): the metapage generation, which
     * every record that removes entries moves (storage/wal.cpp) and inserts
     * into a trained WAL-logged index do not, has not moved since the last
     * walk began; a removal still under way now is seen by the next walk.
     */
    by_generation = !fresh && meta2.generation == ix->walk_generation;
    if (seen != NULL)
        pure = ix->removals_seen != GPUIVF_LIST_UNSETTLED &&
            GpuivfListRemovalCount(&ix->node) == ix->removals_seen;
    else
        pure = by_generation;

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

    ix->removals_seen = in_recovery ? GPUIVF_LIST_UNSETTLED : removals_start;
    if (in_recovery)
    {
        ix->list_changes = NULL;
        ix->list_starts = NULL;
    }
    else
    {
        if (ix->list_changes == NULL)
        {
            ix->list_changes = (uint64 *) MemoryContextAllocHuge(ix->cxt,
                                                                 sizeof(uint64) * meta1.lists);
            ix->list_starts = (BlockNumber *) MemoryContextAllocHuge(ix->cxt,
                                                                     sizeof(BlockNumber) * meta1.lists);
        }
        memcpy(ix->list_changes, counts, sizeof(uint64) * meta1.lists);
        memcpy(ix->list_starts, new_starts, sizeof(BlockNumber) * meta1.lists);
    }
    pfree(counts);
    pfree(new_starts);

    UpdateDeviceBytes(ix);
    ix->meta = meta1;
    ix->version = version1;
    ix->version_is_lsn = req->lsn_reliable;
    ix->walk_generation = meta1.generation;
    GpuivfAddSeconds(&t_rest, &t0);
    elog(DEBUG1, "gpuivf GPU worker %s index %u: %lld entries of %d list pages in %.0f ms "
         "(walking the lists %.0f ms, reading vectors %.0f ms, to the engine %.0f ms); "
         "walked %d of %d lists (%d from their start page), %lld entries removed first (only inserts: %s; by the generation: %s; "
         "%d list pages new)",
         fresh ? "loaded" : "caught up", ix->indexoid, (long long) wk.n, wk.npages,
         1000 * (t_walk + t_rest), 1000 * t_walk, 1000 * wk.t_vectors, 1000 * wk.t_device,
         wk.lists_walked, wk.lists_total, wk.lists_from_start, (long long) nremove,
         fresh ? "-" : pure ? "yes" : "no", fresh ? "-" : by_generation ? "yes" : "no", new_pages);
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
            c->nshards == req->nshards && c->shard == req->shard &&
            c->codes_only == req->codes_only)
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

/* Whether copy ix is loaded and at least at `version`, of the kind req's
 * lsn_reliable says (else GetCopy loads or catches it up, reading pages). */
static bool
CopyIsCurrent(const GpuIndex *ix, const GpuivfRequestSlot *req, uint64 version)
{
    return ix->gindex != NULL && ix->version_is_lsn == req->lsn_reliable &&
        ix->version >= version;
}

/* The copy of req's index, loaded or brought up to `version`. */
static GpuIndex *
GetCopy(const GpuivfRequestSlot *req, uint64 version)
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
        ix->codes_only = req->codes_only;
    }
    ix->last_used = ++UseTick;
    ix->last_used_at = GetCurrentTimestamp();

    /*
     * The limit may have been lowered since (reload): evict down to it,
     * whether or not this request's copy is loaded (a lowered limit can move
     * the index to another placement, codes_only, whose copy is new while
     * the old one stays over the limit).
     */
    {
        int64       limit = GpuivfShmem->workers[GpuivfMyWorker].memory_limit;

        while (CachedBytes(NULL) > limit && EvictOne(ix))
            ;
        if (ix->gindex != NULL && ix->device_bytes > limit)
        {
            int64       need = ix->device_bytes;

            DropCopy(ix);
            ix->in_use = false;
            PublishCache();
            MakeRoom(ix, need);     /* raises the "needs about" error */
        }
    }

    if (!CopyIsCurrent(ix, req, version))
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
 * The GPU copy that serves a search request of at least `version`
 * (loaded, or caught up, first), published in gpuivf_stat.
 */
GpuivfCopyRef
GpuivfGetCopyFor(const GpuivfRequestSlot *req, uint64 version)
{
    GpuIndex   *ix = GetCopy(req, version);
    GpuivfCopyRef ref;

    ref.gindex = ix->gindex;
    ref.stores_vectors = CopyStoresVectors(ix, &ix->meta);
    ref.entries = ix->entries;
    return ref;
}

/*
 * Whether the request's copy is loaded and at least at `version`: then
 * serving it reads no page (GetCopy neither loads nor catches up), and the
 * worker serves it outside a transaction.
 */
bool
GpuivfCopyIsCurrent(const GpuivfRequestSlot *req, uint64 version)
{
    GpuIndex   *ix = FindCopy(req);

    return ix != NULL && CopyIsCurrent(ix, req, version);
}

/*
 * LOAD: load the request's index, or bring its copy up to the request's
 * version, and answer nothing (a build asks once its pages are written,
 * so that its calibration's searches find the copy ready:
 * GpuivfWorkerLoadStart).
 */
void
GpuivfServeLoad(int worker, int slotno)
{
    GpuivfRequestSlot *r = &GpuivfShmem->slots[slotno];

    (void) worker;
    (void) GpuivfGetCopyFor(r, r->version);
    r->result = GPUIVF_RESULT_OK;
}

/* Publish this worker's cache after a search (last-use times). */
void
GpuivfPublishCache(void)
{
    PublishCache();
}
