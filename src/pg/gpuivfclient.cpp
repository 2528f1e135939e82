/*
 * gpuivfclient.cpp — the backend side of the GPU worker protocol: batched
 * kNN searches (the "Search dispatch" seam of gpuivf.h), CREATE INDEX work
 * (training, encoding), exact kNN for ANALYZE's ground truth, and where an
 * index is cached (gpuivf_index_info).
 *
 * gpuivf.device decides:
 *   cpu   never asks the worker (every function returns false at once);
 *   auto  asks when a worker is ready; any failure (no worker, worker error,
 *         timeout, worker exit) returns false and the caller answers on the
 *         CPU, counted in gpuivf_stat.cpu_fallbacks (per query for searches,
 *         per request for build and ANALYZE work);
 *   gpu   raises a clear error instead of falling back.
 * Searches the GPU engine does not take by design (a temporary or untrained
 * index, exact mode — nprobe covering every list of an index with stored
 * vectors) are routed to the CPU by GpuivfSearchBatch under every setting;
 * searches above the engine's limits (GpuivfGpuLimitExceeded) run on the
 * CPU under auto and raise GpuivfRaiseGpuLimit under gpu.
 */
#include "gpuivf.h"
#include "gpuivfworker.h"

#include <algorithm>

#include "utils/builtins.h"

/* Why no worker can serve, as a DETAIL sentence. */
static void
NoWorkerDetail(char *buf, Size len)
{
    if (GpuivfShmem == NULL)
    {
        snprintf(buf, len, "The gpuivf library is not in shared_preload_libraries, so no GPU worker was started.");
        return;
    }
    for (int i = 0; i < GpuivfShmem->nworkers; i++)
    {
        GpuivfWorkerSlot *w = &GpuivfShmem->workers[i];
        int         state;
        char        message[GPUIVF_MESSAGE_LEN];

        SpinLockAcquire(&w->mutex);
        state = w->state;
        strlcpy(message, w->message, sizeof(message));
        SpinLockRelease(&w->mutex);
        if (state == GPUIVF_WORKER_NO_GPU)
        {
            snprintf(buf, len, "GPU worker %d has no usable GPU: %s.", i, message);
            return;
        }
    }
    snprintf(buf, len, "No GPU worker is ready (starting, or restarting after an exit).");
}

static void
RaiseNoWorker(void)
{
    char        detail[GPUIVF_MESSAGE_LEN + 64];

    NoWorkerDetail(detail, sizeof(detail));
    ereport(ERROR,
            (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
             errmsg("gpuivf.device is set to \"gpu\" but no gpuivf GPU worker is running"),
             /* the reason depends on the machine: log it, keep client output stable */
             errdetail_log("%s", detail),
             errhint("Set gpuivf.device to \"auto\" or \"cpu\" to run gpuivf scans on the CPU.")));
}

/* n queries or requests answered on the CPU although gpuivf is preloaded
 * (gpuivf.h); worker -1: none was asked, shown in worker 0's row. */
void
GpuivfCountCpuFallbacks(int worker, int64 n)
{
    if (GpuivfShmem == NULL || n <= 0)
        return;
    if (worker >= 0 && worker < GpuivfShmem->nworkers)
        pg_atomic_fetch_add_u64(&GpuivfShmem->workers[worker].cpu_fallbacks, (uint64) n);
    else
        pg_atomic_fetch_add_u64(&GpuivfShmem->fallbacks_no_worker, (uint64) n);
}

/* Is a GPU worker with a usable GPU up to take requests? */
bool
GpuivfWorkerAvailable(void)
{
    if (gpuivf_device == GPUIVF_DEVICE_CPU)
        return false;
    return GpuivfReadyWorkers() > 0;
}

/*
 * Can the worker be asked at all?  false under cpu; under gpu without a
 * ready worker, raises; under auto, counts `count` fallbacks.
 */
static bool
WorkerUsable(int64 count)
{
    if (gpuivf_device == GPUIVF_DEVICE_CPU)
        return false;
    if (GpuivfReadyWorkers() > 0)
        return true;
    if (gpuivf_device == GPUIVF_DEVICE_GPU)
        RaiseNoWorker();
    GpuivfCountCpuFallbacks(-1, count);
    return false;
}

/*
 * A request that did not succeed: raise under gpu, else count `count`
 * fallbacks (queries, or 1 for a build or exact kNN request) on the worker
 * that failed and let the caller answer on the CPU.  Releases the slot
 * (when answered).
 */
static void
RequestFailed(Relation index, GpuivfRequestSlot *slot, bool answered, const char *what,
              int64 count)
{
    char        message[GPUIVF_MESSAGE_LEN];
    char        detail[GPUIVF_MESSAGE_LEN];
    int         sqlerrcode = ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE;
    int         worker = -1;

    if (answered)
    {
        strlcpy(message, slot->message, sizeof(message));
        strlcpy(detail, slot->detail, sizeof(detail));
        if (slot->result == GPUIVF_RESULT_ERROR && slot->sqlerrcode != 0)
            sqlerrcode = slot->sqlerrcode;
        worker = slot->taken_by;
        GpuivfReleaseSlot(slot);
    }
    else
    {
        snprintf(message, sizeof(message), "no answer within gpuivf.worker_timeout (%d ms)",
                 gpuivf_worker_timeout);
        detail[0] = '\0';
    }
    if (gpuivf_device == GPUIVF_DEVICE_GPU)
        ereport(ERROR,
                (errcode(sqlerrcode),
                 errmsg("gpuivf GPU worker could not %s index \"%s\": %s", what,
                        RelationGetRelationName(index), message),
                 detail[0] ? errdetail("%s", detail) : 0,
                 errhint("Set gpuivf.device to \"auto\" to answer on the CPU when the GPU cannot.")));
    ereport(DEBUG1,
            (errmsg("gpuivf: %s of index \"%s\" runs on the CPU: %s", what,
                    RelationGetRelationName(index), message)));
    GpuivfCountCpuFallbacks(worker, count);
}

/* Fill the identity of index into a request. */
static void
SetIndexIdentity(GpuivfRequestSlot *slot, Relation index, const GpuivfMetaPageData *meta)
{
    slot->dboid = MyDatabaseId;
    slot->indexoid = RelationGetRelid(index);
    slot->node = index->rd_node;
    slot->permanent = index->rd_rel->relpersistence == RELPERSISTENCE_PERMANENT;
    slot->lsn_reliable = RelationNeedsWAL(index);
    slot->train_id = meta ? meta->train_id : 0;
    slot->generation = meta ? meta->generation : 0;
    slot->dims = meta ? (int) meta->dims : 0;
    slot->reranked = 0;
}

/* ------------------------------------------------------------ search */

/* The first GPU engine limit the query exceeds, or NULL (gpuivf.h). */
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

/* ----------------------------------------------------- sharded search */

/*
 * Shards a search of an index of meta's shape uses (gpuivfworker.h,
 * "Sharding"): gpuivf.shards when it is 2 or more (at most one per
 * worker); under 0 (auto) the fewest that make one shard's copy fit the
 * smallest gpuivf.gpu_memory_limit of the ready workers; 1 otherwise.
 */
static int
ShardCount(const GpuivfMetaPageData *meta)
{
    int         nworkers = GpuivfShmem->nworkers;
    int64       limit = -1;

    if (nworkers < 2 || gpuivf_shards == 1)
        return 1;
    if (gpuivf_shards >= 2)
        return Min(gpuivf_shards, nworkers);
    /*
     * Read without the workers' spinlocks, like GpuivfReadyWorkers: every
     * search of a multi-GPU host passes here.  A worker sets its limit
     * before it turns READY (the read barrier keeps that order); a limit
     * changing under us is a reload, seen a moment early or late, which
     * the locked read did not prevent either.  The shard count never
     * changes a search's rows, only which workers answer.
     */
    for (int i = 0; i < nworkers; i++)
    {
        volatile GpuivfWorkerSlot *w = &GpuivfShmem->workers[i];
        int64       wlimit;

        if (!GpuivfWorkerReady(i))
            continue;
        pg_read_barrier();
        wlimit = w->memory_limit;
        if (wlimit > 0 && (limit < 0 || wlimit < limit))
            limit = wlimit;
    }
    if (limit <= 0 || GpuivfEstimateGpuBytes(meta, 1) <= limit)
        return 1;
    for (int s = 2; s < nworkers; s++)
        if (GpuivfEstimateGpuBytes(meta, s) <= limit)
            return s;
    return nworkers;            /* the workers say so if it still does not fit */
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
                  const GpuivfQuery *queries, const int *stride, int off, int nq, int nshards,
                  int shard, GpuivfSearchLayout *l, int *kmax)
{
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
    SetIndexIdentity(slot, index, meta);
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
SearchRequest(Relation index, const GpuivfMetaPageData *meta, const GpuivfQuery *queries,
              const int *stride, int off, int nq, GpuivfRequestSlot **slot,
              GpuivfSearchLayout *l, int *kmax)
{
    int         c = 0;

    if ((*slot = GpuivfMySlot()) != NULL)
        c = FillSearchRequest(*slot, index, meta, queries, stride, off, nq, 1, 0, l, kmax);
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

/* a < b for distances, NaN after every number (as the engines rank it) */
static int
CompareDistance(double a, double b)
{
    bool        an = a != a;    /* NaN */
    bool        bn = b != b;

    if (an || bn)
        return an == bn ? 0 : (an ? 1 : -1);
    return a < b ? -1 : (a > b ? 1 : 0);
}

/* (distance, id) order: ties broken by the smaller id */
static int
CompareDistanceThenId(double da, uint64 ia, double db, uint64 ib)
{
    int         c = CompareDistance(da, db);

    if (c != 0)
        return c;
    return ia < ib ? -1 : (ia > ib ? 1 : 0);
}

/* (ADC distance, id) and (exact distance, id) orders of shard candidates */
static bool
AdcBefore(const ShardHit &x, const ShardHit &y)
{
    return CompareDistanceThenId(x.adc, x.id, y.adc, y.id) < 0;
}

static bool
DistanceBefore(const ShardHit &x, const ShardHit &y)
{
    return CompareDistanceThenId(x.dist, x.id, y.dist, y.id) < 0;
}

/*
 * The search of a sharded index: every shard worker, all asked at once
 * (a request slot each), returns per query its `candidates` =
 * max(k, rerank) best entries by ADC among the probed lists it holds, with
 * ADC and exact distances.  The union holds the
 * global best `candidates` by (ADC, id) (each of them is among its own
 * shard's best), so keeping exactly those and ordering them by (exact
 * distance, id) gives what one GPU re-ranking the global candidates gives.
 * Without stored vectors each shard returns its k best by ADC and the merge
 * keeps the k best by (ADC, id).  Same contract as GpuivfWorkerSearch.
 */
static bool
ShardedSearch(Relation index, const GpuivfMetaPageData *meta, int nshards, int nq,
              const GpuivfQuery *queries, GpuivfHit **hits, int *nhits,
              GpuivfSearchStats *stats)
{
    bool        stores_vectors = (meta->flags & GPUIVF_META_RERANK) != 0;
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
                c = FillSearchRequest(slots[s], index, meta, queries, cand, off, nq, nshards, s, &l,
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
 * Search nq queries of one index on the GPU worker; hits[i] (palloc'd,
 * best first) and nhits[i] out.  False when the CPU must answer (gpuivf.h);
 * errors are raised here under gpuivf.device = gpu.  Every query travels
 * with its own k, nprobe and rerank; the stride of the answers of one
 * request is its largest k.
 */
bool
GpuivfWorkerSearch(Relation index, int nq, const GpuivfQuery *queries,
                   GpuivfHit **hits, int *nhits, GpuivfSearchStats *stats,
                   const GpuivfMetaPageData *given_meta)
{
    GpuivfMetaPageData meta;
    GpuivfRequestSlot *slot;
    int        *want;

    if (nq <= 0 || !WorkerUsable(nq))
        return false;
    if (index->rd_rel->relpersistence == RELPERSISTENCE_TEMP)
        return false;           /* local buffers: only this backend can read them */
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
    for (int i = 0; i < nq; i++)
        hits[i] = (GpuivfHit *) palloc(sizeof(GpuivfHit) * Max(queries[i].k, 1));

    {
        int         nshards = ShardCount(&meta);

        if (nshards > 1)
            return ShardedSearch(index, &meta, nshards, nq, queries, hits, nhits, stats);
    }

    want = (int *) palloc(sizeof(int) * nq);
    for (int i = 0; i < nq; i++)
        want[i] = queries[i].k;
    for (int off = 0; off < nq;)
    {
        int         kmax;
        int         c;
        GpuivfSearchLayout l;
        char       *payload;

        /* as many queries as fit one request buffer, their stride their largest k */
        c = SearchRequest(index, &meta, queries, want, off, nq, &slot, &l, &kmax);
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

/* ------------------------------------------------------------- build */

/*
 * Submits a filled request and waits for it with no time limit (index
 * builds and exact-kNN answers are long); cancel still works.  True when
 * answered.
 */
static bool
SubmitAndWaitUnlimited(GpuivfRequestSlot *slot)
{
    GpuivfSubmit(slot);
    return GpuivfWaitAnswer(slot, 0);
}

/*
 * Run a TRAIN or ENCODE request whose data is in seg; false when the CPU
 * must do it.  The wait has no time limit (a build is long); cancel works.
 */
static bool
BuildRequest(Relation index, dsm_segment *seg, int kind, int metric, int dims,
             const int64 *args)
{
    GpuivfRequestSlot *slot = GpuivfMySlot();
    bool        answered;

    if (slot == NULL)
        return false;
    slot->kind = kind;
    SetIndexIdentity(slot, index, NULL);
    slot->dims = dims;
    slot->metric = metric;
    slot->nq = 0;
    slot->kmax = 0;
    slot->dsm = dsm_segment_handle(seg);
    for (int i = 0; i < 4; i++)
        slot->arg[i] = args[i];
    answered = SubmitAndWaitUnlimited(slot);
    if (!answered || slot->result != GPUIVF_RESULT_OK)
    {
        RequestFailed(index, slot, answered, kind == GPUIVF_KIND_TRAIN ? "train" : "encode", 1);
        return false;
    }
    GpuivfReleaseSlot(slot);
    return true;
}

static Size
CodebookFloats(int dims, int pq_m, int pq_bits)
{
    return (Size) pq_m * ((Size) 1 << pq_bits) * (dims / pq_m);
}

/*
 * CREATE INDEX: k-means and PQ training of n sample vectors (prepared
 * space) on the GPU worker; centroids (lists x dims) and codebook out.
 */
bool
GpuivfWorkerTrain(Relation index, gpuivf::Metric metric, const float *sample, int64 n,
                  int dims, int lists, int pq_m, int pq_bits, float *centroids, float *codebook)
{
    Size        xb = sizeof(float) * (Size) n * dims;
    Size        cb = sizeof(float) * (Size) lists * dims;
    Size        bb = sizeof(float) * CodebookFloats(dims, pq_m, pq_bits);
    dsm_segment *seg;
    char       *base;
    int64       args[4] = {n, lists, pq_m, pq_bits};
    bool        ok;

    if (!WorkerUsable(0))
        return false;
    seg = dsm_create(xb + cb + bb, DSM_CREATE_NULL_IF_MAXSEGMENTS);
    if (seg == NULL)
        return false;
    base = (char *) dsm_segment_address(seg);
    memcpy(base, sample, xb);
    ok = BuildRequest(index, seg, GPUIVF_KIND_TRAIN, (int) metric, dims, args);
    if (ok)
    {
        memcpy(centroids, base + xb, cb);
        memcpy(codebook, base + xb + cb, bb);
    }
    dsm_detach(seg);
    return ok;
}

/*
 * CREATE INDEX: lists and PQ codes of batches of raw vectors on the GPU
 * worker (the same bytes the CPU's ivfpq_encode writes, up to exact float
 * ties).  One DSM segment serves every batch of the build
 * (GpuivfEncodePayloadLayout): the model is copied once, and of its two
 * batch areas the backend's scan fills one while the worker encodes the
 * other, so the heap scan and the GPU overlap.  At most one request is in
 * flight (a backend has one request slot).
 */
struct GpuivfEncodeJob
{
    dsm_segment *seg;
    GpuivfEncodeLayout layout;
    gpuivf::IvfPqModel model;
    int64       cap;
    GpuivfRequestSlot *pending; /* submitted and not waited for, or NULL */
    int         pending_area;
};

/* Requests submitted now and waited for later, for the abort callbacks:
 * the encode job with a batch in flight, a build's load request. */
static GpuivfEncodeJob *PendingEncodeJob = NULL;
static GpuivfRequestSlot *PendingLoad = NULL;
static bool pending_callbacks_registered = false;

/* An aborted (sub)transaction leaves no such request behind. */
static void
AbandonPendingRequests(void)
{
    if (PendingEncodeJob != NULL && PendingEncodeJob->pending != NULL)
        GpuivfAbandonRequest(PendingEncodeJob->pending);
    if (PendingEncodeJob != NULL)
        PendingEncodeJob->pending = NULL;
    PendingEncodeJob = NULL;
    if (PendingLoad != NULL)
        GpuivfAbandonRequest(PendingLoad);
    PendingLoad = NULL;
}

static void
PendingXactCallback(XactEvent event, void *arg)
{
    if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT)
        AbandonPendingRequests();
}

static void
PendingSubXactCallback(SubXactEvent event, SubTransactionId mySubid,
                       SubTransactionId parentSubid, void *arg)
{
    if (event == SUBXACT_EVENT_ABORT_SUB)
        AbandonPendingRequests();
}

static void
RegisterPendingCallbacks(void)
{
    if (pending_callbacks_registered)
        return;
    RegisterXactCallback(PendingXactCallback, NULL);
    RegisterSubXactCallback(PendingSubXactCallback, NULL);
    pending_callbacks_registered = true;
}

/* Starts encoding on the GPU worker (gpuivf.h); NULL: the CPU encodes. */
GpuivfEncodeJob *
GpuivfWorkerEncodeBegin(const gpuivf::IvfPqModel &model, int64 batch_cap)
{
    GpuivfEncodeJob *job;
    GpuivfEncodeHeader h;
    GpuivfEncodeLayout l;
    dsm_segment *seg;
    char       *base;

    if (batch_cap <= 0 || !WorkerUsable(0))
        return NULL;
    h.cap = batch_cap;
    h.lists = model.nlist;
    h.pq_m = model.m;
    h.pq_bits = model.nbits;
    h.code_size = gpuivf::pq_code_size(model.m, model.nbits);
    l = GpuivfEncodePayloadLayout(&h, model.d);
    seg = dsm_create(l.total, DSM_CREATE_NULL_IF_MAXSEGMENTS);
    if (seg == NULL)
        return NULL;
    base = (char *) dsm_segment_address(seg);
    memcpy(base, &h, sizeof(h));
    memcpy(base + l.centroids_off, model.centroids, sizeof(float) * (Size) model.nlist * model.d);
    memcpy(base + l.codebook_off, model.codebook,
           sizeof(float) * CodebookFloats(model.d, model.m, model.nbits));
    RegisterPendingCallbacks();
    job = (GpuivfEncodeJob *) palloc0(sizeof(GpuivfEncodeJob));
    job->seg = seg;
    job->layout = l;
    job->model = model;
    job->cap = batch_cap;
    job->pending = NULL;
    return job;
}

/* Area a's raw rows (cap x dims): the scan writes a batch there directly. */
float *
GpuivfWorkerEncodeArea(GpuivfEncodeJob *job, int area)
{
    return (float *) ((char *) dsm_segment_address(job->seg) + job->layout.area_off[area] +
                      job->layout.raw_off);
}

/*
 * Submit the n rows of area `area` for encoding and return at once; false
 * when the worker cannot take them (the caller encodes them on the CPU).
 * The previous batch must have been waited for.
 */
bool
GpuivfWorkerEncodeSubmit(GpuivfEncodeJob *job, Relation index, int area, int64 n)
{
    GpuivfRequestSlot *slot;

    Assert(job->pending == NULL);
    if (n <= 0 || n > job->cap || area < 0 || area > 1 || !WorkerUsable(0))
        return false;
    slot = GpuivfMySlot();
    if (slot == NULL)
        return false;
    slot->kind = GPUIVF_KIND_ENCODE;
    SetIndexIdentity(slot, index, NULL);
    slot->dims = job->model.d;
    slot->metric = (int) job->model.metric;
    slot->nq = 0;
    slot->kmax = 0;
    slot->dsm = dsm_segment_handle(job->seg);
    slot->arg[0] = n;
    slot->arg[1] = area;
    slot->arg[2] = 0;
    slot->arg[3] = 0;
    job->pending = slot;
    job->pending_area = area;
    PendingEncodeJob = job;
    GpuivfSubmit(slot);
    return true;
}

/*
 * Wait for the submitted batch: true with *lists and *codes pointing at its
 * answer in the segment (valid until the area is submitted again); false
 * when the CPU must encode it (errors are raised under gpuivf.device = gpu).
 * No time limit (a batch of a large build is long); cancel works.
 */
bool
GpuivfWorkerEncodeWait(GpuivfEncodeJob *job, Relation index, const int32 **lists,
                       const uint8 **codes)
{
    GpuivfRequestSlot *slot = job->pending;
    char       *a;
    bool        answered;

    if (slot == NULL)
        return false;
    /* from here the wait owns the request: an error in it abandons it */
    job->pending = NULL;
    PendingEncodeJob = NULL;
    answered = GpuivfWaitAnswer(slot, 0);
    if (!answered || slot->result != GPUIVF_RESULT_OK)
    {
        RequestFailed(index, slot, answered, "encode", 1);
        return false;
    }
    GpuivfReleaseSlot(slot);
    a = (char *) dsm_segment_address(job->seg) + job->layout.area_off[job->pending_area];
    *lists = (const int32 *) (a + job->layout.lists_off);
    *codes = (const uint8 *) (a + job->layout.codes_off);
    return true;
}

/* Ends the job (its segment goes; a request still in flight is abandoned). */
void
GpuivfWorkerEncodeEnd(GpuivfEncodeJob *job)
{
    if (job == NULL)
        return;
    if (job->pending != NULL)
        GpuivfAbandonRequest(job->pending);
    if (PendingEncodeJob == job)
        PendingEncodeJob = NULL;
    dsm_detach(job->seg);
    pfree(job);
}

/*
 * A build's index, loaded by a GPU worker in the background (gpuivf.h):
 * true when a LOAD request went out; GpuivfWorkerLoadWait waits for it.
 * Nothing is raised and nothing counts as a CPU fallback: without a worker
 * (or for a sharded index, whose shards load on their own workers) the
 * calibration's first search loads the copy as it always did.
 */
bool
GpuivfWorkerLoadStart(Relation index, const GpuivfMetaPageData *meta)
{
    GpuivfRequestSlot *slot;

    Assert(PendingLoad == NULL);
    if (gpuivf_device == GPUIVF_DEVICE_CPU || GpuivfReadyWorkers() == 0 || ShardCount(meta) > 1)
        return false;
    if ((slot = GpuivfMySlot()) == NULL)
        return false;
    slot->kind = GPUIVF_KIND_LOAD;
    SetIndexIdentity(slot, index, meta);
    slot->nq = 0;
    slot->kmax = 0;
    RegisterPendingCallbacks();
    PendingLoad = slot;
    GpuivfSubmit(slot);
    return true;
}

/* Wait for the load GpuivfWorkerLoadStart sent (if any); a failed load is
 * only reported at DEBUG1 (the next search of the index loads it again). */
void
GpuivfWorkerLoadWait(Relation index)
{
    GpuivfRequestSlot *slot = PendingLoad;

    if (slot == NULL)
        return;
    /* from here the wait owns the request: an error in it abandons it */
    PendingLoad = NULL;
    if (!GpuivfWaitAnswer(slot, 0))
        return;
    if (slot->result != GPUIVF_RESULT_OK)
        ereport(DEBUG1,
                (errmsg("gpuivf GPU worker did not load index \"%s\" ahead of its calibration: %s",
                        RelationGetRelationName(index), slot->message)));
    else
        ereport(DEBUG1,
                (errmsg("gpuivf GPU worker %d loaded index \"%s\" while its pages were logged",
                        slot->taken_by, RelationGetRelationName(index))));
    GpuivfReleaseSlot(slot);
}

/* ------------------------------------------------- exact kNN (ANALYZE) */

/* Larger jobs stay on the CPU (a DSM segment of that size is unusual). */
#define GPUIVF_EXACT_KNN_MAX_BYTES  ((Size) 512 * 1024 * 1024)

struct GpuivfExactKnnJob
{
    Relation    index;
    dsm_segment *seg;
    GpuivfExactKnnLayout layout;
    gpuivf::Metric metric;
    int         dims;
    int         nq;
    int         kk;
    int64       batch_cap;
    bool        dead;           /* a request failed: the CPU finishes */
};

/* Starts an exact kNN job on the GPU worker, or NULL (gpuivf.h). */
GpuivfExactKnnJob *
GpuivfWorkerExactKnnBegin(Relation index, gpuivf::Metric metric, int dims, int nq,
                          const float4 *queries, int kk, int64 batch_cap, float4 **base)
{
    GpuivfExactKnnJob *job;
    GpuivfExactKnnLayout l;
    dsm_segment *seg;

    if (!GpuivfWorkerAvailable() || nq < 1 || dims < 1 || dims > GPUIVF_CUDA_MAX_DIMS ||
        kk < 1 || kk > GPUIVF_CUDA_MAX_K || batch_cap < 1 || GpuivfMySlot() == NULL)
        return NULL;
    l = GpuivfExactKnnPayloadLayout(nq, dims, kk, batch_cap);
    if (l.total > GPUIVF_EXACT_KNN_MAX_BYTES)
        return NULL;
    seg = dsm_create(l.total, DSM_CREATE_NULL_IF_MAXSEGMENTS);
    if (seg == NULL)
        return NULL;
    job = (GpuivfExactKnnJob *) palloc0(sizeof(GpuivfExactKnnJob));
    job->index = index;
    job->seg = seg;
    job->layout = l;
    job->metric = metric;
    job->dims = dims;
    job->nq = nq;
    job->kk = kk;
    job->batch_cap = batch_cap;
    memcpy((char *) dsm_segment_address(seg) + l.queries_off, queries,
           sizeof(float4) * (Size) nq * dims);
    *base = (float4 *) ((char *) dsm_segment_address(seg) + l.base_off);
    return job;
}

/* Exact top-kk of the job's queries among the n rows of its base (gpuivf.h). */
bool
GpuivfWorkerExactKnnRun(GpuivfExactKnnJob *job, int64 n, float *scores, uint64 *ids)
{
    GpuivfRequestSlot *slot;
    char       *data;
    bool        answered;

    if (job == NULL || job->dead || n < 0 || n > job->batch_cap)
        return false;
    if (GpuivfReadyWorkers() == 0 || (slot = GpuivfMySlot()) == NULL)
    {
        /* the worker went away between two batches */
        if (gpuivf_device == GPUIVF_DEVICE_GPU)
            RaiseNoWorker();
        job->dead = true;
        GpuivfCountCpuFallbacks(-1, 1);
        return false;
    }
    slot->kind = GPUIVF_KIND_EXACT_KNN;
    SetIndexIdentity(slot, job->index, NULL);
    slot->dims = job->dims;
    slot->metric = (int) job->metric;
    slot->nq = job->nq;
    slot->kmax = job->kk;
    slot->dsm = dsm_segment_handle(job->seg);
    slot->arg[0] = n;
    slot->arg[1] = job->kk;
    slot->arg[2] = job->batch_cap;
    slot->arg[3] = 0;
    /* like an index build: no time limit (the answer may be big), cancel works */
    answered = SubmitAndWaitUnlimited(slot);
    if (!answered || slot->result != GPUIVF_RESULT_OK)
    {
        job->dead = true;
        RequestFailed(job->index, slot, answered, "compute exact neighbours for", 1);
        return false;
    }
    GpuivfReleaseSlot(slot);
    data = (char *) dsm_segment_address(job->seg);
    memcpy(scores, data + job->layout.scores_off, sizeof(float) * (Size) job->nq * job->kk);
    memcpy(ids, data + job->layout.ids_off, sizeof(uint64) * (Size) job->nq * job->kk);
    return true;
}

/* Did a Run of the job fail (the CPU finished it)? */
bool
GpuivfWorkerExactKnnDead(const GpuivfExactKnnJob *job)
{
    return job == NULL || job->dead;
}

/* Ends a job (NULL is fine); its DSM segment goes away. */
void
GpuivfWorkerExactKnnEnd(GpuivfExactKnnJob *job)
{
    if (job == NULL)
        return;
    if (job->seg != NULL)
        dsm_detach(job->seg);
    pfree(job);
}

/* ------------------------------------------------- gpuivf_index_info */

/* Appends "gpu_cache": [{worker, device, generation, vectors, bytes, shard,
 * shards}, ...]: shards 1 is a whole copy, else the copy of lists
 * l % shards = shard. */
void
GpuivfAppendCacheInfo(StringInfo json, Relation index)
{
    bool        first = true;

    appendStringInfoString(json, "\"gpu_cache\": [");
    for (int i = 0; GpuivfShmem != NULL && i < GpuivfShmem->nworkers; i++)
    {
        GpuivfWorkerSlot *w = &GpuivfShmem->workers[i];
        GpuivfShownIndex shown[GPUIVF_MAX_SHOWN_INDEXES];
        int         n;
        int         device;

        SpinLockAcquire(&w->mutex);
        n = Min(w->nindexes, GPUIVF_MAX_SHOWN_INDEXES);
        device = w->device;
        memcpy(shown, w->shown, sizeof(GpuivfShownIndex) * n);
        SpinLockRelease(&w->mutex);
        for (int j = 0; j < n; j++)
        {
            if (shown[j].dboid != MyDatabaseId || shown[j].relnode != index->rd_node.relNode ||
                shown[j].indexoid != RelationGetRelid(index))
                continue;
            appendStringInfo(json, "%s{\"worker\": %d, \"device\": %d, \"generation\": " UINT64_FORMAT
                             ", \"vectors\": " INT64_FORMAT ", \"bytes\": " INT64_FORMAT
                             ", \"shard\": %d, \"shards\": %d}",
                             first ? "" : ", ", i, device, shown[j].generation,
                             shown[j].vectors, shown[j].bytes, shown[j].shard,
                             Max(shown[j].nshards, 1));
            first = false;
        }
    }
    appendStringInfoString(json, "], ");
}

/* ------------------------------------------------- gpuivf_worker_search */

extern "C" {
PG_FUNCTION_INFO_V1(gpuivf_worker_search);
}

/*
 * gpuivf_worker_search(index, query, k, nprobe) -> (heap_tid, distance):
 * the k nearest rows as the GPU worker answers them (a diagnostic: compare
 * with the CPU's answer of ORDER BY ... LIMIT k under the same probes).
 * Always asks the worker, whatever gpuivf.device says.
 */
Datum
gpuivf_worker_search(PG_FUNCTION_ARGS)
{
    ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
    Oid         relid = PG_GETARG_OID(0);
    int         k = PG_GETARG_INT32(2);
    int         nprobe = PG_GETARG_INT32(3);
    Relation    index;
    GpuivfMetaPageData meta;
    GpuivfQuery query;
    GpuivfHit  *hits = NULL;
    int         nhits = 0;
    int         dims;
    int         saved_device = gpuivf_device;
    bool        served;

    InitMaterializedSRF(fcinfo, 0);
    index = index_open(relid, AccessShareLock);
    if (index->rd_rel->relam != get_index_am_oid("gpuivf", false))
        ereport(ERROR,
                (errcode(ERRCODE_WRONG_OBJECT_TYPE),
                 errmsg("\"%s\" is not a gpuivf index", RelationGetRelationName(index))));
    if (k < 1 || k > GPUIVF_CUDA_MAX_K)
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                 errmsg("k must be between 1 and %d", GPUIVF_CUDA_MAX_K)));
    GpuivfReadMeta(index, &meta);
    query.vector = GpuivfDatumGetVector(PG_GETARG_DATUM(1), &dims);
    GpuivfCheckDims((int) meta.dims, dims);
    if (nprobe <= 0)
        nprobe = gpuivf_probes > 0 ? gpuivf_probes
            : (int) Max(1.0, ceil(sqrt((double) Max(meta.lists, (uint32) 1))));
    query.k = k;
    query.nprobe = nprobe;
    query.rerank = (meta.flags & GPUIVF_META_RERANK) ? Max(gpuivf_rerank_candidates, k) : 0;

    /* what the worker never takes, said precisely */
    if (index->rd_rel->relpersistence == RELPERSISTENCE_TEMP || !GpuivfMetaIsTrained(&meta) ||
        GpuivfQueryIsExact(&meta, &query))
        ereport(ERROR,
                (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                 errmsg("the gpuivf GPU worker does not search index \"%s\" this way",
                        RelationGetRelationName(index)),
                 index->rd_rel->relpersistence == RELPERSISTENCE_TEMP
                 ? errdetail("A temporary index is searched by its own backend, on the CPU.")
                 : !GpuivfMetaIsTrained(&meta)
                 ? errdetail("An untrained index is searched exactly, on the CPU.")
                 : errdetail("Probing all %u lists of an index that stores vectors is an exact scan, which runs on the CPU.",
                             meta.lists),
                 errhint("Compare with the query itself under gpuivf.device = \"cpu\".")));
    GpuivfRaiseGpuLimit(index, &query);

    gpuivf_device = GPUIVF_DEVICE_GPU;
    PG_TRY();
    {
        served = GpuivfWorkerSearch(index, 1, &query, &hits, &nhits, NULL, &meta);
    }
    PG_FINALLY();
    {
        gpuivf_device = saved_device;
    }
    PG_END_TRY();
    if (!served)                /* cannot happen: raised above or inside */
        elog(ERROR, "the gpuivf GPU worker did not serve a search of index \"%s\"",
             RelationGetRelationName(index));
    for (int i = 0; i < nhits; i++)
    {
        Datum       values[2];
        bool        nulls[2] = {false, false};
        ItemPointer tid = (ItemPointer) palloc(sizeof(ItemPointerData));

        *tid = hits[i].tid;
        values[0] = PointerGetDatum(tid);
        values[1] = Float8GetDatum(hits[i].distance);
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
    index_close(index, AccessShareLock);
    return (Datum) 0;
}
