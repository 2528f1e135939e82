/*
 * am/vacuum.cpp — ambulkdelete and amvacuumcleanup.
 *
 * bulkdelete works in three passes so that a vector slot is never reused
 * while a list entry still points at it:
 *   1. read every vector page (share lock, one page at a time), ask the
 *      callback about each tuple's heap TID and collect the vector TIDs of
 *      dead rows; record each page's free space in the FSM;
 *   2. walk every list chain and remove the entries pointing at those vector
 *      tuples (rerank = false: the entries whose heap TID is dead), one record
 *      per list page with the directory count and the metapage;
 *   3. free the collected vector tuples (line pointers stay, set unused), one
 *      record per vector page, and record the page's new free space.
 * Untrained index: only passes 1 and 3; the vector tuples are the rows.
 */
#include "gpuivf.h"
#include "am/am.h"
#include "calibration/calibration.h"
#include "storage/storage.h"
#include "worker/worker.h"

#include "commands/vacuum.h"
#include "miscadmin.h"
#include "storage/freespace.h"
#include "storage/indexfsm.h"
#include "utils/memutils.h"
#include "utils/rel.h"

/* Growing array of packed TIDs (ascending when filled in block order). */
typedef struct TidArray
{
    uint64     *ids;
    int64       n;
    int64       cap;
} TidArray;

/* Append one id, doubling the array when full. */
static void
TidArrayPush(TidArray *a, uint64 id)
{
    if (a->n == a->cap)
    {
        a->cap = a->cap == 0 ? 1024 : a->cap * 2;
        a->ids = a->ids == NULL
            ? (uint64 *) palloc_extended(a->cap * sizeof(uint64), MCXT_ALLOC_HUGE)
            : (uint64 *) repalloc_huge(a->ids, a->cap * sizeof(uint64));
    }
    a->ids[a->n++] = id;
}

/* Is id in the ascending array? */
static bool
TidArrayContains(const TidArray *a, uint64 id)
{
    return GpuivfSortedIdsContain(a->ids, a->n, id);
}

/* Pass 1: dead rows' vector TIDs; every vector page's free space to the FSM. */
static void
CollectDeadVectors(IndexVacuumInfo *info, IndexBulkDeleteCallback callback,
                   void *callback_state, const GpuivfMetaPageData *meta, TidArray *dead)
{
    Relation    index = info->index;
    BlockNumber nblocks = RelationGetNumberOfBlocks(index);
    Size        tuple_size = GpuivfVectorTupleSize(meta);

    for (BlockNumber blkno = GPUIVF_METAPAGE_BLKNO + 1; blkno < nblocks; blkno++)
    {
        Buffer      buf;
        Page        page;
        OffsetNumber maxoff;
        Size        freespace = 0;

        vacuum_delay_point();
        buf = ReadBufferExtended(index, MAIN_FORKNUM, blkno, RBM_NORMAL, info->strategy);
        LockBuffer(buf, BUFFER_LOCK_SHARE);
        page = BufferGetPage(buf);
        if (PageIsNew(page))
            freespace = GPUIVF_PAGE_CAPACITY;
        else if (GpuivfPageIsType(page, GPUIVF_PAGE_VECTOR))
        {
            maxoff = PageGetMaxOffsetNumber(page);
            for (OffsetNumber off = FirstOffsetNumber; off <= maxoff; off++)
            {
                ItemId      iid = PageGetItemId(page, off);
                GpuivfVectorTuple *vt;

                if (!ItemIdIsNormal(iid))
                    continue;
                vt = (GpuivfVectorTuple *) PageGetItem(page, iid);
                if (callback(&vt->heaptid, callback_state))
                {
                    ItemPointerData vtid;

                    ItemPointerSet(&vtid, blkno, off);
                    TidArrayPush(dead, GpuivfTidToId(&vtid));
                }
            }
            freespace = GpuivfPageFreeSpace(page);
        }
        UnlockReleaseBuffer(buf);
        if (freespace >= tuple_size)
            RecordPageWithFreeSpace(index, blkno, freespace);
    }
}

/* Pass 2 for one list: remove entries of dead rows, page by page. */
static int64
VacuumList(IndexVacuumInfo *info, const GpuivfMetaPageData *meta, int list,
           const TidArray *dead, IndexBulkDeleteCallback callback, void *callback_state)
{
    Relation    index = info->index;
    GpuivfListDirEntry dir = GpuivfReadDirEntry(index, meta, list);
    BlockNumber blkno = dir.head;
    bool        passed_insert_page = false;
    bool        moved_insert_page = false;
    bool        by_vector = GpuivfMetaStoresVectors(meta);
    OffsetNumber *deletable = (OffsetNumber *) palloc(sizeof(OffsetNumber) * MaxOffsetNumber);
    int64       removed = 0;
    BlockNumber visited = 0;

    while (blkno != InvalidBlockNumber)
    {
        Buffer      buf;
        Page        page;
        OffsetNumber maxoff;
        int         ndeletable = 0;
        BlockNumber next;

        vacuum_delay_point();
        if (++visited > RelationGetNumberOfBlocks(index))
            elog(ERROR, "gpuivf index \"%s\" has a cycle in list %d",
                 RelationGetRelationName(index), list);
        buf = ReadBufferExtended(index, MAIN_FORKNUM, blkno, RBM_NORMAL, info->strategy);
        LockBuffer(buf, BUFFER_LOCK_EXCLUSIVE);
        page = BufferGetPage(buf);
        if (!GpuivfPageIsType(page, GPUIVF_PAGE_LIST))
            elog(ERROR, "gpuivf index \"%s\" has no list page at block %u",
                 RelationGetRelationName(index), blkno);
        maxoff = PageGetMaxOffsetNumber(page);
        for (OffsetNumber off = FirstOffsetNumber; off <= maxoff; off++)
        {
            GpuivfListEntry *e = (GpuivfListEntry *) PageGetItem(page, PageGetItemId(page, off));
            bool        is_dead = by_vector
                ? TidArrayContains(dead, GpuivfTidToId(&e->tid))
                : callback(&e->tid, callback_state);

            if (is_dead)
                deletable[ndeletable++] = off;
        }
        next = GpuivfPageGetOpaque(page)->nextblkno;
        if (ndeletable > 0)
        {
            Buffer      dirbuf = ReadBuffer(index, GpuivfDirPageOf(meta, list));
            Buffer      metabuf = ReadBuffer(index, GPUIVF_METAPAGE_BLKNO);
            BlockNumber new_insert = InvalidBlockNumber;

            /* inserts only move insert_page forward: point it back here
             * when it was not before this page when the walk began */
            if (!passed_insert_page && !moved_insert_page)
            {
                new_insert = blkno;
                moved_insert_page = true;
            }
            LockBuffer(dirbuf, BUFFER_LOCK_EXCLUSIVE);
            LockBuffer(metabuf, BUFFER_LOCK_EXCLUSIVE);
            GpuivfListChangeBegin(index, list, true);
            GpuivfLogDeleteListEntries(index, buf, deletable, ndeletable, dirbuf, meta, list,
                                       new_insert, metabuf);
            UnlockReleaseBuffer(metabuf);
            UnlockReleaseBuffer(dirbuf);
            GpuivfListChangeEnd(index, list, true);
            removed += ndeletable;
        }
        if (blkno == dir.insert_page)
            passed_insert_page = true;
        UnlockReleaseBuffer(buf);
        blkno = next;
    }
    pfree(deletable);
    return removed;
}

/* Pass 3: free the dead vector tuples, one record per page. */
static int64
FreeDeadVectors(IndexVacuumInfo *info, const TidArray *dead, bool count_vectors)
{
    Relation    index = info->index;
    OffsetNumber *offsets = (OffsetNumber *) palloc(sizeof(OffsetNumber) * MaxOffsetNumber);
    int64       i = 0;

    while (i < dead->n)
    {
        BlockNumber blkno = (BlockNumber) (dead->ids[i] >> 16);
        int         noffsets = 0;
        Buffer      buf;
        Buffer      metabuf;
        Page        page;
        OffsetNumber maxoff;
        Size        freespace;

        vacuum_delay_point();
        buf = ReadBufferExtended(index, MAIN_FORKNUM, blkno, RBM_NORMAL, info->strategy);
        LockBuffer(buf, BUFFER_LOCK_EXCLUSIVE);
        page = BufferGetPage(buf);
        maxoff = GpuivfPageIsType(page, GPUIVF_PAGE_VECTOR) ? PageGetMaxOffsetNumber(page) : 0;
        for (; i < dead->n && (BlockNumber) (dead->ids[i] >> 16) == blkno; i++)
        {
            OffsetNumber off = (OffsetNumber) (dead->ids[i] & 0xFFFF);

            /* nobody else frees vector tuples, so they are still there */
            if (off <= maxoff && ItemIdIsNormal(PageGetItemId(page, off)))
                offsets[noffsets++] = off;
        }
        if (noffsets > 0)
        {
            metabuf = ReadBuffer(index, GPUIVF_METAPAGE_BLKNO);
            LockBuffer(metabuf, BUFFER_LOCK_EXCLUSIVE);
            GpuivfLogFreeVectorTuples(index, buf, offsets, noffsets, metabuf, count_vectors);
            UnlockReleaseBuffer(metabuf);
        }
        freespace = GpuivfPageFreeSpace(page);
        UnlockReleaseBuffer(buf);
        RecordPageWithFreeSpace(index, blkno, freespace);
    }
    pfree(offsets);
    return dead->n;
}

/* ambulkdelete: see the file comment. */
IndexBulkDeleteResult *
gpuivfbulkdelete(IndexVacuumInfo *info, IndexBulkDeleteResult *stats,
                 IndexBulkDeleteCallback callback, void *callback_state)
{
    Relation    index = info->index;
    GpuivfMetaPageData meta;
    TidArray    dead = {NULL, 0, 0};
    int64       removed = 0;

    if (stats == NULL)
        stats = (IndexBulkDeleteResult *) palloc0(sizeof(IndexBulkDeleteResult));
    GpuivfReadMeta(index, &meta);

    if (GpuivfMetaStoresVectors(&meta))
        CollectDeadVectors(info, callback, callback_state, &meta, &dead);
    if (GpuivfMetaIsTrained(&meta))
    {
        for (uint32 list = 0; list < meta.lists; list++)
            removed += VacuumList(info, &meta, (int) list, &dead, callback, callback_state);
    }
    if (dead.n > 0)
    {
        int64       freed = FreeDeadVectors(info, &dead, !GpuivfMetaIsTrained(&meta));

        if (!GpuivfMetaIsTrained(&meta))
            removed = freed;
    }
    FreeSpaceMapVacuum(index);

    GpuivfReadMeta(index, &meta);
    (void) GpuivfReadRows(index, &meta);
    stats->tuples_removed += (double) removed;
    stats->num_index_tuples = (double) meta.vectors;
    stats->num_pages = RelationGetNumberOfBlocks(index);
    if (dead.ids)
        pfree(dead.ids);
    return stats;
}

/*
 * amvacuumcleanup: statistics (bulkdelete did the work), and the recall
 * curve (calibration/curve.cpp).  ANALYZE (and autovacuum's
 * auto-analyze) calls it with analyze_only: measure the curve.  VACUUM
 * ANALYZE never does (PostgreSQL skips the analyze_only call when the
 * VACUUM part ran), so a VACUUM re-measures a missing or stale curve
 * itself; only for indexes that store vectors (no heap scan under VACUUM).
 */
IndexBulkDeleteResult *
gpuivfvacuumcleanup(IndexVacuumInfo *info, IndexBulkDeleteResult *stats)
{
    GpuivfMetaPageData meta;

    if (info->analyze_only)
    {
        GpuivfCalibrate(info->index, NULL, NULL, NULL);
        return stats;
    }
    if (stats == NULL)
        stats = (IndexBulkDeleteResult *) palloc0(sizeof(IndexBulkDeleteResult));
    GpuivfReadMeta(info->index, &meta);
    (void) GpuivfReadRows(info->index, &meta);
    if (GpuivfMetaStoresVectors(&meta) && GpuivfCalibrationIsStale(&meta))
        GpuivfCalibrate(info->index, NULL, NULL, NULL);
    stats->num_pages = RelationGetNumberOfBlocks(info->index);
    stats->num_index_tuples = (double) meta.vectors;
    stats->estimated_count = false;
    return stats;
}
