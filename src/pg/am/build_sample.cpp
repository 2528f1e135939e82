/*
 * am/build_sample.cpp — the build's sampling scan.
 *
 * The training sample is the k rows (with a vector) whose vector has the
 * smallest GpuivfSampleHash (utils.cpp; the heap TID breaks ties): a
 * function of the rows' values alone, so a parallel build (several processes
 * scanning parts of the heap in an order nobody controls) trains on the rows
 * a serial build trains on, the same heap and options always give the same
 * model, and so do the same vectors in a table of another column type or
 * layout.  k is the target (50 rows per
 * list, at least 25,600) bounded by half of maintenance_work_mem.
 *
 * Every participant offers its rows to one GpuivfSampleArea: the rows it
 * keeps (prepared: normalized for cosine) and the bookkeeping of their keys,
 * in shared memory when the build is parallel.  A participant gathers the
 * rows that pass the last bound it saw into a local batch and adds the batch
 * under the area's mutex; the rows a batch adds are few after the first
 * (k + k ln(N / k) in all for N rows), so participants rarely wait.
 */
#include "gpuivf.h"
#include "am/build.h"

#define SAMPLE_BATCH_BYTES  ((Size) 256 * 1024)     /* a participant's batch */

struct GpuivfSampleArea
{
    int         dims;
    gpuivf::Metric metric;
    int64       k;
    int64       slots;
    bool        shared;
    /* shared: a sleeping mutex (a batch copies up to SAMPLE_BATCH_BYTES,
     * too long for a spinlock), and the rows every participant saw */
    slock_t     mutex;
    bool        busy;
    ConditionVariable cv;
    int64       rows;
    /* GpuivfBottomK (GpuivfBottomKSize(slots)), then slots x dims floats */
};

static GpuivfBottomK *
AreaKeys(GpuivfSampleArea *area)
{
    return (GpuivfBottomK *) ((char *) area + MAXALIGN(sizeof(GpuivfSampleArea)));
}

static float *
AreaRows(GpuivfSampleArea *area)
{
    return (float *) ((char *) AreaKeys(area) + MAXALIGN(GpuivfBottomKSize(area->slots)));
}

/* Slots for a sample of k: a sixteenth more (each compaction, O(k), frees
 * k / 16 slots; there are about 16 (1 + ln(N / k)) of them for N rows). */
static int64
SlotsFor(int64 k)
{
    return k + Max(k / 16, (int64) 16);
}

static Size
SlotBytes(int dims)
{
    return (Size) dims * sizeof(float) + sizeof(GpuivfSampleKey) + sizeof(int64);
}

int64
GpuivfSampleRowsFitting(int dims, Size bytes)
{
    return Max((int64) 1, (int64) (bytes / SlotBytes(dims)) * 16 / 17 - 16);
}

/* The inverse: the fewest bytes in which k rows of dims fit. */
Size
GpuivfSampleBytesFor(int dims, int64 k)
{
    return (Size) (((k + 16) * 17 + 15) / 16 + 1) * SlotBytes(dims);
}

Size
GpuivfSampleAreaSize(int dims, int64 k)
{
    int64       slots = SlotsFor(k);

    return MAXALIGN(sizeof(GpuivfSampleArea)) + MAXALIGN(GpuivfBottomKSize(slots)) +
        (Size) slots * dims * sizeof(float);
}

GpuivfSampleArea *
GpuivfSampleAreaInit(void *mem, int dims, int64 k, gpuivf::Metric metric, bool shared)
{
    GpuivfSampleArea *area = (GpuivfSampleArea *) mem;

    area->dims = dims;
    area->metric = metric;
    area->k = k;
    area->slots = SlotsFor(k);
    area->shared = shared;
    SpinLockInit(&area->mutex);
    area->busy = false;
    ConditionVariableInit(&area->cv);
    area->rows = 0;
    GpuivfBottomKInit(AreaKeys(area), k, area->slots);
    return area;
}

static void
AreaLock(GpuivfSampleArea *area)
{
    if (!area->shared)
        return;
    for (;;)
    {
        bool        got;

        SpinLockAcquire(&area->mutex);
        got = !area->busy;
        area->busy = true;
        SpinLockRelease(&area->mutex);
        if (got)
            break;
        ConditionVariableSleep(&area->cv, WAIT_EVENT_PARALLEL_CREATE_INDEX_SCAN);
    }
    ConditionVariableCancelSleep();
}

static void
AreaUnlock(GpuivfSampleArea *area)
{
    if (!area->shared)
        return;
    SpinLockAcquire(&area->mutex);
    area->busy = false;
    SpinLockRelease(&area->mutex);
    ConditionVariableBroadcast(&area->cv);
}

/* ------------------------------------------------------ the first vector */

typedef struct PeekState
{
    GpuivfVectorType type;      /* of the indexed column */
    int         dims;
    MemoryContext rowctx;
} PeekState;

static void
PeekCallback(Relation index, ItemPointer tid, Datum *values, bool *isnull, bool tupleIsAlive,
             void *arg)
{
    PeekState  *ps = (PeekState *) arg;
    int         dims;

    if (ps->dims == 0 && GpuivfRowVector(ps->type, values, isnull, ps->rowctx, &dims) != NULL)
        ps->dims = dims;
    MemoryContextReset(ps->rowctx);
}

/*
 * The sample area is sized for the rows' dimensions before the scan starts,
 * so the first vector is looked up first: block ranges of growing length
 * (1, 2, 4, ... blocks) from the start of the heap until one holds a vector,
 * at most twice the blocks up to it.
 */
int
GpuivfPeekDims(Relation heap, Relation index, IndexInfo *indexInfo, double *reltuples)
{
    BlockNumber nblocks = RelationGetNumberOfBlocks(heap);
    BlockNumber start = 0;
    BlockNumber len = 1;
    PeekState   ps;

    ps.type = GpuivfGetOpclassInfo(index).type;
    ps.dims = 0;
    ps.rowctx = AllocSetContextCreate(CurrentMemoryContext, "gpuivf peek row",
                                      ALLOCSET_DEFAULT_SIZES);
    *reltuples = 0;
    while (ps.dims == 0 && start < nblocks)
    {
        len = Min(len, nblocks - start);
        *reltuples += table_index_build_range_scan(heap, index, indexInfo, false, false, false,
                                                   start, len, PeekCallback, (void *) &ps, NULL);
        start += len;
        len *= 2;
    }
    MemoryContextDelete(ps.rowctx);
    return ps.dims;
}

/* ------------------------------------------------------- the sample scan */

typedef struct SampleScanner
{
    GpuivfSampleArea *area;
    GpuivfVectorType type;      /* of the indexed column */
    int64       rows;           /* rows with a vector this participant saw */
    /* the batch: rows that passed `bound`, waiting to be offered */
    int         batch_cap;
    int         batch_n;
    float      *batch_rows;
    uint64     *batch_hash;
    uint64     *batch_id;
    GpuivfBottomK bound;        /* the area's bound as last seen (filter) */
    MemoryContext rowctx;
} SampleScanner;

/* Offer the batch to the area under its mutex; note its new bound. */
static void
FlushSampleBatch(SampleScanner *ss)
{
    GpuivfSampleArea *area = ss->area;
    GpuivfBottomK *keys = AreaKeys(area);
    float      *rows = AreaRows(area);

    if (ss->batch_n == 0)
        return;
    AreaLock(area);
    for (int i = 0; i < ss->batch_n; i++)
    {
        int64       slot = GpuivfBottomKOffer(keys, ss->batch_hash[i], ss->batch_id[i]);

        if (slot >= 0)
            memcpy(rows + (Size) slot * area->dims, ss->batch_rows + (Size) i * area->dims,
                   sizeof(float) * area->dims);
    }
    ss->bound = *keys;
    AreaUnlock(area);
    ss->batch_n = 0;
    CHECK_FOR_INTERRUPTS();
}

static void
SampleCallback(Relation index, ItemPointer tid, Datum *values, bool *isnull, bool tupleIsAlive,
               void *arg)
{
    SampleScanner *ss = (SampleScanner *) arg;
    GpuivfSampleArea *area = ss->area;
    const float4 *x;
    int         dims;
    uint64      id;
    uint64      hash;

    x = GpuivfRowVector(ss->type, values, isnull, ss->rowctx, &dims);
    if (x != NULL)
    {
        GpuivfCheckDims(area->dims, dims);
        ss->rows++;
        id = GpuivfTidToId(tid);
        hash = GpuivfSampleHash(GPUIVF_SAMPLE_SEED, x, dims);
        if (!GpuivfBottomKRejects(&ss->bound, hash, id))
        {
            int         i = ss->batch_n++;

            gpuivf::prepare_vector(area->metric, x, ss->batch_rows + (Size) i * area->dims,
                                   area->dims);
            ss->batch_hash[i] = hash;
            ss->batch_id[i] = id;
            if (ss->batch_n == ss->batch_cap)
                FlushSampleBatch(ss);
        }
    }
    MemoryContextReset(ss->rowctx);
}

double
GpuivfSampleScan(GpuivfSampleArea *area, Relation heap, Relation index, IndexInfo *indexInfo,
                 TableScanDesc scan, bool progress)
{
    SampleScanner ss;
    double      reltuples;

    memset(&ss, 0, sizeof(ss));
    ss.area = area;
    ss.type = GpuivfGetOpclassInfo(index).type;
    ss.batch_cap = (int) Max((Size) 16, SAMPLE_BATCH_BYTES / ((Size) area->dims * sizeof(float)));
    ss.batch_rows = (float *) palloc(sizeof(float) * (Size) ss.batch_cap * area->dims);
    ss.batch_hash = (uint64 *) palloc(sizeof(uint64) * ss.batch_cap);
    ss.batch_id = (uint64 *) palloc(sizeof(uint64) * ss.batch_cap);
    ss.bound.bounded = false;
    ss.rowctx = AllocSetContextCreate(CurrentMemoryContext, "gpuivf build row",
                                      ALLOCSET_DEFAULT_SIZES);
    reltuples = table_index_build_scan(heap, index, indexInfo, true, progress, SampleCallback,
                                       (void *) &ss, scan);
    FlushSampleBatch(&ss);
    AreaLock(area);
    area->rows += ss.rows;
    AreaUnlock(area);
    MemoryContextDelete(ss.rowctx);
    pfree(ss.batch_rows);
    pfree(ss.batch_hash);
    pfree(ss.batch_id);
    return reltuples;
}

int64
GpuivfSampleAreaRows(const GpuivfSampleArea *area)
{
    return area->rows;
}

int64
GpuivfSampleAreaTake(GpuivfSampleArea *area, float **sample)
{
    const GpuivfSampleKey *keys;
    int64       n = GpuivfBottomKFinish(AreaKeys(area), &keys);
    const float *rows = AreaRows(area);
    float      *out;

    out = (float *) palloc_extended(sizeof(float) * (Size) Max(n, (int64) 1) * area->dims,
                                    MCXT_ALLOC_HUGE);
    for (int64 i = 0; i < n; i++)
        memcpy(out + (Size) i * area->dims, rows + (Size) keys[i].slot * area->dims,
               sizeof(float) * area->dims);
    *sample = out;
    return n;
}
