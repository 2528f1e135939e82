/*
 * am/build_truth.cpp — the calibration's exact top-k on the CPU at the end
 * of a parallel build, shared by its workers and the leader.
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
 */
#include "gpuivf.h"
#include "am/build.h"

#define TRUTH_PART  (GPUIVF_COMMAND_EXIT + 1)

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
    Size        off_queries;    /* nq * dims floats */
    Size        off_exclude;    /* nq uint64 */
    Size        off_vals;       /* slots * nq * k floats */
    Size        off_ids;        /* slots * nq * k uint64 */
};

#define AREA_AT(area, off, type) ((type *) ((char *) (area) + (area)->off))

static Size
Layout(int nq, int dims, int k, int slots, GpuivfTruthArea *area)
{
    Size        pairs = mul_size(mul_size((Size) slots, nq), k);
    const Size  bytes[] = {
        mul_size(mul_size((Size) nq, dims), sizeof(float4)),
        mul_size((Size) nq, sizeof(uint64)),
        mul_size(pairs, sizeof(float)),
        mul_size(pairs, sizeof(uint64)),
    };
    Size        off[lengthof(bytes)];
    Size        size = MAXALIGN(sizeof(GpuivfTruthArea));

    for (int i = 0; i < (int) lengthof(bytes); i++)
    {
        off[i] = size;
        size = add_size(size, MAXALIGN(bytes[i]));
    }
    if (area != NULL)
    {
        area->off_queries = off[0];
        area->off_exclude = off[1];
        area->off_vals = off[2];
        area->off_ids = off[3];
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

/* This process's part: the best k of the rows of the ranges it claims,
 * into a slot of its own when it claimed any. */
static void
Participate(GpuivfCommands *cmds, uint32 gen, int command, int64 items, void *arg)
{
    TruthParticipant *tp = (TruthParticipant *) arg;
    GpuivfTruthArea *area = tp->area;
    Size        pairs = (Size) area->nq * area->k;
    float      *vals = (float *) palloc_extended(sizeof(float) * pairs, MCXT_ALLOC_HUGE);
    uint64     *ids = (uint64 *) palloc_extended(sizeof(uint64) * pairs, MCXT_ALLOC_HUGE);
    RangeClaim  claim = {cmds, gen, items, 0};

    Assert(command == TRUTH_PART);
    (void) command;
    GpuivfExactKnnPart(tp->index, &area->meta, area->nblocks, area->nq,
                       AREA_AT(area, off_queries, float4), AREA_AT(area, off_exclude, uint64),
                       area->k, NextRange, &claim, vals, ids);
    if (claim.claimed > 0)
    {
        uint32      part = pg_atomic_fetch_add_u32(&area->next_part, 1);

        Assert((int) part < area->slots);
        memcpy(AREA_AT(area, off_vals, float) + part * pairs, vals, sizeof(float) * pairs);
        memcpy(AREA_AT(area, off_ids, uint64) + part * pairs, ids, sizeof(uint64) * pairs);
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
} TruthBuild;

typedef struct TruthInit
{
    const GpuivfMetaPageData *meta;
    BlockNumber nblocks;
    int         nq;
    int         k;
    int         slots;
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
    (void) Layout(ti->nq, (int) ti->meta->dims, ti->k, ti->slots, area);
    memcpy(AREA_AT(area, off_queries, float4), ti->queries,
           sizeof(float4) * (Size) ti->nq * ti->meta->dims);
    memcpy(AREA_AT(area, off_exclude, uint64), ti->exclude, sizeof(uint64) * (Size) ti->nq);
    ti->area = area;
}

/* GpuivfTruthHelpers.run: the exact top-k by the leader and the workers. */
static bool
RunTruth(GpuivfTruthHelpers *helpers, Relation index, const GpuivfMetaPageData *meta, int nq,
         const float4 *queries, const uint64 *exclude_ids, int k, uint64 *out_ids,
         float *out_scores)
{
    TruthBuild *tb = (TruthBuild *) helpers->arg;
    TruthInit   ti;
    TruthParticipant me;
    GpuivfParallelBuild *pb;
    int         participants;
    GpuivfTruthArea *area;

    ti.meta = meta;
    ti.nblocks = RelationGetNumberOfBlocks(index);
    ti.nq = nq;
    ti.k = k;
    ti.slots = tb->nworkers + 1;
    ti.queries = queries;
    ti.exclude = exclude_ids;
    ti.area = NULL;
    /* fewer ranges than processes: not worth starting workers for */
    if (GpuivfTruthRanges(ti.nblocks) < ti.slots)
        return false;
    pb = GpuivfParallelTruthBegin(tb->heap, index, tb->isconcurrent, tb->nworkers,
                                  Layout(nq, (int) meta->dims, k, ti.slots, NULL), InitArea, &ti,
                                  &participants);
    if (pb == NULL)
        return false;
    area = ti.area;
    me.area = area;
    me.index = index;
    GpuivfRunCommand(&area->cmds, TRUTH_PART, GpuivfTruthRanges(ti.nblocks), Participate, &me);
    GpuivfRunCommand(&area->cmds, GPUIVF_COMMAND_EXIT, 0, NULL, NULL);
    GpuivfExactKnnMerge(nq, k, (int) pg_atomic_read_u32(&area->next_part),
                        AREA_AT(area, off_vals, float), AREA_AT(area, off_ids, uint64), out_ids,
                        out_scores);
    helpers->participants = participants;
    GpuivfParallelEnd(pb);
    return true;
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
    helpers->run = RunTruth;
    helpers->arg = tb;
    helpers->participants = 1;
}
