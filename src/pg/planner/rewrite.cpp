/*
 * planner/rewrite.cpp — the planner integration's entry: after planning
 * (planner_hook; and at ExecutorStart for a plan made before this library
 * was loaded) the finished plan tree is rewritten so that a GpuivfKnn node
 * sits above every Index Scan on a gpuivf index and, where the inner side of
 * a Nested Loop is a LATERAL kNN search, a GpuivfBatchKnn node sits between
 * the loop and its outer child (planner.h describes both nodes); a kNN
 * LIMIT over postgres_fdw shards is sent to the shards (remote_limit.cpp).
 */
#include "gpuivf.h"
#include "planner/planner.h"
#include "am/am.h"
#include "search/search.h"

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

const CustomScanMethods knn_plan_methods = {GPUIVF_KNN_NAME, KnnCreateState};
const CustomScanMethods batch_plan_methods = {GPUIVF_BATCH_NAME, BatchCreateState};

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
    List       *rtable;         /* the statement's range table */
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
 * The GpuivfKnn scans a LATERAL kNN subquery's Limit reads: the one below
 * it, or those of a (Merge)Append of partitions below it (other children,
 * e.g. a partition without the index, are left to themselves).  NIL when
 * the Limit reads something else, or when the Append prunes partitions per
 * outer row: every outer row would then be searched on every partition.
 */
static List *
KnnScansUnderLimit(Limit *limit)
{
    Plan       *inner = SkipPassThrough(limit->plan.lefttree);
    List       *children;
    List       *knns = NIL;
    ListCell   *lc;

    if (IsOurScan(inner, &knn_plan_methods))
        return list_make1(inner);
    if (inner != NULL && IsA(inner, MergeAppend) && inner->qual == NIL &&
        ((MergeAppend *) inner)->part_prune_info == NULL)
        children = ((MergeAppend *) inner)->mergeplans;
    else if (inner != NULL && IsA(inner, Append) && inner->qual == NIL &&
             ((Append *) inner)->part_prune_info == NULL)
        children = ((Append *) inner)->appendplans;
    else
        return NIL;
    foreach(lc, children)
        if (IsOurScan((Plan *) lfirst(lc), &knn_plan_methods))
            knns = lappend(knns, lfirst(lc));
    return knns;
}

/*
 * The query vector expression of a GpuivfKnn scan that takes its limit hint
 * from this Limit and orders by index_column <op> arg: arg, else NULL.
 */
static Node *
KnnOrderArg(CustomScan *knn, Limit *limit)
{
    IndexScan  *iscan;
    OpExpr     *orderby;

    if (list_nth_int(knn->custom_private, KNN_HAS_LIMIT) == 0 ||
        linitial(knn->custom_exprs) == NULL)
        return NULL;
    iscan = (IndexScan *) linitial(knn->custom_plans);
    if (!IsA(iscan, IndexScan) || iscan->indexorderby == NIL)
        return NULL;
    if (!equal(linitial(knn->custom_exprs), limit->limitCount))
        return NULL;            /* not the Limit the scan takes its hint from */
    orderby = (OpExpr *) linitial(iscan->indexorderby);
    if (!IsA(orderby, OpExpr) || list_length(orderby->args) != 2)
        return NULL;
    return (Node *) lsecond(orderby->args);
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
    List       *knns;
    CustomScan *knn;
    Node       *arg = NULL;
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
    knns = KnnScansUnderLimit(limit);
    if (knns == NIL)
        return;

    /* every scan: ORDER BY index_column <op> arg, the same arg, computed
     * from the loop's parameters */
    foreach(lc, knns)
    {
        Node       *a = KnnOrderArg((CustomScan *) lfirst(lc), limit);

        if (a == NULL || (arg != NULL && !equal(a, arg)))
            return;
        arg = a;
    }
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

    knn = (CustomScan *) linitial(knns);
    batch = MakeWrapper(outer, &batch_plan_methods, ctx->next_node_id++);
    priv = lappend_int(NIL, list_nth_int(knn->custom_private, KNN_WITH_TIES));
    priv = lappend_int(priv, list_length(knns));
    foreach(lc, knns)
    {
        CustomScan *k = (CustomScan *) lfirst(lc);

        priv = lappend_int(priv, list_nth_int(k->custom_private, KNN_INDEXOID));
        priv = lappend_int(priv, list_nth_int(k->custom_private, KNN_FILTER_PPM));
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
    if (IsA(plan, Limit) &&
        GpuivfPushLimitToShards((Limit *) plan, ctx->rtable, &ctx->next_node_id))
        ctx->changed = true;
    return plan;
}

/* Does the tree hold a gpuivf Index Scan without its GpuivfKnn, or a
 * LIMIT that has not reached the postgres_fdw shards below it? */
static bool
NeedsRewrite(Plan *plan, bool wrapped)
{
    ListCell   *lc;

    if (plan == NULL)
        return false;
    if (IsA(plan, Limit) && GpuivfRemoteLimitPending((Limit *) plan))
        return true;
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
    ctx.rtable = stmt->rtable;
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
