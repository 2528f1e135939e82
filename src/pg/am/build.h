/*
 * am/build.h — private to the build (build*.cpp): CREATE INDEX in two heap
 * scans, each run by one process or by several (PostgreSQL's parallel
 * index build machinery, as btree and pgvector do it).
 *
 *   build.cpp           ambuild: the steps, training, the lists, the metapage
 *   build_sample.cpp    the sampling scan: the training sample by hash
 *   build_commands.cpp  the commands the leader has the workers work on
 *   build_train.cpp     training on the CPU, shared with the workers
 *   build_truth.cpp     the calibration's exact top-k and sweep on the CPU,
 *                       shared with the workers
 *   build_encode.cpp    the encoding scan of one participant: engines,
 *                       vector pages, the (list, id, code) entries
 *   build_parallel.cpp  the parallel contexts and the workers' entry point
 *
 * A *participant* is a process that scans part of the heap (or takes part
 * of the training): the leader
 * alone in a serial build, else the leader and the launched workers.  The
 * index they produce is the same whatever their number, up to where the
 * vector tuples land (see build.cpp).
 */
#ifndef GPUIVF_AM_BUILD_H
#define GPUIVF_AM_BUILD_H

#include "gpuivf.h"
#include "calibration/calibration.h"

/* Fixed seeds: the same heap and options always give the same model. */
#define GPUIVF_SAMPLE_SEED  UINT64CONST(0x6770756976660001)
#define GPUIVF_TRAIN_SEED   UINT64CONST(0x6770756976660002)

/* ------------------------------------------------------ build_sample.cpp */

/*
 * The training sample: the k rows with the smallest GpuivfSampleHash of
 * their vector (then heap TID) among all rows with a vector, in prepared
 * space.  One area
 * (in the parallel context's shared memory, or the leader's memory) that
 * every participant offers its rows to, a batch at a time under a mutex.
 */
typedef struct GpuivfSampleArea GpuivfSampleArea;

/* dims of the first vector of the heap, 0 when it has none (*reltuples:
 * the heap rows seen looking, all of them in that case) */
int         GpuivfPeekDims(Relation heap, Relation index, IndexInfo *indexInfo,
                           double *reltuples);
/* rows of dims the sample can hold in `bytes`; the area's size for k */
int64       GpuivfSampleRowsFitting(int dims, Size bytes);
Size        GpuivfSampleBytesFor(int dims, int64 k);
Size        GpuivfSampleAreaSize(int dims, int64 k);
GpuivfSampleArea *GpuivfSampleAreaInit(void *mem, int dims, int64 k, gpuivf::Metric metric,
                                       bool shared);
/* one participant's sampling scan (scan: its parallel scan, or NULL for all
 * the heap); returns the heap rows it saw */
double      GpuivfSampleScan(GpuivfSampleArea *area, Relation heap, Relation index,
                             IndexInfo *indexInfo, TableScanDesc scan, bool progress);
/* once every participant is done: the rows with a vector, and the sample,
 * copied in key order into *sample (palloc'd; n x dims) */
int64       GpuivfSampleAreaRows(const GpuivfSampleArea *area);
int64       GpuivfSampleAreaTake(GpuivfSampleArea *area, float **sample);

/* ---------------------------------------------------- build_commands.cpp */

/* A command of `items` items that the leader publishes and every
 * participant claims items of (in shared memory, or the leader's memory
 * when it works alone). */
typedef struct GpuivfCommands
{
    slock_t     mutex;          /* the current command: */
    uint32      generation;
    int         command;
    int64       items;          /* written before the generation is */
    ConditionVariable workcv;   /* a new command */
    ConditionVariable donecv;   /* the last item is done */
    pg_atomic_uint64 claim;     /* generation << 32 | next item */
    pg_atomic_uint64 done;      /* items of the command done */
} GpuivfCommands;

#define GPUIVF_COMMAND_IDLE 0
#define GPUIVF_COMMAND_EXIT 1   /* the workers leave; users number theirs above */

/* One participant's work on generation gen's command (claiming its items
 * until none is left, GpuivfItemsDone for those it did). */
typedef void (*GpuivfParticipateFn) (GpuivfCommands *cmds, uint32 gen, int command, int64 items,
                                     void *arg);

void        GpuivfCommandsInit(GpuivfCommands *cmds);
/* the next item of gen's command, -1 when none is left */
int64       GpuivfClaimItem(GpuivfCommands *cmds, uint32 gen, int64 items);
void        GpuivfItemsDone(GpuivfCommands *cmds, int64 count, int64 items);
/* the leader: publish, do its share, wait for every item */
void        GpuivfRunCommand(GpuivfCommands *cmds, int command, int64 items,
                             GpuivfParticipateFn participate, void *arg);
/* a worker: every command until EXIT */
void        GpuivfServeCommands(GpuivfCommands *cmds, GpuivfParticipateFn participate, void *arg);

/* An area in shared memory: a head, then arrays at offsets it records
 * (off_x fields).  GpuivfLayoutArrays places n arrays of bytes[i] after a
 * head of head_size (each MAXALIGNed) into off[], and returns the whole
 * area's size. */
Size        GpuivfLayoutArrays(Size head_size, const Size *bytes, int n, Size *off);
#define GPUIVF_AREA_AT(area, off, type) ((type *) ((char *) (area) + (area)->off))

/* ------------------------------------------------------- build_train.cpp */

/*
 * What training on the CPU works on: the sample (its rows become residuals),
 * the labels, the model being trained, and the command the leader has the
 * participants work on.  In the training context's shared memory, or the
 * leader's memory in a serial build.
 */
typedef struct GpuivfTrainArea GpuivfTrainArea;

Size        GpuivfTrainAreaSize(int64 n, int dims, int lists, int pq_m, int pq_bits);
/* the area in mem (of GpuivfTrainAreaSize), the sample (n x dims) copied in */
GpuivfTrainArea *GpuivfTrainAreaInit(void *mem, const float *sample, int64 n, int dims, int lists,
                                     int pq_m, int pq_bits);
/* the leader: k-means, residuals, PQ into the caller's arrays (the
 * seconds of the k-means and of the rest added to *t_kmeans, *t_pq); then
 * the workers leave */
void        GpuivfTrainOnCpu(GpuivfTrainArea *area, float *centroids, float *centroid_norms,
                             float *codebook, double *t_kmeans, double *t_pq);
/* a parallel worker of the training context */
void        GpuivfTrainWorker(GpuivfTrainArea *area);

/* ------------------------------------------------------- build_truth.cpp */

/*
 * The calibration's exact top-k and sweep on the CPU at the end of a
 * parallel build: a context of its own whose participants claim ranges of
 * the index's vector pages (GpuivfExactKnnPart) while the leader merges
 * their parts, then the queries of each stage of the sweep
 * (GpuivfSweepPart).  GpuivfBuildTruthHelpers fills helpers for
 * GpuivfCalibrate.
 */
typedef struct GpuivfTruthArea GpuivfTruthArea;

void        GpuivfBuildTruthHelpers(Relation heap, Relation index, IndexInfo *indexInfo,
                                    int nworkers, GpuivfTruthHelpers *helpers);
/* a parallel worker of the truth context */
void        GpuivfTruthWorker(GpuivfTruthArea *area, Relation index);

/* ------------------------------------------------------ build_encode.cpp */

/* What every participant of the encoding scan needs: the model and how to
 * write (copied into shared memory for workers; the arrays follow it there) */
typedef struct GpuivfEncodeSpec
{
    gpuivf::Metric metric;
    int         dims;
    int         lists;
    int         pq_m;
    int         pq_bits;
    int         code_size;
    bool        stores_vectors; /* vector tuples, entries point at them */
    uint16      storage;        /* GPUIVF_STORAGE_* of their values */
    bool        wal;            /* log pages as they are finished */
    bool        calibrate;      /* draw the calibration's sample */
    Size        mem_bytes;      /* this participant's share of maintenance_work_mem */
} GpuivfEncodeSpec;

typedef struct GpuivfEncoder GpuivfEncoder;

/*
 * Where a participant's entries go: in memory when `in_memory_rows` entries
 * fit in half of its share (the leader of a serial build; they move to a
 * tuplesort should they outgrow it), else a tuplesort of its own or, in a
 * parallel build, its part of the shared tuplesort (coordinate).
 */
GpuivfEncoder *GpuivfEncoderBegin(Relation heap, Relation index, ForkNumber forknum,
                                  const GpuivfEncodeSpec *spec, const gpuivf::IvfPqModel &model,
                                  int64 in_memory_rows, SortCoordinate coordinate);
/* scan (a parallel scan, or NULL for the whole heap); returns the heap rows */
double      GpuivfEncoderScan(GpuivfEncoder *enc, IndexInfo *indexInfo, TableScanDesc scan,
                              bool progress, pg_atomic_uint64 *shared_encoded);
/* after the scan: its pages released (logged when spec->wal) */
void        GpuivfEncoderFinish(GpuivfEncoder *enc);
int64       GpuivfEncoderRows(const GpuivfEncoder *enc);
double      GpuivfEncoderEngineSeconds(const GpuivfEncoder *enc);
bool        GpuivfEncoderOnGpu(const GpuivfEncoder *enc);
BlockNumber GpuivfEncoderLastVectorPage(const GpuivfEncoder *enc);
GpuivfCalibSample *GpuivfEncoderCalibSample(const GpuivfEncoder *enc);
/* the entries, for the lists: in memory (lists[], ids[], codes[] of n; true)
 * or in the encoder's tuplesort, sorted and returned in *sort (false) */
bool        GpuivfEncoderEntries(GpuivfEncoder *enc, int64 *n, const int32 **lists,
                                 const uint64 **ids, const uint8 **codes, Tuplesortstate **sort);
/* the tuplesort's tuple descriptor and a begin for the leader's merge */
Tuplesortstate *GpuivfBeginEntrySort(int code_size, int work_mem_kb, SortCoordinate coordinate,
                                     TupleDesc *desc);
void        GpuivfEncoderEnd(GpuivfEncoder *enc);

/* ---------------------------------------------------- build_parallel.cpp */

typedef struct GpuivfParallelBuild GpuivfParallelBuild;

/* Workers for this build (plan_create_index_workers), 0 = serial. */
int         GpuivfBuildWorkers(Relation heap, Relation index);
/* The sampling scan with nworkers workers and the leader; false (nothing
 * done) when no worker could be launched: the caller scans alone. */
bool        GpuivfParallelSample(Relation heap, Relation index, IndexInfo *indexInfo, int nworkers,
                                 int dims, int64 k, gpuivf::Metric metric, double *reltuples,
                                 int64 *rows, float **sample, int64 *sample_n);
/* The training context: nworkers workers take part in the training of the
 * area (GpuivfTrainArea of `bytes`, in the context's shared memory, filled
 * by init(mem, arg) before they start; *participants: the launched workers
 * and the leader); NULL (nothing done) when no worker could be launched.
 * GpuivfParallelEnd once GpuivfTrainOnCpu is done. */
GpuivfParallelBuild *GpuivfParallelTrainBegin(Relation heap, Relation index, IndexInfo *indexInfo,
                                              int nworkers, Size bytes,
                                              GpuivfTrainArea *(*init) (void *mem, void *arg),
                                              void *arg, GpuivfTrainArea **area,
                                              int *participants);
/* The truth context likewise (a GpuivfTruthArea of `bytes`). */
GpuivfParallelBuild *GpuivfParallelTruthBegin(Relation heap, Relation index, bool isconcurrent,
                                              int nworkers, Size bytes,
                                              void (*init) (void *mem, void *arg), void *arg,
                                              int *participants);
/* The encoding scan likewise; on success the leader's merge of every
 * participant's entries is in *sort (sorted), its calibration sample holds
 * every participant's, and the counters are summed. */
typedef struct GpuivfParallelEncodeResult
{
    int         participants;
    double      reltuples;
    int64       encoded;
    double      engine_seconds; /* the leader's */
    bool        on_gpu;         /* some participant encoded on the GPU */
    BlockNumber last_vector_page;
    Tuplesortstate *sort;
    GpuivfParallelBuild *pb;    /* GpuivfParallelEnd after reading sort */
} GpuivfParallelEncodeResult;
bool        GpuivfParallelEncode(Relation heap, Relation index, IndexInfo *indexInfo, int nworkers,
                                 const GpuivfEncodeSpec *spec, const gpuivf::IvfPqModel &model,
                                 GpuivfCalibSample *calib, GpuivfParallelEncodeResult *result);
void        GpuivfParallelEnd(GpuivfParallelBuild *pb);

extern "C" {
PGDLLEXPORT void GpuivfParallelBuildMain(dsm_segment *seg, shm_toc *toc);
}

#endif                          /* GPUIVF_AM_BUILD_H */
