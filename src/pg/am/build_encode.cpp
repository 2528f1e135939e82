/*
 * am/build_encode.cpp — one participant's encoding scan.
 *
 * The participant scans its part of the heap (all of it in a serial build)
 * and encodes batches of rows: with the CPU engine (ivfpq_encode, GEMM), or
 * on the GPU worker through one DSM segment of its own (two areas: the scan
 * fills one while the worker encodes the other).  Each batch's rows become
 * vector tuples on the participant's own vector pages (rerank) and
 * (list, id, code) entries; id is the vector tuple's TID, or the heap TID
 * without vectors.  The entries stay in memory when they fit in half of the
 * participant's share of maintenance_work_mem (a serial build), else they go
 * to a tuplesort: the participant's part of the shared tuplesort of a
 * parallel build.  The participant also draws its calibration sample
 * (calibration/sample.cpp: by hash, so the leader merges them).
 *
 * Memory: the batches take at most a quarter of the participant's share,
 * the in-memory entries or the tuplesort at most half.
 */
#include "gpuivf.h"
#include "am/build.h"
#include "calibration/calibration.h"
#include "storage/storage.h"
#include "worker/worker.h"

#define GPUIVF_ENCODE_BATCH         4096    /* rows per ivfpq_encode call */
#define GPUIVF_GPU_ENCODE_BATCH     65536   /* rows per GPU worker request */

struct GpuivfEncoder
{
    Relation    heap;
    Relation    index;
    ForkNumber  forknum;
    GpuivfVectorType type;      /* of the indexed column */
    GpuivfEncodeSpec spec;
    gpuivf::IvfPqModel model;

    /* batches */
    int         batch_cap;
    int         batch_n;        /* rows in the area being filled */
    int         cur;            /* the area the scan fills */
    float      *area_raw[2];    /* as given; with the GPU worker, in its DSM segment */
    ItemPointerData *area_tids[2];
    int         pending_n;      /* > 0: area 1 - cur (that many rows) is being
                                 * encoded by the worker */
    float      *batch_prep;     /* prepared, for the CPU engine */
    int32      *labels;         /* the CPU engine's answer */
    uint8      *codes;
    GpuivfVectorTuple *vtuple;  /* one reusable vector tuple */
    GpuivfEncodeJob *encode_job; /* encoding on the GPU worker, or NULL */
    GpuivfCalibSample *calib;   /* NULL: calibration off */
    GpuivfPageWriter vecw;
    BlockNumber last_vector_page;

    /* the entries: in memory, or in a tuplesort */
    bool        mem_entries;
    int64       mem_n;
    int64       mem_cap;
    Size        mem_budget;
    int32      *mem_lists;
    uint64     *mem_ids;
    uint8      *mem_codes;
    bytea      *code_datum;     /* one reusable code for the sort */
    Tuplesortstate *sort;
    TupleDesc   sortdesc;
    TupleTableSlot *putslot;
    int         sort_kb;

    int64       encoded;
    pg_atomic_uint64 *shared_encoded;   /* a parallel build's progress */
    bool        progress;       /* the leader: reports tuples_done */
    double      t_engine;
    bool        engine_on_gpu;
    MemoryContext rowctx;       /* reset after every row */
};

/* ------------------------------------------------------------ entries */

/* A tuplesort of (list, id) with the code as payload. */
Tuplesortstate *
GpuivfBeginEntrySort(int code_size, int work_mem_kb, SortCoordinate coordinate, TupleDesc *desc)
{
    AttrNumber  attnums[2] = {1, 2};
    Oid         sortops[2] = {Int4LessOperator, Int8LessOperator};
    Oid         collations[2] = {InvalidOid, InvalidOid};
    bool        nullsfirst[2] = {false, false};
    TupleDesc   d = CreateTemplateTupleDesc(3);

    (void) code_size;
    TupleDescInitEntry(d, (AttrNumber) 1, "list", INT4OID, -1, 0);
    TupleDescInitEntry(d, (AttrNumber) 2, "id", INT8OID, -1, 0);
    TupleDescInitEntry(d, (AttrNumber) 3, "code", BYTEAOID, -1, 0);
    *desc = d;
    return tuplesort_begin_heap(d, 2, attnums, sortops, collations, nullsfirst,
                                Max(work_mem_kb, 64), coordinate, TUPLESORT_NONE);
}

static void
StartSort(GpuivfEncoder *enc, SortCoordinate coordinate)
{
    enc->sort = GpuivfBeginEntrySort(enc->spec.code_size, enc->sort_kb, coordinate, &enc->sortdesc);
    enc->putslot = MakeSingleTupleTableSlot(enc->sortdesc, &TTSOpsVirtual);
}

static void
SortPut(GpuivfEncoder *enc, int32 list, uint64 id, const uint8 *code)
{
    TupleTableSlot *slot = enc->putslot;

    memcpy(VARDATA(enc->code_datum), code, enc->spec.code_size);
    ExecClearTuple(slot);
    slot->tts_values[0] = Int32GetDatum(list);
    slot->tts_values[1] = Int64GetDatum((int64) id);
    slot->tts_values[2] = PointerGetDatum(enc->code_datum);
    slot->tts_isnull[0] = slot->tts_isnull[1] = slot->tts_isnull[2] = false;
    ExecStoreVirtualTuple(slot);
    tuplesort_puttupleslot(enc->sort, slot);
}

/* Bytes per in-memory entry: list, id, code, and the lists' order. */
static Size
MemEntryBytes(const GpuivfEncoder *enc)
{
    return sizeof(int32) + sizeof(uint64) + (Size) enc->spec.code_size + sizeof(int64);
}

/* Room for n entries in memory (within the budget), else false. */
static bool
MemReserve(GpuivfEncoder *enc, int64 n)
{
    int64       cap;

    if (n <= enc->mem_cap)
        return true;
    cap = Max(n, enc->mem_cap + enc->mem_cap / 4);
    if ((Size) cap * MemEntryBytes(enc) > enc->mem_budget)
        cap = n;
    if ((Size) cap * MemEntryBytes(enc) > enc->mem_budget)
        return false;
    if (enc->mem_lists == NULL)
    {
        enc->mem_lists = (int32 *) palloc_extended(sizeof(int32) * cap, MCXT_ALLOC_HUGE);
        enc->mem_ids = (uint64 *) palloc_extended(sizeof(uint64) * cap, MCXT_ALLOC_HUGE);
        enc->mem_codes = (uint8 *) palloc_extended((Size) enc->spec.code_size * cap, MCXT_ALLOC_HUGE);
    }
    else
    {
        enc->mem_lists = (int32 *) repalloc_huge(enc->mem_lists, sizeof(int32) * cap);
        enc->mem_ids = (uint64 *) repalloc_huge(enc->mem_ids, sizeof(uint64) * cap);
        enc->mem_codes = (uint8 *) repalloc_huge(enc->mem_codes, (Size) enc->spec.code_size * cap);
    }
    enc->mem_cap = cap;
    return true;
}

/* The entries outgrew the budget: move them into a tuplesort. */
static void
SpillToSort(GpuivfEncoder *enc)
{
    StartSort(enc, NULL);
    for (int64 i = 0; i < enc->mem_n; i++)
        SortPut(enc, enc->mem_lists[i], enc->mem_ids[i],
                enc->mem_codes + (Size) i * enc->spec.code_size);
    pfree(enc->mem_lists);
    pfree(enc->mem_ids);
    pfree(enc->mem_codes);
    enc->mem_lists = NULL;
    enc->mem_ids = NULL;
    enc->mem_codes = NULL;
    enc->mem_entries = false;
}

/* ------------------------------------------------------------ batches */

GpuivfEncoder *
GpuivfEncoderBegin(Relation heap, Relation index, ForkNumber forknum, const GpuivfEncodeSpec *spec,
                   const gpuivf::IvfPqModel &model, int64 in_memory_rows, SortCoordinate coordinate)
{
    GpuivfEncoder *enc = (GpuivfEncoder *) palloc0(sizeof(GpuivfEncoder));
    int         dims = spec->dims;
    bool        worker = GpuivfWorkerAvailable();
    Size        per_row = (Size) dims * sizeof(float) * (worker ? 3 : 2) + spec->code_size + 16;
    int64       cap = (int64) (spec->mem_bytes / 4 / per_row);

    enc->heap = heap;
    enc->index = index;
    enc->forknum = forknum;
    enc->type = GpuivfGetOpclassInfo(index).type;
    enc->spec = *spec;
    enc->model = model;
    enc->rowctx = AllocSetContextCreate(CurrentMemoryContext, "gpuivf build row",
                                        ALLOCSET_DEFAULT_SIZES);
    /* the GPU worker wants bigger batches */
    enc->batch_cap = (int) Max((int64) 64, Min(worker ? (int64) GPUIVF_GPU_ENCODE_BATCH
                                               : (int64) GPUIVF_ENCODE_BATCH, cap));
    enc->encode_job = GpuivfWorkerEncodeBegin(model, enc->batch_cap);
    for (int a = 0; a < 2; a++)
    {
        if (enc->encode_job != NULL)
            enc->area_raw[a] = GpuivfWorkerEncodeArea(enc->encode_job, a);
        else if (a == 0)
            enc->area_raw[a] = (float *) palloc((Size) enc->batch_cap * dims * sizeof(float));
        if (enc->encode_job != NULL || a == 0)
            enc->area_tids[a] = (ItemPointerData *) palloc((Size) enc->batch_cap *
                                                           sizeof(ItemPointerData));
    }
    enc->batch_prep = (float *) palloc((Size) enc->batch_cap * dims * sizeof(float));
    enc->labels = (int32 *) palloc((Size) enc->batch_cap * sizeof(int32));
    enc->codes = (uint8 *) palloc((Size) enc->batch_cap * spec->code_size);
    enc->vtuple = (GpuivfVectorTuple *) palloc0(GpuivfVectorTupleSizeFor(dims, spec->storage, false));
    enc->code_datum = (bytea *) palloc0(VARHDRSZ + spec->code_size);
    SET_VARSIZE(enc->code_datum, VARHDRSZ + spec->code_size);
    GpuivfWriterInit(&enc->vecw, index, forknum, GPUIVF_PAGE_VECTOR, false, spec->wal);
    enc->last_vector_page = InvalidBlockNumber;
    enc->calib = spec->calibrate ? GpuivfCalibSampleBegin(dims) : NULL;

    enc->mem_budget = spec->mem_bytes / 2;
    enc->sort_kb = (int) Min((Size) MAX_KILOBYTES, spec->mem_bytes / 2 / 1024);
    enc->mem_entries = coordinate == NULL && in_memory_rows > 0 &&
        MemReserve(enc, Max(in_memory_rows + in_memory_rows / 16, (int64) 64));
    if (!enc->mem_entries)
        StartSort(enc, coordinate);
    return enc;
}

/* Encode n raw rows with the CPU engine into enc->labels / enc->codes
 * (prepared: enc->batch_prep already holds their prepared copies). */
static void
EncodeOnCpu(GpuivfEncoder *enc, const float *raw, int n, bool prepared)
{
    gpuivf::CancelHook cancel = GpuivfCancelHook();
    int         dims = enc->spec.dims;

    if (!prepared)
        for (int i = 0; i < n; i++)
            gpuivf::prepare_vector(enc->spec.metric, raw + (Size) i * dims,
                                   enc->batch_prep + (Size) i * dims, dims);
    GpuivfRaiseStatus(gpuivf::ivfpq_encode(enc->model, enc->batch_prep, n, enc->labels, enc->codes,
                                           &cancel));
}

/* Write an encoded batch's vector tuples and keep or sort its entries. */
static void
ProcessBatch(GpuivfEncoder *enc, const float *raw, const ItemPointerData *tids, int n,
             const int32 *labels, const uint8 *codes)
{
    int         dims = enc->spec.dims;
    int         code_size = enc->spec.code_size;
    Size        vsize = GpuivfVectorTupleSizeFor(dims, enc->spec.storage, false);

    if (enc->mem_entries && !MemReserve(enc, enc->mem_n + n))
        SpillToSort(enc);
    for (int i = 0; i < n; i++)
    {
        ItemPointerData id_tid = tids[i];
        const uint8 *code = codes + (Size) i * code_size;

        if (enc->spec.stores_vectors)
        {
            GpuivfFillVectorTuple(enc->vtuple, &id_tid, raw + (Size) i * dims, dims,
                                  enc->spec.storage, false);
            GpuivfWriterAdd(&enc->vecw, enc->vtuple, vsize, &id_tid);
        }
        if (enc->calib != NULL)
        {
            ItemPointerData heap_tid = tids[i];

            GpuivfCalibSampleAdd(enc->calib, raw + (Size) i * dims, GpuivfTidToId(&id_tid),
                                 GpuivfTidToId(&heap_tid));
        }
        if (enc->mem_entries)
        {
            enc->mem_lists[enc->mem_n] = labels[i];
            enc->mem_ids[enc->mem_n] = GpuivfTidToId(&id_tid);
            memcpy(enc->mem_codes + (Size) enc->mem_n * code_size, code, code_size);
            enc->mem_n++;
        }
        else
            SortPut(enc, labels[i], GpuivfTidToId(&id_tid), code);
    }
    GpuivfWriterPause(&enc->vecw);
    enc->encoded += n;
    if (enc->shared_encoded != NULL)
        pg_atomic_fetch_add_u64(enc->shared_encoded, (uint64) n);
    if (enc->progress)
        pgstat_progress_update_param(PROGRESS_CREATEIDX_TUPLES_DONE,
                                     enc->shared_encoded != NULL
                                     ? (int64) pg_atomic_read_u64(enc->shared_encoded)
                                     : enc->encoded);
}

/* Wait for the batch the GPU worker is encoding and process it (encoded on
 * the CPU instead when the worker failed under gpuivf.device = auto). */
static void
FinishPending(GpuivfEncoder *enc)
{
    int         area = 1 - enc->cur;
    const int32 *labels;
    const uint8 *codes;
    instr_time  t0;
    int         n = enc->pending_n;

    if (n == 0)
        return;
    enc->pending_n = 0;
    INSTR_TIME_SET_CURRENT(t0);
    if (GpuivfWorkerEncodeWait(enc->encode_job, enc->index, &labels, &codes))
        enc->engine_on_gpu = true;
    else
    {
        EncodeOnCpu(enc, enc->area_raw[area], n, false);
        labels = enc->labels;
        codes = enc->codes;
    }
    GpuivfAddSeconds(&enc->t_engine, &t0);
    ProcessBatch(enc, enc->area_raw[area], enc->area_tids[area], n, labels, codes);
}

/*
 * The area being filled is full (or the scan ended).  With the GPU worker:
 * wait for the other area's batch and process it, then hand this one to
 * the worker and let the scan fill the other area meanwhile; the batches
 * are processed in scan order either way.  Without it: encode on the CPU
 * and process.  No lock is held.
 */
static void
FlushBatch(GpuivfEncoder *enc)
{
    int         n = enc->batch_n;
    instr_time  t0;

    if (n == 0)
        return;
    if (enc->encode_job != NULL)
    {
        bool        submitted;

        FinishPending(enc);
        INSTR_TIME_SET_CURRENT(t0);
        submitted = GpuivfWorkerEncodeSubmit(enc->encode_job, enc->index, enc->cur, n);
        GpuivfAddSeconds(&enc->t_engine, &t0);
        if (submitted)
        {
            enc->pending_n = n;
            enc->cur = 1 - enc->cur;
            enc->batch_n = 0;
            return;
        }
    }
    INSTR_TIME_SET_CURRENT(t0);
    EncodeOnCpu(enc, enc->area_raw[enc->cur], n, enc->encode_job == NULL);
    GpuivfAddSeconds(&enc->t_engine, &t0);
    ProcessBatch(enc, enc->area_raw[enc->cur], enc->area_tids[enc->cur], n, enc->labels,
                 enc->codes);
    enc->batch_n = 0;
}

/* table_index_build_scan callback of the encoding scan. */
static void
EncodeCallback(Relation index, ItemPointer tid, Datum *values, bool *isnull,
               bool tupleIsAlive, void *arg)
{
    GpuivfEncoder *enc = (GpuivfEncoder *) arg;
    int         d = enc->spec.dims;
    const float4 *x;
    int         dims;
    int         i;

    x = GpuivfRowVector(enc->type, values, isnull, enc->rowctx, &dims);
    if (x == NULL)
        return;
    GpuivfCheckDims(d, dims);
    i = enc->batch_n++;
    memcpy(enc->area_raw[enc->cur] + (Size) i * d, x, sizeof(float) * d);
    /* the CPU engine's prepared copy (the GPU worker prepares its own) */
    if (enc->encode_job == NULL)
        gpuivf::prepare_vector(enc->spec.metric, x, enc->batch_prep + (Size) i * d, d);
    enc->area_tids[enc->cur][i] = *tid;
    MemoryContextReset(enc->rowctx);
    if (enc->batch_n == enc->batch_cap)
        FlushBatch(enc);
}

double
GpuivfEncoderScan(GpuivfEncoder *enc, IndexInfo *indexInfo, TableScanDesc scan, bool progress,
                  pg_atomic_uint64 *shared_encoded)
{
    double      reltuples;

    enc->shared_encoded = shared_encoded;
    enc->progress = progress;
    reltuples = table_index_build_scan(enc->heap, enc->index, indexInfo, true, progress,
                                       EncodeCallback, (void *) enc, scan);
    FlushBatch(enc);
    FinishPending(enc);
    GpuivfWorkerEncodeEnd(enc->encode_job);
    enc->encode_job = NULL;
    return reltuples;
}

void
GpuivfEncoderFinish(GpuivfEncoder *enc)
{
    enc->last_vector_page = enc->vecw.blkno;
    GpuivfWriterFinish(&enc->vecw);
}

int64
GpuivfEncoderRows(const GpuivfEncoder *enc)
{
    return enc->encoded;
}

double
GpuivfEncoderEngineSeconds(const GpuivfEncoder *enc)
{
    return enc->t_engine;
}

bool
GpuivfEncoderOnGpu(const GpuivfEncoder *enc)
{
    return enc->engine_on_gpu;
}

BlockNumber
GpuivfEncoderLastVectorPage(const GpuivfEncoder *enc)
{
    return enc->last_vector_page;
}

GpuivfCalibSample *
GpuivfEncoderCalibSample(const GpuivfEncoder *enc)
{
    return enc->calib;
}

bool
GpuivfEncoderEntries(GpuivfEncoder *enc, int64 *n, const int32 **lists, const uint64 **ids,
                     const uint8 **codes, Tuplesortstate **sort)
{
    if (enc->mem_entries)
    {
        *n = enc->mem_n;
        *lists = enc->mem_lists;
        *ids = enc->mem_ids;
        *codes = enc->mem_codes;
        *sort = NULL;
        return true;
    }
    tuplesort_performsort(enc->sort);
    *n = 0;
    *sort = enc->sort;
    return false;
}

/* The participant is done: its tuplesort ended (a parallel build's worker
 * ends its part once performed: the leader merges the tapes). */
void
GpuivfEncoderEnd(GpuivfEncoder *enc)
{
    if (enc->sort != NULL)
        tuplesort_end(enc->sort);
    enc->sort = NULL;
    if (enc->putslot != NULL)
        ExecDropSingleTupleTableSlot(enc->putslot);
    enc->putslot = NULL;
    MemoryContextDelete(enc->rowctx);
}
