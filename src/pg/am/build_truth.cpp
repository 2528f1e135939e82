/*
 * am/build_truth.cpp — the calibration's exact top-k and sweep on the CPU
 * at the end of a parallel build, shared by its workers and the leader.
 *
 * The calibration (calibration/calibration.cpp) runs after the lists are
 * written, when the encoding context's workers have left; its exact top-100
 * of every query among all rows (a brute force over every vector) is the
 * largest part of it.  When the build has workers and the truth is computed
 * on the CPU (no GPU worker answers it) from the index's vector pages, the
 * calibration calls back here (GpuivfTruthHelpers): a context of its own
 * (build_parallel.cpp) with the queries in shared memory, one command
 * (build_commands.cpp) whose items are ranges of GPUIVF_TRUTH_RANGE_BLOCKS
 * vector pages; each participant keeps the best k of its ranges' rows per
 * query (GpuivfExactKnnPart) and hands them over in a slot of its own, and
 * the leader merges the slots (GpuivfExactKnnMerge): the result of one
 * process, bit for bit (test/t/013).  An index without vector pages (its
 * rows are in the heap) is walked by the leader alone.
 *
 * The context stays for the calibration's sweep (calibration/curve.cpp):
 * for each stage a command whose items are the queries; every query's
 * candidates live in the area between stages (whichever process continues
 * it), and its hits at each point go to the area, where the leader adds
 * them up in query order, as one process does: the same sums, bit for bit.
 * end() lets the workers go before the calibration is stored.
 */
#include "gpuivf.h"
#include "am/build.h"

#define TRUTH_PART  (GPUIVF_COMMAND_EXIT + 1)
#define SWEEP_STAGE (GPUIVF_COMMAND_EXIT + 2)

/* The area's head; the arrays follow it at the offsets below. */
struct GpuivfTruthArea
{
    GpuivfCommands cmds;
    GpuivfMetaPageData meta;
    BlockNumber nblocks;        /* of the index, as the leader saw it */
    int         nq;
    int         k;
    int         slots;          /* parts the area holds: every participant's */
    pg_atomic_uint32 next_part; /* slots taken, by those that claimed a range */
    /* the sweep: the stage the leader asks for (written before the command) */
    int         cmax;           /* candidates kept per query */
    int         first;
    int         last;
    int         from;
    uint32      points[GPUIVF_CURVE_POINTS];
    pg_atomic_uint32 rebuilt;   /* a process found the index rebuilt */
    Size        off_queries;    /* nq * dims floats */
    Size        off_exclude;    /* nq uint64 */
    Size        off_vals;       /* slots * nq * k floats */
    Size        off_ids;        /* slots * nq * k uint64 */
    Size        off_truth;      /* nq * k uint64: the merged truth */
    Size        off_cand_vals;  /* nq * cmax floats */
    Size        off_cand_ids;   /* nq * cmax uint64 */
    Size        off_cand_sizes; /* nq int32 */
    Size        off_hits;       /* nq * GPUIVF_CURVE_POINTS * GPUIVF_CALIB_CURVES int */
};

static Size
Layout(int nq, int dims, int k, int slots, int cmax, GpuivfTruthArea *area)
{
    Size        pairs = mul_size(mul_size((Size) slots, nq), k);
    Size        cands = mul_size((Size) nq, cmax);
    const Size  bytes[] = {
        mul_size(mul_size((Size) nq, dims), sizeof(float4)),
        mul_size((Size) nq, sizeof(uint64)),
        mul_size(pairs, sizeof(float)),
        mul_size(pairs, sizeof(uint64)),
        mul_size(mul_size((Size) nq, k), sizeof(uint64)),
        mul_size(cands, sizeof(float)),
        mul_size(cands, sizeof(uint64)),
        mul_size((Size) nq, sizeof(int32)),
        mul_size((Size) nq, GPUIVF_CURVE_POINTS * GPUIVF_CALIB_CURVES * sizeof(int)),
    };
    Size        off[lengthof(bytes)];
    Size        size = GpuivfLayoutArrays(sizeof(GpuivfTruthArea), bytes, lengthof(bytes), off);

    if (area != NULL)
    {
        area->off_queries = off[0];
        area->off_exclude = off[1];
        area->off_vals = off[2];
        area->off_ids = off[3];
        area->off_truth = off[4];
        area->off_cand_vals = off[5];
        area->off_cand_ids = off[6];
        area->off_cand_sizes = off[7];
        area->off_hits = off[8];
    }
    return size;
}

/* ------------------------------------------------------- participants */

typedef struct TruthParticipant
{
    GpuivfTruthArea *area;
    Relation    index;
} TruthParticipant;

/* GpuivfExactKnnPart's claim: the next range of gen's command, counted. */
typedef struct RangeClaim
{
    GpuivfCommands *cmds;
    uint32      gen;
    int64       items;
    int64       claimed;
} RangeClaim;

static int64
NextRange(void *arg)
{
    RangeClaim *c = (RangeClaim *) arg;
    int64       r = GpuivfClaimItem(c->cmds, c->gen, c->items);

    if (r >= 0)
        c->claimed++;
    return r;
}

/* This process's part of a sweep stage: the queries it claims. */
static void
ParticipateSweep(TruthParticipant *tp, RangeClaim *claim)
{
    GpuivfTruthArea *area = tp->area;

    if (!GpuivfSweepPart(tp->index, &area->meta, area->nq, GPUIVF_AREA_AT(area, off_queries, float4),
                         GPUIVF_AREA_AT(area, off_exclude, uint64), GPUIVF_AREA_AT(area, off_truth, uint64),
                         GpuivfCalibKs, GPUIVF_CURVE_KS, area->points, area->first, area->last,
                         area->from, area->cmax, GPUIVF_AREA_AT(area, off_cand_vals, float),
                         GPUIVF_AREA_AT(area, off_cand_ids, uint64), GPUIVF_AREA_AT(area, off_cand_sizes, int32),
                         GPUIVF_AREA_AT(area, off_hits, int), NextRange, claim))
        pg_atomic_write_u32(&area->rebuilt, 1);
}

/* This process's part of the truth (the best k of the rows of the ranges
 * it claims, into a slot of its own when it claimed any) or of a sweep
 * stage. */
static void
Participate(GpuivfCommands *cmds, uint32 gen, int command, int64 items, void *arg)
{
    TruthParticipant *tp = (TruthParticipant *) arg;
    GpuivfTruthArea *area = tp->area;
    Size        pairs = (Size) area->nq * area->k;
    float      *vals;
    uint64     *ids;
    RangeClaim  claim = {cmds, gen, items, 0};

    if (command == SWEEP_STAGE)
    {
        /* a stage's bookkeeping (the truth ranked, buffers) is freed after
         * it: a worker serves every stage */
        MemoryContext stagectx = AllocSetContextCreate(CurrentMemoryContext,
                                                       "gpuivf sweep stage",
                                                       ALLOCSET_DEFAULT_SIZES);
        MemoryContext old = MemoryContextSwitchTo(stagectx);

        ParticipateSweep(tp, &claim);
        MemoryContextSwitchTo(old);
        MemoryContextDelete(stagectx);
        GpuivfItemsDone(cmds, claim.claimed, items);
        return;
    }
    Assert(command == TRUTH_PART);
    vals = (float *) palloc_extended(sizeof(float) * pairs, MCXT_ALLOC_HUGE);
    ids = (uint64 *) palloc_extended(sizeof(uint64) * pairs, MCXT_ALLOC_HUGE);
    GpuivfExactKnnPart(tp->index, &area->meta, area->nblocks, area->nq,
                       GPUIVF_AREA_AT(area, off_queries, float4), GPUIVF_AREA_AT(area, off_exclude, uint64),
                       area->k, NextRange, &claim, vals, ids);
    if (claim.claimed > 0)
    {
        uint32      part = pg_atomic_fetch_add_u32(&area->next_part, 1);

        Assert((int) part < area->slots);
        memcpy(GPUIVF_AREA_AT(area, off_vals, float) + part * pairs, vals, sizeof(float) * pairs);
        memcpy(GPUIVF_AREA_AT(area, off_ids, uint64) + part * pairs, ids, sizeof(uint64) * pairs);
    }
    pfree(vals);
    pfree(ids);
    GpuivfItemsDone(cmds, claim.claimed, items);    /* after the slot is written */
}

/* A parallel worker of the truth context (build_parallel.cpp). */
void
GpuivfTruthWorker(GpuivfTruthArea *area, Relation index)
{
    TruthParticipant me = {area, index};

    gpuivf::init_blas_single_threaded();
    GpuivfServeCommands(&area->cmds, Participate, &me);
}

/* ------------------------------------------------------------- leader */

/* What the helpers keep of the build. */
typedef struct TruthBuild
{
    Relation    heap;
    bool        isconcurrent;
    int         nworkers;
    GpuivfParallelBuild *pb;    /* open from the truth to end() */
    GpuivfTruthArea *area;
    TruthParticipant me;
} TruthBuild;

typedef struct TruthInit
{
    const GpuivfMetaPageData *meta;
    BlockNumber nblocks;
    int         nq;
    int         k;
    int         slots;
    int         cmax;
    const float4 *queries;
    const uint64 *exclude;
    GpuivfTruthArea *area;
} TruthInit;

static void
InitArea(void *mem, void *arg)
{
    TruthInit  *ti = (TruthInit *) arg;
    GpuivfTruthArea *area = (GpuivfTruthArea *) mem;

    memset(area, 0, sizeof(GpuivfTruthArea));
    GpuivfCommandsInit(&area->cmds);
    area->meta = *ti->meta;
    area->nblocks = ti->nblocks;
    area->nq = ti->nq;
    area->k = ti->k;
    area->slots = ti->slots;
    pg_atomic_init_u32(&area->next_part, 0);
    area->cmax = ti->cmax;
    pg_atomic_init_u32(&area->rebuilt, 0);
    (void) Layout(ti->nq, (int) ti->meta->dims, ti->k, ti->slots, ti->cmax, area);
    memset(GPUIVF_AREA_AT(area, off_cand_sizes, int32), 0, sizeof(int32) * (Size) ti->nq);
    memcpy(GPUIVF_AREA_AT(area, off_queries, float4), ti->queries,
           sizeof(float4) * (Size) ti->nq * ti->meta->dims);
    memcpy(GPUIVF_AREA_AT(area, off_exclude, uint64), ti->exclude, sizeof(uint64) * (Size) ti->nq);
    ti->area = area;
}

/* GpuivfTruthHelpers.run: the exact top-k by the leader and the workers;
 * the context stays for the sweep. */
static bool
RunTruth(GpuivfTruthHelpers *helpers, Relation index, const GpuivfMetaPageData *meta, int nq,
         const float4 *queries, const uint64 *exclude_ids, int k, uint64 *out_ids,
         float *out_scores)
{
    TruthBuild *tb = (TruthBuild *) helpers->arg;
    TruthInit   ti;
    GpuivfTruthArea *area;
    int         participants;

    ti.meta = meta;
    ti.nblocks = RelationGetNumberOfBlocks(index);
    ti.nq = nq;
    ti.k = k;
    ti.slots = tb->nworkers + 1;
    ti.cmax = GpuivfSweepCandidates(meta, k);
    ti.queries = queries;
    ti.exclude = exclude_ids;
    ti.area = NULL;
    /* fewer ranges than processes: not worth starting workers for */
    if (tb->pb != NULL || GpuivfTruthRanges(ti.nblocks) < ti.slots)
        return false;
    tb->pb = GpuivfParallelTruthBegin(tb->heap, index, tb->isconcurrent, tb->nworkers,
                                      Layout(nq, (int) meta->dims, k, ti.slots, ti.cmax, NULL),
                                      InitArea, &ti, &participants);
    if (tb->pb == NULL)
        return false;
    tb->area = area = ti.area;
    tb->me.area = area;
    tb->me.index = index;
    GpuivfRunCommand(&area->cmds, TRUTH_PART, GpuivfTruthRanges(ti.nblocks), Participate, &tb->me);
    GpuivfExactKnnMerge(nq, k, (int) pg_atomic_read_u32(&area->next_part),
                        GPUIVF_AREA_AT(area, off_vals, float), GPUIVF_AREA_AT(area, off_ids, uint64), out_ids,
                        out_scores);
    memcpy(GPUIVF_AREA_AT(area, off_truth, uint64), out_ids, sizeof(uint64) * (Size) nq * k);
    helpers->participants = participants;
    return true;
}

/* GpuivfTruthHelpers.sweep: a stage of the sweep, each process claiming
 * queries. */
static bool
RunSweepStage(GpuivfTruthHelpers *helpers, int cmax, const uint32 *points, int first, int last,
              int from, int **hits)
{
    TruthBuild *tb = (TruthBuild *) helpers->arg;
    GpuivfTruthArea *area = tb->area;

    if (tb->pb == NULL || cmax > area->cmax)
        return false;
    memcpy(area->points, points, sizeof(area->points));
    area->first = first;
    area->last = last;
    area->from = from;
    GpuivfRunCommand(&area->cmds, SWEEP_STAGE, area->nq, Participate, &tb->me);
    helpers->swept = true;
    *hits = pg_atomic_read_u32(&area->rebuilt) != 0 ? NULL : GPUIVF_AREA_AT(area, off_hits, int);
    return true;
}

/* GpuivfTruthHelpers.end: the workers leave. */
static void
EndTruth(GpuivfTruthHelpers *helpers)
{
    TruthBuild *tb = (TruthBuild *) helpers->arg;

    if (tb->pb == NULL)
        return;
    GpuivfRunCommand(&tb->area->cmds, GPUIVF_COMMAND_EXIT, 0, NULL, NULL);
    GpuivfParallelEnd(tb->pb);
    tb->pb = NULL;
}

void
GpuivfBuildTruthHelpers(Relation heap, Relation index, IndexInfo *indexInfo, int nworkers,
                        GpuivfTruthHelpers *helpers)
{
    TruthBuild *tb = (TruthBuild *) palloc(sizeof(TruthBuild));

    (void) index;
    tb->heap = heap;
    tb->isconcurrent = indexInfo->ii_Concurrent;
    tb->nworkers = nworkers;
    tb->pb = NULL;
    tb->area = NULL;
    helpers->run = RunTruth;
    helpers->sweep = RunSweepStage;
    helpers->end = EndTruth;
    helpers->arg = tb;
    helpers->participants = 1;
    helpers->swept = false;
}
