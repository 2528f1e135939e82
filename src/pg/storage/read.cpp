/*
 * storage/read.cpp — reading index pages outside the model cache: raw
 * arrays (centroids, codebooks, the directory) spread over consecutive
 * pages, one list's directory entry, a trained index's rows and their
 * version (the directory's counts and page LSNs), and list pages, decoded in one place
 * (GpuivfDecodeListPage) for every search: scans, the CPU engine path,
 * calibration and the GPU worker's copies.  A page that is not what the
 * caller expects raises ERRCODE_INDEX_CORRUPTED; the shared readers
 * (GpuivfCopyRawPages, GpuivfDecodeListPage) return what was expected
 * instead, for the worker, which has no Relation, raises its own error.
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

/*
 * The page loop of the raw readers: an array of `bytes` spread over npages
 * consecutive pages of page_type in page-sized chunks, read one share lock
 * at a time through read_page (ReadBuffer for a backend; the GPU worker,
 * which has no Relation, reads by relfilenode); visit(contents, chunk, page)
 * sees each page's part while it is locked.  Returns InvalidBlockNumber, or
 * the first block that is not such a page holding its part (start + npages
 * when the pages end too early): the caller raises its corruption error.
 * No buffer is locked or pinned on return.
 */
template <typename Visit>
static BlockNumber
VisitRawPages(GpuivfReadPageFn read_page, const void *arg, BlockNumber start, uint32 npages,
              uint16 page_type, Size bytes, Visit visit)
{
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
        visit((const char *) PageGetContents(page), chunk, page);
        UnlockReleaseBuffer(buf);
        left -= chunk;
    }
    return left > 0 ? start + npages : InvalidBlockNumber;
}

/* Copies a raw array (centroids, codebooks, directory) out of npages
 * consecutive pages of page_type (VisitRawPages says how and what it
 * returns). */
BlockNumber
GpuivfCopyRawPages(GpuivfReadPageFn read_page, const void *arg, BlockNumber start,
                   uint32 npages, uint16 page_type, void *data, Size bytes)
{
    char       *out = (char *) data;

    return VisitRawPages(read_page, arg, start, npages, page_type, bytes,
                         [&](const char *contents, Size chunk, Page) {
                             memcpy(out, contents, chunk);
                             out += chunk;
                         });
}

static Buffer
ReadRelationPage(const void *arg, BlockNumber blkno)
{
    return ReadBuffer((Relation) arg, blkno);
}

/* The corruption error for what a copy of consecutive pages of page_type
 * returned: bad, end (the pages ended too early) or InvalidBlockNumber. */
static void
CheckCopied(Relation index, BlockNumber bad, BlockNumber end, uint16 page_type)
{
    if (bad == end)
        ereport(ERROR,
                (errcode(ERRCODE_INDEX_CORRUPTED),
                 errmsg("gpuivf index \"%s\" has too few pages of type %d",
                        RelationGetRelationName(index), (int) page_type),
                 errhint("Rebuild the index with REINDEX.")));
    if (bad != InvalidBlockNumber)
        ReportBadPage(index, bad, page_type);
}

/* GpuivfCopyRawPages of index, raising the corruption error. */
void
GpuivfReadRawPages(Relation index, BlockNumber start, uint32 npages, uint16 page_type,
                   void *data, Size bytes)
{
    CheckCopied(index, GpuivfCopyRawPages(ReadRelationPage, index, start, npages, page_type,
                                          data, bytes),
                start + npages, page_type);
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
    entry = *GpuivfDirEntryOnPage(page, list);
    UnlockReleaseBuffer(buf);
    return entry;
}

/*
 * The rows of a trained index as its directory counts them now (the sum of
 * the lists' counts) and the newest LSN of its directory pages, read one
 * share lock at a time through read_page (as GpuivfCopyRawPages).  Every
 * record that changes a list changes its directory page too (README.md,
 * "WAL"), and a page's LSN only grows, so an LSN read after a change has
 * reached its pages is at least that change's.  Returns InvalidBlockNumber,
 * or the first block that is not a directory page with its part of the
 * directory: the caller raises its corruption error.
 */
BlockNumber
GpuivfCopyDirRows(GpuivfReadPageFn read_page, const void *arg, const GpuivfMetaPageData *meta,
                  uint64 *rows, XLogRecPtr *lsn)
{
    *rows = 0;
    *lsn = InvalidXLogRecPtr;
    return VisitRawPages(read_page, arg, meta->directory_start, meta->directory_pages,
                         GPUIVF_PAGE_DIRECTORY, (Size) meta->lists * sizeof(GpuivfListDirEntry),
                         [&](const char *contents, Size chunk, Page page) {
                             const GpuivfListDirEntry *dir = (const GpuivfListDirEntry *) contents;

                             for (Size j = 0; j < chunk / sizeof(GpuivfListDirEntry); j++)
                                 *rows += dir[j].count;
                             *lsn = Max(*lsn, PageGetLSN(page));
                         });
}

/* See storage.h. */
uint64
GpuivfRowsVersion(const GpuivfMetaPageData *meta, bool lsn_reliable, XLogRecPtr dir_lsn)
{
    return GpuivfMetaIsTrained(meta) && lsn_reliable ? (uint64) dir_lsn : meta->generation;
}

/* See storage.h. */
bool
GpuivfRowsOnMetapage(Relation index, const GpuivfMetaPageData *meta)
{
    return !GpuivfMetaIsTrained(meta) || !RelationNeedsWAL(index);
}

/* See storage.h. */
uint64
GpuivfReadRows(Relation index, GpuivfMetaPageData *meta)
{
    uint64      rows;
    XLogRecPtr  lsn;

    if (!GpuivfMetaIsTrained(meta))
        return meta->generation;
    CheckCopied(index, GpuivfCopyDirRows(ReadRelationPage, index, meta, &rows, &lsn),
                meta->directory_start + meta->directory_pages, GPUIVF_PAGE_DIRECTORY);
    meta->vectors = rows;
    return GpuivfRowsVersion(meta, RelationNeedsWAL(index), lsn);
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
