/*
 * search/rows.cpp — the exact values of an index's rows, wherever they are,
 * and their exact distances to a query.
 *
 * A row's values are in its vector tuple (float4, or IEEE halves for
 * halfvec: widened exactly), or, when the index re-ranks from the table
 * (rerank_from = 'table', or vectors larger than an index page), in the
 * table's column: the heap row the index entry names, its indexed column
 * (or expression) computed by PostgreSQL and detoasted here.
 *
 * Distances are the engine's (src/core/distance.cpp: the same bits on the
 * CPU and on the GPU, for real[] and pgvector's types alike) — except in
 * exact scans of pgvector columns, which order by pgvector's operator
 * itself (called through fmgr), so that an exact scan returns what a
 * sequential scan ordered by that operator returns, bit for bit.
 *
 * Reading the table: table_index_fetch_tuple with SnapshotAny returns the
 * first version of the row's HOT chain; every version of a chain has the
 * same indexed values (HOT never changes an indexed column), so it is the
 * value the index entry was made from.  A row whose every version is gone
 * (line pointer dead) is skipped: it is dead to every snapshot, and VACUUM
 * will remove its index entry.  The caller holds a lock on the index, and
 * so on its table; the table is opened with AccessShareLock anyway.
 */
#include "gpuivf.h"
#include "search/search.h"
#include "storage/storage.h"

#include <algorithm>

#include "access/tableam.h"
#include "catalog/index.h"
#include "executor/executor.h"
#include "utils/lsyscache.h"

/* ------------------------------------------------------ row distances */

/* The ORDER BY operator's function of the index's operator class. */
static FmgrInfo *
OrderByFunction(Relation index)
{
    Oid         type = index->rd_opcintype[0];
    Oid         opno = get_opfamily_member(index->rd_opfamily[0], type, type,
                                           GPUIVF_DISTANCE_STRATEGY);
    FmgrInfo   *finfo;

    if (!OidIsValid(opno))
        elog(ERROR, "operator family of index \"%s\" has no operator %d",
             RelationGetRelationName(index), GPUIVF_DISTANCE_STRATEGY);
    finfo = (FmgrInfo *) palloc0(sizeof(FmgrInfo));
    fmgr_info(get_opcode(opno), finfo);
    return finfo;
}

/* See search.h. */
void
GpuivfRowDistanceInit(GpuivfRowDistance *rd, Relation index, const GpuivfMetaPageData *meta,
                      const float4 *query, bool exact)
{
    memset(rd, 0, sizeof(*rd));
    rd->metric = (gpuivf::Metric) meta->metric;
    rd->dims = (int) meta->dims;
    rd->storage = meta->storage;
    rd->query = query;
    rd->widened = (float4 *) palloc(sizeof(float4) * Max(rd->dims, 1));
    rd->type = GpuivfGetOpclassInfo(index).type;
    /* real[]'s operators are gpuivf's own functions: the engine's bits */
    if (exact && rd->type != GPUIVF_TYPE_REAL_ARRAY)
    {
        rd->op = OrderByFunction(index);
        rd->query_datum = GpuivfVectorDatum(rd->type, query, rd->dims);
    }
}

/* The distance of values x (dims float4; for halfvec, widened halves). */
static double
ValuesDistance(GpuivfRowDistance *rd, const float4 *x)
{
    if (rd->op != NULL)
    {
        Datum       row = GpuivfVectorDatum(rd->type, x, rd->dims);
        Datum       d = FunctionCall2Coll(rd->op, InvalidOid, row, rd->query_datum);

        pfree(DatumGetPointer(row));
        return DatumGetFloat8(d);
    }
    return gpuivf::metric_distance(rd->metric, rd->query, x, rd->dims);
}

/* The float4 values of a vector tuple (halves widened into rd->widened). */
const float4 *
GpuivfTupleValues(GpuivfRowDistance *rd, const GpuivfVectorTuple *vt)
{
    if (rd->storage != GPUIVF_STORAGE_FLOAT16)
        return vt->x;
    gpuivf::half_to_float_n((const uint16_t *) vt->x, rd->widened, rd->dims);
    return rd->widened;
}

/* See search.h. */
double
GpuivfRowDistanceOf(GpuivfRowDistance *rd, const GpuivfRow *row)
{
    if (row->values != NULL)
        return ValuesDistance(rd, row->values);
    return ValuesDistance(rd, GpuivfTupleValues(rd, row->vt));
}

/* -------------------------------------------------------- table rows */

struct GpuivfTableRows
{
    Relation    heap;
    IndexFetchTableData *fetch;
    TupleTableSlot *slot;
    IndexInfo  *info;
    EState     *estate;
    GpuivfVectorType type;
    int         dims;
    MemoryContext rowctx;       /* the current row's detoasted values */
};

/* See search.h. */
GpuivfTableRows *
GpuivfTableRowsBegin(Relation index, int dims)
{
    GpuivfTableRows *tr = (GpuivfTableRows *) palloc0(sizeof(GpuivfTableRows));

    tr->heap = table_open(index->rd_index->indrelid, AccessShareLock);
    tr->fetch = table_index_fetch_begin(tr->heap);
    tr->slot = table_slot_create(tr->heap, NULL);
    tr->info = BuildIndexInfo(index);
    tr->estate = CreateExecutorState();
    GetPerTupleExprContext(tr->estate)->ecxt_scantuple = tr->slot;
    tr->type = GpuivfGetOpclassInfo(index).type;
    tr->dims = dims;
    tr->rowctx = AllocSetContextCreate(CurrentMemoryContext, "gpuivf table row",
                                       ALLOCSET_DEFAULT_SIZES);
    return tr;
}

/* See search.h. */
const float4 *
GpuivfTableRowValues(GpuivfTableRows *tr, uint64 heapid)
{
    ItemPointerData tid;
    bool        call_again = false;
    bool        all_dead = false;
    Datum       value;
    bool        isnull;
    const float4 *x;
    int         dims;
    MemoryContext old;

    MemoryContextReset(tr->rowctx);
    ResetPerTupleExprContext(tr->estate);
    GpuivfIdToTid(heapid, &tid);
    if (!table_index_fetch_tuple(tr->fetch, &tid, SnapshotAny, tr->slot, &call_again, &all_dead))
        return NULL;
    old = MemoryContextSwitchTo(tr->rowctx);
    FormIndexDatum(tr->info, tr->slot, tr->estate, &value, &isnull);
    x = isnull ? NULL : GpuivfVectorValues(tr->type, value, &dims);
    MemoryContextSwitchTo(old);
    ExecClearTuple(tr->slot);
    if (x != NULL)
        GpuivfCheckDims(tr->dims, dims);
    return x;
}

/* See search.h. */
void
GpuivfTableRowsEnd(GpuivfTableRows *tr)
{
    ExecDropSingleTupleTableSlot(tr->slot);
    table_index_fetch_end(tr->fetch);
    FreeExecutorState(tr->estate);
    table_close(tr->heap, AccessShareLock);
    MemoryContextDelete(tr->rowctx);
    pfree(tr);
}

/* --------------------------------------------------- every row of an index */

/* Appends heap ids to a growing array. */
typedef struct IdArray
{
    uint64     *ids;
    int64       n;
    int64       cap;
} IdArray;

static void
IdArrayAdd(IdArray *a, const uint64 *ids, int64 n)
{
    if (a->n + n > a->cap)
    {
        int64       cap = Max(Max(a->cap * 2, a->n + n), (int64) 1024);

        a->ids = a->ids == NULL
            ? (uint64 *) MemoryContextAllocHuge(CurrentMemoryContext, sizeof(uint64) * cap)
            : (uint64 *) repalloc_huge(a->ids, sizeof(uint64) * cap);
        a->cap = cap;
    }
    memcpy(a->ids + a->n, ids, sizeof(uint64) * n);
    a->n += n;
}

/* Calls visit(arg, vt) for every vector tuple (all blocks, one page at a
 * time under its share lock), checked to hold value_bytes of values. */
static void
WalkVectorTuples(Relation index, Size value_bytes, BufferAccessStrategy bas,
                 void (*visit) (void *arg, const GpuivfVectorTuple *vt), void *arg)
{
    BlockNumber nblocks = RelationGetNumberOfBlocks(index);

    for (BlockNumber blkno = GPUIVF_METAPAGE_BLKNO + 1; blkno < nblocks; blkno++)
    {
        Buffer      buf = ReadBufferExtended(index, MAIN_FORKNUM, blkno, RBM_NORMAL, bas);
        Page        page;

        LockBuffer(buf, BUFFER_LOCK_SHARE);
        page = BufferGetPage(buf);
        if (GpuivfPageIsType(page, GPUIVF_PAGE_VECTOR))
        {
            OffsetNumber maxoff = PageGetMaxOffsetNumber(page);

            for (OffsetNumber off = FirstOffsetNumber; off <= maxoff; off = OffsetNumberNext(off))
            {
                GpuivfVectorTuple *vt = GpuivfPageVectorTuple(index, page, blkno, off, value_bytes);

                if (vt != NULL)
                    visit(arg, vt);
            }
        }
        UnlockReleaseBuffer(buf);
        CHECK_FOR_INTERRUPTS();
    }
}

static void
CollectHeapId(void *arg, const GpuivfVectorTuple *vt)
{
    uint64      id = GpuivfTidToId((ItemPointer) &vt->heaptid);

    IdArrayAdd((IdArray *) arg, &id, 1);
}

/*
 * The heap ids of every row of an index that re-ranks from the table,
 * ascending (the table is then read in physical order): the vector tuples'
 * heap TIDs while untrained, else every list entry.
 */
static uint64 *
TableIndexHeapIds(Relation index, const GpuivfMetaPageData *meta, BufferAccessStrategy bas,
                  int64 *n)
{
    IdArray     a = {NULL, 0, 0};

    if (!GpuivfMetaIsTrained(meta))
        WalkVectorTuples(index, 0, bas, CollectHeapId, &a);
    else
    {
        int         capacity = (int) (GPUIVF_PAGE_CAPACITY /
                                      (sizeof(ItemIdData) + GPUIVF_LIST_ENTRY_SIZE(meta->code_size)));
        uint64     *ids = (uint64 *) palloc(sizeof(uint64) * capacity);
        uint8      *codes = (uint8 *) palloc((Size) meta->code_size * capacity + 1);

        for (int list = 0; list < (int) meta->lists; list++)
        {
            BlockNumber blkno = GpuivfReadDirEntry(index, meta, list).head;

            while (BlockNumberIsValid(blkno))
            {
                BlockNumber next;
                int         m = GpuivfReadListPage(index, blkno, meta->code_size, capacity, ids,
                                                   codes, &next);

                IdArrayAdd(&a, ids, m);
                blkno = next;
                CHECK_FOR_INTERRUPTS();
            }
        }
        pfree(ids);
        pfree(codes);
    }
    std::sort(a.ids, a.ids + a.n);
    *n = a.n;
    return a.ids;
}

/* GpuivfForEachRow over vector tuples: the caller's visitor per row */
typedef struct RowWalk
{
    GpuivfRowVisitor visit;
    void       *arg;
} RowWalk;

static void
VisitTuple(void *arg, const GpuivfVectorTuple *vt)
{
    RowWalk    *rw = (RowWalk *) arg;
    GpuivfRow   row;

    row.heapid = GpuivfTidToId((ItemPointer) &vt->heaptid);
    row.vt = vt;
    row.values = NULL;
    rw->visit(rw->arg, &row);
}

/* See search.h. */
void
GpuivfForEachRow(Relation index, const GpuivfMetaPageData *meta, BufferAccessStrategy bas,
                 GpuivfRowVisitor visit, void *arg)
{
    GpuivfRow   row;

    if (GpuivfMetaRerankFromTable(meta))
    {
        MemoryContext ctx = AllocSetContextCreate(CurrentMemoryContext, "gpuivf table rows",
                                                  ALLOCSET_DEFAULT_SIZES);
        MemoryContext old = MemoryContextSwitchTo(ctx);
        int64       n;
        uint64     *ids = TableIndexHeapIds(index, meta, bas, &n);
        GpuivfTableRows *tr = GpuivfTableRowsBegin(index, (int) meta->dims);

        MemoryContextSwitchTo(old);
        row.vt = NULL;
        for (int64 i = 0; i < n; i++)
        {
            row.heapid = ids[i];
            row.values = GpuivfTableRowValues(tr, ids[i]);
            if (row.values != NULL)
                visit(arg, &row);
            if (i % 256 == 0)
                CHECK_FOR_INTERRUPTS();
        }
        GpuivfTableRowsEnd(tr);
        MemoryContextDelete(ctx);
        return;
    }

    {
        RowWalk     rw = {visit, arg};

        WalkVectorTuples(index, GpuivfVectorValueBytes(meta), bas, VisitTuple, &rw);
    }
}

/* See search.h. */
double
GpuivfTableRowDistance(GpuivfRowDistance *rd, GpuivfTableRows *tr, uint64 heapid, bool *found)
{
    const float4 *x = GpuivfTableRowValues(tr, heapid);

    *found = x != NULL;
    return x != NULL ? ValuesDistance(rd, x) : 0.0;
}
