/*
 * am/verify_heap.cpp — gpuivf_verify's heapallindexed: every heap row with
 * a vector visible to the snapshot is indexed exactly once with the same
 * vector (or the right list and code), and every other entry points at a
 * heap line pointer still in use (or was removed by a concurrent VACUUM).
 */
#include "gpuivf.h"
#include "am/am.h"
#include "am/verify.h"
#include "calibration/calibration.h"
#include "storage/storage.h"

#include <cmath>

/* Heap scan callback: every visible row with a vector is indexed, once,
 * with the same vector (or list and code when the index stores none). */
static void
HeapRowCallback(Relation index, ItemPointer tid, Datum *values, bool *isnull,
                bool tupleIsAlive, void *arg)
{
    VerifyState *vs = (VerifyState *) arg;
    VerifyEntry *e;
    float4     *x;
    int         dims;

    if (isnull[0])
        return;
    e = VerifyFindEntry(vs, GpuivfTidToId(tid), false);
    if (e == NULL)
        VerifyCorrupt(vs, "Heap row (%u,%u) has a vector but is not in the index.",
                ItemPointerGetBlockNumber(tid), ItemPointerGetOffsetNumber(tid));
    if (e->seen)
        VerifyCorrupt(vs, "Heap row (%u,%u) was reported twice by the table scan.",
                ItemPointerGetBlockNumber(tid), ItemPointerGetOffsetNumber(tid));
    e->seen = true;
    x = GpuivfDatumGetVector(GpuivfGetOpclassInfo(index).type, values[0], &dims);
    if ((uint32) dims != vs->meta.dims)
        VerifyCorrupt(vs, "Heap row (%u,%u) has %d dimensions but the index has %u.",
                ItemPointerGetBlockNumber(tid), ItemPointerGetOffsetNumber(tid), dims,
                vs->meta.dims);
    if (GpuivfMetaStoresVectors(&vs->meta))
    {
        if (!GpuivfMetaRerankFromTable(&vs->meta) && VerifyVectorHash(x, dims) != e->hash)
            VerifyCorrupt(vs, "The index stores a different vector for heap row (%u,%u).",
                    ItemPointerGetBlockNumber(tid), ItemPointerGetOffsetNumber(tid));
    }
    else
        VerifyQueueCheck(vs, x, e);
    pfree(x);
}

/* Is the index entry still there?  (A concurrent VACUUM may have removed
 * it, and then freed the heap line pointer, after we read the index.) */
static bool
EntryStillPresent(VerifyState *vs, const VerifyEntry *e)
{
    Buffer      buf = ReadBuffer(vs->index, e->page);
    Page        page;
    bool        found = false;
    OffsetNumber maxoff;

    LockBuffer(buf, BUFFER_LOCK_SHARE);
    page = BufferGetPage(buf);
    maxoff = PageGetMaxOffsetNumber(page);
    if (GpuivfMetaStoresVectors(&vs->meta))
    {
        ItemPointerData ref;

        GpuivfIdToTid(e->ref_id, &ref);
        if (GpuivfPageIsType(page, GPUIVF_PAGE_VECTOR) &&
            ItemPointerGetOffsetNumber(&ref) <= maxoff &&
            ItemIdIsNormal(PageGetItemId(page, ItemPointerGetOffsetNumber(&ref))))
        {
            GpuivfVectorTuple *vt = (GpuivfVectorTuple *)
                PageGetItem(page, PageGetItemId(page, ItemPointerGetOffsetNumber(&ref)));

            found = GpuivfTidToId(&vt->heaptid) == e->heap_id;
        }
    }
    else if (GpuivfPageIsType(page, GPUIVF_PAGE_LIST))
    {
        for (OffsetNumber off = FirstOffsetNumber; off <= maxoff && !found; off++)
        {
            GpuivfListEntry *le = (GpuivfListEntry *) PageGetItem(page, PageGetItemId(page, off));

            found = GpuivfTidToId(&le->tid) == e->heap_id;
        }
    }
    UnlockReleaseBuffer(buf);
    return found;
}

/* Does the heap still have a line pointer in use at id? */
static bool
HeapSlotInUse(Relation heap, uint64 id, BlockNumber heap_blocks)
{
    ItemPointerData tid;
    Buffer      buf;
    Page        page;
    bool        used = false;

    GpuivfIdToTid(id, &tid);
    if (ItemPointerGetBlockNumber(&tid) >= heap_blocks)
        return false;
    buf = ReadBuffer(heap, ItemPointerGetBlockNumber(&tid));
    LockBuffer(buf, BUFFER_LOCK_SHARE);
    page = BufferGetPage(buf);
    if (!PageIsNew(page) && ItemPointerGetOffsetNumber(&tid) <= PageGetMaxOffsetNumber(page))
        used = ItemIdIsUsed(PageGetItemId(page, ItemPointerGetOffsetNumber(&tid)));
    UnlockReleaseBuffer(buf);
    return used;
}

/* Forward: table_index_build_scan under the snapshot.  Reverse: entries the
 * scan did not report must point at a heap line pointer still in use. */
void
VerifyHeapAllIndexed(VerifyState *vs, Snapshot snapshot)
{
    IndexInfo  *indexInfo = BuildIndexInfo(vs->index);
    TableScanDesc scan;
    BlockNumber heap_blocks;

    qsort(vs->entries, vs->nentries, sizeof(VerifyEntry), VerifyCompareHeap);
    for (int64 i = 1; i < vs->nentries; i++)
        if (vs->entries[i].heap_id == vs->entries[i - 1].heap_id)
        {
            ItemPointerData t;

            GpuivfIdToTid(vs->entries[i].heap_id, &t);
            VerifyCorrupt(vs, "Heap row (%u,%u) is indexed more than once.",
                    ItemPointerGetBlockNumberNoCheck(&t), ItemPointerGetOffsetNumberNoCheck(&t));
        }
    indexInfo->ii_Concurrent = true;    /* only rows visible to the snapshot */
    scan = table_beginscan_strat(vs->heap, snapshot, 0, NULL, true, false);
    table_index_build_scan(vs->heap, vs->index, indexInfo, true, false, HeapRowCallback,
                           (void *) vs, scan);
    if (vs->trained && !GpuivfMetaStoresVectors(&vs->meta))
        VerifyCheckBatch(vs);

    heap_blocks = RelationGetNumberOfBlocks(vs->heap);
    for (int64 i = 0; i < vs->nentries; i++)
    {
        VerifyEntry *e = &vs->entries[i];

        CHECK_FOR_INTERRUPTS();
        if (e->seen || HeapSlotInUse(vs->heap, e->heap_id, heap_blocks))
            continue;
        if (EntryStillPresent(vs, e))
        {
            ItemPointerData t;

            GpuivfIdToTid(e->heap_id, &t);
            VerifyCorrupt(vs, "The index has an entry for heap row (%u,%u), which does not exist.",
                    ItemPointerGetBlockNumberNoCheck(&t), ItemPointerGetOffsetNumberNoCheck(&t));
        }
    }
}

