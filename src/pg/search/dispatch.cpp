/*
 * search/dispatch.cpp — GpuivfSearchBatch: the round-1 search of nq queries
 * of one index, on the GPU worker when gpuivf.device allows and one is up
 * (worker/backend/search.cpp), else on the CPU in this backend
 * (search/cpu.cpp).  A plain index scan calls it with nq = 1 for its first
 * round; the batched kNN join (planner/batch_node.cpp) with a whole chunk of
 * outer rows.  The answer of a query never depends on the batch it rode in.
 */
#include "gpuivf.h"
#include "search/search.h"
#include "storage/storage.h"
#include "worker/worker.h"

/* ------------------------------------------------------------ entry */

/*
 * gpuivf.device = gpu without a GPU worker is an error (the settings
 * section of the README); called before any work of a scan or a batch.
 */
void
GpuivfCheckDevice(void)
{
    if (gpuivf_device == GPUIVF_DEVICE_GPU && !GpuivfWorkerAvailable())
        ereport(ERROR,
                (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                 errmsg("gpuivf.device is set to \"gpu\" but no gpuivf GPU worker is running"),
                 errhint("Set gpuivf.device to \"auto\" or \"cpu\" to run gpuivf scans on the CPU.")));
}

/*
 * GpuivfWorkerSearch, and the re-rank of its ADC candidates here when the
 * index's GPU copies hold only codes (search.h).
 */
bool
GpuivfSearchOnWorker(Relation index, int nq, const GpuivfQuery *queries, GpuivfHit **hits,
                     int *nhits, GpuivfSearchStats *stats, const GpuivfMetaPageData *meta)
{
    bool        adc_candidates;
    uint64    **ids;
    int        *ncand;
    int64       reranked = 0;

    if (!GpuivfWorkerSearch(index, nq, queries, hits, nhits, stats, meta, &adc_candidates))
        return false;
    if (!adc_candidates)
        return true;
    ids = (uint64 **) palloc(sizeof(uint64 *) * nq);
    ncand = (int *) palloc(sizeof(int) * nq);
    for (int q = 0; q < nq; q++)
    {
        ncand[q] = nhits[q];
        ids[q] = (uint64 *) palloc(sizeof(uint64) * Max(nhits[q], 1));
        for (int j = 0; j < nhits[q]; j++)
            ids[q][j] = GpuivfTidToId(&hits[q][j].tid);
        pfree(hits[q]);
    }
    GpuivfRerankCandidates(index, meta, nq, queries, NULL, ids, ncand, CurrentMemoryContext, hits,
                           nhits, &reranked);
    if (stats != NULL)
        stats->reranked += reranked;
    for (int q = 0; q < nq; q++)
        pfree(ids[q]);
    pfree(ids);
    pfree(ncand);
    return true;
}

/*
 * The queries listed in which[0..n), answered together by the GPU worker
 * (on_gpu) or the CPU path, their hits put back in hits[] and nhits[] at
 * their places; *st: that engine call's statistics.  False when the worker
 * declined (then nothing was put back).
 */
static bool
SearchSubset(Relation index, bool on_gpu, const int *which, int n, const GpuivfQuery *queries,
             GpuivfHit **hits, int *nhits, GpuivfSearchStats *st, const GpuivfMetaPageData *meta)
{
    GpuivfQuery *sub = (GpuivfQuery *) palloc(sizeof(GpuivfQuery) * n);
    GpuivfHit **subhits = (GpuivfHit **) palloc0(sizeof(GpuivfHit *) * n);
    int        *subn = (int *) palloc0(sizeof(int) * n);
    bool        answered = true;

    for (int i = 0; i < n; i++)
        sub[i] = queries[which[i]];
    memset(st, 0, sizeof(*st));
    if (on_gpu)
        answered = GpuivfSearchOnWorker(index, n, sub, subhits, subn, st, meta);
    else
        GpuivfSearchBatchCpu(index, n, sub, subhits, subn, st, meta);
    if (answered)
    {
        for (int i = 0; i < n; i++)
        {
            hits[which[i]] = subhits[i];
            nhits[which[i]] = subn[i];
        }
    }
    pfree(sub);
    pfree(subhits);
    pfree(subn);
    return answered;
}

/*
 * Answers nq queries of one index (search.h): on the GPU worker when
 * gpuivf.device is not cpu and a worker is up, else on the CPU.  Every
 * query's vector must have the index's dims (the callers check it).
 *
 * Routing, query by query:
 *   CPU by design   a temporary or untrained index, exact mode (nprobe
 *                   covering every list of an index with stored vectors),
 *                   nothing to find: the CPU's exact scan or nothing, under
 *                   every setting (the GPU engine has no exact path over
 *                   pages, and cannot read a backend's local buffers); not
 *                   counted as CPU fallbacks;
 *   over a limit    k, candidates or nprobe above the GPU engine's 1024:
 *                   an ERROR naming the limit under gpu, the CPU under auto
 *                   (counted in gpuivf_stat.cpu_fallbacks);
 *   the GPU         everything else, all in one GpuivfWorkerSearch (each
 *                   query keeps its own k, nprobe and rerank there); when
 *                   that declines (no ready worker, a worker failure) the
 *                   CPU answers under auto (counted there), gpu raises.
 * A query's answer never depends on the batch it rode in: both engines
 * compute it alone (a batched join equals its nested loop only so).
 */
void
GpuivfSearchBatch(Relation index, int nq, const GpuivfQuery *queries,
                  GpuivfHit **hits, int *nhits, GpuivfSearchStats *stats,
                  const GpuivfMetaPageData *given_meta)
{
    GpuivfMetaPageData meta;
    bool        temp;
    int        *gpu_which;
    int        *cpu_which;
    int         ngpu = 0;
    int         ncpu = 0;
    int64       over_limit = 0;

    memset(stats, 0, sizeof(GpuivfSearchStats));
    if (nq <= 0)
        return;
    GpuivfCheckDevice();
    if (gpuivf_device == GPUIVF_DEVICE_CPU)
    {
        GpuivfSearchBatchCpu(index, nq, queries, hits, nhits, stats, given_meta);
        return;
    }

    GpuivfGivenOrReadMeta(index, given_meta, &meta);
    temp = !GpuivfWorkerCanRead(index);
    gpu_which = (int *) palloc(sizeof(int) * nq);
    cpu_which = (int *) palloc(sizeof(int) * nq);
    for (int i = 0; i < nq; i++)
    {
        const GpuivfQuery *q = &queries[i];

        if (temp || meta.dims == 0 || q->vector == NULL || q->k < 1 ||
            GpuivfQueryIsExact(&meta, q))
            cpu_which[ncpu++] = i;
        else if (GpuivfGpuLimitExceeded(q) != NULL)
        {
            if (gpuivf_device == GPUIVF_DEVICE_GPU)
                GpuivfRaiseGpuLimit(index, q);
            cpu_which[ncpu++] = i;
            over_limit++;
        }
        else
            gpu_which[ngpu++] = i;
    }
    GpuivfCountCpuFallbacks(-1, over_limit);

    if (ngpu > 0)
    {
        GpuivfSearchStats st;

        /* false: the CPU answers (auto; counted inside), gpu has raised */
        if (SearchSubset(index, true, gpu_which, ngpu, queries, hits, nhits, &st, &meta))
            *stats = st;
        else
        {
            for (int i = 0; i < ngpu; i++)
                cpu_which[ncpu++] = gpu_which[i];
        }
    }

    if (ncpu == nq)
        GpuivfSearchBatchCpu(index, nq, queries, hits, nhits, stats, &meta);
    else if (ncpu > 0)
    {
        GpuivfSearchStats st;

        SearchSubset(index, false, cpu_which, ncpu, queries, hits, nhits, &st, &meta);
        stats->reranked += st.reranked;
        stats->batch_size = Max(stats->batch_size, ncpu);
    }
    pfree(gpu_which);
    pfree(cpu_which);
}
