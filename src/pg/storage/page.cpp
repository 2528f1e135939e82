/*
 * storage/page.cpp — every change to a gpuivf page happens here.
 *
 * Two kinds of writers:
 *  - the build (ambuild, ambuildempty) appends pages to a fork that nobody
 *    else can see yet and writes them without WAL, logging each page with
 *    log_newpage_range once it is final (when the relation needs WAL, and
 *    always for an init fork);
 *  - insert and VACUUM change live pages through GenericXLog, one record per
 *    logical step, never more than 4 buffers per record (MAX_GENERIC_XLOG_PAGES).
 *
 * Callers lock buffers in the order vector page -> list page(s) -> directory
 * page -> metapage and hand the locked buffers in; these functions only
 * change page contents and never take a lock themselves (except the
 * relation extension lock in GpuivfNewBuffer).
 */
#include "gpuivf.h"
#include "storage/storage.h"

#include "access/xloginsert.h"
#include "storage/bufpage.h"
#include "storage/lmgr.h"
#include "storage/smgr.h"
#include "utils/rel.h"

/* Raw arrays are split into page-sized chunks; every element type we store
 * (float4, GpuivfListDirEntry) must divide the chunk exactly. */
StaticAssertDecl(GPUIVF_PAGE_CAPACITY % sizeof(GpuivfListDirEntry) == 0,
                 "directory entries must tile a page");
StaticAssertDecl(GPUIVF_PAGE_CAPACITY % sizeof(float4) == 0, "floats must tile a page");
StaticAssertDecl(sizeof(GpuivfMetaPageData) <= GPUIVF_PAGE_CAPACITY, "metapage too large");

/* ------------------------------------------------------------ primitives */

/* Format an empty page of the given type (special space, no next page). */
void
GpuivfInitPage(Page page, uint16 page_type)
{
    GpuivfPageOpaque opaque;

    PageInit(page, BLCKSZ, sizeof(GpuivfPageOpaqueData));
    opaque = GpuivfPageGetOpaque(page);
    opaque->nextblkno = InvalidBlockNumber;
    opaque->page_type = page_type;
    opaque->page_id = GPUIVF_PAGE_ID;
}

/*
 * Whether extending the relation needs the extension lock: when others may
 * extend it too.  A relation created in this transaction is invisible to
 * other backends, but not to the parallel workers of a parallel build,
 * whose relcache does not know it is new: they extend the index with the
 * leader (their extension locks conflict with the leader's).
 */
static bool
ExtensionNeedsLock(Relation index)
{
    return !RELATION_IS_LOCAL(index) || IsInParallelMode();
}

/*
 * Extend a fork by one page; returns it exclusively locked and all-zero.
 * The caller initializes it (in a WAL record, or during the build).
 * RBM_ZERO_AND_LOCK locks it before anyone else can see it, so no reader
 * (VACUUM recording all-zero pages as free) can hand it out meanwhile.
 */
Buffer
GpuivfNewBuffer(Relation index, ForkNumber forknum)
{
    bool        need_lock = ExtensionNeedsLock(index);
    Buffer      buf;

    if (need_lock)
        LockRelationForExtension(index, ExclusiveLock);
    buf = ReadBufferExtended(index, forknum, P_NEW, RBM_ZERO_AND_LOCK, NULL);
    if (need_lock)
        UnlockRelationForExtension(index, ExclusiveLock);
    return buf;
}

/*
 * A new vector page for an insert, exclusively locked and all-zero, like
 * GpuivfNewBuffer; when other backends wait for the extension lock too
 * (concurrent inserts each filling pages of their own), the fork grows by
 * a few more all-zero pages, which go to the FSM for them (as heap inserts
 * do, RelationAddExtraBlocks): one lock round per waiter instead of one
 * per page.
 */
Buffer
GpuivfNewVectorBuffer(Relation index)
{
    Buffer      buf;
    int         extra = 0;
    BlockNumber first_extra = InvalidBlockNumber;

    if (!ExtensionNeedsLock(index))
        return ReadBufferExtended(index, MAIN_FORKNUM, P_NEW, RBM_ZERO_AND_LOCK, NULL);
    LockRelationForExtension(index, ExclusiveLock);
    buf = ReadBufferExtended(index, MAIN_FORKNUM, P_NEW, RBM_ZERO_AND_LOCK, NULL);
    extra = Min(RelationExtensionLockWaiterCount(index) * 4, GPUIVF_INSERT_EXTEND_MAX);
    for (int i = 0; i < extra; i++)
    {
        Buffer      e = ReadBufferExtended(index, MAIN_FORKNUM, P_NEW, RBM_ZERO_AND_LOCK, NULL);
        BlockNumber blk = BufferGetBlockNumber(e);

        if (first_extra == InvalidBlockNumber)
            first_extra = blk;
        UnlockReleaseBuffer(e);
        RecordPageWithFreeSpace(index, blk, GPUIVF_PAGE_CAPACITY);
    }
    UnlockRelationForExtension(index, ExclusiveLock);
    if (extra > 0)
        FreeSpaceMapVacuumRange(index, first_extra, first_extra + extra);
    return buf;
}

/* Register a buffer whose old contents do not matter and format it. */
void
GpuivfInitRegisterPage(GenericXLogState *state, Buffer buf, uint16 page_type, Page *page)
{
    *page = GenericXLogRegisterBuffer(state, buf, GENERIC_XLOG_FULL_IMAGE);
    GpuivfInitPage(*page, page_type);
}

/* Add one item; the caller checked the room, so failure means corruption. */
static OffsetNumber
PageAddItemOrError(Relation index, Page page, const void *item, Size size)
{
    OffsetNumber off;

    off = PageAddItem(page, (Item) item, size, InvalidOffsetNumber, false, false);
    if (off == InvalidOffsetNumber)
        elog(ERROR, "failed to add item of %zu bytes to page of gpuivf index \"%s\"",
             size, RelationGetRelationName(index));
    return off;
}

/*
 * Bytes an item page (list or vector page) can still take for one more item:
 * PageGetFreeSpace, or 0 when the page already has MaxIndexTuplesPerPage
 * line pointers and none of them is free.  PostgreSQL's page routines size
 * their arrays by that bound (PageIndexMultiDelete's would overflow), and
 * small items would pass it: a list entry with a code of 1 or 2 bytes takes
 * 8 bytes, 680 of which fit the free space of a page.  Every decision to add
 * an item (build writers, inserts, the free space VACUUM and inserts record
 * in the FSM) goes through this, so no page gpuivf writes exceeds the bound.
 */
Size
GpuivfPageFreeSpace(Page page)
{
    OffsetNumber maxoff = PageGetMaxOffsetNumber(page);

    if (maxoff < MaxIndexTuplesPerPage)
        return PageGetFreeSpace(page);
    /* at the bound: only a line pointer VACUUM freed (vector pages) can be reused */
    if (PageHasFreeLinePointers(page))
    {
        for (OffsetNumber off = FirstOffsetNumber; off <= maxoff; off++)
            if (!ItemIdIsUsed(PageGetItemId(page, off)))
                return PageGetFreeSpace(page);
    }
    return 0;
}

/* Can page take one more item of size bytes (GpuivfPageFreeSpace)? */
bool
GpuivfPageHasRoom(Page page, Size size)
{
    return GpuivfPageFreeSpace(page) >= MAXALIGN(size);
}

/* Block of the directory page that holds list's entry. */
BlockNumber
GpuivfDirPageOf(const GpuivfMetaPageData *meta, int list)
{
    return meta->directory_start + (BlockNumber) (list / (int) GPUIVF_DIR_ENTRIES_PER_PAGE);
}

/* The entry of list on its directory page (a page image, locked by caller). */
static GpuivfListDirEntry *
DirEntryOnPage(Page page, int list)
{
    return ((GpuivfListDirEntry *) PageGetContents(page)) +
        (list % (int) GPUIVF_DIR_ENTRIES_PER_PAGE);
}

/* Raise "index corrupted" for a page of the wrong type. */
static void
ReportBadPage(Relation index, BlockNumber blkno, uint16 expected)
{
    ereport(ERROR,
            (errcode(ERRCODE_INDEX_CORRUPTED),
             errmsg("gpuivf index \"%s\" has an unexpected page at block %u",
                    RelationGetRelationName(index), blkno),
             errdetail("Expected a page of type %d.", (int) expected),
             errhint("Rebuild the index with REINDEX.")));
}

/* --------------------------------------------------- reading raw arrays */

/*
 * Copies a raw array (centroids, codebooks, directory) out of npages
 * consecutive pages of page_type, one share lock at a time, reading each
 * page through read_page (ReadBuffer for a backend; the GPU worker, which
 * has no Relation, reads by relfilenode).  Returns InvalidBlockNumber, or
 * the first block that is not such a page holding its part of the array
 * (start + npages when the pages end too early): the caller raises its
 * corruption error.  No buffer is locked or pinned on return.
 */
BlockNumber
GpuivfCopyRawPages(GpuivfReadPageFn read_page, const void *arg, BlockNumber start,
                   uint32 npages, uint16 page_type, void *data, Size bytes)
{
    char       *out = (char *) data;
    Size        left = bytes;

    for (uint32 i = 0; i < npages && left > 0; i++)
    {
        BlockNumber blkno = start + i;
        Buffer      buf = read_page(arg, blkno);
        Page        page;
        Size        chunk = Min(left, (Size) GPUIVF_PAGE_CAPACITY);

        LockBuffer(buf, BUFFER_LOCK_SHARE);
        page = BufferGetPage(buf);
        if (!GpuivfPageIsType(page, page_type) ||
            ((PageHeader) page)->pd_lower < MAXALIGN(SizeOfPageHeaderData) + chunk)
        {
            UnlockReleaseBuffer(buf);
            return blkno;
        }
        memcpy(out, PageGetContents(page), chunk);
        UnlockReleaseBuffer(buf);
        out += chunk;
        left -= chunk;
    }
    return left > 0 ? start + npages : InvalidBlockNumber;
}

static Buffer
ReadRelationPage(const void *arg, BlockNumber blkno)
{
    return ReadBuffer((Relation) arg, blkno);
}

/* GpuivfCopyRawPages of index, raising the corruption error. */
void
GpuivfReadRawPages(Relation index, BlockNumber start, uint32 npages, uint16 page_type,
                   void *data, Size bytes)
{
    BlockNumber bad = GpuivfCopyRawPages(ReadRelationPage, index, start, npages, page_type,
                                         data, bytes);

    if (bad == start + npages)
        ereport(ERROR,
                (errcode(ERRCODE_INDEX_CORRUPTED),
                 errmsg("gpuivf index \"%s\" has too few pages of type %d",
                        RelationGetRelationName(index), (int) page_type),
                 errhint("Rebuild the index with REINDEX.")));
    if (bad != InvalidBlockNumber)
        ReportBadPage(index, bad, page_type);
}

/* Copy one list's directory entry (share lock on its directory page). */
GpuivfListDirEntry
GpuivfReadDirEntry(Relation index, const GpuivfMetaPageData *meta, int list)
{
    BlockNumber blkno = GpuivfDirPageOf(meta, list);
    Buffer      buf;
    Page        page;
    GpuivfListDirEntry entry;

    Assert(list >= 0 && (uint32) list < meta->lists);
    buf = ReadBuffer(index, blkno);
    LockBuffer(buf, BUFFER_LOCK_SHARE);
    page = BufferGetPage(buf);
    if (!GpuivfPageIsType(page, GPUIVF_PAGE_DIRECTORY))
    {
        UnlockReleaseBuffer(buf);
        ReportBadPage(index, blkno, GPUIVF_PAGE_DIRECTORY);
    }
    entry = *DirEntryOnPage(page, list);
    UnlockReleaseBuffer(buf);
    return entry;
}

/* ------------------------------------------------ build-time page writes */

/* Mark a build page dirty and let it go (no WAL: logged at the end). */
static void
BuildReleasePage(Buffer buf)
{
    MarkBufferDirty(buf);
    UnlockReleaseBuffer(buf);
}

/* Append raw pages holding data; start and npages say where they went. */
void
GpuivfWriteRawPages(Relation index, ForkNumber forknum, uint16 page_type,
                    const void *data, Size bytes, bool wal, BlockNumber *start, uint32 *npages)
{
    const char *in = (const char *) data;
    Size        left = bytes;
    BlockNumber expected = InvalidBlockNumber;

    *start = InvalidBlockNumber;
    *npages = 0;
    while (left > 0)
    {
        Buffer      buf = GpuivfNewBuffer(index, forknum);
        Page        page = BufferGetPage(buf);
        Size        chunk = Min(left, (Size) GPUIVF_PAGE_CAPACITY);
        BlockNumber blkno = BufferGetBlockNumber(buf);

        /* the build is the only writer, so the pages come out consecutive */
        if (expected != InvalidBlockNumber && blkno != expected)
            elog(ERROR, "gpuivf build expected block %u, got %u", expected, blkno);
        if (*start == InvalidBlockNumber)
            *start = blkno;
        GpuivfInitPage(page, page_type);
        memcpy(PageGetContents(page), in, chunk);
        /* pd_lower covers the array so full-page images keep it */
        ((PageHeader) page)->pd_lower = MAXALIGN(SizeOfPageHeaderData) + chunk;
        BuildReleasePage(buf);
        in += chunk;
        left -= chunk;
        (*npages)++;
        expected = blkno + 1;
    }
    if (wal && *npages > 0)
        log_newpage_range(index, forknum, *start, *start + *npages, true);
}

/* Start a writer that appends items to fresh pages of page_type. */
void
GpuivfWriterInit(GpuivfPageWriter *w, Relation index, ForkNumber forknum,
                 uint16 page_type, bool chained, bool wal)
{
    w->index = index;
    w->forknum = forknum;
    w->page_type = page_type;
    w->chained = chained;
    w->wal = wal;
    w->log_first = w->log_end = InvalidBlockNumber;
    w->buf = InvalidBuffer;
    w->blkno = InvalidBlockNumber;
    w->chain_head = InvalidBlockNumber;
    w->pages = 0;
    w->reserve_next = w->reserve_end = 0;
}

/* Log the finished pages not logged yet. */
static void
WriterLogRun(GpuivfPageWriter *w)
{
    if (w->log_first != InvalidBlockNumber && w->log_end > w->log_first)
        log_newpage_range(w->index, w->forknum, w->log_first, w->log_end, true);
    w->log_first = w->log_end = InvalidBlockNumber;
}

/* The writer left page blkno (released) for good: it is final. */
static void
WriterRetirePage(GpuivfPageWriter *w, BlockNumber blkno)
{
    if (!w->wal || blkno == InvalidBlockNumber)
        return;
    if (w->log_first != InvalidBlockNumber && blkno != w->log_end)
        WriterLogRun(w);        /* not next to the run: log the run alone */
    if (w->log_first == InvalidBlockNumber)
        w->log_first = blkno;
    w->log_end = blkno + 1;
    if (w->log_end - w->log_first >= GPUIVF_WRITER_LOG_RUN)
        WriterLogRun(w);
}

/* Close the current page; the next item starts a new chain (a new list). */
void
GpuivfWriterNewChain(GpuivfPageWriter *w)
{
    GpuivfWriterPause(w);
    WriterRetirePage(w, w->blkno);
    w->blkno = InvalidBlockNumber;
    w->chain_head = InvalidBlockNumber;
}

/* Release the current page but remember it, so engine work runs unlocked. */
void
GpuivfWriterPause(GpuivfPageWriter *w)
{
    if (BufferIsValid(w->buf))
        BuildReleasePage(w->buf);
    w->buf = InvalidBuffer;
}

/*
 * A fresh page for a build writer, exclusively locked and all-zero.  The
 * fork grows by a chunk of pages at a time: one write of the chunk's last
 * page (the pages before it are a hole in the file until their buffers are
 * written), instead of one write of a zero page per page, which was a sixth
 * of the backend's time in a 1M-row build.  Chunks grow with the writer (an
 * eighth of its pages so far, 1 to 1024), so at most an eighth of its pages
 * is left over.  Those stay all-zero, like the page of an extension cut
 * short by a crash: GpuivfWriterFinish (and later VACUUM) records them in
 * the FSM, inserts take them, log_newpage_range skips them.  Writers of
 * several processes take chunks under the relation extension lock.
 */
static Buffer
WriterNewBuffer(GpuivfPageWriter *w)
{
    if (w->reserve_next >= w->reserve_end)
    {
        bool        need_lock = ExtensionNeedsLock(w->index);
        BlockNumber chunk = Min(Max((BlockNumber) GPUIVF_WRITER_CHUNK_MIN, w->pages / 8),
                                (BlockNumber) GPUIVF_WRITER_CHUNK_MAX);
        BlockNumber first;
        PGAlignedBlock zero;

        memset(zero.data, 0, BLCKSZ);
        if (need_lock)
            LockRelationForExtension(w->index, ExclusiveLock);
        first = RelationGetNumberOfBlocksInFork(w->index, w->forknum);
        smgrextend(RelationGetSmgr(w->index), w->forknum, first + chunk - 1, zero.data, false);
        if (need_lock)
            UnlockRelationForExtension(w->index, ExclusiveLock);
        w->reserve_next = first;
        w->reserve_end = first + chunk;
    }
    return ReadBufferExtended(w->index, w->forknum, w->reserve_next++, RBM_ZERO_AND_LOCK, NULL);
}

/*
 * The writer is done: its page is released, and the pages it added to the
 * fork but did not use go to the FSM as empty (as VACUUM records all-zero
 * pages), so the first inserts fill them instead of extending the file.  The
 * caller updates the FSM's upper levels (FreeSpaceMapVacuum).
 */
void
GpuivfWriterFinish(GpuivfPageWriter *w)
{
    BlockNumber last = w->blkno;
    Size        last_free = 0;

    if (last != InvalidBlockNumber)
    {
        if (!BufferIsValid(w->buf))
        {
            w->buf = ReadBufferExtended(w->index, w->forknum, last, RBM_NORMAL, NULL);
            LockBuffer(w->buf, BUFFER_LOCK_SHARE);
            last_free = GpuivfPageFreeSpace(BufferGetPage(w->buf));
            UnlockReleaseBuffer(w->buf);
            w->buf = InvalidBuffer;
        }
        else
            last_free = GpuivfPageFreeSpace(BufferGetPage(w->buf));
    }
    GpuivfWriterPause(w);
    WriterRetirePage(w, last);
    WriterLogRun(w);
    if (w->forknum == MAIN_FORKNUM)
    {
        /* a parallel build leaves a partly filled page per participant */
        if (last != InvalidBlockNumber && !w->chained && last_free > 0)
            RecordPageWithFreeSpace(w->index, last, last_free);
        for (BlockNumber b = w->reserve_next; b < w->reserve_end; b++)
            RecordPageWithFreeSpace(w->index, b, GPUIVF_PAGE_CAPACITY);
    }
    w->reserve_next = w->reserve_end;
    w->blkno = InvalidBlockNumber;
}

/* Append a fresh page, linking it from the current one when chained. */
static void
WriterNextPage(GpuivfPageWriter *w)
{
    Buffer      nbuf = WriterNewBuffer(w);
    BlockNumber nblk = BufferGetBlockNumber(nbuf);

    GpuivfInitPage(BufferGetPage(nbuf), w->page_type);
    if (BufferIsValid(w->buf))
    {
        if (w->chained)
            GpuivfPageGetOpaque(BufferGetPage(w->buf))->nextblkno = nblk;
        BuildReleasePage(w->buf);
        WriterRetirePage(w, w->blkno);
    }
    if (w->chain_head == InvalidBlockNumber)
        w->chain_head = nblk;
    w->buf = nbuf;
    w->blkno = nblk;
    w->pages++;
}

/* Add one item at the end, on a new page when the current one is full;
 * *tid (when not null) receives where it went. */
void
GpuivfWriterAdd(GpuivfPageWriter *w, const void *item, Size size, ItemPointer tid)
{
    OffsetNumber off;

    if (!BufferIsValid(w->buf) && w->blkno != InvalidBlockNumber)
    {
        w->buf = ReadBufferExtended(w->index, w->forknum, w->blkno, RBM_NORMAL, NULL);
        LockBuffer(w->buf, BUFFER_LOCK_EXCLUSIVE);
    }
    if (!BufferIsValid(w->buf) || !GpuivfPageHasRoom(BufferGetPage(w->buf), size))
        WriterNextPage(w);
    off = PageAddItemOrError(w->index, BufferGetPage(w->buf), item, size);
    if (tid)
        ItemPointerSet(tid, w->blkno, off);
}

/* Write the metapage (block 0) of a fork being built; the build calls it
 * first with a placeholder so the metapage takes block 0 (wal false), then
 * at the end (logged when wal). */
void
GpuivfBuildPutMeta(Relation index, ForkNumber forknum, const GpuivfMetaPageData *meta, bool wal)
{
    Buffer      buf;
    Page        page;

    if (RelationGetNumberOfBlocksInFork(index, forknum) == 0)
        buf = GpuivfNewBuffer(index, forknum);
    else
    {
        buf = ReadBufferExtended(index, forknum, GPUIVF_METAPAGE_BLKNO, RBM_NORMAL, NULL);
        LockBuffer(buf, BUFFER_LOCK_EXCLUSIVE);
    }
    if (BufferGetBlockNumber(buf) != GPUIVF_METAPAGE_BLKNO)
        elog(ERROR, "gpuivf metapage must be block 0");
    page = BufferGetPage(buf);
    GpuivfInitPage(page, GPUIVF_PAGE_META);
    memcpy(GpuivfPageGetMeta(page), meta, sizeof(GpuivfMetaPageData));
    ((PageHeader) page)->pd_lower = MAXALIGN(SizeOfPageHeaderData) + sizeof(GpuivfMetaPageData);
    BuildReleasePage(buf);
    if (wal)
        log_newpage_range(index, forknum, GPUIVF_METAPAGE_BLKNO, GPUIVF_METAPAGE_BLKNO + 1, true);
}

/* -------------------------------------------------- WAL-logged changes */

/* Register the metapage in a record: generation + 1, vectors + delta. */
void
GpuivfBumpMeta(GenericXLogState *state, Buffer metabuf, int64 vectors_delta)
{
    Page        page = GenericXLogRegisterBuffer(state, metabuf, 0);
    GpuivfMetaPage meta = GpuivfPageGetMeta(page);

    if (vectors_delta < 0 && (uint64) (-vectors_delta) > meta->vectors)
        meta->vectors = 0;
    else
        meta->vectors += vectors_delta;
    meta->generation++;
}

/*
 * One row in one record: the vector tuple (vecbuf), the list entry pointing
 * at it (listbuf), the list's count in the directory (dirbuf) and the
 * metapage (vectors, generation, vector_insert_page, dims of a first row).
 * Untrained: vecbuf + metabuf only.  rerank = false: no vecbuf, and the
 * entry holds the heap TID.  At most 4 buffers.
 */
void
GpuivfLogInsert(Relation index, const GpuivfInsertPlan *plan)
{
    GenericXLogState *state = GenericXLogStart(index);
    ItemPointerData entry_tid = plan->heaptid;
    BlockNumber vecblk = InvalidBlockNumber;
    Page        mpage;
    GpuivfMetaPage meta;

    if (BufferIsValid(plan->vecbuf))
    {
        Page        vpage;
        Size        size = GpuivfVectorTupleSizeFor((int) plan->dims, plan->storage, plan->from_table);
        GpuivfVectorTuple *vt = (GpuivfVectorTuple *) palloc0(size);
        ItemPointerData heaptid = plan->heaptid;
        OffsetNumber off;

        if (plan->vec_init)
            GpuivfInitRegisterPage(state, plan->vecbuf, GPUIVF_PAGE_VECTOR, &vpage);
        else
            vpage = GenericXLogRegisterBuffer(state, plan->vecbuf, 0);
        GpuivfFillVectorTuple(vt, &heaptid, plan->vector, (int) plan->dims, plan->storage,
                              plan->from_table);
        off = PageAddItemOrError(index, vpage, vt, size);
        vecblk = BufferGetBlockNumber(plan->vecbuf);
        ItemPointerSet(&entry_tid, vecblk, off);
        pfree(vt);
    }

    if (BufferIsValid(plan->listbuf))
    {
        Page        lpage = GenericXLogRegisterBuffer(state, plan->listbuf, 0);
        Size        size = GPUIVF_LIST_ENTRY_SIZE(plan->code_size);
        GpuivfListEntry *entry = (GpuivfListEntry *) palloc0(size);
        Page        dpage;
        GpuivfListDirEntry *dir;

        entry->tid = entry_tid;
        memcpy(entry->code, plan->code, plan->code_size);
        PageAddItemOrError(index, lpage, entry, size);
        pfree(entry);

        dpage = GenericXLogRegisterBuffer(state, plan->dirbuf, 0);
        dir = DirEntryOnPage(dpage, plan->list);
        dir->count++;
        if (plan->new_insert_page != InvalidBlockNumber)
            dir->insert_page = plan->new_insert_page;
    }

    mpage = GenericXLogRegisterBuffer(state, plan->metabuf, 0);
    meta = GpuivfPageGetMeta(mpage);
    meta->vectors++;
    meta->generation++;
    if (plan->vec_init)
        meta->vector_insert_page = vecblk;
    if (plan->set_dims)
    {
        meta->dims = plan->dims;
        meta->flags = plan->set_flags;
    }

    GenericXLogFinish(state);
}

/*
 * Link a new, empty list page at the end of a list (or make it the list's
 * first page when tailbuf is InvalidBuffer), point the directory's tail and
 * insert_page at it, and bump the generation.  Its own record (4 buffers):
 * the index is consistent after it.
 */
void
GpuivfLogAppendListPage(Relation index, Buffer tailbuf, Buffer newbuf, Buffer dirbuf,
                        int list, Buffer metabuf)
{
    GenericXLogState *state = GenericXLogStart(index);
    BlockNumber newblk = BufferGetBlockNumber(newbuf);
    Page        npage;
    Page        dpage;
    GpuivfListDirEntry *dir;

    GpuivfInitRegisterPage(state, newbuf, GPUIVF_PAGE_LIST, &npage);
    if (BufferIsValid(tailbuf))
    {
        Page        tpage = GenericXLogRegisterBuffer(state, tailbuf, 0);

        GpuivfPageGetOpaque(tpage)->nextblkno = newblk;
    }
    dpage = GenericXLogRegisterBuffer(state, dirbuf, 0);
    dir = DirEntryOnPage(dpage, list);
    if (dir->head == InvalidBlockNumber)
        dir->head = newblk;
    dir->tail = newblk;
    dir->insert_page = newblk;
    GpuivfBumpMeta(state, metabuf, 0);
    GenericXLogFinish(state);
}

/*
 * Remove the items at offsets (ascending) and compact the page, whatever its
 * number of line pointers: the kept items are added again, in their order,
 * to a freshly formatted page with the same special space.  Only for pages
 * whose items nothing points at (list pages).  Not PageIndexMultiDelete: its
 * arrays hold MaxIndexTuplesPerPage items, and indexes written before
 * GpuivfPageFreeSpace enforced that bound have list pages with up to 680.
 */
static void
DeleteItemsAndCompact(Relation index, Page page, const OffsetNumber *offsets, int noffsets)
{
    PGAlignedBlock copy;
    Page        old = copy.data;
    OffsetNumber maxoff;
    int         next = 0;

    memcpy(old, page, BLCKSZ);
    PageInit(page, BLCKSZ, PageGetSpecialSize(old));
    memcpy(PageGetSpecialPointer(page), PageGetSpecialPointer(old), PageGetSpecialSize(old));
    maxoff = PageGetMaxOffsetNumber(old);
    for (OffsetNumber off = FirstOffsetNumber; off <= maxoff; off++)
    {
        ItemId      iid = PageGetItemId(old, off);

        while (next < noffsets && offsets[next] < off)
            next++;
        if ((next < noffsets && offsets[next] == off) || !ItemIdIsUsed(iid))
            continue;
        PageAddItemOrError(index, page, PageGetItem(old, iid), ItemIdGetLength(iid));
    }
}

/*
 * VACUUM: remove entries (offsets ascending) from one list page, lower the
 * list's count and the metapage's vectors, bump the generation, and move the
 * list's insert_page back to this page when asked.  3 buffers.
 */
void
GpuivfLogDeleteListEntries(Relation index, Buffer listbuf, OffsetNumber *offsets, int noffsets,
                           Buffer dirbuf, const GpuivfMetaPageData *meta, int list,
                           BlockNumber new_insert_page, Buffer metabuf)
{
    GenericXLogState *state = GenericXLogStart(index);
    Page        lpage = GenericXLogRegisterBuffer(state, listbuf, 0);
    Page        dpage;
    GpuivfListDirEntry *dir;

    (void) meta;
    DeleteItemsAndCompact(index, lpage, offsets, noffsets);
    dpage = GenericXLogRegisterBuffer(state, dirbuf, 0);
    dir = DirEntryOnPage(dpage, list);
    dir->count = dir->count >= (uint32) noffsets ? dir->count - noffsets : 0;
    if (new_insert_page != InvalidBlockNumber)
        dir->insert_page = new_insert_page;
    GpuivfBumpMeta(state, metabuf, -(int64) noffsets);
    GenericXLogFinish(state);
}

/*
 * VACUUM: free vector tuples (offsets ascending).  Line pointers stay (set
 * unused) so every other tuple keeps its TID, which list entries point at;
 * the page is marked as having free line pointers so inserts reuse them.
 * count_vectors: the tuples were the rows themselves (untrained index).
 */
void
GpuivfLogFreeVectorTuples(Relation index, Buffer vecbuf, OffsetNumber *offsets, int noffsets,
                          Buffer metabuf, bool count_vectors)
{
    GenericXLogState *state = GenericXLogStart(index);
    Page        vpage = GenericXLogRegisterBuffer(state, vecbuf, 0);
    OffsetNumber maxoff;

    /* from the end, so removing a trailing line pointer never shifts others */
    for (int i = noffsets - 1; i >= 0; i--)
        PageIndexTupleDeleteNoCompact(vpage, offsets[i]);
    maxoff = PageGetMaxOffsetNumber(vpage);
    for (OffsetNumber off = FirstOffsetNumber; off <= maxoff; off++)
    {
        if (!ItemIdIsUsed(PageGetItemId(vpage, off)))
        {
            PageSetHasFreeLinePointers(vpage);
            break;
        }
    }
    GpuivfBumpMeta(state, metabuf, count_vectors ? -(int64) noffsets : 0);
    GenericXLogFinish(state);
}

/* -------------------------------------------------- ANALYZE calibration */

/* The fields before the calibration keep the offsets of format version 1
 * (README.md, "Metapage"). */
StaticAssertDecl(offsetof(GpuivfMetaPageData, vector_insert_page) == 80,
                 "metapage fields of format 1 moved");
StaticAssertDecl(offsetof(GpuivfMetaPageData, calib_sample) == 84,
                 "calibration fields must follow vector_insert_page");
StaticAssertDecl(offsetof(GpuivfMetaPageData, calib_nprobe) == 152 &&
                 offsetof(GpuivfMetaPageData, calib_recall) == 408 &&
                 sizeof(GpuivfMetaPageData) == 1944,
                 "metapage layout differs from README.md");

/* Format a calibration-query page: stamp calib_id, n floats of data, the
 * chain link kept as it was (next). */
static void
PutCalibPage(Page page, BlockNumber next, uint32 calib_id, const float4 *data, uint32 n)
{
    GpuivfCalibPageHeader *hdr;

    Assert(n <= GPUIVF_CALIB_FLOATS_PER_PAGE);
    GpuivfInitPage(page, GPUIVF_PAGE_CALIB);
    GpuivfPageGetOpaque(page)->nextblkno = next;
    hdr = (GpuivfCalibPageHeader *) PageGetContents(page);
    hdr->calib_id = calib_id;
    hdr->nfloats = n;
    if (n > 0)
        memcpy((char *) hdr + sizeof(GpuivfCalibPageHeader), data, sizeof(float4) * n);
    ((PageHeader) page)->pd_lower = MAXALIGN(SizeOfPageHeaderData) +
        sizeof(GpuivfCalibPageHeader) + sizeof(float4) * n;
}

/*
 * Grow the chain of free calibration-query pages by the pages newbufs[0..n)
 * (n <= 2; new pages of the fork, exclusively locked by the caller): they
 * are formatted empty and linked behind tailbuf, the chain's last page, or,
 * when the chain is empty (tailbuf invalid), become it, in one record with
 * the metapage (calib_free_head, calib_free_pages).  So a page is never
 * outside a chain the metapage reaches, whatever crashes.
 */
void
GpuivfLogCalibFreeAppend(Relation index, Buffer tailbuf, const Buffer *newbufs, int n,
                         Buffer metabuf)
{
    GenericXLogState *state = GenericXLogStart(index);
    Page        metapage;
    GpuivfMetaPage meta;
    BlockNumber first = BufferGetBlockNumber(newbufs[0]);

    Assert(n >= 1 && n <= MAX_GENERIC_XLOG_PAGES - 2);
    for (int i = 0; i < n; i++)
    {
        Page        page = GenericXLogRegisterBuffer(state, newbufs[i], GENERIC_XLOG_FULL_IMAGE);

        PutCalibPage(page, i + 1 < n ? BufferGetBlockNumber(newbufs[i + 1]) : InvalidBlockNumber,
                     0, NULL, 0);
    }
    if (BufferIsValid(tailbuf))
    {
        Page        tail = GenericXLogRegisterBuffer(state, tailbuf, 0);

        GpuivfPageGetOpaque(tail)->nextblkno = first;
    }
    metapage = GenericXLogRegisterBuffer(state, metabuf, 0);
    meta = GpuivfPageGetMeta(metapage);
    if (!BufferIsValid(tailbuf))
        meta->calib_free_head = first;
    meta->calib_free_pages += n;
    GenericXLogFinish(state);
}

/*
 * Write calibration queries into pages of the free chain: bufs[i] (n <=
 * MAX_GENERIC_XLOG_PAGES, exclusively locked) gets counts[i] floats from
 * data[i] and the stamp calib_id; links stay as they are, so the pages stay
 * in the free chain until GpuivfLogCalibration makes them the current set.
 */
void
GpuivfLogCalibQueryPages(Relation index, const Buffer *bufs, int n, const float4 *const *data,
                         const uint32 *counts, uint32 calib_id)
{
    GenericXLogState *state = GenericXLogStart(index);

    Assert(n >= 1 && n <= MAX_GENERIC_XLOG_PAGES);
    for (int i = 0; i < n; i++)
    {
        Page        page = GenericXLogRegisterBuffer(state, bufs[i], GENERIC_XLOG_FULL_IMAGE);
        BlockNumber next = GpuivfPageGetOpaque(BufferGetPage(bufs[i]))->nextblkno;

        PutCalibPage(page, next, calib_id, data[i], counts[i]);
    }
    GenericXLogFinish(state);
}

/*
 * Store a calibration, in one GenericXLog record: the calib_* fields of
 * calib (from calib_sample to the end of the struct, including the two
 * chains' heads and counts, which the caller computed) replace the
 * metapage's.  When the new query set ends before the free chain did,
 * lastbuf (its last page) is cut from the rest; when there was a current
 * set, its last page oldtailbuf is linked to free_next, the first page of
 * the new free chain after it (the old set joins the free pages).  Either
 * buffer may be invalid; both are exclusively locked by the caller, the
 * metapage too.  The rows of the index do not change, so neither does
 * generation; pd_lower covers the whole struct.
 */
void
GpuivfLogCalibration(Relation index, Buffer metabuf, const GpuivfMetaPageData *calib,
                     Buffer lastbuf, Buffer oldtailbuf, BlockNumber free_next)
{
    GenericXLogState *state = GenericXLogStart(index);
    Page        page;
    PageHeader  phdr;
    Size        start = offsetof(GpuivfMetaPageData, calib_sample);
    Size        lower = MAXALIGN(SizeOfPageHeaderData) + sizeof(GpuivfMetaPageData);

    if (BufferIsValid(lastbuf))
    {
        Page        last = GenericXLogRegisterBuffer(state, lastbuf, 0);

        GpuivfPageGetOpaque(last)->nextblkno = InvalidBlockNumber;
    }
    if (BufferIsValid(oldtailbuf))
    {
        Page        tail = GenericXLogRegisterBuffer(state, oldtailbuf, 0);

        GpuivfPageGetOpaque(tail)->nextblkno = free_next;
    }
    page = GenericXLogRegisterBuffer(state, metabuf, 0);
    phdr = (PageHeader) page;
    memcpy((char *) GpuivfPageGetMeta(page) + start, (const char *) calib + start,
           sizeof(GpuivfMetaPageData) - start);
    if (phdr->pd_lower < lower)
        phdr->pd_lower = lower;
    GenericXLogFinish(state);
}

/* A calibration-query page's stamp and data (n floats), or NULL when blkno
 * is not such a page; the caller holds a lock on page. */
const float4 *
GpuivfCalibPageData(Page page, uint32 *calib_id, uint32 *n)
{
    const GpuivfCalibPageHeader *hdr;

    if (!GpuivfPageIsType(page, GPUIVF_PAGE_CALIB))
        return NULL;
    hdr = (const GpuivfCalibPageHeader *) PageGetContents(page);
    if (hdr->nfloats > GPUIVF_CALIB_FLOATS_PER_PAGE)
        return NULL;
    *calib_id = hdr->calib_id;
    *n = hdr->nfloats;
    return (const float4 *) ((const char *) hdr + sizeof(GpuivfCalibPageHeader));
}

/* ----------------------------------------------------- reading pages */

/* Raises the index-corruption error for a page that is not the kind
 * expected ("list", "well-formed vector", ...). */
void
GpuivfBadPage(Relation index, BlockNumber blkno, const char *expected)
{
    ereport(ERROR,
            (errcode(ERRCODE_INDEX_CORRUPTED),
             errmsg("index \"%s\" contains an unexpected page at block %u",
                    RelationGetRelationName(index), blkno),
             errdetail("A %s page was expected.", expected),
             errhint("Please REINDEX it.")));
}

/*
 * Decodes the live entries of a list page (locked by the caller) into ids[]
 * (the entries' TIDs as engine ids) and codes[] (code_size bytes each, room
 * for capacity entries): the one reader of list entries for every search
 * (scans, GpuivfSearchBatch, calibration, the GPU worker's copies).  Returns
 * NULL and sets *n, or the kind of page that was expected ("list",
 * "well-formed list") when the page is not one: the caller raises its
 * corruption error (the worker, which has no Relation, raises its own).
 */
const char *
GpuivfDecodeListPage(Page page, int code_size, int capacity, uint64 *ids, uint8 *codes, int *n)
{
    OffsetNumber maxoff;

    *n = 0;
    if (!GpuivfPageIsType(page, GPUIVF_PAGE_LIST))
        return "list";
    maxoff = PageGetMaxOffsetNumber(page);
    if (maxoff > capacity)
        return "well-formed list";
    for (OffsetNumber off = FirstOffsetNumber; off <= maxoff; off = OffsetNumberNext(off))
    {
        ItemId      iid = PageGetItemId(page, off);
        GpuivfListEntry *entry;

        if (!ItemIdIsNormal(iid))
            continue;
        if (ItemIdGetLength(iid) < offsetof(GpuivfListEntry, code) + code_size)
            return "well-formed list";
        entry = (GpuivfListEntry *) PageGetItem(page, iid);
        ids[*n] = GpuivfTidToId(&entry->tid);
        memcpy(codes + (size_t) *n * code_size, entry->code, code_size);
        (*n)++;
    }
    return NULL;
}

/*
 * Copies the live entries of list page blkno (under a share lock) into ids[]
 * and codes[] (room for capacity entries of code_size bytes); returns how
 * many and sets *next to the next page of the chain.  A page that is not a
 * well-formed list page raises the corruption error.
 */
int
GpuivfReadListPage(Relation index, BlockNumber blkno, int code_size, int capacity,
                   uint64 *ids, uint8 *codes, BlockNumber *next)
{
    Buffer      buf;
    Page        page;
    const char *bad;
    int         n;

    buf = ReadBufferExtended(index, MAIN_FORKNUM, blkno, RBM_NORMAL, NULL);
    LockBuffer(buf, BUFFER_LOCK_SHARE);
    page = BufferGetPage(buf);
    bad = GpuivfDecodeListPage(page, code_size, capacity, ids, codes, &n);
    if (bad != NULL)
        GpuivfBadPage(index, blkno, bad);
    *next = GpuivfPageGetOpaque(page)->nextblkno;
    UnlockReleaseBuffer(buf);
    return n;
}

/*
 * The vector tuple at offset off of vector page blkno (locked by the
 * caller), or NULL when off is out of range or its line pointer is not in
 * use (VACUUM freed it); raises the corruption error when it is too short
 * for value_bytes of values.
 */
GpuivfVectorTuple *
GpuivfPageVectorTuple(Relation index, Page page, BlockNumber blkno, OffsetNumber off,
                      Size value_bytes)
{
    ItemId      iid;

    if (off < FirstOffsetNumber || off > PageGetMaxOffsetNumber(page))
        return NULL;
    iid = PageGetItemId(page, off);
    if (!ItemIdIsNormal(iid))
        return NULL;
    if (ItemIdGetLength(iid) < offsetof(GpuivfVectorTuple, x) + value_bytes)
        GpuivfBadPage(index, blkno, "well-formed vector");
    return (GpuivfVectorTuple *) PageGetItem(page, iid);
}

/* A vector tuple's contents (storage.h); vt is zeroed by the caller. */
void
GpuivfFillVectorTuple(GpuivfVectorTuple *vt, ItemPointer heaptid, const float4 *x, int dims,
                      int storage, bool from_table)
{
    vt->heaptid = *heaptid;
    vt->unused = 0;
    if (from_table)
        return;
    if (storage == GPUIVF_STORAGE_FLOAT16)
        gpuivf::float_to_half_n(x, (uint16_t *) vt->x, dims);
    else
        memcpy(vt->x, x, sizeof(float4) * dims);
}
