/*
 * calibration/curve.cpp — measuring the recall curves of an index: recall@k
 * of its own search against exact results, for several k (1, 10, 100) and
 * a sweep of nprobe values, on a set of queries with their exact top k
 * (calibration/calibration.cpp chooses the queries and stores the result).
 *
 * How: for each query the lists are visited in probe order, feeding one ADC
 * k-selection of Cmax = the most candidates a scan of any measured k keeps
 * (C_k = GpuivfRerankCount(k), the scan's count), the query's own
 * entry skipped when the query is a row of the index; at every measured
 * nprobe the best C_k of them are exactly those a scan's first round keeps
 * for a LIMIT of k with that nprobe, so the scan's recall follows without
 * re-running it: with re-rank the exact top k of those candidates contains
 * every true neighbour among them (they are the k nearest of all rows), so
 * recall@k = |best C_k ∩ truth_k| / k; without re-rank the scan returns the
 * k best ADC scores, compared with the truth directly.  One pass over the
 * probe order gives every point (nprobe 1, 2, ..., 16, then about 64 points
 * in all, geometric up to lists), in stages that double nprobe; the sweep
 * stops at the end of the first stage where every curve is done: at
 * recall 1, meeting the recall targets the curves must serve (max(0.995,
 * the index's recall target), as a scan judges a point: CurveDone), or on a
 * plateau (a doubling closed less than a tenth of the gap to recall 1); or
 * at lists (with re-rank nprobe = lists is the exact scan: 1).  So its cost
 * follows the nprobe the targets need, not the number of lists.  When the
 * GPU worker is up, each point is measured by GpuivfSearchBatch of all
 * queries instead (SweepSearchStage, one batch per distinct candidate count):
 * the same curves, computed by the engine that answers the queries, up to
 * the engine's nprobe limit (1024; beyond it a search runs on the CPU
 * anyway), then the exact point.  At the end of a parallel build the
 * build's processes share each stage's queries (GpuivfSweepPart,
 * am/build_truth.cpp); each query's hits are added up in query order
 * either way, so the curves are the same bits.
 *
 * Cost on the CPU, for n rows, q queries, L lists, PQ with m sub-quantizers
 * of 2^b centroids of d / m dimensions: at most one ADC pass over the whole
 * index per query, q * (n * m table look-ups + L * d * 2^b for the look-up
 * tables), less when it stops early; per point and query a sort of Cmax
 * candidates when some k keeps fewer of them, and Cmax binary searches in
 * the query's true neighbours.  Memory: q * Cmax candidates.  No lock is
 * held while computing: pages are read under a share lock one at a time.
 */
#include "gpuivf.h"
#include "calibration/calibration.h"
#include "calibration/sample.h"
#include "calibration/sweep.h"
#include "search/search.h"
#include "storage/storage.h"
#include "worker/worker.h"

#include <cmath>

#define GPUIVF_CALIB_DENSE      16      /* every nprobe up to this is a point */
#define GPUIVF_PLATEAU_FRACTION 0.10

/* ----------------------------------------------------------------- sweep */

/*
 * The nprobe values that may be measured: every one up to 16, then geometric
 * so that at most GPUIVF_CURVE_POINTS points reach `reach` (lists, or the
 * GPU engine's nprobe limit when the GPU measures the curve), ascending;
 * then lists itself when it is beyond (with re-rank the exact scan, recall
 * 1 by construction, never measured).  The sweep stops early (MeasureCurve).
 */
static int
SweepPoints(int lists, int reach, bool rerank, uint32 *points)
{
    int         n = 0;
    double      ratio = 1.0;
    int         p = 1;
    int         room = GPUIVF_CURVE_POINTS - (reach < lists && rerank ? 1 : 0);

    reach = Min(reach, lists);
    if (reach > GPUIVF_CALIB_DENSE)
        ratio = pow((double) reach / GPUIVF_CALIB_DENSE,
                    1.0 / (room - GPUIVF_CALIB_DENSE - 2));
    while (p < reach && n < room - 1)
    {
        points[n++] = (uint32) p;
        if (p < GPUIVF_CALIB_DENSE)
            p++;
        else
            p = Max(p + 1, (int) ceil(p * ratio));
    }
    points[n++] = (uint32) reach;
    if (reach < lists && rerank)
        points[n++] = (uint32) lists;
    return n;
}

static int
CompareTruthRank(const void *a, const void *b)
{
    uint64      x = ((const TruthRank *) a)->id;
    uint64      y = ((const TruthRank *) b)->id;

    return x < y ? -1 : x > y ? 1 : 0;
}

/* Index every query's true neighbours (truth: nq * K ids, UINT64_MAX
 * padded) by id. */
static void
RankTruth(SweepState *sw, const uint64 *truth)
{
    sw->ranks = (TruthRank *) palloc(sizeof(TruthRank) * (Size) sw->nq * sw->K);
    sw->ntruth = (int *) palloc(sizeof(int) * sw->nq);
    for (int q = 0; q < sw->nq; q++)
    {
        TruthRank  *r = sw->ranks + (Size) q * sw->K;
        int         n = 0;

        for (int t = 0; t < sw->K && truth[(Size) q * sw->K + t] != PG_UINT64_MAX; t++)
        {
            r[n].id = truth[(Size) q * sw->K + t];
            r[n].rank = t;
            n++;
        }
        qsort(r, n, sizeof(TruthRank), CompareTruthRank);
        sw->ntruth[q] = n;
    }
}

/* Rank of id among query q's true neighbours, or -1. */
int
SweepTruthRankOf(const SweepState *sw, int q, uint64 id)
{
    const TruthRank *r = sw->ranks + (Size) q * sw->K;
    int         lo = 0;
    int         hi = sw->ntruth[q] - 1;

    while (lo <= hi)
    {
        int         mid = (lo + hi) / 2;

        if (r[mid].id == id)
            return r[mid].rank;
        if (r[mid].id < id)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

/* Add query q's recall@ks[c] at depths[d] at point j: hits[CURVE(d, c)]
 * of its true neighbours of rank < ks[c] returned (every true neighbour
 * when it has fewer). */
void
SweepAddRecall(SweepState *sw, int q, int j, const int *hits)
{
    for (int d = 0; d < sw->nd; d++)
        for (int c = 0; c < sw->nk; c++)
        {
            int         want = Min(sw->ks[c], sw->ntruth[q]);
            double      r = want > 0 ? (double) hits[CURVE(d, c)] / want : 1.0;

            sw->sum[CURVE(d, c) * sw->npoints + j] += r;
            sw->sumsq[CURVE(d, c) * sw->npoints + j] += r * r;
        }
}

/* Read one list page: its entries' ids and codes, the own row left out. */
static int
SweepReadListPage(SweepState *sw, BlockNumber blkno, uint64 skip_id, BlockNumber *next)
{
    int         code_size = sw->meta.code_size;
    int         n = GpuivfReadListPage(sw->index, blkno, code_size, sw->page_cap, sw->page_ids,
                                       sw->page_codes, next);
    int         kept = 0;

    for (int i = 0; i < n; i++)
    {
        if (sw->page_ids[i] == skip_id)
            continue;
        if (kept != i)
        {
            sw->page_ids[kept] = sw->page_ids[i];
            memcpy(sw->page_codes + (Size) kept * code_size,
                   sw->page_codes + (Size) i * code_size, code_size);
        }
        kept++;
    }
    return kept;
}

/* ADC-score every entry of one list into the query's candidates. */
static void
SweepScanList(SweepState *sw, const gpuivf::IvfPqModel &model, int list, uint64 skip_id,
              gpuivf::TopK *cands)
{
    GpuivfListDirEntry dir = GpuivfReadDirEntry(sw->index, &sw->meta, list);
    BlockNumber blkno = dir.head;
    BlockNumber visited = 0;
    float       bias;

    if (!BlockNumberIsValid(blkno))
        return;
    gpuivf::ivfpq_build_lut(model, sw->query_prep, list, sw->lut, &bias);
    /* a chain longer than the index has pages is a cycle: stop (verify says why) */
    while (BlockNumberIsValid(blkno) && visited++ < sw->nblocks)
    {
        BlockNumber next;
        int         n = SweepReadListPage(sw, blkno, skip_id, &next);

        if (n > 0)
            gpuivf::ivfpq_adc_scan(model, sw->lut, bias, sw->page_codes, sw->page_ids, n, cands);
        blkno = next;
    }
}

/*
 * Query q's hits at a point for every depth and k (into hits[CURVE(d, c)]),
 * from its current candidates c (the best Cmax by ADC).  With re-rank a
 * scan of k rows returns the exact top k of its best C_k candidates, which
 * holds every true neighbour among them (they are the nearest of all rows):
 * hits = true neighbours of rank < k among the best C_k, so a deeper depth
 * costs no exact distance here, only a count.  Without re-rank it returns
 * the k best by ADC.
 */
static void
SweepHits(SweepState *sw, int q, const gpuivf::TopK *c, int *hits)
{
    const uint64 *ids = c->ids;

    for (int s = 0; s < GPUIVF_CALIB_CURVES; s++)
        hits[s] = 0;
    if (sw->ordered)
    {
        memcpy(sw->snap_vals, c->vals, sizeof(float) * c->size);
        memcpy(sw->snap_ids, c->ids, sizeof(uint64) * c->size);
        gpuivf::sort_pairs(sw->snap_vals, sw->snap_ids, c->size);
        ids = sw->snap_ids;
    }
    for (int i = 0; i < c->size; i++)
    {
        int         rank = SweepTruthRankOf(sw, q, ids[i]);

        if (rank < 0)
            continue;
        for (int d = 0; d < sw->nd; d++)
            for (int k = 0; k < sw->nk; k++)
            {
                int         returned = sw->rerank ? sw->C[CURVE(d, k)] : sw->ks[k];

                if (rank < sw->ks[k] && i < returned)
                    hits[CURVE(d, k)]++;
            }
    }
}

/*
 * Continue query q's probe order from position `from` up to points[last],
 * its candidates in *cands, its hits at the points first..last into
 * hits[(j - first) * GPUIVF_CALIB_CURVES + CURVE(d, c)].  Returns false when the index
 * was rebuilt meanwhile (its model is gone).
 */
static bool
SweepQueryStage(SweepState *sw, int q, gpuivf::TopK *cands, const uint32 *points, int first,
                int last, int from, int *hits)
{
    GpuivfIndexState *state = GpuivfGetIndexState(sw->index);
    const gpuivf::IvfPqModel &model = state->model;
    int         to = (int) points[last];
    int         dims = (int) sw->meta.dims;
    int         next_point = first;
    uint64      self = sw->self_ids[q];

    if (state->meta.train_id != sw->meta.train_id)
        return false;
    if (sw->lut == NULL)
        sw->lut = (float *) palloc(sizeof(float) * gpuivf::ivfpq_lut_size(model));
    gpuivf::prepare_vector((gpuivf::Metric) sw->meta.metric, sw->queries + (Size) q * dims,
                           sw->query_prep, dims);
    gpuivf::ivfpq_probe_lists(model, sw->query_prep, to, sw->order, sw->order_scores);
    for (int pos = from; pos < to; pos++)
    {
        int         list = sw->order[pos];

        if (list >= 0 && list < (int) sw->meta.lists)
            SweepScanList(sw, model, list, self, cands);
        while (next_point <= last && (int) points[next_point] == pos + 1)
        {
            SweepHits(sw, q, cands, hits + (Size) (next_point - first) * GPUIVF_CALIB_CURVES);
            next_point++;
        }
        vacuum_delay_point();
        CHECK_FOR_INTERRUPTS();
    }
    return true;
}

/*
 * Continue every query's probe order from position `from` up to
 * points[last], recording the points first..last: here, or by the
 * processes of a parallel build (helpers), each query's hits added in query
 * order either way, so the sums are the same bits.  Returns false when the
 * index was rebuilt meanwhile (its model is gone).
 */
static bool
SweepStage(SweepState *sw, const uint32 *points, int first, int last, int from,
           GpuivfTruthHelpers *helpers)
{
    int        *hits;
    Size        stride = (Size) (last - first + 1) * GPUIVF_CALIB_CURVES;

    if (helpers != NULL && helpers->sweep != NULL &&
        helpers->sweep(helpers, sw->Cmax, points, first, last, from, &hits))
    {
        if (hits == NULL)
            return false;
    }
    else
    {
        hits = (int *) palloc(sizeof(int) * stride * sw->nq);
        for (int q = 0; q < sw->nq; q++)
            if (!SweepQueryStage(sw, q, &sw->cands[q], points, first, last, from,
                                 hits + (Size) q * stride))
                return false;
    }
    for (int q = 0; q < sw->nq; q++)
        for (int j = first; j <= last; j++)
            SweepAddRecall(sw, q, j, hits + (Size) q * stride + (Size) (j - first) * GPUIVF_CALIB_CURVES);
    return true;
}

/* Mean recall of curve c (CURVE(d, k)) measured at point j. */
static double
SweepMean(const SweepState *sw, int c, int j)
{
    return sw->sum[c * sw->npoints + j] / sw->nq;
}

/* Standard error of curve c's mean recall at point j, over the queries. */
static double
SweepStdErr(const SweepState *sw, int c, int j)
{
    double      mean = SweepMean(sw, c, j);
    double      sq = sw->sumsq[c * sw->npoints + j];
    double      var = sw->nq > 1 ? Max(0.0, (sq - sw->nq * mean * mean) / (sw->nq - 1)) : 0.0;

    return sqrt(var / sw->nq);
}

/*
 * The recall targets the curves must serve: the index's recall target as
 * the calibration runs (its target_recall option, else
 * gpuivf.target_recall), and at least GPUIVF_CALIB_COVER.  Once a curve's
 * point meets them (as a scan judges a point: GpuivfCurvePointMeets), the
 * points beyond serve only higher targets, and cost the most to measure: a
 * sweep of a 10M-row index (3,162 lists) went on to nprobe 2,215 for 43 s on
 * the CPU where recall 0.995 needed a few hundred.  A scan whose target is
 * above the curve uses its best point and says so (GpuivfChooseProbes).
 */
#define GPUIVF_CALIB_COVER      0.995

/*
 * Is curve c done at point last (prev: the previous stage's last point, or
 * -1): at recall 1, covering the targets, or on a plateau (doubling nprobe
 * from prev closed less than a tenth of the remaining gap to recall 1: the
 * candidates, not the lists, limit recall)?
 */
static bool
CurveDone(const SweepState *sw, int c, int prev, int last)
{
    double      now = SweepMean(sw, c, last);
    double      target = Max(GPUIVF_CALIB_COVER, GpuivfTargetRecall(sw->index, NULL));

    if (now >= 1.0)
        return true;
    if (GpuivfCurvePointMeets(now, SweepStdErr(sw, c, last), target))
        return true;
    if (prev >= 0)
    {
        double      before = SweepMean(sw, c, prev);

        return now - before <= GPUIVF_PLATEAU_FRACTION * (1.0 - before);
    }
    return false;
}

/* Is every curve that counts at point j (SweepDepthsNeeded) at recall 1? */
static bool
AllPerfect(const SweepState *sw, int j)
{
    for (int d = 0; d < SweepDepthsNeeded(sw, j); d++)
        for (int c = 0; c < sw->nk; c++)
            if (SweepMean(sw, CURVE(d, c), j) < 1.0)
                return false;
    return true;
}

/*
 * Does depth d need no deeper one, at points 0 .. last: does its recall@10
 * (the calibration's k) reach GPUIVF_CALIB_DEPTH_ENOUGH and meet the
 * index's recall target, at some point, as a scan judges a point?  Then
 * deeper depths could only save a few probes (at 1M x 128 rows, 32
 * sub-quantizers, 200 candidates reach 0.995), and measuring them would
 * prolong the sweep where the depth flattens near 1; below it (1M x 768 with
 * pq_m 96 flattened at 0.962, 5M x 768 at 0.911 whatever the target) they
 * are what lifts the cap.
 */
#define GPUIVF_CALIB_DEPTH_ENOUGH 0.99

static bool
DepthCovers(const SweepState *sw, int d, int last)
{
    double      target = GpuivfTargetRecall(sw->index, NULL);
    int         c = sw->nk - 1;

    for (int i = 0; i < sw->nk; i++)
        if (sw->ks[i] == GPUIVF_CALIBRATION_K)
            c = i;
    for (int j = 0; j <= last; j++)
        if (SweepMean(sw, CURVE(d, c), j) >= GPUIVF_CALIB_DEPTH_ENOUGH &&
            GpuivfCurvePointMeets(SweepMean(sw, CURVE(d, c), j),
                                  SweepStdErr(sw, CURVE(d, c), j), target))
            return true;
    return false;
}

/*
 * The depths that count at points 0 .. last: the base, then each deeper
 * one while the one before it does not cover (DepthCovers).  A deeper
 * depth keeps a superset of the candidates, so its curve is never below
 * the shallower's; once a depth covers, the deeper ones are neither waited
 * for nor stored.
 */
int
SweepDepthsNeeded(const SweepState *sw, int last)
{
    int         n = 1;

    while (n < sw->nd && !DepthCovers(sw, n - 1, last))
        n++;
    return n;
}

/*
 * Is every curve that counts done at point last (CurveDone)?  When the
 * base depth covers (DepthCovers) the deeper curves are not waited for:
 * the sweep ends where it did before depths were measured.  Only when the
 * base depth's curve flattens below it does the sweep go on, for the
 * deeper ones.
 */
static bool
SweepDone(const SweepState *sw, int prev, int last)
{
    int         nd = SweepDepthsNeeded(sw, last);

    for (int d = 0; d < nd; d++)
        for (int c = 0; c < sw->nk; c++)
            if (!CurveDone(sw, CURVE(d, c), prev, last))
                return false;
    return true;
}

/*
 * The re-rank depths a calibration of an index of meta's shape measures
 * (into depths, ascending; returns how many): the base, gpuivf.rerank_
 * candidates when set, else GPUIVF_DEFAULT_RERANK_DEPTH, then twice and
 * four times it up to the engines' kMaxK, without repeats.  At high
 * dimensions with few PQ sub-quantizers the PQ order of the candidates is
 * poor: the true neighbours lie deeper in it than the base depth re-ranks,
 * and no nprobe lifts recall past that cap (1M x 768 with pq_m 96: 0.962 at
 * 200 candidates).  Without re-rank one depth (it keeps k candidates).
 * Parallel workers read the leader's setting, so they measure the same.
 */
static int
CalibDepths(const GpuivfMetaPageData *meta, int *depths)
{
    int         base = gpuivf_rerank_candidates > 0 ? gpuivf_rerank_candidates
        : GPUIVF_DEFAULT_RERANK_DEPTH;
    int         n = 0;

    depths[n++] = Min(base, gpuivf::kMaxK);
    if ((meta->flags & GPUIVF_META_RERANK) == 0)
        return n;
    for (int i = 1; i < GPUIVF_CALIB_DEPTHS; i++)
    {
        int         d = (int) Min((int64) base << i, (int64) gpuivf::kMaxK);

        if (d > depths[n - 1])
            depths[n++] = d;
    }
    return n;
}

/* Everything but the truth, the candidates and the sums, for nq queries
 * (raw, with their own entries) and the k of ks[0 .. nk). */
static void
SweepInit(SweepState *sw, Relation index, const GpuivfMetaPageData *meta, int nq,
          const float4 *queries, const uint64 *self_ids, const uint64 *self_heap_ids,
          const int *ks, int nk, int npoints)
{
    int         lists = (int) meta->lists;

    Assert(nk >= 1 && nk <= GPUIVF_CURVE_KS);
    memset(sw, 0, sizeof(*sw));
    sw->index = index;
    sw->meta = *meta;
    sw->nblocks = RelationGetNumberOfBlocks(index);
    sw->rerank = (meta->flags & GPUIVF_META_RERANK) != 0;
    sw->nq = nq;
    sw->nk = nk;
    sw->npoints = npoints;
    sw->nd = CalibDepths(meta, sw->depths);
    for (int c = 0; c < nk; c++)
        sw->ks[c] = ks[c];
    sw->ordered = !sw->rerank;
    for (int d = 0; d < sw->nd; d++)
        for (int c = 0; c < nk; c++)
        {
            /* what a scan of k rows keeps at that depth (search/round_one.cpp) */
            sw->C[CURVE(d, c)] = GpuivfRerankCount(sw->depths[d], ks[c]);
            sw->Cmax = Max(sw->Cmax, sw->rerank ? sw->C[CURVE(d, c)] : ks[c]);
        }
    for (int d = 0; d < sw->nd; d++)
        for (int c = 0; c < nk; c++)
            if (sw->C[CURVE(d, c)] < sw->Cmax)
                sw->ordered = true;
    sw->K = ks[nk - 1];
    sw->queries = queries;
    sw->self_ids = self_ids;
    sw->self_heap_ids = self_heap_ids;
    sw->query_prep = (float *) palloc(sizeof(float) * meta->dims);
    sw->order = (int32 *) palloc(sizeof(int32) * lists);
    sw->order_scores = (float *) palloc(sizeof(float) * lists);
    sw->page_cap = GPUIVF_LIST_PAGE_CAPACITY(meta->code_size);
    sw->page_codes = (uint8 *) palloc((Size) sw->page_cap * meta->code_size);
    sw->page_ids = (uint64 *) palloc(sizeof(uint64) * sw->page_cap);
    sw->snap_vals = (float *) palloc(sizeof(float) * sw->Cmax);
    sw->snap_ids = (uint64 *) palloc(sizeof(uint64) * sw->Cmax);
}

/* Candidates per query a sweep of any k up to K keeps (calibration.h). */
int
GpuivfSweepCandidates(const GpuivfMetaPageData *meta, int K)
{
    int         cmax = K;
    int         depths[GPUIVF_CALIB_DEPTHS];
    int         nd = CalibDepths(meta, depths);

    if ((meta->flags & GPUIVF_META_RERANK) != 0)
        for (int d = 0; d < nd; d++)
            for (int k = 1; k <= K; k++)
                cmax = Max(cmax, GpuivfRerankCount(depths[d], k));
    return cmax;
}

/*
 * One process's part of a sweep stage (calibration.h): the queries claim()
 * hands it, each continued from its candidates (cand_vals/cand_ids: cmax
 * per query, cand_sizes: how many) and its hits at points first..last
 * written at hits[q * (last - first + 1) * GPUIVF_CALIB_CURVES ...].  False when
 * the index was rebuilt meanwhile.
 */
bool
GpuivfSweepPart(Relation index, const GpuivfMetaPageData *meta, int nq, const float4 *queries,
                const uint64 *self_ids, const uint64 *truth, const int *ks, int nk,
                const uint32 *points, int first, int last, int from, int cmax, float *cand_vals,
                uint64 *cand_ids, int32 *cand_sizes, int *hits,
                int64 (*claim) (void *claim_arg), void *claim_arg)
{
    SweepState  sw;
    Size        stride = (Size) (last - first + 1) * GPUIVF_CALIB_CURVES;
    int64       q;
    bool        ok = true;

    SweepInit(&sw, index, meta, nq, queries, self_ids, NULL, ks, nk, GPUIVF_CURVE_POINTS);
    Assert(sw.Cmax <= cmax);
    RankTruth(&sw, truth);
    while ((q = claim(claim_arg)) >= 0)
    {
        gpuivf::TopK cands;

        gpuivf::topk_init(&cands, cand_vals + (Size) q * cmax, cand_ids + (Size) q * cmax,
                          sw.Cmax);
        cands.size = cand_sizes[q];
        if (ok)
            ok = SweepQueryStage(&sw, (int) q, &cands, points, first, last, from,
                                 hits + (Size) q * stride);
        cand_sizes[q] = cands.size;
    }
    return ok;
}

/* Measure the curves (calibration.h's private part, sample.h). */
bool
MeasureCurves(Relation index, const GpuivfMetaPageData *meta, const CalibSample *sample,
              const uint64 *truth, const int *ks, int nk, GpuivfTruthHelpers *helpers,
              GpuivfMetaPageData *calib)
{
    SweepState  sw;
    uint32      points[GPUIVF_CURVE_POINTS];
    int         lists = (int) meta->lists;
    bool        via_search = SweepViaSearch(index, meta);
    bool        rerank = (meta->flags & GPUIVF_META_RERANK) != 0;
    /* the GPU measures what it can answer: up to its nprobe limit */
    int         npoints = SweepPoints(lists, via_search ? GPUIVF_GPU_MAX_NPROBE : lists, rerank,
                                      points);
    int         measured = 0;   /* points[0 .. measured) are done */
    int         stage_end_prev = -1;
    float      *cand_vals;
    uint64     *cand_ids;

    SweepInit(&sw, index, meta, sample->nq, sample->queries, sample->self_ids,
              sample->self_heap_ids, ks, nk, npoints);
    if (via_search)
    {
        /* the search answers heap TIDs: rank the truth by those */
        uint64     *truth_heap = (uint64 *) palloc(sizeof(uint64) * (Size) sw.nq * sw.K);

        SweepEntryHeapIds(index, meta, truth, (int64) sw.nq * sw.K, truth_heap);
        RankTruth(&sw, truth_heap);
        helpers = NULL;
    }
    else
        RankTruth(&sw, truth);
    sw.cands = (gpuivf::TopK *) palloc(sizeof(gpuivf::TopK) * sw.nq);
    cand_vals = (float *) palloc_extended(sizeof(float) * (Size) sw.nq * sw.Cmax, MCXT_ALLOC_HUGE);
    cand_ids = (uint64 *) palloc_extended(sizeof(uint64) * (Size) sw.nq * sw.Cmax, MCXT_ALLOC_HUGE);
    for (int q = 0; q < sw.nq; q++)
        gpuivf::topk_init(&sw.cands[q], cand_vals + (Size) q * sw.Cmax,
                          cand_ids + (Size) q * sw.Cmax, sw.Cmax);
    sw.sum = (double *) palloc0(sizeof(double) * npoints * GPUIVF_CALIB_CURVES);
    sw.sumsq = (double *) palloc0(sizeof(double) * npoints * GPUIVF_CALIB_CURVES);

    /*
     * With re-rank, nprobe = lists is the exact scan (recall 1 by
     * construction), so the ADC sweep stops before it.
     */
    while (measured < npoints)
    {
        int         limit = stage_end_prev < 0 ? GPUIVF_CALIB_DENSE : 2 * (int) points[stage_end_prev];
        int         last = measured;
        int         from = measured == 0 ? 0 : (int) points[measured - 1];
        bool        exact_point = sw.rerank && (int) points[measured] == lists;

        if (exact_point)
        {
            for (int c = 0; c < GPUIVF_CALIB_CURVES; c++)
            {
                sw.sum[c * npoints + measured] = sw.nq;
                sw.sumsq[c * npoints + measured] = sw.nq;
            }
            measured++;
            break;
        }
        while (last + 1 < npoints && (int) points[last + 1] <= limit &&
               !(sw.rerank && (int) points[last + 1] == lists))
            last++;
        if (via_search ? !SweepSearchStage(&sw, points, measured, last)
            : !SweepStage(&sw, points, measured, last, from, helpers))
            return false;
        measured = last + 1;

        /* stop when every curve is at recall 1, covers the targets or is on
         * a plateau (CurveDone) */
        if (SweepDone(&sw, stage_end_prev, last))
            break;
        stage_end_prev = last;
    }

    /* points after the first where every curve is perfect add nothing */
    for (int j = 0; j < measured; j++)
        if (AllPerfect(&sw, j))
        {
            measured = j + 1;
            break;
        }
    calib->calib_npoints = (uint16) measured;
    for (int c = 0; c < GPUIVF_CURVE_KS; c++)
        calib->calib_k[c] = c < nk ? (uint16) ks[c] : 0;
    calib->calib_depth = (uint32) sw.depths[0];
    calib->calib_deep_count = (uint32) SweepDepthsNeeded(&sw, measured - 1) - 1;
    for (int d = 1; d <= (int) calib->calib_deep_count; d++)
        calib->calib_deep_depth[d - 1] = (uint32) sw.depths[d];
    for (int j = 0; j < measured; j++)
    {
        calib->calib_nprobe[j] = points[j];
        for (int d = 0; d <= (int) calib->calib_deep_count; d++)
            for (int c = 0; c < nk; c++)
            {
                GpuivfRecallPoint *p = d == 0 ? &calib->calib_recall[c][j]
                    : &calib->calib_deep_recall[d - 1][c][j];

                p->recall = (float4) SweepMean(&sw, CURVE(d, c), j);
                p->recall_se = (float4) SweepStdErr(&sw, CURVE(d, c), j);
            }
    }
    calib->calib_rerank = sw.rerank ? (uint32) sw.Cmax : 0;
    return true;
}
