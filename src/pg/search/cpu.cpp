/*
 * search/cpu.cpp — the CPU path of GpuivfSearchBatch (search/dispatch.cpp):
 * the round-1 search of nq queries of one index in this backend, with the
 * same answer per query as the GPU worker's.
 *
 * CPU path, per query (the algorithm of a scan's round 1):
 *   IVF    the nprobe best lists; every entry ADC-scored into a TopK of
 *          C = max(k, rerank) candidates; with re-rank the C candidates
 *          are re-ranked with exact distances (search/rerank.cpp: from the
 *          vector tuples, or from the table's rows); sorted by
 *          (distance, heap TID), the first k returned.
 *   exact  untrained index, or nprobe >= lists with re-rank: the k
 *          smallest exact distances over every row (the vector tuples, or
 *          the table's rows; search/rows.cpp).
 * The batch is processed list-major: each probed list's pages are read once
 * and scored against every query probing it, each vector page once for all
 * re-ranks.  TopK breaks ties by id, so the order of work changes nothing.
 *
 * Memory: scratch in a child context deleted at the end; hits in the
 * caller's context.
 */
#include "gpuivf.h"
#include "search/search.h"
#include "search/results.h"
#include "storage/storage.h"

#include <algorithm>
#include <cmath>

/* where GpuivfSearchBatch's scratch lives */
typedef struct SearchScratch
{
    MemoryContext ctx;
    GpuivfMetaPageData meta;
    gpuivf::Metric metric;
    int         dims;
    int         code_size;
    int         page_capacity;  /* list entries per page at most */
    uint8      *page_codes;
    uint64     *page_ids;
} SearchScratch;

/* Bounded max-heap of the k best results (exact mode). */
static void
HeapPush(GpuivfResult *heap, int *size, int k, double distance, uint64 heapid)
{
    int         i;

    if (*size < k)
    {
        i = (*size)++;
        while (i > 0)
        {
            int         parent = (i - 1) / 2;

            if (!ResultLess(heap[parent].distance, heap[parent].heapid, distance, heapid))
                break;
            heap[i] = heap[parent];
            i = parent;
        }
        heap[i].distance = distance;
        heap[i].heapid = heapid;
        return;
    }
    if (!ResultLess(distance, heapid, heap[0].distance, heap[0].heapid))
        return;
    /* replace the worst, sift down */
    i = 0;
    for (;;)
    {
        int         l = 2 * i + 1;
        int         r = l + 1;
        int         big = i;
        double      bd = distance;
        uint64      bi = heapid;

        if (l < k && ResultLess(bd, bi, heap[l].distance, heap[l].heapid))
        {
            big = l;
            bd = heap[l].distance;
            bi = heap[l].heapid;
        }
        if (r < k && ResultLess(bd, bi, heap[r].distance, heap[r].heapid))
            big = r;
        if (big == i)
            break;
        heap[i] = heap[big];
        i = big;
    }
    heap[i].distance = distance;
    heap[i].heapid = heapid;
}

/* --------------------------------------------------------- exact path */

/* the exact path's state: each query's distance and bounded heap */
typedef struct ExactState
{
    const GpuivfQuery *queries;
    const int  *which;
    int         nexact;
    GpuivfRowDistance *rd;
    GpuivfResult **heaps;
    int        *sizes;
} ExactState;

static void
ExactVisit(void *arg, const GpuivfRow *row)
{
    ExactState *es = (ExactState *) arg;

    for (int j = 0; j < es->nexact; j++)
    {
        const GpuivfQuery *q = &es->queries[es->which[j]];

        HeapPush(es->heaps[j], &es->sizes[j], q->k, GpuivfRowDistanceOf(&es->rd[j], row),
                 row->heapid);
    }
}

/*
 * Exact top-k of the queries listed in which[0..nexact): one pass over
 * every row (the vector pages, or the table's rows), with the distance of
 * an exact scan (pgvector's operator on pgvector columns).
 */
static void
SearchExact(Relation index, SearchScratch *s, const GpuivfQuery *queries, const int *which,
            int nexact, MemoryContext caller, GpuivfHit **hits, int *nhits)
{
    BufferAccessStrategy bas = GetAccessStrategy(BAS_BULKREAD);
    ExactState  es;

    es.queries = queries;
    es.which = which;
    es.nexact = nexact;
    es.rd = (GpuivfRowDistance *) palloc(sizeof(GpuivfRowDistance) * nexact);
    es.heaps = (GpuivfResult **) palloc(sizeof(GpuivfResult *) * nexact);
    es.sizes = (int *) palloc0(sizeof(int) * nexact);
    for (int j = 0; j < nexact; j++)
    {
        es.heaps[j] = (GpuivfResult *) palloc(sizeof(GpuivfResult) * queries[which[j]].k);
        GpuivfRowDistanceInit(&es.rd[j], index, &s->meta, queries[which[j]].vector, true);
    }
    GpuivfForEachRow(index, &s->meta, bas, ExactVisit, &es);
    FreeAccessStrategy(bas);

    for (int j = 0; j < nexact; j++)
    {
        int         qi = which[j];

        SortResults(es.heaps[j], es.sizes[j]);
        hits[qi] = MakeHits(caller, es.heaps[j], es.sizes[j], queries[qi].k, &nhits[qi]);
    }
}

/* ----------------------------------------------------------- IVF path */

/*
 * IVF round 1 of the queries listed in which[0..nivf): probe, ADC TopK of C
 * candidates per query (list-major), exact re-rank, first k.
 */
static void
SearchIvf(Relation index, SearchScratch *s, const GpuivfQuery *queries, const int *which,
          int nivf, MemoryContext caller, GpuivfHit **hits, int *nhits, int64 *reranked)
{
    GpuivfIndexState *state = GpuivfGetIndexState(index);
    gpuivf::IvfPqModel model = state->model;   /* views of rd_amcache arrays */
    int         nlist = (int) s->meta.lists;
    int         dims = s->dims;
    /* re-ranked: from the vector tuples (entries are their TIDs) or from
     * the table (entries are heap TIDs); else entries are heap TIDs and the
     * ADC order is the answer */
    bool        rerank = (s->meta.flags & GPUIVF_META_RERANK) != 0;
    float      *prepared = (float *) MemoryContextAllocHuge(s->ctx, sizeof(float) * (Size) nivf * dims);
    int        *cap = (int *) palloc(sizeof(int) * nivf);
    gpuivf::TopK *topk = (gpuivf::TopK *) palloc(sizeof(gpuivf::TopK) * nivf);
    int        *list_count = (int *) palloc0(sizeof(int) * (nlist + 1));
    int        *list_start;
    int        *list_queries;
    int32     **probes = (int32 **) palloc(sizeof(int32 *) * nivf);
    float      *probe_scores;
    float      *lut = (float *) palloc(sizeof(float) * gpuivf::ivfpq_lut_size(model));
    int         max_probe = 1;
    int64       total_probes = 0;
    uint8      *list_codes = NULL;
    uint64     *list_ids = NULL;
    int64       list_cap = 0;

    /* prepare, probe, and the TopK of each query */
    for (int j = 0; j < nivf; j++)
        max_probe = Max(max_probe, queries[which[j]].nprobe);
    probe_scores = (float *) palloc(sizeof(float) * max_probe);
    for (int j = 0; j < nivf; j++)
    {
        const GpuivfQuery *q = &queries[which[j]];
        int         nprobe = Min(Max(q->nprobe, 1), nlist);

        gpuivf::prepare_vector(s->metric, q->vector, prepared + (size_t) j * dims, dims);
        probes[j] = (int32 *) palloc(sizeof(int32) * nprobe);
        gpuivf::ivfpq_probe_lists(model, prepared + (size_t) j * dims, nprobe, probes[j],
                                  probe_scores);
        for (int p = 0; p < nprobe; p++)
        {
            int         list = probes[j][p];

            if (list >= 0 && list < nlist)
            {
                list_count[list]++;
                total_probes++;
            }
        }
        cap[j] = Max(rerank ? Max(q->k, q->rerank) : q->k, 1);
        gpuivf::topk_init(&topk[j],
                          (float *) palloc(sizeof(float) * cap[j]),
                          (uint64 *) palloc(sizeof(uint64) * cap[j]), cap[j]);
        CHECK_FOR_INTERRUPTS();
    }

    /* list -> the queries probing it (counting sort) */
    list_start = (int *) palloc(sizeof(int) * (nlist + 1));
    list_start[0] = 0;
    for (int l = 0; l < nlist; l++)
        list_start[l + 1] = list_start[l] + list_count[l];
    list_queries = (int *) MemoryContextAllocHuge(s->ctx, sizeof(int) * Max(total_probes, 1));
    memset(list_count, 0, sizeof(int) * nlist);
    for (int j = 0; j < nivf; j++)
    {
        int         nprobe = Min(Max(queries[which[j]].nprobe, 1), nlist);

        for (int p = 0; p < nprobe; p++)
        {
            int         list = probes[j][p];

            if (list >= 0 && list < nlist)
                list_queries[list_start[list] + list_count[list]++] = j;
        }
    }

    /* each probed list once: all its entries, then every query probing it */
    for (int list = 0; list < nlist; list++)
    {
        GpuivfListDirEntry dir;
        BlockNumber blkno;
        int64       n = 0;

        if (list_count[list] == 0)
            continue;
        dir = GpuivfReadDirEntry(index, &s->meta, list);
        blkno = dir.head;
        while (BlockNumberIsValid(blkno))
        {
            BlockNumber next;
            int         m = GpuivfReadListPage(index, blkno, s->code_size, s->page_capacity,
                                                s->page_ids, s->page_codes, &next);

            if (n + m > list_cap)
            {
                int64       newcap = Max(Max(list_cap * 2, n + m), 1024);

                if (list_codes == NULL)
                {
                    list_codes = (uint8 *) MemoryContextAllocHuge(s->ctx, (Size) newcap * s->code_size);
                    list_ids = (uint64 *) MemoryContextAllocHuge(s->ctx, sizeof(uint64) * newcap);
                }
                else
                {
                    list_codes = (uint8 *) repalloc_huge(list_codes, (Size) newcap * s->code_size);
                    list_ids = (uint64 *) repalloc_huge(list_ids, sizeof(uint64) * newcap);
                }
                list_cap = newcap;
            }
            memcpy(list_codes + (size_t) n * s->code_size, s->page_codes, (size_t) m * s->code_size);
            memcpy(list_ids + n, s->page_ids, sizeof(uint64) * m);
            n += m;
            blkno = next;
            CHECK_FOR_INTERRUPTS();
        }
        if (n == 0)
            continue;
        for (int i = list_start[list]; i < list_start[list] + list_count[list]; i++)
        {
            int         j = list_queries[i];
            float       bias;

            gpuivf::ivfpq_build_lut(model, prepared + (size_t) j * dims, list, lut, &bias);
            gpuivf::ivfpq_adc_scan(model, lut, bias, list_codes, list_ids, n, &topk[j]);
        }
        CHECK_FOR_INTERRUPTS();
    }
    for (int j = 0; j < nivf; j++)
        gpuivf::topk_sort(&topk[j]);

    if (!rerank)
    {
        /* list entries hold heap TIDs; ADC distances, already in order */
        for (int j = 0; j < nivf; j++)
        {
            int         qi = which[j];
            GpuivfResult *res = (GpuivfResult *) palloc(sizeof(GpuivfResult) * Max(topk[j].size, 1));

            for (int i = 0; i < topk[j].size; i++)
            {
                res[i].distance = gpuivf::ivfpq_score_to_distance(s->metric, topk[j].vals[i]);
                res[i].heapid = topk[j].ids[i];
            }
            hits[qi] = MakeHits(caller, res, topk[j].size, queries[qi].k, &nhits[qi]);
        }
        return;
    }

    /* exact re-rank of every query's candidates (search/rerank.cpp: from
     * the vector tuples or the table) */
    {
        uint64    **cand = (uint64 **) palloc(sizeof(uint64 *) * nivf);
        int        *ncand = (int *) palloc(sizeof(int) * nivf);

        for (int j = 0; j < nivf; j++)
        {
            cand[j] = topk[j].ids;
            ncand[j] = topk[j].size;
        }
        GpuivfRerankCandidates(index, &s->meta, nivf, queries, which, cand, ncand, caller, hits,
                               nhits, reranked);
    }
}

/* The CPU engine in this backend (see the file comment); meta as for
 * GpuivfSearchBatch. */
void
GpuivfSearchBatchCpu(Relation index, int nq, const GpuivfQuery *queries,
                     GpuivfHit **hits, int *nhits, GpuivfSearchStats *stats,
                     const GpuivfMetaPageData *meta)
{
    MemoryContext caller = CurrentMemoryContext;
    SearchScratch s;
    int        *exact_which;
    int        *ivf_which;
    int         nexact = 0;
    int         nivf = 0;
    int64       reranked = 0;

    memset(&s, 0, sizeof(s));
    s.ctx = AllocSetContextCreate(caller, "gpuivf search", ALLOCSET_DEFAULT_SIZES);
    MemoryContextSwitchTo(s.ctx);

    GpuivfGivenOrReadMeta(index, meta, &s.meta);
    s.metric = (gpuivf::Metric) s.meta.metric;
    s.dims = (int) s.meta.dims;
    s.code_size = s.meta.code_size;

    exact_which = (int *) palloc(sizeof(int) * Max(nq, 1));
    ivf_which = (int *) palloc(sizeof(int) * Max(nq, 1));
    for (int i = 0; i < nq; i++)
    {
        const GpuivfQuery *q = &queries[i];

        hits[i] = NULL;
        nhits[i] = 0;
        if (s.dims == 0 || q->vector == NULL || q->k < 1)
            continue;           /* never saw a vector: nothing to find */
        if (GpuivfQueryIsExact(&s.meta, q))
            exact_which[nexact++] = i;
        else
            ivf_which[nivf++] = i;
    }

    if (nexact > 0)
    {
        SearchExact(index, &s, queries, exact_which, nexact, caller, hits, nhits);
        for (int j = 0; j < nexact; j++)
            reranked += nhits[exact_which[j]];
    }
    if (nivf > 0)
    {
        s.page_capacity = GPUIVF_LIST_PAGE_CAPACITY(s.code_size);
        s.page_codes = (uint8 *) palloc((Size) s.code_size * s.page_capacity + 1);
        s.page_ids = (uint64 *) palloc(sizeof(uint64) * s.page_capacity);
        SearchIvf(index, &s, queries, ivf_which, nivf, caller, hits, nhits, &reranked);
    }

    /* queries without an answer still get an (empty) array */
    for (int i = 0; i < nq; i++)
        if (hits[i] == NULL)
            hits[i] = (GpuivfHit *) MemoryContextAlloc(caller, sizeof(GpuivfHit));

    MemoryContextSwitchTo(caller);
    MemoryContextDelete(s.ctx);

    stats->on_gpu = false;
    stats->batch_size = nq;
    stats->queue_ms = 0;
    stats->gpu_ms = 0;
    stats->reranked = reranked;
}
