/*
 * am/build_commands.cpp — the commands a build's leader has its parallel
 * workers work on (training on the CPU: build_train.cpp; the calibration's
 * exact top-k: build_truth.cpp).
 *
 * The leader publishes a command of a number of items; every participant
 * (the leader included) claims items one at a time until none is left, and
 * the leader waits until all are done.  A claim is tied to its command's
 * generation (one atomic counter holds both), so a late worker never claims
 * an item of a command it has not read.  All waiting is in PostgreSQL code:
 * an error or a cancel raised there (a worker's error is re-raised by the
 * leader) leaves no engine frame behind.
 */
#include "gpuivf.h"
#include "am/build.h"

void
GpuivfCommandsInit(GpuivfCommands *c)
{
    memset(c, 0, sizeof(GpuivfCommands));
    SpinLockInit(&c->mutex);
    c->command = GPUIVF_COMMAND_IDLE;
    ConditionVariableInit(&c->workcv);
    ConditionVariableInit(&c->donecv);
    pg_atomic_init_u64(&c->claim, 0);
    pg_atomic_init_u64(&c->done, 0);
}

Size
GpuivfLayoutArrays(Size head_size, const Size *bytes, int n, Size *off)
{
    Size        size = MAXALIGN(head_size);

    for (int i = 0; i < n; i++)
    {
        off[i] = size;
        size = add_size(size, MAXALIGN(bytes[i]));
    }
    return size;
}

/* The next item of generation gen's command, or -1 when none is left (or
 * the leader has moved on to a newer command). */
int64
GpuivfClaimItem(GpuivfCommands *c, uint32 gen, int64 items)
{
    uint64      cur = pg_atomic_read_u64(&c->claim);

    for (;;)
    {
        if ((uint32) (cur >> 32) != gen || (int64) (cur & 0xFFFFFFFF) >= items)
            return -1;
        if (pg_atomic_compare_exchange_u64(&c->claim, &cur, cur + 1))
            return (int64) (cur & 0xFFFFFFFF);
    }
}

/* count items of the command (of `items`) are done. */
void
GpuivfItemsDone(GpuivfCommands *c, int64 count, int64 items)
{
    if (count > 0 && (int64) pg_atomic_add_fetch_u64(&c->done, (uint64) count) == items)
        ConditionVariableSignal(&c->donecv);
}

/* A parallel worker: every command until EXIT, each by participate(). */
void
GpuivfServeCommands(GpuivfCommands *c, GpuivfParticipateFn participate, void *arg)
{
    uint32      seen = 0;

    for (;;)
    {
        uint32      gen;
        int         command;
        int64       items;

        SpinLockAcquire(&c->mutex);
        gen = c->generation;
        command = c->command;
        items = c->items;
        SpinLockRelease(&c->mutex);
        if (gen == seen)
        {
            ConditionVariableSleep(&c->workcv, WAIT_EVENT_PARALLEL_CREATE_INDEX_SCAN);
            continue;
        }
        ConditionVariableCancelSleep();
        seen = gen;
        if (command == GPUIVF_COMMAND_EXIT)
            break;
        participate(c, gen, command, items, arg);
    }
}

/* The leader: publish a command of `items` items, do its share by
 * participate(), wait for the rest (EXIT: the workers leave, nothing to
 * wait for). */
void
GpuivfRunCommand(GpuivfCommands *c, int command, int64 items, GpuivfParticipateFn participate,
                 void *arg)
{
    uint32      gen;

    Assert(items < ((int64) 1 << 32));
    pg_atomic_write_u64(&c->done, 0);
    gen = c->generation + 1;    /* only the leader writes it */
    /* claims open before a worker can read gen below; a full barrier, so
     * whoever claims an item of gen sees what the leader wrote before */
    (void) pg_atomic_exchange_u64(&c->claim, (uint64) gen << 32);
    SpinLockAcquire(&c->mutex);
    c->generation = gen;
    c->command = command;
    c->items = items;
    SpinLockRelease(&c->mutex);
    ConditionVariableBroadcast(&c->workcv);
    if (command == GPUIVF_COMMAND_EXIT)
        return;

    participate(c, gen, command, items, arg);
    while ((int64) pg_atomic_read_u64(&c->done) < items)
        ConditionVariableSleep(&c->donecv, WAIT_EVENT_PARALLEL_CREATE_INDEX_SCAN);
    ConditionVariableCancelSleep();
    pg_read_barrier();          /* what the workers wrote */
}
