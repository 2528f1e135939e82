/*
 * am/build.cpp — ambuild and ambuildempty (build.h maps the build's files).
 *
 * CREATE INDEX / REINDEX:
 *   1. metapage placeholder at block 0; the dims of the first vector;
 *   2. sampling scan (build_sample.cpp): the training sample, the k rows of
 *      smallest hash of their vector, and the number of rows;
 *   3. no rows: write an untrained metapage (NOTICE with HINT) and stop;
 *   4. k-means on the sample (coarse centroids), residuals against the
 *      nearest centroid, PQ codebooks on the residuals (GPU worker or CPU);
 *      raw pages for both;
 *   5. encoding scan (build_encode.cpp): each row's list and code, its
 *      vector tuple (rerank), a (list, id, code) entry;
 *   6. the entries in (list, id) order (a counting sort in memory, or the
 *      tuplesort) become one chain of consecutive pages per list, then the
 *      directory, then the final metapage;
 *   7. the calibration measures the recall curve.
 * Steps 2 and 5 (and step 4 and the exact top-k of step 7 when they run on
 * the CPU) are run by parallel workers and the leader together when
 * plan_create_index_workers allows (build_parallel.cpp), else by the
 * leader alone; either way the sample, the model and every row's list and
 * code are the same (fixed seeds; the sample is chosen by hash), and only
 * where a vector tuple lands (so the entry ids and their order within a
 * list) depends on which process wrote it.
 * Pages are written through shared buffers without WAL (storage/writer.cpp's
 * build writers) and, when the index needs WAL, logged as full-page images
 * once each is final: by the process that wrote it, while the build goes
 * on.  The engine runs with no buffer lock held; it polls GpuivfShouldCancel
 * and returns kCanceled, after which we let CHECK_FOR_INTERRUPTS raise.
 */
#include "gpuivf.h"
#include "am/am.h"
#include "am/build.h"
#include "calibration/calibration.h"
#include "storage/storage.h"
#include "worker/worker.h"

#include <cmath>

#define GPUIVF_MIN_SAMPLE           25600   /* rows, whatever the lists */
#define GPUIVF_SAMPLE_PER_LIST      50

typedef struct GpuivfBuildState
{
    Relation    heap;
    Relation    index;
    IndexInfo  *indexInfo;
    ForkNumber  forknum;
    gpuivf::Metric metric;
    GpuivfOptions *opts;
    int         dims;           /* of the first vector; 0: the heap has none */
    bool        wal;            /* the index needs WAL */
    int         workers;        /* parallel workers to ask for */

    /* sampling scan */
    double      reltuples;
    int64       rows;           /* non-NULL vectors seen */
    int64       sample_target;
    int64       sample_cap;     /* the target, bounded by maintenance_work_mem */
    int64       sample_n;
    float      *sample;         /* sample_n * dims, prepared space */

    /* model */
    int         lists;
    int         pq_m;
    int         pq_bits;
    int         code_size;
    float      *centroids;
    float      *centroid_norms;
    float      *codebook;
    gpuivf::IvfPqModel model;

    /* encoding scan */
    int         participants;   /* processes that scanned (1: serial) */
    int64       encoded;
    BlockNumber last_vector_page;
    GpuivfCalibSample *calib;   /* calibration's queries, drawn from the
                                 * encoded rows (NULL: calibration off) */
    GpuivfEncoder *enc;         /* serial: the leader's encoder (its entries) */
    Tuplesortstate *merged;     /* parallel: every participant's entries */
    GpuivfParallelBuild *pb;    /* parallel: ended after the lists are written */
    bool        entries_in_memory;

    /* seconds per phase, for the DEBUG1 summary (GpuivfAddSeconds from
     * phase_start, which each phase's end moves on) */
    instr_time  phase_start;
    double      t_sample, t_train, t_encode, t_engine, t_lists, t_load_wait, t_calibrate;
    double      t_kmeans, t_pq;     /* parts of t_train on the CPU */
    int         train_participants; /* processes that trained on the CPU (0: the GPU worker did) */
    bool        engine_on_gpu;
} GpuivfBuildState;

/* pg_stat_progress_create_index.subphase names. */
char *
gpuivfbuildphasename(int64 phasenum)
{
    switch (phasenum)
    {
        case PROGRESS_CREATEIDX_SUBPHASE_INITIALIZE:
            return (char *) "initializing";
        case GPUIVF_PHASE_SAMPLE:
            return (char *) "sampling table";
        case GPUIVF_PHASE_KMEANS:
            return (char *) "training coarse quantizer";
        case GPUIVF_PHASE_PQ:
            return (char *) "training product quantizer";
        case GPUIVF_PHASE_ENCODE:
            return (char *) "encoding vectors";
        case GPUIVF_PHASE_WRITE:
            return (char *) "writing lists";
        default:
            return NULL;
    }
}

/* pq_m for dims: the option when it divides dims, automatic when 0. */
int
GpuivfResolvePqM(Relation index, int pq_m_option, int dims)
{
    if (pq_m_option == 0)
        return gpuivf::pq_auto_m(dims);
    if (pq_m_option > dims || dims % pq_m_option != 0 || pq_m_option > gpuivf::kMaxPqM)
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                 errmsg("pq_m must divide the number of dimensions"),
                 errdetail("Index \"%s\" has pq_m = %d and its vectors have %d dimensions.",
                           RelationGetRelationName(index), pq_m_option, dims),
                 errhint("Choose a divisor of %d for pq_m, or set pq_m = 0 to choose one automatically.",
                         dims)));
    return pq_m_option;
}

/*
 * A metapage with nothing trained: dims from the column's typmod
 * (vector(n)), else 0 until a first row fixes them; the flags and storage
 * for those dims (GpuivfStorageFlags).
 */
static void
FillUntrainedMeta(Relation index, GpuivfOptions *opts, GpuivfMetaPageData *meta)
{
    GpuivfOpclassInfo info = GpuivfGetOpclassInfo(index);

    memset(meta, 0, sizeof(*meta));
    meta->magic = GPUIVF_MAGIC;
    meta->version = GPUIVF_FORMAT_VERSION;
    meta->metric = (uint16) info.metric;
    meta->storage = GpuivfStorageOf(info.type);
    meta->dims = (uint32) GpuivfTypmodDims(index);
    meta->flags = GpuivfStorageFlags(index, opts, (int) meta->dims, false);
    meta->pq_bits = (uint16) opts->pq_bits;
    meta->generation = 1;
    meta->centroid_start = InvalidBlockNumber;
    meta->codebook_start = InvalidBlockNumber;
    meta->directory_start = InvalidBlockNumber;
    meta->vector_insert_page = InvalidBlockNumber;
}

/* A fresh, non-zero identifier of one trained model (caches key on it). */
static uint64
NewTrainId(void)
{
    uint64      id = 0;

    if (!pg_strong_random(&id, sizeof(id)))
        id = (uint64) GetCurrentTimestamp() ^ ((uint64) MyProcPid << 32);
    return id != 0 ? id : 1;
}

/* ------------------------------------------------------------ sampling */

/* Rows the planner would guess for the heap, to size the sample. */
static double
EstimateHeapRows(Relation heap)
{
    BlockNumber pages;
    double      tuples;
    double      allvisfrac;

    estimate_rel_size(heap, NULL, &pages, &tuples, &allvisfrac);
    return tuples;
}

/*
 * The sampling scan: the dims of the first vector size the sample, then the
 * heap is scanned (in parallel when allowed) and every row with a vector
 * offered to the sample.  Its size: the target (50 rows per list of the
 * planner's row estimate, at least 25,600) bounded by half of
 * maintenance_work_mem (ResolveModelShape says so when that bound bites).
 */
static void
SampleHeap(GpuivfBuildState *bs)
{
    int         lists_guess;
    void       *mem;
    GpuivfSampleArea *area;
    double      peeked;

    bs->dims = GpuivfPeekDims(bs->heap, bs->index, bs->indexInfo, &peeked);
    if (bs->dims == 0)
    {
        bs->reltuples = peeked;     /* the whole heap: no vector in it */
        return;
    }
    GpuivfCheckMaxDims(bs->dims);
    lists_guess = bs->opts->lists > 0 ? bs->opts->lists
        : gpuivf::auto_lists((int64) Max(EstimateHeapRows(bs->heap), 0.0));
    bs->sample_target = Max((int64) GPUIVF_MIN_SAMPLE,
                            (int64) GPUIVF_SAMPLE_PER_LIST * lists_guess);
    bs->sample_cap = Min(bs->sample_target,
                         GpuivfSampleRowsFitting(bs->dims, (Size) maintenance_work_mem * 1024 / 2));

    if (bs->workers > 0 &&
        GpuivfParallelSample(bs->heap, bs->index, bs->indexInfo, bs->workers, bs->dims,
                             bs->sample_cap, bs->metric, &bs->reltuples, &bs->rows, &bs->sample,
                             &bs->sample_n))
        return;
    mem = palloc_extended(GpuivfSampleAreaSize(bs->dims, bs->sample_cap), MCXT_ALLOC_HUGE);
    area = GpuivfSampleAreaInit(mem, bs->dims, bs->sample_cap, bs->metric, false);
    bs->reltuples = GpuivfSampleScan(area, bs->heap, bs->index, bs->indexInfo, NULL, true);
    bs->rows = GpuivfSampleAreaRows(area);
    bs->sample_n = GpuivfSampleAreaTake(area, &bs->sample);
    pfree(mem);
}

/* ------------------------------------------------------------ training */

/* GpuivfParallelTrainBegin's init: the area with the build's sample. */
static GpuivfTrainArea *
InitTrainArea(void *mem, void *arg)
{
    GpuivfBuildState *bs = (GpuivfBuildState *) arg;

    return GpuivfTrainAreaInit(mem, bs->sample, bs->sample_n, bs->dims, bs->lists, bs->pq_m,
                               bs->pq_bits);
}

/*
 * Training on the CPU (build_train.cpp): shared with parallel workers in a
 * context of their own when the build has them, else by the leader alone,
 * in an area of its memory.  The area holds a copy of the sample: the
 * sample is freed once it is copied.
 */
static void
TrainOnCpu(GpuivfBuildState *bs)
{
    Size        bytes = GpuivfTrainAreaSize(bs->sample_n, bs->dims, bs->lists, bs->pq_m,
                                            bs->pq_bits);
    GpuivfParallelBuild *pb = NULL;
    GpuivfTrainArea *area = NULL;
    void       *mem = NULL;

    bs->train_participants = 1;
    if (bs->workers > 0)
        pb = GpuivfParallelTrainBegin(bs->heap, bs->index, bs->indexInfo, bs->workers, bytes,
                                      InitTrainArea, bs, &area, &bs->train_participants);
    if (pb == NULL)
    {
        mem = palloc_extended(bytes, MCXT_ALLOC_HUGE);
        area = InitTrainArea(mem, bs);
    }
    pfree(bs->sample);
    bs->sample = NULL;
    GpuivfTrainOnCpu(area, bs->centroids, bs->centroid_norms, bs->codebook, &bs->t_kmeans,
                     &bs->t_pq);
    GpuivfParallelEnd(pb);
    if (mem != NULL)
        pfree(mem);
}

/* k-means, residuals, PQ codebooks; frees the sample. */
static void
TrainModel(GpuivfBuildState *bs)
{
    int64       n = bs->sample_n;
    int         d = bs->dims;
    Size        codebook_floats;

    pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, GPUIVF_PHASE_KMEANS);
    bs->centroids = (float *) palloc_extended((Size) bs->lists * d * sizeof(float),
                                              MCXT_ALLOC_HUGE);
    bs->centroid_norms = (float *) palloc((Size) bs->lists * sizeof(float));
    codebook_floats = GpuivfCodebookFloats(d, bs->pq_m, bs->pq_bits);
    bs->codebook = (float *) palloc_extended(codebook_floats * sizeof(float), MCXT_ALLOC_HUGE);

    /* k-means + PQ on the GPU worker when one can;
     * same format, the CPU below otherwise (gpuivf.device decides) */
    if (GpuivfWorkerTrain(bs->index, bs->metric, bs->sample, n, d, bs->lists, bs->pq_m,
                          bs->pq_bits, bs->centroids, bs->codebook))
    {
        gpuivf::row_norms(bs->centroids, bs->lists, d, bs->centroid_norms);
        pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, GPUIVF_PHASE_PQ);
    }
    else
        TrainOnCpu(bs);
    if (bs->sample != NULL)
        pfree(bs->sample);
    bs->sample = NULL;
    /* the engines check this themselves; whichever trained, an index never
     * gets a centroid or codebook value a search cannot use */
    if (!gpuivf::components_within(bs->centroids, (int64) bs->lists * d, gpuivf::kMaxModelComponent) ||
        !gpuivf::components_within(bs->codebook, (int64) codebook_floats, gpuivf::kMaxModelComponent))
        ereport(ERROR,
                (errcode(ERRCODE_INTERNAL_ERROR),
                 errmsg("training gpuivf index \"%s\" produced a centroid or codebook value that is not finite",
                        RelationGetRelationName(bs->index))));

    bs->model.metric = bs->metric;
    bs->model.d = d;
    bs->model.nlist = bs->lists;
    bs->model.m = bs->pq_m;
    bs->model.nbits = bs->pq_bits;
    bs->model.centroids = bs->centroids;
    bs->model.centroid_norms = bs->centroid_norms;
    bs->model.codebook = bs->codebook;
}

/* ------------------------------------------------------------ encoding */

/*
 * The encoding scan, by parallel workers and the leader when allowed, else
 * by the leader alone; the entries end in bs->merged (parallel) or in the
 * leader's encoder (in memory, or its tuplesort).
 */
static void
EncodeHeap(GpuivfBuildState *bs)
{
    GpuivfEncodeSpec spec;
    GpuivfParallelEncodeResult pr;

    memset(&spec, 0, sizeof(spec));
    spec.metric = bs->metric;
    spec.dims = bs->dims;
    spec.lists = bs->lists;
    spec.pq_m = bs->pq_m;
    spec.pq_bits = bs->pq_bits;
    spec.code_size = bs->code_size;
    /* the trained index's flags: vector tuples unless it re-ranks from the
     * table (or not at all) */
    {
        GpuivfMetaPageData shape;

        memset(&shape, 0, sizeof(shape));
        shape.flags = GPUIVF_META_TRAINED |
            GpuivfStorageFlags(bs->index, bs->opts, bs->dims, true);
        spec.stores_vectors = GpuivfMetaStoresVectors(&shape);
        spec.storage = GpuivfStorageOf(GpuivfGetOpclassInfo(bs->index).type);
    }
    spec.wal = bs->wal;
    spec.mem_bytes = (Size) maintenance_work_mem * 1024;
    spec.calibrate = true;      /* unless gpuivf.analyze_sample is 0 */

    pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, GPUIVF_PHASE_ENCODE);
    pgstat_progress_update_param(PROGRESS_CREATEIDX_TUPLES_TOTAL, bs->rows);
    if (bs->workers > 0)
        bs->calib = GpuivfCalibSampleBegin(bs->dims);
    if (bs->workers > 0 &&
        GpuivfParallelEncode(bs->heap, bs->index, bs->indexInfo, bs->workers, &spec, bs->model,
                             bs->calib, &pr))
    {
        bs->participants = pr.participants;
        bs->reltuples = pr.reltuples;
        bs->encoded = pr.encoded;
        bs->t_engine = pr.engine_seconds;
        bs->engine_on_gpu = pr.on_gpu;
        bs->last_vector_page = pr.last_vector_page;
        bs->merged = pr.sort;
        bs->pb = pr.pb;
        return;
    }
    /* serial: the calibration sample is the encoder's own */
    bs->participants = 1;
    bs->enc = GpuivfEncoderBegin(bs->heap, bs->index, bs->forknum, &spec, bs->model, bs->rows,
                                 NULL);
    bs->reltuples = GpuivfEncoderScan(bs->enc, bs->indexInfo, NULL, true, NULL);
    GpuivfEncoderFinish(bs->enc);
    bs->encoded = GpuivfEncoderRows(bs->enc);
    bs->t_engine = GpuivfEncoderEngineSeconds(bs->enc);
    bs->engine_on_gpu = GpuivfEncoderOnGpu(bs->enc);
    bs->last_vector_page = GpuivfEncoderLastVectorPage(bs->enc);
    bs->calib = GpuivfEncoderCalibSample(bs->enc);
}

/* ------------------------------------------------------------ the lists */

/* Where WriteLists is: the chain being written and its list. */
typedef struct ListWriter
{
    GpuivfPageWriter pw;
    GpuivfListEntry *entry;
    Size        esize;
    int         cur;            /* list of the chain being written, or -1 */
    int64       written;
} ListWriter;

/* Append one entry; entries come in (list, id) order. */
static void
ListWriterAdd(ListWriter *w, GpuivfListDirEntry *dir, int list, uint64 id, const uint8 *code,
              int code_size)
{
    if (list != w->cur)
    {
        if (w->cur >= 0)
            dir[w->cur].tail = dir[w->cur].insert_page = w->pw.blkno;
        GpuivfWriterNewChain(&w->pw);
        w->cur = list;
    }
    GpuivfIdToTid(id, &w->entry->tid);
    memcpy(w->entry->code, code, code_size);
    GpuivfWriterAdd(&w->pw, w->entry, w->esize, NULL);
    if (dir[list].head == InvalidBlockNumber)
        dir[list].head = w->pw.chain_head;
    dir[list].count++;
    if (++w->written % 4096 == 0)
        CHECK_FOR_INTERRUPTS();
}

/* qsort_arg comparator: entry positions by id. */
static int
CompareEntryIds(const void *a, const void *b, void *arg)
{
    const uint64 *ids = (const uint64 *) arg;
    uint64      x = ids[*(const int64 *) a];
    uint64      y = ids[*(const int64 *) b];

    return x < y ? -1 : (x > y ? 1 : 0);
}

/* n in-memory entries in (list, id) order: a counting sort on the list
 * (stable, so each list keeps scan order, which is id order unless a
 * synchronized scan started mid-table; then that list is sorted). */
static int64 *
OrderMemEntries(int nlists, int64 n, const int32 *lists, const uint64 *ids)
{
    int64      *start = (int64 *) palloc0(sizeof(int64) * (nlists + 1));
    int64      *order = (int64 *) palloc_extended(sizeof(int64) * Max(n, (int64) 1),
                                                  MCXT_ALLOC_HUGE);
    int64      *next;

    for (int64 i = 0; i < n; i++)
    {
        if (lists[i] < 0 || lists[i] >= nlists)
            elog(ERROR, "gpuivf build encoded an entry into list %d of %d", lists[i], nlists);
        start[lists[i] + 1]++;
    }
    for (int l = 0; l < nlists; l++)
        start[l + 1] += start[l];
    next = (int64 *) palloc(sizeof(int64) * nlists);
    memcpy(next, start, sizeof(int64) * nlists);
    for (int64 i = 0; i < n; i++)
        order[next[lists[i]]++] = i;
    pfree(next);
    for (int l = 0; l < nlists; l++)
    {
        for (int64 i = start[l] + 1; i < start[l + 1]; i++)
        {
            if (ids[order[i]] < ids[order[i - 1]])
            {
                qsort_arg(order + start[l], start[l + 1] - start[l], sizeof(int64),
                          CompareEntryIds, (void *) ids);
                break;
            }
        }
    }
    pfree(start);
    return order;
}

/* Every entry of a sorted tuplesort of (list, id, code), in order. */
static void
WriteSortedEntries(GpuivfBuildState *bs, Tuplesortstate *sort, ListWriter *w,
                   GpuivfListDirEntry *dir)
{
    TupleDesc   desc = CreateTemplateTupleDesc(3);
    TupleTableSlot *slot;

    TupleDescInitEntry(desc, (AttrNumber) 1, "list", INT4OID, -1, 0);
    TupleDescInitEntry(desc, (AttrNumber) 2, "id", INT8OID, -1, 0);
    TupleDescInitEntry(desc, (AttrNumber) 3, "code", BYTEAOID, -1, 0);
    slot = MakeSingleTupleTableSlot(desc, &TTSOpsMinimalTuple);
    while (tuplesort_gettupleslot(sort, true, false, slot, NULL))
    {
        bool        isnull;
        int         list = DatumGetInt32(slot_getattr(slot, 1, &isnull));
        uint64      id = (uint64) DatumGetInt64(slot_getattr(slot, 2, &isnull));
        bytea      *code = DatumGetByteaPP(slot_getattr(slot, 3, &isnull));

        if (list < 0 || list >= bs->lists || VARSIZE_ANY_EXHDR(code) != (Size) bs->code_size)
            elog(ERROR, "gpuivf build sorted an invalid entry");
        ListWriterAdd(w, dir, list, id, (const uint8 *) VARDATA_ANY(code), bs->code_size);
    }
    ExecDropSingleTupleTableSlot(slot);
}

/* Write every list as one chain, in list order; fills dir[lists]. */
static void
WriteLists(GpuivfBuildState *bs, GpuivfListDirEntry *dir)
{
    ListWriter  w;
    int64       n;
    const int32 *lists;
    const uint64 *ids;
    const uint8 *codes;
    Tuplesortstate *sort = bs->merged;

    pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, GPUIVF_PHASE_WRITE);
    for (int l = 0; l < bs->lists; l++)
    {
        dir[l].head = dir[l].tail = dir[l].insert_page = InvalidBlockNumber;
        dir[l].count = 0;
    }
    w.esize = GPUIVF_LIST_ENTRY_SIZE(bs->code_size);
    w.entry = (GpuivfListEntry *) palloc0(w.esize);
    w.cur = -1;
    w.written = 0;
    GpuivfWriterInit(&w.pw, bs->index, bs->forknum, GPUIVF_PAGE_LIST, true, bs->wal);
    if (sort == NULL && GpuivfEncoderEntries(bs->enc, &n, &lists, &ids, &codes, &sort))
    {
        int64      *order = OrderMemEntries(bs->lists, n, lists, ids);

        bs->entries_in_memory = true;

        for (int64 i = 0; i < n; i++)
        {
            int64       e = order[i];

            ListWriterAdd(&w, dir, lists[e], ids[e], codes + (Size) e * bs->code_size,
                          bs->code_size);
        }
        pfree(order);
    }
    else
        WriteSortedEntries(bs, sort, &w, dir);
    if (w.cur >= 0)
        dir[w.cur].tail = dir[w.cur].insert_page = w.pw.blkno;
    GpuivfWriterFinish(&w.pw);
    pfree(w.entry);
    if (bs->merged != NULL)
        tuplesort_end(bs->merged);
    bs->merged = NULL;
    if (bs->enc != NULL)
        GpuivfEncoderEnd(bs->enc);
    bs->enc = NULL;
    GpuivfParallelEnd(bs->pb);
    bs->pb = NULL;
}

/* ------------------------------------------------------------ the build */

/*
 * Pick lists and pq_m for the rows seen; NOTICE when lists outnumber rows,
 * and when maintenance_work_mem kept the sample below what the lists want.
 */
static void
ResolveModelShape(GpuivfBuildState *bs)
{
    int64       want;

    bs->lists = bs->opts->lists > 0 ? bs->opts->lists : gpuivf::auto_lists(bs->rows);
    bs->lists = Min(bs->lists, gpuivf::kMaxLists);
    bs->pq_m = GpuivfResolvePqM(bs->index, bs->opts->pq_m, bs->dims);
    bs->pq_bits = bs->opts->pq_bits;
    bs->code_size = gpuivf::pq_code_size(bs->pq_m, bs->pq_bits);
    if (bs->rows < bs->lists)
        ereport(NOTICE,
                (errmsg("gpuivf index \"%s\" has fewer rows than lists",
                        RelationGetRelationName(bs->index)),
                 errdetail("The table has %lld rows with a vector for %d lists, so some lists stay empty and recall suffers.",
                           (long long) bs->rows, bs->lists),
                 errhint("Create the index after loading the data, or choose fewer lists.")));
    want = Min(bs->rows, Max((int64) GPUIVF_MIN_SAMPLE, (int64) GPUIVF_SAMPLE_PER_LIST * bs->lists));
    if (bs->sample_cap < bs->sample_target && bs->sample_n < want)
    {
        Size        need_kb = GpuivfSampleBytesFor(bs->dims, want) * 2 / 1024 + 1;

        ereport(NOTICE,
                (errmsg("gpuivf index \"%s\" is trained on a sample of %lld rows, fewer than the %lld its %d lists want",
                        RelationGetRelationName(bs->index), (long long) bs->sample_n,
                        (long long) want, bs->lists),
                 errdetail("The training sample may take half of maintenance_work_mem (%d kB); each row of %d dimensions takes %zu bytes of it.",
                           maintenance_work_mem, bs->dims,
                           GpuivfSampleBytesFor(bs->dims, want) / (Size) want),
                 errhint("Set maintenance_work_mem to at least %zu kB before CREATE INDEX for the full sample, or choose fewer lists.",
                         need_kb)));
    }
}

/* Build a trained index: model pages, vectors, lists, directory, meta. */
static void
BuildTrained(GpuivfBuildState *bs)
{
    GpuivfMetaPageData meta;
    GpuivfListDirEntry *dir;
    Size        codebook_floats;

    ResolveModelShape(bs);
    TrainModel(bs);
    GpuivfAddSeconds(&bs->t_train, &bs->phase_start);

    FillUntrainedMeta(bs->index, bs->opts, &meta);
    meta.flags = GPUIVF_META_TRAINED | GpuivfStorageFlags(bs->index, bs->opts, bs->dims, true);
    meta.dims = (uint32) bs->dims;
    meta.lists = (uint32) bs->lists;
    meta.pq_m = (uint16) bs->pq_m;
    meta.pq_bits = (uint16) bs->pq_bits;
    meta.code_size = (uint16) bs->code_size;
    meta.train_id = NewTrainId();
    codebook_floats = GpuivfCodebookFloats(bs->dims, bs->pq_m, bs->pq_bits);
    GpuivfWriteRawPages(bs->index, bs->forknum, GPUIVF_PAGE_CENTROIDS, bs->centroids,
                        (Size) bs->lists * bs->dims * sizeof(float), bs->wal, &meta.centroid_start,
                        &meta.centroid_pages);
    GpuivfWriteRawPages(bs->index, bs->forknum, GPUIVF_PAGE_CODEBOOK, bs->codebook,
                        codebook_floats * sizeof(float), bs->wal, &meta.codebook_start,
                        &meta.codebook_pages);

    EncodeHeap(bs);
    meta.vector_insert_page = bs->last_vector_page;
    GpuivfAddSeconds(&bs->t_encode, &bs->phase_start);

    dir = (GpuivfListDirEntry *) palloc_extended((Size) bs->lists * sizeof(GpuivfListDirEntry),
                                                 MCXT_ALLOC_HUGE);
    WriteLists(bs, dir);
    GpuivfWriteRawPages(bs->index, bs->forknum, GPUIVF_PAGE_DIRECTORY, dir,
                        (Size) bs->lists * sizeof(GpuivfListDirEntry), bs->wal,
                        &meta.directory_start, &meta.directory_pages);
    meta.vectors = (uint64) bs->encoded;
    GpuivfBuildPutMeta(bs->index, bs->forknum, &meta, bs->wal);
    /* the writers' unused pages are in the FSM: make them findable */
    if (bs->forknum == MAIN_FORKNUM)
        FreeSpaceMapVacuum(bs->index);
    GpuivfAddSeconds(&bs->t_lists, &bs->phase_start);
}

/*
 * Is the table a Citus distributed or reference table (a row of Citus's
 * pg_dist_partition)?  Its rows live in shards on the workers, each with its
 * own index, and the coordinator's table stays empty: the empty index there
 * is no reason for a NOTICE.  Read without depending on Citus: nothing is
 * found where the catalog does not exist.
 */
static bool
IsCitusTable(Oid relid)
{
    Oid         catalog = get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE);
    Relation    rel;
    ScanKeyData key;
    SysScanDesc scan;
    bool        found;

    if (!OidIsValid(catalog))
        return false;
    rel = table_open(catalog, AccessShareLock);
    /* its first column, logicalrelid, is the table's regclass */
    if (RelationGetDescr(rel)->natts < 1 ||
        TupleDescAttr(RelationGetDescr(rel), 0)->atttypid != REGCLASSOID)
    {
        table_close(rel, AccessShareLock);
        return false;
    }
    ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(relid));
    scan = systable_beginscan(rel, InvalidOid, false, NULL, 1, &key);
    found = HeapTupleIsValid(systable_getnext(scan));
    systable_endscan(scan);
    table_close(rel, AccessShareLock);
    return found;
}

/* The heap has no vector: an untrained index that REINDEX will train. */
static void
BuildUntrained(GpuivfBuildState *bs)
{
    GpuivfMetaPageData meta;

    FillUntrainedMeta(bs->index, bs->opts, &meta);
    GpuivfBuildPutMeta(bs->index, bs->forknum, &meta, bs->wal);
    if (IsCitusTable(RelationGetRelid(bs->heap)))
        return;
    ereport(NOTICE,
            (errmsg("gpuivf index \"%s\" is not trained because the table has no vectors",
                    RelationGetRelationName(bs->index)),
             errdetail("Until it is rebuilt, the index stores every vector and answers queries by exact search."),
             errhint("Run REINDEX INDEX %s after loading representative data.",
                     RelationGetRelationName(bs->index))));
}

/* ambuild: see the file comment. */
IndexBuildResult *
gpuivfbuild(Relation heap, Relation index, IndexInfo *indexInfo)
{
    IndexBuildResult *result = (IndexBuildResult *) palloc0(sizeof(IndexBuildResult));
    MemoryContext buildctx;
    MemoryContext old;
    GpuivfBuildState *bs;
    GpuivfMetaPageData placeholder;

    if (RelationGetNumberOfBlocks(index) != 0)
        elog(ERROR, "index \"%s\" already contains data", RelationGetRelationName(index));
    gpuivf::init_blas_single_threaded();

    buildctx = AllocSetContextCreate(CurrentMemoryContext, "gpuivf build",
                                     ALLOCSET_DEFAULT_SIZES);
    old = MemoryContextSwitchTo(buildctx);
    bs = (GpuivfBuildState *) palloc0(sizeof(GpuivfBuildState));
    bs->heap = heap;
    bs->index = index;
    bs->indexInfo = indexInfo;
    bs->forknum = MAIN_FORKNUM;
    bs->metric = GpuivfGetOpclassInfo(index).metric;
    bs->opts = GpuivfGetOptions(index);
    bs->wal = RelationNeedsWAL(index);
    bs->workers = GpuivfBuildWorkers(heap, index);
    INSTR_TIME_SET_CURRENT(bs->phase_start);

    /* the metapage must be block 0; it is rewritten (and logged) at the end */
    FillUntrainedMeta(index, bs->opts, &placeholder);
    GpuivfBuildPutMeta(index, bs->forknum, &placeholder, false);

    pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, GPUIVF_PHASE_SAMPLE);
    SampleHeap(bs);
    GpuivfAddSeconds(&bs->t_sample, &bs->phase_start);

    if (bs->rows == 0)
        BuildUntrained(bs);
    else
        BuildTrained(bs);

    /*
     * The calibration below searches the fresh index on the GPU worker, which
     * must load it first (half a second for 1M rows): it loads it now, and
     * the calibration's ground truth (rows read here) goes on meanwhile.
     */
    if (bs->rows > 0 && bs->engine_on_gpu)
    {
        GpuivfMetaPageData meta;

        GpuivfReadMeta(index, &meta);
        if (GpuivfCalibrationSearchesOnGpu(index, &meta))
            (void) GpuivfWorkerLoadStart(index, &meta);
    }
    {
        instr_time  t0;

        INSTR_TIME_SET_CURRENT(t0);
        GpuivfWorkerLoadWait(index);
        GpuivfAddSeconds(&bs->t_load_wait, &t0);
    }
    /* a fresh index is tuned before its first ANALYZE; its exact top-k on
     * the CPU shared with parallel workers when it has them */
    if (bs->rows > 0)
    {
        GpuivfTruthHelpers helpers;

        if (bs->workers > 0)
            GpuivfBuildTruthHelpers(heap, index, indexInfo, bs->workers, &helpers);
        GpuivfCalibrate(index, heap, bs->calib, bs->workers > 0 ? &helpers : NULL);
    }
    GpuivfAddSeconds(&bs->t_calibrate, &bs->phase_start);
    elog(DEBUG1, "gpuivf build of \"%s\": %lld rows, %d process%s; sample scan %.3f s (%lld rows sampled), "
         "training %.3f s (%s), encoding scan %.3f s (the leader waiting for the engine %.3f s, on the %s), "
         "lists %.3f s (entries sorted %s), waiting for the GPU worker's load %.3f s, calibration %.3f s",
         RelationGetRelationName(index), (long long) bs->rows, Max(bs->participants, 1),
         bs->participants > 1 ? "es" : "", bs->t_sample, (long long) bs->sample_n, bs->t_train,
         bs->rows == 0 ? "nothing to train" : bs->train_participants == 0 ? "on the GPU worker" :
         psprintf("%d process%s: k-means %.3f s, residuals and PQ %.3f s", bs->train_participants,
                  bs->train_participants > 1 ? "es" : "", bs->t_kmeans, bs->t_pq),
         bs->t_encode, bs->t_engine, bs->engine_on_gpu ? "GPU" : "CPU", bs->t_lists,
         bs->entries_in_memory ? "in memory" : "by a tuplesort", bs->t_load_wait, bs->t_calibrate);
    result->heap_tuples = bs->reltuples;
    result->index_tuples = (double) (bs->rows == 0 ? 0 : bs->encoded);

    MemoryContextSwitchTo(old);
    MemoryContextDelete(buildctx);
    return result;
}

/* ambuildempty: an unlogged index's init fork is an untrained metapage
 * (init forks are always logged). */
void
gpuivfbuildempty(Relation index)
{
    GpuivfMetaPageData meta;

    FillUntrainedMeta(index, GpuivfGetOptions(index), &meta);
    GpuivfBuildPutMeta(index, INIT_FORKNUM, &meta, true);
}
