/*
 * utils.cpp — small services every module of the PostgreSQL side uses:
 * engine statuses raised as errors and the engine's cancel hook, a sorted-id
 * lookup, sampling by hash and phase timing.
 */
#include "gpuivf.h"

#include <algorithm>

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

/* The cancel hook long engine calls get: GpuivfShouldCancel. */
gpuivf::CancelHook
GpuivfCancelHook(void)
{
    gpuivf::CancelHook hook;

    hook.should_cancel = GpuivfShouldCancel;
    hook.arg = NULL;
    return hook;
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
 * Sampling by hash: a row is in the sample of k rows when its key
 * (GpuivfSampleHash of its vector, then its id) is among the k smallest of
 * all rows.  The sample is then a function of the rows alone, not of the
 * order they are seen in nor of how many processes scan them: a parallel
 * build draws the rows a serial one draws, and a build draws those a walk of
 * the finished index would.  The hash is of the vector's values, not of its
 * heap TID: the same vectors are drawn wherever they lie, so a table of
 * real[] and one of pgvector's vector (other row sizes, other TIDs) holding
 * the same values train the same model and calibrate on the same queries,
 * as does the table after VACUUM FULL or CLUSTER; rows of equal vectors
 * (equal keys) are told apart by their ids, and any of them gives the sample
 * the same values.  The bookkeeping below (GpuivfBottomK) keeps the keys of
 * the rows held in `slots` row slots owned by the caller; when the slots are
 * full it keeps the k smallest keys and frees the other slots, and from then
 * on turns away any key above the largest one kept (it can no longer be
 * among the k smallest).  Position-independent: it may live in a DSM
 * segment.
 */

/* splitmix64's finalizer: every bit of z moves every bit of the result */
static inline uint64
Mix64(uint64 z)
{
    z = (z ^ (z >> 30)) * UINT64CONST(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64CONST(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* The values hashed: the dimension count and at most the first
 * GPUIVF_SAMPLE_HASH_VALUES of them (distinct embeddings differ there; a
 * build's scan pays a few nanoseconds a row whatever its dimensions). */
#define GPUIVF_SAMPLE_HASH_VALUES 64

uint64
GpuivfSampleHash(uint64 seed, const float4 *x, int dims)
{
    uint64      z = Mix64(seed ^ ((uint64) dims * UINT64CONST(0x9E3779B97F4A7C15)));
    int         n = Min(dims, GPUIVF_SAMPLE_HASH_VALUES);
    int         i = 0;

    /* two values a step: half the dependent multiplications */
    for (; i + 2 <= n; i += 2)
    {
        uint32      a;
        uint32      b;

        memcpy(&a, x + i, sizeof(a));
        memcpy(&b, x + i + 1, sizeof(b));
        z = Mix64(z ^ (((uint64) a << 32) | b));
    }
    if (i < n)
    {
        uint32      a;

        memcpy(&a, x + i, sizeof(a));
        z = Mix64(z ^ a);
    }
    return z;
}

static inline bool
SampleKeyLess(const GpuivfSampleKey &a, const GpuivfSampleKey &b)
{
    return a.hash < b.hash || (a.hash == b.hash && a.id < b.id);
}

static GpuivfSampleKey *
BottomKKeys(GpuivfBottomK *bk)
{
    return (GpuivfSampleKey *) ((char *) bk + MAXALIGN(sizeof(GpuivfBottomK)));
}

static int64 *
BottomKFree(GpuivfBottomK *bk)
{
    return (int64 *) (BottomKKeys(bk) + bk->slots);
}

/* Bytes of the bookkeeping for `slots` slots (the rows are the caller's). */
Size
GpuivfBottomKSize(int64 slots)
{
    return MAXALIGN(sizeof(GpuivfBottomK)) + (Size) slots * (sizeof(GpuivfSampleKey) + sizeof(int64));
}

/* Keep the k smallest keys in `slots` >= k + 1 slots; mem: GpuivfBottomKSize. */
GpuivfBottomK *
GpuivfBottomKInit(void *mem, int64 k, int64 slots)
{
    GpuivfBottomK *bk = (GpuivfBottomK *) mem;
    int64      *free_slots;

    Assert(k >= 1 && slots > k);
    bk->k = k;
    bk->slots = slots;
    bk->n = 0;
    bk->bounded = false;
    bk->bound.hash = PG_UINT64_MAX;
    bk->bound.id = PG_UINT64_MAX;
    bk->bound.slot = -1;
    free_slots = BottomKFree(bk);
    for (int64 i = 0; i < slots; i++)
        free_slots[i] = slots - 1 - i;  /* slot 0 is handed out first */
    return bk;
}

/* Would GpuivfBottomKOffer turn this key away? (a cheap pre-filter) */
bool
GpuivfBottomKRejects(const GpuivfBottomK *bk, uint64 hash, uint64 id)
{
    GpuivfSampleKey key = {hash, id, 0};

    return bk->bounded && !SampleKeyLess(key, bk->bound);
}

/* Keep the k smallest keys; their slots stay, the others are freed. */
static void
BottomKCompact(GpuivfBottomK *bk)
{
    GpuivfSampleKey *keys = BottomKKeys(bk);
    int64      *free_slots = BottomKFree(bk);

    if (bk->n <= bk->k)
        return;
    /* keys[k - 1] becomes the k-th smallest, the smaller ones before it */
    std::nth_element(keys, keys + (bk->k - 1), keys + bk->n, SampleKeyLess);
    /* the free stack holds slots - n entries; push the evicted keys' slots */
    for (int64 i = bk->k; i < bk->n; i++)
        free_slots[bk->slots - bk->n + (i - bk->k)] = keys[i].slot;
    bk->n = bk->k;
    bk->bound = keys[bk->k - 1];
    bk->bounded = true;
}

/*
 * The slot that the row of this key goes into (the caller copies it there),
 * or -1 when it is not among the k smallest keys offered so far.
 */
int64
GpuivfBottomKOffer(GpuivfBottomK *bk, uint64 hash, uint64 id)
{
    GpuivfSampleKey *keys = BottomKKeys(bk);
    int64      *free_slots = BottomKFree(bk);
    int64       slot;

    if (GpuivfBottomKRejects(bk, hash, id))
        return -1;
    if (bk->n == bk->slots)
    {
        BottomKCompact(bk);
        if (GpuivfBottomKRejects(bk, hash, id))
            return -1;
    }
    slot = free_slots[bk->slots - bk->n - 1];
    keys[bk->n].hash = hash;
    keys[bk->n].id = id;
    keys[bk->n].slot = slot;
    bk->n++;
    return slot;
}

/*
 * The sample: min(k, offered) keys, ascending (so its order, too, depends on
 * the rows alone); *keys points at them.  Offering more afterwards is wrong.
 */
int64
GpuivfBottomKFinish(GpuivfBottomK *bk, const GpuivfSampleKey **keys)
{
    GpuivfSampleKey *k = BottomKKeys(bk);

    BottomKCompact(bk);
    std::sort(k, k + bk->n, SampleKeyLess);
    *keys = k;
    return bk->n;
}

/*
 * Algorithm R: the reservoir slot (of cap) for the row after `seen` rows, the
 * reservoir holding `held` of them: `held` itself while it is not full (the
 * caller then counts it), else a random slot, or -1 to skip the row.
 * (Rows of an index are sampled by hash instead, above.)
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
