/*
 * calibration/sweep.h — the sweep's state, shared by the two ways of
 * measuring its points: curve.cpp (the single ADC pass over each query's
 * probe order, on the CPU) and curve_search.cpp (a GpuivfSearchBatch of all
 * queries per point, on the GPU worker).
 */
#ifndef GPUIVF_CALIBRATION_SWEEP_H
#define GPUIVF_CALIBRATION_SWEEP_H

#include "gpuivf.h"

/* A true neighbour of a query: its id and its rank in the exact order. */
typedef struct TruthRank
{
    uint64      id;
    int         rank;
} TruthRank;

/* Everything the sweep keeps between stages. */
typedef struct SweepState
{
    Relation    index;
    GpuivfMetaPageData meta;    /* as calibration began */
    BlockNumber nblocks;        /* of the index as the sweep began */
    bool        rerank;
    int         nq;
    int         nk;             /* k measured */
    int         ks[GPUIVF_CURVE_KS];    /* their k, ascending */
    int         nd;             /* re-rank depths measured (1 without re-rank) */
    int         depths[GPUIVF_CALIB_DEPTHS];    /* ascending, the first the base */
    /* candidates a scan of ks[c] rows at depths[d] keeps: C[CURVE(d, c)] */
    int         C[GPUIVF_CALIB_CURVES];
    int         Cmax;           /* candidates kept per query */
    bool        ordered;        /* some k needs the candidates in ADC order */
    int         K;              /* true neighbours per query: ks[nk - 1] */
    const float4 *queries;      /* nq * dims, raw */
    const uint64 *self_ids;     /* each query's own entry, or UINT64_MAX */
    const uint64 *self_heap_ids;
    TruthRank  *ranks;          /* per query K (id, rank), sorted by id */
    int        *ntruth;         /* per query: true neighbours known */
    gpuivf::TopK *cands;        /* nq selections of Cmax */
    float      *query_prep;     /* dims */
    int32      *order;          /* probe order, lists */
    float      *order_scores;
    float      *lut;
    int         page_cap;
    uint8      *page_codes;
    uint64     *page_ids;
    float      *snap_vals;      /* Cmax, for a sorted copy */
    uint64     *snap_ids;
    int         npoints;
    double     *sum;            /* [GPUIVF_CALIB_CURVES][npoints]: sum of per-query recall */
    double     *sumsq;
} SweepState;

/* The slot of the curve of depth d and k index c (hits, sums, C). */
#define CURVE(d, c) ((d) * GPUIVF_CURVE_KS + (c))

/* curve.cpp */
int         SweepTruthRankOf(const SweepState *sw, int q, uint64 id);  /* rank among q's true neighbours, or -1 */
void        SweepAddRecall(SweepState *sw, int q, int j, const int *hits);
int         SweepDepthsNeeded(const SweepState *sw, int last);

/* curve_search.cpp */
bool        SweepViaSearch(Relation index, const GpuivfMetaPageData *meta);
void        SweepEntryHeapIds(Relation index, const GpuivfMetaPageData *meta, const uint64 *ids, int64 n,
                              uint64 *heap_ids);
bool        SweepSearchStage(SweepState *sw, const uint32 *points, int first, int last);

#endif                          /* GPUIVF_CALIBRATION_SWEEP_H */
