/*
 * planner/knn_node.cpp — the GpuivfKnn custom scan (planner.h): passes the
 * rows of the Index Scan below it through, gives that scan its limit hint
 * at each (re)scan, and shows in EXPLAIN what the scan's engine did.  Also
 * the limit hints both custom scans compute.
 */
#include "gpuivf.h"
#include "planner/planner.h"
#include "am/am.h"
#include "search/search.h"

/* ======================================================== limit hints */

/* Rows a scan under a Limit needs: count + offset (+1 WITH TIES), raised
 * for the selectivity of its filter; 0 = unknown (no count). */
int64
HintFromLimit(bool has_count, int64 count, int64 offset, bool with_ties, int filter_ppm)
{
    double      rows;

    if (!has_count)
        return 0;
    rows = (double) Max(count, 0) + (double) Max(offset, 0) + (with_ties ? 1 : 0);
    return GpuivfRowsForFilter(rows, filter_ppm / 1e6);
}

/* Evaluates the LIMIT count and OFFSET expressions: false when there is no
 * count (LIMIT NULL / ALL). */
bool
EvalLimit(ExprState *count_state, ExprState *offset_state, ExprContext *econtext,
          int64 *count, int64 *offset)
{
    bool        isnull;
    Datum       d;

    *count = 0;
    *offset = 0;
    if (count_state == NULL)
        return false;
    d = ExecEvalExprSwitchContext(count_state, econtext, &isnull);
    if (isnull)
        return false;
    *count = DatumGetInt64(d);
    if (offset_state != NULL)
    {
        d = ExecEvalExprSwitchContext(offset_state, econtext, &isnull);
        if (!isnull)
            *offset = DatumGetInt64(d);
    }
    return true;
}

/* =============================================================== GpuivfKnn */

typedef struct KnnState
{
    CustomScanState css;
    PlanState  *child;          /* the Index Scan */
    Oid         indexoid;
    bool        with_ties;
    int         filter_ppm;
    ExprState  *count_state;
    ExprState  *offset_state;
    bool        need_hint;      /* set at (re)scan */
} KnnState;

static void KnnBegin(CustomScanState *node, EState *estate, int eflags);
static TupleTableSlot *KnnExec(CustomScanState *node);
static void KnnEnd(CustomScanState *node);
static void KnnReScan(CustomScanState *node);
static void KnnExplain(CustomScanState *node, List *ancestors, ExplainState *es);

static const CustomExecMethods knn_exec_methods = {
    GPUIVF_KNN_NAME,
    KnnBegin, KnnExec, KnnEnd, KnnReScan,
    NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    KnnExplain
};

Node *
KnnCreateState(CustomScan *cscan)
{
    KnnState   *ks = (KnnState *) palloc0(sizeof(KnnState));

    NodeSetTag(ks, T_CustomScanState);
    ks->css.methods = &knn_exec_methods;
    return (Node *) ks;
}

/* Starts the child; our result slots are the child's. */
static void
KnnBegin(CustomScanState *node, EState *estate, int eflags)
{
    KnnState   *ks = (KnnState *) node;
    CustomScan *cscan = (CustomScan *) node->ss.ps.plan;
    bool        fixed;

    ks->child = ExecInitNode((Plan *) linitial(cscan->custom_plans), estate, eflags);
    node->custom_ps = lappend(NIL, ks->child);
    node->ss.ps.resultops = ExecGetResultSlotOps(ks->child, &fixed);
    node->ss.ps.resultopsfixed = fixed;
    node->ss.ps.resultopsset = true;

    ks->indexoid = (Oid) list_nth_int(cscan->custom_private, KNN_INDEXOID);
    ks->with_ties = list_nth_int(cscan->custom_private, KNN_WITH_TIES) != 0;
    ks->filter_ppm = list_nth_int(cscan->custom_private, KNN_FILTER_PPM);
    if (list_nth_int(cscan->custom_private, KNN_HAS_LIMIT) != 0)
    {
        ks->count_state = ExecInitExpr((Expr *) linitial(cscan->custom_exprs), &node->ss.ps);
        ks->offset_state = ExecInitExpr((Expr *) lsecond(cscan->custom_exprs), &node->ss.ps);
    }
    ks->need_hint = true;
}

/*
 * Passes the child's rows through; before the first row of a (re)scan it
 * gives the scan its limit hint (on the scan descriptor, or pending for the
 * descriptor the child creates in this call).
 */
static TupleTableSlot *
KnnExec(CustomScanState *node)
{
    KnnState   *ks = (KnnState *) node;
    TupleTableSlot *slot;
    bool        pending = false;
    int64       hint;

    if (ks->need_hint)
    {
        IndexScanState *iss = (IndexScanState *) ks->child;
        int64       count;
        int64       offset;
        bool        has;

        ResetExprContext(node->ss.ps.ps_ExprContext);
        has = EvalLimit(ks->count_state, ks->offset_state,
                        node->ss.ps.ps_ExprContext, &count, &offset);
        hint = HintFromLimit(has, count, offset, ks->with_ties, ks->filter_ppm);

        ks->need_hint = false;
        if (IsA(iss, IndexScanState) && iss->iss_ScanDesc != NULL)
        {
            GpuivfScanSetLimitHint(iss->iss_ScanDesc, hint);
            GpuivfScanSetFilterSelectivity(iss->iss_ScanDesc, ks->filter_ppm / 1e6);
        }
        else
        {
            gpuivf_pending_limit_index = ks->indexoid;
            gpuivf_pending_limit_hint = hint;
            gpuivf_pending_filter_sel = ks->filter_ppm / 1e6;
            pending = true;
        }
    }
    slot = ExecProcNode(ks->child);
    if (pending)
    {
        gpuivf_pending_limit_index = InvalidOid;
        gpuivf_pending_limit_hint = 0;
        gpuivf_pending_filter_sel = 1.0;
    }
    return slot;
}

static void
KnnEnd(CustomScanState *node)
{
    ExecEndNode(((KnnState *) node)->child);
}

static void
KnnReScan(CustomScanState *node)
{
    KnnState   *ks = (KnnState *) node;

    ks->need_hint = true;
    if (node->ss.ps.chgParam != NULL)
        UpdateChangedParamSet(ks->child, node->ss.ps.chgParam);
    if (ks->child->chgParam == NULL)
        ExecReScan(ks->child);
}

/* Device of n scans of which on_gpu ran on the GPU. */
const char *
DeviceName(int64 on_gpu, int64 n)
{
    if (on_gpu == 0)
        return "CPU";
    return on_gpu >= n ? "GPU" : "GPU and CPU";
}

/* EXPLAIN: the recall target the probes are chosen for, and where it comes
 * from; text format as one line ("Target Recall: 0.950 (index option)") */
static void
ExplainTarget(double target, int source, ExplainState *es)
{
    if (es->format == EXPLAIN_FORMAT_TEXT)
    {
        /* what ExplainIndentText does (static in PostgreSQL 15) */
        appendStringInfoSpaces(es->str, es->indent * 2);
        appendStringInfo(es->str, "Target Recall: %.3f (%s)\n", target,
                         GpuivfTargetSourceName(source));
    }
    else
    {
        ExplainPropertyFloat("Target Recall", NULL, target, 3, es);
        ExplainPropertyText("Target From", GpuivfTargetSourceName(source), es);
    }
}

/* EXPLAIN: what the scans did (ANALYZE), or where the rows asked come from. */
static void
KnnExplain(CustomScanState *node, List *ancestors, ExplainState *es)
{
    KnnState   *ks = (KnnState *) node;
    IndexScanState *iss = (IndexScanState *) ks->child;
    const GpuivfScanStats *st = NULL;

    if (!es->analyze)
    {
        ExplainPropertyText("Rows Asked",
                            ks->count_state == NULL ? "rerank candidates per round" :
                            ks->filter_ppm < 1000000 ? "LIMIT raised for the filter" : "LIMIT",
                            es);
        if (ks->filter_ppm < 1000000)
            ExplainPropertyFloat("Filter Selectivity", NULL, ks->filter_ppm / 1e6, 4, es);
        if (es->verbose && gpuivf_probes == 0)
        {
            /* the planner locked the index */
            Relation    index = index_open(ks->indexoid, AccessShareLock);
            int         source;
            double      target = GpuivfTargetRecall(index, &source);

            index_close(index, AccessShareLock);
            ExplainTarget(target, source, es);
        }
        return;
    }
    if (IsA(iss, IndexScanState) && iss->iss_ScanDesc != NULL)
        st = GpuivfScanGetStats(iss->iss_ScanDesc);
    if (st == NULL || st->scans == 0)
    {
        ExplainPropertyInteger("Searches", NULL, 0, es);
        return;
    }
    if (st->exact == st->scans)
        ExplainPropertyText("Probes", "all lists (exact)", es);
    else
    {
        ExplainPropertyFloat("Probes", NULL, (double) st->probes_sum / st->scans, 0, es);
        ExplainPropertyText("Probes From", GpuivfProbeSourceName(st->probe_source, false), es);
        if (st->probe_source == GPUIVF_PROBES_CURVE)
            ExplainTarget(st->target_recall, st->target_source, es);
    }
    ExplainPropertyFloat("Rows Asked", NULL, (double) st->k_sum / st->scans, 0, es);
    if (st->depth > 0)
    {
        ExplainPropertyInteger("Re-rank Depth", NULL, st->depth, es);
        ExplainPropertyText("Re-rank Depth From", GpuivfDepthSourceName(st->depth_source, false), es);
    }
    ExplainPropertyFloat("Re-ranked", NULL, (double) st->reranked / st->scans, 0, es);
    ExplainPropertyText("Device", DeviceName(st->on_gpu, st->scans), es);
    ExplainPropertyFloat("Batch Size", NULL, (double) st->batch_sum / st->scans, 0, es);
    if (st->precomputed > 0 || es->format != EXPLAIN_FORMAT_TEXT)
        ExplainPropertyInteger("Batched Searches", NULL, st->precomputed, es);
    if (st->deepened > 0 || es->format != EXPLAIN_FORMAT_TEXT)
    {
        ExplainPropertyInteger("Deepened", NULL, st->deepened, es);
        ExplainPropertyInteger("Max Lists Visited", NULL, st->lists_max, es);
    }
    if (es->timing)
        ExplainPropertyFloat("GPU Time", "ms", st->gpu_ms, 3, es);
}
