/*
 * worker/bgworker/waker.cpp — the GPU worker's wake-up thread: sets the latches of the
 * backends whose answers are written, so that the worker's one thread does
 * not.
 *
 * Why.  Waking a backend that sleeps in WaitLatch is a kill(SIGURG) to
 * another process; the kernel then wakes that process on another CPU.  On
 * the GPU machine that cost the worker's thread about 3.5 µs per request —
 * under 64 clients 40 % of its time, more than it spent waiting for the
 * GPU — and that thread is the one that takes, batches and starts every
 * search.  Here the wake-ups go through a ring to a second thread of the
 * worker process, which makes the system calls while the worker goes on.
 *
 * Why a thread may do it.  SetLatch is the one PostgreSQL function the
 * thread calls, and PostgreSQL calls it from signal handlers: it touches only
 * the latch (shared memory, with barriers) and the owner's pid, allocates
 * nothing and cannot raise an error.  The thread blocks every signal (they
 * stay with the worker's main thread, where PostgreSQL's handlers run) and
 * calls nothing else of PostgreSQL; its ring is plain memory and atomics.
 *
 * Protocol.  One producer (the worker's main thread, GpuivfWakeBackend) and
 * one consumer (the thread): the producer writes a latch into ring[head] and
 * then advances head; the consumer sets ring[tail]'s latch and advances tail.
 * A full ring, or no thread, and the producer sets the latch itself.  The
 * thread spins for GPUIVF_WAKER_SPIN_US after its last wake-up (under load
 * the next batch comes sooner), then sleeps on a futex: it announces
 * `sleeping`, looks at the ring once more, and waits; the producer, after
 * publishing, takes `sleeping` back and wakes it — one system call per
 * batch, not per request.  Both sides order announcement and look with a
 * full barrier, so a wake-up is never lost.  A late wake-up is harmless
 * (the backend waits for its slot's DONE, which is written before), and so
 * is a stray one (latches allow spurious wake-ups).
 *
 * Stopping.  GpuivfWakerStop (the worker's exit callback) lets the thread
 * finish the ring and joins it; wake-ups after that are made directly.
 */
#include "gpuivf.h"
#include "worker/worker.h"
#include "worker/protocol.h"
#include "worker/bgworker/bgworker.h"

#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "portability/instr_time.h"
#include "port/atomics.h"
#include "storage/latch.h"

#define GPUIVF_WAKER_RING       4096    /* latches in flight (power of two) */
#define GPUIVF_WAKER_SPIN_US    50      /* spin this long before sleeping */

bool        gpuivf_wake_thread = true;

static Latch *WakeRing[GPUIVF_WAKER_RING];
static pg_atomic_uint64 WakeHead;   /* next slot the producer writes */
static pg_atomic_uint64 WakeTail;   /* next slot the thread reads */
static pg_atomic_uint32 WakerSleeping;
static pg_atomic_uint32 WakerStopping;
static pthread_t WakerThread;
static bool WakerRunning = false;

static long
Futex(pg_atomic_uint32 *word, int op, uint32 val)
{
    /* a 1 s limit: a sleeping thread looks at `stopping` now and then */
    struct timespec limit = {1, 0};

    return syscall(SYS_futex, (uint32 *) &word->value, op, val,
                   op == FUTEX_WAIT_PRIVATE ? &limit : NULL, NULL, 0);
}

/* The thread: set the latches of the ring, spin a while, sleep. */
static void *
WakerMain(void *)
{
    instr_time  last;           /* the last wake-up (or sleep) */
    instr_time  idle;

    INSTR_TIME_SET_CURRENT(last);
    for (;;)
    {
        uint64      tail = pg_atomic_read_u64(&WakeTail);
        uint64      head = pg_atomic_read_u64(&WakeHead);

        if (tail != head)
        {
            pg_read_barrier();  /* the entry after the head that covers it */
            while (tail != head)
            {
                SetLatch(WakeRing[tail & (GPUIVF_WAKER_RING - 1)]);
                tail++;
                pg_atomic_write_u64(&WakeTail, tail);
            }
            INSTR_TIME_SET_CURRENT(last);
            continue;
        }
        if (pg_atomic_read_u32(&WakerStopping) != 0)
            break;
        INSTR_TIME_SET_CURRENT(idle);
        INSTR_TIME_SUBTRACT(idle, last);
        if (INSTR_TIME_GET_MICROSEC(idle) < GPUIVF_WAKER_SPIN_US)
        {
            pg_spin_delay();
            continue;
        }
        pg_atomic_write_u32(&WakerSleeping, 1);
        pg_memory_barrier();
        if (pg_atomic_read_u64(&WakeHead) == tail && pg_atomic_read_u32(&WakerStopping) == 0)
            (void) Futex(&WakerSleeping, FUTEX_WAIT_PRIVATE, 1);
        pg_atomic_write_u32(&WakerSleeping, 0);
        INSTR_TIME_SET_CURRENT(last);
    }
    return NULL;
}

/* Start the thread (the GPU worker, once its engine is up); false when it
 * could not be started (wake-ups are then made directly). */
bool
GpuivfWakerStart(void)
{
    sigset_t    all;
    sigset_t    old;
    int         rc;

    if (WakerRunning || !gpuivf_wake_thread)
        return WakerRunning;
    pg_atomic_init_u64(&WakeHead, 0);
    pg_atomic_init_u64(&WakeTail, 0);
    pg_atomic_init_u32(&WakerSleeping, 0);
    pg_atomic_init_u32(&WakerStopping, 0);
    /* the thread inherits a mask with every signal blocked */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&WakerThread, NULL, WakerMain, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
    {
        ereport(LOG,
                (errmsg("gpuivf GPU worker wakes backends from its main thread: could not start a thread: %s",
                        strerror(rc))));
        return false;
    }
    WakerRunning = true;
    return true;
}

/* Let the thread finish the ring and join it. */
void
GpuivfWakerStop(void)
{
    if (!WakerRunning)
        return;
    pg_atomic_write_u32(&WakerStopping, 1);
    pg_memory_barrier();
    if (pg_atomic_exchange_u32(&WakerSleeping, 0) != 0)
        (void) Futex(&WakerSleeping, FUTEX_WAKE_PRIVATE, 1);
    pthread_join(WakerThread, NULL);
    WakerRunning = false;
}

/* Wake the backend that owns latch: through the thread when it runs and
 * the ring has room, else here. */
void
GpuivfWakeBackend(Latch *latch)
{
    uint64      head;

    if (!WakerRunning)
    {
        SetLatch(latch);
        return;
    }
    head = pg_atomic_read_u64(&WakeHead);
    if (head - pg_atomic_read_u64(&WakeTail) >= GPUIVF_WAKER_RING)
    {
        SetLatch(latch);
        return;
    }
    WakeRing[head & (GPUIVF_WAKER_RING - 1)] = latch;
    pg_write_barrier();         /* the entry before the head that covers it */
    pg_atomic_write_u64(&WakeHead, head + 1);
    pg_memory_barrier();        /* head published before `sleeping` is read */
    if (pg_atomic_read_u32(&WakerSleeping) != 0 &&
        pg_atomic_exchange_u32(&WakerSleeping, 0) != 0)
        (void) Futex(&WakerSleeping, FUTEX_WAKE_PRIVATE, 1);
}
