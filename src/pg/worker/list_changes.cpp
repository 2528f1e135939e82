/*
 * worker/list_changes.cpp — which lists of an index changed since a GPU copy
 * last read them, so that catching the copy up walks those lists only
 * (README.md, "Never stale").
 *
 * A table in shared memory of GPUIVF_LIST_CHANGE_SLOTS pairs of counters,
 * one pair per (relfilenode, list) by hash: a backend that changes a list
 * page adds one to `begun` before its change (before its WAL record, with its
 * locks held) and one to `ended` once the change is done.  The worker reads
 * `begun`, then `ended`, before it walks a list; when they are equal every
 * change begun by then was over before the walk, and the walk saw it.  So
 * when `begun` has not moved since (and was settled then), no change of the
 * list can be missing from the copy and the list is skipped.  Lists sharing
 * a slot (a hash collision) only make each other walked more often.
 *
 * A second, smaller table counts, per relfilenode, the changes that remove
 * entries from a list page (VACUUM): while it stands still between two
 * walks, a changed page only gained entries, and the catch-up appends what
 * follows the entries it had (an entry TID reused after a removal would
 * otherwise look like the entry it replaced).
 *
 * Changes that do not come from backends of this server are not counted:
 * WAL replay on a standby or in crash recovery.  The worker trusts the
 * counters only for copies whose previous walk began after recovery had
 * ended (RecoveryInProgress false); shared memory and the worker's copies
 * are both lost together at a restart.
 */
#include "gpuivf.h"
#include "worker/worker.h"

#include "access/xact.h"
#include "common/hashfn.h"
#include "port/atomics.h"
#include "storage/shmem.h"
#include "utils/rel.h"

#define GPUIVF_LIST_CHANGE_SLOTS 65536  /* a power of two; 1 MB */
#define GPUIVF_REMOVAL_SLOTS    1024    /* a power of two, after them */

typedef struct ListChangeSlot
{
    pg_atomic_uint64 begun;
    pg_atomic_uint64 ended;
} ListChangeSlot;

static ListChangeSlot *ListChanges = NULL;

Size
GpuivfListChangesShmemBytes(void)
{
    return mul_size(sizeof(ListChangeSlot), GPUIVF_LIST_CHANGE_SLOTS + GPUIVF_REMOVAL_SLOTS);
}

/* Create or attach (the caller holds AddinShmemInitLock). */
void
GpuivfListChangesShmemInit(void)
{
    bool        found;

    ListChanges = (ListChangeSlot *) ShmemInitStruct("gpuivf list changes",
                                                     GpuivfListChangesShmemBytes(), &found);
    if (!found)
        for (int i = 0; i < GPUIVF_LIST_CHANGE_SLOTS + GPUIVF_REMOVAL_SLOTS; i++)
        {
            pg_atomic_init_u64(&ListChanges[i].begun, 0);
            pg_atomic_init_u64(&ListChanges[i].ended, 0);
        }
}

static uint32
HashNode(const RelFileNode *node)
{
    uint32      h = hash_bytes_uint32(node->relNode);

    h = hash_combine(h, hash_bytes_uint32(node->dbNode));
    return hash_combine(h, hash_bytes_uint32(node->spcNode));
}

static ListChangeSlot *
ListSlot(const RelFileNode *node, int list)
{
    uint32      h = hash_combine(HashNode(node), hash_bytes_uint32((uint32) list));

    return &ListChanges[h & (GPUIVF_LIST_CHANGE_SLOTS - 1)];
}

static ListChangeSlot *
RemovalSlot(const RelFileNode *node)
{
    return &ListChanges[GPUIVF_LIST_CHANGE_SLOTS + (HashNode(node) & (GPUIVF_REMOVAL_SLOTS - 1))];
}

/*
 * The change this backend has begun and not ended (at most one: Begin and
 * End bracket one record).  An error between them (a page found full, out
 * of memory: before the record, so the page did not change) ends it from
 * the (sub)transaction abort callback; else the slot would stay unsettled
 * and its lists be walked at every catch-up.
 */
static struct
{
    bool        active;
    RelFileNode node;
    int         list;
    bool        removes;
}           Pending;

static void
EndPending(void)
{
    if (!Pending.active)
        return;
    Pending.active = false;
    (void) pg_atomic_fetch_add_u64(&ListSlot(&Pending.node, Pending.list)->ended, 1);
    if (Pending.removes)
        (void) pg_atomic_fetch_add_u64(&RemovalSlot(&Pending.node)->ended, 1);
}

static void
AbortCallback(XactEvent event, void *arg)
{
    if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT)
        EndPending();
}

static void
SubAbortCallback(SubXactEvent event, SubTransactionId mySubid, SubTransactionId parentSubid,
                void *arg)
{
    if (event == SUBXACT_EVENT_ABORT_SUB)
        EndPending();
}

void
GpuivfListChangeBegin(Relation index, int list, bool removes)
{
    static bool callbacks = false;

    if (ListChanges == NULL)
        return;
    if (!callbacks)
    {
        RegisterXactCallback(AbortCallback, NULL);
        RegisterSubXactCallback(SubAbortCallback, NULL);
        callbacks = true;
    }
    Assert(!Pending.active);
    Pending.node = index->rd_node;
    Pending.list = list;
    Pending.removes = removes;
    Pending.active = true;
    if (removes)
        (void) pg_atomic_fetch_add_u64(&RemovalSlot(&index->rd_node)->begun, 1);
    (void) pg_atomic_fetch_add_u64(&ListSlot(&index->rd_node, list)->begun, 1);
}

void
GpuivfListChangeEnd(Relation index, int list, bool removes)
{
    Assert(!Pending.active ||
           (RelFileNodeEquals(Pending.node, index->rd_node) && Pending.list == list &&
            Pending.removes == removes));
    EndPending();
}

/* begun when it equals ended, else GPUIVF_LIST_UNSETTLED */
static uint64
SettledCount(ListChangeSlot *s)
{
    uint64      begun;
    uint64      ended;

    begun = pg_atomic_read_u64(&s->begun);
    pg_memory_barrier();
    ended = pg_atomic_read_u64(&s->ended);
    pg_memory_barrier();        /* before the caller reads pages */
    return begun == ended ? begun : GPUIVF_LIST_UNSETTLED;
}

uint64
GpuivfListChangeCount(const RelFileNode *node, int list)
{
    return ListChanges == NULL ? GPUIVF_LIST_UNSETTLED : SettledCount(ListSlot(node, list));
}

uint64
GpuivfListRemovalCount(const RelFileNode *node)
{
    return ListChanges == NULL ? GPUIVF_LIST_UNSETTLED : SettledCount(RemovalSlot(node));
}
