/*
 * am/cost.cpp — amcostestimate: what a gpuivf scan costs the planner.
 *
 * An index scan is only useful for ORDER BY col <op> constant; without an
 * ordering the path gets a prohibitive cost.  With one, the startup cost is
 * the work of round 1 (probing, reading the probed list pages, ADC scoring,
 * reading R vector tuples and re-ranking them) or, in exact mode, reading and
 * sorting every vector; the total cost adds what streaming every further row
 * would take.  Round 1 is costed as the scan will ask it (GpuivfMakeQuery):
 * the LIMIT of this query level, if any, and the tuned probes.  With LIMIT k the planner charges startup plus a k/rows share of
 * the rest, so kNN queries on large tables use the index while tiny tables,
 * where reading R vector tuples costs more than reading the heap, keep their
 * sequential scan.  Page reads of repeated scans (loop_count > 1, e.g. a
 * LATERAL kNN join) are amortized as genericcostestimate does.
 */
#include "gpuivf.h"
#include "am/am.h"
#include "search/search.h"
#include "storage/storage.h"

#include <cmath>

#include "access/relation.h"
#include "optimizer/cost.h"
#include "optimizer/optimizer.h"
#include "utils/selfuncs.h"
#include "utils/spccache.h"

/* Pages needed for n items of item_bytes (plus line pointer) each. */
static double
GpuivfPagesFor(double n, double item_bytes)
{
    double      per_page = floor(GPUIVF_PAGE_CAPACITY / (item_bytes + sizeof(ItemIdData)));

    if (per_page < 1)
        per_page = 1;
    return ceil(n / per_page);
}

/* The planner's cost of a gpuivf index path (see the file comment). */
void
gpuivfcostestimate(PlannerInfo *root, IndexPath *path, double loop_count,
                   Cost *indexStartupCost, Cost *indexTotalCost,
                   Selectivity *indexSelectivity, double *indexCorrelation,
                   double *indexPages)
{
    IndexOptInfo *index = path->indexinfo;
    GenericCosts costs;
    GpuivfMetaPageData meta;
    Relation    rel;
    double      tuples;
    double      dims;
    bool        trained;
    bool        stores_vectors;
    bool        from_table;
    double      toast_chunks = 0.0;
    double      vector_pages;
    double      list_pages = 0;
    double      random_page_cost;
    double      seq_page_cost;
    Cost        startup;
    Cost        total;
    double      pages_read;
    GpuivfQuery query;

    /* without ORDER BY an index scan cannot help at all */
    if (path->indexorderbys == NIL)
    {
        *indexStartupCost = disable_cost;
        *indexTotalCost = disable_cost;
        *indexSelectivity = 1.0;
        *indexCorrelation = 0;
        *indexPages = 0;
        return;
    }

    rel = index_open(index->indexoid, NoLock);
    GpuivfReadMeta(rel, &meta);

    tuples = index->tuples > 0 ? index->tuples : index->rel->tuples;
    tuples = Max(tuples, 1.0);
    dims = Max((double) meta.dims, 1.0);
    trained = (meta.flags & GPUIVF_META_TRAINED) != 0 && meta.lists > 0;
    stores_vectors = !trained || (meta.flags & GPUIVF_META_RERANK) != 0;
    from_table = stores_vectors && GpuivfMetaRerankFromTable(&meta);
    vector_pages = stores_vectors ? GpuivfPagesFor(tuples, GpuivfVectorTupleSize(&meta)) : 0;
    /* re-rank from the table reads heap rows instead; a vector above ~2 kB
     * is TOASTed and detoasting it reads its chunks through the TOAST
     * index.  PostgreSQL's costs charge a sequential scan nothing for
     * detoasting, so the chunks are charged as CPU work here too, not as
     * page reads: otherwise a sort of every row would look cheaper than the
     * few hundred candidates the index re-ranks. */
    if (from_table)
    {
        double      bytes = dims * GpuivfStorageElemSize(meta.storage);

        if (bytes > TOAST_TUPLE_THRESHOLD)
            toast_chunks = ceil(bytes / TOAST_MAX_CHUNK_SIZE);
        vector_pages = Max((double) index->rel->pages, 1.0);
    }
    if (trained)
        list_pages = GpuivfPagesFor(tuples, GPUIVF_LIST_ENTRY_SIZE(meta.code_size));

    get_tablespace_page_costs(index->reltablespace, &random_page_cost, &seq_page_cost);

    /* selectivity and the other generic parts (no quals: everything) */
    memset(&costs, 0, sizeof(costs));
    costs.numIndexTuples = tuples;
    genericcostestimate(root, path, loop_count, &costs);

    /*
     * Round 1 as the scan will ask it (search/round_one.cpp): k from this
     * level's LIMIT (divided by the selectivity of the rel's filters),
     * nprobe from the settings or the tuned curve, max(k, R) re-ranked.
     */
    {
        double      limit = root->limit_tuples;
        RelOptInfo *baserel = index->rel;
        double      sel = 1.0;
        int64       hint = 0;

        if (baserel->tuples > 0 && baserel->rows > 0)
            sel = Min(Max(baserel->rows / baserel->tuples, 1e-6), 1.0);
        if (limit > 0)
            hint = GpuivfRowsForFilter(limit, sel);
        GpuivfMakeQuery(rel, &meta, hint, sel, NULL, &query, NULL);
    }
    index_close(rel, NoLock);

    if (!trained || GpuivfQueryIsExact(&meta, &query))
    {
        /* exact mode: every vector, one distance each, then a full sort */
        startup = vector_pages * seq_page_cost
            + tuples * (cpu_index_tuple_cost + cpu_operator_cost)
            + tuples * log2(Max(tuples, 2.0)) * 2.0 * cpu_operator_cost;
        total = startup + tuples * cpu_index_tuple_cost;
        pages_read = vector_pages;
    }
    else
    {
        double      nlist = meta.lists;
        double      nprobe = Max(query.nprobe, 1);
        double      fraction = Min(nprobe / nlist, 1.0);
        double      probed_pages = ceil(list_pages * fraction);
        double      scored = tuples * fraction;
        double      rerank = Min((double) Max(Max(query.rerank, query.k), 1), scored);
        double      rerank_pages = 0;
        double      ksub = (double) (1 << meta.pq_bits);
        double      list_fetched;

        double      loops = Max(loop_count, 1.0);
        double      cache_pages = Max((double) effective_cache_size, 1.0);
        double      hot_page_cost;

        /*
         * A kNN index is read by every query (the model, the best lists, the
         * vectors of the candidates), so when it fits in
         * effective_cache_size its pages are mostly in shared buffers or the
         * OS cache: a scattered read then costs between a sequential and a
         * random page, the closer to sequential the smaller the index is
         * against the cache.  Charging R cold random reads instead made a
         * 100-row LATERAL kNN join cost ~100k and trigger JIT (~13 ms) for
         * a query that reads a few MB of cached pages.
         */
        if (index->pages < cache_pages)
            hot_page_cost = seq_page_cost + (random_page_cost - seq_page_cost) *
                ((double) index->pages / cache_pages);
        else
            hot_page_cost = random_page_cost;

        /* probing and one look-up table per probed list */
        startup = nlist * cpu_operator_cost + nprobe * ksub * cpu_operator_cost;

        /*
         * Pages: the probed lists' pages and the re-rank candidates' vector
         * pages.  Repeated scans (the inner side of a nested loop, loop_count
         * > 1) find most of them cached, so as genericcostestimate does the
         * pages fetched over all loops come from index_pages_fetched and
         * each loop is charged its share; otherwise a 100-row LATERAL kNN
         * join would be charged 100 cold reads of R random pages and cross
         * jit_above_cost although it reads a few MB of cached pages.
         */
        list_fetched = index_pages_fetched(probed_pages * loops, (BlockNumber) list_pages,
                                           (double) index->pages, root) / loops;
        startup += Min(nprobe, list_fetched) * hot_page_cost
            + Max(list_fetched - nprobe, 0.0) * seq_page_cost;
        /* ADC: one table look-up and add per sub-quantizer code, charged a
         * tenth of an operator (an operator is a function call) */
        startup += scored * (cpu_index_tuple_cost + meta.pq_m * 0.1 * cpu_operator_cost);
        if (from_table)
        {
            /* a heap fetch per candidate, its TOAST chunks, the distance */
            rerank_pages = index_pages_fetched(rerank * loops, (BlockNumber) vector_pages,
                                               vector_pages, root) / loops;
            startup += rerank_pages * hot_page_cost + rerank * cpu_tuple_cost
                + rerank * toast_chunks * (cpu_index_tuple_cost + cpu_tuple_cost)
                + rerank * dims * 0.01 * cpu_operator_cost;
        }
        else if (stores_vectors)
        {
            rerank_pages = index_pages_fetched(rerank * loops, (BlockNumber) vector_pages,
                                               (double) index->pages, root) / loops;
            /* an exact distance: dims multiply-adds, inlined, no fmgr call */
            startup += rerank_pages * hot_page_cost + rerank * dims * 0.01 * cpu_operator_cost;
        }
        startup += rerank * log2(Max(rerank, 2.0)) * 2.0 * cpu_operator_cost;

        /* streaming every other row: all lists again, all vectors */
        total = startup + list_pages * seq_page_cost + vector_pages * random_page_cost
            + tuples * (cpu_index_tuple_cost + 1.5 * cpu_operator_cost);
        pages_read = list_fetched + rerank_pages;
    }

    *indexStartupCost = startup;
    *indexTotalCost = total;
    *indexSelectivity = costs.indexSelectivity;
    *indexCorrelation = 0;
    *indexPages = pages_read;
}
