/*
 * utils.cpp — small services every module of the PostgreSQL side uses:
 * engine statuses raised as errors and the engine's cancel hook, a sorted-id
 * lookup, reservoir sampling and phase timing.
 */
#include "gpuivf.h"

/*
 * Raises a failed engine status as a PostgreSQL error.  A canceled status
 * means the cancel hook saw a pending interrupt: serve it here.
 */
void
GpuivfRaiseStatus(const gpuivf::Status &status)
{
    switch (status.code)
    {
        case gpuivf::kOk:
            return;
        case gpuivf::kCanceled:
            CHECK_FOR_INTERRUPTS();
            /* interrupts are held off: still stop the operation */
            ereport(ERROR,
                    (errcode(ERRCODE_QUERY_CANCELED),
                     errmsg("gpuivf operation was canceled")));
            break;
        case gpuivf::kInvalidArgument:
            ereport(ERROR,
                    (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                     errmsg("%s", status.message)));
            break;
        case gpuivf::kOutOfMemory:
            ereport(ERROR,
                    (errcode(ERRCODE_OUT_OF_MEMORY),
                     errmsg("out of memory"),
                     errdetail("The gpuivf engine reported: %s.", status.message)));
            break;
        default:
            ereport(ERROR,
                    (errcode(ERRCODE_INTERNAL_ERROR),
                     errmsg("gpuivf engine error: %s", status.message)));
            break;
    }
}

/*
 * The engine's cancel hook: true when a query cancel or termination is
 * pending.  It only reads the flags; the caller raises the interrupt after
 * the engine has returned (GpuivfRaiseStatus), so nothing longjmps out of
 * engine code.
 */
bool
GpuivfShouldCancel(void *arg)
{
    (void) arg;
    return InterruptPending && (QueryCancelPending || ProcDiePending);
}

/* qsort comparator: ascending uint64 (ids) */
int
GpuivfCompareUint64(const void *a, const void *b)
{
    uint64      x = *(const uint64 *) a;
    uint64      y = *(const uint64 *) b;

    return x < y ? -1 : (x > y ? 1 : 0);
}

/* Binary search: is id among the n ascending ids? */
bool
GpuivfSortedIdsContain(const uint64 *ids, int64 n, uint64 id)
{
    int64       lo = 0;
    int64       hi = n;

    while (lo < hi)
    {
        int64       mid = lo + (hi - lo) / 2;

        if (ids[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && ids[lo] == id;
}

/*
 * Algorithm R: the reservoir slot (of cap) for the row after `seen` rows, the
 * reservoir holding `held` of them: `held` itself while it is not full (the
 * caller then counts it), else a random slot, or -1 to skip the row.
 */
int64
GpuivfReservoirSlot(pg_prng_state *prng, int64 held, int64 cap, int64 seen)
{
    uint64      j;

    if (held < cap)
        return held;
    j = pg_prng_uint64_range(prng, 0, (uint64) seen);
    return j < (uint64) cap ? (int64) j : -1;
}

/* Seconds from *since to now added to *seconds; *since becomes now, so the
 * next call times the next stretch (phase timings, the worker's breakdown). */
void
GpuivfAddSeconds(double *seconds, instr_time *since)
{
    instr_time  now;
    instr_time  d;

    INSTR_TIME_SET_CURRENT(now);
    d = now;
    INSTR_TIME_SUBTRACT(d, *since);
    *seconds += INSTR_TIME_GET_DOUBLE(d);
    *since = now;
}
