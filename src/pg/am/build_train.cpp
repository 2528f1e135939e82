/*
 * am/build_train.cpp — training on the CPU: k-means (the coarse centroids),
 * the sample's residuals, the PQ codebooks; shared with the build's
 * parallel workers when it has any.
 *
 * The work comes in commands (build_commands.cpp) the leader publishes in
 * the train area, each a number of items that every participant (the
 * leader included) claims one at a time until none is left:
 *
 *   LABEL  blocks of GPUIVF_TRAIN_BLOCK rows of the sample: the nearest of
 *          the current centroids of each (assign_nearest);
 *   PQ     the sub-quantizers (pq_train_claimed);
 *   EXIT   the workers leave.
 *
 * The leader steps the k-means itself (kmeans_begin/kmeans_step): LABEL for
 * every Lloyd iteration, then once more for the residuals, then PQ.  A
 * block starts at a multiple of kAssignRowBlock, so each row's label, and
 * so every centroid and codebook, is the one a single process computes
 * (serial and parallel builds train the same model; test/t/013).
 *
 * Without workers the area is the leader's memory and the leader claims
 * everything: one path for both.  With them it is in the training context's
 * shared memory (build_parallel.cpp) and the sample is copied there.  The
 * k-means run is ended by PG_FINALLY.
 */
#include "gpuivf.h"
#include "am/build.h"

#define GPUIVF_TRAIN_BLOCK  (4 * gpuivf::kAssignRowBlock)  /* rows per LABEL item */

#define TRAIN_LABEL (GPUIVF_COMMAND_EXIT + 1)
#define TRAIN_PQ    (GPUIVF_COMMAND_EXIT + 2)

/* The area's head; the arrays follow it at the offsets below. */
struct GpuivfTrainArea
{
    /* fixed before any command */
    int         dims;
    int         lists;
    int         pq_m;
    int         pq_bits;
    int64       n;              /* sample rows */
    Size        off_sample;     /* n * dims floats (residuals after LABEL of them) */
    Size        off_labels;     /* n int32 */
    Size        off_centroids;  /* lists * dims floats */
    Size        off_norms;      /* lists floats */
    Size        off_codebook;
    GpuivfCommands cmds;
    int64       label_rows;     /* LABEL: rows of the sample it labels */
};

/* Where the arrays go after the head (into *area when not NULL); the
 * area's size. */
static Size
Layout(int64 n, int dims, int lists, int pq_m, int pq_bits, GpuivfTrainArea *area)
{
    const Size  bytes[] = {
        mul_size(mul_size((Size) n, dims), sizeof(float)),          /* sample */
        mul_size((Size) n, sizeof(int32)),                          /* labels */
        mul_size(mul_size((Size) lists, dims), sizeof(float)),      /* centroids */
        mul_size((Size) lists, sizeof(float)),                      /* norms */
        mul_size(GpuivfCodebookFloats(dims, pq_m, pq_bits), sizeof(float)),
    };
    Size        off[lengthof(bytes)];
    Size        size = GpuivfLayoutArrays(sizeof(GpuivfTrainArea), bytes, lengthof(bytes), off);

    if (area != NULL)
    {
        area->off_sample = off[0];
        area->off_labels = off[1];
        area->off_centroids = off[2];
        area->off_norms = off[3];
        area->off_codebook = off[4];
    }
    return size;
}

Size
GpuivfTrainAreaSize(int64 n, int dims, int lists, int pq_m, int pq_bits)
{
    return Layout(n, dims, lists, pq_m, pq_bits, NULL);
}

GpuivfTrainArea *
GpuivfTrainAreaInit(void *mem, const float *sample, int64 n, int dims, int lists, int pq_m,
                    int pq_bits)
{
    GpuivfTrainArea *area = (GpuivfTrainArea *) mem;

    memset(area, 0, sizeof(GpuivfTrainArea));
    area->dims = dims;
    area->lists = lists;
    area->pq_m = pq_m;
    area->pq_bits = pq_bits;
    area->n = n;
    (void) Layout(n, dims, lists, pq_m, pq_bits, area);
    memcpy(GPUIVF_AREA_AT(area, off_sample, float), sample, (Size) n * dims * sizeof(float));
    GpuivfCommandsInit(&area->cmds);
    return area;
}

/* ------------------------------------------------------- participants */

/* pq_train_claimed's claim: the next sub-quantizer, counted. */
typedef struct PqClaim
{
    GpuivfTrainArea *area;
    uint32      gen;
    int64       claimed;
} PqClaim;

static int64_t
NextSubQuantizer(void *arg)
{
    PqClaim    *c = (PqClaim *) arg;
    int64       j = GpuivfClaimItem(&c->area->cmds, c->gen, c->area->pq_m);

    if (j >= 0)
        c->claimed++;
    return j;
}

/* Work on generation gen's command until none of its items is left. */
static void
Participate(GpuivfCommands *cmds, uint32 gen, int command, int64 items, void *arg)
{
    GpuivfTrainArea *area = (GpuivfTrainArea *) arg;
    gpuivf::CancelHook cancel = GpuivfCancelHook();
    int         d = area->dims;
    float      *sample = GPUIVF_AREA_AT(area, off_sample, float);

    if (command == TRAIN_LABEL)
    {
        int64       rows = area->label_rows;
        int64       b;

        while ((b = GpuivfClaimItem(cmds, gen, items)) >= 0)
        {
            int64       r0 = b * GPUIVF_TRAIN_BLOCK;
            int64       len = Min((int64) GPUIVF_TRAIN_BLOCK, rows - r0);

            GpuivfRaiseStatus(gpuivf::assign_nearest(GPUIVF_AREA_AT(area, off_centroids, float),
                                                     GPUIVF_AREA_AT(area, off_norms, float), area->lists,
                                                     d, sample + r0 * d, len,
                                                     GPUIVF_AREA_AT(area, off_labels, int32) + r0, NULL,
                                                     &cancel));
            GpuivfItemsDone(cmds, 1, items);
        }
    }
    else if (command == TRAIN_PQ)
    {
        PqClaim     claim = {area, gen, 0};
        gpuivf::WorkClaim wc = {NextSubQuantizer, &claim};

        GpuivfRaiseStatus(gpuivf::pq_train_claimed(sample, area->n, d, area->pq_m, area->pq_bits,
                                                   GPUIVF_TRAIN_SEED,
                                                   GPUIVF_AREA_AT(area, off_codebook, float), &wc,
                                                   &cancel));
        GpuivfItemsDone(cmds, claim.claimed, items);
    }
}

/* A parallel worker of the training context: every command until EXIT. */
void
GpuivfTrainWorker(GpuivfTrainArea *area)
{
    GpuivfServeCommands(&area->cmds, Participate, area);
}

/* ------------------------------------------------------------- leader */

static void
RunCommand(GpuivfTrainArea *area, int command, int64 items)
{
    GpuivfRunCommand(&area->cmds, command, items, Participate, area);
}

/* Label `rows` rows of the area's sample against its centroids (norms
 * computed here) into its labels. */
static void
LabelSample(GpuivfTrainArea *area, int64 rows)
{
    gpuivf::row_norms(GPUIVF_AREA_AT(area, off_centroids, float), area->lists, area->dims,
                      GPUIVF_AREA_AT(area, off_norms, float));
    area->label_rows = rows;
    RunCommand(area, TRAIN_LABEL, (rows + GPUIVF_TRAIN_BLOCK - 1) / GPUIVF_TRAIN_BLOCK);
}

/* The coarse k-means, stepped here: each Lloyd iteration's labels come from
 * LabelSample (or, when the run trains on its own subsample of the sample,
 * from one assign_nearest of it in the leader). */
static void
TrainCentroids(GpuivfTrainArea *area)
{
    gpuivf::CancelHook cancel = GpuivfCancelHook();
    gpuivf::KMeansParams params = gpuivf::kmeans_default_params();
    float      *sample = GPUIVF_AREA_AT(area, off_sample, float);
    float      *centroids = GPUIVF_AREA_AT(area, off_centroids, float);
    gpuivf::KMeansRun *run;
    gpuivf::Status st;
    int32      *own_labels = NULL;

    params.seed = GPUIVF_TRAIN_SEED;
    run = gpuivf::kmeans_begin(sample, area->n, area->dims, area->lists, params, centroids,
                               &cancel, &st);
    if (run == NULL)
        GpuivfRaiseStatus(st);
    PG_TRY();
    {
        const float *rows;
        int64_t     nrows;

        while (gpuivf::kmeans_wants_labels(run, &rows, &nrows))
        {
            const int32 *labels;

            if (rows == sample)
            {
                LabelSample(area, nrows);
                labels = GPUIVF_AREA_AT(area, off_labels, int32);
            }
            else
            {
                if (own_labels == NULL)
                    own_labels = (int32 *) palloc_extended((Size) nrows * sizeof(int32),
                                                           MCXT_ALLOC_HUGE);
                gpuivf::row_norms(centroids, area->lists, area->dims,
                                  GPUIVF_AREA_AT(area, off_norms, float));
                GpuivfRaiseStatus(gpuivf::assign_nearest(centroids, GPUIVF_AREA_AT(area, off_norms, float),
                                                         area->lists, area->dims, rows, nrows,
                                                         own_labels, NULL, &cancel));
                labels = own_labels;
            }
            GpuivfRaiseStatus(gpuivf::kmeans_step(run, labels));
        }
    }
    PG_FINALLY();
    {
        gpuivf::kmeans_end(run);
    }
    PG_END_TRY();
    if (own_labels != NULL)
        pfree(own_labels);
}

/*
 * k-means, residuals and PQ codebooks of the area's sample (its rows become
 * residuals) into centroids, norms and codebook (the caller's arrays); the
 * seconds of the k-means and of the rest are added to *t_kmeans, *t_pq.
 */
void
GpuivfTrainOnCpu(GpuivfTrainArea *area, float *centroids, float *centroid_norms, float *codebook,
                 double *t_kmeans, double *t_pq)
{
    int         d = area->dims;
    int64       n = area->n;
    float      *sample = GPUIVF_AREA_AT(area, off_sample, float);
    const float *trained = GPUIVF_AREA_AT(area, off_centroids, float);
    const int32 *labels = GPUIVF_AREA_AT(area, off_labels, int32);

    instr_time  start;

    INSTR_TIME_SET_CURRENT(start);
    TrainCentroids(area);
    GpuivfAddSeconds(t_kmeans, &start);

    pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, GPUIVF_PHASE_PQ);
    LabelSample(area, n);
    for (int64 i = 0; i < n; i++)
    {
        float      *x = sample + i * d;
        const float *c = trained + (int64) labels[i] * d;

        for (int j = 0; j < d; j++)
            x[j] -= c[j];
    }
    RunCommand(area, TRAIN_PQ, area->pq_m);
    RunCommand(area, GPUIVF_COMMAND_EXIT, 0);
    GpuivfAddSeconds(t_pq, &start);

    memcpy(centroids, trained, (Size) area->lists * d * sizeof(float));
    memcpy(centroid_norms, GPUIVF_AREA_AT(area, off_norms, float), (Size) area->lists * sizeof(float));
    memcpy(codebook, GPUIVF_AREA_AT(area, off_codebook, float),
           GpuivfCodebookFloats(d, area->pq_m, area->pq_bits) * sizeof(float));
}
