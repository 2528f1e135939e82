/*
 * planner/planner.h — the planner integration: the LIMIT reaches gpuivf scans,
 * LATERAL kNN joins run as batched searches, EXPLAIN shows what the engine did.
 *
 * PostgreSQL never passes a LIMIT to an index AM, and a nested loop runs its
 * inner index scan once per outer row.  After planning (planner_hook; and at
 * ExecutorStart for a plan made before this library was loaded) the finished
 * plan tree is rewritten:
 *
 *  GpuivfKnn       a custom scan put above every Index Scan on a gpuivf
 *                  index.  It passes the rows through unchanged.  When the
 *                  scan sits under a Limit (through Result / SubqueryScan
 *                  nodes without quals) it evaluates the Limit's count and
 *                  offset (copies of its expressions, non-volatile only) at
 *                  each (re)scan and hands count + offset — divided by the
 *                  planner's selectivity of the scan's filter, if any — to
 *                  the scan as its limit hint: round 1 asks the engine for
 *                  that many rows.  Its EXPLAIN shows probes, rows asked,
 *                  re-ranked candidates, device, batch size and GPU time.
 *  GpuivfBatchKnn  a custom scan put between a Nested Loop and its outer
 *                  child when the inner side is Limit -> GpuivfKnn -> Index
 *                  Scan ordered by a value computed from the loop's
 *                  parameters (a LATERAL kNN subquery), or Limit -> (Merge)
 *                  Append of such scans (a partitioned table, without
 *                  run-time partition pruning).  It reads outer rows
 *                  ahead in chunks (up to GPUIVF_BATCH_MAX rows), computes
 *                  each row's query vector and LIMIT exactly as the inner
 *                  side will, answers all of them with one GpuivfSearchBatch
 *                  call per index, then returns the outer rows one by one,
 *                  offering each row's round 1 on every index to the inner
 *                  scans (GpuivfOfferRoundOne).
 *                  The inner plan still runs as before; its scan takes the
 *                  offer only when its own query is byte for byte the same
 *                  (search/round_one.cpp), so the join returns what the nested
 *                  loop returns, rows and order, whatever else the inner
 *                  side does (filters, invisible rows, deeper rounds).
 *
 * Both nodes are parallel safe when their child is (they keep no shared
 * state; in a parallel worker each process batches its own outer rows) and
 * never parallel aware.  gpuivf.enable_batch_join = off at planning time
 * leaves nested loops alone.
 *
 * A kNN LIMIT over a partitioned table of postgres_fdw foreign tables
 * (shards) is appended to each shard's remote query, and a Merge Append of
 * those shards becomes a Sort over an Append that asks them at once
 * (remote_limit.cpp: where PostgreSQL stops and why).
 *
 * Files: rewrite.cpp (the hooks and the plan rewrite), knn_node.cpp
 * (GpuivfKnn, and the limit hints both nodes compute), batch_node.cpp
 * (GpuivfBatchKnn), remote_limit.cpp (the LIMIT to postgres_fdw shards).
 * Only GpuivfPlannerInit is called from outside.
 */
#ifndef GPUIVF_PLANNER_H
#define GPUIVF_PLANNER_H

#include "gpuivf.h"

/* rewrite.cpp: planner/executor hooks and the custom scan nodes,
 * installed by _PG_init */
void        GpuivfPlannerInit(void);

/* ------------------------------------------- private to planner/ */

/* outer rows read ahead per batched search at most */
#define GPUIVF_BATCH_MAX        10000
/* the first chunk when the planner expects few outer rows */
#define GPUIVF_BATCH_MIN        64

#define GPUIVF_KNN_NAME         "GpuivfKnn"
#define GPUIVF_BATCH_NAME       "GpuivfBatchKnn"

/* custom_private of GpuivfKnn (an IntList) */
#define KNN_INDEXOID            0
#define KNN_HAS_LIMIT           1
#define KNN_WITH_TIES           2
#define KNN_FILTER_PPM          3   /* filter selectivity, parts per million */
/* custom_exprs of GpuivfKnn: limitCount, limitOffset (either may be NULL) */

/* custom_private of GpuivfBatchKnn: with_ties, the number n of indexes the
 * inner side scans (one per partition of a partitioned table), n (indexoid,
 * filter_ppm) pairs, then (paramno, outer attno) pairs of the nested loop's
 * parameters */
#define BATCH_WITH_TIES         0
#define BATCH_NINDEXES          1
#define BATCH_INDEXES           2
/* custom_exprs of GpuivfBatchKnn: query vector expression, limitCount,
 * limitOffset */

/* PostgreSQL's list_makeN and copyObject macros use C-only syntax */
#define CopyNode(x)     ((__typeof__(x)) copyObjectImpl(x))
typedef bool (*TreeWalker) ();
#define WALKER(fn)      ((TreeWalker) (void (*) (void)) (fn))

/* rewrite.cpp: the plan methods of the two custom scans */
extern const CustomScanMethods knn_plan_methods;
extern const CustomScanMethods batch_plan_methods;

/* knn_node.cpp, batch_node.cpp: their executor states */
Node       *KnnCreateState(CustomScan *cscan);
Node       *BatchCreateState(CustomScan *cscan);

/* knn_node.cpp: rows a scan under a Limit needs: count + offset (+1 WITH
 * TIES), raised for the selectivity of its filter; 0 = unknown (no count) */
int64       HintFromLimit(bool has_count, int64 count, int64 offset, bool with_ties,
                          int filter_ppm);
/* knn_node.cpp: evaluates the LIMIT count and OFFSET expressions: false when
 * there is no count (LIMIT NULL / ALL) */
bool        EvalLimit(ExprState *count_state, ExprState *offset_state, ExprContext *econtext,
                      int64 *count, int64 *offset);
/* remote_limit.cpp: sends a Limit's count + offset to the postgres_fdw
 * shards below it and asks them at once (true: the plan changed); whether
 * it would change anything */
bool        GpuivfPushLimitToShards(Limit *limit, List *rtable, int *next_node_id);
bool        GpuivfRemoteLimitPending(Limit *limit);

/* knn_node.cpp: "CPU", "GPU" or "GPU and CPU" for n scans of which on_gpu
 * ran on the GPU (EXPLAIN) */
const char *DeviceName(int64 on_gpu, int64 n);

#endif                          /* GPUIVF_PLANNER_H */
