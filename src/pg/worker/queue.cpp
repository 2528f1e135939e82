/*
 * worker/queue.cpp — the shared memory of the GPU worker: one worker slot per
 * GPU worker and request slots per PGPROC (one, or one per worker when
 * there are several: a sharded search asks its shards at once), with the
 * state machine both sides follow.
 *
 *   FREE --backend fills, submits--> SUBMITTED --a worker takes it--> TAKEN
 *   TAKEN --worker writes the answer--> DONE --backend reads it--> FREE
 *
 * A backend owns its slots (numbers pgprocno * slots_per_backend + i)
 * while FREE, SUBMITTED (it may withdraw them) and DONE; a worker owns a
 * slot while TAKEN.  A backend that leaves while its request is TAKEN
 * (cancel, statement_timeout, exit) sets `abandoned` and the worker frees
 * the slot when it is done instead of answering.  The backend's next
 * request, or the next owner of that PGPROC, waits for that (bounded: the
 * worker finishes its batch, or it is gone and the slot is reclaimed).
 * Every transition happens under the slot's spinlock; the payload part a
 * slot names belongs to whoever owns the slot, so it needs no lock.
 *
 * Waking: a worker sets `idle` before its last look at the queue and sleeps
 * on its latch; a backend that submitted sets the latch of one idle worker.
 * Both sides put a full barrier between their write and their read, so a
 * request is never left with every worker asleep.  Busy workers look at the
 * queue again before sleeping: that is what grows batches under load.  A
 * backend waiting for its answer first polls its slot for
 * gpuivf.answer_spin microseconds, yielding its core between looks, and
 * only then sleeps on its latch (YieldUntilDone says why).
 */
#include "gpuivf.h"
#include "worker/worker.h"
#include "worker/protocol.h"
#include "worker/bgworker/bgworker.h"

#include <sched.h>

GpuivfShared *GpuivfShmem = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;
static bool exit_callback_registered = false;

/* Number of workers registered by _PG_init (worker/bgworker/registration.cpp). */
extern int  GpuivfRegisteredWorkers;

/* ------------------------------------------------------------- layout */

static Size
SlotsBytes(int nslots)
{
    return MAXALIGN(add_size(offsetof(GpuivfShared, slots),
                             mul_size(sizeof(GpuivfRequestSlot), nslots)));
}

static Size
PayloadBytes(void)
{
    return MAXALIGN((Size) gpuivf_request_buffer * 1024);
}

/* Request slots of each PGPROC: one per worker when there are several (a
 * sharded search asks every shard at once), else one. */
static int
SlotsPerBackend(void)
{
    return Max(GpuivfRegisteredWorkers, 1);
}

static Size
ShmemBytes(void)
{
    return add_size(SlotsBytes(MaxBackends * SlotsPerBackend()), mul_size(PayloadBytes(), MaxBackends));
}

/* The part of its backend's payload area that slot slotno's request uses. */
char *
GpuivfSlotPayload(int slotno)
{
    return (char *) GpuivfShmem + SlotsBytes(GpuivfShmem->nslots) +
        (Size) (slotno / GpuivfShmem->slots_per_backend) * GpuivfShmem->payload_bytes +
        GpuivfShmem->slots[slotno].payload_off;
}

/* The bytes of that part; 0 when the backend wrote a part that is not
 * within its area (the worker then refuses the request). */
Size
GpuivfSlotCapacity(int slotno)
{
    const GpuivfRequestSlot *r = &GpuivfShmem->slots[slotno];

    if (r->payload_off > GpuivfShmem->payload_bytes ||
        r->payload_cap > GpuivfShmem->payload_bytes - r->payload_off)
        return 0;
    return r->payload_cap;
}

/* shmem_request_hook: MaxBackends is known here (not yet in _PG_init). */
static void
ShmemRequestHook(void)
{
    if (prev_shmem_request_hook)
        prev_shmem_request_hook();
    RequestAddinShmemSpace(ShmemBytes());
    RequestAddinShmemSpace(GpuivfListChangesShmemBytes());
}

/* shmem_startup_hook: create (postmaster, and after a crash restart) or attach. */
static void
ShmemStartupHook(void)
{
    bool        found;

    if (prev_shmem_startup_hook)
        prev_shmem_startup_hook();

    LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
    GpuivfShmem = (GpuivfShared *) ShmemInitStruct("gpuivf GPU worker", ShmemBytes(), &found);
    if (!found)
    {
        memset(GpuivfShmem, 0, SlotsBytes(MaxBackends * SlotsPerBackend()));
        GpuivfShmem->nworkers = GpuivfRegisteredWorkers;
        GpuivfShmem->slots_per_backend = SlotsPerBackend();
        GpuivfShmem->nslots = MaxBackends * SlotsPerBackend();
        GpuivfShmem->payload_bytes = PayloadBytes();
        pg_atomic_init_u32(&GpuivfShmem->max_slot, 0);
        pg_atomic_init_u64(&GpuivfShmem->fallbacks_no_worker, 0);
        for (int i = 0; i < GPUIVF_MAX_WORKERS; i++)
        {
            GpuivfWorkerSlot *w = &GpuivfShmem->workers[i];

            SpinLockInit(&w->mutex);
            w->state = GPUIVF_WORKER_UNUSED;
            w->device = -1;
            pg_atomic_init_u32(&w->idle, 0);
            pg_atomic_init_u64(&w->requests, 0);
            pg_atomic_init_u64(&w->queries, 0);
            pg_atomic_init_u64(&w->batches, 0);
            pg_atomic_init_u64(&w->max_batch, 0);
            pg_atomic_init_u64(&w->queue_us, 0);
            pg_atomic_init_u64(&w->gpu_us, 0);
            pg_atomic_init_u64(&w->errors, 0);
            pg_atomic_init_u64(&w->cpu_fallbacks, 0);
            pg_atomic_init_u64(&w->loads, 0);
            pg_atomic_init_u64(&w->refreshes, 0);
            pg_atomic_init_u64(&w->evictions, 0);
            pg_atomic_init_u64(&w->builds, 0);
            pg_atomic_init_u64(&w->exact_knn, 0);
        }
        for (int i = 0; i < GpuivfShmem->nslots; i++)
            SpinLockInit(&GpuivfShmem->slots[i].mutex);
    }
    GpuivfListChangesShmemInit();
    LWLockRelease(AddinShmemInitLock);
}

void
GpuivfShmemRequest(void)
{
    prev_shmem_request_hook = shmem_request_hook;
    shmem_request_hook = ShmemRequestHook;
}

void
GpuivfShmemStartup(void)
{
    prev_shmem_startup_hook = shmem_startup_hook;
    shmem_startup_hook = ShmemStartupHook;
}

/* ------------------------------------------------------------ workers */

/* Is worker w still the incarnation that took a request, and serving? */
bool
GpuivfWorkerAlive(const GpuivfWorkerSlot *w, uint64 incarnation)
{
    GpuivfWorkerSlot *ww = (GpuivfWorkerSlot *) w;
    bool        alive;

    SpinLockAcquire(&ww->mutex);
    alive = ww->incarnation == incarnation && ww->pid != 0 &&
        (ww->state == GPUIVF_WORKER_READY || ww->state == GPUIVF_WORKER_STARTING);
    SpinLockRelease(&ww->mutex);
    return alive;
}

/*
 * A worker's state, read without its spinlock.  Every search asks several
 * times whether a worker is ready (the scan's and the search's device
 * checks, the worker search itself, the wait);
 * with the spinlock each ask was a write to the worker slot's cache line, so
 * at 64 clients that line bounced between all backends.  The state is one
 * aligned int that its worker writes under the mutex: a plain read returns a
 * value it had, which is all the locked read gave (the state may change
 * right after either way).  GpuivfTakeRequests reads it the same way.
 */
static inline int
WorkerState(const GpuivfWorkerSlot *w)
{
    return ((const volatile GpuivfWorkerSlot *) w)->state;
}

/* Workers that take requests now. */
int
GpuivfReadyWorkers(void)
{
    int         n = 0;

    if (GpuivfShmem == NULL)
        return 0;
    for (int i = 0; i < GpuivfShmem->nworkers; i++)
        if (WorkerState(&GpuivfShmem->workers[i]) == GPUIVF_WORKER_READY)
            n++;
    return n;
}

/* Is worker `worker` ready to take requests? */
bool
GpuivfWorkerReady(int worker)
{
    if (GpuivfShmem == NULL || worker < 0 || worker >= GpuivfShmem->nworkers)
        return false;
    return WorkerState(&GpuivfShmem->workers[worker]) == GPUIVF_WORKER_READY;
}

/*
 * Wake one idle ready worker (the preferred one when it is ready).  When all
 * are busy nobody is woken: each looks at the queue before it sleeps.  A
 * worker that is not idle is passed over without its spinlock (idle is an
 * atomic, read after the barrier as before): under load every worker is
 * busy, and the submit then writes to no worker's cache line.
 */
void
GpuivfWakeWorker(int preferred)
{
    int         first = preferred >= 0 ? preferred : 0;

    pg_memory_barrier();
    for (int j = 0; j < GpuivfShmem->nworkers; j++)
    {
        int         i = (first + j) % GpuivfShmem->nworkers;
        GpuivfWorkerSlot *w = &GpuivfShmem->workers[i];
        Latch      *latch = NULL;

        if (pg_atomic_read_u32(&w->idle) == 0)
            continue;
        SpinLockAcquire(&w->mutex);
        if (w->state == GPUIVF_WORKER_READY && pg_atomic_read_u32(&w->idle) != 0)
            latch = w->latch;
        SpinLockRelease(&w->mutex);
        if (latch != NULL)
        {
            SetLatch(latch);
            return;
        }
    }
}

/* ------------------------------------------------------- backend side */

/* Withdraw or abandon this backend's request, whatever state it is in
 * (withdrawn, or left to the worker to free); safe in abort callbacks
 * (spinlock only). */
void
GpuivfAbandonRequest(GpuivfRequestSlot *slot)
{
    SpinLockAcquire(&slot->mutex);
    if (slot->state == GPUIVF_REQ_SUBMITTED || slot->state == GPUIVF_REQ_DONE)
        slot->state = GPUIVF_REQ_FREE;
    else if (slot->state == GPUIVF_REQ_TAKEN)
        slot->abandoned = true;
    SpinLockRelease(&slot->mutex);
}

/* before_shmem_exit: a backend that exits leaves no request behind. */
static void
AbandonAtExit(int code, Datum arg)
{
    int         first = DatumGetInt32(arg);

    if (GpuivfShmem == NULL)
        return;
    for (int i = 0; i < GpuivfShmem->slots_per_backend; i++)
        if (first + i < GpuivfShmem->nslots)
            GpuivfAbandonRequest(&GpuivfShmem->slots[first + i]);
}

/* A TAKEN slot whose worker is gone is answered "worker gone" here. */
static bool
ReclaimIfWorkerGone(GpuivfRequestSlot *slot)
{
    int         worker;
    uint64      incarnation;
    bool        reclaimed = false;

    SpinLockAcquire(&slot->mutex);
    worker = slot->taken_by;
    incarnation = slot->taken_incarnation;
    SpinLockRelease(&slot->mutex);
    if (worker < 0 || worker >= GpuivfShmem->nworkers ||
        GpuivfWorkerAlive(&GpuivfShmem->workers[worker], incarnation))
        return false;

    SpinLockAcquire(&slot->mutex);
    if (slot->state == GPUIVF_REQ_TAKEN && slot->taken_by == worker &&
        slot->taken_incarnation == incarnation)
    {
        if (slot->abandoned)
        {
            slot->abandoned = false;
            slot->state = GPUIVF_REQ_FREE;
        }
        else
        {
            slot->result = GPUIVF_RESULT_WORKER_GONE;
            slot->fallback_ok = true;
            snprintf(slot->message, sizeof(slot->message),
                     "gpuivf GPU worker %d exited while serving the request", worker);
            slot->state = GPUIVF_REQ_DONE;
        }
        reclaimed = true;
    }
    SpinLockRelease(&slot->mutex);
    return reclaimed;
}

/*
 * Wait until this backend's slot is FREE: a request an earlier owner of
 * this PGPROC (or an interrupted search of this one) left SUBMITTED or DONE
 * is dropped, one it abandoned while TAKEN is waited out (its worker frees
 * it) or reclaimed from a dead worker.  Its part of the payload area is
 * then nobody else's.
 */
static void
WaitSlotFree(GpuivfRequestSlot *slot)
{
    for (;;)
    {
        int         state;

        SpinLockAcquire(&slot->mutex);
        state = slot->state;
        if (state == GPUIVF_REQ_SUBMITTED || state == GPUIVF_REQ_DONE)
        {
            slot->state = GPUIVF_REQ_FREE;
            state = GPUIVF_REQ_FREE;
        }
        SpinLockRelease(&slot->mutex);
        if (state == GPUIVF_REQ_FREE)
            return;
        if (ReclaimIfWorkerGone(slot))
            continue;
        (void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 10,
                         PG_WAIT_EXTENSION);
        ResetLatch(MyLatch);
        CHECK_FOR_INTERRUPTS();
    }
}

/*
 * n request slots of this backend, FREE and ready to fill, each with an
 * equal share of the backend's payload area (n = 1: all of it); false when
 * the library was not preloaded, this process has no slots or n is more
 * than it has.  Every slot of the backend is waited free first, used or
 * not: the shares of the last search may overlap this one's.
 */
bool
GpuivfMySlots(int n, GpuivfRequestSlot **slots)
{
    int         per;
    int         first;
    Size        share;

    if (GpuivfShmem == NULL || MyProc == NULL)
        return false;
    per = GpuivfShmem->slots_per_backend;
    first = MyProc->pgprocno * per;
    if (n < 1 || n > per || MyProc->pgprocno < 0 || first + per > GpuivfShmem->nslots)
        return false;
    if (!exit_callback_registered)
    {
        before_shmem_exit(AbandonAtExit, Int32GetDatum(first));
        exit_callback_registered = true;
    }

    for (int i = 0; i < per; i++)
        WaitSlotFree(&GpuivfShmem->slots[first + i]);
    share = n == 1 ? GpuivfShmem->payload_bytes
        : TYPEALIGN_DOWN(MAXIMUM_ALIGNOF, GpuivfShmem->payload_bytes / n);
    for (int i = 0; i < n; i++)
    {
        GpuivfRequestSlot *slot = &GpuivfShmem->slots[first + i];

        slot->abandoned = false;
        slot->result = GPUIVF_RESULT_OK;
        slot->fallback_ok = false;
        slot->sqlerrcode = 0;
        slot->message[0] = '\0';
        slot->detail[0] = '\0';
        slot->preferred_worker = -1;
        slot->target_worker = -1;
        slot->nshards = 1;
        slot->shard = 0;
        slot->codes_only = false;
        slot->dsm = DSM_HANDLE_INVALID;
        slot->taken_by = -1;
        slot->payload_off = (Size) i * share;
        slot->payload_cap = share;
        slots[i] = slot;
    }
    return true;
}

/* This backend's (first) request slot, with its whole payload area; NULL
 * when it has none (GpuivfMySlots). */
GpuivfRequestSlot *
GpuivfMySlot(void)
{
    GpuivfRequestSlot *slot;

    return GpuivfMySlots(1, &slot) ? slot : NULL;
}

/* Raise max_slot to cover slotno (workers look at slots below it). */
static void
CoverSlot(int slotno)
{
    uint32      cur = pg_atomic_read_u32(&GpuivfShmem->max_slot);

    while (cur < (uint32) slotno + 1)
    {
        if (pg_atomic_compare_exchange_u32(&GpuivfShmem->max_slot, &cur, (uint32) slotno + 1))
            break;
    }
}

/* Answer the request locally (no worker will): DONE with a "gone" result. */
static void
WithdrawUnanswered(GpuivfRequestSlot *slot, const char *why)
{
    SpinLockAcquire(&slot->mutex);
    if (slot->state == GPUIVF_REQ_SUBMITTED)
    {
        slot->result = GPUIVF_RESULT_WORKER_GONE;
        slot->fallback_ok = true;
        strlcpy(slot->message, why, sizeof(slot->message));
        slot->state = GPUIVF_REQ_DONE;
    }
    SpinLockRelease(&slot->mutex);
}

/*
 * Submit the filled slot (then GpuivfWaitAnswer, or GpuivfAbandonRequest
 * when the backend gives up on it).
 */
void
GpuivfSubmit(GpuivfRequestSlot *slot)
{
    int         slotno = (int) (slot - GpuivfShmem->slots);

    slot->submitted_at = GetCurrentTimestamp();
    CoverSlot(slotno);
    SpinLockAcquire(&slot->mutex);
    slot->state = GPUIVF_REQ_SUBMITTED;
    SpinLockRelease(&slot->mutex);
    GpuivfWakeWorker(slot->target_worker >= 0 ? slot->target_worker : slot->preferred_worker);
}

/*
 * Look at the slot for up to us microseconds, giving the core to any other
 * runnable process between looks; true when it is DONE (gpuivf.answer_spin).
 * Why: under load an answer takes a few hundred microseconds, and a backend
 * that sleeps on its latch for it costs a signal from the worker, a wake-up
 * through the kernel and a trip through the scheduler's sleep queue; one
 * that stays runnable and yields costs only context switches, and while it
 * yields its core runs the other backends (SetLatch sends no signal to a
 * backend that is not sleeping).  Interruptible like the latch wait.
 */
static bool
YieldUntilDone(GpuivfRequestSlot *slot, int us)
{
    instr_time  t0;
    instr_time  now;
    bool        done = false;

    pgstat_report_wait_start(PG_WAIT_EXTENSION);
    INSTR_TIME_SET_CURRENT(t0);
    for (;;)
    {
        pg_read_barrier();
        if (((volatile GpuivfRequestSlot *) slot)->state == GPUIVF_REQ_DONE)
        {
            done = true;
            break;
        }
        CHECK_FOR_INTERRUPTS();
        sched_yield();
        INSTR_TIME_SET_CURRENT(now);
        INSTR_TIME_SUBTRACT(now, t0);
        if (INSTR_TIME_GET_MICROSEC(now) >= (uint64) us)
            break;
    }
    pgstat_report_wait_end();
    return done;
}

/*
 * Wait until the submitted slot is DONE (then the caller reads the answer
 * and calls GpuivfReleaseSlot).  The wait is interruptible: an error or
 * FATAL (cancel, statement_timeout, terminate) withdraws or abandons the
 * request first.  It ends in bounded time when the worker disappears (100
 * ms checks: answered "gone").  It first looks without sleeping for
 * gpuivf.answer_spin microseconds (YieldUntilDone), then sleeps on the
 * latch, which the worker sets when it answers.  Returns false when
 * timeout_ms (counted from the submission; 0: no limit) passed first: the
 * request is then abandoned and the slot is no longer the caller's.
 */
bool
GpuivfWaitAnswer(GpuivfRequestSlot *slot, int timeout_ms)
{
    TimestampTz start = slot->submitted_at;
    volatile bool answered = true;
    bool        spun = false;

    PG_TRY();
    {
        for (;;)
        {
            int         state;

            SpinLockAcquire(&slot->mutex);
            state = slot->state;
            SpinLockRelease(&slot->mutex);
            if (state == GPUIVF_REQ_DONE)
                break;
            if (state == GPUIVF_REQ_TAKEN && ReclaimIfWorkerGone(slot))
                continue;
            if (state == GPUIVF_REQ_SUBMITTED && GpuivfReadyWorkers() == 0)
            {
                WithdrawUnanswered(slot, "no gpuivf GPU worker is ready");
                continue;
            }
            if (state == GPUIVF_REQ_SUBMITTED && slot->target_worker >= 0 &&
                !GpuivfWorkerReady(slot->target_worker))
            {
                char        why[GPUIVF_MESSAGE_LEN];

                /* only that worker holds the shard: nobody else may answer */
                snprintf(why, sizeof(why),
                         "gpuivf GPU worker %d, which holds shard %d of %d of the index, is not ready",
                         slot->target_worker, slot->shard, slot->nshards);
                WithdrawUnanswered(slot, why);
                continue;
            }
            if (timeout_ms > 0 &&
                TimestampDifferenceExceeds(start, GetCurrentTimestamp(), timeout_ms))
            {
                GpuivfAbandonRequest(slot);
                answered = false;
                break;
            }
            if (gpuivf_answer_spin > 0 && !spun)
            {
                spun = true;
                if (YieldUntilDone(slot, gpuivf_answer_spin))
                    continue;
            }
            (void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 100,
                             PG_WAIT_EXTENSION);
            ResetLatch(MyLatch);
            CHECK_FOR_INTERRUPTS();
        }
    }
    PG_CATCH();
    {
        GpuivfAbandonRequest(slot);
        PG_RE_THROW();
    }
    PG_END_TRY();
    return answered;
}

/* GpuivfSubmit + GpuivfWaitAnswer within gpuivf.worker_timeout. */
bool
GpuivfSubmitAndWait(GpuivfRequestSlot *slot)
{
    GpuivfSubmit(slot);
    return GpuivfWaitAnswer(slot, gpuivf_worker_timeout);
}

/* The backend has read the answer: the slot is FREE again. */
void
GpuivfReleaseSlot(GpuivfRequestSlot *slot)
{
    SpinLockAcquire(&slot->mutex);
    if (slot->state == GPUIVF_REQ_DONE || slot->state == GPUIVF_REQ_SUBMITTED)
        slot->state = GPUIVF_REQ_FREE;
    SpinLockRelease(&slot->mutex);
}

/* -------------------------------------------------------- worker side */

/*
 * Take up to max SUBMITTED requests (slot numbers out); requests meant for
 * another live worker are left to it.
 */
int
GpuivfTakeRequests(int worker, int *slotnos, int max)
{
    GpuivfWorkerSlot *me = &GpuivfShmem->workers[worker];
    uint32      nslots = pg_atomic_read_u32(&GpuivfShmem->max_slot);
    TimestampTz now = 0;
    int         n = 0;

    pg_memory_barrier();
    for (uint32 i = 0; i < nslots && n < max; i++)
    {
        GpuivfRequestSlot *slot = &GpuivfShmem->slots[i];
        bool        taken = false;

        if (slot->state != GPUIVF_REQ_SUBMITTED)   /* unlocked peek */
            continue;
        if (slot->target_worker >= 0 && slot->target_worker != worker)
            continue;           /* another worker's shard */
        if (slot->preferred_worker >= 0 && slot->preferred_worker != worker &&
            slot->preferred_worker < GpuivfShmem->nworkers &&
            GpuivfShmem->workers[slot->preferred_worker].state == GPUIVF_WORKER_READY)
            continue;
        if (now == 0)
            now = GetCurrentTimestamp();
        SpinLockAcquire(&slot->mutex);
        if (slot->state == GPUIVF_REQ_SUBMITTED &&
            (slot->target_worker < 0 || slot->target_worker == worker))
        {
            slot->state = GPUIVF_REQ_TAKEN;
            slot->taken_by = worker;
            slot->taken_incarnation = me->incarnation;
            slot->taken_at = now;
            taken = true;
        }
        SpinLockRelease(&slot->mutex);
        if (taken)
            slotnos[n++] = (int) i;
    }
    return n;
}

/* The answer is written: DONE and wake its backend (or free it if abandoned). */
void
GpuivfFinishRequest(int worker, int slotno)
{
    GpuivfRequestSlot *slot = &GpuivfShmem->slots[slotno];
    GpuivfWorkerSlot *me = &GpuivfShmem->workers[worker];

    pg_atomic_fetch_add_u64(&me->requests, 1);
    /* cpu_fallbacks are counted by the backend, which alone knows whether
     * it answers on the CPU (auto) or raises the error (gpu) */
    if (slot->result != GPUIVF_RESULT_OK)
        pg_atomic_fetch_add_u64(&me->errors, 1);
    if (slot->taken_at > slot->submitted_at)
        pg_atomic_fetch_add_u64(&me->queue_us, (uint64) (slot->taken_at - slot->submitted_at));

    SpinLockAcquire(&slot->mutex);
    if (slot->state == GPUIVF_REQ_TAKEN && slot->taken_by == worker)
    {
        if (slot->abandoned)
        {
            slot->abandoned = false;
            slot->state = GPUIVF_REQ_FREE;
        }
        else
            slot->state = GPUIVF_REQ_DONE;
    }
    SpinLockRelease(&slot->mutex);
    /* the system call of the wake-up is made by the worker's wake-up thread
     * when it runs (worker/bgworker/waker.cpp) */
    GpuivfWakeBackend(&GetPGProcByNumber(slotno / GpuivfShmem->slots_per_backend)->procLatch);
}

/* A worker on its way out answers everything it holds with "gone". */
void
GpuivfFailTakenRequests(int worker, uint64 incarnation, const char *why)
{
    uint32      nslots;

    if (GpuivfShmem == NULL)
        return;
    nslots = pg_atomic_read_u32(&GpuivfShmem->max_slot);
    for (uint32 i = 0; i < nslots; i++)
    {
        GpuivfRequestSlot *slot = &GpuivfShmem->slots[i];
        bool        mine;

        SpinLockAcquire(&slot->mutex);
        mine = slot->state == GPUIVF_REQ_TAKEN && slot->taken_by == worker &&
            slot->taken_incarnation == incarnation;
        SpinLockRelease(&slot->mutex);
        if (!mine)
            continue;
        slot->result = GPUIVF_RESULT_WORKER_GONE;
        slot->fallback_ok = true;
        strlcpy(slot->message, why, sizeof(slot->message));
        GpuivfFinishRequest(worker, (int) i);
    }
}
