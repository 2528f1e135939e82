/*
 * storage/writer.cpp — the build's page writing (ambuild, ambuildempty,
 * parallel build participants): raw arrays, the metapage, and the page
 * writer that appends list and vector items to fresh pages of a fork nobody
 * else can see yet.  Pages are written without WAL through shared buffers
 * and logged as full-page images (log_newpage_range) once they are final,
 * when the relation needs WAL and always for an init fork (storage.h,
 * GpuivfPageWriter).
 */
#include "gpuivf.h"
#include "storage/storage.h"

#include "access/xloginsert.h"
#include "storage/bufpage.h"
#include "storage/lmgr.h"
#include "storage/smgr.h"
#include "utils/rel.h"

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
        bool        need_lock = GpuivfExtensionNeedsLock(w->index);
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
    off = GpuivfPageAddItemOrError(w->index, BufferGetPage(w->buf), item, size);
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
