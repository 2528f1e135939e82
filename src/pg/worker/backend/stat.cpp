/*
 * worker/backend/stat.cpp — what the GPU workers publish in shared memory,
 * read by a backend: the gpuivf_stat() rows (the gpuivf_stat view) and where
 * an index is cached ("gpu_cache" of gpuivf_index_info).
 */
#include "gpuivf.h"
#include "worker/worker.h"
#include "worker/protocol.h"
#include "worker/backend/backend.h"

/* ------------------------------------------------- gpuivf_index_info */

/* Appends "gpu_cache": [{worker, device, version, vectors, bytes, shard,
 * shards}, ...]: shards 1 is a whole copy, else the copy of lists
 * l % shards = shard. */
void
GpuivfAppendCacheInfo(StringInfo json, Relation index)
{
    bool        first = true;

    appendStringInfoString(json, "\"gpu_cache\": [");
    for (int i = 0; GpuivfShmem != NULL && i < GpuivfShmem->nworkers; i++)
    {
        GpuivfWorkerSlot *w = &GpuivfShmem->workers[i];
        GpuivfShownIndex shown[GPUIVF_MAX_SHOWN_INDEXES];
        int         n;
        int         device;

        SpinLockAcquire(&w->mutex);
        n = Min(w->nindexes, GPUIVF_MAX_SHOWN_INDEXES);
        device = w->device;
        memcpy(shown, w->shown, sizeof(GpuivfShownIndex) * n);
        SpinLockRelease(&w->mutex);
        for (int j = 0; j < n; j++)
        {
            if (shown[j].dboid != MyDatabaseId || shown[j].relnode != index->rd_node.relNode ||
                shown[j].indexoid != RelationGetRelid(index))
                continue;
            appendStringInfo(json, "%s{\"worker\": %d, \"device\": %d, \"version\": " UINT64_FORMAT
                             ", \"vectors\": " INT64_FORMAT ", \"bytes\": " INT64_FORMAT
                             ", \"shard\": %d, \"shards\": %d, \"rerank\": \"%s\"}",
                             first ? "" : ", ", i, device, shown[j].version,
                             shown[j].vectors, shown[j].bytes, shown[j].shard,
                             Max(shown[j].nshards, 1), shown[j].codes_only ? "host" : "gpu");
            first = false;
        }
    }
    appendStringInfoString(json, "], ");
}

/* ------------------------------------------------------- gpuivf_stat */

static const char *
WorkerStateName(int state)
{
    switch (state)
    {
        case GPUIVF_WORKER_STARTING:
            return "starting";
        case GPUIVF_WORKER_READY:
            return "ready";
        case GPUIVF_WORKER_NO_GPU:
            return "no gpu";
        case GPUIVF_WORKER_STOPPED:
            return "stopped";
        default:
            return "not started";
    }
}

extern "C" {
PG_FUNCTION_INFO_V1(gpuivf_stat);
}

/* gpuivf_stat(): one row per GPU worker (none when not preloaded). */
Datum
gpuivf_stat(PG_FUNCTION_ARGS)
{
    ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

    InitMaterializedSRF(fcinfo, 0);
    if (GpuivfShmem == NULL)
        return (Datum) 0;
    for (int i = 0; i < GpuivfShmem->nworkers; i++)
    {
        GpuivfWorkerSlot *w = &GpuivfShmem->workers[i];
        Datum       values[23];
        bool        nulls[23];
        int         state, pid, device, nindexes;
        int64       bytes;
        char        name[128];
        char        message[GPUIVF_MESSAGE_LEN];
        TimestampTz started;
        uint64      requests = pg_atomic_read_u64(&w->requests);
        uint64      queries = pg_atomic_read_u64(&w->queries);
        uint64      batches = pg_atomic_read_u64(&w->batches);
        uint64      fallbacks = pg_atomic_read_u64(&w->cpu_fallbacks);
        int         c = 0;

        SpinLockAcquire(&w->mutex);
        state = w->state;
        pid = w->pid;
        device = w->device;
        nindexes = w->nindexes;
        bytes = w->bytes_cached;
        started = w->started_at;
        strlcpy(name, w->device_name, sizeof(name));
        strlcpy(message, w->message, sizeof(message));
        SpinLockRelease(&w->mutex);
        if (i == 0)
            fallbacks += pg_atomic_read_u64(&GpuivfShmem->fallbacks_no_worker);

        memset(nulls, 0, sizeof(nulls));
        values[c++] = Int32GetDatum(i);
        values[c] = Int32GetDatum(pid);
        nulls[c++] = pid == 0;
        values[c++] = CStringGetTextDatum(WorkerStateName(state));
        values[c] = Int32GetDatum(device);
        nulls[c++] = device < 0;
        values[c] = CStringGetTextDatum(name);
        nulls[c++] = name[0] == '\0';
        values[c++] = Int64GetDatum((int64) requests);
        values[c++] = Int64GetDatum((int64) queries);
        values[c++] = Int64GetDatum((int64) batches);
        values[c] = Float8GetDatum(batches > 0 ? (double) queries / batches : 0.0);
        nulls[c++] = batches == 0;
        values[c++] = Int64GetDatum((int64) pg_atomic_read_u64(&w->max_batch));
        values[c] = Float8GetDatum(requests > 0 ?
                                   (double) pg_atomic_read_u64(&w->queue_us) / 1000.0 / requests : 0.0);
        nulls[c++] = requests == 0;
        values[c++] = Float8GetDatum((double) pg_atomic_read_u64(&w->gpu_us) / 1000.0);
        values[c++] = Int32GetDatum(nindexes);
        values[c++] = Int64GetDatum(bytes);
        values[c++] = Int64GetDatum((int64) fallbacks);
        values[c++] = Int64GetDatum((int64) pg_atomic_read_u64(&w->errors));
        values[c++] = Int64GetDatum((int64) pg_atomic_read_u64(&w->loads));
        values[c++] = Int64GetDatum((int64) pg_atomic_read_u64(&w->refreshes));
        values[c++] = Int64GetDatum((int64) pg_atomic_read_u64(&w->evictions));
        values[c++] = Int64GetDatum((int64) pg_atomic_read_u64(&w->builds));
        values[c++] = Int64GetDatum((int64) pg_atomic_read_u64(&w->exact_knn));
        values[c] = CStringGetTextDatum(message);
        nulls[c++] = message[0] == '\0';
        values[c] = TimestampTzGetDatum(started);
        nulls[c++] = started == 0;
        Assert(c == 23);
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
    return (Datum) 0;
}
