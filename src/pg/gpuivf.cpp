/*
 * gpuivf.cpp — module entry points: the access method handler, _PG_init
 * (settings, index options, engine start-up) and the relation options.
 */
#include "gpuivf.h"
#include "am/am.h"
#include "calibration/calibration.h"
#include "planner/planner.h"
#include "worker/worker.h"

#include <climits>

#include "access/reloptions.h"
#include "commands/vacuum.h"
#include "fmgr.h"
#include "utils/guc.h"

extern "C" {
PG_MODULE_MAGIC;
}

/* settings (gpuivf.h) */
int         gpuivf_probes = 0;
int         gpuivf_rerank_candidates = 0;
int         gpuivf_device = GPUIVF_DEVICE_AUTO;
/* planner integration settings */
bool        gpuivf_enable_batch_join = true;
int         gpuivf_max_probes = 0;
/* ANALYZE calibration settings */
double      gpuivf_target_recall = 0.95;
int         gpuivf_analyze_sample = GPUIVF_DEFAULT_ANALYZE_SAMPLE;

/*
 * The PQ candidates re-ranked exactly for a query of k rows at a re-rank
 * depth (the count for up to 10 rows: gpuivf.rerank_candidates when set,
 * else the depth the calibration chose, search/probes.cpp): a larger k gets
 * as many candidates per row as the depth gives 10 rows (200: 20 a row),
 * at most the engines' 1024 and never fewer than k.  Re-ranking a fixed
 * count capped the recall of LIMIT 100 near 0.90 on 1M x 128 rows (200
 * candidates: two per row), whatever the probes; a count proportional to k
 * keeps the exact re-rank as deep for every LIMIT.  Scans,
 * gpuivf_worker_search and the calibration of each LIMIT's curve all use
 * this.
 */
int
GpuivfRerankCount(int depth, int k)
{
    int64       r = Max(depth, 1);

    if (k > 10)
        r = (r * k + 9) / 10;   /* ceil(r * k / 10): at least r */
    return (int) Min(Max(r, (int64) k), (int64) gpuivf::kMaxK);
}

/* the reloption kind of gpuivf indexes, registered in _PG_init */
static relopt_kind gpuivf_relopt_kind;

/* rerank_from: where re-ranking reads the exact vectors */
static relopt_enum_elt_def gpuivf_rerank_from_values[] = {
    {"auto", GPUIVF_RERANK_FROM_AUTO},
    {"index", GPUIVF_RERANK_FROM_INDEX},
    {"table", GPUIVF_RERANK_FROM_TABLE},
    {NULL, 0}
};

static const struct config_enum_entry gpuivf_device_options[] = {
    {"auto", GPUIVF_DEVICE_AUTO, false},
    {"cpu", GPUIVF_DEVICE_CPU, false},
    {"gpu", GPUIVF_DEVICE_GPU, false},
    {NULL, 0, false}
};

/*
 * Registers the settings and the index options, and keeps OpenBLAS
 * single-threaded in this process (no helper threads that could receive
 * PostgreSQL's signals or outlive an ereport).
 */
void
_PG_init(void)
{
    gpuivf::init_blas_single_threaded();

    gpuivf_relopt_kind = add_reloption_kind();
    add_int_reloption(gpuivf_relopt_kind, "lists",
                      "Number of inverted lists (0 = automatic from the row count)",
                      0, 0, gpuivf::kMaxLists, AccessExclusiveLock);
    add_int_reloption(gpuivf_relopt_kind, "pq_m",
                      "Number of PQ sub-quantizers (0 = automatic; must divide the dimensions)",
                      0, 0, gpuivf::kMaxPqM, AccessExclusiveLock);
    /* any integer parses; gpuivfoptions() says that only 4 and 8 are valid */
    add_int_reloption(gpuivf_relopt_kind, "pq_bits",
                      "Bits per PQ sub-quantizer code (4 or 8)",
                      GPUIVF_DEFAULT_PQ_BITS, INT_MIN, INT_MAX, AccessExclusiveLock);
    add_bool_reloption(gpuivf_relopt_kind, "rerank",
                       "Store full vectors and re-rank PQ candidates with exact distances",
                       GPUIVF_DEFAULT_RERANK, AccessExclusiveLock);
    /* read by every scan from the relcache; it changes no page, so ALTER
     * INDEX ... SET (target_recall) waits for no query (the default, outside
     * the range, means "not set") */
    add_real_reloption(gpuivf_relopt_kind, "target_recall",
                       "Recall that scans of this index aim for when gpuivf.probes = 0 "
                       "(overrides gpuivf.target_recall)",
                       GPUIVF_TARGET_UNSET, 0.0, 1.0, ShareUpdateExclusiveLock);
    add_enum_reloption(gpuivf_relopt_kind, "rerank_from",
                       "Where re-ranking reads exact vectors: a copy in the index, or the table's column",
                       gpuivf_rerank_from_values, GPUIVF_RERANK_FROM_AUTO,
                       "Valid values are \"auto\" (the index when a vector fits an index page), "
                       "\"index\" and \"table\".", AccessExclusiveLock);

    DefineCustomIntVariable("gpuivf.probes",
                            "Number of lists probed by a gpuivf scan (0 = automatic).",
                            "When the value is at least the number of lists of an index that "
                            "stores full vectors, scans are exact.",
                            &gpuivf_probes, 0, 0, gpuivf::kMaxLists,
                            PGC_USERSET, 0, NULL, NULL, NULL);
    DefineCustomIntVariable("gpuivf.rerank_candidates",
                            "Number of PQ candidates re-ranked with exact distances per round, for up to 10 rows (0 = automatic).",
                            "A query of more rows re-ranks proportionally more, at most 1024.  Automatic: "
                            "200, or the deeper re-rank ANALYZE measured when 200 caps an index's recall, "
                            "whichever meets the recall target at the least cost.",
                            &gpuivf_rerank_candidates, 0, 0, gpuivf::kMaxK,
                            PGC_USERSET, 0, NULL, NULL, NULL);
    DefineCustomEnumVariable("gpuivf.device",
                             "Where gpuivf scans run: auto, cpu or gpu.",
                             "\"gpu\" requires the gpuivf GPU worker.",
                             &gpuivf_device, GPUIVF_DEVICE_AUTO, gpuivf_device_options,
                             PGC_USERSET, 0, NULL, NULL, NULL);
    /* ANALYZE calibration; see gpuivfanalyze.cpp */
    DefineCustomRealVariable("gpuivf.target_recall",
                             "Recall@10 that gpuivf scans aim for when gpuivf.probes = 0.",
                             "Each scan probes the fewest lists whose recall, as measured by "
                             "ANALYZE, meets this target.  An index's target_recall option "
                             "overrides it for that index.",
                             &gpuivf_target_recall, 0.95, 0.0, 1.0,
                             PGC_USERSET, 0, NULL, NULL, NULL);
    DefineCustomIntVariable("gpuivf.analyze_sample",
                            "Number of query vectors ANALYZE uses to measure the recall of a gpuivf index (0 = do not measure).",
                            NULL,
                            &gpuivf_analyze_sample, GPUIVF_DEFAULT_ANALYZE_SAMPLE, 0,
                            GPUIVF_MAX_ANALYZE_SAMPLE,
                            PGC_USERSET, 0, NULL, NULL, NULL);

    /* planner integration: settings, hooks and
     * the custom scan nodes (gpuivfplanner.cpp) */
    DefineCustomBoolVariable("gpuivf.enable_batch_join",
                             "Runs LATERAL kNN joins on a gpuivf index as batched searches.",
                             "The outer rows are read ahead in chunks and their searches run "
                             "as one engine call per chunk; results equal the nested loop's.",
                             &gpuivf_enable_batch_join, true,
                             PGC_USERSET, 0, NULL, NULL, NULL);
    DefineCustomIntVariable("gpuivf.max_probes",
                            "Most lists a gpuivf scan visits when it deepens (0 = no bound).",
                            "A scan whose first round did not give the executor enough rows, "
                            "e.g. because a filter removed them, visits further lists until "
                            "this many were visited; 0 lets it reach every row.",
                            &gpuivf_max_probes, 0, 0, gpuivf::kMaxLists,
                            PGC_USERSET, 0, NULL, NULL, NULL);
    GpuivfPlannerInit();

    /* recorded queries: gpuivf.query_sample; when preloading, the shared
     * memory of the reservoirs (calibration/recorded.cpp) */
    GpuivfRecordedInit();

    /* GPU worker settings; when preloading, its
     * shared memory and one background worker per GPU (gpuivfworker.cpp) */
    GpuivfWorkerInit();

    MarkGUCPrefixReserved("gpuivf");
}

/*
 * Parses (and with validate, checks) the WITH (...) options of an index.
 * pq_bits is registered as a plain integer so that every wrong value gets
 * the same message here.
 */
bytea *
gpuivfoptions(Datum reloptions, bool validate)
{
    static const relopt_parse_elt tab[] = {
        {"lists", RELOPT_TYPE_INT, offsetof(GpuivfOptions, lists)},
        {"pq_m", RELOPT_TYPE_INT, offsetof(GpuivfOptions, pq_m)},
        {"pq_bits", RELOPT_TYPE_INT, offsetof(GpuivfOptions, pq_bits)},
        {"rerank", RELOPT_TYPE_BOOL, offsetof(GpuivfOptions, rerank)},
        {"target_recall", RELOPT_TYPE_REAL, offsetof(GpuivfOptions, target_recall)},
        {"rerank_from", RELOPT_TYPE_ENUM, offsetof(GpuivfOptions, rerank_from)},
    };
    GpuivfOptions *opts;

    opts = (GpuivfOptions *) build_reloptions(reloptions, validate, gpuivf_relopt_kind,
                                              sizeof(GpuivfOptions), tab, lengthof(tab));
    if (validate && opts != NULL && opts->pq_bits != 4 && opts->pq_bits != 8)
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                 errmsg("invalid value for option \"pq_bits\": %d", opts->pq_bits),
                 errdetail("Valid values are 4 and 8.")));
    return (bytea *) opts;
}

/*
 * The options of an index, with defaults when none were given (never NULL;
 * palloc'd in the current context when the relcache holds none).
 */
GpuivfOptions *
GpuivfGetOptions(Relation index)
{
    GpuivfOptions *opts = (GpuivfOptions *) index->rd_options;

    if (opts == NULL)
    {
        opts = (GpuivfOptions *) palloc0(sizeof(GpuivfOptions));
        SET_VARSIZE(opts, sizeof(GpuivfOptions));
        opts->lists = 0;
        opts->pq_m = 0;
        opts->pq_bits = GPUIVF_DEFAULT_PQ_BITS;
        opts->rerank = GPUIVF_DEFAULT_RERANK;
        opts->target_recall = GPUIVF_TARGET_UNSET;
        opts->rerank_from = GPUIVF_RERANK_FROM_AUTO;
    }
    return opts;
}

/*
 * The recall target of an index's scans (gpuivf.h).  An option set on the
 * index wins over the setting, whatever set the setting: the option travels
 * with the index to every session, connection pool and shard, where a
 * session's SET does not reach, and an object's own setting overriding the
 * general one is PostgreSQL's rule (a tablespace's random_page_cost, a
 * table's autovacuum options).
 */
double
GpuivfTargetRecall(Relation index, int *source)
{
    GpuivfOptions *opts = (GpuivfOptions *) index->rd_options;

    if (opts != NULL && opts->target_recall >= 0.0)
    {
        if (source)
            *source = GPUIVF_TARGET_INDEX;
        return opts->target_recall;
    }
    if (source)
        *source = GPUIVF_TARGET_SETTING;
    return gpuivf_target_recall;
}

/* Where a target came from, as EXPLAIN and gpuivf_index_info say it. */
const char *
GpuivfTargetSourceName(int source)
{
    return source == GPUIVF_TARGET_INDEX ? "index option" : "gpuivf.target_recall";
}

extern "C" {
PG_FUNCTION_INFO_V1(gpuivfhandler);
}

/* The IndexAmRoutine of gpuivf: an ORDER BY-only (kNN) access method. */
Datum
gpuivfhandler(PG_FUNCTION_ARGS)
{
    IndexAmRoutine *amroutine = makeNode(IndexAmRoutine);

    amroutine->amstrategies = GPUIVF_DISTANCE_STRATEGY;
    amroutine->amsupport = GPUIVF_NPROC;
    amroutine->amoptsprocnum = 0;
    amroutine->amcanorder = false;
    amroutine->amcanorderbyop = true;
    amroutine->amcanbackward = false;
    amroutine->amcanunique = false;
    amroutine->amcanmulticol = false;
    amroutine->amoptionalkey = true;
    amroutine->amsearcharray = false;
    amroutine->amsearchnulls = false;
    amroutine->amstorage = false;
    amroutine->amclusterable = false;
    amroutine->ampredlocks = false;
    amroutine->amcanparallel = false;
    amroutine->amcaninclude = false;
    amroutine->amusemaintenanceworkmem = true;
    amroutine->amparallelvacuumoptions = VACUUM_OPTION_PARALLEL_BULKDEL;
    amroutine->amkeytype = InvalidOid;

    amroutine->ambuild = gpuivfbuild;
    amroutine->ambuildempty = gpuivfbuildempty;
    amroutine->aminsert = gpuivfinsert;
    amroutine->ambulkdelete = gpuivfbulkdelete;
    amroutine->amvacuumcleanup = gpuivfvacuumcleanup;
    amroutine->amcanreturn = NULL;
    amroutine->amcostestimate = gpuivfcostestimate;
    amroutine->amoptions = gpuivfoptions;
    amroutine->amproperty = NULL;
    amroutine->ambuildphasename = gpuivfbuildphasename;
    amroutine->amvalidate = gpuivfvalidate;
    amroutine->amadjustmembers = NULL;
    amroutine->ambeginscan = gpuivfbeginscan;
    amroutine->amrescan = gpuivfrescan;
    amroutine->amgettuple = gpuivfgettuple;
    amroutine->amgetbitmap = NULL;
    amroutine->amendscan = gpuivfendscan;
    amroutine->ammarkpos = NULL;
    amroutine->amrestrpos = NULL;
    amroutine->amestimateparallelscan = NULL;
    amroutine->aminitparallelscan = NULL;
    amroutine->amparallelrescan = NULL;

    PG_RETURN_POINTER(amroutine);
}
