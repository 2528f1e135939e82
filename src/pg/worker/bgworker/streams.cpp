/*
 * worker/bgworker/streams.cpp — the GPU worker's searches: one group of requests
 * (one index, or one shard of it) becomes one engine call per candidate
 * count, and the common case (one candidate count) runs on a search stream
 * so that the worker takes and prepares the next batch while the GPU works.
 *
 * Search streams.  The worker holds gpuivf.search_streams engine resources
 * objects (a CUDA stream, cuBLAS handle and arena each; the first is the
 * worker's main one).  A group handed to a stream is started with
 * gpuivf_cuda_index_search_async and answered — results written into each
 * request's payload, backends woken — when the worker finds it done
 * (GpuivfFinishSearches) or needs the stream back; streams finish in the
 * order they started.  Everything that changes a GPU copy (loading,
 * catching up, eviction) or uses the main resources otherwise (builds,
 * exact kNN, the synchronous searches) first drains the streams
 * (GpuivfDrainSearches), so a search in flight never sees its index change.
 * Engine errors of a stream become the answers of its requests (SQLSTATE
 * and message), never an ERROR outside a transaction.
 */
#include "gpuivf.h"
#include "worker/worker.h"
#include "worker/protocol.h"
#include "worker/bgworker/bgworker.h"

#include "utils/memutils.h"

/* A query of a search group: where it came from and what it asks. */
typedef struct GroupQuery
{
    int         req;            /* request of the group */
    int         pos;            /* query number in that request */
    int32       k;
    int32       nprobe;
    int32       candidates;     /* re-ranked exactly; 0: ADC order */
} GroupQuery;

/* A group running on a search stream, and what its answer needs. */
typedef struct SearchStream
{
    gpuivf_cuda_resources *res;
    bool        busy;
    uint64      seq;            /* start order */
    MemoryContext cxt;          /* reset when answered */
    int         worker;
    int         nreq;
    int        *slotnos;
    bool        sharded;        /* a shard's search: answers carry ADC distances */
    int         dims;
    int64       m;
    GroupQuery *gq;
    int32      *qk;
    int         kmax;
    double     *dist;
    uint64     *ids;
    double     *adc;            /* sharded: the ADC distance of each answer */
    int64       entries;
    instr_time  started;
} SearchStream;

static SearchStream *Streams = NULL;
static int  NStreams = 0;
static uint64 StreamSeq = 0;
static instr_time LastCallEnd;  /* for the GPU's busy time: calls overlap */
static bool LastCallEndSet = false;

static int
CompareCandidates(const void *a, const void *b)
{
    const GroupQuery *x = (const GroupQuery *) a;
    const GroupQuery *y = (const GroupQuery *) b;

    if (x->candidates != y->candidates)
        return x->candidates < y->candidates ? -1 : 1;
    if (x->req != y->req)
        return x->req < y->req ? -1 : 1;
    return x->pos < y->pos ? -1 : (x->pos > y->pos ? 1 : 0);
}

/*
 * Whether the n ids (UINT64_MAX ends them) hold one twice.  An index copy
 * may hold a heap TID twice while a load catches up with its reuse; that
 * is rare, so the answers are copied as they are unless this says so.
 * Sorting a copy keeps a LIMIT 1000 from costing 500,000 comparisons; a
 * few are compared pairwise.
 */
static bool
HasDuplicateIds(const uint64 *ids, int n, uint64 *scratch)
{
    int         m = 0;

    while (m < n && ids[m] != UINT64_MAX)
        m++;
    if (m <= 16)
    {
        for (int i = 1; i < m; i++)
            for (int j = 0; j < i; j++)
                if (ids[i] == ids[j])
                    return true;
        return false;
    }
    memcpy(scratch, ids, sizeof(uint64) * m);
    qsort(scratch, m, sizeof(uint64), GpuivfCompareUint64);
    for (int i = 1; i < m; i++)
        if (scratch[i] == scratch[i - 1])
            return true;
    return false;
}

/* Statistics of one engine call of m queries from started to ended; the
 * GPU's busy time counts overlapping calls once (calls end in start order). */
static void
CountCall(int worker, int64 m, instr_time started, instr_time ended)
{
    GpuivfWorkerSlot *w = &GpuivfShmem->workers[worker];
    instr_time  busy_from = started;
    instr_time  busy;
    uint64      cur;

    if (LastCallEndSet && INSTR_TIME_GET_DOUBLE(LastCallEnd) > INSTR_TIME_GET_DOUBLE(busy_from))
        busy_from = LastCallEnd;
    busy = ended;
    INSTR_TIME_SUBTRACT(busy, busy_from);
    if (INSTR_TIME_GET_DOUBLE(busy) > 0)
        pg_atomic_fetch_add_u64(&w->gpu_us, (uint64) (INSTR_TIME_GET_MICROSEC(busy)));
    LastCallEnd = ended;
    LastCallEndSet = true;
    pg_atomic_fetch_add_u64(&w->batches, 1);
    pg_atomic_fetch_add_u64(&w->queries, (uint64) m);
    cur = pg_atomic_read_u64(&w->max_batch);
    while ((uint64) m > cur && !pg_atomic_compare_exchange_u64(&w->max_batch, &cur, (uint64) m))
        ;
}

/*
 * Answers of the m queries gq[] of one engine call (rows of kmax, each query
 * its qk[j] best) into their requests' payloads; sharded calls also write
 * each answer's ADC distance (adc, rows of kmax).
 */
static void
WriteAnswers(const int *slotnos, bool sharded, int dims, const GroupQuery *gq, int64 m,
             const int32 *qk, int kmax, const double *dist, const uint64 *ids, const double *adc,
             int64 entries, double gpu_ms, int *req_batch, double *req_gpu_ms, int64 *req_reranked)
{
    uint64     *scratch = (uint64 *) palloc(sizeof(uint64) * kmax);

    for (int64 j = 0; j < m; j++)
    {
        const GroupQuery *g = &gq[j];
        GpuivfRequestSlot *r = &GpuivfShmem->slots[slotnos[g->req]];
        char       *payload = GpuivfSlotPayload(slotnos[g->req]);
        GpuivfSearchLayout l = GpuivfSearchPayloadLayout(r->nq, dims, r->kmax, sharded);
        uint64     *rids = (uint64 *) (payload + l.ids_off) + (Size) g->pos * r->kmax;
        double     *rdist = (double *) (payload + l.dist_off) + (Size) g->pos * r->kmax;
        double     *radc = (double *) (payload + l.adc_off) + (Size) g->pos * r->kmax;
        const uint64 *src_ids = ids + j * kmax;
        const double *src_d = dist + j * kmax;
        /* a shard's candidates go to the backend's merge, which drops a
         * duplicate TID from the rows it returns */
        bool        dedupe = !sharded && HasDuplicateIds(src_ids, qk[j], scratch);
        int         got = 0;

        for (int t = 0; t < qk[j]; t++)
        {
            bool        dup = false;

            if (src_ids[t] == UINT64_MAX)
                break;
            /* a heap TID twice is returned once (its best) */
            for (int u = 0; dedupe && u < got && !dup; u++)
                dup = rids[u] == src_ids[t];
            if (dup)
                continue;
            rids[got] = src_ids[t];
            rdist[got] = src_d[t];
            if (sharded)
                radc[got] = adc[j * kmax + t];
            got++;
        }
        ((int32 *) (payload + l.nhits_off))[g->pos] = got;
        req_batch[g->req] = Max(req_batch[g->req], (int) m);
        /* each call of a request counts once towards its GPU time */
        if (j == 0 || gq[j - 1].req != g->req)
            req_gpu_ms[g->req] += gpu_ms;
        /* the engine re-ranks the best `candidates` of the probed lists;
         * the CPU would count fewer only when those lists hold fewer
         * entries */
        req_reranked[g->req] += Min((int64) g->candidates, entries);
    }
    pfree(scratch);
}

/* Pack the m queries gq[] into queries (m x dims) and their k and nprobe
 * into qk / qnp (a shard answers with all its candidates); the largest k
 * and nprobe out. */
static void
PackQueries(const int *slotnos, bool sharded, int dims, const GroupQuery *gq, int64 m,
            bool all_candidates, float *queries, int32 *qk, int32 *qnp, int *kmax, int *npmax)
{
    *kmax = 1;
    *npmax = 1;
    for (int64 j = 0; j < m; j++)
    {
        const GroupQuery *g = &gq[j];
        GpuivfRequestSlot *r = &GpuivfShmem->slots[slotnos[g->req]];
        GpuivfSearchLayout l = GpuivfSearchPayloadLayout(r->nq, dims, r->kmax, sharded);

        memcpy(queries + j * dims,
               GpuivfSlotPayload(slotnos[g->req]) + l.vec_off + sizeof(float) * (Size) g->pos * dims,
               sizeof(float) * dims);
        qk[j] = all_candidates ? g->candidates : g->k;
        qnp[j] = g->nprobe;
        *kmax = Max(*kmax, qk[j]);
        *npmax = Max(*npmax, g->nprobe);
    }
}

/* ---------------------------------------------------- search streams */

/* Set up gpuivf.search_streams streams: the main resources and more of
 * its device (fewer, with a LOG line, when the GPU refuses more). */
void
GpuivfSearchStreamsStart(int device, int nstreams)
{
    Streams = (SearchStream *) MemoryContextAllocZero(TopMemoryContext,
                                                      sizeof(SearchStream) * Max(nstreams, 1));
    NStreams = 0;
    for (int i = 0; i < nstreams; i++)
    {
        SearchStream *s = &Streams[NStreams];

        if (i == 0)
            s->res = GpuivfCudaRes;
        else
        {
            gpuivf_cuda_status st = GpuivfCuda.gpuivf_cuda_resources_create(device, 256 << 20, &s->res);

            if (st.code != GPUIVF_CUDA_OK)
            {
                ereport(LOG,
                        (errmsg("gpuivf GPU worker uses %d search stream(s) instead of %d: %s",
                                NStreams, nstreams, st.message)));
                break;
            }
        }
        s->cxt = AllocSetContextCreate(TopMemoryContext, "gpuivf search stream",
                                       ALLOCSET_DEFAULT_SIZES);
        NStreams++;
    }
}

int
GpuivfSearchesInFlight(void)
{
    int         n = 0;

    for (int i = 0; i < NStreams; i++)
        n += Streams[i].busy ? 1 : 0;
    return n;
}

/* The busy stream started first, or NULL. */
static SearchStream *
OldestStream(void)
{
    SearchStream *oldest = NULL;

    for (int i = 0; i < NStreams; i++)
        if (Streams[i].busy && (oldest == NULL || Streams[i].seq < oldest->seq))
            oldest = &Streams[i];
    return oldest;
}

/* Wait for stream s, answer its requests (or give them the engine's error)
 * and wake their backends.  Raises nothing. */
static void
FinishStream(SearchStream *s)
{
    instr_time  t0;
    gpuivf_cuda_status st;
    instr_time  ended;
    instr_time  took;
    double      gpu_ms;

    INSTR_TIME_SET_CURRENT(t0);
    st = GpuivfCuda.gpuivf_cuda_search_wait(s->res);
    GpuivfAddSeconds(&GpuivfTimes.gpu_wait, &t0);
    INSTR_TIME_SET_CURRENT(ended);
    took = ended;
    INSTR_TIME_SUBTRACT(took, s->started);
    gpu_ms = INSTR_TIME_GET_MILLISEC(took);
    CountCall(s->worker, s->m, s->started, ended);
    if (st.code == GPUIVF_CUDA_OK)
    {
        MemoryContext old = MemoryContextSwitchTo(s->cxt);
        int        *req_batch = (int *) palloc0(sizeof(int) * s->nreq);
        double     *req_gpu_ms = (double *) palloc0(sizeof(double) * s->nreq);
        int64      *req_reranked = (int64 *) palloc0(sizeof(int64) * s->nreq);

        WriteAnswers(s->slotnos, s->sharded, s->dims, s->gq, s->m, s->qk, s->kmax, s->dist, s->ids,
                     s->adc, s->entries, gpu_ms, req_batch, req_gpu_ms, req_reranked);
        for (int i = 0; i < s->nreq; i++)
        {
            GpuivfRequestSlot *r = &GpuivfShmem->slots[s->slotnos[i]];

            r->result = GPUIVF_RESULT_OK;
            r->batch_size = req_batch[i];
            r->gpu_ms = req_gpu_ms[i];
            r->reranked = req_reranked[i];
        }
        MemoryContextSwitchTo(old);
    }
    else
    {
        int         sqlerrcode = GpuivfCudaErrcode(st);

        for (int i = 0; i < s->nreq; i++)
        {
            GpuivfRequestSlot *r = &GpuivfShmem->slots[s->slotnos[i]];

            r->result = GPUIVF_RESULT_ERROR;
            r->sqlerrcode = sqlerrcode;
            r->fallback_ok = true;
            snprintf(r->message, sizeof(r->message),
                     "gpuivf GPU engine failed to search a GPU index: %s", st.message);
            r->detail[0] = '\0';
        }
        ereport(LOG,
                (errmsg("gpuivf GPU worker %d could not serve %d request(s): %s",
                        s->worker, s->nreq, st.message)));
    }
    for (int i = 0; i < s->nreq; i++)
        GpuivfFinishRequest(s->worker, s->slotnos[i]);
    s->busy = false;
    MemoryContextReset(s->cxt);
    GpuivfTimes.requests += s->nreq;
    GpuivfTimes.batches++;
    GpuivfAddSeconds(&GpuivfTimes.answer, &t0);
}

/* Answer the oldest search in flight: only when the GPU is done with it,
 * or waiting for it (wait).  True when one was answered. */
bool
GpuivfFinishSearches(bool wait)
{
    SearchStream *s = OldestStream();
    int32       done = 1;

    if (s == NULL)
        return false;
    if (!wait)
    {
        gpuivf_cuda_status st = GpuivfCuda.gpuivf_cuda_search_done(s->res, &done);

        /* an error is the search's: its wait reports it */
        if (st.code == GPUIVF_CUDA_OK && !done)
            return false;
    }
    FinishStream(s);
    return true;
}

/* Answer every search in flight (before anything changes a GPU copy or
 * uses the main resources otherwise). */
void
GpuivfDrainSearches(void)
{
    while (GpuivfFinishSearches(true))
        ;
}

/* After an error outside a group: the requests in flight were failed with
 * the others taken; let the GPU finish and drop their answers. */
void
GpuivfForgetSearches(void)
{
    for (int i = 0; i < NStreams; i++)
    {
        if (!Streams[i].busy)
            continue;
        (void) GpuivfCuda.gpuivf_cuda_search_wait(Streams[i].res);
        Streams[i].busy = false;
        MemoryContextReset(Streams[i].cxt);
    }
}

/* A stream to start a search on: a free one, else the oldest, answered. */
static SearchStream *
FreeStream(void)
{
    for (int i = 0; i < NStreams; i++)
        if (!Streams[i].busy)
            return &Streams[i];
    (void) GpuivfFinishSearches(true);
    for (int i = 0; i < NStreams; i++)
        if (!Streams[i].busy)
            return &Streams[i];
    elog(ERROR, "gpuivf GPU worker has no free search stream");
    return NULL;                /* keep compiler quiet */
}

/* --------------------------------------------------------- searching */

uint64
GpuivfGroupVersion(const int *slotnos, int n)
{
    uint64      version = 0;

    for (int i = 0; i < n; i++)
        version = Max(version, GpuivfShmem->slots[slotnos[i]].version);
    return version;
}

/*
 * Search the queries of every request of the group (one index): one engine
 * call per candidate count.  A query's candidates are max(k, rerank) when
 * the index stores vectors (re-ranked exactly), else none (ADC order, k
 * rows), exactly as on the CPU (search/cpu.cpp), so its answer never
 * depends on the queries it is batched with; within a call each query
 * keeps its own k and nprobe.  Per-list tables: ADC scores bit-identical
 * to the CPU engine's.
 *
 * Returns true when the group went to a search stream (one candidate
 * count): its requests are answered when the stream is done.  Otherwise
 * they are answered here (results in the payloads; the caller finishes the
 * requests).
 *
 * A shard's request (nshards > 1) returns, per query, all `candidates`
 * best entries by ADC among the probed lists this shard holds, sorted by
 * exact distance, each with the ADC distance it was selected by (the
 * engine's out_adc_distances); without stored vectors its k best by ADC.
 * The backend merges the shards (worker/backend/search.cpp).
 */
bool
GpuivfServeSearchGroup(int worker, int *slotnos, int n)
{
    GpuivfRequestSlot *first = &GpuivfShmem->slots[slotnos[0]];
    int64       nq = 0;
    int         dims = first->dims;
    bool        sharded = first->nshards > 1;
    GpuivfCopyRef ref;
    GroupQuery *gq;
    float      *queries;
    int32      *qk;
    int32      *qnp;
    int        *req_batch;
    double     *req_gpu_ms;
    int64      *req_reranked;
    instr_time  t0;

    INSTR_TIME_SET_CURRENT(t0);
    if (first->nshards < 1 || first->nshards > GPUIVF_MAX_WORKERS || first->shard < 0 ||
        first->shard >= first->nshards || (sharded && first->target_worker != worker))
        elog(ERROR, "gpuivf GPU worker %d got a malformed shard request (shard %d of %d for worker %d)",
             worker, first->shard, first->nshards, first->target_worker);
    for (int i = 0; i < n; i++)
    {
        GpuivfRequestSlot *r = &GpuivfShmem->slots[slotnos[i]];

        if (r->nq < 1 || r->kmax < 1 || r->kmax > GPUIVF_CUDA_MAX_K || r->dims != dims ||
            GpuivfSearchPayloadLayout(r->nq, dims, r->kmax, sharded).total >
            GpuivfSlotCapacity(slotnos[i]))
            elog(ERROR, "gpuivf GPU worker got a malformed search request (%d queries, k %d, %d dimensions)",
                 r->nq, r->kmax, r->dims);
        nq += r->nq;
    }
    ref = GpuivfGetCopyFor(first, GpuivfGroupVersion(slotnos, n));

    /* every query with its own k, nprobe and candidates, sorted by candidates */
    gq = (GroupQuery *) palloc_extended(sizeof(GroupQuery) * nq, MCXT_ALLOC_HUGE);
    nq = 0;
    for (int i = 0; i < n; i++)
    {
        GpuivfRequestSlot *r = &GpuivfShmem->slots[slotnos[i]];
        char       *payload = GpuivfSlotPayload(slotnos[i]);
        GpuivfSearchLayout l = GpuivfSearchPayloadLayout(r->nq, dims, r->kmax, sharded);
        const int32 *rk = (const int32 *) (payload + l.k_off);
        const int32 *rnp = (const int32 *) (payload + l.nprobe_off);
        const int32 *rrr = (const int32 *) (payload + l.rerank_off);

        for (int q = 0; q < r->nq; q++)
        {
            GroupQuery *g = &gq[nq++];

            if (rk[q] < 1 || rk[q] > r->kmax || rnp[q] < 1 || rnp[q] > GPUIVF_CUDA_MAX_NPROBE ||
                rrr[q] < 0 || rrr[q] > GPUIVF_CUDA_MAX_K)
                elog(ERROR, "gpuivf GPU worker got a malformed search query (k %d of %d, nprobe %d, candidates %d)",
                     rk[q], r->kmax, rnp[q], rrr[q]);
            g->req = i;
            g->pos = q;
            g->k = rk[q];
            g->nprobe = rnp[q];
            g->candidates = ref.stores_vectors ? Max(rk[q], rrr[q]) : 0;
            /* a shard returns all its candidates: they must fit the stride */
            if (sharded && g->candidates > r->kmax)
                elog(ERROR, "gpuivf GPU worker got a malformed shard query (%d candidates, stride %d)",
                         g->candidates, r->kmax);
        }
    }
    qsort(gq, nq, sizeof(GroupQuery), CompareCandidates);

    queries = (float *) palloc_extended(sizeof(float) * nq * dims, MCXT_ALLOC_HUGE);
    qnp = (int32 *) palloc(sizeof(int32) * nq);

    /* the common case on a search stream: answered when it is done */
    if (NStreams > 0 && gq[0].candidates == gq[nq - 1].candidates)
    {
        /* a shard answers with all its candidates, and their ADC distances */
        bool        all_candidates = sharded && gq[0].candidates > 0;

        SearchStream *s;
        MemoryContext old;
        gpuivf_cuda_search_params params;
        gpuivf_cuda_status st;
        int         npmax;

        GpuivfAddSeconds(&GpuivfTimes.prepare, &t0);
        s = FreeStream();       /* its time: gpu_wait and answer */
        INSTR_TIME_SET_CURRENT(t0);
        old = MemoryContextSwitchTo(s->cxt);

        s->worker = worker;
        s->nreq = n;
        s->slotnos = (int *) palloc(sizeof(int) * n);
        memcpy(s->slotnos, slotnos, sizeof(int) * n);
        s->sharded = sharded;
        s->dims = dims;
        s->m = nq;
        s->gq = (GroupQuery *) palloc_extended(sizeof(GroupQuery) * nq, MCXT_ALLOC_HUGE);
        memcpy(s->gq, gq, sizeof(GroupQuery) * nq);
        s->qk = (int32 *) palloc(sizeof(int32) * nq);
        s->entries = ref.entries;
        PackQueries(slotnos, sharded, dims, gq, nq, all_candidates, queries, s->qk, qnp, &s->kmax,
                    &npmax);
        s->dist = (double *) palloc_extended(sizeof(double) * nq * s->kmax, MCXT_ALLOC_HUGE);
        s->ids = (uint64 *) palloc_extended(sizeof(uint64) * nq * s->kmax, MCXT_ALLOC_HUGE);
        s->adc = sharded ? (double *) palloc_extended(sizeof(double) * nq * s->kmax, MCXT_ALLOC_HUGE)
            : NULL;
        MemoryContextSwitchTo(old);
        memset(&params, 0, sizeof(params));
        params.k = s->kmax;
        params.nprobe = npmax;
        params.lut_mode = GPUIVF_CUDA_LUT_PER_LIST;
        params.rerank_candidates = gq[0].candidates;
        params.query_k = s->qk;
        params.query_nprobe = qnp;
        params.out_adc_distances = s->adc;
        params.host_arrays = 1;     /* all palloc'd */
        /* fewer, longer scan blocks when other searches already fill the GPU */
        if (GpuivfSearchesInFlight() > 0)
            params.block_codes_per_candidate = gpuivf_busy_codes_per_candidate;
        GpuivfAddSeconds(&GpuivfTimes.prepare, &t0);
        INSTR_TIME_SET_CURRENT(s->started);
        st = GpuivfCuda.gpuivf_cuda_index_search_async(s->res, ref.gindex, queries, nq, &params,
                                                      s->dist, s->ids);
        GpuivfAddSeconds(&GpuivfTimes.enqueue, &t0);
        if (st.code != GPUIVF_CUDA_OK)
        {
            MemoryContextReset(s->cxt);
            GpuivfCheckCuda(st, "search a GPU index");
        }
        s->busy = true;
        s->seq = ++StreamSeq;
        GpuivfPublishCache();
        return true;
    }

    /* several candidate counts: here and now, on the main resources
     * (which the streams share) */
    GpuivfDrainSearches();
    qk = (int32 *) palloc(sizeof(int32) * nq);
    req_batch = (int *) palloc0(sizeof(int) * n);
    req_gpu_ms = (double *) palloc0(sizeof(double) * n);
    req_reranked = (int64 *) palloc0(sizeof(int64) * n);
    for (int64 start = 0; start < nq;)
    {
        int64       end = start;
        int         kmax;
        int         npmax;
        int64       m;
        int         candidates = gq[start].candidates;
        bool        all_candidates = sharded && candidates > 0;
        double     *dist;
        uint64     *ids;
        double     *adc = NULL;
        gpuivf_cuda_search_params params;
        instr_time  t0, t1, took;

        /* [start, end): the queries of one candidate count */
        while (end < nq && gq[end].candidates == candidates)
            end++;
        m = end - start;
        PackQueries(slotnos, sharded, dims, gq + start, m, all_candidates, queries, qk, qnp, &kmax,
                    &npmax);
        dist = (double *) palloc_extended(sizeof(double) * m * kmax, MCXT_ALLOC_HUGE);
        ids = (uint64 *) palloc_extended(sizeof(uint64) * m * kmax, MCXT_ALLOC_HUGE);
        if (sharded)
            adc = (double *) palloc_extended(sizeof(double) * m * kmax, MCXT_ALLOC_HUGE);
        memset(&params, 0, sizeof(params));
        params.k = kmax;
        params.nprobe = npmax;
        params.lut_mode = GPUIVF_CUDA_LUT_PER_LIST;
        params.rerank_candidates = candidates;
        params.query_k = qk;
        params.query_nprobe = qnp;
        params.out_adc_distances = adc;
        INSTR_TIME_SET_CURRENT(t0);
        GpuivfCheckCuda(GpuivfCuda.gpuivf_cuda_index_search(GpuivfCudaRes, ref.gindex, queries, m,
                                                            &params, dist, ids),
                        "search a GPU index");
        INSTR_TIME_SET_CURRENT(t1);
        CountCall(worker, m, t0, t1);
        took = t1;
        INSTR_TIME_SUBTRACT(took, t0);
        WriteAnswers(slotnos, sharded, dims, gq + start, m, qk, kmax, dist, ids, adc, ref.entries,
                     INSTR_TIME_GET_MILLISEC(took), req_batch, req_gpu_ms, req_reranked);
        pfree(dist);
        pfree(ids);
        if (adc != NULL)
            pfree(adc);
        start = end;
    }

    for (int i = 0; i < n; i++)
    {
        GpuivfRequestSlot *r = &GpuivfShmem->slots[slotnos[i]];

        r->result = GPUIVF_RESULT_OK;
        r->batch_size = req_batch[i];
        r->gpu_ms = req_gpu_ms[i];
        r->reranked = req_reranked[i];
    }
    GpuivfPublishCache();
    return false;
}
