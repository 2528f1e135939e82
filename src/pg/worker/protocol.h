/*
 * worker/protocol.h — the GPU worker protocol, shared by both of its sides
 * (worker/backend/, worker/bgworker/) and private to them: the shared-memory
 * layout of the worker slots and the request queue (queue.cpp), the request
 * kinds, and the layouts of the request payloads.  Everything else sees only
 * worker/worker.h.  The protocol is described in README.md ("GPU worker").
 *
 * The GPU engine's header (cuda/include/gpuivf_cuda.h) is a plain C header
 * (stddef.h, stdint.h): it is included for its types and limits only.
 * gpuivf.so never links the engine; the worker dlopen()s
 * $libdir/gpuivf_gpu.so (worker/bgworker/engine.cpp), so backends and the
 * postmaster never map CUDA.
 */
#ifndef GPUIVF_WORKER_PROTOCOL_H
#define GPUIVF_WORKER_PROTOCOL_H

#include "gpuivf.h"
#include "worker/worker.h"

#include "../../../cuda/include/gpuivf_cuda.h"

StaticAssertDecl(GPUIVF_GPU_MAX_K == GPUIVF_CUDA_MAX_K &&
                 GPUIVF_GPU_MAX_NPROBE == GPUIVF_CUDA_MAX_NPROBE,
                 "worker.h's GPU limits are the engine's");

#define GPUIVF_MAX_WORKERS          16      /* GPUs served by one cluster */
#define GPUIVF_MAX_SHOWN_INDEXES    32      /* cached indexes listed per worker */
#define GPUIVF_MESSAGE_LEN          256

/* ------------------------------------------------------------ worker slot */
typedef enum GpuivfWorkerState
{
    GPUIVF_WORKER_UNUSED = 0,   /* never started (or not registered) */
    GPUIVF_WORKER_STARTING,     /* loading the engine, creating the context */
    GPUIVF_WORKER_READY,        /* takes requests */
    GPUIVF_WORKER_NO_GPU,       /* up, but has no usable GPU: message says why */
    GPUIVF_WORKER_STOPPED       /* exited; the postmaster restarts it */
} GpuivfWorkerState;

/* An index a worker holds on its GPU, as gpuivf_index_info shows it. */
typedef struct GpuivfShownIndex
{
    Oid         dboid;
    Oid         relnode;        /* relfilenode */
    Oid         indexoid;
    uint64      version;        /* version of the rows the copy holds */
    int64       vectors;
    int64       bytes;          /* device memory */
    TimestampTz loaded_at;
    TimestampTz last_used;
    int         nshards;        /* 1: the whole index; else this copy holds */
    int         shard;          /* the lists l with l % nshards == shard */
    bool        codes_only;     /* no vectors: the backends re-rank */
} GpuivfShownIndex;

/*
 * Worker and request slots start on a cache line of their own
 * (PG_CACHE_LINE_SIZE; shared memory is allocated line-aligned): a backend
 * spinning on its slot's mutex and state then shares no line with the
 * answer its neighbour's slot is being written, nor with a worker slot.
 */
typedef struct alignas(PG_CACHE_LINE_SIZE) GpuivfWorkerSlot
{
    slock_t     mutex;          /* protects everything but the atomics */
    int         state;          /* GpuivfWorkerState; written under mutex,
                                 * also read without it (queue.cpp) */
    int         pid;
    uint64      incarnation;    /* +1 at every start of this slot's worker */
    int         device;         /* CUDA device ordinal */
    Latch      *latch;          /* the worker's, set to wake it */
    pg_atomic_uint32 idle;      /* 1 while it may sleep: submitters wake it */
    char        device_name[128];
    char        message[GPUIVF_MESSAGE_LEN];   /* why NO_GPU / last fatal error */
    int64       memory_limit;   /* bytes the cache may use */
    TimestampTz started_at;

    /* statistics (gpuivf_stat); the worker adds, anyone reads */
    pg_atomic_uint64 requests;      /* requests answered (any result) */
    pg_atomic_uint64 queries;       /* queries searched on the GPU */
    pg_atomic_uint64 batches;       /* engine search calls */
    pg_atomic_uint64 max_batch;     /* most queries in one call */
    pg_atomic_uint64 queue_us;      /* sum over requests: submit -> taken */
    pg_atomic_uint64 gpu_us;        /* sum over batches: engine call time */
    pg_atomic_uint64 errors;        /* requests answered with an error (or "gone") */
    pg_atomic_uint64 cpu_fallbacks; /* queries the CPU answered instead (counted by
                                     * backends, gpuivf.device = auto) */
    pg_atomic_uint64 loads;         /* full index loads */
    pg_atomic_uint64 refreshes;     /* incremental catch-ups */
    pg_atomic_uint64 evictions;
    pg_atomic_uint64 builds;        /* CREATE INDEX work done here */
    pg_atomic_uint64 exact_knn;     /* exact kNN requests (ANALYZE ground truth) */

    /* the cache, published after every change (under mutex) */
    int         nindexes;
    int64       bytes_cached;
    GpuivfShownIndex shown[GPUIVF_MAX_SHOWN_INDEXES];
} GpuivfWorkerSlot;

/* ----------------------------------------------------------- request slot */

typedef enum GpuivfRequestState
{
    GPUIVF_REQ_FREE = 0,
    GPUIVF_REQ_SUBMITTED,       /* filled by its backend, waiting for a worker */
    GPUIVF_REQ_TAKEN,           /* a worker works on it; the payload is the worker's */
    GPUIVF_REQ_DONE             /* result written; the backend reads and frees it */
} GpuivfRequestState;

typedef enum GpuivfRequestKind
{
    GPUIVF_KIND_SEARCH = 1,     /* batched IVF-PQ search of one index */
    GPUIVF_KIND_TRAIN,          /* CREATE INDEX: k-means + PQ on a sample (DSM) */
    GPUIVF_KIND_ENCODE,         /* CREATE INDEX: lists + codes of a batch (DSM) */
    GPUIVF_KIND_EXACT_KNN,      /* ANALYZE: exact top-k of queries among rows (DSM) */
    GPUIVF_KIND_LOAD            /* load or catch up an index's GPU copy (no data) */
} GpuivfRequestKind;

typedef enum GpuivfResultCode
{
    GPUIVF_RESULT_OK = 0,
    GPUIVF_RESULT_ERROR,        /* raise sqlerrcode + message (CPU under auto when
                                 * fallback_ok) */
    GPUIVF_RESULT_WORKER_GONE   /* the worker exited before answering */
} GpuivfResultCode;

/*
 * Request slots belong to PGPROCs: slots_per_backend of them each (one, or
 * one per worker when there are several, so that a sharded search asks
 * every shard at once), slot number = pgprocno * slots_per_backend + i, so
 * a backend never competes for a slot.  Each PGPROC has one payload area of
 * gpuivf.request_buffer bytes; a request uses the part of it its slot names
 * (payload_off, payload_cap): all of it for the first slot alone, an equal
 * share each when a sharded search uses several (GpuivfMySlots).
 */
typedef struct alignas(PG_CACHE_LINE_SIZE) GpuivfRequestSlot
{
    slock_t     mutex;          /* state, abandoned, taken_* */
    int         state;          /* GpuivfRequestState */
    bool        abandoned;      /* the backend left while TAKEN: worker frees it */
    int         taken_by;       /* worker number */
    uint64      taken_incarnation;
    TimestampTz submitted_at;
    TimestampTz taken_at;

    /* the request (written by the backend before SUBMITTED) */
    int         kind;           /* GpuivfRequestKind */
    int         preferred_worker;   /* -1: any */
    int         target_worker;  /* -1: any; else only this worker takes it
                                 * (a shard's search, see "Sharding") */
    int         nshards;        /* 1: the whole index; else search (and hold)
                                 * only the lists of shard `shard` */
    int         shard;
    bool        codes_only;     /* a copy of codes and entry ids only: the
                                 * search returns ADC candidates, the backend
                                 * re-ranks them ("Larger than the GPU") */
    Oid         dboid;
    Oid         indexoid;
    RelFileNode node;
    bool        permanent;      /* RELPERSISTENCE_PERMANENT (for ReadBuffer) */
    bool        lsn_reliable;   /* RelationNeedsWAL: page LSNs move with changes */
    uint64      train_id;       /* metapage as the backend saw it */
    uint64      version;        /* of its rows, read after the snapshot
                                 * (GpuivfReadRows): in LSN space when
                                 * lsn_reliable, else the generation */
    int         dims;
    int         metric;         /* gpuivf::Metric (TRAIN / ENCODE) */
    int         nq;
    int         kmax;           /* result stride: the largest k of the queries */
    dsm_handle  dsm;            /* TRAIN / ENCODE / EXACT_KNN data */
    int64       arg[4];         /* TRAIN / ENCODE / EXACT_KNN parameters */
    Size        payload_off;    /* SEARCH: its part of the backend's payload */
    Size        payload_cap;    /* area (GpuivfSlotPayload, GpuivfSlotCapacity) */

    /* the answer (written by the worker before DONE) */
    int         result;         /* GpuivfResultCode */
    bool        fallback_ok;    /* the CPU may answer instead (device = auto) */
    int         sqlerrcode;
    char        message[GPUIVF_MESSAGE_LEN];
    char        detail[GPUIVF_MESSAGE_LEN];
    int         batch_size;     /* most queries of an engine call it rode in */
    double      gpu_ms;         /* engine time of the calls it rode in */
    double      queue_ms;
    int64       reranked;       /* candidates re-ranked exactly, all its queries */
} GpuivfRequestSlot;

typedef struct GpuivfShared
{
    int         nworkers;       /* registered at start-up */
    int         nslots;         /* MaxBackends * slots_per_backend */
    int         slots_per_backend;
    Size        payload_bytes;  /* per backend (PGPROC) */
    pg_atomic_uint32 max_slot;  /* 1 + highest slot ever submitted to */
    pg_atomic_uint64 fallbacks_no_worker;  /* requests no worker could take */
    GpuivfWorkerSlot workers[GPUIVF_MAX_WORKERS];
    GpuivfRequestSlot slots[FLEXIBLE_ARRAY_MEMBER];
} GpuivfShared;

/*
 * Sharding (README.md, "GPU worker", "Sharding").  An index whose GPU copy
 * does not fit one worker (or gpuivf.shards forces it) is split by lists:
 * list l belongs to shard l % nshards, shard s is held by worker s.  Every
 * shard holds the whole model, so coarse quantization is the same
 * everywhere; a search asks every shard for its best candidates by ADC
 * score among the probed lists it holds, with their exact distances, and
 * the backend merges them (worker/backend/search.cpp).
 */
extern int  gpuivf_shards;              /* gpuivf.shards: 0 auto, 1 never, n force */

static inline int
GpuivfListShard(uint32 list, int nshards)
{
    return nshards > 1 ? (int) (list % (uint32) nshards) : 0;
}

/* Device memory a copy of (one shard of) an index of meta's shape needs,
 * roughly (engine layout: 16-byte code chunks, 8-byte ids, a 4-byte term,
 * vectors unless codes_only, 25% headroom; the model is on every shard). */
static inline int64
GpuivfEstimateGpuBytes(const GpuivfMetaPageData *meta, int nshards, bool codes_only)
{
    double      per = (double) (TYPEALIGN(16, meta->code_size) + 8 + 4);

    if (GpuivfMetaStoresVectors(meta) && !codes_only)
        per += (double) GpuivfStorageElemSize(meta->storage) * meta->dims;
    return (int64) ((double) meta->vectors * per * 1.25 / Max(nshards, 1)) +
        (int64) meta->lists * meta->dims * 4 +
        (int64) GpuivfCodebookFloats((int) meta->dims, meta->pq_m, meta->pq_bits) * 4;
}

/*
 * Search payload, in the slot's buffer: per query k[nq], nprobe[nq] and
 * rerank[nq] (int32 each: GpuivfQuery's fields, so that every query keeps
 * its own candidate count whatever it is batched with), vectors[nq * dims]
 * (float4); then the answer: nhits[nq] (int32), ids[nq * kmax] (uint64 heap
 * TIDs), distances[nq * kmax] (float8); a shard's search (with_adc) also
 * adc[nq * kmax] (float8: the ADC distance each candidate was selected by).
 */
typedef struct GpuivfSearchLayout
{
    Size        k_off, nprobe_off, rerank_off, vec_off, nhits_off, ids_off, dist_off, adc_off,
                total;
} GpuivfSearchLayout;

static inline GpuivfSearchLayout
GpuivfSearchPayloadLayout(int nq, int dims, int kmax, bool with_adc = false)
{
    GpuivfSearchLayout l;
    Size        off = 0;

    l.k_off = off;
    off += MAXALIGN(sizeof(int32) * nq);
    l.nprobe_off = off;
    off += MAXALIGN(sizeof(int32) * nq);
    l.rerank_off = off;
    off += MAXALIGN(sizeof(int32) * nq);
    l.vec_off = off;
    off += MAXALIGN(sizeof(float4) * (Size) nq * dims);
    l.nhits_off = off;
    off += MAXALIGN(sizeof(int32) * nq);
    l.ids_off = off;
    off += MAXALIGN(sizeof(uint64) * (Size) nq * kmax);
    l.dist_off = off;
    off += MAXALIGN(sizeof(float8) * (Size) nq * kmax);
    l.adc_off = off;
    if (with_adc)
        off += MAXALIGN(sizeof(float8) * (Size) nq * kmax);
    l.total = off;
    return l;
}
/* queue.cpp */
extern GpuivfShared *GpuivfShmem;
void        GpuivfShmemRequest(void);       /* shmem_request_hook */
void        GpuivfShmemStartup(void);       /* shmem_startup_hook */
char       *GpuivfSlotPayload(int slotno);
Size        GpuivfSlotCapacity(int slotno);    /* 0: the slot's part is malformed */
bool        GpuivfWorkerAlive(const GpuivfWorkerSlot *w, uint64 incarnation);
int         GpuivfReadyWorkers(void);
bool        GpuivfWorkerReady(int worker);
void        GpuivfWakeWorker(int preferred);
/* backend side: submit the filled slot of this backend and wait for DONE;
 * interruptible (cancel, timeout, exit leave the queue consistent) */
GpuivfRequestSlot *GpuivfMySlot(void);
/* n slots of this backend at once (at most one per worker), each with an
 * equal share of its payload area (a sharded search); false when this
 * process has none */
bool        GpuivfMySlots(int n, GpuivfRequestSlot **slots);
bool        GpuivfSubmitAndWait(GpuivfRequestSlot *slot);   /* false: timed out */
/* the same in two steps (a build encodes its next batch meanwhile), with
 * the wait's limit given (0: none, for builds and exact kNN) */
void        GpuivfSubmit(GpuivfRequestSlot *slot);
/* polls the slot for gpuivf.answer_spin µs, then sleeps on the latch */
extern int  gpuivf_answer_spin;
bool        GpuivfWaitAnswer(GpuivfRequestSlot *slot, int timeout_ms);  /* false: timed out */
void        GpuivfAbandonRequest(GpuivfRequestSlot *slot);
void        GpuivfReleaseSlot(GpuivfRequestSlot *slot);
/* worker side */
int         GpuivfTakeRequests(int worker, int *slotnos, int max);
void        GpuivfFinishRequest(int worker, int slotno);
void        GpuivfFailTakenRequests(int worker, uint64 incarnation, const char *why);

/*
 * EXACT_KNN data, in the request's DSM segment: queries[nq * dims],
 * base[batch_cap * dims] (float4), then the answer: scores[nq * kk]
 * (float4, internal scores), ids[nq * kk] (uint64 base row numbers,
 * UINT64_MAX padding).  arg[0] = rows in base, arg[1] = kk,
 * arg[2] = batch_cap.
 */
typedef struct GpuivfExactKnnLayout
{
    Size        queries_off, base_off, scores_off, ids_off, total;
} GpuivfExactKnnLayout;

static inline GpuivfExactKnnLayout
GpuivfExactKnnPayloadLayout(int nq, int dims, int kk, int64 batch_cap)
{
    GpuivfExactKnnLayout l;
    Size        off = 0;

    l.queries_off = off;
    off += MAXALIGN(sizeof(float4) * (Size) nq * dims);
    l.base_off = off;
    off += MAXALIGN(sizeof(float4) * (Size) batch_cap * dims);
    l.scores_off = off;
    off += MAXALIGN(sizeof(float4) * (Size) nq * kk);
    l.ids_off = off;
    off += MAXALIGN(sizeof(uint64) * (Size) nq * kk);
    l.total = off;
    return l;
}

/*
 * ENCODE data, one DSM segment per index build: a header, the model
 * (centroids, codebook), then two batch areas, so that the backend fills
 * one while the worker encodes the other.  An area holds raw[cap * dims]
 * (float4, as given), then the answer: lists[cap] (int32) and
 * codes[cap * code_size].  arg[0] = rows in the batch, arg[1] = area.
 */
typedef struct GpuivfEncodeHeader
{
    int64       cap;            /* rows per area */
    int32       lists;
    int32       pq_m;
    int32       pq_bits;
    int32       code_size;
} GpuivfEncodeHeader;

typedef struct GpuivfEncodeLayout
{
    Size        centroids_off, codebook_off, area_off[2];
    Size        raw_off, lists_off, codes_off;  /* within an area */
    Size        total;
} GpuivfEncodeLayout;

static inline GpuivfEncodeLayout
GpuivfEncodePayloadLayout(const GpuivfEncodeHeader *h, int dims)
{
    GpuivfEncodeLayout l;
    Size        off = MAXALIGN(sizeof(GpuivfEncodeHeader));
    Size        area;

    l.centroids_off = off;
    off += MAXALIGN(sizeof(float4) * (Size) h->lists * dims);
    l.codebook_off = off;
    off += MAXALIGN(sizeof(float4) * GpuivfCodebookFloats(dims, h->pq_m, h->pq_bits));
    l.raw_off = 0;
    l.lists_off = MAXALIGN(sizeof(float4) * (Size) h->cap * dims);
    l.codes_off = l.lists_off + MAXALIGN(sizeof(int32) * (Size) h->cap);
    area = l.codes_off + MAXALIGN((Size) h->code_size * h->cap);
    l.area_off[0] = off;
    l.area_off[1] = off + area;
    l.total = off + 2 * area;
    return l;
}
#endif                          /* GPUIVF_WORKER_PROTOCOL_H */
