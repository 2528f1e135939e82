/*
 * am/am.h — the gpuivf access method: the IndexAmRoutine callbacks
 * (gpuivfhandler in gpuivf.cpp points at them), the scan's interface to the
 * planner integration, and the SQL functions on an index.
 */
#ifndef GPUIVF_AM_H
#define GPUIVF_AM_H

#include "gpuivf.h"
/* build.cpp: options resolved against the data (pq_m must divide dims) */
int         GpuivfResolvePqM(Relation index, int pq_m_option, int dims);
/* build.cpp */
IndexBuildResult *gpuivfbuild(Relation heap, Relation index, IndexInfo *indexInfo);
void        gpuivfbuildempty(Relation index);

/* insert.cpp */
bool        gpuivfinsert(Relation index, Datum *values, bool *isnull, ItemPointer heap_tid,
                         Relation heap, IndexUniqueCheck checkUnique, bool indexUnchanged,
                         IndexInfo *indexInfo);

/* scan.cpp */
IndexScanDesc gpuivfbeginscan(Relation index, int nkeys, int norderbys);
void        gpuivfrescan(IndexScanDesc scan, ScanKey keys, int nkeys, ScanKey orderbys, int norderbys);
bool        gpuivfgettuple(IndexScanDesc scan, ScanDirection dir);
void        gpuivfendscan(IndexScanDesc scan);

/* vacuum.cpp */
IndexBulkDeleteResult *gpuivfbulkdelete(IndexVacuumInfo *info, IndexBulkDeleteResult *stats,
                                        IndexBulkDeleteCallback callback, void *callback_state);
IndexBulkDeleteResult *gpuivfvacuumcleanup(IndexVacuumInfo *info, IndexBulkDeleteResult *stats);

/* cost.cpp */
void        gpuivfcostestimate(PlannerInfo *root, IndexPath *path, double loop_count,
                               Cost *indexStartupCost, Cost *indexTotalCost,
                               Selectivity *indexSelectivity, double *indexCorrelation,
                               double *indexPages);

/* validate.cpp */
bool        gpuivfvalidate(Oid opclassoid);

/* build.cpp: amphasename (the handler points amphasename here) */
char       *gpuivfbuildphasename(int64 phasenum);
/* info.cpp, verify.cpp (am/verify.h maps its files), calibrate.cpp: SQL
 * functions (the install script references them) */
extern "C" {
Datum       gpuivf_index_info(PG_FUNCTION_ARGS);
Datum       gpuivf_verify(PG_FUNCTION_ARGS);
Datum       gpuivf_calibrate(PG_FUNCTION_ARGS);
}
/* info.cpp: the index argument of an SQL function (gpuivf_index_info,
 * gpuivf_verify, gpuivf_worker_search).  GpuivfCheckIndexArg checks, before
 * any lock is taken, that relid is a gpuivf index (or partitioned index) and
 * that the caller may SELECT from its table, which it returns.
 * GpuivfOpenCheckedIndex then locks the table and the index (AccessShareLock,
 * in that order) and returns the index; *heap gets the table when asked.
 * GpuivfLockPartitionIndexes locks a partitioned index and its table and
 * returns the OIDs of its leaf indexes (one per partition). */
Oid         GpuivfCheckIndexArg(Oid relid, bool *partitioned);
Relation    GpuivfOpenCheckedIndex(Oid relid, Oid heapid, Relation *heap);
/* The same with the locks a caller that changes the index wants (the
 * table's heaplock first, then the index's) */
Relation    GpuivfOpenCheckedIndexLocked(Oid relid, Oid heapid, LOCKMODE heaplock,
                                         LOCKMODE indexlock, Relation *heap);
List       *GpuivfLockPartitionIndexes(Oid relid, Oid heapid);
/* -------------------------------------------------------------- scan */

/* the scan's state, private to scan*.cpp (am/scan.h) */
typedef struct GpuivfScanOpaqueData *GpuivfScanOpaque;
/* rows the scan's query needs (0 = unknown): round 1 keeps at least that
 * many candidates; set before rescan (the planner integration sets it from
 * the LIMIT, planner/knn_node.cpp) */
void        GpuivfScanSetLimitHint(IndexScanDesc scan, int64 rows);
/* scan.cpp: what the scans of one scan descriptor did, summed over
 * its rescans (EXPLAIN ANALYZE of the GpuivfKnn node) */
typedef struct GpuivfScanStats
{
    int64       scans;          /* (re)scans that searched */
    int64       k_sum;          /* rows asked of round 1 */
    int64       probes_sum;     /* nprobe of round 1 */
    int         probe_source;   /* GPUIVF_PROBES_* of the last scan */
    int         depth;          /* its re-rank depth; 0 = no re-rank */
    int         depth_source;   /* GPUIVF_DEPTH_* of it */
    double      target_recall;  /* the recall target of the last scan */
    int         target_source;  /* GPUIVF_TARGET_* of it */
    int64       exact;          /* scans answered exactly */
    int64       reranked;       /* candidates re-ranked exactly, all rounds */
    int64       on_gpu;         /* scans answered by the GPU worker */
    int64       batch_sum;      /* batch size the round 1 rode in */
    double      gpu_ms;
    double      queue_ms;
    int64       precomputed;    /* round 1 taken from a batched join */
    int64       deepened;       /* scans that went past round 1 */
    int64       lists_max;      /* most lists one scan visited */
} GpuivfScanStats;

const GpuivfScanStats *GpuivfScanGetStats(IndexScanDesc scan);
/* the limit hint the next scan descriptor of index gpuivf_pending_limit_index
 * takes (gpuivfbeginscan consumes it): set by the GpuivfKnn node around its
 * child's first call, when the child has no scan descriptor yet */
extern int64 gpuivf_pending_limit_hint;
extern double gpuivf_pending_filter_sel;
extern Oid  gpuivf_pending_limit_index;
/* scan.cpp: the selectivity of the filter above the scan (1 = none),
 * before the next rescan, with GpuivfScanSetLimitHint */
void        GpuivfScanSetFilterSelectivity(IndexScanDesc scan, double sel);
#endif                          /* GPUIVF_AM_H */
