/*
 * worker/backend/backend.h — private to the backend's side of the GPU worker
 * protocol (worker/backend/): what every request shares (requests.cpp).
 */
#ifndef GPUIVF_WORKER_BACKEND_H
#define GPUIVF_WORKER_BACKEND_H

#include "gpuivf.h"
#include "worker/protocol.h"

/* ERROR: gpuivf.device = gpu and no worker is running (the reason in the
 * server log) */
void        RaiseNoWorker(void);
/* Can the worker be asked at all?  false under cpu; under gpu without a
 * ready worker, raises; under auto, counts `count` fallbacks. */
bool        WorkerUsable(int64 count);
/* A request that did not succeed: raise under gpu, else count `count`
 * fallbacks on the worker that failed; releases the slot when answered. */
void        RequestFailed(Relation index, GpuivfRequestSlot *slot, bool answered,
                          const char *what, int64 count);
/* the identity of index (and the metapage as the backend saw it, if any,
 * with the version of its rows that the copy must have reached:
 * GpuivfReadRows after the snapshot; 0 when there is no meta) */
void        SetIndexIdentity(GpuivfRequestSlot *slot, Relation index,
                             const GpuivfMetaPageData *meta, uint64 version);
/* Where the GPU copies of an index of meta's shape live (protocol.h,
 * "Sharding", "Larger than the GPU"): how many shards, and whether they
 * hold only codes (searches return ADC candidates that the backend
 * re-ranks).  Every backend computes the same from the metapage. */
typedef struct GpuivfPlacement
{
    int         nshards;
    bool        codes_only;
    uint64      version;        /* of the rows the copies must hold (set by
                                 * the search, from GpuivfReadRows) */
} GpuivfPlacement;
GpuivfPlacement GpuivfPlaceIndex(const GpuivfMetaPageData *meta);
/* submit a filled request and wait without a time limit (builds, exact
 * kNN); cancel still works; true when answered */
bool        SubmitAndWaitUnlimited(GpuivfRequestSlot *slot);

#endif                          /* GPUIVF_WORKER_BACKEND_H */
