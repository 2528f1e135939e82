/*
 * am/calibrate.cpp — the SQL function gpuivf_calibrate(index regclass, query text):
 * calibrate an index on the query vectors the first column of `query`
 * returns (e.g. 'SELECT embedding FROM past_queries'), and store them as
 * its calibration queries (source "given"), which later ANALYZEs measure on
 * again.  With query NULL the index goes back to calibrating on rows.
 *
 * Privileges: SELECT on the index's table (checked first, before any
 * lock), and ownership of the table (or of the database), as ANALYZE
 * wants: the calibration decides how every user's queries on the table
 * are searched.  The query runs read-only with the caller's own
 * privileges.  Locks: the table ShareUpdateExclusiveLock (as ANALYZE: one
 * calibration at a time, inserts and queries go on), the index
 * RowExclusiveLock.
 *
 * Vectors: each value of the first column is cast to the type the index
 * holds (assignment casts, as INSERT would: real[] from double precision[]
 * or numeric[], pgvector's types through their casts) and then read
 * exactly as the index reads its rows (GpuivfRowVector), so every type the
 * index supports is accepted the way the index accepts it.  NULLs are
 * skipped; a vector of other dimensions is an error.  More rows than
 * gpuivf.analyze_sample: a uniform sample of them (fixed seed).
 */
#include "gpuivf.h"
#include "am/am.h"
#include "calibration/calibration.h"
#include "storage/storage.h"

extern "C" {
PG_FUNCTION_INFO_V1(gpuivf_calibrate);
}

#define GIVEN_FETCH     1000
#define GIVEN_SEED      UINT64CONST(0x6770756976660011)

/* Turns a value of the query's first column into the index's key type. */
typedef struct KeyCast
{
    Oid         from;
    ExprState  *expr;           /* NULL: the types are the same */
    ParamListInfo params;
    ExprContext *econtext;
} KeyCast;

static void
KeyCastInit(KeyCast *kc, Relation index, Oid from)
{
    Oid         keytype = TupleDescAttr(RelationGetDescr(index), 0)->atttypid;
    Param      *param;
    Node       *expr;

    memset(kc, 0, sizeof(*kc));
    kc->from = from;
    if (from == keytype)
        return;
    param = makeNode(Param);
    param->paramkind = PARAM_EXTERN;
    param->paramid = 1;
    param->paramtype = from;
    param->paramtypmod = -1;
    param->paramcollid = InvalidOid;
    param->location = -1;
    expr = coerce_to_target_type(NULL, (Node *) param, from, keytype, -1, COERCION_ASSIGNMENT,
                                 COERCE_IMPLICIT_CAST, -1);
    if (expr == NULL)
        ereport(ERROR,
                (errcode(ERRCODE_DATATYPE_MISMATCH),
                 errmsg("the first column of the query is of type %s, which cannot be cast to %s, the type index \"%s\" holds",
                        format_type_be(from), format_type_be(keytype),
                        RelationGetRelationName(index)),
                 errhint("Return the query vectors as %s.", format_type_be(keytype))));
    kc->params = makeParamList(1);
    kc->params->numParams = 1;
    kc->params->params[0].ptype = from;
    kc->params->params[0].pflags = PARAM_FLAG_CONST;
    kc->expr = ExecInitExprWithParams((Expr *) expr, kc->params);
    kc->econtext = CreateStandaloneExprContext();
    kc->econtext->ecxt_param_list_info = kc->params;
}

static Datum
KeyCastApply(KeyCast *kc, Datum value, bool *isnull)
{
    if (kc->expr == NULL)
        return value;
    kc->params->params[0].value = value;
    kc->params->params[0].isnull = *isnull;
    return ExecEvalExprSwitchContext(kc->expr, kc->econtext, isnull);
}

/* Errors from the user's query say where they come from. */
static void
QueryErrorContext(void *arg)
{
    errcontext("query given to gpuivf_calibrate (which runs it read-only): %s", (const char *) arg);
}

/* The query's vectors, up to max of them (a uniform sample beyond), into
 * *out (allocated in ctx); returns how many. */
static int
RunQuery(Relation index, const char *sql, int dims, int max, MemoryContext ctx, float4 **out)
{
    SPIPlanPtr  plan;
    Portal      portal;
    KeyCast     kc;
    bool        cast_ready = false;
    int64       seen = 0;
    int         held = 0;
    pg_prng_state prng;
    MemoryContext rowctx;
    float4     *x = (float4 *) MemoryContextAllocExtended(ctx, sizeof(float4) * (Size) max * dims,
                                                          MCXT_ALLOC_HUGE);
    GpuivfVectorType type = GpuivfGetOpclassInfo(index).type;
    ErrorContextCallback errcb;

    pg_prng_seed(&prng, GIVEN_SEED);
    errcb.callback = QueryErrorContext;
    errcb.arg = (void *) sql;
    errcb.previous = error_context_stack;
    error_context_stack = &errcb;
    SPI_connect();
    rowctx = AllocSetContextCreate(CurrentMemoryContext, "gpuivf_calibrate row",
                                   ALLOCSET_DEFAULT_SIZES);
    plan = SPI_prepare(sql, 0, NULL);
    if (plan == NULL)
        elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
    if (!SPI_is_cursor_plan(plan) || list_length(SPI_plan_get_plan_sources(plan)) != 1 ||
        ((CachedPlanSource *) linitial(SPI_plan_get_plan_sources(plan)))->commandTag != CMDTAG_SELECT)
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                 errmsg("the query of gpuivf_calibrate must be one SELECT"),
                 errhint("Pass a query such as 'SELECT embedding FROM past_queries'.")));
    /* read-only: the query cannot change data */
    portal = SPI_cursor_open(NULL, plan, NULL, NULL, true);
    for (;;)
    {
        SPI_cursor_fetch(portal, true, GIVEN_FETCH);
        if (SPI_processed == 0)
            break;
        if (!cast_ready)
        {
            KeyCastInit(&kc, index, SPI_gettypeid(SPI_tuptable->tupdesc, 1));
            cast_ready = true;
        }
        for (uint64 r = 0; r < SPI_processed; r++)
        {
            bool        isnull;
            Datum       value = SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1, &isnull);
            const float4 *v;
            int         d;
            int64       slot;
            MemoryContext old = MemoryContextSwitchTo(rowctx);

            value = KeyCastApply(&kc, value, &isnull);
            v = GpuivfRowVector(type, &value, &isnull, rowctx, &d);
            MemoryContextSwitchTo(old);
            if (v != NULL)
            {
                if (d != dims)
                    ereport(ERROR,
                            (errcode(ERRCODE_DATA_EXCEPTION),
                             errmsg("query vector " INT64_FORMAT " has %d dimensions, index \"%s\" has %d",
                                    seen + 1, d, RelationGetRelationName(index), dims)));
                slot = GpuivfReservoirSlot(&prng, held, max, seen);
                if (slot == held)
                    held++;
                if (slot >= 0)
                    memcpy(x + (Size) slot * dims, v, sizeof(float4) * dims);
                seen++;
            }
            MemoryContextReset(rowctx);
            if (kc.econtext != NULL)
                ResetExprContext(kc.econtext);
        }
        SPI_freetuptable(SPI_tuptable);
        CHECK_FOR_INTERRUPTS();
    }
    SPI_cursor_close(portal);
    if (cast_ready && kc.econtext != NULL)
        FreeExprContext(kc.econtext, true);
    SPI_finish();
    error_context_stack = errcb.previous;
    *out = x;
    return held;
}

/* gpuivf_calibrate(index regclass, query text) RETURNS jsonb */
Datum
gpuivf_calibrate(PG_FUNCTION_ARGS)
{
    Oid         relid;
    Oid         heapid;
    bool        partitioned;
    Relation    heap;
    Relation    index;
    GpuivfMetaPageData meta;
    float4     *queries = NULL;
    int         nq = 0;
    StringInfoData json;

    if (PG_ARGISNULL(0))
        PG_RETURN_NULL();
    relid = PG_GETARG_OID(0);
    /* privileges first, without a lock (GpuivfCheckIndexArg: SELECT) */
    heapid = GpuivfCheckIndexArg(relid, &partitioned);
    if (partitioned)
        ereport(ERROR,
                (errcode(ERRCODE_WRONG_OBJECT_TYPE),
                 errmsg("\"%s\" is a partitioned index", get_rel_name(relid)),
                 errhint("Call gpuivf_calibrate on the index of each partition.")));
    if (!pg_class_ownercheck(heapid, GetUserId()) &&
        !(pg_database_ownercheck(MyDatabaseId, GetUserId()) && !IsSharedRelation(heapid)))
        ereport(ERROR,
                (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                 errmsg("must be owner of table %s to calibrate its index", get_rel_name(heapid)),
                 errdetail("A calibration chooses the probes of every query on the table, as ANALYZE does.")));
    index = GpuivfOpenCheckedIndexLocked(relid, heapid, ShareUpdateExclusiveLock, RowExclusiveLock,
                                         &heap);
    GpuivfReadMeta(index, &meta);
    if (!GpuivfMetaIsTrained(&meta) || meta.lists == 0)
        ereport(ERROR,
                (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                 errmsg("gpuivf index \"%s\" is not trained", RelationGetRelationName(index)),
                 errdetail("An untrained index answers every query exactly; there is nothing to calibrate."),
                 errhint("Run REINDEX INDEX %s once its table has rows.", RelationGetRelationName(index))));
    if (!PG_ARGISNULL(1))
    {
        char       *sql = text_to_cstring(PG_GETARG_TEXT_PP(1));
        int         max = Max(gpuivf_analyze_sample, 2);

        nq = RunQuery(index, sql, (int) meta.dims, max, CurrentMemoryContext, &queries);
        if (nq < 2)
            ereport(ERROR,
                    (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                     errmsg_plural("the query of gpuivf_calibrate returned %d query vector, at least 2 are needed",
                                   "the query of gpuivf_calibrate returned %d query vectors, at least 2 are needed",
                                   nq, nq)));
    }
    if (!GpuivfCalibrateOn(index, heap, queries, nq))
        ereport(ERROR,
                (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                 errmsg("gpuivf index \"%s\" could not be calibrated", RelationGetRelationName(index)),
                 errdetail("It has fewer than 2 rows, or was rebuilt meanwhile.")));
    GpuivfReadMeta(index, &meta);
    initStringInfo(&json);
    appendStringInfoChar(&json, '{');
    GpuivfAppendCalibrationInfo(&json, index, &meta);
    /* its members end in ", " */
    if (json.len >= 2 && json.data[json.len - 2] == ',')
        json.data[json.len -= 2] = '\0';
    appendStringInfoChar(&json, '}');
    index_close(index, RowExclusiveLock);
    table_close(heap, ShareUpdateExclusiveLock);
    PG_RETURN_DATUM(DirectFunctionCall1(jsonb_in, CStringGetDatum(json.data)));
}
