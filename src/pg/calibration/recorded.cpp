/*
 * calibration/recorded.cpp — the queries each index answers, recorded in
 * shared memory so that ANALYZE can calibrate on the workload instead of on
 * rows (calibration/calibration.cpp), and noticing when the workload drifts
 * away from the queries the index was calibrated on.
 *
 * Per index, a reservoir (Algorithm R) of up to gpuivf.query_sample query
 * vectors, each with its L2 distance to the nearest list centre.  Only with
 * shared_preload_libraries = 'gpuivf' (the memory is sized at start-up,
 * gpuivf.query_sample_memory); otherwise nothing is recorded and ANALYZE
 * calibrates on rows (or on queries given to gpuivf_calibrate).
 *
 * Lock-light: a scan's cost is a look-up in a backend-local cache (index
 * OID -> reservoir, validated by the reservoir's tag), one atomic add to
 * the reservoir's count of queries (on a cache line of its own) and one
 * random draw.  Only a query that the reservoir keeps — all of the first
 * query_sample, then with probability query_sample / queries seen — pays
 * for its nearest-centre distance (lists x dims multiply-adds) and a copy
 * into its slot, published with a per-slot sequence count: a writer that
 * finds the slot busy skips it, a reader retries or skips a slot that
 * changed while it copied.  The LWLock of the area is taken only to find a
 * reservoir a backend has not cached, to create or evict one, and by
 * ANALYZE; evicting waits for the reservoir's writers (a pin count).
 *
 * Memory: an arena of 64 kB units; a reservoir takes a contiguous run of
 * them (query_sample slots of 8 + 4 x dims bytes, at most half the arena),
 * first fit, evicting the reservoir recorded into longest ago when none is
 * free — if that was more than a minute ago: busy reservoirs are not traded
 * for each other.  An index that gets none is not recorded, and a backend
 * asks again only after 10 s.  DROP of an index frees its reservoir (object
 * access hook).
 *
 * Privacy: the vectors stay in shared memory; no SQL function returns
 * them.  ANALYZE stores those it calibrates on in the index
 * (calibration/stored.cpp), where they are as readable as the table's own
 * vectors in its index pages: by superusers through pageinspect.
 */
#include "gpuivf.h"
#include "calibration/calibration.h"
#include "storage/storage.h"

#include <cmath>

int         gpuivf_query_sample = 1000;
int         gpuivf_query_sample_memory = 32768;     /* kB */

#define REC_ENTRIES     128
#define REC_UNIT        ((Size) 64 * 1024)
#define REC_MAX_UNITS   65535
#define REC_DRIFT_FRACTION  0.20    /* mean nearest-centre distance moved by 20% */
#define REC_DRIFT_MIN_QUERIES 32
#define REC_CHECK_EVERY 16          /* a backend checks every 16th query it records */
#define REC_IDLE_EVICT_US   INT64CONST(60000000)   /* a reservoir idle this long may be evicted */
#define REC_RETRY_US    INT64CONST(10000000)   /* a backend denied a reservoir asks again after */

/* One reservoir.  `seen` is written by every query: its own cache line. */
typedef struct RecEntry
{
    pg_atomic_uint64 tag;       /* 0: free; new for every use of the entry */
    Oid         dbid;
    Oid         indexoid;
    Oid         heapoid;
    int32       dims;
    int32       capacity;       /* slots */
    uint32      slot_bytes;
    uint32      first_unit;
    uint32      nunits;
    pg_atomic_uint64 last_used; /* TimestampTz of the last query kept */
    pg_atomic_uint32 writers;   /* backends copying into a slot (a pin) */
    pg_atomic_uint32 drift_said;    /* calib_id + 1 of the calibration the
                                     * drift notice was given for */
    char        pad1[PG_CACHE_LINE_SIZE];
    pg_atomic_uint64 seen;      /* queries offered since the last reset */
    char        pad2[PG_CACHE_LINE_SIZE - sizeof(pg_atomic_uint64)];
} RecEntry;

/* A slot: sequence count (even: stable; 0: empty), the query's distance to
 * its nearest list centre (NaN: unknown), the raw vector. */
typedef struct RecSlot
{
    pg_atomic_uint32 version;
    float4      nn;
    float4      x[FLEXIBLE_ARRAY_MEMBER];
} RecSlot;

typedef struct RecShared
{
    LWLock     *lock;
    uint32      nunits;
    pg_atomic_uint64 next_tag;
    RecEntry    entries[REC_ENTRIES];
    /* then: uint8 owner[nunits] (entry + 1, 0 = free), then the arena */
} RecShared;

static RecShared *Rec = NULL;
static uint8 *RecOwner = NULL;
static char *RecArena = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;
static object_access_hook_type prev_object_access_hook = NULL;

/* ---------------------------------------------------------- shared memory */

static uint32
ArenaUnits(void)
{
    return (uint32) Min((Size) gpuivf_query_sample_memory * 1024 / REC_UNIT, (Size) REC_MAX_UNITS);
}

static Size
RecBytes(void)
{
    Size        head = MAXALIGN(sizeof(RecShared)) + PG_CACHE_LINE_SIZE;

    head = add_size(head, MAXALIGN(ArenaUnits()));
    return add_size(add_size(head, PG_CACHE_LINE_SIZE), mul_size(ArenaUnits(), REC_UNIT));
}

static void
RecRequestHook(void)
{
    if (prev_shmem_request_hook)
        prev_shmem_request_hook();
    RequestAddinShmemSpace(RecBytes());
    RequestNamedLWLockTranche("gpuivf query sample", 1);
}

static void
RecStartupHook(void)
{
    bool        found;
    char       *base;

    if (prev_shmem_startup_hook)
        prev_shmem_startup_hook();
    LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
    base = (char *) ShmemInitStruct("gpuivf query sample", RecBytes(), &found);
    /* entries on cache lines of their own */
    Rec = (RecShared *) TYPEALIGN(PG_CACHE_LINE_SIZE, base);
    RecOwner = (uint8 *) Rec + MAXALIGN(sizeof(RecShared));
    RecArena = (char *) TYPEALIGN(PG_CACHE_LINE_SIZE, RecOwner + MAXALIGN(ArenaUnits()));
    if (!found)
    {
        memset(Rec, 0, sizeof(RecShared));
        Rec->lock = &(GetNamedLWLockTranche("gpuivf query sample"))->lock;
        Rec->nunits = ArenaUnits();
        pg_atomic_init_u64(&Rec->next_tag, 1);
        for (int i = 0; i < REC_ENTRIES; i++)
        {
            RecEntry   *e = &Rec->entries[i];

            pg_atomic_init_u64(&e->tag, 0);
            pg_atomic_init_u64(&e->last_used, 0);
            pg_atomic_init_u32(&e->writers, 0);
            pg_atomic_init_u32(&e->drift_said, 0);
            pg_atomic_init_u64(&e->seen, 0);
        }
        memset(RecOwner, 0, Rec->nunits);
    }
    LWLockRelease(AddinShmemInitLock);
}

static RecSlot *
SlotOf(const RecEntry *e, int i)
{
    return (RecSlot *) (RecArena + (Size) e->first_unit * REC_UNIT + (Size) i * e->slot_bytes);
}

/* ------------------------------------------------------- finding entries */

/* This backend's cache of entries: index OID -> entry, valid while the
 * entry's tag is the one cached. */
#define LOCAL_CACHE 16
typedef struct LocalEntry
{
    Oid         indexoid;
    int         entry;
    uint64      tag;            /* 0: denied (no memory) until retry_after */
    TimestampTz retry_after;
    uint32      recorded;       /* queries this backend recorded into it */
} LocalEntry;
static LocalEntry local_cache[LOCAL_CACHE];
static int  local_next = 0;
static pg_prng_state local_prng;
static bool local_prng_seeded = false;

/* Forget an entry: no writer copies into it once this returns (the caller
 * holds the lock exclusively). */
static void
EvictLocked(int i)
{
    RecEntry   *e = &Rec->entries[i];

    pg_atomic_write_u64(&e->tag, 0);
    pg_memory_barrier();
    while (pg_atomic_read_u32(&e->writers) != 0)
        pg_usleep(10);
    for (uint32 u = e->first_unit; u < e->first_unit + e->nunits && u < Rec->nunits; u++)
        RecOwner[u] = 0;
    e->nunits = 0;
}

/* The entry of (database, index) under the lock, or -1. */
static int
FindLocked(Oid indexoid)
{
    for (int i = 0; i < REC_ENTRIES; i++)
    {
        RecEntry   *e = &Rec->entries[i];

        if (pg_atomic_read_u64(&e->tag) != 0 && e->dbid == MyDatabaseId && e->indexoid == indexoid)
            return i;
    }
    return -1;
}

/* First fit of n contiguous free units, or -1. */
static int64
FreeRun(uint32 n)
{
    uint32      run = 0;

    for (uint32 u = 0; u < Rec->nunits; u++)
    {
        run = RecOwner[u] == 0 ? run + 1 : 0;
        if (run == n)
            return (int64) (u + 1 - n);
    }
    return -1;
}

/* The entry recorded into longest ago (other than keep), if that was more
 * than a minute ago, or -1: a busy reservoir is never evicted to make room
 * for another (that would only trade one for the other, query by query). */
static int
LeastRecentLocked(int keep)
{
    int         best = -1;
    int64       oldest = PG_INT64_MAX;
    TimestampTz idle_before = GetCurrentTimestamp() - REC_IDLE_EVICT_US;

    for (int i = 0; i < REC_ENTRIES; i++)
    {
        int64       used;

        if (i == keep || pg_atomic_read_u64(&Rec->entries[i].tag) == 0)
            continue;
        used = (int64) pg_atomic_read_u64(&Rec->entries[i].last_used);
        if (used < oldest)
        {
            oldest = used;
            best = i;
        }
    }
    return oldest < idle_before ? best : -1;
}

/* A new entry for the index (exclusive lock held), or -1 when it cannot
 * get memory. */
static int
CreateLocked(Oid indexoid, Oid heapoid, int dims)
{
    Size        slot_bytes = MAXALIGN(offsetof(RecSlot, x) + sizeof(float4) * (Size) dims);
    uint32      want = (uint32) Min(((Size) gpuivf_query_sample * slot_bytes + REC_UNIT - 1) / REC_UNIT,
                                    (Size) Max(Rec->nunits / 2, 1));
    int         slot = -1;
    int64       first;
    RecEntry   *e;

    if (slot_bytes > REC_UNIT * want || want == 0)
        return -1;
    for (int i = 0; i < REC_ENTRIES && slot < 0; i++)
        if (pg_atomic_read_u64(&Rec->entries[i].tag) == 0)
            slot = i;
    if (slot < 0)
    {
        slot = LeastRecentLocked(-1);
        if (slot < 0)
            return -1;
        EvictLocked(slot);
    }
    while ((first = FreeRun(want)) < 0)
    {
        int         victim = LeastRecentLocked(slot);

        if (victim < 0)
            return -1;
        EvictLocked(victim);
    }
    e = &Rec->entries[slot];
    e->dbid = MyDatabaseId;
    e->indexoid = indexoid;
    e->heapoid = heapoid;
    e->dims = dims;
    e->slot_bytes = (uint32) slot_bytes;
    e->first_unit = (uint32) first;
    e->nunits = want;
    e->capacity = (int32) Min((Size) gpuivf_query_sample, (Size) want * REC_UNIT / slot_bytes);
    for (uint32 u = 0; u < want; u++)
        RecOwner[first + u] = (uint8) Min(slot + 1, 255);
    for (int s = 0; s < e->capacity; s++)
    {
        pg_atomic_init_u32(&SlotOf(e, s)->version, 0);
        SlotOf(e, s)->nn = NAN;
    }
    pg_atomic_write_u64(&e->seen, 0);
    pg_atomic_write_u32(&e->drift_said, 0);
    pg_atomic_write_u64(&e->last_used, (uint64) GetCurrentTimestamp());
    pg_write_barrier();
    pg_atomic_write_u64(&e->tag, pg_atomic_fetch_add_u64(&Rec->next_tag, 1));
    return slot;
}

/*
 * This backend's cache entry for the index's reservoir, creating the
 * reservoir when `create`; NULL when there is none (or no memory for one).
 * A reservoir of another table or dimension count (a reused OID, an index
 * emptied and refilled) is replaced.
 */
static LocalEntry *
Lookup(Relation index, int dims, bool create)
{
    Oid         indexoid = RelationGetRelid(index);
    Oid         heapoid = index->rd_index->indrelid;
    LocalEntry *le = NULL;
    int         i;

    for (int c = 0; c < LOCAL_CACHE; c++)
    {
        if (local_cache[c].indexoid != indexoid)
            continue;
        if (local_cache[c].tag != 0 &&
            pg_atomic_read_u64(&Rec->entries[local_cache[c].entry].tag) == local_cache[c].tag)
            return &local_cache[c];
        /* denied a reservoir lately: not every query asks for one again */
        if (local_cache[c].tag == 0 && create && GetCurrentTimestamp() < local_cache[c].retry_after)
            return NULL;
        le = &local_cache[c];
    }

    LWLockAcquire(Rec->lock, LW_SHARED);
    i = FindLocked(indexoid);
    if (i >= 0 && (Rec->entries[i].heapoid != heapoid || Rec->entries[i].dims != dims))
        i = -2;                 /* replace it */
    LWLockRelease(Rec->lock);
    if (i < 0 && !create)
        return NULL;
    if (i < 0)
    {
        LWLockAcquire(Rec->lock, LW_EXCLUSIVE);
        i = FindLocked(indexoid);
        if (i >= 0 && (Rec->entries[i].heapoid != heapoid || Rec->entries[i].dims != dims))
        {
            EvictLocked(i);
            i = -1;
        }
        if (i < 0)
            i = CreateLocked(indexoid, heapoid, dims);
        LWLockRelease(Rec->lock);
    }
    if (le == NULL)
    {
        le = &local_cache[local_next];
        local_next = (local_next + 1) % LOCAL_CACHE;
    }
    le->indexoid = indexoid;
    le->entry = Max(i, 0);
    le->tag = i >= 0 ? pg_atomic_read_u64(&Rec->entries[i].tag) : 0;
    le->retry_after = GetCurrentTimestamp() + REC_RETRY_US;
    le->recorded = 0;
    return le->tag != 0 ? le : NULL;
}

/* ------------------------------------------------------------- recording */

/* L2 distance of raw vector x to its nearest list centre, in the space the
 * centres live in (normalized for cosine); NaN when untrained. */
float
GpuivfNearestCentreDistance(Relation index, const float4 *x, int dims)
{
    GpuivfIndexState *st = GpuivfGetIndexState(index);
    float      *prep;
    int32       label;
    float       dist = NAN;

    if (!GpuivfMetaIsTrained(&st->meta) || st->meta.lists == 0 || (int) st->meta.dims != dims)
        return NAN;
    prep = (float *) palloc(sizeof(float) * dims);
    gpuivf::prepare_vector((gpuivf::Metric) st->meta.metric, x, prep, dims);
    if (gpuivf::ok(gpuivf::assign_nearest(st->centroids, st->centroid_norms, (int) st->meta.lists,
                                          dims, prep, 1, &label, &dist, NULL)))
        dist = sqrtf(Max(dist, 0.0f));
    else
        dist = NAN;
    pfree(prep);
    return dist;
}

/* Mean nearest-centre distance over the valid slots of e; *n of them. */
static double
RecordedMeanDistance(RecEntry *e, int *n)
{
    double      sum = 0;
    int         cnt = 0;
    int         filled = (int) Min(pg_atomic_read_u64(&e->seen), (uint64) e->capacity);

    for (int s = 0; s < filled; s++)
    {
        RecSlot    *slot = SlotOf(e, s);
        uint32      v = pg_atomic_read_u32(&slot->version);
        float       nn = slot->nn;

        if (v == 0 || (v & 1) || std::isnan(nn))
            continue;
        sum += nn;
        cnt++;
    }
    *n = cnt;
    return cnt > 0 ? sum / cnt : NAN;
}

/* The drift message, at elevel (to the server log, and to the client). */
static void
SayDrift(int elevel, Relation index, const GpuivfMetaPageData *meta, RecEntry *e, int n,
         double mean)
{
    ereport(elevel,
            (errmsg("queries of gpuivf index \"%s\" have drifted from those it was calibrated on",
                    RelationGetRelationName(index)),
             errdetail("The last %d recorded queries lie %.3g from their nearest list centre on average, the %u queries of its calibration (%s) %.3g; its recall curve may not hold for them.",
                       n, mean, meta->calib_sample, GpuivfCalibSourceName(meta->calib_source),
                       (double) meta->calib_nn_mean),
             e->capacity >= gpuivf_analyze_sample
             ? errhint("Run ANALYZE on its table: it calibrates the index on the recorded queries.")
             : errhint("Raise gpuivf.query_sample to at least gpuivf.analyze_sample (%d), then run ANALYZE on its table, so that it calibrates on recorded queries.",
                       gpuivf_analyze_sample)));
}

/*
 * Have the queries this index answers drifted from those its curve was
 * measured on?  Said once per calibration, for the whole server.
 */
static void
CheckDrift(Relation index, const GpuivfMetaPageData *meta, RecEntry *e)
{
    uint32      said = pg_atomic_read_u32(&e->drift_said);
    uint32      now = meta->calib_id + 1;
    int         need = Max(REC_DRIFT_MIN_QUERIES, Min(gpuivf_analyze_sample, (int) e->capacity));
    int         n;
    double      mean;

    if (meta->calib_sample == 0 || !(meta->calib_nn_mean > 0) || said == now)
        return;
    mean = RecordedMeanDistance(e, &n);
    if (n < need || std::isnan(mean) ||
        fabs(mean - (double) meta->calib_nn_mean) <= REC_DRIFT_FRACTION * (double) meta->calib_nn_mean)
        return;
    if (!pg_atomic_compare_exchange_u32(&e->drift_said, &said, now))
        return;                 /* another backend says it */
    SayDrift(LOG, index, meta, e, n, mean);
    SayDrift(NOTICE, index, meta, e, n, mean);
}

/* Offer a query a scan of the index answers to its reservoir (calibration.h). */
void
GpuivfRecordQuery(Relation index, const GpuivfMetaPageData *meta, const float4 *x, int dims)
{
    LocalEntry *le;
    RecEntry   *e;
    uint64      n;
    int64       slotno;
    RecSlot    *slot;
    uint32      v;
    float       nn;

    if (Rec == NULL || gpuivf_query_sample <= 0 || x == NULL || dims <= 0 ||
        RecoveryInProgress())
        return;
    le = Lookup(index, dims, true);
    if (le == NULL)
        return;
    e = &Rec->entries[le->entry];
    n = pg_atomic_fetch_add_u64(&e->seen, 1);
    if (n < (uint64) e->capacity)
        slotno = (int64) n;
    else
    {
        if (!local_prng_seeded)
        {
            pg_prng_seed(&local_prng, (uint64) MyProcPid ^ (uint64) GetCurrentTimestamp());
            local_prng_seeded = true;
        }
        slotno = (int64) pg_prng_uint64_range(&local_prng, 0, n);
        if (slotno >= e->capacity)
            return;
    }

    /* kept: its distance (outside the pin), then the copy */
    nn = GpuivfNearestCentreDistance(index, x, dims);
    pg_atomic_fetch_add_u32(&e->writers, 1);
    if (pg_atomic_read_u64(&e->tag) != le->tag)
    {
        pg_atomic_fetch_sub_u32(&e->writers, 1);
        return;
    }
    slot = SlotOf(e, (int) slotno);
    v = pg_atomic_read_u32(&slot->version);
    if (!(v & 1) && pg_atomic_compare_exchange_u32(&slot->version, &v, v + 1))
    {
        slot->nn = nn;
        memcpy(slot->x, x, sizeof(float4) * dims);
        pg_write_barrier();
        pg_atomic_write_u32(&slot->version, v + 2);
    }
    pg_atomic_fetch_sub_u32(&e->writers, 1);
    pg_atomic_write_u64(&e->last_used, (uint64) GetCurrentTimestamp());
    /* every 16th query this backend records, and at the count the test needs */
    if (++le->recorded % REC_CHECK_EVERY == 0 ||
        n + 1 == (uint64) Max(REC_DRIFT_MIN_QUERIES, Min(gpuivf_analyze_sample, (int) e->capacity)))
        CheckDrift(index, meta, e);
}

/* ---------------------------------------------------------------- ANALYZE */

/*
 * Copy up to max recorded queries of the index (calibration.h): a random
 * subset (fixed seed) when it holds more.  *ticket identifies what was
 * taken for GpuivfRecordedConsumed.
 */
int
GpuivfRecordedTake(Relation index, int dims, int max, float4 **out, uint64 *ticket)
{
    LocalEntry *le;
    RecEntry   *e;
    int         filled;
    int         n = 0;
    float4     *x;
    float4     *tmp;
    int        *order;
    pg_prng_state prng;

    *out = NULL;
    *ticket = 0;
    if (Rec == NULL || max <= 0 || (le = Lookup(index, dims, false)) == NULL)
        return 0;
    e = &Rec->entries[le->entry];
    filled = (int) Min(pg_atomic_read_u64(&e->seen), (uint64) e->capacity);
    if (filled == 0)
        return 0;
    tmp = (float4 *) palloc_extended(sizeof(float4) * (Size) filled * dims, MCXT_ALLOC_HUGE);
    pg_atomic_fetch_add_u32(&e->writers, 1);    /* keeps the memory ours */
    if (pg_atomic_read_u64(&e->tag) == le->tag)
    {
        for (int s = 0; s < filled; s++)
        {
            RecSlot    *slot = SlotOf(e, s);

            for (int attempt = 0; attempt < 3; attempt++)
            {
                uint32      v1 = pg_atomic_read_u32(&slot->version);

                if (v1 == 0 || (v1 & 1))
                    continue;
                pg_read_barrier();
                memcpy(tmp + (Size) n * dims, slot->x, sizeof(float4) * dims);
                pg_read_barrier();
                if (pg_atomic_read_u32(&slot->version) == v1)
                {
                    n++;
                    break;
                }
            }
        }
    }
    pg_atomic_fetch_sub_u32(&e->writers, 1);
    *ticket = le->tag;

    /* a random max of them, in a random order */
    order = (int *) palloc(sizeof(int) * Max(n, 1));
    for (int i = 0; i < n; i++)
        order[i] = i;
    pg_prng_seed(&prng, UINT64CONST(0x6770756976660007));
    for (int i = 0; i < Min(n, max); i++)
    {
        int         j = i + (int) pg_prng_uint64_range(&prng, 0, (uint64) (n - i - 1));
        int         t = order[i];

        order[i] = order[j];
        order[j] = t;
    }
    n = Min(n, max);
    x = (float4 *) palloc_extended(sizeof(float4) * (Size) Max(n, 1) * dims, MCXT_ALLOC_HUGE);
    for (int i = 0; i < n; i++)
        memcpy(x + (Size) i * dims, tmp + (Size) order[i] * dims, sizeof(float4) * dims);
    pfree(tmp);
    pfree(order);
    *out = x;
    return n;
}

/* A calibration used the queries taken with ticket: the reservoir starts
 * again, so that the next one measures on queries recorded since. */
void
GpuivfRecordedConsumed(uint64 ticket)
{
    if (Rec == NULL || ticket == 0)
        return;
    LWLockAcquire(Rec->lock, LW_EXCLUSIVE);
    for (int i = 0; i < REC_ENTRIES; i++)
    {
        RecEntry   *e = &Rec->entries[i];

        if (pg_atomic_read_u64(&e->tag) != ticket)
            continue;
        pg_atomic_write_u64(&e->seen, 0);
        for (int s = 0; s < e->capacity; s++)
        {
            RecSlot    *slot = SlotOf(e, s);
            uint32      v = pg_atomic_read_u32(&slot->version);

            /* a slot being written keeps its (new) query */
            if (!(v & 1))
                pg_atomic_compare_exchange_u32(&slot->version, &v, 0);
        }
    }
    LWLockRelease(Rec->lock);
}

/* What gpuivf_index_info shows of the index's reservoir (calibration.h). */
bool
GpuivfRecordedStats(Relation index, int dims, GpuivfRecordedInfo *info)
{
    LocalEntry *le;
    RecEntry   *e;

    memset(info, 0, sizeof(*info));
    info->available = Rec != NULL;
    if (Rec == NULL || (le = Lookup(index, dims, false)) == NULL)
        return false;
    e = &Rec->entries[le->entry];
    info->capacity = e->capacity;
    info->seen = pg_atomic_read_u64(&e->seen);
    info->nn_mean = RecordedMeanDistance(e, &info->held);
    info->drift_said = pg_atomic_read_u32(&e->drift_said);
    return true;
}

/* ------------------------------------------------------------ set-up */

/* DROP of an index frees its reservoir. */
static void
RecObjectAccess(ObjectAccessType access, Oid classId, Oid objectId, int subId, void *arg)
{
    if (prev_object_access_hook)
        prev_object_access_hook(access, classId, objectId, subId, arg);
    if (access != OAT_DROP || classId != RelationRelationId || subId != 0 || Rec == NULL)
        return;
    LWLockAcquire(Rec->lock, LW_EXCLUSIVE);
    for (int i = FindLocked(objectId); i >= 0; i = FindLocked(objectId))
        EvictLocked(i);
    LWLockRelease(Rec->lock);
}

/* _PG_init: the settings; with shared_preload_libraries the shared memory
 * (calibration.h). */
void
GpuivfRecordedInit(void)
{
    DefineCustomIntVariable("gpuivf.query_sample",
                            "Query vectors kept per gpuivf index for ANALYZE to calibrate on (0 = record none).",
                            "A uniform sample of the queries each index answers since its last calibration on them; "
                            "needs shared_preload_libraries = 'gpuivf'.",
                            &gpuivf_query_sample, 1000, 0, 100000, PGC_SUSET, 0, NULL, NULL, NULL);
    if (!process_shared_preload_libraries_in_progress)
        return;
    DefineCustomIntVariable("gpuivf.query_sample_memory",
                            "Shared memory for the recorded queries of all gpuivf indexes.",
                            "A reservoir takes at most half of it; the one recorded into longest ago makes room for a new one.",
                            &gpuivf_query_sample_memory, 32768, 0, 4194304, PGC_POSTMASTER,
                            GUC_UNIT_KB, NULL, NULL, NULL);
    if (ArenaUnits() == 0)
        return;
    prev_shmem_request_hook = shmem_request_hook;
    shmem_request_hook = RecRequestHook;
    prev_shmem_startup_hook = shmem_startup_hook;
    shmem_startup_hook = RecStartupHook;
    prev_object_access_hook = object_access_hook;
    object_access_hook = RecObjectAccess;
}
