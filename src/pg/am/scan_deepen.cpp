/*
 * am/scan_deepen.cpp — an index scan past round 1, when the executor wants
 * more rows: the prepared query and the round-1 lists in probe order, the
 * revisit of those lists and further rounds over the remaining ones (each
 * as many lists as all rounds before it, within gpuivf.max_probes), handed
 * out in re-ranked chunks that skip what round 1 returned.  The rounds:
 * scan.cpp's file comment.
 */
#include "gpuivf.h"
#include "am/am.h"
#include "am/scan.h"
#include "calibration/calibration.h"
#include "search/search.h"
#include "storage/storage.h"

#include <algorithm>
#include <cmath>

#include "access/relscan.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/bufmgr.h"
#include "utils/array.h"
#include "utils/memutils.h"
#include "utils/rel.h"

/* ------------------------------------------------------- list reading */

/*
 * ADC-scores every entry of one list into the collected candidates (the
 * deeper rounds; round 1 is GpuivfSearchBatch's).
 */
static void
GpuivfScanList(Relation index, GpuivfScanOpaque so, const gpuivf::IvfPqModel &model, int list)
{
    GpuivfListDirEntry dir = GpuivfReadDirEntry(index, &so->meta, list);
    BlockNumber blkno = dir.head;
    float       bias;

    if (!BlockNumberIsValid(blkno))
        return;
    gpuivf::ivfpq_build_lut(model, so->query_prepared, list, so->lut, &bias);

    while (BlockNumberIsValid(blkno))
    {
        BlockNumber next;
        int         n = GpuivfReadListPage(index, blkno, so->meta.code_size, so->page_capacity,
                                               so->page_ids, so->page_codes, &next);

        if (n > 0)
        {
            GpuivfReserveCandidates(so, n);
            gpuivf::ivfpq_adc_scores(model, so->lut, bias, so->page_codes, n,
                                     so->cand_scores + so->ncand);
            memcpy(so->cand_ids + so->ncand, so->page_ids, sizeof(uint64) * n);
            so->ncand += n;
        }
        blkno = next;
        CHECK_FOR_INTERRUPTS();
    }
}

/* Is this heap id among those round 1 returned? */
static bool
GpuivfInRoundOne(GpuivfScanOpaque so, uint64 heapid)
{
    return GpuivfSortedIdsContain(so->round1_ids, so->nround1, heapid);
}

/* Drops results[from..] that round 1 returned already, keeping the order. */
static void
GpuivfDropRoundOneRows(GpuivfScanOpaque so, int64 from)
{
    int64       out = from;

    if (so->nround1 == 0)
        return;
    for (int64 i = from; i < so->nresults; i++)
        if (!GpuivfInRoundOne(so, so->results[i].heapid))
            so->results[out++] = so->results[i];
    so->nresults = out;
}

/*
 * Before the first chunk past round 1: the prepared query, the buffers and
 * the round-1 lists in probe order (computed again: the probe order is
 * deterministic), marked visited.
 */
static void
GpuivfPrepareDeepen(Relation index, GpuivfScanOpaque so)
{
    GpuivfIndexState *state = GpuivfGetIndexState(index);
    const gpuivf::IvfPqModel &model = state->model;
    int         nprobe = Min(Max(so->q.nprobe, 1), so->nlist);
    float      *probe_scores;

    so->rerank_k = Max(Max(so->q.rerank, so->q.k), Max(so->depth, 1));
    so->query_prepared = (float4 *) palloc(sizeof(float4) * so->meta.dims);
    gpuivf::prepare_vector(so->metric, so->query, so->query_prepared, so->meta.dims);
    so->visited = (bool *) palloc0(sizeof(bool) * so->nlist);
    so->lists_visited = 0;

    so->page_capacity = GPUIVF_LIST_PAGE_CAPACITY(so->meta.code_size);
    so->page_codes = (uint8 *) palloc(so->meta.code_size * (Size) so->page_capacity + 1);
    so->page_ids = (uint64 *) palloc(sizeof(uint64) * so->page_capacity);
    so->chunk_ids = (uint64 *) palloc(sizeof(uint64) * so->rerank_k);
    so->chunk_scores = (float *) palloc(sizeof(float) * so->rerank_k);
    so->lut = (float *) palloc(sizeof(float) * gpuivf::ivfpq_lut_size(model));

    so->list_order = (int32 *) palloc(sizeof(int32) * nprobe);
    probe_scores = (float *) palloc(sizeof(float) * nprobe);
    gpuivf::ivfpq_probe_lists(model, so->query_prepared, nprobe, so->list_order, probe_scores);
    pfree(probe_scores);
    so->list_order_len = nprobe;
    for (int i = 0; i < nprobe; i++)
    {
        int         list = so->list_order[i];

        if (list >= 0 && list < so->nlist && !so->visited[list])
        {
            so->visited[list] = true;
            so->lists_visited++;
        }
    }
}

/* May the scan visit another list (gpuivf.max_probes, 0 = no bound)?  The
 * bound never cuts round 1's own lists. */
static bool
GpuivfMayVisitMore(GpuivfScanOpaque so)
{
    if (so->lists_visited >= so->nlist)
        return false;
    if (gpuivf_max_probes > 0 && so->lists_visited >= Max(gpuivf_max_probes, so->q.nprobe))
        return false;
    return true;
}

/*
 * Collects every entry of the next round of lists in ADC order: the round-1
 * lists again (revisit), then each later round as many unvisited lists as
 * were visited so far.  Returns false when every list was visited.
 */
static bool
GpuivfCollectRound(Relation index, GpuivfScanOpaque so)
{
    GpuivfIndexState *state = GpuivfGetIndexState(index);
    const gpuivf::IvfPqModel &model = state->model;

    so->ncand = 0;
    so->cand_pos = 0;
    GpuivfSortDone(so);

    if (so->phase == GPUIVF_PHASE_START)
    {
        /* revisit the lists of round 1, all their entries this time */
        so->phase = GPUIVF_PHASE_REVISIT;
        for (int i = 0; i < so->list_order_len; i++)
        {
            int         list = so->list_order[i];

            if (list >= 0 && list < so->nlist)
                GpuivfScanList(index, so, model, list);
        }
    }
    else
    {
        int         batch;
        int         taken = 0;

        if (!GpuivfMayVisitMore(so))
            return false;
        if (so->phase != GPUIVF_PHASE_MORE)
        {
            /* the full probe order, once */
            float      *scores = (float *) palloc(sizeof(float) * so->nlist);

            so->phase = GPUIVF_PHASE_MORE;
            pfree(so->list_order);
            so->list_order = (int32 *) palloc(sizeof(int32) * so->nlist);
            gpuivf::ivfpq_probe_lists(model, so->query_prepared, so->nlist, so->list_order,
                                      scores);
            pfree(scores);
            so->list_order_len = so->nlist;
            so->list_order_pos = 0;
        }
        batch = Max(so->lists_visited, 1);
        if (gpuivf_max_probes > 0)
            batch = Min(batch, Max(gpuivf_max_probes, so->q.nprobe) - so->lists_visited);
        while (taken < batch && so->list_order_pos < so->list_order_len)
        {
            int         list = so->list_order[so->list_order_pos++];

            if (list < 0 || list >= so->nlist || so->visited[list])
                continue;
            so->visited[list] = true;
            so->lists_visited++;
            taken++;
            GpuivfScanList(index, so, model, list);
        }
        /* lists the probe order missed (it should cover all): visit them too */
        if (so->list_order_pos >= so->list_order_len && so->lists_visited < so->nlist)
        {
            for (int list = 0; list < so->nlist && GpuivfMayVisitMore(so); list++)
            {
                if (so->visited[list])
                    continue;
                so->visited[list] = true;
                so->lists_visited++;
                GpuivfScanList(index, so, model, list);
            }
        }
    }
    so->stats.lists_max = Max(so->stats.lists_max, (int64) so->lists_visited);
    gpuivf::sort_pairs(so->cand_scores, so->cand_ids, so->ncand);
    return true;
}

/*
 * Loads the next chunk of rows not returned yet: after an exact round 1 all
 * other rows sorted; else up to rerank_k collected candidates, moving on to
 * the next round of lists when they run out.  Returns false when the scan
 * has nothing more.
 */
bool
GpuivfLoadNextChunk(Relation index, GpuivfScanOpaque so)
{
    so->nresults = 0;
    so->results_pos = 0;

    if (so->phase == GPUIVF_PHASE_EXACT_REST)
    {
        so->stats.deepened++;
        so->phase = GPUIVF_PHASE_DONE;
        GpuivfScanExact(index, so);
        so->stats.reranked += so->nresults;
        GpuivfDropRoundOneRows(so, 0);
        return so->nresults > 0;
    }
    if (so->phase == GPUIVF_PHASE_START)
    {
        so->stats.deepened++;
        GpuivfPrepareDeepen(index, so);
    }

    while (so->phase != GPUIVF_PHASE_DONE)
    {
        int         n = 0;

        while (n < so->rerank_k && so->cand_pos < so->ncand)
        {
            uint64      id = so->cand_ids[so->cand_pos];

            if (!GpuivfIsDone(so, id))
            {
                so->chunk_ids[n] = id;
                so->chunk_scores[n] = so->cand_scores[so->cand_pos];
                n++;
            }
            so->cand_pos++;
        }
        if (n > 0)
        {
            GpuivfAddDone(so, so->chunk_ids, n);
            GpuivfRerank(index, so, so->chunk_ids, so->chunk_scores, n);
            if (so->rerank)
                so->stats.reranked += n;
            GpuivfDropRoundOneRows(so, 0);
            so->nsorted = so->nresults;     /* GpuivfRerank sorted them */
            if (so->nresults > 0)
                return true;
            continue;
        }
        if (!GpuivfCollectRound(index, so))
            so->phase = GPUIVF_PHASE_DONE;
    }
    return false;
}
