/*
 * gpuivf.h — the map of the PostgreSQL side of gpuivf.
 *
 * Everything here includes postgres.h; nothing here includes a CUDA header.
 * The CPU engine (src/core/gpuivf_core.h) is called through plain pointers
 * and Status values: no C++ object with a destructor is ever alive across a
 * call that can ereport(), and no C++ exception can reach a PostgreSQL frame
 * (this directory is built with -fno-exceptions, the engine is noexcept).
 *
 * Sections: constants; settings; page layout; relation options; module
 * and access-method entry points, SQL functions; index state and input
 * checks; WAL-logged page changes; scan; ANALYZE calibration;
 * search dispatch; GPU worker; planner integration.
 *
 * Design, page layouts, locking and WAL: README.md next to this file.
 */
#ifndef GPUIVF_H
#define GPUIVF_H

/*
 * PostgreSQL's headers are C without extern "C"
 * guards: included plainly from C++ they declare every PostgreSQL function
 * with C++ linkage, gpuivf.so then references mangled names (_Z10LockBufferii)
 * and cannot be loaded.  So every PostgreSQL header that src/pg uses is
 * included here, inside one extern "C" block, and every .cpp file includes
 * gpuivf.h first; a later #include of one of these headers is a no-op (include
 * guards).  A header that is not in this list must be added here, not
 * included elsewhere: `make` fails on mangled PostgreSQL symbols
 * (check-c-linkage in the Makefile).  The C and C++ standard headers that
 * PostgreSQL's headers pull in are included first, outside the block, so that
 * no C++ template ends up with C linkage.
 */
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" {
#include "postgres.h"

#include "access/amapi.h"
#include "access/amvalidate.h"
#include "access/generic_xlog.h"
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/itup.h"
#include "access/relation.h"
#include "access/relscan.h"
#include "access/reloptions.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xloginsert.h"
#include "catalog/index.h"
#include "catalog/pg_amop.h"
#include "catalog/pg_amproc.h"
#include "catalog/pg_class.h"
#include "catalog/pg_opclass.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_opfamily.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "commands/explain.h"
#include "commands/progress.h"
#include "commands/vacuum.h"
#include "common/hashfn.h"
#include "common/pg_prng.h"
#include "executor/executor.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/execnodes.h"
#include "nodes/extensible.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/cost.h"
#include "optimizer/optimizer.h"
#include "optimizer/plancat.h"
#include "optimizer/planner.h"
#include "portability/instr_time.h"
#include "pgstat.h"
#include "storage/bufmgr.h"
#include "storage/bufpage.h"
#include "storage/freespace.h"
#include "storage/indexfsm.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/backend_progress.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/resowner.h"
#include "utils/selfuncs.h"
#include "utils/snapmgr.h"
#include "utils/spccache.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/tuplesort.h"
#include "utils/tuplestore.h"
/* the GPU worker: bgworker, shared memory, latches */
#include "funcapi.h"
#include "port/atomics.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/dsm.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/relfilenode.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "tcop/tcopprot.h"
#include "utils/backend_status.h"
#include "utils/hsearch.h"
#include "utils/wait_event.h"
}

#include "../core/gpuivf_core.h"

/* --------------------------------------------------------- constants */

#define GPUIVF_MAGIC            0x47504956  /* "GPIV" */
#define GPUIVF_FORMAT_VERSION   1
#define GPUIVF_PAGE_ID          0xFF91      /* last 2 bytes of special space */

#define GPUIVF_METAPAGE_BLKNO   0

/* page types (GpuivfPageOpaqueData.page_type) */
#define GPUIVF_PAGE_META        1
#define GPUIVF_PAGE_CENTROIDS   2   /* raw float4 array */
#define GPUIVF_PAGE_CODEBOOK    3   /* raw float4 array */
#define GPUIVF_PAGE_DIRECTORY   4   /* raw GpuivfListDirEntry array */
#define GPUIVF_PAGE_LIST        5   /* items: GpuivfListEntry */
#define GPUIVF_PAGE_VECTOR      6   /* items: GpuivfVectorTuple */

/* metapage flags */
#define GPUIVF_META_TRAINED     0x0001  /* lists, centroids, codebooks exist */
#define GPUIVF_META_RERANK      0x0002  /* full vectors are stored */

/* operator strategy and support procedure numbers */
#define GPUIVF_DISTANCE_STRATEGY    1   /* the ORDER BY operator */
#define GPUIVF_DISTANCE_PROC        1   /* (real[], real[]) -> float8 */
#define GPUIVF_NPROC                1

/* defaults and bounds of the index options */
#define GPUIVF_DEFAULT_PQ_BITS      8
#define GPUIVF_DEFAULT_RERANK       true

/* Build phases reported in pg_stat_progress_create_index.subphase
 * (1 is PostgreSQL's PROGRESS_CREATEIDX_SUBPHASE_INITIALIZE). */
#define GPUIVF_PHASE_SAMPLE     2   /* "sampling table" */
#define GPUIVF_PHASE_KMEANS     3   /* "training coarse quantizer" */
#define GPUIVF_PHASE_PQ         4   /* "training product quantizer" */
#define GPUIVF_PHASE_ENCODE     5   /* "encoding vectors" */
#define GPUIVF_PHASE_WRITE      6   /* "writing lists" */

/* ---------------------------------------------------------- settings */

/* defined in gpuivf.cpp unless noted */
#define GPUIVF_DEVICE_AUTO  0
#define GPUIVF_DEVICE_CPU   1
#define GPUIVF_DEVICE_GPU   2

extern int  gpuivf_probes;              /* gpuivf.probes, 0 = automatic */
extern int  gpuivf_rerank_candidates;   /* gpuivf.rerank_candidates */
extern int  gpuivf_device;              /* gpuivf.device */

/* ANALYZE calibration */
extern double gpuivf_target_recall;     /* gpuivf.target_recall, 0..1 */
extern int  gpuivf_analyze_sample;      /* gpuivf.analyze_sample, queries; 0 = off */

/* planner integration */
extern bool gpuivf_enable_batch_join;   /* gpuivf.enable_batch_join */
extern int  gpuivf_max_probes;          /* gpuivf.max_probes, 0 = no bound */

/* GPU worker (defined in gpuivfworker.cpp) */
extern char *gpuivf_devices;            /* gpuivf.devices: "" = all visible */
extern int  gpuivf_batch_delay;         /* gpuivf.batch_delay, microseconds */
extern int  gpuivf_gpu_memory_limit;    /* gpuivf.gpu_memory_limit, kB, 0 = automatic */
extern int  gpuivf_worker_timeout;      /* gpuivf.worker_timeout, ms, 0 = none */
extern int  gpuivf_request_buffer;      /* gpuivf.request_buffer, kB per backend */

/* ------------------------------------------------------- page layout */

/* Special space of every page. */
typedef struct GpuivfPageOpaqueData
{
    BlockNumber nextblkno;      /* next page of this chain, or InvalidBlockNumber */
    uint16      page_type;      /* GPUIVF_PAGE_* */
    uint16      page_id;        /* GPUIVF_PAGE_ID, for tools like pageinspect */
} GpuivfPageOpaqueData;
typedef GpuivfPageOpaqueData *GpuivfPageOpaque;

#define GpuivfPageGetOpaque(page) \
    ((GpuivfPageOpaque) PageGetSpecialPointer(page))

/* One measured point of the recall curve. */
#define GPUIVF_CURVE_POINTS     64
typedef struct GpuivfCurvePoint
{
    uint32      nprobe;         /* lists probed */
    float4      recall;         /* mean recall@calib_k over the sample */
    float4      recall_se;      /* standard error of that mean */
} GpuivfCurvePoint;

/* Metapage contents, right after the page header. */
typedef struct GpuivfMetaPageData
{
    uint32      magic;
    uint32      version;
    uint32      dims;
    uint16      metric;         /* gpuivf::Metric */
    uint16      flags;          /* GPUIVF_META_* */
    uint32      lists;          /* 0 while untrained */
    uint16      pq_m;
    uint16      pq_bits;
    uint16      code_size;      /* bytes of one PQ code */
    uint16      reserved;
    uint64      generation;     /* changes with every change of contents */
    uint64      train_id;       /* identifies centroids + codebooks; caches key on it */
    uint64      vectors;        /* live entries */
    BlockNumber centroid_start;
    uint32      centroid_pages;
    BlockNumber codebook_start;
    uint32      codebook_pages;
    BlockNumber directory_start;
    uint32      directory_pages;
    BlockNumber vector_insert_page; /* last vector page appended to */

    /*
     * The recall curve measured by ANALYZE / CREATE INDEX: recall@calib_k
     * against exact results for nprobe values in ascending order.  All zero until the first calibration (an index
     * written before these fields existed reads as "no curve": the page
     * beyond pd_lower is zero).  Written only by GpuivfLogCalibration.
     */
    uint32      calib_sample;   /* queries measured */
    uint64      calib_vectors;  /* live entries when measured */
    int64       calib_time;     /* TimestampTz of the measurement */
    uint16      calib_k;        /* recall@k; 0 = no curve */
    uint16      calib_npoints;  /* points in calib_curve */
    uint32      calib_rerank;   /* candidates re-ranked exactly per query; 0 = no re-rank */
    GpuivfCurvePoint calib_curve[GPUIVF_CURVE_POINTS];
} GpuivfMetaPageData;
typedef GpuivfMetaPageData *GpuivfMetaPage;

#define GpuivfPageGetMeta(page) ((GpuivfMetaPage) PageGetContents(page))

/* One slot of the list directory: where list i lives. */
typedef struct GpuivfListDirEntry
{
    BlockNumber head;           /* first page of the chain, or InvalidBlockNumber */
    BlockNumber tail;           /* last page of the chain */
    BlockNumber insert_page;    /* first page that may have room */
    uint32      count;          /* live entries */
} GpuivfListDirEntry;

/*
 * An entry of a list page: the location of the row and its PQ code.  tid is
 * the vector tuple's location when the index stores full vectors (rerank),
 * else the heap TID.
 */
typedef struct GpuivfListEntry
{
    ItemPointerData tid;
    uint8       code[FLEXIBLE_ARRAY_MEMBER];
} GpuivfListEntry;

#define GPUIVF_LIST_ENTRY_SIZE(code_size) \
    MAXALIGN(offsetof(GpuivfListEntry, code) + (code_size))

/* A full vector (vector pages): the heap row it belongs to and its values. */
typedef struct GpuivfVectorTuple
{
    ItemPointerData heaptid;
    uint16      unused;
    float4      x[FLEXIBLE_ARRAY_MEMBER];
} GpuivfVectorTuple;

#define GPUIVF_VECTOR_TUPLE_SIZE(dims) \
    MAXALIGN(offsetof(GpuivfVectorTuple, x) + sizeof(float4) * (dims))

/* Bytes usable for raw arrays on one page. */
#define GPUIVF_PAGE_CAPACITY \
    (BLCKSZ - MAXALIGN(SizeOfPageHeaderData) - MAXALIGN(sizeof(GpuivfPageOpaqueData)))
#define GPUIVF_FLOATS_PER_PAGE      (GPUIVF_PAGE_CAPACITY / sizeof(float4))
#define GPUIVF_DIR_ENTRIES_PER_PAGE (GPUIVF_PAGE_CAPACITY / sizeof(GpuivfListDirEntry))

/* Pack an ItemPointer into an engine id and back. */
static inline uint64
GpuivfTidToId(ItemPointer tid)
{
    return ((uint64) ItemPointerGetBlockNumberNoCheck(tid) << 16) |
        ItemPointerGetOffsetNumberNoCheck(tid);
}
static inline void
GpuivfIdToTid(uint64 id, ItemPointer tid)
{
    ItemPointerSet(tid, (BlockNumber) (id >> 16), (OffsetNumber) (id & 0xFFFF));
}

/* Is this page initialized and of the given GPUIVF_PAGE_* type?  All-zero
 * pages (left by an extension that crashed before its WAL record) are not. */
static inline bool
GpuivfPageIsType(Page page, uint16 page_type)
{
    return !PageIsNew(page) &&
        PageGetSpecialSize(page) == MAXALIGN(sizeof(GpuivfPageOpaqueData)) &&
        GpuivfPageGetOpaque(page)->page_id == GPUIVF_PAGE_ID &&
        GpuivfPageGetOpaque(page)->page_type == page_type;
}

static inline bool
GpuivfMetaIsTrained(const GpuivfMetaPageData *meta)
{
    return (meta->flags & GPUIVF_META_TRAINED) != 0;
}

/* Does a row live as a vector tuple (always when untrained, else with rerank)? */
static inline bool
GpuivfMetaStoresVectors(const GpuivfMetaPageData *meta)
{
    return !GpuivfMetaIsTrained(meta) || (meta->flags & GPUIVF_META_RERANK) != 0;
}

/* -------------------------------------------------- relation options */

typedef struct GpuivfOptions
{
    int32       vl_len_;        /* varlena header (do not touch directly!) */
    int         lists;          /* 0 = automatic */
    int         pq_m;           /* 0 = automatic */
    int         pq_bits;        /* 4 or 8 */
    bool        rerank;
} GpuivfOptions;

/* gpuivf.cpp: handler, _PG_init, settings, reloptions */
bytea      *gpuivfoptions(Datum reloptions, bool validate);
GpuivfOptions *GpuivfGetOptions(Relation index);

/* gpuivfbuild.cpp: options resolved against the data (pq_m must divide dims) */
int         GpuivfResolvePqM(Relation index, int pq_m_option, int dims);

/* ------------------------------------------------------ entry points */

/* gpuivf.cpp: the handler and module entry points */
extern "C" {
void        _PG_init(void);
Datum       gpuivfhandler(PG_FUNCTION_ARGS);
}

/* gpuivfbuild.cpp */
IndexBuildResult *gpuivfbuild(Relation heap, Relation index, IndexInfo *indexInfo);
void        gpuivfbuildempty(Relation index);

/* gpuivfinsert.cpp */
bool        gpuivfinsert(Relation index, Datum *values, bool *isnull, ItemPointer heap_tid,
                         Relation heap, IndexUniqueCheck checkUnique, bool indexUnchanged,
                         IndexInfo *indexInfo);

/* gpuivfscan.cpp */
IndexScanDesc gpuivfbeginscan(Relation index, int nkeys, int norderbys);
void        gpuivfrescan(IndexScanDesc scan, ScanKey keys, int nkeys, ScanKey orderbys, int norderbys);
bool        gpuivfgettuple(IndexScanDesc scan, ScanDirection dir);
void        gpuivfendscan(IndexScanDesc scan);

/* gpuivfvacuum.cpp */
IndexBulkDeleteResult *gpuivfbulkdelete(IndexVacuumInfo *info, IndexBulkDeleteResult *stats,
                                        IndexBulkDeleteCallback callback, void *callback_state);
IndexBulkDeleteResult *gpuivfvacuumcleanup(IndexVacuumInfo *info, IndexBulkDeleteResult *stats);

/* gpuivfcost.cpp */
void        gpuivfcostestimate(PlannerInfo *root, IndexPath *path, double loop_count,
                               Cost *indexStartupCost, Cost *indexTotalCost,
                               Selectivity *indexSelectivity, double *indexCorrelation,
                               double *indexPages);

/* gpuivfvalidate.cpp */
bool        gpuivfvalidate(Oid opclassoid);

/* gpuivfbuild.cpp: amphasename (the handler points amphasename here) */
char       *gpuivfbuildphasename(int64 phasenum);

/* gpuivfvector.cpp: the SQL distance functions on real[].  The opclasses
 * name them as support function 1, and GpuivfGetMetric() recognises the
 * metric of an index by comparing fn_addr with these symbols. */
extern "C" {
Datum       gpuivf_l2_distance(PG_FUNCTION_ARGS);
Datum       gpuivf_inner_product(PG_FUNCTION_ARGS);
Datum       gpuivf_negative_inner_product(PG_FUNCTION_ARGS);
Datum       gpuivf_cosine_distance(PG_FUNCTION_ARGS);
}

/* gpuivffuncs.cpp: SQL functions (the install script references them) */
extern "C" {
Datum       gpuivf_index_info(PG_FUNCTION_ARGS);
Datum       gpuivf_verify(PG_FUNCTION_ARGS);
}

/* -------------------------------------- index state and input checks */

/*
 * What a backend keeps of an index between scans (rd_amcache): the metapage
 * fields and the trained model, valid while train_id matches the metapage.
 */
typedef struct GpuivfIndexState
{
    GpuivfMetaPageData meta;
    float      *centroids;      /* lists * dims */
    float      *centroid_norms; /* lists */
    float      *codebook;       /* pq_m * 2^pq_bits * (dims / pq_m) */
    gpuivf::IvfPqModel model;   /* views of the arrays above */
} GpuivfIndexState;

/* gpuivfmeta.cpp: metapage and the per-backend model cache */
void        GpuivfReadMeta(Relation index, GpuivfMetaPageData *meta);
/* *meta = *given (a copy the caller read earlier in this statement), or read
 * here when given is NULL */
void        GpuivfGivenOrReadMeta(Relation index, const GpuivfMetaPageData *given,
                                  GpuivfMetaPageData *meta);
void        GpuivfCheckFormat(Relation index, const GpuivfMetaPageData *meta);
/* The returned state lives in rd_amcache, which a relcache invalidation frees:
 * call it again at every amgettuple/aminsert, never keep the pointer across
 * calls.  meta is re-read from the metapage on every call. */
GpuivfIndexState *GpuivfGetIndexState(Relation index);

/* gpuivfmeta.cpp */
void        GpuivfCheckMaxDims(int dims);   /* 54000 above gpuivf::kMaxDims */
const char *GpuivfMetricName(int metric);

/* gpuivfutils.cpp: metric of an index, vector input checks, engine status */
gpuivf::Metric GpuivfGetMetric(Relation index);
float4     *GpuivfDatumGetVector(Datum value, int *dims);    /* validated, detoasted copy */
const float4 *GpuivfRowVector(Datum *values, bool *isnull, MemoryContext rowctx, int *dims);
                                                            /* values[0] in rowctx, NULL if null */
void        GpuivfCheckDims(int expected, int actual);
void        GpuivfRaiseStatus(const gpuivf::Status &status);
bool        GpuivfShouldCancel(void *arg);                   /* CancelHook, never longjmps */
bool        GpuivfSortedIdsContain(const uint64 *ids, int64 n, uint64 id);  /* binary search */
int64       GpuivfReservoirSlot(pg_prng_state *prng, int64 held, int64 cap, int64 seen);
void        GpuivfAddSeconds(double *seconds, instr_time *since);  /* since: now */

/* gpuivfutils.cpp: checks a detoasted real[] (element type, NULLs, shape,
 * empty, NaN, infinity) and returns a pointer to its float4 values inside the
 * array; no dimension limit (GpuivfDatumGetVector adds the index limit). */
const float4 *GpuivfArrayGetValues(ArrayType *array, int *dims);

/* ------------------------------------------- WAL-logged page changes */

/* gpuivfpage.cpp: the only code that changes pages under WAL */
Buffer      GpuivfNewBuffer(Relation index, ForkNumber forknum);
void        GpuivfInitPage(Page page, uint16 page_type);
void        GpuivfInitRegisterPage(GenericXLogState *state, Buffer buf, uint16 page_type, Page *page);
void        GpuivfWriteRawPages(Relation index, ForkNumber forknum, uint16 page_type,
                                const void *data, Size bytes, BlockNumber *start, uint32 *npages);
void        GpuivfReadRawPages(Relation index, BlockNumber start, uint32 npages, uint16 page_type,
                               void *data, Size bytes);
GpuivfListDirEntry GpuivfReadDirEntry(Relation index, const GpuivfMetaPageData *meta, int list);
void        GpuivfBumpMeta(GenericXLogState *state, Buffer metabuf, int64 vectors_delta);

/* gpuivfpage.cpp: build-time page writer (no WAL; the build logs every page
 * with log_newpage_range at the end).  Appends pages to a fork in order,
 * growing the fork by chunks of GPUIVF_WRITER_CHUNK_MIN..MAX pages. */
#define GPUIVF_WRITER_CHUNK_MIN     1
#define GPUIVF_WRITER_CHUNK_MAX     1024
typedef struct GpuivfPageWriter
{
    Relation    index;
    ForkNumber  forknum;
    uint16      page_type;
    bool        chained;        /* link each new page from the previous one */
    Buffer      buf;            /* current page, locked, or InvalidBuffer */
    BlockNumber blkno;          /* current page, kept across pauses */
    BlockNumber chain_head;     /* first page since the last NewChain */
    uint32      pages;          /* pages appended by this writer */
    BlockNumber reserve_next;   /* pages [reserve_next, reserve_end) were */
    BlockNumber reserve_end;    /* added to the fork for this writer, unused */
} GpuivfPageWriter;

void        GpuivfWriterInit(GpuivfPageWriter *w, Relation index, ForkNumber forknum,
                             uint16 page_type, bool chained);
void        GpuivfWriterNewChain(GpuivfPageWriter *w);
void        GpuivfWriterAdd(GpuivfPageWriter *w, const void *item, Size size, ItemPointer tid);
void        GpuivfWriterPause(GpuivfPageWriter *w);   /* unlock before long engine work */
void        GpuivfWriterFinish(GpuivfPageWriter *w);  /* unused pages to the FSM */
void        GpuivfBuildPutMeta(Relation index, ForkNumber forknum, const GpuivfMetaPageData *meta);
void        GpuivfBuildLogPages(Relation index, ForkNumber forknum);

/* gpuivfpage.cpp: one insert, one GenericXLog record (at most 4 buffers). */
typedef struct GpuivfInsertPlan
{
    Buffer      vecbuf;         /* vector page, or InvalidBuffer: no vector tuple */
    bool        vec_init;       /* vecbuf is new (or all-zero): initialize it */
    const float4 *vector;       /* raw vector, dims values */
    uint32      dims;
    ItemPointerData heaptid;
    Buffer      listbuf;        /* list page, or InvalidBuffer: untrained */
    const uint8 *code;          /* code_size bytes */
    uint16      code_size;
    Buffer      dirbuf;         /* directory page holding the list's entry */
    int         list;
    BlockNumber new_insert_page;    /* or InvalidBlockNumber: keep */
    Buffer      metabuf;
    bool        set_dims;       /* first row of an untrained index fixes dims */
} GpuivfInsertPlan;

void        GpuivfLogInsert(Relation index, const GpuivfInsertPlan *plan);
void        GpuivfLogAppendListPage(Relation index, Buffer tailbuf, Buffer newbuf,
                                    Buffer dirbuf, int list, Buffer metabuf);
void        GpuivfLogDeleteListEntries(Relation index, Buffer listbuf, OffsetNumber *offsets,
                                       int noffsets, Buffer dirbuf, const GpuivfMetaPageData *meta,
                                       int list, BlockNumber new_insert_page, Buffer metabuf);
void        GpuivfLogFreeVectorTuples(Relation index, Buffer vecbuf, OffsetNumber *offsets,
                                      int noffsets, Buffer metabuf, bool count_vectors);
BlockNumber GpuivfDirPageOf(const GpuivfMetaPageData *meta, int list);

/* gpuivfpage.cpp: the curve into the metapage (one record, metapage only) */
void        GpuivfLogCalibration(Relation index, Buffer metabuf, const GpuivfMetaPageData *calib);

/* gpuivfpage.cpp: reading pages (scan, batch search) */
void        GpuivfBadPage(Relation index, BlockNumber blkno, const char *expected);  /* ERROR */
int         GpuivfReadListPage(Relation index, BlockNumber blkno, int code_size, int capacity,
                               uint64 *ids, uint8 *codes, BlockNumber *next);
GpuivfVectorTuple *GpuivfPageVectorTuple(Relation index, Page page, BlockNumber blkno,
                                         OffsetNumber off, int dims);    /* NULL: not in use */

/* -------------------------------------------------------------- scan */

/* private to gpuivfscan.cpp */
typedef struct GpuivfScanOpaqueData *GpuivfScanOpaque;

/* gpuivfscan.cpp: the number of lists probed when gpuivf.probes = 0
 * and the index has no tuned curve (GpuivfProbesForScan) */
int         GpuivfAutoProbes(int lists);
/* the number of lists a scan probes in its first round */
int         GpuivfScanProbes(int lists);
/* rows the scan's query needs (0 = unknown): round 1 keeps at least that
 * many candidates; set before rescan (the planner integration sets it from
 * the LIMIT, gpuivfplanner.cpp) */
void        GpuivfScanSetLimitHint(IndexScanDesc scan, int64 rows);

/* where a scan's nprobe came from (EXPLAIN "Probes") */
#define GPUIVF_PROBES_UNTRAINED 0   /* no lists: exact */
#define GPUIVF_PROBES_SETTING   1   /* gpuivf.probes */
#define GPUIVF_PROBES_AUTO      2   /* ceil(sqrt(lists)) */
#define GPUIVF_PROBES_CURVE     3   /* the curve tuned at ANALYZE */

/* gpuivfscan.cpp: what the scans of one scan descriptor did, summed over
 * its rescans (EXPLAIN ANALYZE of the GpuivfKnn node) */
typedef struct GpuivfScanStats
{
    int64       scans;          /* (re)scans that searched */
    int64       k_sum;          /* rows asked of round 1 */
    int64       probes_sum;     /* nprobe of round 1 */
    int         probe_source;   /* GPUIVF_PROBES_* of the last scan */
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
/* gpuivfscan.cpp: the selectivity of the filter above the scan (1 = none),
 * before the next rescan, with GpuivfScanSetLimitHint */
void        GpuivfScanSetFilterSelectivity(IndexScanDesc scan, double sel);

/* ================================================================
 * ANALYZE calibration (gpuivfanalyze.cpp).
 * ================================================================ */

/* The nprobe a scan uses when gpuivf.probes = 0: the curve's choice for
 * gpuivf.target_recall (GpuivfCurveProbes; *from_curve = true; a target the
 * curve cannot reach gives its best point and a NOTICE once per backend and
 * curve), else GpuivfAutoProbes(lists).  k: rows the query wants (0 =
 * unknown; the curve is measured at k = 10 and used for any k). */
int         GpuivfProbesForScan(const GpuivfMetaPageData *meta, int k, bool *from_curve);

#define GPUIVF_CALIBRATION_K        10      /* recall@10 is measured */
#define GPUIVF_DEFAULT_ANALYZE_SAMPLE 200
#define GPUIVF_MAX_ANALYZE_SAMPLE   10000

/* The calibration's queries: a reservoir sample of the index's rows (raw
 * vector, entry id, heap TID).  Calibration draws it by walking the rows;
 * CREATE INDEX draws it while its encoding scan hands the rows over (in the
 * order the walk would see them), which saves calibration that walk. */
typedef struct CalibSample GpuivfCalibSample;
GpuivfCalibSample *GpuivfCalibSampleBegin(int dims);   /* NULL when calibration is off */
void        GpuivfCalibSampleAdd(GpuivfCalibSample *sample, const float4 *x, uint64 id,
                                 uint64 heap_id);

/* Measure the curve of an index and store it in the metapage.  heap may be
 * NULL (opened when needed); drawn: the sample, drawn over every row of the
 * index, or NULL (drawn here).  Returns false when nothing was stored
 * (untrained, too few rows, gpuivf.analyze_sample = 0, rebuilt meanwhile). */
bool        GpuivfCalibrate(Relation index, Relation heap, const GpuivfCalibSample *drawn);
/* Would calibrating an index of meta's shape search through the GPU worker
 * (gpuivf.device not cpu, a worker up, every point within its limits)? */
bool        GpuivfCalibrationSearchesOnGpu(const GpuivfMetaPageData *meta);
/* Should VACUUM (which hides a following ANALYZE from the AM) re-measure?
 * True when the index has no curve or its size changed by 10% or more. */
bool        GpuivfCalibrationIsStale(const GpuivfMetaPageData *meta);
/* The curve's choice for target, without side effects: the smallest
 * measured nprobe meeting it with 95% confidence (recall - 1.645 standard
 * errors >= target; *reached = true), else the point with the best recall
 * (*reached = false).  0 when the metapage has no curve. */
int         GpuivfCurveProbes(const GpuivfMetaPageData *meta, double target, bool *reached);
/* The seam for ground truth: exact top-k (entry ids, ascending by score,
 * padded with UINT64_MAX) of nq raw queries among all rows of the index,
 * each query's own entry exclude_ids[i] left out.  On the GPU worker when
 * one is up (gpuivf.device not cpu), else on the CPU: the same result.
 * *on_gpu (may be NULL): the worker computed all of it. */
void        GpuivfExactKnnForCalibration(Relation index, Relation heap,
                                         const GpuivfMetaPageData *meta, int nq,
                                         const float4 *queries, const uint64 *exclude_ids,
                                         int k, uint64 *out_ids, float *out_scores,
                                         bool *on_gpu);

/* ================================================================
 * Search dispatch: the seam between a scan (or a batched kNN join) and the
 * engines.  GpuivfSearchBatch (gpuivfsearch.cpp, planner side) answers nq
 * queries of one index; it hands them to the GPU worker when gpuivf.device
 * allows and a worker is up (gpuivfclient.cpp, GPU worker side), else runs the
 * CPU engine in this backend.  Both sides return the same rows.
 * ================================================================ */
typedef struct GpuivfQuery
{
    const float4 *vector;       /* raw query values, the index's dims */
    int         k;              /* rows wanted, >= 1 */
    int         nprobe;         /* lists probed */
    int         rerank;         /* PQ candidates re-ranked exactly; 0 = none */
} GpuivfQuery;

typedef struct GpuivfHit
{
    ItemPointerData tid;        /* heap TID */
    float8      distance;       /* SQL-scale distance (exact when re-ranked) */
} GpuivfHit;

typedef struct GpuivfSearchStats
{
    bool        on_gpu;         /* answered by the GPU worker */
    int         batch_size;     /* queries in the engine call this rode in */
    double      queue_ms;       /* waiting for the worker */
    double      gpu_ms;         /* device time of that engine call */
    int64       reranked;       /* candidates re-ranked exactly */
} GpuivfSearchStats;

/* gpuivfsearch.cpp: hits[i] is palloc'd, sorted best first, nhits[i] <= k.
 * meta: the metapage as the caller read it in this statement (after its
 * snapshot was taken: a worker request carries its generation), or NULL to
 * read it here.  A scan passes the copy it started with, so a statement
 * reads the metapage once, not once per layer. */
void        GpuivfSearchBatch(Relation index, int nq, const GpuivfQuery *queries,
                              GpuivfHit **hits, int *nhits, GpuivfSearchStats *stats,
                              const GpuivfMetaPageData *meta);

/* gpuivfsearch.cpp: gpuivf.device = gpu without a worker is an error */
void        GpuivfCheckDevice(void);

/* gpuivfsearch.cpp: the round-1 query of a scan that needs `hint` rows
 * (0 = unknown) of which a fraction filter_sel (1 = no filter) passes the
 * scan's filter: k = hint (or gpuivf.rerank_candidates), nprobe from
 * gpuivf.probes, or from the tuned curve / automatic rule raised by
 * 1/sqrt(filter_sel), rerank = max(k, gpuivf.rerank_candidates) when the
 * index stores vectors.  Returns a GPUIVF_PROBES_* source. */
int         GpuivfMakeQuery(const GpuivfMetaPageData *meta, int64 hint, double filter_sel,
                            const float4 *vector, GpuivfQuery *query);
/* Rows to ask of round 1 when `rows` must pass a filter of selectivity sel
 * (1 = no filter) */
int64       GpuivfRowsForFilter(double rows, double sel);
/* Is that query answered exactly (untrained, or every list with vectors)? */
bool        GpuivfQueryIsExact(const GpuivfMetaPageData *meta, const GpuivfQuery *query);

/*
 * gpuivfsearch.cpp: a round 1 computed ahead of time (the batched kNN join)
 * and offered to the next scan of that index.  A scan takes it only when its
 * own round-1 query is the same (vector bytes, k, nprobe, rerank) and the
 * metapage generation has not moved, i.e. when GpuivfSearchBatch would
 * return exactly these hits; otherwise it searches itself.
 */
void        GpuivfOfferRoundOne(Oid indexoid, uint64 generation, const GpuivfQuery *query,
                                int dims, const GpuivfHit *hits, int nhits,
                                const GpuivfSearchStats *stats);
bool        GpuivfTakeRoundOne(Oid indexoid, uint64 generation, const GpuivfQuery *query,
                               int dims, GpuivfHit **hits, int *nhits, GpuivfSearchStats *stats);
void        GpuivfClearOffer(void);

/* gpuivfclient.cpp (backend side of the GPU worker protocol) */
bool        GpuivfWorkerAvailable(void);
/* false when no worker could serve (the caller falls back to the CPU under
 * gpuivf.device = auto); errors the worker reports are raised here.
 * Precisely: false under cpu; false for queries the GPU engine does not
 * take (GpuivfSearchBatch routes them to the CPU itself: untrained or
 * temporary index, exact mode = nprobe >= lists with stored vectors, k /
 * candidates / nprobe above GPUIVF_GPU_MAX_*); under auto also false when
 * no worker is ready or on any worker failure, and then its nq queries are
 * counted in gpuivf_stat.cpu_fallbacks; under gpu those raise here.  Each
 * query keeps its own k, nprobe and rerank on the worker, so its answer
 * never depends on the batch it rides in.  meta as for GpuivfSearchBatch
 * (NULL: read here). */
bool        GpuivfWorkerSearch(Relation index, int nq, const GpuivfQuery *queries,
                               GpuivfHit **hits, int *nhits, GpuivfSearchStats *stats,
                               const GpuivfMetaPageData *meta);

/* ================================================================
 * GPU worker (gpuivfworker/shmem/client/gpuindex.cpp).  The shared-memory
 * layout is private (gpuivfworker.h); the protocol is in README.md
 * ("GPU worker").
 * ================================================================ */

/* _PG_init: the worker's settings; when preloading, its shared memory and
 * one background worker per GPU */
void        GpuivfWorkerInit(void);
/* the background worker's entry point (bgw_function_name) */
extern "C" {
PGDLLEXPORT void GpuivfWorkerMain(Datum main_arg);
Datum       gpuivf_stat(PG_FUNCTION_ARGS);
Datum       gpuivf_worker_search(PG_FUNCTION_ARGS);   /* gpuivfclient.cpp */
}
/* gpuivf_index_info: appends "gpu_cache": [...] (where the index is cached) */
void        GpuivfAppendCacheInfo(StringInfo json, Relation index);
/* CREATE INDEX on the GPU (gpuivfclient.cpp).  They return false (or NULL)
 * when no worker can do it (the build then runs on the CPU); errors are
 * raised.  Encoding runs in batches through one job (one DSM segment). */
bool        GpuivfWorkerTrain(Relation index, gpuivf::Metric metric, const float *sample,
                              int64 n, int dims, int lists, int pq_m, int pq_bits,
                              float *centroids, float *codebook);
typedef struct GpuivfEncodeJob GpuivfEncodeJob;
GpuivfEncodeJob *GpuivfWorkerEncodeBegin(const gpuivf::IvfPqModel &model, int64 batch_cap);
float      *GpuivfWorkerEncodeArea(GpuivfEncodeJob *job, int area);
bool        GpuivfWorkerEncodeSubmit(GpuivfEncodeJob *job, Relation index, int area, int64 n);
bool        GpuivfWorkerEncodeWait(GpuivfEncodeJob *job, Relation index, const int32 **lists,
                                   const uint8 **codes);
void        GpuivfWorkerEncodeEnd(GpuivfEncodeJob *job);
/* A GPU worker loads the index's copy while the build logs its pages (the
 * calibration that follows then finds it ready); Start returns whether it
 * asked, Wait waits for that answer.  Neither raises for a failed load. */
bool        GpuivfWorkerLoadStart(Relation index, const GpuivfMetaPageData *meta);
void        GpuivfWorkerLoadWait(Relation index);

/*
 * The GPU engine's limits per query (the same numbers as
 * cuda/include/gpuivf_cuda.h, checked there by gpuivfworker.h).  Queries
 * above them run on the CPU under gpuivf.device = auto (counted in
 * gpuivf_stat.cpu_fallbacks) and raise GpuivfRaiseGpuLimit under gpu.
 */
#define GPUIVF_GPU_MAX_K        1024    /* rows, and re-rank candidates */
#define GPUIVF_GPU_MAX_NPROBE   1024    /* lists probed */

/* gpuivfclient.cpp: the name of the first GPU engine limit query exceeds
 * ("k", "candidates", "nprobe"), NULL when it fits */
const char *GpuivfGpuLimitExceeded(const GpuivfQuery *query);
/* ERROR (54000) naming that limit, for gpuivf.device = gpu */
void        GpuivfRaiseGpuLimit(Relation index, const GpuivfQuery *query);
/* gpuivfclient.cpp: n queries (or GPU work requests) answered on the CPU
 * under gpuivf.device = auto because no worker could serve them; worker -1
 * when none was asked (shown in worker 0's row).  No-op unless preloaded. */
void        GpuivfCountCpuFallbacks(int worker, int64 n);

/*
 * gpuivfclient.cpp: exact kNN on the GPU worker (ANALYZE's ground truth,
 * GpuivfExactKnnForCalibration).  A job is a DSM segment holding the nq
 * queries and room for batch_cap base rows (*base: fill it, then Run).
 * Begin returns NULL when no worker can take it (gpuivf.device = cpu, no
 * ready worker, or the segment cannot be had): the caller computes on the
 * CPU.  Run computes the exact top-kk of every query among the n rows of
 * *base, in core exact_knn's format (internal scores ascending, base row
 * numbers, UINT64_MAX padding; the same bits: the engine re-scores with the
 * CPU's functions); false when the worker failed — under gpuivf.device =
 * gpu that raises instead — and the job is then dead (the caller finishes
 * on the CPU).
 */
typedef struct GpuivfExactKnnJob GpuivfExactKnnJob;
GpuivfExactKnnJob *GpuivfWorkerExactKnnBegin(Relation index, gpuivf::Metric metric, int dims,
                                             int nq, const float4 *queries, int kk,
                                             int64 batch_cap, float4 **base);
bool        GpuivfWorkerExactKnnRun(GpuivfExactKnnJob *job, int64 n, float *scores, uint64 *ids);
bool        GpuivfWorkerExactKnnDead(const GpuivfExactKnnJob *job);  /* a Run failed */
void        GpuivfWorkerExactKnnEnd(GpuivfExactKnnJob *job);

/* ================================================================
 * Planner integration (gpuivfplanner.cpp; src/pg/README.md, "Planner").
 * ================================================================ */

/* gpuivfplanner.cpp: planner/executor hooks and the custom scan nodes,
 * installed by _PG_init */
void        GpuivfPlannerInit(void);

#endif                          /* GPUIVF_H */
