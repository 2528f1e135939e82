/*
 * calibration/curve_search.cpp — the sweep's points measured through
 * GpuivfSearchBatch, by the engine that answers the queries: when the GPU
 * worker answers them (one batched search per point is cheap there; on the
 * CPU the single-pass sweep of curve.cpp costs one ADC pass per query
 * instead of one per point).  The same curves either way.
 */
#include "gpuivf.h"
#include "calibration/calibration.h"
#include "calibration/sweep.h"
#include "search/search.h"
#include "storage/storage.h"
#include "worker/worker.h"

/* Heap TIDs of n entry ids (vector TIDs when the index stores vectors);
 * UINT64_MAX for padding or a vector tuple freed meanwhile. */
void
SweepEntryHeapIds(Relation index, const GpuivfMetaPageData *meta, const uint64 *ids, int64 n,
                  uint64 *heap_ids)
{
    for (int64 i = 0; i < n; i++)
    {
        ItemPointerData tid;
        Buffer      buf;
        Page        page;
        OffsetNumber off;

        heap_ids[i] = ids[i];
        if (ids[i] == PG_UINT64_MAX || !GpuivfMetaStoresVectors(meta))
            continue;
        heap_ids[i] = PG_UINT64_MAX;
        GpuivfIdToTid(ids[i], &tid);
        buf = ReadBuffer(index, ItemPointerGetBlockNumber(&tid));
        LockBuffer(buf, BUFFER_LOCK_SHARE);
        page = BufferGetPage(buf);
        off = ItemPointerGetOffsetNumber(&tid);
        if (GpuivfPageIsType(page, GPUIVF_PAGE_VECTOR) && off <= PageGetMaxOffsetNumber(page) &&
            ItemIdIsNormal(PageGetItemId(page, off)))
            heap_ids[i] = GpuivfTidToId(&((GpuivfVectorTuple *)
                                          PageGetItem(page, PageGetItemId(page, off)))->heaptid);
        UnlockReleaseBuffer(buf);
    }
}

/*
 * The stage of SweepStage measured through GpuivfSearchBatch instead: per
 * point one batch of all queries per candidate count that some curve's
 * scan keeps (with re-rank: the distinct C of every depth and k that still
 * counts, SweepDepthsNeeded: once a depth covers, the deeper ones cost no batch
 * more; without re-rank: one), asking the largest k of the curves of that
 * count.  A scan of k
 * rows returns the first k of those rows (the exact top k of the same
 * candidates, or the k best by ADC).  A query that is a row of the index
 * asks one more row (and candidate), so that its own row can be dropped.
 */
bool
SweepSearchStage(SweepState *sw, const uint32 *points, int first, int last)
{
    int         dims = (int) sw->meta.dims;
    GpuivfQuery *queries = (GpuivfQuery *) palloc(sizeof(GpuivfQuery) * sw->nq);
    GpuivfHit **hits = (GpuivfHit **) palloc(sizeof(GpuivfHit *) * sw->nq);
    int        *nhits = (int *) palloc(sizeof(int) * sw->nq);
    int        *found = (int *) palloc(sizeof(int) * (Size) sw->nq * GPUIVF_CALIB_CURVES);

    for (int j = first; j <= last; j++)
    {
        bool        done[GPUIVF_CALIB_CURVES] = {false};
        int         nd = j > 0 ? SweepDepthsNeeded(sw, j - 1) : sw->nd;

        if (GpuivfGetIndexState(sw->index)->meta.train_id != sw->meta.train_id)
            return false;
        memset(found, 0, sizeof(int) * (Size) sw->nq * GPUIVF_CALIB_CURVES);
        for (int g = 0; g < nd * GPUIVF_CURVE_KS; g++)
        {
            GpuivfSearchStats stats;
            bool        group[GPUIVF_CALIB_CURVES] = {false};
            int         kask = 0;

            if (g % GPUIVF_CURVE_KS >= sw->nk || done[g])
                continue;
            /* the curves that keep as many candidates as curve g */
            for (int s = g; s < nd * GPUIVF_CURVE_KS; s++)
                if (s % GPUIVF_CURVE_KS < sw->nk && !done[s] &&
                    (!sw->rerank || sw->C[s] == sw->C[g]))
                {
                    group[s] = done[s] = true;
                    kask = Max(kask, sw->ks[s % GPUIVF_CURVE_KS]);
                }
            for (int q = 0; q < sw->nq; q++)
            {
                int         self = sw->self_ids[q] != PG_UINT64_MAX ? 1 : 0;

                queries[q].vector = sw->queries + (Size) q * dims;
                queries[q].k = Min(kask + self, gpuivf::kMaxK);
                queries[q].nprobe = (int) points[j];
                queries[q].rerank = sw->rerank ? Min(sw->C[g] + self, gpuivf::kMaxK) : 0;
            }
            /* NULL: the metapage as it is now, not as the calibration began */
            GpuivfSearchBatch(sw->index, sw->nq, queries, hits, nhits, &stats, NULL);
            for (int q = 0; q < sw->nq; q++)
            {
                int         taken = 0;

                for (int h = 0; h < nhits[q] && taken < kask; h++)
                {
                    uint64      id = GpuivfTidToId(&hits[q][h].tid);
                    int         rank;

                    if (id == sw->self_heap_ids[q])
                        continue;
                    rank = SweepTruthRankOf(sw, q, id);
                    for (int s = g; s < nd * GPUIVF_CURVE_KS && rank >= 0; s++)
                    {
                        int         k = sw->ks[s % GPUIVF_CURVE_KS];

                        if (group[s] && rank < k && taken < k)
                            found[q * GPUIVF_CALIB_CURVES + s]++;
                    }
                    taken++;
                }
                pfree(hits[q]);
            }
            CHECK_FOR_INTERRUPTS();
        }
        for (int q = 0; q < sw->nq; q++)
            SweepAddRecall(sw, q, j, found + q * GPUIVF_CALIB_CURVES);
    }
    pfree(queries);
    pfree(hits);
    pfree(nhits);
    pfree(found);
    return true;
}

/*
 * Measure through GpuivfSearchBatch when the GPU worker answers it (one
 * batched search per point is cheap there); on the CPU the single-pass
 * sweep costs one ADC pass per query instead of one per point.  Building
 * with -DGPUIVF_CALIBRATE_VIA_SEARCH forces the search path, to check that
 * both measure the same curve.
 */
bool
SweepViaSearch(Relation index, const GpuivfMetaPageData *meta)
{
#ifdef GPUIVF_CALIBRATE_VIA_SEARCH
    return true;
#else
    /* the points stay within the GPU engine's nprobe limit (SweepPoints):
     * none falls back */
    return gpuivf_device != GPUIVF_DEVICE_CPU && GpuivfWorkerAvailable() &&
        GpuivfWorkerCanRead(index);
#endif
}

/* The calibration's searches go to the GPU worker (calibration.h). */
bool
GpuivfCalibrationSearchesOnGpu(Relation index, const GpuivfMetaPageData *meta)
{
    return gpuivf_analyze_sample > 0 && SweepViaSearch(index, meta);
}
