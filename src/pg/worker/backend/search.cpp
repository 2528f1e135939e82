/*
 * worker/backend/search.cpp — a backend's kNN searches on the GPU worker
 * (GpuivfWorkerSearch, which GpuivfSearchBatch calls): the queries packed
 * into request payloads, one request per worker for a sharded index and the
 * shards' candidates merged here; the GPU engine's per-query limits.
 */
#include "gpuivf.h"
#include "worker/worker.h"
#include "worker/protocol.h"
#include "worker/backend/backend.h"
#include "storage/storage.h"

#include <algorithm>

/* ------------------------------------------------------------ search */

/* The first GPU engine limit the query exceeds, or NULL (worker.h). */
const char *
GpuivfGpuLimitExceeded(const GpuivfQuery *query)
{
    if (query->k > GPUIVF_GPU_MAX_K)
        return "k";
    if (query->rerank > GPUIVF_GPU_MAX_K)
        return "candidates";
    if (query->nprobe > GPUIVF_GPU_MAX_NPROBE)
        return "nprobe";
    return NULL;
}

/*
 * A query above the engine's limits where the CPU may not answer it
 * (gpuivf.device = gpu, or gpuivf_worker_search): ERROR naming the limit.
 */
void
GpuivfRaiseGpuLimit(Relation index, const GpuivfQuery *query)
{
    const char *limit = GpuivfGpuLimitExceeded(query);
    const char *detail = "The GPU engine's limits are per query; under gpuivf.device = \"gpu\" such searches are not moved to the CPU.";

    if (limit == NULL)
        return;
    if (strcmp(limit, "nprobe") == 0)
        ereport(ERROR,
                (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                 errmsg("search of index \"%s\" probes %d lists, more than the %d the GPU engine probes",
                        RelationGetRelationName(index), query->nprobe, GPUIVF_GPU_MAX_NPROBE),
                 errdetail("%s", detail),
                 errhint("Set gpuivf.probes to %d or less (or lower gpuivf.target_recall), or set gpuivf.device to \"auto\" to run such searches on the CPU.",
                         GPUIVF_GPU_MAX_NPROBE)));
    if (strcmp(limit, "candidates") == 0)
        ereport(ERROR,
                (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                 errmsg("search of index \"%s\" re-ranks %d candidates, more than the %d the GPU engine re-ranks",
                        RelationGetRelationName(index), query->rerank, GPUIVF_GPU_MAX_K),
                 errdetail("%s", detail),
                 errhint("Set gpuivf.rerank_candidates to %d or less, or set gpuivf.device to \"auto\" to run such searches on the CPU.",
                         GPUIVF_GPU_MAX_K)));
    ereport(ERROR,
            (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
             errmsg("search of index \"%s\" asks for %d rows, more than the %d the GPU engine returns",
                    RelationGetRelationName(index), query->k, GPUIVF_GPU_MAX_K),
             errdetail("%s", detail),
             errhint("Use a LIMIT of %d or less, or set gpuivf.device to \"auto\" to run such searches on the CPU.",
                     GPUIVF_GPU_MAX_K)));
}

/* A search that cannot go to the worker (larger than a request buffer, or
 * no request slot): ERROR with gpuivf.device = gpu, else counted for the CPU. */
static void
SearchDoesNotFit(Relation index, int nq)
{
    if (gpuivf_device == GPUIVF_DEVICE_GPU)
        ereport(ERROR,
                (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                 errmsg("a search of index \"%s\" does not fit the GPU worker's request buffer",
                        RelationGetRelationName(index)),
                 errhint("Raise gpuivf.request_buffer, or set gpuivf.device to \"auto\" to run such searches on the CPU.")));
    GpuivfCountCpuFallbacks(-1, nq);
}

/* Writes the c queries' k, nprobe, rerank and vectors into a search payload. */
static void
FillSearchPayload(char *payload, const GpuivfSearchLayout *l, const GpuivfQuery *queries,
                  int c, int dims)
{
    for (int q = 0; q < c; q++)
    {
        ((int32 *) (payload + l->k_off))[q] = queries[q].k;
        ((int32 *) (payload + l->nprobe_off))[q] = queries[q].nprobe;
        ((int32 *) (payload + l->rerank_off))[q] = queries[q].rerank;
        memcpy(payload + l->vec_off + sizeof(float4) * (Size) q * dims,
               queries[q].vector, sizeof(float4) * dims);
    }
}

/*
 * Submits a filled search request and waits; false (after RequestFailed) when
 * it was not answered or failed: the whole batch of nq queries goes to the CPU.
 */
static bool
SubmitSearch(Relation index, GpuivfRequestSlot *slot, int nq)
{
    bool        answered = GpuivfSubmitAndWait(slot);

    if (!answered || slot->result != GPUIVF_RESULT_OK)
    {
        RequestFailed(index, slot, answered, "search", nq);
        return false;
    }
    return true;
}

/* Adds an answered search request's timings and counts to stats (if any). */
static void
AddSearchStats(GpuivfSearchStats *stats, const GpuivfRequestSlot *slot)
{
    if (stats == NULL)
        return;
    stats->on_gpu = true;
    stats->batch_size = Max(stats->batch_size, slot->batch_size);
    stats->gpu_ms += slot->gpu_ms;
    stats->reranked += slot->reranked;
    if (slot->taken_at > slot->submitted_at)
        stats->queue_ms += (double) (slot->taken_at - slot->submitted_at) / 1000.0;
}

/*
 * Fills slot with the search of the queries from off on that fit its share
 * of the payload area; the answers' stride is the largest stride[] among
 * them (each query's k, or its candidates for a shard).  Addressed to
 * shard's worker when nshards > 1, else to any.  Returns how many queries
 * it took, laid out as *l with stride *kmax; 0 when not even the first
 * fits (the slot is then untouched).
 */
static int
FillSearchRequest(GpuivfRequestSlot *slot, Relation index, const GpuivfMetaPageData *meta,
                  const GpuivfQuery *queries, const int *stride, int off, int nq,
                  const GpuivfPlacement *pl, int shard, GpuivfSearchLayout *l, int *kmax)
{
    int         nshards = pl->nshards;
    bool        sharded = nshards > 1;
    int         dims = (int) meta->dims;
    int         c = 0;

    *kmax = 1;
    while (off + c < nq)
    {
        int         k2 = Max(*kmax, stride[off + c]);

        if (GpuivfSearchPayloadLayout(c + 1, dims, k2, sharded).total > slot->payload_cap)
            break;
        *kmax = k2;
        c++;
    }
    if (c == 0)
        return 0;
    *l = GpuivfSearchPayloadLayout(c, dims, *kmax, sharded);
    slot->kind = GPUIVF_KIND_SEARCH;
    SetIndexIdentity(slot, index, meta, pl->version);
    slot->codes_only = pl->codes_only;
    if (sharded)
    {
        slot->target_worker = shard;
        slot->nshards = nshards;
        slot->shard = shard;
    }
    slot->nq = c;
    slot->kmax = *kmax;
    FillSearchPayload(GpuivfSlotPayload((int) (slot - GpuivfShmem->slots)), l, queries + off, c,
                      dims);
    return c;
}

/*
 * One request of an unsharded search: the queries from off on that fit
 * this backend's request buffer, sent to any worker and answered.  Returns
 * how many queries it took; 0 when the whole batch of nq queries goes to
 * the CPU (counted, or raised under gpuivf.device = gpu).  Otherwise *slot
 * holds the answer, laid out as *l with stride *kmax: the caller reads it
 * and releases the slot.
 */
static int
SearchRequest(Relation index, const GpuivfMetaPageData *meta, const GpuivfPlacement *pl,
              const GpuivfQuery *queries, const int *stride, int off, int nq,
              GpuivfRequestSlot **slot, GpuivfSearchLayout *l, int *kmax)
{
    int         c = 0;

    if ((*slot = GpuivfMySlot()) != NULL)
        c = FillSearchRequest(*slot, index, meta, queries, stride, off, nq, pl, 0, l, kmax);
    if (c == 0)
    {
        /* a query larger than a request buffer, or a process without a
         * request slot */
        SearchDoesNotFit(index, nq);
        return 0;
    }
    /* a failure sends the whole batch to the CPU: every query counts */
    if (!SubmitSearch(index, *slot, nq))
        return 0;
    return c;
}

/*
 * Waits for the n shards' requests, submitted together.  True when all
 * answered; else the others are withdrawn or abandoned, the failure is
 * raised (gpuivf.device = gpu) or counted for the CPU, and false.  An
 * interrupt (cancel, statement_timeout) abandons every one of them.
 */
static bool
WaitShardAnswers(Relation index, GpuivfRequestSlot **slots, int n, int nq)
{
    volatile int failed = -1;
    volatile bool answered = true;

    PG_TRY();
    {
        for (int s = 0; s < n && failed < 0; s++)
        {
            answered = GpuivfWaitAnswer(slots[s], gpuivf_worker_timeout);
            if (!answered || slots[s]->result != GPUIVF_RESULT_OK)
                failed = s;
        }
    }
    PG_CATCH();
    {
        for (int s = 0; s < n; s++)
            GpuivfAbandonRequest(slots[s]);
        PG_RE_THROW();
    }
    PG_END_TRY();
    if (failed < 0)
        return true;
    for (int s = 0; s < n; s++)
        if (s != failed)
            GpuivfAbandonRequest(slots[s]);
    RequestFailed(index, slots[failed], answered, "search", nq);
    return false;
}

/* A candidate of one query from one shard. */
typedef struct ShardHit
{
    uint64      id;             /* heap TID */
    double      adc;            /* the ADC distance it was selected by */
    double      dist;           /* exact distance (= adc without re-rank) */
} ShardHit;

/* (ADC distance, id) and (exact distance, id) orders of shard candidates */
static bool
AdcBefore(const ShardHit &x, const ShardHit &y)
{
    return GpuivfCompareDistanceId(x.adc, x.id, y.adc, y.id) < 0;
}

static bool
DistanceBefore(const ShardHit &x, const ShardHit &y)
{
    return GpuivfCompareDistanceId(x.dist, x.id, y.dist, y.id) < 0;
}

/*
 * The search of a sharded index: every shard worker, all asked at once
 * (a request slot each), returns per query its `candidates` =
 * max(k, rerank) best entries by ADC among the probed lists it holds, with
 * ADC and exact distances.  The union holds the
 * global best `candidates` by (ADC, id) (each of them is among its own
 * shard's best), so keeping exactly those and ordering them by (exact
 * distance, id) gives what one GPU re-ranking the global candidates gives.
 * Without stored vectors on the GPU (none, or a copy of the codes alone)
 * each shard returns its k best by ADC and the merge keeps the k best by
 * (ADC, id).  Same contract as GpuivfWorkerSearch; hits[q] of k allocated
 * by the caller.
 */
static bool
ShardedSearch(Relation index, const GpuivfMetaPageData *meta, const GpuivfPlacement *pl, int nq,
              const GpuivfQuery *queries, GpuivfHit **hits, int *nhits,
              GpuivfSearchStats *stats)
{
    int         nshards = pl->nshards;
    bool        stores_vectors = GpuivfMetaStoresVectors(meta) && !pl->codes_only;
    ShardHit  **pool = (ShardHit **) palloc(sizeof(ShardHit *) * nq);
    int        *npool = (int *) palloc0(sizeof(int) * nq);
    int        *cand = (int *) palloc(sizeof(int) * nq);

    for (int s = 0; s < nshards; s++)
    {
        if (GpuivfWorkerReady(s))
            continue;
        if (gpuivf_device == GPUIVF_DEVICE_GPU)
            ereport(ERROR,
                    (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                     errmsg("gpuivf GPU worker %d, which holds shard %d of %d of index \"%s\", is not ready",
                            s, s, nshards, RelationGetRelationName(index)),
                     errhint("Set gpuivf.device to \"auto\" to answer on the CPU while it restarts.")));
        GpuivfCountCpuFallbacks(s, nq);
        return false;
    }
    for (int q = 0; q < nq; q++)
    {
        cand[q] = stores_vectors ? Max(queries[q].k, queries[q].rerank) : queries[q].k;
        pool[q] = (ShardHit *) palloc(sizeof(ShardHit) * (Size) cand[q] * nshards);
    }

    for (int off = 0; off < nq;)
    {
        GpuivfRequestSlot *slots[GPUIVF_MAX_WORKERS];
        GpuivfSearchLayout l;
        int         kmax = 1;
        int         c = 0;

        /* as many queries as fit a shard's share of the request buffer,
         * their stride their most candidates; every shard asked at once */
        if (GpuivfMySlots(nshards, slots))
        {
            for (int s = 0; s < nshards; s++)
                c = FillSearchRequest(slots[s], index, meta, queries, cand, off, nq, pl, s, &l,
                                      &kmax);
        }
        if (c == 0)
        {
            SearchDoesNotFit(index, nq);
            return false;
        }
        for (int s = 0; s < nshards; s++)
            GpuivfSubmit(slots[s]);
        if (!WaitShardAnswers(index, slots, nshards, nq))
            return false;
        for (int s = 0; s < nshards; s++)
        {
            char       *payload = GpuivfSlotPayload((int) (slots[s] - GpuivfShmem->slots));

            for (int q = 0; q < c; q++)
            {
                int         got = ((int32 *) (payload + l.nhits_off))[q];
                const uint64 *ids = (const uint64 *) (payload + l.ids_off) + (Size) q * kmax;
                const double *dist = (const double *) (payload + l.dist_off) + (Size) q * kmax;
                const double *adc = (const double *) (payload + l.adc_off) + (Size) q * kmax;
                ShardHit   *p = pool[off + q];

                got = Min(Max(got, 0), cand[off + q]);
                for (int j = 0; j < got; j++)
                {
                    ShardHit   *h = &p[npool[off + q]++];

                    h->id = ids[j];
                    h->adc = adc[j];
                    h->dist = dist[j];
                }
            }
            AddSearchStats(stats, slots[s]);
            GpuivfReleaseSlot(slots[s]);
        }
        off += c;
    }

    /*
     * Merge: the global candidates, the cand best by (ADC, id), selected
     * without sorting the pool; then the rows in (distance, id) order,
     * sorted only as far as they are returned (k, and past a duplicate TID
     * until k are distinct).  Shards answer about 200 candidates each for
     * a LIMIT 10: full sorts of them cost a backend tens of microseconds a
     * statement.
     */
    for (int q = 0; q < nq; q++)
    {
        ShardHit   *p = pool[q];
        int         n = Min(npool[q], cand[q]);
        int         got = 0;
        int         sorted = 0;

        if (npool[q] > n)
            std::nth_element(p, p + n, p + npool[q], AdcBefore);
        for (int j = 0; j < n && got < queries[q].k; j++)
        {
            bool        dup = false;

            if (j == sorted)
            {
                /* the next k - got rows in order */
                int         upto = Min(n, j + (queries[q].k - got));

                if (stores_vectors)
                    std::partial_sort(p + j, p + upto, p + n, DistanceBefore);
                else
                    std::partial_sort(p + j, p + upto, p + n, AdcBefore);
                sorted = upto;
            }
            /* a heap TID twice (reuse during a load) is returned once */
            for (int u = 0; u < got && !dup; u++)
                dup = GpuivfTidToId(&hits[q][u].tid) == p[j].id;
            if (dup)
                continue;
            GpuivfIdToTid(p[j].id, &hits[q][got].tid);
            hits[q][got].distance = p[j].dist;
            got++;
        }
        nhits[q] = got;
        pfree(p);
    }
    pfree(pool);
    pfree(npool);
    pfree(cand);
    return true;
}

/*
 * The search of an unsharded copy: as many queries per request as fit one
 * request buffer, their stride their largest k.  hits[q] of k allocated by
 * the caller.
 */
static bool
UnshardedSearch(Relation index, const GpuivfMetaPageData *meta, const GpuivfPlacement *pl,
                int nq, const GpuivfQuery *queries, GpuivfHit **hits, int *nhits,
                GpuivfSearchStats *stats)
{
    GpuivfRequestSlot *slot;
    int        *want = (int *) palloc(sizeof(int) * nq);

    for (int i = 0; i < nq; i++)
        want[i] = queries[i].k;
    for (int off = 0; off < nq;)
    {
        int         kmax;
        int         c;
        GpuivfSearchLayout l;
        char       *payload;

        c = SearchRequest(index, meta, pl, queries, want, off, nq, &slot, &l, &kmax);
        if (c == 0)
            return false;
        payload = GpuivfSlotPayload((int) (slot - GpuivfShmem->slots));
        for (int q = 0; q < c; q++)
        {
            int         got = ((int32 *) (payload + l.nhits_off))[q];
            const uint64 *ids = (const uint64 *) (payload + l.ids_off) + (Size) q * kmax;
            const double *dist = (const double *) (payload + l.dist_off) + (Size) q * kmax;
            GpuivfHit  *h = hits[off + q];

            got = Min(Max(got, 0), queries[off + q].k);
            for (int j = 0; j < got; j++)
            {
                GpuivfIdToTid(ids[j], &h[j].tid);
                h[j].distance = dist[j];
            }
            nhits[off + q] = got;
        }
        AddSearchStats(stats, slot);
        GpuivfReleaseSlot(slot);
        off += c;
    }
    pfree(want);
    return true;
}

/*
 * The search of copies that hold only codes (README.md, "Larger than the
 * GPU"): each query's C = max(k, rerank) best entries by ADC (entry ids:
 * vector tuple TIDs), sharded or not, which the caller re-ranks: the same
 * candidates as a GPU re-rank, hence the same rows.
 */
static bool
AdcCandidateSearch(Relation index, const GpuivfMetaPageData *meta, const GpuivfPlacement *pl,
                   int nq, const GpuivfQuery *queries, GpuivfHit **hits, int *nhits,
                   GpuivfSearchStats *stats)
{
    GpuivfQuery *adc = (GpuivfQuery *) palloc(sizeof(GpuivfQuery) * nq);
    bool        ok;

    for (int q = 0; q < nq; q++)
    {
        adc[q] = queries[q];
        adc[q].k = Min(Max(queries[q].k, queries[q].rerank), GPUIVF_GPU_MAX_K);
        adc[q].rerank = 0;
        hits[q] = (GpuivfHit *) palloc(sizeof(GpuivfHit) * adc[q].k);
    }
    ok = pl->nshards > 1
        ? ShardedSearch(index, meta, pl, nq, adc, hits, nhits, stats)
        : UnshardedSearch(index, meta, pl, nq, adc, hits, nhits, stats);
    pfree(adc);
    return ok;
}

/*
 * Search nq queries of one index on the GPU worker; hits[i] (palloc'd,
 * best first) and nhits[i] out.  False when the CPU must answer (worker.h);
 * errors are raised here under gpuivf.device = gpu.  Every query travels
 * with its own k, nprobe and rerank; the stride of the answers of one
 * request is its largest k.
 */
bool
GpuivfWorkerSearch(Relation index, int nq, const GpuivfQuery *queries,
                   GpuivfHit **hits, int *nhits, GpuivfSearchStats *stats,
                   const GpuivfMetaPageData *given_meta, bool *adc_candidates)
{
    GpuivfMetaPageData meta;
    GpuivfPlacement pl;
    uint64      version;

    *adc_candidates = false;
    if (nq <= 0 || !WorkerUsable(nq))
        return false;
    if (!GpuivfWorkerCanRead(index))
        return false;
    GpuivfGivenOrReadMeta(index, given_meta, &meta);
    if (!GpuivfMetaIsTrained(&meta) || meta.dims == 0 || meta.lists > GPUIVF_CUDA_MAX_LISTS)
        return false;
    for (int i = 0; i < nq; i++)
    {
        if (queries[i].vector == NULL || queries[i].k < 1 || queries[i].nprobe < 1 ||
            queries[i].rerank < 0 || GpuivfGpuLimitExceeded(&queries[i]) != NULL ||
            GpuivfQueryIsExact(&meta, &queries[i]))
            return false;
    }

    if (stats != NULL)
        memset(stats, 0, sizeof(*stats));
    /* the rows now (the placement counts them) and their version, read
     * after the caller's snapshot: every row it sees is at most that */
    version = GpuivfReadRows(index, &meta);
    pl = GpuivfPlaceIndex(&meta);
    pl.version = version;
    if (pl.codes_only)
    {
        *adc_candidates = true;
        return AdcCandidateSearch(index, &meta, &pl, nq, queries, hits, nhits, stats);
    }
    for (int i = 0; i < nq; i++)
        hits[i] = (GpuivfHit *) palloc(sizeof(GpuivfHit) * Max(queries[i].k, 1));
    if (pl.nshards > 1)
        return ShardedSearch(index, &meta, &pl, nq, queries, hits, nhits, stats);
    return UnshardedSearch(index, &meta, &pl, nq, queries, hits, nhits, stats);
}
