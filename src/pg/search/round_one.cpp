/*
 * search/round_one.cpp — the round-1 query of a scan (rows asked, lists
 * probed, candidates re-ranked) and round 1 computed ahead of time by the
 * batched kNN join and offered to the scan it was computed for.
 */
#include "gpuivf.h"
#include "search/search.h"
#include "storage/storage.h"

#include <cmath>

/* ------------------------------------------------------ round-1 query */

/* The round-1 query of a scan that needs `hint` rows (search.h). */
void
GpuivfMakeQuery(Relation index, const GpuivfMetaPageData *meta, int64 hint, double filter_sel,
                const float4 *vector, GpuivfQuery *query, GpuivfProbeChoice *choice)
{
    GpuivfProbeChoice probes;
    int         k;

    /* the recall target is for the rows the query wants, the LIMIT: behind
     * a filter the hint is raised for it, and so are the probes (by
     * 1/sqrt(filter_sel) in GpuivfChooseProbes): read the curve of the
     * LIMIT, not of the raised hint; no LIMIT known: 0, the default curve */
    GpuivfChooseProbes(index, meta, hint > 0 ? GpuivfRowsWanted(hint, filter_sel) : 0, filter_sel,
                       true, &probes);
    k = hint > 0 ? (int) Min(hint, (int64) gpuivf::kMaxK) : Min(probes.depth, gpuivf::kMaxK);

    query->vector = vector;
    query->k = k;
    query->nprobe = probes.nprobe;
    /* a LIMIT: its count at the depth; none: k, the depth, a chunk at a time */
    query->rerank = !GpuivfMetaReranks(meta) ? 0 : hint > 0 ? GpuivfRerankCount(probes.depth, k) : k;
    if (choice != NULL)
        *choice = probes;
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

/*
 * The rows a query wants when round 1 asks `hint` rows behind a filter of
 * selectivity sel (search.h): GpuivfRowsForFilter's inverse, rows + 3
 * sqrt(rows) + 3 = hint * sel solved for rows (its ceil rounds back).
 */
int
GpuivfRowsWanted(int64 hint, double sel)
{
    double      y;
    double      r;

    if (!(sel > 0 && sel < 1))
        return (int) Min(hint, (int64) PG_INT32_MAX);
    y = (double) hint * sel - 3;
    if (y <= 1)
        return 1;
    r = (-3 + sqrt(9 + 4 * y)) / 2;
    return (int) Max(1.0, Min(floor(r * r + 0.5), (double) hint));
}

/* ------------------------------------------- precomputed round 1 offers */

/*
 * The offers of one outer row, one per index, in static storage: the
 * batched join offers the round 1 of the outer row it is about to return on
 * every index its inner side scans (one per partition of a partitioned
 * table), and each inner scan started for that row takes the offer of its
 * index.  The copies of the query vectors and the hits live in a context of
 * their own, reset when the offers are cleared.
 */
typedef struct RoundOneOffer
{
    bool        valid;
    Oid         index;
    uint64      version;        /* of the index's rows (GpuivfReadRows) */
    GpuivfQuery query;
    int         dims;
    GpuivfHit  *hits;
    int         nhits;
    GpuivfSearchStats stats;
} RoundOneOffer;

static MemoryContext offer_ctx = NULL;
static RoundOneOffer *offers = NULL;
static int  noffers = 0;
static int  offers_cap = 0;

/* Forgets every offer. */
void
GpuivfClearOffer(void)
{
    noffers = 0;
    if (offer_ctx != NULL && offers_cap > 0)
        MemoryContextReset(offer_ctx);
    offers = NULL;
    offers_cap = 0;
}

/* Offers a precomputed round 1 to the next scan of indexoid (search.h);
 * it replaces an offer on that index not taken yet. */
void
GpuivfOfferRoundOne(Oid indexoid, uint64 version, const GpuivfQuery *query, int dims,
                    const GpuivfHit *hits, int nhits, const GpuivfSearchStats *stats)
{
    RoundOneOffer *o = NULL;
    float4     *vector;
    GpuivfHit  *copy;

    if (offer_ctx == NULL)
        offer_ctx = AllocSetContextCreate(TopMemoryContext, "gpuivf round-1 offers",
                                          ALLOCSET_SMALL_SIZES);
    for (int i = 0; i < noffers && o == NULL; i++)
        if (offers[i].index == indexoid)
            o = &offers[i];
    if (o == NULL)
    {
        if (noffers == offers_cap)
        {
            int         cap = Max(offers_cap * 2, 4);
            RoundOneOffer *grown = (RoundOneOffer *)
                MemoryContextAllocZero(offer_ctx, sizeof(RoundOneOffer) * cap);

            if (noffers > 0)
                memcpy(grown, offers, sizeof(RoundOneOffer) * noffers);
            offers = grown;
            offers_cap = cap;
        }
        o = &offers[noffers++];
    }
    vector = (float4 *) MemoryContextAlloc(offer_ctx, sizeof(float4) * Max(dims, 1));
    memcpy(vector, query->vector, sizeof(float4) * dims);
    copy = (GpuivfHit *) MemoryContextAlloc(offer_ctx, sizeof(GpuivfHit) * Max(nhits, 1));
    if (nhits > 0)
        memcpy(copy, hits, sizeof(GpuivfHit) * nhits);

    o->index = indexoid;
    o->version = version;
    o->query = *query;
    o->query.vector = vector;
    o->dims = dims;
    o->hits = copy;
    o->nhits = nhits;
    o->stats = *stats;
    o->valid = true;
}

/*
 * Takes the offer on this index when it answers exactly this query and the
 * index's rows are still at the offer's version (read only then: meta is
 * the scan's metapage copy): hits are copied into the current context.  An
 * offer is used once.
 */
bool
GpuivfTakeRoundOne(Relation index, const GpuivfMetaPageData *meta, const GpuivfQuery *query,
                   int dims, GpuivfHit **hits, int *nhits, GpuivfSearchStats *stats)
{
    Oid         indexoid = RelationGetRelid(index);

    for (int i = 0; i < noffers; i++)
    {
        RoundOneOffer *o = &offers[i];
        GpuivfMetaPageData now;

        if (!o->valid || o->index != indexoid)
            continue;
        if (o->dims != dims || o->query.k != query->k ||
            o->query.nprobe != query->nprobe || o->query.rerank != query->rerank ||
            memcmp(o->query.vector, query->vector, sizeof(float4) * dims) != 0)
            return false;
        now = *meta;
        if (GpuivfReadRows(index, &now) != o->version)
            return false;
        *hits = (GpuivfHit *) palloc(sizeof(GpuivfHit) * Max(o->nhits, 1));
        if (o->nhits > 0)
            memcpy(*hits, o->hits, sizeof(GpuivfHit) * o->nhits);
        *nhits = o->nhits;
        *stats = o->stats;
        o->valid = false;
        return true;
    }
    return false;
}
