/*
 * am/insert.cpp — aminsert.
 *
 * One row: check and prepare the vector, find its list and PQ code with the
 * cached model (no buffer lock held), then lock, in this order,
 *   the vector page (the backend's own, else the metapage's
 *   vector_insert_page, else one from the FSM, else a new page),
 *   the list page with room (from the directory's insert_page along the
 *   chain; a full tail gets a new page linked behind it in its own record),
 *   the list's directory page, and the metapage only when the index counts
 *   its rows there (GpuivfRowsOnMetapage: untrained, or not WAL-logged),
 * and write everything in one GenericXLog record (GpuivfLogInsert).  A
 * trained, WAL-logged index counts its rows in the directory and its
 * version is the directory pages' LSN (storage/storage.h), so inserts into
 * different lists share no page but a directory page.  Untrained index: only
 * the vector page and the metapage; the first row of an index that never
 * saw one fixes its dims.
 */
#include "gpuivf.h"
#include "am/am.h"
#include "storage/storage.h"
#include "worker/worker.h"

#include "miscadmin.h"
#include "storage/freespace.h"
#include "utils/memutils.h"
#include "utils/rel.h"

/* Give up on FSM candidates after this many stale answers, and extend. */
#define GPUIVF_FSM_TRIES 8

/* Lock buf exclusively; true when it is a vector page (or an all-zero page,
 * *is_new) with size bytes free. */
static bool
VectorPageHasRoom(Buffer buf, Size size, bool *is_new)
{
    Page        page = BufferGetPage(buf);

    *is_new = PageIsNew(page);
    if (*is_new)
        return true;
    return GpuivfPageIsType(page, GPUIVF_PAGE_VECTOR) && GpuivfPageHasRoom(page, size);
}

/* Lock blkno exclusively when it is a vector page with room (or an
 * all-zero page); else InvalidBuffer (the FSM corrected when it said so). */
static Buffer
TryVectorPage(Relation index, BlockNumber blkno, Size size, bool *is_new, bool from_fsm)
{
    Buffer      buf;
    Size        actual = 0;

    if (blkno >= RelationGetNumberOfBlocks(index) || blkno == GPUIVF_METAPAGE_BLKNO)
    {
        if (from_fsm)
            RecordPageWithFreeSpace(index, blkno, 0);
        return InvalidBuffer;
    }
    buf = ReadBuffer(index, blkno);
    LockBuffer(buf, BUFFER_LOCK_EXCLUSIVE);
    if (VectorPageHasRoom(buf, size, is_new))
        return buf;
    if (GpuivfPageIsType(BufferGetPage(buf), GPUIVF_PAGE_VECTOR))
        actual = GpuivfPageFreeSpace(BufferGetPage(buf));
    UnlockReleaseBuffer(buf);
    /* the FSM was stale: correct it */
    if (from_fsm)
        RecordPageWithFreeSpace(index, blkno, actual);
    return InvalidBuffer;
}

/*
 * A locked vector page with room for one tuple of size bytes; *is_new when
 * it is all-zero.  Each backend fills a page of its own (the relation's
 * target block, as heap inserts do): concurrent inserts then lock different
 * vector pages, where they all queued for the metapage's
 * vector_insert_page, holding it through the whole insert.  A backend
 * without a target takes the metapage's hint, then a page from the FSM,
 * then a new page.
 */
static Buffer
GetVectorBuffer(Relation index, const GpuivfMetaPageData *meta, Size size, bool *is_new)
{
    BlockNumber target = RelationGetTargetBlock(index);
    Buffer      buf;

    if (target != InvalidBlockNumber &&
        BufferIsValid(buf = TryVectorPage(index, target, size, is_new, false)))
        return buf;
    if (target == InvalidBlockNumber && meta->vector_insert_page != InvalidBlockNumber &&
        BufferIsValid(buf = TryVectorPage(index, meta->vector_insert_page, size, is_new, false)))
    {
        RelationSetTargetBlock(index, meta->vector_insert_page);
        return buf;
    }
    for (int tries = 0; tries < GPUIVF_FSM_TRIES; tries++)
    {
        BlockNumber blkno = GetPageWithFreeSpace(index, size);

        if (blkno == InvalidBlockNumber)
            break;
        if (BufferIsValid(buf = TryVectorPage(index, blkno, size, is_new, true)))
        {
            RelationSetTargetBlock(index, blkno);
            return buf;
        }
    }
    *is_new = true;
    buf = GpuivfNewVectorBuffer(index);
    RelationSetTargetBlock(index, BufferGetBlockNumber(buf));
    return buf;
}

/* Lock the metapage exclusively (always the last lock taken). */
static Buffer
LockMetaPage(Relation index)
{
    Buffer      buf = ReadBuffer(index, GPUIVF_METAPAGE_BLKNO);

    LockBuffer(buf, BUFFER_LOCK_EXCLUSIVE);
    return buf;
}

/* Lock the directory page that holds list's entry. */
static Buffer
LockDirPage(Relation index, const GpuivfMetaPageData *meta, int list)
{
    Buffer      buf = ReadBuffer(index, GpuivfDirPageOf(meta, list));

    LockBuffer(buf, BUFFER_LOCK_EXCLUSIVE);
    if (!GpuivfPageIsType(BufferGetPage(buf), GPUIVF_PAGE_DIRECTORY))
        elog(ERROR, "gpuivf index \"%s\" has no directory page at block %u",
             RelationGetRelationName(index), BufferGetBlockNumber(buf));
    return buf;
}

/*
 * Append newbuf (new, locked) to list after tail (its locked full tail, or
 * InvalidBuffer for an empty list), dirbuf the list's locked directory
 * page: one record, with the metapage locked last when the index counts its
 * rows there (on_meta); releases all but newbuf.
 */
static Buffer
AppendListPage(Relation index, int list, Buffer tail, Buffer newbuf, Buffer dirbuf,
               bool on_meta)
{
    Buffer      metabuf = on_meta ? LockMetaPage(index) : InvalidBuffer;

    GpuivfListChangeBegin(index, list, false);
    GpuivfLogAppendListPage(index, tail, newbuf, dirbuf, list, metabuf);
    if (BufferIsValid(metabuf))
        UnlockReleaseBuffer(metabuf);
    UnlockReleaseBuffer(dirbuf);
    if (BufferIsValid(tail))
        UnlockReleaseBuffer(tail);
    GpuivfListChangeEnd(index, list, false);
    return newbuf;
}

/*
 * A locked list page of list with room for one entry.  Walks the chain from
 * the directory's insert_page; at a full tail appends a new page (record of
 * its own).  *start_blk is where the walk began, so the insert record moves
 * insert_page only when the walk moved past full pages.
 */
static Buffer
GetListBuffer(Relation index, const GpuivfMetaPageData *meta, int list, Size size,
              BlockNumber *start_blk)
{
    GpuivfListDirEntry dir = GpuivfReadDirEntry(index, meta, list);
    BlockNumber blkno = dir.insert_page != InvalidBlockNumber ? dir.insert_page : dir.head;

    *start_blk = blkno;
    if (blkno == InvalidBlockNumber)
    {
        /* an empty list: create its first page unless someone just did */
        Buffer      dirbuf = LockDirPage(index, meta, list);
        GpuivfListDirEntry *cur = ((GpuivfListDirEntry *) PageGetContents(BufferGetPage(dirbuf))) +
            (list % (int) GPUIVF_DIR_ENTRIES_PER_PAGE);

        if (cur->head == InvalidBlockNumber)
        {
            /* the new page is invisible to others, so locking it after the
             * directory page cannot deadlock */
            Buffer      newbuf = GpuivfNewBuffer(index, MAIN_FORKNUM);

            *start_blk = BufferGetBlockNumber(newbuf);
            return AppendListPage(index, list, InvalidBuffer, newbuf, dirbuf,
                                  GpuivfRowsOnMetapage(index, meta));
        }
        blkno = cur->insert_page != InvalidBlockNumber ? cur->insert_page : cur->head;
        *start_blk = blkno;
        UnlockReleaseBuffer(dirbuf);
    }

    for (;;)
    {
        Buffer      buf = ReadBuffer(index, blkno);
        Page        page;
        BlockNumber next;

        LockBuffer(buf, BUFFER_LOCK_EXCLUSIVE);
        page = BufferGetPage(buf);
        if (!GpuivfPageIsType(page, GPUIVF_PAGE_LIST))
            elog(ERROR, "gpuivf index \"%s\" has no list page at block %u",
                 RelationGetRelationName(index), blkno);
        if (GpuivfPageHasRoom(page, size))
            return buf;
        next = GpuivfPageGetOpaque(page)->nextblkno;
        if (next == InvalidBlockNumber)
        {
            /* full tail: we hold it, so nobody else can append meanwhile */
            Buffer      newbuf = GpuivfNewBuffer(index, MAIN_FORKNUM);
            Buffer      dirbuf = LockDirPage(index, meta, list);

            return AppendListPage(index, list, buf, newbuf, dirbuf,
                                  GpuivfRowsOnMetapage(index, meta));
        }
        UnlockReleaseBuffer(buf);
        blkno = next;
        CHECK_FOR_INTERRUPTS();
    }
}

/* Place one prepared row: pages, locks, one WAL record. */
static void
InsertRow(Relation index, const GpuivfMetaPageData *meta, const float4 *x, int dims,
          ItemPointer heap_tid, int list, const uint8 *code)
{
    GpuivfInsertPlan plan;
    bool        trained = GpuivfMetaIsTrained(meta);

    memset(&plan, 0, sizeof(plan));
    plan.vecbuf = plan.listbuf = plan.dirbuf = InvalidBuffer;
    plan.vector = x;
    plan.dims = (uint32) dims;
    plan.storage = meta->storage;
    plan.from_table = GpuivfMetaRerankFromTable(meta);
    plan.heaptid = *heap_tid;
    plan.list = list;
    plan.code = code;
    plan.code_size = meta->code_size;
    plan.new_insert_page = InvalidBlockNumber;

    if (GpuivfMetaStoresVectors(meta))
        plan.vecbuf = GetVectorBuffer(index, meta,
                                      GpuivfVectorTupleSizeFor(dims, plan.storage, plan.from_table),
                                      &plan.vec_init);
    if (trained)
    {
        BlockNumber start_blk;

        plan.listbuf = GetListBuffer(index, meta, list, GPUIVF_LIST_ENTRY_SIZE(meta->code_size),
                                     &start_blk);
        if (BufferGetBlockNumber(plan.listbuf) != start_blk)
            plan.new_insert_page = BufferGetBlockNumber(plan.listbuf);
        plan.dirbuf = LockDirPage(index, meta, list);
    }
    plan.metabuf = InvalidBuffer;
    if (GpuivfRowsOnMetapage(index, meta))
    {
        const GpuivfMetaPageData *cur;

        plan.metabuf = LockMetaPage(index);
        /* a concurrent first row may have fixed dims since we looked */
        cur = GpuivfPageGetMeta(BufferGetPage(plan.metabuf));
        if (cur->train_id != meta->train_id)
            elog(ERROR, "gpuivf index \"%s\" was rebuilt during an insert",
                 RelationGetRelationName(index));
        /* (a trained index's dims are its model's: checked before encoding;
         * the check's error path reads the directory, locked here) */
        plan.set_dims = !trained && GpuivfIndexTakesDims(index, cur, dims);
        /* meta's flags are those for these dims (gpuivfinsert), whoever fixes them */
        plan.set_flags = meta->flags;
    }

    /* a GPU copy's catch-up walks the lists whose counters moved */
    if (trained)
        GpuivfListChangeBegin(index, list, false);
    GpuivfLogInsert(index, &plan);

    if (BufferIsValid(plan.metabuf))
        UnlockReleaseBuffer(plan.metabuf);
    if (BufferIsValid(plan.dirbuf))
        UnlockReleaseBuffer(plan.dirbuf);
    if (BufferIsValid(plan.listbuf))
        UnlockReleaseBuffer(plan.listbuf);
    if (trained)
        GpuivfListChangeEnd(index, list, false);
    if (BufferIsValid(plan.vecbuf))
    {
        BlockNumber vecblk = BufferGetBlockNumber(plan.vecbuf);
        Size        freespace = GpuivfPageFreeSpace(BufferGetPage(plan.vecbuf));

        UnlockReleaseBuffer(plan.vecbuf);
        /* keep the FSM honest about the page this insert filled (it is the
         * backend's own until full, but others may find it there later) */
        if (vecblk != meta->vector_insert_page && !plan.vec_init)
            RecordPageWithFreeSpace(index, vecblk, freespace);
    }
}

/* aminsert: rows whose vector is NULL are not indexed. */
bool
gpuivfinsert(Relation index, Datum *values, bool *isnull, ItemPointer heap_tid,
             Relation heap, IndexUniqueCheck checkUnique, bool indexUnchanged,
             IndexInfo *indexInfo)
{
    MemoryContext ctx;
    MemoryContext old;
    GpuivfIndexState *st;
    GpuivfMetaPageData meta;
    float4     *x;
    int         dims;
    int32       list = 0;
    uint8      *code = NULL;

    if (isnull[0])
        return false;

    ctx = AllocSetContextCreate(CurrentMemoryContext, "gpuivf insert", ALLOCSET_SMALL_SIZES);
    old = MemoryContextSwitchTo(ctx);

    x = GpuivfDatumGetVector(GpuivfGetOpclassInfo(index).type, values[0], &dims);
    GpuivfCheckMaxDims(dims);
    st = GpuivfGetIndexState(index);
    meta = st->meta;
    if (GpuivfIndexTakesDims(index, &meta, dims))
    {
        /* a row that fixes the index's dims (its first, or the first after
         * it was emptied untrained): its dims decide where the vectors are
         * kept (the same for a concurrent row of these dims) */
        GpuivfOptions *opts = GpuivfGetOptions(index);

        (void) GpuivfResolvePqM(index, opts->pq_m, dims);
        meta.flags = (uint16) ((meta.flags & GPUIVF_META_TRAINED) |
                               GpuivfStorageFlags(index, opts, dims, GpuivfMetaIsTrained(&meta)));
    }

    if (GpuivfMetaIsTrained(&meta))
    {
        float      *prepared = (float *) palloc(sizeof(float) * dims);
        gpuivf::Status status;

        gpuivf::init_blas_single_threaded();
        gpuivf::prepare_vector(st->model.metric, x, prepared, dims);
        code = (uint8 *) palloc0(meta.code_size);
        status = gpuivf::ivfpq_encode(st->model, prepared, 1, &list, code, NULL);
        if (!gpuivf::ok(status))
            GpuivfRaiseStatus(status);
    }
    InsertRow(index, &meta, x, dims, heap_tid, list, code);

    MemoryContextSwitchTo(old);
    MemoryContextDelete(ctx);
    return false;
}
