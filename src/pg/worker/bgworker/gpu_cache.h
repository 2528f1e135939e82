/*
 * worker/bgworker/gpu_cache.h — private to gpu_cache.cpp (the cache of GPU
 * copies: lookup, loading, eviction) and gpu_sync.cpp (catching a copy up
 * with the pages): a copy, its host-side page mirror, and a walk of the list
 * chains.
 */
#ifndef GPUIVF_GPU_CACHE_H
#define GPUIVF_GPU_CACHE_H

#include "gpuivf.h"
#include "worker/bgworker/bgworker.h"

#define GPUIVF_MAX_CACHED       64
#define GPUIVF_ADD_CHUNK_BYTES  ((Size) 64 * 1024 * 1024)

typedef struct PageMirror
{
    BlockNumber blkno;          /* hash key */
    XLogRecPtr  lsn;
    int32       list;
    int32       nentries;
    uint64     *tids;           /* entry TIDs as on the page, page order */
    uint64     *ids;            /* heap ids on the GPU; UINT64_MAX: not added */
} PageMirror;

typedef struct GpuIndex
{
    bool        in_use;
    Oid         dboid;
    Oid         indexoid;
    RelFileNode node;
    bool        permanent;
    uint64      train_id;
    int         nshards;        /* 1, or this copy holds only the lists of */
    int         shard;          /* shard `shard` (worker/protocol.h, "Sharding") */
    bool        codes_only;     /* codes and entry ids, no vectors: searches
                                 * return ADC candidates (entry ids) */
    GpuivfMetaPageData meta;    /* shape of the model */
    uint64      version;        /* every change of the rows up to this version
                                 * (storage/storage.h) is on the GPU */
    bool        version_is_lsn; /* of the LSN kind (the requests' lsn_reliable) */
    uint64      walk_generation;    /* the metapage generation when the last
                                     * walk began */
    gpuivf_cuda_index *gindex;
    MemoryContext cxt;          /* mirror */
    HTAB       *pages;
    uint64     *list_changes;   /* per list, its change count when the last
                                 * walk read it (list_changes.cpp); NULL when
                                 * those cannot be trusted (the walk began in
                                 * recovery): the next walk walks every list */
    BlockNumber *list_starts;   /* per list, its first page with room when
                                 * the last walk read it, else its last page
                                 * (allocated with list_changes): the first
                                 * page a later insert can touch (gpu_sync.cpp,
                                 * WalkLists) */
    uint64      removals_seen;  /* the index's removal count when the last
                                 * walk began (list_changes.cpp), or
                                 * GPUIVF_LIST_UNSETTLED */
    int64       entries;
    int64       device_bytes;
    uint64      last_used;
    TimestampTz loaded_at;
    TimestampTz last_used_at;
} GpuIndex;


/* A list page read during a walk whose entries differ from the mirror. */
typedef struct ChangedPage
{
    BlockNumber blkno;
    XLogRecPtr  lsn;
    int32       list;
    PageMirror *old;
    int64       start;          /* into the walk's entry arrays */
    int32       n;
    int32       keep;           /* old entries kept (append-only change) */
} ChangedPage;

typedef struct Walk
{
    ChangedPage *pages;
    int         npages, cappages;
    uint64     *tids;
    uint8      *codes;
    int64       n, cap;
    int         code_size;
    int         lists_walked;   /* lists whose pages were read */
    int         lists_from_start;   /* of those, read from their start page */
    int         lists_total;    /* lists of the copy (its shard's) */
    /* where a load's time went, in seconds (the DEBUG1 line of SyncCopy) */
    double      t_vectors;      /* reading vector tuples for the entries */
    double      t_device;       /* handing entries to the engine */
} Walk;

/* gpu_cache.cpp: does the copy hold the re-rank vectors (not codes_only)? */
bool        CopyStoresVectors(const GpuIndex *ix, const GpuivfMetaPageData *meta);
/* gpu_cache.cpp: reading the index's pages by relfilenode */
Buffer      ReadIndexPage(const GpuIndex *ix, BlockNumber blkno);
void        Corrupted(const GpuIndex *ix, BlockNumber blkno, const char *what);  /* ERROR */
/* a raw array (model, directory) from consecutive pages */
void        ReadRawPages(const GpuIndex *ix, BlockNumber start, uint32 npages, uint16 type,
                         void *data, Size bytes);
/* evict the least recently used copy other than keep; false when none */
bool        EvictOne(const GpuIndex *keep);

/* Engine call that may run out of memory: evict LRU copies and retry. */
#define WITH_EVICTION(ix, call, what) \
    do { \
        gpuivf_cuda_status st_ = (call); \
        while (st_.code == GPUIVF_CUDA_OUT_OF_MEMORY && EvictOne(ix)) \
            st_ = (call); \
        GpuivfCheckCuda(st_, what); \
    } while (0)


/* gpu_sync.cpp: the steps of SyncCopy (gpu_cache.cpp) */
int         WalkLists(GpuIndex *ix, const GpuivfMetaPageData *meta, bool use_lsn,
                      const uint64 *seen, const BlockNumber *starts, uint64 *counts,
                      BlockNumber *new_starts, Walk *wk);
void        AddEntries(GpuIndex *ix, const GpuivfMetaPageData *meta, Walk *wk, uint64 *ids_out);
void        UpdateMirror(GpuIndex *ix, const Walk *wk, const ChangedPage *p, const uint64 *ids_out);

#endif                          /* GPUIVF_GPU_CACHE_H */
