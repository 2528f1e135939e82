/*
 * storage/wal.cpp — the changes to live pages, each a GenericXLog record of
 * one logical step and never more than 4 buffers (MAX_GENERIC_XLOG_PAGES):
 * an insert (vector tuple, list entry, directory count, and the metapage
 * where the index counts its rows there), a list's
 * new tail page, VACUUM's deletions of list entries and vector tuples, and
 * ANALYZE's calibration (its query pages and the record that makes a set of
 * curves current).  Callers lock the buffers (order: storage/page.cpp) and
 * hand them in.
 */
#include "gpuivf.h"
#include "storage/storage.h"

#include "access/xloginsert.h"
#include "storage/bufpage.h"
#include "storage/lmgr.h"
#include "storage/smgr.h"
#include "utils/rel.h"

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
 * at it (listbuf), the list's count in the directory (dirbuf) and, when the
 * index counts its rows there (GpuivfRowsOnMetapage), the metapage:
 * generation, vectors (untrained; a trained index counts its rows in the
 * directory), vector_insert_page, dims of a first row.  Untrained: vecbuf +
 * metabuf only.  rerank = false: no vecbuf, and the entry holds the heap
 * TID.  At most 4 buffers.
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
        off = GpuivfPageAddItemOrError(index, vpage, vt, size);
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
        GpuivfPageAddItemOrError(index, lpage, entry, size);
        pfree(entry);

        dpage = GenericXLogRegisterBuffer(state, plan->dirbuf, 0);
        dir = GpuivfDirEntryOnPage(dpage, plan->list);
        dir->count++;
        if (plan->new_insert_page != InvalidBlockNumber)
            dir->insert_page = plan->new_insert_page;
    }

    if (BufferIsValid(plan->metabuf))
    {
        mpage = GenericXLogRegisterBuffer(state, plan->metabuf, 0);
        meta = GpuivfPageGetMeta(mpage);
        if (!BufferIsValid(plan->listbuf))
            meta->vectors++;
        meta->generation++;
        if (plan->vec_init)
            meta->vector_insert_page = vecblk;
        if (plan->set_dims)
        {
            meta->dims = plan->dims;
            meta->flags = plan->set_flags;
        }
    }

    GenericXLogFinish(state);
}

/*
 * Link a new, empty list page at the end of a list (or make it the list's
 * first page when tailbuf is InvalidBuffer), point the directory's tail and
 * insert_page at it, and bump the generation when metabuf is given (rows on
 * the metapage).  Its own record (at most 4 buffers): the index is
 * consistent after it.
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
    dir = GpuivfDirEntryOnPage(dpage, list);
    if (dir->head == InvalidBlockNumber)
        dir->head = newblk;
    dir->tail = newblk;
    dir->insert_page = newblk;
    if (BufferIsValid(metabuf))
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
        GpuivfPageAddItemOrError(index, page, PageGetItem(old, iid), ItemIdGetLength(iid));
    }
}

/*
 * VACUUM: remove entries (offsets ascending) from one list page, lower the
 * list's count (a trained index's rows are the directory's counts), bump the
 * generation (which tells a GPU copy that entries were removed: README.md,
 * "Never stale"), and move the list's insert_page back to this page when
 * asked.  3 buffers.
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
    dir = GpuivfDirEntryOnPage(dpage, list);
    dir->count = dir->count >= (uint32) noffsets ? dir->count - noffsets : 0;
    if (new_insert_page != InvalidBlockNumber)
        dir->insert_page = new_insert_page;
    GpuivfBumpMeta(state, metabuf, 0);
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
                 offsetof(GpuivfMetaPageData, calib_depth) == 1944 &&
                 offsetof(GpuivfMetaPageData, calib_deep_recall) == 1960 &&
                 sizeof(GpuivfMetaPageData) == 5032,
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
