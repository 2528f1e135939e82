/*
 * search/results.h — private to search/: sorting the rows
 * (GpuivfResult, gpuivf.h) a CPU search or a re-rank produces, and the hits
 * handed back.
 */
#ifndef GPUIVF_SEARCH_RESULTS_H
#define GPUIVF_SEARCH_RESULTS_H

#include "gpuivf.h"

#include <algorithm>
#include <cmath>

/* (distance, heap id) ascending, NaN last (gpuivf.h) */
static inline bool
ResultLess(double da, uint64 ia, double db, uint64 ib)
{
    return GpuivfCompareDistanceId(da, ia, db, ib) < 0;
}

/* Sorts results by (distance, heap id), NaN last (std::sort: no allocation,
 * no exceptions with this comparator). */
static inline void
SortResults(GpuivfResult *r, int n)
{
    std::sort(r, r + n, GpuivfResultLess);
}

/* Copies the hits of results[0..n) (sorted) into a palloc'd array of the
 * caller's context, at most k. */
static inline GpuivfHit *
MakeHits(MemoryContext caller, const GpuivfResult *results, int n, int k, int *nhits)
{
    int         m = Min(n, k);
    GpuivfHit  *hits = (GpuivfHit *) MemoryContextAlloc(caller, sizeof(GpuivfHit) * Max(m, 1));

    for (int i = 0; i < m; i++)
    {
        GpuivfIdToTid(results[i].heapid, &hits[i].tid);
        hits[i].distance = results[i].distance;
    }
    *nhits = m;
    return hits;
}

#endif                          /* GPUIVF_SEARCH_RESULTS_H */
