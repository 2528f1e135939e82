/*
 * planner/batch_node.cpp — the GpuivfBatchKnn custom scan (planner.h): reads
 * a nested loop's outer rows ahead in chunks, answers the LATERAL kNN search
 * of every row of a chunk with one GpuivfSearchBatch call, and offers each
 * row's round 1 to the inner scan as the row is returned.
 */
#include "gpuivf.h"
#include "planner/planner.h"
#include "search/search.h"
#include "storage/storage.h"

/* ========================================================= GpuivfBatchKnn */

typedef struct BatchState
{
    CustomScanState css;
    PlanState  *child;          /* the nested loop's outer side */
    Oid         indexoid;
    Relation    index;          /* opened at the first chunk */
    bool        with_ties;
    int         filter_ppm;
    int         nparams;
    int        *paramnos;
    AttrNumber *attnos;
    ExprState  *arg_state;      /* the query vector */
    ExprState  *count_state;
    ExprState  *offset_state;
    double      est_rows;       /* the planner's outer rows */

    /* the current chunk */
    MemoryContext chunk_ctx;
    Tuplestorestate *store;
    TupleTableSlot *out_slot;
    int         nrows;
    int         pos;
    bool        child_done;
    int         chunk_target;
    GpuivfQuery *queries;       /* per row; vector NULL: not searched */
    GpuivfHit **hits;
    int        *nhits;
    uint64      generation;
    int         dims;
    bool        chunk_on_gpu;   /* the chunk's search ran on the GPU */
    int         chunk_batch;    /* queries in the chunk's search */

    /* EXPLAIN ANALYZE */
    int64       batches;
    int64       searched;
    int64       rows_read;
    int         max_batch;
    int64       on_gpu;
    double      gpu_ms;
    double      search_ms;
    int64       reranked;
} BatchState;

static void BatchBegin(CustomScanState *node, EState *estate, int eflags);
static TupleTableSlot *BatchExec(CustomScanState *node);
static void BatchEnd(CustomScanState *node);
static void BatchReScan(CustomScanState *node);
static void BatchExplain(CustomScanState *node, List *ancestors, ExplainState *es);

static const CustomExecMethods batch_exec_methods = {
    GPUIVF_BATCH_NAME,
    BatchBegin, BatchExec, BatchEnd, BatchReScan,
    NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    BatchExplain
};

Node *
BatchCreateState(CustomScan *cscan)
{
    BatchState *bs = (BatchState *) palloc0(sizeof(BatchState));

    NodeSetTag(bs, T_CustomScanState);
    bs->css.methods = &batch_exec_methods;
    return (Node *) bs;
}

/* First chunk: the planner's outer rows within [GPUIVF_BATCH_MIN, MAX]. */
static int
FirstChunk(double est_rows)
{
    return (int) Min(Max(est_rows, (double) GPUIVF_BATCH_MIN), (double) GPUIVF_BATCH_MAX);
}

static void
BatchBegin(CustomScanState *node, EState *estate, int eflags)
{
    BatchState *bs = (BatchState *) node;
    CustomScan *cscan = (CustomScan *) node->ss.ps.plan;
    Plan       *child_plan = (Plan *) linitial(cscan->custom_plans);
    List       *priv = cscan->custom_private;

    bs->child = ExecInitNode(child_plan, estate, eflags);
    node->custom_ps = lappend(NIL, bs->child);
    bs->indexoid = (Oid) list_nth_int(priv, BATCH_INDEXOID);
    bs->with_ties = list_nth_int(priv, BATCH_WITH_TIES) != 0;
    bs->filter_ppm = list_nth_int(priv, BATCH_FILTER_PPM);
    bs->nparams = (list_length(priv) - BATCH_PARAMS) / 2;
    bs->paramnos = (int *) palloc(sizeof(int) * Max(bs->nparams, 1));
    bs->attnos = (AttrNumber *) palloc(sizeof(AttrNumber) * Max(bs->nparams, 1));
    for (int i = 0; i < bs->nparams; i++)
    {
        bs->paramnos[i] = list_nth_int(priv, BATCH_PARAMS + 2 * i);
        bs->attnos[i] = (AttrNumber) list_nth_int(priv, BATCH_PARAMS + 2 * i + 1);
    }
    bs->arg_state = ExecInitExpr((Expr *) linitial(cscan->custom_exprs), &node->ss.ps);
    bs->count_state = ExecInitExpr((Expr *) lsecond(cscan->custom_exprs), &node->ss.ps);
    bs->offset_state = ExecInitExpr((Expr *) lthird(cscan->custom_exprs), &node->ss.ps);
    bs->est_rows = child_plan->plan_rows;
    bs->chunk_target = FirstChunk(bs->est_rows);

    /* we return the buffered outer rows in a slot of our own */
    bs->out_slot = ExecInitExtraTupleSlot(estate, ExecGetResultType(bs->child),
                                          &TTSOpsMinimalTuple);
    node->ss.ps.resultops = &TTSOpsMinimalTuple;
    node->ss.ps.resultopsfixed = true;
    node->ss.ps.resultopsset = true;

    if (eflags & EXEC_FLAG_EXPLAIN_ONLY)
        return;
    bs->chunk_ctx = AllocSetContextCreate(estate->es_query_cxt, "gpuivf batch chunk",
                                          ALLOCSET_DEFAULT_SIZES);
    bs->store = tuplestore_begin_heap(false, false, work_mem);
}

/*
 * The query vector of the outer row in slot as the inner scan will see it,
 * copied into the chunk context, or NULL when that scan returns no rows or
 * raises an error (NULL, wrong shape, NaN, other dims): then it searches
 * itself, as in a plain nested loop.
 */
static float4 *
RowQueryVector(BatchState *bs, TupleTableSlot *slot)
{
    ExprContext *econtext = bs->css.ss.ps.ps_ExprContext;
    bool        isnull;
    Datum       d;
    ArrayType  *array;
    int         n;
    const float4 *x;
    float4     *copy;
    MemoryContext oldcxt;

    d = ExecEvalExprSwitchContext(bs->arg_state, econtext, &isnull);
    if (isnull)
        return NULL;
    /* a detoasted copy lives until the next row's ResetExprContext */
    oldcxt = MemoryContextSwitchTo(econtext->ecxt_per_tuple_memory);
    array = DatumGetArrayTypeP(d);
    MemoryContextSwitchTo(oldcxt);
    if (ARR_ELEMTYPE(array) != FLOAT4OID || ARR_NDIM(array) != 1 || ARR_HASNULL(array))
        return NULL;
    n = ArrayGetNItems(ARR_NDIM(array), ARR_DIMS(array));
    if (n <= 0 || n != bs->dims)
        return NULL;
    x = (const float4 *) ARR_DATA_PTR(array);
    for (int i = 0; i < n; i++)
        if (!std::isfinite(x[i]))
            return NULL;
    copy = (float4 *) MemoryContextAlloc(bs->chunk_ctx, sizeof(float4) * n);
    memcpy(copy, x, sizeof(float4) * n);
    (void) slot;
    return copy;
}

/*
 * Reads the next chunk of outer rows into the tuplestore, computes each
 * row's round-1 query (its parameters set as the nested loop will set
 * them) and answers them all with one GpuivfSearchBatch call.
 */
static void
LoadChunk(BatchState *bs)
{
    EState     *estate = bs->css.ss.ps.state;
    ExprContext *econtext = bs->css.ss.ps.ps_ExprContext;
    ParamExecData *prm = estate->es_param_exec_vals;
    GpuivfMetaPageData meta;
    MemoryContext oldcxt;
    int         cap = bs->chunk_target;
    int         nq = 0;
    GpuivfQuery *qs;
    int        *qrow;
    GpuivfHit **qhits;
    int        *qnhits;
    GpuivfSearchStats st;
    instr_time  start;
    instr_time  elapsed;

    MemoryContextReset(bs->chunk_ctx);
    tuplestore_clear(bs->store);
    bs->nrows = 0;
    bs->pos = 0;
    if (bs->index == NULL)
        bs->index = index_open(bs->indexoid, AccessShareLock);
    GpuivfReadMeta(bs->index, &meta);
    bs->generation = meta.generation;
    bs->dims = (int) meta.dims;

    oldcxt = MemoryContextSwitchTo(bs->chunk_ctx);
    bs->queries = (GpuivfQuery *) palloc0(sizeof(GpuivfQuery) * cap);
    bs->hits = (GpuivfHit **) palloc0(sizeof(GpuivfHit *) * cap);
    bs->nhits = (int *) palloc0(sizeof(int) * cap);
    qrow = (int *) palloc(sizeof(int) * cap);
    MemoryContextSwitchTo(oldcxt);

    while (bs->nrows < cap)
    {
        TupleTableSlot *slot = ExecProcNode(bs->child);
        float4     *vector;

        if (TupIsNull(slot))
        {
            bs->child_done = true;
            break;
        }
        tuplestore_puttupleslot(bs->store, slot);

        /* the nested loop's parameters for this row */
        for (int i = 0; i < bs->nparams; i++)
        {
            ParamExecData *p = &prm[bs->paramnos[i]];

            p->value = slot_getattr(slot, bs->attnos[i], &p->isnull);
        }
        ResetExprContext(econtext);
        vector = bs->dims > 0 ? RowQueryVector(bs, slot) : NULL;
        if (vector != NULL)
        {
            int64       count;
            int64       offset;
            bool        has = EvalLimit(bs->count_state, bs->offset_state, econtext,
                                        &count, &offset);
            int64       hint = HintFromLimit(has, count, offset, bs->with_ties, bs->filter_ppm);
            GpuivfQuery *q = &bs->queries[bs->nrows];

            GpuivfMakeQuery(bs->index, &meta, hint, bs->filter_ppm / 1e6, vector, q);
            /* a limit of 0 runs no scan; an exact scan without a limit
             * sorts everything itself */
            if ((has && count <= 0) || (hint <= 0 && GpuivfQueryIsExact(&meta, q)))
                q->vector = NULL;
            else
                qrow[nq++] = bs->nrows;
        }
        bs->nrows++;
    }
    bs->rows_read += bs->nrows;
    bs->chunk_target = Min(bs->chunk_target * 2, GPUIVF_BATCH_MAX);

    if (nq > 0)
    {
        oldcxt = MemoryContextSwitchTo(bs->chunk_ctx);
        qs = (GpuivfQuery *) palloc(sizeof(GpuivfQuery) * nq);
        qhits = (GpuivfHit **) palloc0(sizeof(GpuivfHit *) * nq);
        qnhits = (int *) palloc0(sizeof(int) * nq);
        for (int i = 0; i < nq; i++)
            qs[i] = bs->queries[qrow[i]];
        INSTR_TIME_SET_CURRENT(start);
        GpuivfSearchBatch(bs->index, nq, qs, qhits, qnhits, &st, &meta);
        INSTR_TIME_SET_CURRENT(elapsed);
        INSTR_TIME_SUBTRACT(elapsed, start);
        MemoryContextSwitchTo(oldcxt);
        for (int i = 0; i < nq; i++)
        {
            bs->hits[qrow[i]] = qhits[i];
            bs->nhits[qrow[i]] = qnhits[i];
        }
        bs->batches++;
        bs->searched += nq;
        bs->max_batch = Max(bs->max_batch, nq);
        bs->on_gpu += st.on_gpu ? 1 : 0;
        bs->gpu_ms += st.gpu_ms;
        bs->reranked += st.reranked;
        bs->search_ms += INSTR_TIME_GET_MILLISEC(elapsed);
        /* what each offer of this chunk carries */
        bs->chunk_on_gpu = st.on_gpu;
        bs->chunk_batch = nq;
    }
    tuplestore_rescan(bs->store);
}

/* Returns the next outer row and offers its round 1 to the inner scan. */
static TupleTableSlot *
BatchExec(CustomScanState *node)
{
    BatchState *bs = (BatchState *) node;

    if (bs->pos >= bs->nrows)
    {
        if (bs->child_done)
        {
            GpuivfClearOffer();
            return ExecClearTuple(bs->out_slot);
        }
        LoadChunk(bs);
        if (bs->nrows == 0)
        {
            GpuivfClearOffer();
            return ExecClearTuple(bs->out_slot);
        }
    }
    if (!tuplestore_gettupleslot(bs->store, true, false, bs->out_slot))
        elog(ERROR, "gpuivf batch lost an outer row");
    if (bs->queries[bs->pos].vector != NULL)
    {
        GpuivfSearchStats st;

        memset(&st, 0, sizeof(st));
        st.on_gpu = bs->chunk_on_gpu;
        st.batch_size = bs->chunk_batch;
        GpuivfOfferRoundOne(bs->indexoid, bs->generation, &bs->queries[bs->pos], bs->dims,
                            bs->hits[bs->pos], bs->nhits[bs->pos], &st);
    }
    else
        GpuivfClearOffer();
    bs->pos++;
    return bs->out_slot;
}

static void
BatchEnd(CustomScanState *node)
{
    BatchState *bs = (BatchState *) node;

    GpuivfClearOffer();
    ExecEndNode(bs->child);
    if (bs->store != NULL)
        tuplestore_end(bs->store);
    if (bs->index != NULL)
        index_close(bs->index, AccessShareLock);
}

/* Forgets the chunk and starts the outer side over. */
static void
BatchReScan(CustomScanState *node)
{
    BatchState *bs = (BatchState *) node;

    GpuivfClearOffer();
    bs->nrows = 0;
    bs->pos = 0;
    bs->child_done = false;
    bs->chunk_target = FirstChunk(bs->est_rows);
    if (bs->store != NULL)
        tuplestore_clear(bs->store);
    if (node->ss.ps.chgParam != NULL)
        UpdateChangedParamSet(bs->child, node->ss.ps.chgParam);
    if (bs->child->chgParam == NULL)
        ExecReScan(bs->child);
}

static void
BatchExplain(CustomScanState *node, List *ancestors, ExplainState *es)
{
    BatchState *bs = (BatchState *) node;
    char       *name = get_rel_name(bs->indexoid);

    ExplainPropertyText("Index", name ? name : "?", es);
    if (!es->analyze)
    {
        ExplainPropertyInteger("Max Batch", "rows", GPUIVF_BATCH_MAX, es);
        return;
    }
    ExplainPropertyInteger("Batches", NULL, bs->batches, es);
    ExplainPropertyInteger("Searches", NULL, bs->searched, es);
    ExplainPropertyInteger("Batch Size", NULL, bs->max_batch, es);
    ExplainPropertyText("Device", DeviceName(bs->on_gpu, bs->batches), es);
    ExplainPropertyInteger("Re-ranked", NULL, bs->reranked, es);
    if (es->timing)
    {
        ExplainPropertyFloat("Search Time", "ms", bs->search_ms, 3, es);
        ExplainPropertyFloat("GPU Time", "ms", bs->gpu_ms, 3, es);
    }
}
