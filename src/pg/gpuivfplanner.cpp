/*
 * gpuivfplanner.cpp — planner integration: the LIMIT reaches gpuivf scans,
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
 *                  parameters (a LATERAL kNN subquery).  It reads outer rows
 *                  ahead in chunks (up to GPUIVF_BATCH_MAX rows), computes
 *                  each row's query vector and LIMIT exactly as the inner
 *                  side will, answers all of them with one GpuivfSearchBatch
 *                  call, then returns the outer rows one by one, offering
 *                  each row's round 1 to the inner scan (GpuivfOfferRoundOne).
 *                  The inner plan still runs as before; its scan takes the
 *                  offer only when its own query is byte for byte the same
 *                  (gpuivfsearch.cpp), so the join returns what the nested
 *                  loop returns, rows and order, whatever else the inner
 *                  side does (filters, invisible rows, deeper rounds).
 *
 * Both nodes are parallel safe when their child is (they keep no shared
 * state; in a parallel worker each process batches its own outer rows) and
 * never parallel aware.  gpuivf.enable_batch_join = off at planning time
 * leaves nested loops alone.
 */
#include "gpuivf.h"

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

/* custom_private of GpuivfBatchKnn: indexoid, with_ties, filter_ppm, then
 * (paramno, outer attno) pairs of the nested loop's parameters */
#define BATCH_INDEXOID          0
#define BATCH_WITH_TIES         1
#define BATCH_FILTER_PPM        2
#define BATCH_PARAMS            3
/* custom_exprs of GpuivfBatchKnn: query vector expression, limitCount,
 * limitOffset */

/* PostgreSQL's list_makeN and copyObject macros use C-only syntax */
#define CopyNode(x)     ((__typeof__(x)) copyObjectImpl(x))
typedef bool (*TreeWalker) ();
#define WALKER(fn)      ((TreeWalker) (void (*) (void)) (fn))

static List *
IntList(int n, const int *values)
{
    List       *list = NIL;

    for (int i = 0; i < n; i++)
        list = lappend_int(list, values[i]);
    return list;
}

static List *
PtrList(int n, void *const *values)
{
    List       *list = NIL;

    for (int i = 0; i < n; i++)
        list = lappend(list, values[i]);
    return list;
}

static planner_hook_type prev_planner_hook = NULL;
static ExecutorStart_hook_type prev_executor_start_hook = NULL;

static Node *KnnCreateState(CustomScan *cscan);
static Node *BatchCreateState(CustomScan *cscan);

static const CustomScanMethods knn_plan_methods = {GPUIVF_KNN_NAME, KnnCreateState};
static const CustomScanMethods batch_plan_methods = {GPUIVF_BATCH_NAME, BatchCreateState};

/* ================================================================ helpers */

/* Is this the GpuivfKnn / GpuivfBatchKnn custom scan? */
static bool
IsOurScan(Plan *plan, const CustomScanMethods *methods)
{
    return plan != NULL && IsA(plan, CustomScan) &&
        (((CustomScan *) plan)->methods == methods ||
         strcmp(((CustomScan *) plan)->methods->CustomName, methods->CustomName) == 0);
}

/*
 * Is the index a gpuivf index?  Decided by the access method's gettuple
 * function; one positive and a few negative access method OIDs are cached.
 */
static bool
IsGpuivfIndex(Oid indexoid)
{
    static Oid  gpuivf_am = InvalidOid;
    static Oid  other_am[8];
    static int  nother = 0;
    HeapTuple   tp;
    Oid         relam;
    IndexAmRoutine *routine;

    tp = SearchSysCache1(RELOID, ObjectIdGetDatum(indexoid));
    if (!HeapTupleIsValid(tp))
        return false;
    relam = ((Form_pg_class) GETSTRUCT(tp))->relam;
    ReleaseSysCache(tp);
    if (!OidIsValid(relam))
        return false;
    if (relam == gpuivf_am)
        return true;
    for (int i = 0; i < nother; i++)
        if (other_am[i] == relam)
            return false;

    routine = GetIndexAmRoutineByAmId(relam, true);
    if (routine != NULL && routine->amgettuple == gpuivfgettuple)
    {
        gpuivf_am = relam;
        pfree(routine);
        return true;
    }
    if (routine != NULL)
        pfree(routine);
    if (nother < (int) lengthof(other_am))
        other_am[nother++] = relam;
    return false;
}

/* Does an expression contain a sub-plan? */
static bool
ContainsSubplanWalker(Node *node, void *context)
{
    if (node == NULL)
        return false;
    if (IsA(node, SubPlan) || IsA(node, AlternativeSubPlan))
        return true;
    return expression_tree_walker(node, WALKER(ContainsSubplanWalker), context);
}

/* May we evaluate this (planned) expression a second time, elsewhere? */
static bool
SafeToEvaluate(Node *expr)
{
    if (expr == NULL)
        return true;
    return !contain_volatile_functions_after_planning((Expr *) expr) &&
        !ContainsSubplanWalker(expr, NULL);
}

/*
 * A pass-through target list over a child with target list child_tlist:
 * our tlist references the scan tuple (INDEX_VAR), whose columns are the
 * child's (custom_scan_tlist of OUTER_VAR Vars; lefttree = child makes
 * EXPLAIN VERBOSE resolve them).
 */
static void
MakePassThroughTlists(List *child_tlist, List **tlist, List **scan_tlist)
{
    ListCell   *lc;
    AttrNumber  attno = 0;

    *tlist = NIL;
    *scan_tlist = NIL;
    foreach(lc, child_tlist)
    {
        TargetEntry *tle = (TargetEntry *) lfirst(lc);
        Node       *expr = (Node *) tle->expr;
        Var        *outer_var;
        Var        *scan_var;

        attno++;
        outer_var = makeVar(OUTER_VAR, attno, exprType(expr), exprTypmod(expr),
                            exprCollation(expr), 0);
        scan_var = makeVar(INDEX_VAR, attno, exprType(expr), exprTypmod(expr),
                           exprCollation(expr), 0);
        *scan_tlist = lappend(*scan_tlist,
                              makeTargetEntry((Expr *) outer_var, attno,
                                              tle->resname ? pstrdup(tle->resname) : NULL,
                                              tle->resjunk));
        *tlist = lappend(*tlist,
                         makeTargetEntry((Expr *) scan_var, attno,
                                         tle->resname ? pstrdup(tle->resname) : NULL,
                                         tle->resjunk));
    }
}

/* A CustomScan that passes its one child's rows through. */
static CustomScan *
MakeWrapper(Plan *child, const CustomScanMethods *methods, int plan_node_id)
{
    CustomScan *cscan = makeNode(CustomScan);
    Plan       *plan = &cscan->scan.plan;

    plan->startup_cost = child->startup_cost;
    plan->total_cost = child->total_cost;
    plan->plan_rows = child->plan_rows;
    plan->plan_width = child->plan_width;
    plan->parallel_aware = false;
    plan->parallel_safe = child->parallel_safe;
    plan->async_capable = false;
    plan->plan_node_id = plan_node_id;
    plan->qual = NIL;
    plan->lefttree = child;     /* for EXPLAIN's deparsing only */
    plan->righttree = NULL;
    plan->initPlan = NIL;
    plan->extParam = bms_copy(child->extParam);
    plan->allParam = bms_copy(child->allParam);
    MakePassThroughTlists(child->targetlist, &plan->targetlist, &cscan->custom_scan_tlist);

    cscan->scan.scanrelid = 0;
    cscan->flags = 0;
    cscan->custom_plans = lappend(NIL, child);
    cscan->custom_exprs = NIL;
    cscan->custom_private = NIL;
    cscan->custom_relids = NULL;
    cscan->methods = methods;
    return cscan;
}

/* ============================================================ rewriting */

/* what the rewrite knows on its way down */
typedef struct RewriteContext
{
    int         next_node_id;   /* for the nodes it adds */
    bool        batch_join;     /* gpuivf.enable_batch_join */
    bool        changed;
} RewriteContext;

/* The Limit governing a scan below it, if any. */
typedef struct LimitInfo
{
    Limit      *limit;          /* NULL: none */
} LimitInfo;

/* Highest plan_node_id in a plan tree. */
static int
MaxPlanNodeId(Plan *plan)
{
    int         max;
    ListCell   *lc;

    if (plan == NULL)
        return -1;
    max = plan->plan_node_id;
    max = Max(max, MaxPlanNodeId(plan->lefttree));
    max = Max(max, MaxPlanNodeId(plan->righttree));
    switch (nodeTag(plan))
    {
        case T_Append:
            foreach(lc, ((Append *) plan)->appendplans)
                max = Max(max, MaxPlanNodeId((Plan *) lfirst(lc)));
            break;
        case T_MergeAppend:
            foreach(lc, ((MergeAppend *) plan)->mergeplans)
                max = Max(max, MaxPlanNodeId((Plan *) lfirst(lc)));
            break;
        case T_BitmapAnd:
            foreach(lc, ((BitmapAnd *) plan)->bitmapplans)
                max = Max(max, MaxPlanNodeId((Plan *) lfirst(lc)));
            break;
        case T_BitmapOr:
            foreach(lc, ((BitmapOr *) plan)->bitmapplans)
                max = Max(max, MaxPlanNodeId((Plan *) lfirst(lc)));
            break;
        case T_SubqueryScan:
            max = Max(max, MaxPlanNodeId(((SubqueryScan *) plan)->subplan));
            break;
        case T_CustomScan:
            if (((CustomScan *) plan)->scan.plan.lefttree == NULL)
                foreach(lc, ((CustomScan *) plan)->custom_plans)
                    max = Max(max, MaxPlanNodeId((Plan *) lfirst(lc)));
            break;
        default:
            break;
    }
    return max;
}

/* Selectivity of the scan's filter (plan.qual), in parts per million. */
static int
FilterPpm(IndexScan *iscan)
{
    double      reltuples;
    double      sel;
    Oid         heapoid;
    HeapTuple   tp;

    if (iscan->scan.plan.qual == NIL)
        return 1000000;
    heapoid = IndexGetRelation(iscan->indexid, true);
    if (!OidIsValid(heapoid))
        return 1000000;
    tp = SearchSysCache1(RELOID, ObjectIdGetDatum(heapoid));
    if (!HeapTupleIsValid(tp))
        return 1000000;
    reltuples = ((Form_pg_class) GETSTRUCT(tp))->reltuples;
    ReleaseSysCache(tp);
    if (reltuples <= 0)
        return 1000000;
    sel = iscan->scan.plan.plan_rows / reltuples;
    sel = Min(Max(sel, 1e-6), 1.0);
    return (int) Max(1.0, rint(sel * 1e6));
}

/* Puts GpuivfKnn above a gpuivf Index Scan. */
static Plan *
WrapIndexScan(IndexScan *iscan, const LimitInfo *li, RewriteContext *ctx)
{
    CustomScan *cscan = MakeWrapper(&iscan->scan.plan, &knn_plan_methods, ctx->next_node_id++);
    Limit      *limit = li->limit;
    bool        has_limit = false;

    if (limit != NULL && limit->limitCount != NULL &&
        SafeToEvaluate(limit->limitCount) && SafeToEvaluate(limit->limitOffset))
        has_limit = true;

    {
        int         priv[4];
        void       *exprs[2];

        priv[KNN_INDEXOID] = (int) iscan->indexid;
        priv[KNN_HAS_LIMIT] = has_limit ? 1 : 0;
        priv[KNN_WITH_TIES] = has_limit && limit->limitOption == LIMIT_OPTION_WITH_TIES ? 1 : 0;
        priv[KNN_FILTER_PPM] = FilterPpm(iscan);
        exprs[0] = has_limit ? CopyNode(limit->limitCount) : NULL;
        exprs[1] = has_limit ? CopyNode(limit->limitOffset) : NULL;
        cscan->custom_private = IntList(4, priv);
        cscan->custom_exprs = PtrList(2, exprs);
    }
    ctx->changed = true;
    return (Plan *) cscan;
}

/* Does the expression use a Param whose id is in params? */
static bool
UsesParamWalker(Node *node, Bitmapset *params)
{
    if (node == NULL)
        return false;
    if (IsA(node, Param) && ((Param *) node)->paramkind == PARAM_EXEC &&
        bms_is_member(((Param *) node)->paramid, params))
        return true;
    return expression_tree_walker(node, WALKER(UsesParamWalker), (void *) params);
}

/* Single-child nodes that pass every row through unchanged (Memoize: or
 * replay them from its cache without running its child). */
static Plan *
SkipPassThrough(Plan *plan)
{
    while (plan != NULL)
    {
        if (IsA(plan, Memoize) && plan->lefttree != NULL)
            plan = plan->lefttree;
        else if (IsA(plan, Result) && plan->qual == NIL && plan->lefttree != NULL)
            plan = plan->lefttree;
        else if (IsA(plan, SubqueryScan) && plan->qual == NIL)
            plan = ((SubqueryScan *) plan)->subplan;
        else
            break;
    }
    return plan;
}

/*
 * Puts GpuivfBatchKnn between a Nested Loop and its outer child when the
 * inner side is a LATERAL kNN search (see the file comment).
 */
static void
TryBatchJoin(NestLoop *nl, RewriteContext *ctx)
{
    Plan       *outer = nl->join.plan.lefttree;
    Plan       *inner = SkipPassThrough(nl->join.plan.righttree);
    Limit      *limit;
    CustomScan *knn;
    IndexScan  *iscan;
    OpExpr     *orderby;
    Node       *arg;
    Bitmapset  *params = NULL;
    List       *priv;
    ListCell   *lc;
    CustomScan *batch;

    if (outer == NULL || nl->nestParams == NIL || IsOurScan(outer, &batch_plan_methods))
        return;
    if (outer->plan_rows < 2)
        return;                 /* one outer row: nothing to batch */
    if (inner == NULL || !IsA(inner, Limit))
        return;
    limit = (Limit *) inner;
    inner = SkipPassThrough(inner->lefttree);
    if (!IsOurScan(inner, &knn_plan_methods))
        return;
    knn = (CustomScan *) inner;
    if (list_nth_int(knn->custom_private, KNN_HAS_LIMIT) == 0 ||
        linitial(knn->custom_exprs) == NULL)
        return;
    iscan = (IndexScan *) linitial(knn->custom_plans);
    if (!IsA(iscan, IndexScan) || iscan->indexorderby == NIL)
        return;
    if (!equal(linitial(knn->custom_exprs), limit->limitCount))
        return;                 /* not the Limit the scan takes its hint from */

    /* ORDER BY index_column <op> arg, arg computed from the loop's parameters */
    orderby = (OpExpr *) linitial(iscan->indexorderby);
    if (!IsA(orderby, OpExpr) || list_length(orderby->args) != 2)
        return;
    arg = (Node *) lsecond(orderby->args);
    foreach(lc, nl->nestParams)
        params = bms_add_member(params, ((NestLoopParam *) lfirst(lc))->paramno);
    if (!UsesParamWalker(arg, params) || !SafeToEvaluate(arg))
        return;
    foreach(lc, nl->nestParams)
    {
        NestLoopParam *nlp = (NestLoopParam *) lfirst(lc);

        if (!IsA(nlp->paramval, Var) || nlp->paramval->varno != OUTER_VAR)
            return;
    }

    batch = MakeWrapper(outer, &batch_plan_methods, ctx->next_node_id++);
    {
        int         head[3];

        head[BATCH_INDEXOID] = list_nth_int(knn->custom_private, KNN_INDEXOID);
        head[BATCH_WITH_TIES] = list_nth_int(knn->custom_private, KNN_WITH_TIES);
        head[BATCH_FILTER_PPM] = list_nth_int(knn->custom_private, KNN_FILTER_PPM);
        priv = IntList(3, head);
    }
    foreach(lc, nl->nestParams)
    {
        NestLoopParam *nlp = (NestLoopParam *) lfirst(lc);

        priv = lappend_int(priv, nlp->paramno);
        priv = lappend_int(priv, nlp->paramval->varattno);
    }
    batch->custom_private = priv;
    {
        void       *exprs[3];

        exprs[0] = CopyNode(arg);
        exprs[1] = CopyNode((Node *) linitial(knn->custom_exprs));
        exprs[2] = CopyNode((Node *) lsecond(knn->custom_exprs));
        batch->custom_exprs = PtrList(3, exprs);
    }
    nl->join.plan.lefttree = (Plan *) batch;
    ctx->changed = true;
}

static Plan *RewritePlan(Plan *plan, const LimitInfo *li, RewriteContext *ctx);

/* Rewrites every plan of a list in place. */
static void
RewriteList(List *plans, const LimitInfo *li, RewriteContext *ctx)
{
    ListCell   *lc;

    foreach(lc, plans)
        lfirst(lc) = RewritePlan((Plan *) lfirst(lc), li, ctx);
}

/*
 * Rewrites a plan tree bottom-up: wraps gpuivf index scans, then batches
 * nested loops over them.  li is the Limit governing this node's rows.
 * Returns the node that takes this node's place.
 */
static Plan *
RewritePlan(Plan *plan, const LimitInfo *li, RewriteContext *ctx)
{
    LimitInfo   none = {NULL};
    LimitInfo   below = {NULL};

    if (plan == NULL)
        return NULL;
    check_stack_depth();

    if (IsA(plan, CustomScan))
    {
        /* ours: already rewritten, but look below a batch node */
        if (IsOurScan(plan, &batch_plan_methods))
        {
            CustomScan *cscan = (CustomScan *) plan;
            Plan       *child = RewritePlan((Plan *) linitial(cscan->custom_plans), &none, ctx);

            linitial(cscan->custom_plans) = child;
            plan->lefttree = child;
        }
        /* other custom scans keep their children as they are */
        return plan;
    }

    /*
     * Which Limit the children see: a Limit's own; through nodes that pass
     * rows unchanged, the one above; (Merge)Append children need at most as
     * many rows as the Append (a LIMIT over partitions or UNION ALL).
     */
    if (IsA(plan, Limit))
        below.limit = (Limit *) plan;
    else if (plan->qual == NIL &&
             (IsA(plan, Result) || IsA(plan, SubqueryScan) ||
              IsA(plan, Append) || IsA(plan, MergeAppend)))
        below = *li;

    switch (nodeTag(plan))
    {
        case T_Append:
            RewriteList(((Append *) plan)->appendplans, &below, ctx);
            break;
        case T_MergeAppend:
            RewriteList(((MergeAppend *) plan)->mergeplans, &below, ctx);
            break;
        case T_SubqueryScan:
            ((SubqueryScan *) plan)->subplan =
                RewritePlan(((SubqueryScan *) plan)->subplan, &below, ctx);
            break;
        default:
            break;
    }
    plan->lefttree = RewritePlan(plan->lefttree, &below, ctx);
    plan->righttree = RewritePlan(plan->righttree, &none, ctx);

    if (IsA(plan, IndexScan) && IsGpuivfIndex(((IndexScan *) plan)->indexid))
        return WrapIndexScan((IndexScan *) plan, li, ctx);
    if (IsA(plan, NestLoop) && ctx->batch_join)
        TryBatchJoin((NestLoop *) plan, ctx);
    return plan;
}

/* Does the tree hold a gpuivf Index Scan without its GpuivfKnn? */
static bool
NeedsRewrite(Plan *plan, bool wrapped)
{
    ListCell   *lc;

    if (plan == NULL)
        return false;
    if (IsA(plan, IndexScan))
        return !wrapped && IsGpuivfIndex(((IndexScan *) plan)->indexid);
    if (IsA(plan, CustomScan))
    {
        bool        ours = IsOurScan(plan, &knn_plan_methods);

        if (!ours && !IsOurScan(plan, &batch_plan_methods))
            return false;
        foreach(lc, ((CustomScan *) plan)->custom_plans)
            if (NeedsRewrite((Plan *) lfirst(lc), ours))
                return true;
        return false;
    }
    if (NeedsRewrite(plan->lefttree, false) || NeedsRewrite(plan->righttree, false))
        return true;
    switch (nodeTag(plan))
    {
        case T_Append:
            foreach(lc, ((Append *) plan)->appendplans)
                if (NeedsRewrite((Plan *) lfirst(lc), false))
                    return true;
            break;
        case T_MergeAppend:
            foreach(lc, ((MergeAppend *) plan)->mergeplans)
                if (NeedsRewrite((Plan *) lfirst(lc), false))
                    return true;
            break;
        case T_SubqueryScan:
            return NeedsRewrite(((SubqueryScan *) plan)->subplan, false);
        default:
            break;
    }
    return false;
}

static bool
StmtNeedsRewrite(PlannedStmt *stmt)
{
    ListCell   *lc;

    if (stmt->commandType == CMD_UTILITY)
        return false;
    if (NeedsRewrite(stmt->planTree, false))
        return true;
    foreach(lc, stmt->subplans)
        if (NeedsRewrite((Plan *) lfirst(lc), false))
            return true;
    return false;
}

/* Rewrites a planned statement in place (see the file comment). */
static void
RewriteStmt(PlannedStmt *stmt)
{
    RewriteContext ctx;
    LimitInfo   none = {NULL};
    ListCell   *lc;
    int         max_id;

    if (stmt->commandType == CMD_UTILITY)
        return;
    max_id = MaxPlanNodeId(stmt->planTree);
    foreach(lc, stmt->subplans)
        max_id = Max(max_id, MaxPlanNodeId((Plan *) lfirst(lc)));
    ctx.next_node_id = max_id + 1;
    ctx.batch_join = gpuivf_enable_batch_join;
    ctx.changed = false;

    stmt->planTree = RewritePlan(stmt->planTree, &none, &ctx);
    foreach(lc, stmt->subplans)
        lfirst(lc) = RewritePlan((Plan *) lfirst(lc), &none, &ctx);
}

/* planner_hook: plan, then rewrite the finished plan. */
static PlannedStmt *
GpuivfPlanner(Query *parse, const char *query_string, int cursorOptions,
              ParamListInfo boundParams)
{
    PlannedStmt *stmt;

    if (prev_planner_hook)
        stmt = prev_planner_hook(parse, query_string, cursorOptions, boundParams);
    else
        stmt = standard_planner(parse, query_string, cursorOptions, boundParams);
    if (StmtNeedsRewrite(stmt))
        RewriteStmt(stmt);
    return stmt;
}

/*
 * ExecutorStart_hook: a plan made before this library was loaded (the first
 * query of a session loads it while planning) is rewritten on a copy — the
 * original may be a cached plan.
 */
static void
GpuivfExecutorStart(QueryDesc *queryDesc, int eflags)
{
    gpuivf_pending_limit_index = InvalidOid;
    gpuivf_pending_limit_hint = 0;
    gpuivf_pending_filter_sel = 1.0;
    if (StmtNeedsRewrite(queryDesc->plannedstmt))
    {
        PlannedStmt *copy = CopyNode(queryDesc->plannedstmt);

        RewriteStmt(copy);
        queryDesc->plannedstmt = copy;
    }
    if (prev_executor_start_hook)
        prev_executor_start_hook(queryDesc, eflags);
    else
        standard_ExecutorStart(queryDesc, eflags);
}

/* ======================================================== limit hints */

/* Rows a scan under a Limit needs: count + offset (+1 WITH TIES), raised
 * for the selectivity of its filter; 0 = unknown (no count). */
static int64
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
static bool
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

static Node *
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

/* "automatic", "gpuivf.probes", ... */
static const char *
ProbeSourceName(int source)
{
    switch (source)
    {
        case GPUIVF_PROBES_SETTING:
            return "gpuivf.probes";
        case GPUIVF_PROBES_CURVE:
            return "tuned curve";
        case GPUIVF_PROBES_AUTO:
            return "automatic";
        default:
            return "untrained index";
    }
}

/* Device of n scans of which on_gpu ran on the GPU. */
static const char *
DeviceName(int64 on_gpu, int64 n)
{
    if (on_gpu == 0)
        return "CPU";
    return on_gpu >= n ? "GPU" : "GPU and CPU";
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
        ExplainPropertyText("Probes From", ProbeSourceName(st->probe_source), es);
    }
    ExplainPropertyFloat("Rows Asked", NULL, (double) st->k_sum / st->scans, 0, es);
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

static Node *
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

            GpuivfMakeQuery(&meta, hint, bs->filter_ppm / 1e6, vector, q);
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

/* ==================================================================== init */

/* At transaction end nothing offered or pending may outlive its query. */
static void
GpuivfPlannerXactCallback(XactEvent event, void *arg)
{
    (void) event;
    (void) arg;
    GpuivfClearOffer();
    gpuivf_pending_limit_index = InvalidOid;
    gpuivf_pending_limit_hint = 0;
    gpuivf_pending_filter_sel = 1.0;
}

/* Installs the hooks and registers the custom scans (from _PG_init). */
void
GpuivfPlannerInit(void)
{
    RegisterXactCallback(GpuivfPlannerXactCallback, NULL);
    RegisterCustomScanMethods(&knn_plan_methods);
    RegisterCustomScanMethods(&batch_plan_methods);
    prev_planner_hook = planner_hook;
    planner_hook = GpuivfPlanner;
    prev_executor_start_hook = ExecutorStart_hook;
    ExecutorStart_hook = GpuivfExecutorStart;
}
