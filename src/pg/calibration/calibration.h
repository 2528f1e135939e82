/*
 * calibration/calibration.h — ANALYZE calibration: the recall curves of an
 * index (recall@1, @10, @100 against nprobe) measured against exact results
 * and stored in the metapage, on the queries the index really answers when
 * it has recorded enough of them, else on a sample of its rows.
 *
 *   calibration.cpp choosing the queries, measuring, storing (GpuivfCalibrate)
 *   curve.cpp      measuring the curves (the sweep; sweep.h its state)
 *   curve_search.cpp  the sweep's points through GpuivfSearchBatch (the GPU
 *                  worker)
 *   sample.cpp     the rows of an index, the row sample, the ground truth
 *   recorded.cpp   the queries scans answer, recorded in shared memory;
 *                  noticing when they drift from the calibration's
 *   stored.cpp     the calibration's queries stored in the index's pages
 *   info.cpp       what gpuivf_index_info shows of a calibration
 * (gpuivf_calibrate, the SQL function calibrating on given queries, is in
 * am/calibrate.cpp with the other SQL functions on an index.)
 *
 * Scans read the curves through search/probes.cpp.
 */
#ifndef GPUIVF_CALIBRATION_H
#define GPUIVF_CALIBRATION_H

#include "gpuivf.h"
#define GPUIVF_DEFAULT_ANALYZE_SAMPLE 200
#define GPUIVF_MAX_ANALYZE_SAMPLE   10000

/* settings (recorded.cpp) */
extern int  gpuivf_query_sample;        /* gpuivf.query_sample, vectors per index; 0 = off */
extern int  gpuivf_query_sample_memory; /* gpuivf.query_sample_memory, kB (postmaster) */

/* The calibration's row sample: the index's rows (raw vector,
 * entry id, heap TID) chosen by a hash of the vector, whatever the order
 * the rows come in.  Calibration draws it by walking the rows; CREATE INDEX
 * draws it while its encoding scans hand the rows over, which saves
 * calibration that walk. */
typedef struct CalibSample GpuivfCalibSample;
GpuivfCalibSample *GpuivfCalibSampleBegin(int dims);   /* NULL when calibration is off */
void        GpuivfCalibSampleAdd(GpuivfCalibSample *sample, const float4 *x, uint64 id,
                                 uint64 heap_id);
/* A parallel build's participants each draw a sample of the rows they
 * scanned and flatten it into GpuivfCalibSampleBytes() bytes of shared
 * memory; the leader merges them into its own: the sample of all the rows. */
Size        GpuivfCalibSampleBytes(int dims);
void        GpuivfCalibSampleFlatten(GpuivfCalibSample *sample, void *dst);
void        GpuivfCalibSampleMerge(GpuivfCalibSample *sample, const void *src);

/*
 * Helpers a parallel build lends the calibration (am/build_truth.cpp):
 * run() computes what GpuivfExactKnnForCalibration does on the CPU from the
 * index's vector pages, shared out among the build's parallel workers and
 * the leader (GpuivfExactKnnPart by each, GpuivfExactKnnMerge); false when
 * it could not (no worker launched): the caller computes it alone.  After a
 * run that did, sweep() has the same processes measure a stage of the
 * sweep (GpuivfSweepPart by each; *hits: every query's hits, NULL when the
 * index was rebuilt), false when it cannot (the caller sweeps alone, every
 * stage); end() lets them go (always called).  *participants: the
 * processes that did, *swept: sweep() did.
 */
typedef struct GpuivfTruthHelpers
{
    bool        (*run) (struct GpuivfTruthHelpers *helpers, Relation index,
                        const GpuivfMetaPageData *meta, int nq, const float4 *queries,
                        const uint64 *exclude_ids, int k, uint64 *out_ids, float *out_scores);
    bool        (*sweep) (struct GpuivfTruthHelpers *helpers, int cmax, const uint32 *points,
                          int first, int last, int from, int **hits);
    void        (*end) (struct GpuivfTruthHelpers *helpers);
    void       *arg;
    int         participants;
    bool        swept;          /* sweep() measured the stages */
} GpuivfTruthHelpers;

/* ----------------------------------------------------- calibration.cpp */

/* Measure the curves of an index and store them in the metapage, on the
 * recorded and stored queries when there are gpuivf.analyze_sample of them
 * (or stored queries that were given), else on rows.  heap may be NULL
 * (opened when needed); drawn: the row sample, drawn over every row of the
 * index, or NULL (drawn here when needed); helpers: a parallel build's, or
 * NULL.  Returns false when nothing was stored (untrained, too few rows,
 * gpuivf.analyze_sample = 0, rebuilt meanwhile). */
bool        GpuivfCalibrate(Relation index, Relation heap, const GpuivfCalibSample *drawn,
                            GpuivfTruthHelpers *helpers);
/* The same on given queries (nq raw vectors of the index's dims; stored as
 * the index's calibration queries, source "given"), or with queries NULL on
 * rows, forgetting the stored queries. */
bool        GpuivfCalibrateOn(Relation index, Relation heap, const float4 *queries, int nq);
/* Would calibrating an index of meta's shape search through the GPU worker
 * (gpuivf.device not cpu, a worker up, every point within its limits)? */
bool        GpuivfCalibrationSearchesOnGpu(Relation index, const GpuivfMetaPageData *meta);
/* Should VACUUM (which hides a following ANALYZE from the AM) re-measure?
 * True when the index has no curve or its size changed by 10% or more. */
bool        GpuivfCalibrationIsStale(const GpuivfMetaPageData *meta);
/* "rows", "workload", "given" */
const char *GpuivfCalibSourceName(int source);
/* gpuivf_index_info's "calibration" and "recorded_queries" members */
void        GpuivfAppendCalibrationInfo(StringInfo json, Relation index,
                                        const GpuivfMetaPageData *meta);

/*
 * The re-rank depths of a stored calibration: curve set d (0 .. count - 1,
 * ascending depth; 0 without a curve) is at depth GpuivfCalibDepthAt(d),
 * its recall@calib_k[c] points at GpuivfCalibPoints(d, c).  An index
 * calibrated before depths were recorded has one set, at the depth its
 * candidate count says (GpuivfCalibDepthAt: calibration.cpp).
 */
static inline int
GpuivfCalibDepthCount(const GpuivfMetaPageData *meta)
{
    if (meta->calib_sample == 0 || meta->calib_npoints == 0)
        return 0;
    return 1 + (int) Min(meta->calib_deep_count, (uint32) GPUIVF_CALIB_DEEPER);
}
int         GpuivfCalibDepthAt(const GpuivfMetaPageData *meta, int d);
static inline const GpuivfRecallPoint *
GpuivfCalibPoints(const GpuivfMetaPageData *meta, int d, int c)
{
    return d == 0 ? meta->calib_recall[c] : meta->calib_deep_recall[d - 1][c];
}

/* ---------------------------------------------------------- sample.cpp */

/* The seam for ground truth: exact top-k (entry ids, ascending by score,
 * padded with UINT64_MAX) of nq raw queries among all rows of the index,
 * each query's own entry exclude_ids[i] left out (UINT64_MAX: none).  On the
 * GPU worker when one is up (gpuivf.device not cpu), else on the CPU: the
 * same result; on the CPU shared out by helpers (may be NULL) when the
 * index stores its vectors.  *on_gpu (may be NULL): the worker computed all
 * of it. */
void        GpuivfExactKnnForCalibration(Relation index, Relation heap,
                                         const GpuivfMetaPageData *meta, int nq,
                                         const float4 *queries, const uint64 *exclude_ids,
                                         int k, uint64 *out_ids, float *out_scores,
                                         bool *on_gpu, GpuivfTruthHelpers *helpers);
/* The parts of it: the vector pages in ranges of GPUIVF_TRUTH_RANGE_BLOCKS
 * (GpuivfTruthRanges of them, in an index of nblocks blocks); one process's
 * part is the k best (score, id) per query (nq x k into vals/ids, padded
 * with INFINITY/UINT64_MAX) of the rows of the ranges claim(claim_arg)
 * hands it (-1: no more); the merge of nparts parts is the whole result.
 * Scores and ties are ordered as TopK orders them, so the merge is
 * GpuivfExactKnnForCalibration's result bit for bit. */
#define GPUIVF_TRUTH_RANGE_BLOCKS 32
int64       GpuivfTruthRanges(BlockNumber nblocks);
/* the index's rows are in its vector pages (else in the heap: not shared) */
bool        GpuivfTruthCanShare(const GpuivfMetaPageData *meta);
void        GpuivfExactKnnPart(Relation index, const GpuivfMetaPageData *meta, BlockNumber nblocks,
                               int nq, const float4 *queries, const uint64 *exclude_ids, int k,
                               int64 (*claim) (void *claim_arg), void *claim_arg, float *vals,
                               uint64 *ids);
void        GpuivfExactKnnMerge(int nq, int k, int nparts, const float *vals, const uint64 *ids,
                                uint64 *out_ids, float *out_scores);

/* ----------------------------------------------------------- curve.cpp */

/* The k measured: recall@1, @10, @100 (the truth's k is the last). */
extern const int GpuivfCalibKs[GPUIVF_CURVE_KS];
/* Curves one sweep measures per point: every k at every depth (the hits of
 * a sweep stage have this many slots per point, depth-major). */
#define GPUIVF_CALIB_CURVES (GPUIVF_CURVE_KS * GPUIVF_CALIB_DEPTHS)
/* Candidates per query the sweep keeps for any k up to K. */
int         GpuivfSweepCandidates(const GpuivfMetaPageData *meta, int K);
/* One process's part of a sweep stage: the queries claim() hands it (-1:
 * no more), each continued from position `from` of its probe order up to
 * points[last] with its candidates (cand_vals/cand_ids: cmax per query,
 * cand_sizes: how many are kept), its hits at points first..last into
 * hits[q * (last - first + 1) * GPUIVF_CURVE_KS + (j - first) *
 * GPUIVF_CURVE_KS + c]; truth: nq x GpuivfCalibKs[last] entry ids.  False
 * when the index was rebuilt meanwhile. */
bool        GpuivfSweepPart(Relation index, const GpuivfMetaPageData *meta, int nq,
                            const float4 *queries, const uint64 *self_ids, const uint64 *truth,
                            const int *ks, int nk, const uint32 *points, int first, int last,
                            int from, int cmax, float *cand_vals, uint64 *cand_ids,
                            int32 *cand_sizes, int *hits, int64 (*claim) (void *claim_arg),
                            void *claim_arg);

/* -------------------------------------------------------- recorded.cpp */

/* _PG_init: the settings; with shared_preload_libraries the shared memory */
void        GpuivfRecordedInit(void);
/* A scan offers the query it answers (raw vector of dims floats) to the
 * index's reservoir; meta: the scan's metapage copy (drift detection). */
void        GpuivfRecordQuery(Relation index, const GpuivfMetaPageData *meta, const float4 *x,
                              int dims);
/* Up to max recorded queries (palloc'd *out), a random subset when there
 * are more; *ticket for GpuivfRecordedConsumed.  0 without any. */
int         GpuivfRecordedTake(Relation index, int dims, int max, float4 **out, uint64 *ticket);
/* A calibration stored what was taken: the reservoir starts again. */
void        GpuivfRecordedConsumed(uint64 ticket);
typedef struct GpuivfRecordedInfo
{
    bool        available;      /* recording possible (preloaded) */
    int         capacity;       /* slots of the index's reservoir */
    uint64      seen;           /* queries offered since it started */
    int         held;           /* queries in it with a known distance */
    double      nn_mean;        /* their mean distance to the nearest list centre */
    uint32      drift_said;     /* calib_id + 1 of the calibration drift was said for */
} GpuivfRecordedInfo;
bool        GpuivfRecordedStats(Relation index, int dims, GpuivfRecordedInfo *info);
/* L2 distance of a raw vector to its nearest list centre; NaN untrained */
float       GpuivfNearestCentreDistance(Relation index, const float4 *x, int dims);

/* ---------------------------------------------------------- stored.cpp */

/* The index's stored calibration queries (palloc'd, *nq of meta->dims
 * floats), or NULL. */
float4     *GpuivfReadStoredQueries(Relation index, const GpuivfMetaPageData *meta, int *nq);
/* How many of nq queries of dims floats a stored set keeps (a byte bound). */
int         GpuivfCalibStoredCap(int nq, int dims);
/* Store calib (its calib_* fields) with queries (NULL: none) as the current
 * set; false when the index was rebuilt since train_id. */
bool        GpuivfStoreCalibration(Relation index, uint64 train_id, GpuivfMetaPageData *calib,
                                   const float4 *queries, int nq, int dims);

/* gpuivf_verify: the two chains against the metapage; NULL, or what is
 * wrong (palloc'd).  Claims their blocks in role[] (0 = unclaimed). */
char       *GpuivfCheckCalibChains(Relation index, const GpuivfMetaPageData *meta,
                                   BlockNumber nblocks, uint8 *role, uint8 calib_role);

#endif                          /* GPUIVF_CALIBRATION_H */
