/*
 * search/round_one.cpp — the round-1 query of a scan (rows asked, lists
 * probed, candidates re-ranked) and round 1 computed ahead of time by the
 * batched kNN join and offered to the scan it was computed for.
 */
#include "gpuivf.h"
#include "search/search.h"

#include <cmath>

/* ------------------------------------------------------ round-1 query */

/* The round-1 query of a scan that needs `hint` rows (search.h). */
int
GpuivfMakeQuery(Relation index, const GpuivfMetaPageData *meta, int64 hint, double filter_sel,
                const float4 *vector, GpuivfQuery *query)
{
    int         candidates = Max(gpuivf_rerank_candidates, 1);
    int         k;
    GpuivfProbeChoice probes;

    k = hint > 0 ? (int) Min(hint, (int64) gpuivf::kMaxK) : Min(candidates, gpuivf::kMaxK);
    GpuivfChooseProbes(index, meta, k, filter_sel, true, &probes);

    query->vector = vector;
    query->k = k;
    query->nprobe = probes.nprobe;
    query->rerank = GpuivfMetaStoresVectors(meta) ? Min(Max(k, candidates), gpuivf::kMaxK) : 0;
    return probes.source;
}

/*
 * Rows round 1 should ask for when the executor needs `rows` rows that pass
 * a filter of selectivity sel: enough that, were the filter independent of
 * the distance, fewer than `rows` pass only rarely (mean + 3 standard
 * deviations, about).  Correlated filters are the deepening's job.
 */
int64
GpuivfRowsForFilter(double rows, double sel)
{
    if (rows <= 0)
        return 0;
    if (sel > 0 && sel < 1)
        rows = ceil((rows + 3 * sqrt(rows) + 3) / sel);
    return (int64) Min(rows, 1e12);
}

/* ------------------------------------------- precomputed round 1 offers */

/*
 * One offer at a time, in static storage: the batched
 * join offers the round 1 of the outer row it is about to return, and the
 * inner scan started for that row takes it.  The copy of the query vector
 * and the hits live in a context of their own, reset with every offer.
 */
static MemoryContext offer_ctx = NULL;
static bool offer_valid = false;
static Oid  offer_index = InvalidOid;
static uint64 offer_generation = 0;
static GpuivfQuery offer_query;
static int  offer_dims = 0;
static GpuivfHit *offer_hits = NULL;
static int  offer_nhits = 0;
static GpuivfSearchStats offer_stats;

/* Forgets the current offer. */
void
GpuivfClearOffer(void)
{
    offer_valid = false;
    if (offer_ctx != NULL)
        MemoryContextReset(offer_ctx);
    offer_hits = NULL;
    offer_query.vector = NULL;
}

/* Offers a precomputed round 1 to the next scan of indexoid (search.h). */
void
GpuivfOfferRoundOne(Oid indexoid, uint64 generation, const GpuivfQuery *query, int dims,
                    const GpuivfHit *hits, int nhits, const GpuivfSearchStats *stats)
{
    float4     *vector;
    GpuivfHit  *copy;

    if (offer_ctx == NULL)
        offer_ctx = AllocSetContextCreate(TopMemoryContext, "gpuivf round-1 offer",
                                          ALLOCSET_SMALL_SIZES);
    GpuivfClearOffer();
    vector = (float4 *) MemoryContextAlloc(offer_ctx, sizeof(float4) * Max(dims, 1));
    memcpy(vector, query->vector, sizeof(float4) * dims);
    copy = (GpuivfHit *) MemoryContextAlloc(offer_ctx, sizeof(GpuivfHit) * Max(nhits, 1));
    if (nhits > 0)
        memcpy(copy, hits, sizeof(GpuivfHit) * nhits);

    offer_index = indexoid;
    offer_generation = generation;
    offer_query = *query;
    offer_query.vector = vector;
    offer_dims = dims;
    offer_hits = copy;
    offer_nhits = nhits;
    offer_stats = *stats;
    offer_valid = true;
}

/*
 * Takes the offer when it answers exactly this query of this index at this
 * generation: hits are copied into the current context.  The offer is used
 * once.
 */
bool
GpuivfTakeRoundOne(Oid indexoid, uint64 generation, const GpuivfQuery *query, int dims,
                   GpuivfHit **hits, int *nhits, GpuivfSearchStats *stats)
{
    if (!offer_valid || offer_index != indexoid || offer_generation != generation ||
        offer_dims != dims || offer_query.k != query->k ||
        offer_query.nprobe != query->nprobe || offer_query.rerank != query->rerank ||
        memcmp(offer_query.vector, query->vector, sizeof(float4) * dims) != 0)
        return false;

    *hits = (GpuivfHit *) palloc(sizeof(GpuivfHit) * Max(offer_nhits, 1));
    if (offer_nhits > 0)
        memcpy(*hits, offer_hits, sizeof(GpuivfHit) * offer_nhits);
    *nhits = offer_nhits;
    *stats = offer_stats;
    GpuivfClearOffer();
    return true;
}
