/*
 * search/search.h — answering kNN queries of one index.
 *
 * GpuivfSearchBatch (dispatch.cpp) is the seam between a scan (or a batched
 * kNN join) and the engines: it answers nq queries of one index, handing
 * them to the GPU worker when gpuivf.device allows and a worker is up
 * (worker/backend/search.cpp), else running the CPU engine in this backend
 * (cpu.cpp).  Both return the same rows.  How many lists a query probes is
 * decided in probes.cpp; the round-1 query of a scan and the round-1 offers
 * of the batched join are in round_one.cpp.
 */
#ifndef GPUIVF_SEARCH_H
#define GPUIVF_SEARCH_H

#include "gpuivf.h"

/* ------------------------------------------------------------ probes.cpp */

/* where a query's nprobe came from (EXPLAIN "Probes From") */
#define GPUIVF_PROBES_UNTRAINED 0   /* no lists: exact */
#define GPUIVF_PROBES_SETTING   1   /* gpuivf.probes */
#define GPUIVF_PROBES_AUTO      2   /* ceil(sqrt(lists)) */
#define GPUIVF_PROBES_CURVE     3   /* the curve tuned at ANALYZE */

/* where a query's re-rank depth came from (EXPLAIN "Re-rank Depth From") */
#define GPUIVF_DEPTH_DEFAULT    0   /* GPUIVF_DEFAULT_RERANK_DEPTH, or the one curve's */
#define GPUIVF_DEPTH_SETTING    1   /* gpuivf.rerank_candidates */
#define GPUIVF_DEPTH_CURVE      2   /* the cheapest measured depth meeting the target */

typedef struct GpuivfProbeChoice
{
    int         nprobe;         /* lists to probe: 0 untrained (exact), else 1..lists */
    int         source;         /* GPUIVF_PROBES_* */
    double      target;         /* the recall target in force (GpuivfTargetRecall) */
    int         target_source;  /* GPUIVF_TARGET_*: the index option or the setting */
    int         curve_nprobe;   /* the curve's choice for target; 0: no curve */
    bool        target_reached; /* the curve meets target at curve_nprobe */
    int         curve_depth;    /* the re-rank depth of the curves' choice */
    double      curve_recall;   /* its measured recall (not reached: the best) */
    int         depth;          /* re-rank depth: candidates for up to 10 rows
                                 * (GpuivfRerankCount(depth, k) for k rows) */
    int         depth_source;   /* GPUIVF_DEPTH_* */
} GpuivfProbeChoice;

/*
 * How many lists a query of index (meta: its metapage as the caller read
 * it) probes, and how deep it re-ranks: the one place that decides both.
 * Probes: gpuivf.probes when set (taken as it is); else the curves' choice
 * for the index's recall target (GpuivfTargetRecall: its target_recall
 * option, else gpuivf.target_recall; GpuivfCurveProbes: a target no curve
 * reaches gives the best point, and with notice a NOTICE once per backend
 * and calibration), else ceil(sqrt(lists)), either raised by
 * 1/sqrt(filter_sel) for a filter of selectivity filter_sel (1 = none);
 * always within [1, lists] (0 for an untrained index).  Depth:
 * gpuivf.rerank_candidates when set (taken as it is, and the curves read
 * are those of the deepest measured depth at or below it), else the depth
 * of the curves' choice, else GPUIVF_DEFAULT_RERANK_DEPTH.  k: rows the
 * query wants (0 = unknown: 10); its curve is GpuivfCurveProbes's.
 */
void        GpuivfChooseProbes(Relation index, const GpuivfMetaPageData *meta, int k,
                               double filter_sel, bool notice, GpuivfProbeChoice *choice);
/* The curves' choice for target at k rows (0 = unknown: 10), without side
 * effects: among the measured re-rank depths (depth > 0: only the deepest
 * at or below it, or the shallowest), the (depth, nprobe) of least
 * GpuivfSearchCost whose point meets target with 95% confidence (recall -
 * 1.645 standard errors >= target; *reached = true), else the point with
 * the best recall (*reached = false; on a tie the shallower depth, the
 * fewer probes); returns its nprobe, 0 when the metapage has no curve, its
 * depth in *curve_depth and its measured recall in *curve_recall.  Curves are
 * measured at a few k (calib_k: 1, 10, 100); a k between two of them reads
 * the lower of their two values at each point, a k above the largest reads
 * the largest's curve. */
int         GpuivfCurveProbes(const GpuivfMetaPageData *meta, int k, double target, int depth,
                              int *curve_depth, double *curve_recall, bool *reached);
/* The cost model of the choice: what a query of k rows probing nprobe
 * lists at a re-rank depth costs, in one unit (probes.cpp says why). */
double      GpuivfSearchCost(const GpuivfMetaPageData *meta, int k, int nprobe, int depth);
/* The name of a GPUIVF_PROBES_* source in EXPLAIN, or (json) in
 * gpuivf_index_info */
const char *GpuivfProbeSourceName(int source, bool json);
/* The same of a GPUIVF_DEPTH_* source */
const char *GpuivfDepthSourceName(int source, bool json);
/* Does a curve point (mean recall, standard error) meet target, with 95%
 * confidence?  The one rule of scans and of the calibration's sweep. */
bool        GpuivfCurvePointMeets(double recall, double se, double target);

/* -------------------------------------------- dispatch.cpp, round_one.cpp */
/* dispatch.cpp: hits[i] is palloc'd, sorted best first, nhits[i] <= k.
 * meta: the metapage as the caller read it in this statement (after its
 * snapshot was taken: a worker request carries its generation), or NULL to
 * read it here.  A scan passes the copy it started with, so a statement
 * reads the metapage once, not once per layer. */
void        GpuivfSearchBatch(Relation index, int nq, const GpuivfQuery *queries,
                              GpuivfHit **hits, int *nhits, GpuivfSearchStats *stats,
                              const GpuivfMetaPageData *meta);

/* dispatch.cpp: GpuivfWorkerSearch (worker/worker.h: same contract), the
 * ADC candidates of an index whose GPU copies hold only codes re-ranked
 * here (GpuivfRerankCandidates).  meta: as the caller read it (not NULL). */
bool        GpuivfSearchOnWorker(Relation index, int nq, const GpuivfQuery *queries,
                                 GpuivfHit **hits, int *nhits, GpuivfSearchStats *stats,
                                 const GpuivfMetaPageData *meta);
/* dispatch.cpp: gpuivf.device = gpu without a worker is an error */
void        GpuivfCheckDevice(void);

/* round_one.cpp: the round-1 query of a scan of index that needs `hint`
 * rows (0 = unknown) of which a fraction filter_sel (1 = no filter) passes
 * the scan's filter: nprobe and the re-rank depth from GpuivfChooseProbes
 * (into *choice, which may be NULL), k = hint (or the depth), rerank =
 * GpuivfRerankCount(depth, k) (no LIMIT: the depth) when the index re-ranks. */
void        GpuivfMakeQuery(Relation index, const GpuivfMetaPageData *meta, int64 hint,
                            double filter_sel, const float4 *vector, GpuivfQuery *query,
                            GpuivfProbeChoice *choice);
/* Rows to ask of round 1 when `rows` must pass a filter of selectivity sel
 * (1 = no filter) */
int64       GpuivfRowsForFilter(double rows, double sel);
/* Its inverse: the rows a query wants when round 1 asks `hint` behind a
 * filter of selectivity sel (the LIMIT whose recall the target is about) */
int         GpuivfRowsWanted(int64 hint, double sel);

/*
 * round_one.cpp: a round 1 computed ahead of time (the batched kNN join)
 * and offered to the next scan of that index; one offer per index (the
 * partitions of a partitioned table), until GpuivfClearOffer.  A scan takes
 * the offer of its index only when its own round-1 query is the same (vector
 * bytes, k, nprobe, rerank) and the version of the index's rows
 * (GpuivfReadRows) has not moved, i.e. when GpuivfSearchBatch would return
 * exactly these hits; otherwise it searches itself.
 */
void        GpuivfOfferRoundOne(Oid indexoid, uint64 version, const GpuivfQuery *query,
                                int dims, const GpuivfHit *hits, int nhits,
                                const GpuivfSearchStats *stats);
bool        GpuivfTakeRoundOne(Relation index, const GpuivfMetaPageData *meta,
                               const GpuivfQuery *query, int dims, GpuivfHit **hits, int *nhits,
                               GpuivfSearchStats *stats);
void        GpuivfClearOffer(void);
/* rerank.cpp: the exact re-rank on the host of the PQ candidates of n
 * queries: cand[i][0 .. ncand[i]) are entry ids (what list entries hold:
 * vector tuple TIDs, or heap TIDs when the index re-ranks from the table)
 * of query queries[which ? which[i] : i]; its hits
 * (heap TIDs, exact SQL distances, best first, a heap TID at most once, at
 * most k) go to hits[that query] in the caller's context, and *reranked
 * counts the candidates.  Candidates whose vector tuple (or every
 * version of whose row) is gone are skipped. */
void        GpuivfRerankCandidates(Relation index, const GpuivfMetaPageData *meta, int n,
                                   const GpuivfQuery *queries, const int *which,
                                   uint64 *const *cand, const int *ncand, MemoryContext caller,
                                   GpuivfHit **hits, int *nhits, int64 *reranked);

/* --------------------------------------------------------------- rows.cpp */

/*
 * The exact distance of a query to the index's rows (rows.cpp): the
 * engine's distance of the row's float4 values (halfvec: widened), or with
 * exact = true on a pgvector column, pgvector's ORDER BY operator itself
 * (exact scans equal a sequential scan ordered by it, bit for bit).
 */
typedef struct GpuivfRowDistance
{
    gpuivf::Metric metric;
    int         dims;
    int         storage;        /* GPUIVF_STORAGE_* of vector tuples */
    const float4 *query;        /* raw query values */
    float4     *widened;        /* dims floats: one tuple's halves, widened */
    GpuivfVectorType type;
    FmgrInfo   *op;             /* the ORDER BY operator's function, or NULL */
    Datum       query_datum;    /* the query as that operator takes it */
} GpuivfRowDistance;

/* One row of the index: its heap id and either its vector tuple (values in
 * the index) or its values (float4, from the table). */
typedef struct GpuivfRow
{
    uint64      heapid;
    const GpuivfVectorTuple *vt;
    const float4 *values;
} GpuivfRow;

void        GpuivfRowDistanceInit(GpuivfRowDistance *rd, Relation index,
                                  const GpuivfMetaPageData *meta, const float4 *query, bool exact);
double      GpuivfRowDistanceOf(GpuivfRowDistance *rd, const GpuivfRow *row);
/* a vector tuple's float4 values (halves widened into rd->widened) */
const float4 *GpuivfTupleValues(GpuivfRowDistance *rd, const GpuivfVectorTuple *vt);

/* Calls visit for every row of the index: each vector tuple (walking all
 * pages, bas may be NULL), or with re-rank from the table each row the
 * index names, read from the table in heap order. */
typedef void (*GpuivfRowVisitor) (void *arg, const GpuivfRow *row);
void        GpuivfForEachRow(Relation index, const GpuivfMetaPageData *meta,
                             BufferAccessStrategy bas, GpuivfRowVisitor visit, void *arg);

/* Rows read from the index's table by heap TID: the indexed column (or
 * expression) of the first version of the row, checked and as float4 (valid
 * until the next call); NULL when no version of the row is left. */
typedef struct GpuivfTableRows GpuivfTableRows;
GpuivfTableRows *GpuivfTableRowsBegin(Relation index, int dims);
const float4 *GpuivfTableRowValues(GpuivfTableRows *tr, uint64 heapid);
void        GpuivfTableRowsEnd(GpuivfTableRows *tr);
/* rd's distance to a table row; *found = false (and 0) when it is gone */
double      GpuivfTableRowDistance(GpuivfRowDistance *rd, GpuivfTableRows *tr, uint64 heapid,
                                   bool *found);

/* cpu.cpp: the CPU path of GpuivfSearchBatch (meta as there) */
void        GpuivfSearchBatchCpu(Relation index, int nq, const GpuivfQuery *queries,
                                 GpuivfHit **hits, int *nhits, GpuivfSearchStats *stats,
                                 const GpuivfMetaPageData *meta);

#endif                          /* GPUIVF_SEARCH_H */
