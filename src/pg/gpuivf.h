/*
 * gpuivf.h — the base header of the PostgreSQL side of gpuivf, and the map.
 *
 * Everything under src/pg includes postgres.h (through this header, first);
 * nothing here includes a CUDA header.  The CPU engine (src/core/gpuivf_core.h)
 * is called through plain pointers and Status values: no C++ object with a
 * destructor is ever alive across a call that can ereport(), and no C++
 * exception can reach a PostgreSQL frame (src/pg is built with
 * -fno-exceptions, the engine is noexcept).
 *
 * The modules, each a folder with its header, calls going down the list:
 *
 *   gpuivf.cpp        _PG_init, the settings, the AM handler, reloptions
 *   planner/          planner.h: GpuivfKnn (the LIMIT reaches the scan,
 *                     EXPLAIN) and GpuivfBatchKnn (batched LATERAL kNN joins)
 *   am/               am.h: the access method's callbacks (build, insert,
 *                     scan, vacuum, cost, validate) and the SQL functions on
 *                     an index (gpuivf_index_info, gpuivf_verify)
 *   calibration/      calibration.h: ANALYZE measures the recall curve
 *   search/           search.h: answering kNN queries — the probe count
 *                     (probes.cpp), the round-1 query, dispatch to the CPU
 *                     path (cpu.cpp) or the GPU worker
 *   worker/           worker.h: the GPU worker as the rest sees it;
 *                     protocol.h: its shared memory and request queue;
 *                     backend/ the backend's side of the protocol (requests,
 *                     search, build jobs, exact kNN, gpuivf_stat),
 *                     bgworker/ the worker process (engine, GPU copies,
 *                     search streams, wake-up thread)
 *   storage/          storage.h: pages, WAL (GenericXLog), the metapage and
 *                     the per-backend model cache; list pages are decoded
 *                     here
 *   vector.cpp, utils.cpp (declared here): real[] input and distance
 *                     functions; engine statuses, sampling, timing
 *
 * This header holds what every module shares: the PostgreSQL headers, the
 * on-disk format, the settings, the index options and the vocabulary of a
 * search (GpuivfQuery, GpuivfHit).  Design, page layouts, locking, WAL and
 * the worker protocol: README.md next to this file.
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
#include "access/heaptoast.h"
#include "access/htup_details.h"
#include "access/itup.h"
#include "access/parallel.h"
#include "access/relation.h"
#include "access/relscan.h"
#include "access/reloptions.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "access/xloginsert.h"
#include "catalog/catalog.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_amop.h"
#include "catalog/pg_amproc.h"
#include "catalog/pg_inherits.h"
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
#include "common/int.h"
#include "common/pg_prng.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "foreign/foreign.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/execnodes.h"
#include "nodes/extensible.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "nodes/params.h"
#include "optimizer/cost.h"
#include "optimizer/optimizer.h"
#include "optimizer/plancat.h"
#include "optimizer/planner.h"
#include "parser/parse_coerce.h"
#include "parser/parsetree.h"
#include "portability/instr_time.h"
#include "pgstat.h"
#include "storage/bufmgr.h"
#include "storage/bufpage.h"
#include "storage/condition_variable.h"
#include "storage/freespace.h"
#include "storage/indexfsm.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/backend_progress.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/fmgrprotos.h"
#include "utils/guc.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/plancache.h"
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
#define GPUIVF_FORMAT_VERSION   2
#define GPUIVF_PAGE_ID          0xFF91      /* last 2 bytes of special space */

#define GPUIVF_METAPAGE_BLKNO   0

/* page types (GpuivfPageOpaqueData.page_type) */
#define GPUIVF_PAGE_META        1
#define GPUIVF_PAGE_CENTROIDS   2   /* raw float4 array */
#define GPUIVF_PAGE_CODEBOOK    3   /* raw float4 array */
#define GPUIVF_PAGE_DIRECTORY   4   /* raw GpuivfListDirEntry array */
#define GPUIVF_PAGE_LIST        5   /* items: GpuivfListEntry */
#define GPUIVF_PAGE_VECTOR      6   /* items: GpuivfVectorTuple */
#define GPUIVF_PAGE_CALIB       7   /* GpuivfCalibPageHeader + raw float4 stream:
                                     * calibration queries */

/* metapage flags */
#define GPUIVF_META_TRAINED     0x0001  /* lists, centroids, codebooks exist */
#define GPUIVF_META_RERANK      0x0002  /* candidates are re-ranked with exact distances */
#define GPUIVF_META_RERANK_TABLE 0x0004 /* ... read from the table's column (with RERANK):
                                         * vector tuples hold no values */

/* metapage storage: the element type of the values in vector tuples */
#define GPUIVF_STORAGE_FLOAT4   0       /* real[] and pgvector's vector */
#define GPUIVF_STORAGE_FLOAT16  1       /* pgvector's halfvec: IEEE half, raw uint16 */

/* operator strategy and support procedure numbers */
#define GPUIVF_DISTANCE_STRATEGY    1   /* the ORDER BY operator */
#define GPUIVF_DISTANCE_PROC        1   /* (type, type) -> float8, one of gpuivf's */
#define GPUIVF_NPROC                1

/* defaults and bounds of the index options */
#define GPUIVF_DEFAULT_PQ_BITS      8
#define GPUIVF_DEFAULT_RERANK       true
#define GPUIVF_RERANK_FROM_AUTO     0   /* the index when a vector fits a page, else the table */
#define GPUIVF_RERANK_FROM_INDEX    1   /* vector tuples in the index */
#define GPUIVF_RERANK_FROM_TABLE    2   /* the table's column */

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
extern int  gpuivf_rerank_candidates;   /* gpuivf.rerank_candidates, 0 = automatic */
/* The re-rank depth: PQ candidates re-ranked per round for up to 10 rows.
 * Without a setting and without a calibration that chose deeper, this;
 * ANALYZE also measures twice and four times it when this depth caps
 * recall (calibration/curve.cpp), and scans pick one (search/probes.cpp). */
#define GPUIVF_DEFAULT_RERANK_DEPTH 200
/* PQ candidates re-ranked for a query of k rows at a re-rank depth
 * (gpuivf.cpp) */
int         GpuivfRerankCount(int depth, int k);
extern int  gpuivf_device;              /* gpuivf.device */

/* ANALYZE calibration */
extern double gpuivf_target_recall;     /* gpuivf.target_recall, 0..1 */
extern int  gpuivf_analyze_sample;      /* gpuivf.analyze_sample, queries; 0 = off */

/* planner integration */
extern bool gpuivf_enable_batch_join;   /* gpuivf.enable_batch_join */
extern int  gpuivf_max_probes;          /* gpuivf.max_probes, 0 = no bound */
/* GPU worker (defined in worker/bgworker/registration.cpp) */
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

/*
 * The recall curves: one per measured k (recall@1, @10, @100), over the
 * same nprobe points.
 */
#define GPUIVF_CURVE_POINTS     64
#define GPUIVF_CURVE_KS         3
#define GPUIVF_CALIBRATION_K    10  /* the k of a query whose LIMIT is unknown,
                                     * and of gpuivf.target_recall's wording */
typedef struct GpuivfRecallPoint
{
    float4      recall;         /* mean recall@k over the calibration's queries */
    float4      recall_se;      /* standard error of that mean */
} GpuivfRecallPoint;

/* Re-rank depths one calibration measures: the depth of calib_recall and
 * up to GPUIVF_CALIB_DEEPER deeper ones (calib_deep_*). */
#define GPUIVF_CALIB_DEEPER     2
#define GPUIVF_CALIB_DEPTHS     (1 + GPUIVF_CALIB_DEEPER)

/* where a calibration's queries came from (calib_source) */
#define GPUIVF_CALIB_NONE       0   /* no curve */
#define GPUIVF_CALIB_ROWS       1   /* a sample of the index's rows */
#define GPUIVF_CALIB_WORKLOAD   2   /* queries the index answered (recorded) */
#define GPUIVF_CALIB_GIVEN      3   /* gpuivf_calibrate(index, query) */

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
    uint16      storage;        /* GPUIVF_STORAGE_*: values of vector tuples */
    uint64      generation;     /* +1 with VACUUM's records, and with every
                                 * change of an index that counts its rows
                                 * here (storage/storage.h, GpuivfReadRows) */
    uint64      train_id;       /* identifies centroids + codebooks; caches key on it */
    uint64      vectors;        /* live rows of such an index; a trained
                                 * WAL-logged one: its build's (its directory
                                 * counts them) */
    BlockNumber centroid_start;
    uint32      centroid_pages;
    BlockNumber codebook_start;
    uint32      codebook_pages;
    BlockNumber directory_start;
    uint32      directory_pages;
    BlockNumber vector_insert_page; /* last vector page appended to */

    /*
     * The calibration (ANALYZE, CREATE INDEX, gpuivf_calibrate): recall@k
     * against exact results for nprobe values in ascending order, one curve
     * per calib_k, and the queries it was measured on when they are not
     * rows of the index (a chain of calibration-query pages).  All zero
     * until the first calibration.  Written only by GpuivfLogCalibration;
     * the two page chains only by a calibration (storage: README.md).
     */
    uint32      calib_sample;   /* queries measured; 0 = no curve */
    uint64      calib_vectors;  /* live entries when measured */
    int64       calib_time;     /* TimestampTz of the measurement */
    uint16      calib_source;   /* GPUIVF_CALIB_* */
    uint16      calib_npoints;  /* nprobe points of every curve */
    uint32      calib_rerank;   /* candidates re-ranked exactly per query; 0 = no re-rank */
    uint16      calib_k[GPUIVF_CURVE_KS];   /* k of each curve, ascending; 0 = unused */
    uint16      calib_reserved;
    float4      calib_nn_mean;  /* the queries' mean L2 distance to their nearest centroid */
    float4      calib_nn_sd;    /* and its standard deviation (drift detection) */
    uint32      calib_id;       /* +1 with every stored calibration; stamps its query pages */
    uint32      calib_query_count;  /* queries stored (count x dims floats); 0 = none */
    BlockNumber calib_query_head;   /* first page of their chain (when count > 0) */
    uint32      calib_query_pages;
    BlockNumber calib_free_head;    /* calibration-query pages free for the next */
    uint32      calib_free_pages;   /* calibration (0: none; head not meaningful) */
    uint32      calib_nprobe[GPUIVF_CURVE_POINTS];
    GpuivfRecallPoint calib_recall[GPUIVF_CURVE_KS][GPUIVF_CURVE_POINTS];

    /*
     * The re-rank depths of the curves (the depth: candidates re-ranked for
     * up to 10 rows, GpuivfRerankCount): calib_recall's is calib_depth (0:
     * measured before depths were recorded, GpuivfCalibDepthAt says which);
     * when that depth capped recall, the same sweep's curves at the deeper
     * calib_deep_depth[0 .. calib_deep_count), ascending, over the same
     * nprobe points and k (calibration/curve.cpp).
     */
    uint32      calib_depth;
    uint32      calib_deep_count;
    uint32      calib_deep_depth[GPUIVF_CALIB_DEEPER];
    GpuivfRecallPoint calib_deep_recall[GPUIVF_CALIB_DEEPER][GPUIVF_CURVE_KS][GPUIVF_CURVE_POINTS];
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
/* Most list entries one page can hold (line pointer + entry each): the room
 * every reader of list pages keeps.  Writers keep the lower bound of
 * MaxIndexTuplesPerPage line pointers (GpuivfPageFreeSpace); readers keep
 * this one, so that list pages written before that bound was kept (up to
 * 680 small entries) are still read (README.md, "Line-pointer bound"). */
#define GPUIVF_LIST_PAGE_CAPACITY(code_size) \
    ((int) (GPUIVF_PAGE_CAPACITY / (sizeof(ItemIdData) + GPUIVF_LIST_ENTRY_SIZE(code_size))))

/*
 * A full vector (vector pages): the heap row it belongs to and its values,
 * dims float4 or (GPUIVF_STORAGE_FLOAT16) dims raw IEEE halves; no values
 * when the index re-ranks from the table (GPUIVF_META_RERANK_TABLE).
 */
typedef struct GpuivfVectorTuple
{
    ItemPointerData heaptid;
    uint16      unused;
    float4      x[FLEXIBLE_ARRAY_MEMBER];
} GpuivfVectorTuple;

/* The largest item a vector page takes: one tuple on an empty page. */
#define GPUIVF_MAX_VECTOR_TUPLE_SIZE \
    MAXALIGN_DOWN(BLCKSZ - MAXALIGN(SizeOfPageHeaderData) - sizeof(ItemIdData) - \
                  MAXALIGN(sizeof(GpuivfPageOpaqueData)))

/* The head of a calibration-query page: which calibration wrote it and how
 * many floats of the queries' stream follow (queries may span pages). */
typedef struct GpuivfCalibPageHeader
{
    uint32      calib_id;
    uint32      nfloats;
} GpuivfCalibPageHeader;

/* Bytes usable for raw arrays on one page. */
#define GPUIVF_PAGE_CAPACITY \
    (BLCKSZ - MAXALIGN(SizeOfPageHeaderData) - MAXALIGN(sizeof(GpuivfPageOpaqueData)))
#define GPUIVF_FLOATS_PER_PAGE      (GPUIVF_PAGE_CAPACITY / sizeof(float4))
#define GPUIVF_DIR_ENTRIES_PER_PAGE (GPUIVF_PAGE_CAPACITY / sizeof(GpuivfListDirEntry))
#define GPUIVF_CALIB_FLOATS_PER_PAGE \
    ((GPUIVF_PAGE_CAPACITY - sizeof(GpuivfCalibPageHeader)) / sizeof(float4))

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

/* Are candidates re-ranked with exact distances (always when untrained)? */
static inline bool
GpuivfMetaReranks(const GpuivfMetaPageData *meta)
{
    return !GpuivfMetaIsTrained(meta) || (meta->flags & GPUIVF_META_RERANK) != 0;
}

/* Are the exact values read from the table's column (vector tuples, when
 * there are any, hold only the heap TID)? */
static inline bool
GpuivfMetaRerankFromTable(const GpuivfMetaPageData *meta)
{
    return (meta->flags & GPUIVF_META_RERANK_TABLE) != 0;
}

/* Does a row live as a vector tuple that list entries point at (always
 * when untrained, else with re-rank from the index)?  Otherwise list
 * entries hold heap TIDs. */
static inline bool
GpuivfMetaStoresVectors(const GpuivfMetaPageData *meta)
{
    return !GpuivfMetaIsTrained(meta) ||
        ((meta->flags & GPUIVF_META_RERANK) != 0 && !GpuivfMetaRerankFromTable(meta));
}

/* Bytes of one stored element, and of the values of one vector tuple. */
static inline Size
GpuivfStorageElemSize(int storage)
{
    return storage == GPUIVF_STORAGE_FLOAT16 ? sizeof(uint16) : sizeof(float4);
}
/* Bytes of the values of one vector tuple (none with re-rank from the table). */
static inline Size
GpuivfVectorValueBytes(const GpuivfMetaPageData *meta)
{
    return GpuivfMetaRerankFromTable(meta) ? 0 : GpuivfStorageElemSize(meta->storage) * (Size) meta->dims;
}
static inline Size
GpuivfVectorTupleSizeFor(int dims, int storage, bool from_table)
{
    return MAXALIGN(offsetof(GpuivfVectorTuple, x) +
                    (from_table ? 0 : GpuivfStorageElemSize(storage) * (Size) dims));
}
static inline Size
GpuivfVectorTupleSize(const GpuivfMetaPageData *meta)
{
    return GpuivfVectorTupleSizeFor((int) Max(meta->dims, 1), meta->storage,
                                    GpuivfMetaRerankFromTable(meta));
}

/* Floats of an index's codebooks: pq_m sub-quantizers of 2^pq_bits
 * centroids of dims / pq_m values each (src/core's layout). */
static inline Size
GpuivfCodebookFloats(int dims, int pq_m, int pq_bits)
{
    return (Size) pq_m * ((Size) 1 << pq_bits) * (Size) (dims / Max(pq_m, 1));
}

/* -------------------------------------------------- relation options */

typedef struct GpuivfOptions
{
    int32       vl_len_;        /* varlena header (do not touch directly!) */
    int         lists;          /* 0 = automatic */
    int         pq_m;           /* 0 = automatic */
    int         pq_bits;        /* 4 or 8 */
    bool        rerank;
    double      target_recall;  /* GPUIVF_TARGET_UNSET: gpuivf.target_recall */
    int         rerank_from;    /* GPUIVF_RERANK_FROM_* */
} GpuivfOptions;

#define GPUIVF_TARGET_UNSET         (-1.0)

/* where the recall target of a scan comes from */
#define GPUIVF_TARGET_SETTING   0   /* gpuivf.target_recall */
#define GPUIVF_TARGET_INDEX     1   /* the index option target_recall */

/* gpuivf.cpp: handler, _PG_init, settings, reloptions */
bytea      *gpuivfoptions(Datum reloptions, bool validate);
GpuivfOptions *GpuivfGetOptions(Relation index);
/* The recall target of scans of an index: its target_recall option, which
 * overrides gpuivf.target_recall (like a tablespace's random_page_cost
 * overrides the setting), else the setting.  *source (may be NULL):
 * GPUIVF_TARGET_INDEX or GPUIVF_TARGET_SETTING. */
double      GpuivfTargetRecall(Relation index, int *source);
const char *GpuivfTargetSourceName(int source);   /* "index option", "gpuivf.target_recall" */
/* ------------------------------------------------------ entry points */

/* gpuivf.cpp: the handler and module entry points */
extern "C" {
void        _PG_init(void);
Datum       gpuivfhandler(PG_FUNCTION_ARGS);
}
/* --------------------------------------------- vector.cpp, utils.cpp */

/* vector.cpp: the SQL distance functions on real[].  The opclasses
 * name them as support function 1, and GpuivfGetMetric() recognises the
 * metric of an index by comparing fn_addr with these symbols. */
extern "C" {
Datum       gpuivf_l2_distance(PG_FUNCTION_ARGS);
Datum       gpuivf_inner_product(PG_FUNCTION_ARGS);
Datum       gpuivf_negative_inner_product(PG_FUNCTION_ARGS);
Datum       gpuivf_cosine_distance(PG_FUNCTION_ARGS);
}
/*
 * The column types gpuivf indexes, and what a vector datum of each is: a
 * real[] (one dimension, no NULLs), or pgvector's vector / halfvec, read by
 * their documented layout (varlena header, int16 dim, int16 unused, then
 * dim float4 or IEEE half values; pgvector's src/vector.h, src/halfvec.h).
 * gpuivf.so does not link pgvector: gpuivf_vector's operator classes name
 * support functions of gpuivf.so that read these layouts.
 */
typedef enum GpuivfVectorType
{
    GPUIVF_TYPE_REAL_ARRAY = 0,
    GPUIVF_TYPE_VECTOR = 1,
    GPUIVF_TYPE_HALFVEC = 2
} GpuivfVectorType;

/* What an index's operator class says (from its support function 1). */
typedef struct GpuivfOpclassInfo
{
    gpuivf::Metric metric;
    GpuivfVectorType type;
} GpuivfOpclassInfo;

/* pgvector.cpp: pgvector's layouts (checked; the datum detoasted in the
 * current context) and gpuivf_vector's support functions */
const float4 *GpuivfPgvectorValues(Datum value, int *dims);
const uint16 *GpuivfHalfvecValues(Datum value, int *dims);
Datum       GpuivfPgvectorDatum(GpuivfVectorType type, const float4 *x, int dims);
extern "C" {
Datum       gpuivf_vector_l2_distance(PG_FUNCTION_ARGS);
Datum       gpuivf_vector_negative_inner_product(PG_FUNCTION_ARGS);
Datum       gpuivf_vector_cosine_distance(PG_FUNCTION_ARGS);
Datum       gpuivf_halfvec_l2_distance(PG_FUNCTION_ARGS);
Datum       gpuivf_halfvec_negative_inner_product(PG_FUNCTION_ARGS);
Datum       gpuivf_halfvec_cosine_distance(PG_FUNCTION_ARGS);
}
/* vector.cpp: metric and type of an index, vector input checks */
GpuivfOpclassInfo GpuivfGetOpclassInfo(Relation index);
/* is fn one of gpuivf's distance functions (then *info: metric, type)? */
bool        GpuivfDistanceFunctionInfo(PGFunction fn, GpuivfOpclassInfo *info);
gpuivf::Metric GpuivfGetMetric(Relation index);
const char *GpuivfVectorTypeName(GpuivfVectorType type);
/* A vector datum's values, checked (shape, not empty, finite, at most
 * gpuivf::kMaxDims): float4 values inside the detoasted datum (real[],
 * vector) or a palloc'd float4 copy of a halfvec's (widened exactly); in
 * CurrentMemoryContext. */
const float4 *GpuivfVectorValues(GpuivfVectorType type, Datum value, int *dims);
/* the same without errors: NULL when the datum is no valid vector */
const float4 *GpuivfVectorValuesIfValid(GpuivfVectorType type, Datum value, int *dims);
float4     *GpuivfDatumGetVector(GpuivfVectorType type, Datum value, int *dims);
                                                            /* validated, detoasted copy */
const float4 *GpuivfRowVector(GpuivfVectorType type, Datum *values, bool *isnull,
                              MemoryContext rowctx, int *dims);
                                                            /* values[0] in rowctx, NULL if null */
/* A datum of the type holding x (a palloc'd varlena; a halfvec's values
 * must be halves: they narrow back exactly). */
Datum       GpuivfVectorDatum(GpuivfVectorType type, const float4 *x, int dims);
/* The typmod of a pgvector column is its dimension count: the index's
 * first column's, or 0 when it has none (real[], or vector without one). */
int         GpuivfTypmodDims(Relation index);
void        GpuivfCheckDims(int expected, int actual);
/* a row's dimensions against an index's: false = same, true = the index
 * takes them (no dimension yet, or untrained and empty); else ERROR */
bool        GpuivfIndexTakesDims(Relation index, const GpuivfMetaPageData *meta, int dims);
/* a query's: true = same, false = the index holds no vector; else ERROR */
bool        GpuivfQueryMatchesIndex(Relation index, const GpuivfMetaPageData *meta, int dims);
/* vector.cpp: checks a detoasted real[] (element type, NULLs, shape,
 * empty, NaN, infinity, magnitude above gpuivf::kMaxComponent) and returns a
 * pointer to its float4 values inside the array; no dimension limit
 * (GpuivfDatumGetVector adds the index limit). */
const float4 *GpuivfArrayGetValues(ArrayType *array, int *dims);
/* the value test of GpuivfArrayGetValues, without raising: finite and
 * within +-gpuivf::kMaxComponent */
bool        GpuivfValuesAcceptable(const float4 *x, int n);
/* utils.cpp: engine status, the engine's cancel hook, small algorithms */
void        GpuivfRaiseStatus(const gpuivf::Status &status);
bool        GpuivfShouldCancel(void *arg);                   /* CancelHook, never longjmps */
gpuivf::CancelHook GpuivfCancelHook(void);                  /* with GpuivfShouldCancel */
int         GpuivfCompareUint64(const void *a, const void *b);    /* qsort: ascending */
bool        GpuivfSortedIdsContain(const uint64 *ids, int64 n, uint64 id);  /* binary search */
int64       GpuivfReservoirSlot(pg_prng_state *prng, int64 held, int64 cap, int64 seen);
/* utils.cpp: sampling by hash — the k rows with the smallest
 * (GpuivfSampleHash(seed, vector), id), whatever the order or the number of
 * processes they are seen by; GpuivfBottomK keeps the keys of the rows held
 * in the caller's slots (position-independent: may live in shared memory) */
typedef struct GpuivfSampleKey
{
    uint64      hash;
    uint64      id;             /* the row's id (heap TID as GpuivfTidToId) */
    int64       slot;           /* where the caller keeps the row */
} GpuivfSampleKey;
typedef struct GpuivfBottomK
{
    int64       k;              /* keys kept */
    int64       slots;          /* > k: rows the caller can hold */
    int64       n;              /* keys held now */
    bool        bounded;        /* bound is set: larger keys are turned away */
    GpuivfSampleKey bound;      /* largest key kept at the last compaction */
    /* keys[slots] and a stack of free slots follow */
} GpuivfBottomK;
uint64      GpuivfSampleHash(uint64 seed, const float4 *x, int dims);
Size        GpuivfBottomKSize(int64 slots);
GpuivfBottomK *GpuivfBottomKInit(void *mem, int64 k, int64 slots);
bool        GpuivfBottomKRejects(const GpuivfBottomK *bk, uint64 hash, uint64 id);
int64       GpuivfBottomKOffer(GpuivfBottomK *bk, uint64 hash, uint64 id);  /* slot, or -1 */
int64       GpuivfBottomKFinish(GpuivfBottomK *bk, const GpuivfSampleKey **keys);
void        GpuivfAddSeconds(double *seconds, instr_time *since);  /* since: now */
/* ------------------------------------------------------------ search */

/*
 * A kNN query of one index and its answer: what a scan or a batched kNN
 * join asks GpuivfSearchBatch (search/search.h), and what the CPU path and
 * the GPU worker both answer.
 */
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

/*
 * The order of a query's answer: distance ascending with NaN after every
 * number (as float8 sorts), ties broken by the smaller id (the heap TID,
 * packed): what both engines and every merge of candidates rank by.
 * Negative, zero or positive, as for qsort.
 */
static inline int
GpuivfCompareDistanceId(double da, uint64 ia, double db, uint64 ib)
{
    bool        nan_a = da != da;
    bool        nan_b = db != db;

    if (nan_a != nan_b)
        return nan_a ? 1 : -1;
    if (!nan_a && da != db)
        return da < db ? -1 : 1;
    return ia < ib ? -1 : (ia > ib ? 1 : 0);
}

/* A row of an answer: its distance and heap TID, in that order. */
typedef struct GpuivfResult
{
    double      distance;       /* SQL-visible distance (the order-by value) */
    uint64      heapid;         /* heap TID, packed */
} GpuivfResult;

/* GpuivfCompareDistanceId as a strict "less" (std::sort, std::nth_element) */
static inline bool
GpuivfResultLess(const GpuivfResult &a, const GpuivfResult &b)
{
    return GpuivfCompareDistanceId(a.distance, a.heapid, b.distance, b.heapid) < 0;
}

/* Is the query answered exactly: an untrained index, or every list of an
 * index that re-ranks (the exact scan; the GPU worker never takes it)? */
static inline bool
GpuivfQueryIsExact(const GpuivfMetaPageData *meta, const GpuivfQuery *query)
{
    if (!GpuivfMetaIsTrained(meta) || meta->lists == 0)
        return true;
    return GpuivfMetaReranks(meta) && query->nprobe >= (int) meta->lists;
}
#endif                          /* GPUIVF_H */
