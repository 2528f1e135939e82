/*
 * planner/remote_limit.cpp — a kNN LIMIT over postgres_fdw shards reaches
 * every shard, and the shards are asked at once.
 *
 * A partitioned table whose partitions are postgres_fdw foreign tables is
 * planned by PostgreSQL 15, for ORDER BY v <-> q LIMIT k, as
 *
 *     Limit -> Merge Append -> Foreign Scan (one per shard)
 *
 * where each shard's remote query carries the ORDER BY (when the server's
 * `extensions` option names gpuivf, so that the operator may be shipped)
 * but not the LIMIT, and the shards are asked one after the other:
 *  - postgres_fdw sends a LIMIT only when the foreign table is the query's
 *    whole FROM: it adds the LIMIT in its GetForeignUpperPaths callback,
 *    which the planner calls for the final upper relation of a foreign
 *    relation, never for a partition of a local partitioned table (there is
 *    no partitionwise LIMIT in PostgreSQL);
 *  - asynchronous execution (async_capable) exists for Append only; Merge
 *    Append starts its children one at a time.
 * Without the LIMIT a shard's kNN scan does not know k: round 1 asks for
 * as many rows as its re-rank depth, and postgres_fdw fetches them in batches of
 * fetch_size (100) rows through a cursor.
 *
 * So after planning (GpuivfPushLimitToShards, called by the rewrite for
 * every Limit) a Limit whose child is such a foreign scan, or a (Merge)
 * Append of them, gets its count + offset appended to each shard's remote
 * query as " LIMIT n" (a constant, or the statement's parameters, added to
 * the scan's fdw_exprs: postgres_fdw evaluates fdw_exprs and sends them as
 * the remote query's $1..$n).  A Merge Append all of whose children got the LIMIT becomes
 *
 *     Limit -> Sort -> Append -> Async Foreign Scan (one per shard)
 *
 * when its servers (or foreign tables) are async_capable: each shard returns
 * at most count + offset rows, already in order, so sorting their union
 * gives the Merge Append's rows, and the Append asks every shard at once.
 *
 * Only what is certainly equivalent is rewritten: a foreign scan of
 * postgres_fdw (its handler is postgres_fdw_handler) that selects rows, has
 * no local filter, and whose remote query ends with its ORDER BY clause (no
 * LIMIT yet, no FOR UPDATE); a LIMIT without WITH TIES whose count and
 * offset are constants or expressions of the statement's parameters; and
 * only ORDER BY a gpuivf distance (an ordering operator of the gpuivf access
 * method is in the scan's target list), so other queries keep PostgreSQL's
 * plans.
 * postgres_fdw's fdw_private is (remote SQL, retrieved attributes, fetch
 * size[, relations]) in PostgreSQL 15; anything else is left alone.
 */
#include "gpuivf.h"
#include "planner/planner.h"

/* ------------------------------------------------------- which scans */

/* Is opno an ordering operator (ORDER BY) of the gpuivf access method? */
static bool
IsGpuivfOrderOperator(Oid opno)
{
    Oid         am = get_am_oid("gpuivf", true);
    CatCList   *list;
    bool        found = false;

    if (!OidIsValid(am))
        return false;
    list = SearchSysCacheList1(AMOPOPID, ObjectIdGetDatum(opno));
    for (int i = 0; i < list->n_members && !found; i++)
    {
        Form_pg_amop amop = (Form_pg_amop) GETSTRUCT(&list->members[i]->tuple);

        found = amop->amopmethod == am && amop->amoppurpose == AMOP_ORDER;
    }
    ReleaseSysCacheList(list);
    return found;
}

/* Does the scan compute a gpuivf distance (what its ORDER BY is on)? */
static bool
ComputesGpuivfDistance(Plan *plan)
{
    ListCell   *lc;

    foreach(lc, plan->targetlist)
    {
        Expr       *expr = ((TargetEntry *) lfirst(lc))->expr;

        if (IsA(expr, OpExpr) && IsGpuivfOrderOperator(((OpExpr *) expr)->opno))
            return true;
    }
    return false;
}

/* Is the server's foreign-data wrapper postgres_fdw? */
static bool
IsPostgresFdwServer(Oid serverid)
{
    ForeignServer *server = GetForeignServerExtended(serverid, FSV_MISSING_OK);
    ForeignDataWrapper *fdw;
    char       *handler;

    if (server == NULL)
        return false;
    fdw = GetForeignDataWrapperExtended(server->fdwid, FDW_MISSING_OK);
    if (fdw == NULL || !OidIsValid(fdw->fdwhandler))
        return false;
    handler = get_func_name(fdw->fdwhandler);
    return handler != NULL && strcmp(handler, "postgres_fdw_handler") == 0;
}

static bool
EndsWith(const char *s, const char *suffix)
{
    size_t      n = strlen(s);
    size_t      m = strlen(suffix);

    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/*
 * A postgres_fdw scan of ORDER BY a gpuivf distance whose remote query
 * could take a LIMIT (see the file comment): its remote SQL, else NULL.
 */
static const char *
SortedRemoteSql(Plan *plan)
{
    ForeignScan *fs;
    const char *sql;

    if (plan == NULL || !IsA(plan, ForeignScan))
        return NULL;
    fs = (ForeignScan *) plan;
    if (fs->operation != CMD_SELECT || fs->scan.plan.qual != NIL ||
        list_length(fs->fdw_private) < 3 || !IsA(linitial(fs->fdw_private), String))
        return NULL;
    sql = strVal(linitial(fs->fdw_private));
    /* postgres_fdw appends ORDER BY, then LIMIT, then FOR UPDATE/SHARE;
     * each ORDER BY key ends with its NULLS FIRST/LAST */
    if (strstr(sql, " ORDER BY ") == NULL ||
        !(EndsWith(sql, " NULLS LAST") || EndsWith(sql, " NULLS FIRST")))
        return NULL;
    if (!IsPostgresFdwServer(fs->fs_server) || !ComputesGpuivfDistance(plan))
        return NULL;
    return sql;
}

/* The scans a Limit's rows come from: its child, or the children of its
 * (Merge)Append child. */
static List *
ScansUnder(Limit *limit)
{
    Plan       *child = limit->plan.lefttree;

    if (child == NULL)
        return NIL;
    if (IsA(child, MergeAppend))
        return ((MergeAppend *) child)->mergeplans;
    if (IsA(child, Append))
        return ((Append *) child)->appendplans;
    return list_make1(child);
}

/* Does the expression use something other than constants and the
 * statement's parameters (a column, an outer row's value, a sub-plan)? */
static bool
NotStatementConstantWalker(Node *node, void *context)
{
    if (node == NULL)
        return false;
    if (IsA(node, Param))
        return ((Param *) node)->paramkind != PARAM_EXTERN;
    if (IsA(node, Var) || IsA(node, SubPlan) || IsA(node, AlternativeSubPlan) ||
        IsA(node, Aggref) || IsA(node, WindowFunc))
        return true;
    return expression_tree_walker(node, WALKER(NotStatementConstantWalker), context);
}

/* May the Limit's count and offset be sent: constants, or expressions of
 * the statement's parameters (LIMIT $1, or its cast to bigint), not
 * volatile; a count that is not a NULL constant? */
static bool
PushableLimitPart(Node *expr, bool is_count)
{
    if (expr == NULL)
        return !is_count;
    if (IsA(expr, Const))
        return !(is_count && ((Const *) expr)->constisnull);
    return !NotStatementConstantWalker(expr, NULL) &&
        !contain_volatile_functions_after_planning((Expr *) expr);
}

static bool
PushableLimit(Limit *limit)
{
    return limit->limitOption == LIMIT_OPTION_COUNT &&
        PushableLimitPart(limit->limitCount, true) &&
        PushableLimitPart(limit->limitOffset, false);
}

/* Would GpuivfPushLimitToShards change this Limit? */
bool
GpuivfRemoteLimitPending(Limit *limit)
{
    ListCell   *lc;

    if (!PushableLimit(limit))
        return false;
    foreach(lc, ScansUnder(limit))
        if (SortedRemoteSql((Plan *) lfirst(lc)) != NULL)
            return true;
    return false;
}

/* ------------------------------------------------------- the rewrite */

/* One part of the remote LIMIT: a constant's value, or $n for an
 * expression of the statement's parameters appended to the scan's fdw_exprs
 * (postgres_fdw evaluates them when the scan starts and sends their
 * values). */
static void
AppendLimitPart(StringInfo buf, Node *expr, ForeignScan *fs)
{
    if (IsA(expr, Const))
    {
        Const      *c = (Const *) expr;

        appendStringInfo(buf, INT64_FORMAT, c->constisnull ? (int64) 0 : DatumGetInt64(c->constvalue));
        return;
    }
    fs->fdw_exprs = lappend(fs->fdw_exprs, copyObjectImpl(expr));
    appendStringInfo(buf, "$%d::bigint", list_length(fs->fdw_exprs));
}

/* Appends " LIMIT count + offset" to a scan's remote query; false when a
 * constant limit cannot be sent (negative: the Limit raises the error
 * itself; int64 overflow). */
static bool
PushLimit(ForeignScan *fs, const char *sql, Limit *limit)
{
    StringInfoData buf;
    Node       *count = limit->limitCount;
    Node       *offset = limit->limitOffset;

    initStringInfo(&buf);
    appendStringInfo(&buf, "%s LIMIT ", sql);
    if (IsA(count, Const) && (offset == NULL || IsA(offset, Const)))
    {
        int64       n = DatumGetInt64(((Const *) count)->constvalue);
        int64       off = 0;
        int64       sum;

        if (offset != NULL && !((Const *) offset)->constisnull)
            off = DatumGetInt64(((Const *) offset)->constvalue);
        if (n < 0 || off < 0 || pg_add_s64_overflow(n, off, &sum))
        {
            pfree(buf.data);
            return false;
        }
        appendStringInfo(&buf, INT64_FORMAT, sum);
    }
    else if (offset == NULL)
        AppendLimitPart(&buf, count, fs);
    else
    {
        appendStringInfoChar(&buf, '(');
        AppendLimitPart(&buf, count, fs);
        appendStringInfoString(&buf, " + ");
        AppendLimitPart(&buf, offset, fs);
        appendStringInfoChar(&buf, ')');
    }
    linitial(fs->fdw_private) = makeString(buf.data);
    return true;
}

/* Is the foreign table of a scan async_capable (postgres_fdw's rule: the
 * server's option, overridden by the table's)? */
static bool
AsyncCapable(ForeignScan *fs, List *rtable)
{
    ForeignServer *server = GetForeignServer(fs->fs_server);
    bool        capable = false;
    ListCell   *lc;

    foreach(lc, server->options)
    {
        DefElem    *def = (DefElem *) lfirst(lc);

        if (strcmp(def->defname, "async_capable") == 0)
            capable = defGetBoolean(def);
    }
    if (fs->scan.scanrelid > 0 && fs->scan.scanrelid <= (Index) list_length(rtable))
    {
        RangeTblEntry *rte = rt_fetch(fs->scan.scanrelid, rtable);

        if (rte->rtekind == RTE_RELATION && get_rel_relkind(rte->relid) == RELKIND_FOREIGN_TABLE)
        {
            foreach(lc, GetForeignTable(rte->relid)->options)
            {
                DefElem    *def = (DefElem *) lfirst(lc);

                if (strcmp(def->defname, "async_capable") == 0)
                    capable = defGetBoolean(def);
            }
        }
    }
    return capable;
}

/*
 * Limit -> Merge Append -> scans becomes Limit -> Sort -> Append -> scans,
 * the scans that are async_capable marked so.  Returns the Sort.
 */
static Plan *
SortOverAsyncAppend(MergeAppend *ma, List *rtable, int *next_node_id)
{
    Append     *append = makeNode(Append);
    Sort       *sort = makeNode(Sort);
    ListCell   *lc;
    int         nasync = 0;

    foreach(lc, ma->mergeplans)
    {
        ForeignScan *fs = (ForeignScan *) lfirst(lc);

        if (AsyncCapable(fs, rtable))
        {
            fs->scan.plan.async_capable = true;
            nasync++;
        }
    }

    append->plan = ma->plan;
    NodeSetTag(append, T_Append);
    append->plan.initPlan = NIL;
    append->apprelids = ma->apprelids;
    append->appendplans = ma->mergeplans;
    append->nasyncplans = nasync;
    append->first_partial_plan = list_length(ma->mergeplans);
    append->part_prune_info = ma->part_prune_info;

    sort->plan = ma->plan;      /* costs, rows, width, parameters, initPlans */
    NodeSetTag(sort, T_Sort);
    sort->plan.targetlist = (List *) copyObjectImpl(ma->plan.targetlist);
    sort->plan.plan_node_id = (*next_node_id)++;
    sort->plan.lefttree = &append->plan;
    sort->plan.righttree = NULL;
    sort->numCols = ma->numCols;
    sort->sortColIdx = ma->sortColIdx;
    sort->sortOperators = ma->sortOperators;
    sort->collations = ma->collations;
    sort->nullsFirst = ma->nullsFirst;
    return &sort->plan;
}

/*
 * Sends a Limit's count + offset to the postgres_fdw shards below it, and
 * asks them at once (see the file comment).  Returns whether it changed the
 * plan.
 */
bool
GpuivfPushLimitToShards(Limit *limit, List *rtable, int *next_node_id)
{
    Plan       *child = limit->plan.lefttree;
    ListCell   *lc;
    int         pushed = 0;
    int         nscans = 0;

    if (!PushableLimit(limit))
        return false;
    foreach(lc, ScansUnder(limit))
    {
        Plan       *scan = (Plan *) lfirst(lc);
        const char *sql = SortedRemoteSql(scan);

        nscans++;
        if (sql == NULL)
            continue;
        if (PushLimit((ForeignScan *) scan, sql, limit))
            pushed++;
    }
    if (pushed == 0)
        return false;

    /* every shard answers at most the LIMIT, in order: ask them at once */
    if (IsA(child, MergeAppend) && pushed == nscans && nscans >= 2 &&
        enable_async_append && !child->parallel_safe)
    {
        MergeAppend *ma = (MergeAppend *) child;
        bool        any_async = false;

        foreach(lc, ma->mergeplans)
            any_async = any_async || AsyncCapable((ForeignScan *) lfirst(lc), rtable);
        if (any_async)
            limit->plan.lefttree = SortOverAsyncAppend(ma, rtable, next_node_id);
    }
    return true;
}
