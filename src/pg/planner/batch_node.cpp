/*
 * planner/batch_node.cpp — the GpuivfBatchKnn custom scan (planner.h): reads
 * a nested loop's outer rows ahead in chunks, answers the LATERAL kNN search
 * of every row of a chunk with one GpuivfSearchBatch call per index (one
 * index for a table, one per partition's scan for a partitioned table), and
 * offers each row's round 1 on every index to the inner scans as the row is
 * returned.
 */
#include "gpuivf.h"
#include "planner/planner.h"
#include "search/search.h"
#include "storage/storage.h"

/* ========================================================= GpuivfBatchKnn */

/* One index the inner side scans (a partition's, or the table's): its
 * round-1 queries and answers for the current chunk. */
typedef struct BatchIndex
{
    Oid         indexoid;
    Relation    index;          /* opened at the first chunk */
    int         filter_ppm;
    uint64      version;        /* of the index's rows (GpuivfReadRows) */
    int         dims;
    GpuivfQuery *queries;       /* per row; vector NULL: not searched */
    GpuivfHit **hits;
    int        *nhits;
    bool        chunk_on_gpu;   /* the chunk's search ran on the GPU */
    int         chunk_batch;    /* queries in the chunk's search */
} BatchIndex;

typedef struct BatchState
{
    CustomScanState css;
    PlanState  *child;          /* the nested loop's outer side */
    int         nindexes;
    BatchIndex *indexes;
    bool        with_ties;
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
    int         params_at;

    bs->child = ExecInitNode(child_plan, estate, eflags);
    node->custom_ps = lappend(NIL, bs->child);
    bs->with_ties = list_nth_int(priv, BATCH_WITH_TIES) != 0;
    bs->nindexes = list_nth_int(priv, BATCH_NINDEXES);
    bs->indexes = (BatchIndex *) palloc0(sizeof(BatchIndex) * bs->nindexes);
    for (int j = 0; j < bs->nindexes; j++)
    {
        bs->indexes[j].indexoid = (Oid) list_nth_int(priv, BATCH_INDEXES + 2 * j);
        bs->indexes[j].filter_ppm = list_nth_int(priv, BATCH_INDEXES + 2 * j + 1);
    }
    params_at = BATCH_INDEXES + 2 * bs->nindexes;
    bs->nparams = (list_length(priv) - params_at) / 2;
    bs->paramnos = (int *) palloc(sizeof(int) * Max(bs->nparams, 1));
    bs->attnos = (AttrNumber *) palloc(sizeof(AttrNumber) * Max(bs->nparams, 1));
    for (int i = 0; i < bs->nparams; i++)
    {
        bs->paramnos[i] = list_nth_int(priv, params_at + 2 * i);
        bs->attnos[i] = (AttrNumber) list_nth_int(priv, params_at + 2 * i + 1);
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
 * The query vector of the outer row as the inner scans will see it, copied
 * into the chunk context (its length in *n), or NULL when a scan returns no
 * rows or raises an error for it (NULL, wrong shape, NaN or out of range):
 * then the scans search themselves, as in a plain nested loop.  A vector of
 * other dimensions than an index's is not searched on that index (LoadChunk).
 */
static float4 *
RowQueryVector(BatchState *bs, int *n)
{
    ExprContext *econtext = bs->css.ss.ps.ps_ExprContext;
    bool        isnull;
    Datum       d;
    GpuivfVectorType type;
    const float4 *x;
    float4     *copy;
    MemoryContext oldcxt;

    if (bs->nindexes == 0)
        return NULL;
    /* every index of the node is on the same column type (a partitioned
     * index's partitions share its operator class) */
    type = GpuivfGetOpclassInfo(bs->indexes[0].index).type;
    d = ExecEvalExprSwitchContext(bs->arg_state, econtext, &isnull);
    if (isnull)
        return NULL;
    /* a detoasted (or widened) copy lives until the next row's ResetExprContext */
    oldcxt = MemoryContextSwitchTo(econtext->ecxt_per_tuple_memory);
    x = GpuivfVectorValuesIfValid(type, d, n);
    MemoryContextSwitchTo(oldcxt);
    if (x == NULL)
        return NULL;
    copy = (float4 *) MemoryContextAlloc(bs->chunk_ctx, sizeof(float4) * *n);
    memcpy(copy, x, sizeof(float4) * *n);
    return copy;
}

/* Answers one index's queries of the chunk with one GpuivfSearchBatch call. */
static void
SearchIndex(BatchState *bs, BatchIndex *bi, const GpuivfMetaPageData *meta)
{
    MemoryContext oldcxt = MemoryContextSwitchTo(bs->chunk_ctx);
    GpuivfQuery *qs = (GpuivfQuery *) palloc(sizeof(GpuivfQuery) * Max(bs->nrows, 1));
    int        *qrow = (int *) palloc(sizeof(int) * Max(bs->nrows, 1));
    GpuivfHit **qhits;
    int        *qnhits;
    int         nq = 0;
    GpuivfSearchStats st;
    instr_time  start;
    instr_time  elapsed;

    for (int r = 0; r < bs->nrows; r++)
        if (bi->queries[r].vector != NULL)
        {
            qs[nq] = bi->queries[r];
            qrow[nq++] = r;
        }
    if (nq == 0)
    {
        MemoryContextSwitchTo(oldcxt);
        return;
    }
    qhits = (GpuivfHit **) palloc0(sizeof(GpuivfHit *) * nq);
    qnhits = (int *) palloc0(sizeof(int) * nq);
    INSTR_TIME_SET_CURRENT(start);
    GpuivfSearchBatch(bi->index, nq, qs, qhits, qnhits, &st, meta);
    INSTR_TIME_SET_CURRENT(elapsed);
    INSTR_TIME_SUBTRACT(elapsed, start);
    MemoryContextSwitchTo(oldcxt);
    for (int i = 0; i < nq; i++)
    {
        bi->hits[qrow[i]] = qhits[i];
        bi->nhits[qrow[i]] = qnhits[i];
    }
    bs->batches++;
    bs->searched += nq;
    bs->max_batch = Max(bs->max_batch, nq);
    bs->on_gpu += st.on_gpu ? 1 : 0;
    bs->gpu_ms += st.gpu_ms;
    bs->reranked += st.reranked;
    bs->search_ms += INSTR_TIME_GET_MILLISEC(elapsed);
    /* what each offer of this chunk carries */
    bi->chunk_on_gpu = st.on_gpu;
    bi->chunk_batch = nq;
}

/*
 * Reads the next chunk of outer rows into the tuplestore, computes each
 * row's round-1 query on every index (its parameters set as the nested loop
 * will set them) and answers them with one GpuivfSearchBatch call per index.
 */
static void
LoadChunk(BatchState *bs)
{
    EState     *estate = bs->css.ss.ps.state;
    ExprContext *econtext = bs->css.ss.ps.ps_ExprContext;
    ParamExecData *prm = estate->es_param_exec_vals;
    GpuivfMetaPageData *metas;
    MemoryContext oldcxt;
    int         cap = bs->chunk_target;

    MemoryContextReset(bs->chunk_ctx);
    tuplestore_clear(bs->store);
    bs->nrows = 0;
    bs->pos = 0;

    oldcxt = MemoryContextSwitchTo(bs->chunk_ctx);
    metas = (GpuivfMetaPageData *) palloc(sizeof(GpuivfMetaPageData) * bs->nindexes);
    for (int j = 0; j < bs->nindexes; j++)
    {
        BatchIndex *bi = &bs->indexes[j];

        if (bi->index == NULL)
            bi->index = index_open(bi->indexoid, AccessShareLock);
        GpuivfReadMeta(bi->index, &metas[j]);
        bi->version = GpuivfReadRows(bi->index, &metas[j]);
        bi->dims = (int) metas[j].dims;
        bi->queries = (GpuivfQuery *) palloc0(sizeof(GpuivfQuery) * cap);
        bi->hits = (GpuivfHit **) palloc0(sizeof(GpuivfHit *) * cap);
        bi->nhits = (int *) palloc0(sizeof(int) * cap);
    }
    MemoryContextSwitchTo(oldcxt);

    while (bs->nrows < cap)
    {
        TupleTableSlot *slot = ExecProcNode(bs->child);
        float4     *vector;
        int         n = 0;
        int64       count;
        int64       offset;
        bool        has;

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
        vector = RowQueryVector(bs, &n);
        if (vector != NULL)
        {
            has = EvalLimit(bs->count_state, bs->offset_state, econtext, &count, &offset);
            for (int j = 0; j < bs->nindexes; j++)
            {
                BatchIndex *bi = &bs->indexes[j];
                int64       hint = HintFromLimit(has, count, offset, bs->with_ties, bi->filter_ppm);
                GpuivfQuery *q = &bi->queries[bs->nrows];

                if (bi->dims <= 0 || n != bi->dims)
                    continue;   /* that scan raises its error, or finds nothing */
                GpuivfMakeQuery(bi->index, &metas[j], hint, bi->filter_ppm / 1e6, vector, q, NULL);
                /* a limit of 0 runs no scan; an exact scan without a limit
                 * sorts everything itself */
                if ((has && count <= 0) || (hint <= 0 && GpuivfQueryIsExact(&metas[j], q)))
                    q->vector = NULL;
            }
        }
        bs->nrows++;
    }
    bs->rows_read += bs->nrows;
    bs->chunk_target = Min(bs->chunk_target * 2, GPUIVF_BATCH_MAX);

    for (int j = 0; j < bs->nindexes; j++)
        SearchIndex(bs, &bs->indexes[j], &metas[j]);
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
    GpuivfClearOffer();
    for (int j = 0; j < bs->nindexes; j++)
    {
        BatchIndex *bi = &bs->indexes[j];
        GpuivfSearchStats st;

        if (bi->queries[bs->pos].vector == NULL)
            continue;
        memset(&st, 0, sizeof(st));
        st.on_gpu = bi->chunk_on_gpu;
        st.batch_size = bi->chunk_batch;
        GpuivfOfferRoundOne(bi->indexoid, bi->version, &bi->queries[bs->pos], bi->dims,
                            bi->hits[bs->pos], bi->nhits[bs->pos], &st);
    }
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
    for (int j = 0; j < bs->nindexes; j++)
        if (bs->indexes[j].index != NULL)
            index_close(bs->indexes[j].index, AccessShareLock);
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

    if (bs->nindexes == 1)
    {
        char       *name = get_rel_name(bs->indexes[0].indexoid);

        ExplainPropertyText("Index", name ? name : "?", es);
    }
    else
    {
        List       *names = NIL;

        for (int j = 0; j < bs->nindexes; j++)
        {
            char       *name = get_rel_name(bs->indexes[j].indexoid);

            names = lappend(names, name ? name : pstrdup("?"));
        }
        ExplainPropertyList("Indexes", names, es);
    }
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
