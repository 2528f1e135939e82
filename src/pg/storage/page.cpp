/*
 * storage/page.cpp — the page primitives every other page file builds on:
 * formatting a page, extending a fork, adding an item within the page
 * limits (GpuivfPageFreeSpace), where a list's directory entry lives, the
 * corruption error for a page of the wrong kind, and vector tuples.
 *
 * The storage folder holds every read and change of a gpuivf page, one
 * idea per file: page.cpp (these primitives), read.cpp (reading raw arrays,
 * directory entries and list pages), writer.cpp (the build's page writer,
 * no WAL until a page is final), wal.cpp (GenericXLog records of inserts,
 * VACUUM and calibrations), meta.cpp (the metapage and the model cache).
 * Callers lock buffers in the order vector page -> list page(s) ->
 * directory page -> metapage and hand the locked buffers in; these
 * functions only change page contents and never take a lock themselves
 * (except the relation extension lock when a fork grows).
 */
#include "gpuivf.h"
#include "storage/storage.h"

#include "access/xloginsert.h"
#include "storage/bufpage.h"
#include "storage/lmgr.h"
#include "storage/smgr.h"
#include "utils/rel.h"

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
bool
GpuivfExtensionNeedsLock(Relation index)
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
    bool        need_lock = GpuivfExtensionNeedsLock(index);
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

    if (!GpuivfExtensionNeedsLock(index))
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
OffsetNumber
GpuivfPageAddItemOrError(Relation index, Page page, const void *item, Size size)
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
GpuivfListDirEntry *
GpuivfDirEntryOnPage(Page page, int list)
{
    return ((GpuivfListDirEntry *) PageGetContents(page)) +
        (list % (int) GPUIVF_DIR_ENTRIES_PER_PAGE);
}

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