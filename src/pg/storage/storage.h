/*
 * storage/storage.h — the pages of a gpuivf index: the metapage and the
 * per-backend model cache (meta.cpp), and every page read and change:
 * page.cpp (primitives: formatting, extending, adding items, vector
 * tuples), read.cpp (raw arrays, directory entries, list page decoding),
 * writer.cpp (the build's page writer), wal.cpp (GenericXLog records of
 * inserts, VACUUM and calibrations).  Formats: gpuivf.h; design: README.md,
 * "Pages" and "WAL".
 */
#ifndef GPUIVF_STORAGE_H
#define GPUIVF_STORAGE_H

#include "gpuivf.h"
/* -------------------------------------- index state and input checks */

/*
 * What a backend keeps of an index between scans (rd_amcache): the metapage
 * fields and the trained model, valid while train_id matches the metapage.
 */
typedef struct GpuivfIndexState
{
    GpuivfMetaPageData meta;
    float      *centroids;      /* lists * dims */
    float      *centroid_norms; /* lists */
    float      *codebook;       /* pq_m * 2^pq_bits * (dims / pq_m) */
    gpuivf::IvfPqModel model;   /* views of the arrays above */
} GpuivfIndexState;

/* meta.cpp: metapage and the per-backend model cache */
void        GpuivfReadMeta(Relation index, GpuivfMetaPageData *meta);
/* *meta = *given (a copy the caller read earlier in this statement), or read
 * here when given is NULL */
void        GpuivfGivenOrReadMeta(Relation index, const GpuivfMetaPageData *given,
                                  GpuivfMetaPageData *meta);
void        GpuivfCheckFormat(Relation index, const GpuivfMetaPageData *meta);
/* The returned state lives in rd_amcache, which a relcache invalidation frees:
 * call it again at every amgettuple/aminsert, never keep the pointer across
 * calls.  meta is re-read from the metapage on every call. */
GpuivfIndexState *GpuivfGetIndexState(Relation index);
/* The engine's model of meta's shape over the given arrays */
gpuivf::IvfPqModel GpuivfModelOf(const GpuivfMetaPageData *meta, const float *centroids,
                                 const float *centroid_norms, const float *codebook);

/* meta.cpp */
void        GpuivfCheckMaxDims(int dims);   /* 54000 above gpuivf::kMaxDims */
/* meta.cpp: the metapage flags and storage of an index with these options,
 * column type and dims (0 = not known yet): RERANK per rerank, RERANK_TABLE
 * per rerank_from ('auto': when a vector tuple would not fit a page; an
 * untrained index keeps every row as a vector tuple, so whether it re-ranks
 * or not); an ERROR when rerank_from = 'index' cannot hold the vectors. */
uint16      GpuivfStorageFlags(Relation index, const GpuivfOptions *opts, int dims, bool trained);
uint16      GpuivfStorageOf(GpuivfVectorType type);
const char *GpuivfMetricName(int metric);
/* ------------------------------------------- WAL-logged page changes */

/* page.cpp: primitives of the other page files */
Buffer      GpuivfNewBuffer(Relation index, ForkNumber forknum);
#define GPUIVF_INSERT_EXTEND_MAX    64  /* pages an insert adds for waiters */
Buffer      GpuivfNewVectorBuffer(Relation index);
/* whether extending index needs the relation extension lock */
bool        GpuivfExtensionNeedsLock(Relation index);
void        GpuivfInitPage(Page page, uint16 page_type);
void        GpuivfInitRegisterPage(GenericXLogState *state, Buffer buf, uint16 page_type, Page *page);
/* adds one item the caller made room for (an ERROR if it does not fit) */
OffsetNumber GpuivfPageAddItemOrError(Relation index, Page page, const void *item, Size size);
/* list's entry on its directory page (GpuivfDirPageOf; locked by the caller) */
GpuivfListDirEntry *GpuivfDirEntryOnPage(Page page, int list);

/* read.cpp: raw arrays and directory entries */
/* reads block blkno of the index arg names (pinned, unlocked) */
typedef Buffer (*GpuivfReadPageFn) (const void *arg, BlockNumber blkno);
BlockNumber GpuivfCopyRawPages(GpuivfReadPageFn read_page, const void *arg, BlockNumber start,
                               uint32 npages, uint16 page_type, void *data, Size bytes);
void        GpuivfReadRawPages(Relation index, BlockNumber start, uint32 npages, uint16 page_type,
                               void *data, Size bytes);
GpuivfListDirEntry GpuivfReadDirEntry(Relation index, const GpuivfMetaPageData *meta, int list);

/*
 * read.cpp: a trained index's rows and their version (README.md, "Never
 * stale").  An untrained index, or one whose page changes are not
 * WAL-logged (unlogged, or new in this transaction under wal_level =
 * minimal: page LSNs do not move), counts its rows and changes on the
 * metapage (`vectors`, `generation`), which every insert then locks.  A
 * trained, WAL-logged index counts them in its directory only: its rows are
 * the lists' counts, and the version of its rows is the newest LSN of its
 * directory pages, which every change of a list moves; its inserts never
 * lock the metapage.
 */
/* whether index counts its rows on the metapage (inserts lock it) */
bool        GpuivfRowsOnMetapage(Relation index, const GpuivfMetaPageData *meta);
/* the rows' version of meta's index: the newest LSN of its directory pages
 * (dir_lsn) when it is trained and WAL-logged, else its generation; only
 * grows (versions of the two kinds are not comparable) */
uint64      GpuivfRowsVersion(const GpuivfMetaPageData *meta, bool lsn_reliable,
                              XLogRecPtr dir_lsn);
/* meta (as GpuivfReadMeta read it): a trained index's `vectors` becomes its
 * rows now (the directory's counts); returns the rows' version.  Readers of
 * `vectors` call it: a trained index's metapage keeps its build's count. */
uint64      GpuivfReadRows(Relation index, GpuivfMetaPageData *meta);
/* its reader, shared with the GPU worker: rows, the newest directory LSN */
BlockNumber GpuivfCopyDirRows(GpuivfReadPageFn read_page, const void *arg,
                              const GpuivfMetaPageData *meta, uint64 *rows, XLogRecPtr *lsn);

/* writer.cpp: build-time page writing.  Pages of an index being built are
 * written without WAL through shared buffers; when the index needs WAL
 * (`wal`: RelationNeedsWAL, decided by the build's leader, or an init fork)
 * each page is logged as a full-page image (log_newpage_range) once it is
 * final: a writer logs the pages it has left behind in runs of up to
 * GPUIVF_WRITER_LOG_RUN pages, so that a parallel build's participants
 * write their WAL while they scan.  A writer appends pages to a fork in
 * order, growing the fork by chunks of GPUIVF_WRITER_CHUNK_MIN..MAX pages;
 * several writers (processes) may append to one fork at once. */
#define GPUIVF_WRITER_CHUNK_MIN     1
#define GPUIVF_WRITER_CHUNK_MAX     1024
#define GPUIVF_WRITER_LOG_RUN       128
typedef struct GpuivfPageWriter
{
    Relation    index;
    ForkNumber  forknum;
    uint16      page_type;
    bool        chained;        /* link each new page from the previous one */
    bool        wal;            /* log finished pages */
    Buffer      buf;            /* current page, locked, or InvalidBuffer */
    BlockNumber blkno;          /* current page, kept across pauses */
    BlockNumber chain_head;     /* first page since the last NewChain */
    uint32      pages;          /* pages appended by this writer */
    BlockNumber reserve_next;   /* pages [reserve_next, reserve_end) were */
    BlockNumber reserve_end;    /* added to the fork for this writer, unused */
    BlockNumber log_first;      /* finished pages [log_first, log_end) are */
    BlockNumber log_end;        /* not logged yet */
} GpuivfPageWriter;

void        GpuivfWriterInit(GpuivfPageWriter *w, Relation index, ForkNumber forknum,
                             uint16 page_type, bool chained, bool wal);
void        GpuivfWriterNewChain(GpuivfPageWriter *w);
void        GpuivfWriterAdd(GpuivfPageWriter *w, const void *item, Size size, ItemPointer tid);
void        GpuivfWriterPause(GpuivfPageWriter *w);   /* unlock before long engine work */
/* the writer is done: its pages logged (wal), its last page's free space and
 * its unused pages recorded in the FSM */
void        GpuivfWriterFinish(GpuivfPageWriter *w);
void        GpuivfBuildPutMeta(Relation index, ForkNumber forknum, const GpuivfMetaPageData *meta,
                               bool wal);
void        GpuivfWriteRawPages(Relation index, ForkNumber forknum, uint16 page_type,
                                const void *data, Size bytes, bool wal, BlockNumber *start,
                                uint32 *npages);

/* wal.cpp: changes to live pages, one GenericXLog record each (at most 4
 * buffers).  One insert: */
typedef struct GpuivfInsertPlan
{
    Buffer      vecbuf;         /* vector page, or InvalidBuffer: no vector tuple */
    bool        vec_init;       /* vecbuf is new (or all-zero): initialize it */
    const float4 *vector;       /* raw vector, dims values */
    uint32      dims;
    uint16      storage;        /* GPUIVF_STORAGE_* of the vector tuple */
    bool        from_table;     /* the vector tuple holds no values */
    ItemPointerData heaptid;
    Buffer      listbuf;        /* list page, or InvalidBuffer: untrained */
    const uint8 *code;          /* code_size bytes */
    uint16      code_size;
    Buffer      dirbuf;         /* directory page holding the list's entry */
    int         list;
    BlockNumber new_insert_page;    /* or InvalidBlockNumber: keep */
    Buffer      metabuf;        /* or InvalidBuffer: rows not on the metapage */
    bool        set_dims;       /* first row of an untrained index fixes dims, */
    uint16      set_flags;      /* and the flags (GpuivfStorageFlags for them) */
} GpuivfInsertPlan;

void        GpuivfLogInsert(Relation index, const GpuivfInsertPlan *plan);
/* registers the metapage in state: generation + 1, vectors + delta */
void        GpuivfBumpMeta(GenericXLogState *state, Buffer metabuf, int64 vectors_delta);
/* metabuf: InvalidBuffer when the index's rows are not on the metapage */
void        GpuivfLogAppendListPage(Relation index, Buffer tailbuf, Buffer newbuf,
                                    Buffer dirbuf, int list, Buffer metabuf);
void        GpuivfLogDeleteListEntries(Relation index, Buffer listbuf, OffsetNumber *offsets,
                                       int noffsets, Buffer dirbuf, const GpuivfMetaPageData *meta,
                                       int list, BlockNumber new_insert_page, Buffer metabuf);
void        GpuivfLogFreeVectorTuples(Relation index, Buffer vecbuf, OffsetNumber *offsets,
                                      int noffsets, Buffer metabuf, bool count_vectors);
/* page.cpp */
BlockNumber GpuivfDirPageOf(const GpuivfMetaPageData *meta, int list);
/* room on an item page, within MaxIndexTuplesPerPage line pointers */
Size        GpuivfPageFreeSpace(Page page);
bool        GpuivfPageHasRoom(Page page, Size size);

/* wal.cpp: a calibration (README.md, "Calibration queries"): growing the
 * free chain of calibration-query pages, writing queries into its pages,
 * and the record that stores the curves and makes them the current set */
void        GpuivfLogCalibFreeAppend(Relation index, Buffer tailbuf, const Buffer *newbufs, int n,
                                     Buffer metabuf);
void        GpuivfLogCalibQueryPages(Relation index, const Buffer *bufs, int n,
                                     const float4 *const *data, const uint32 *counts,
                                     uint32 calib_id);
void        GpuivfLogCalibration(Relation index, Buffer metabuf, const GpuivfMetaPageData *calib,
                                 Buffer lastbuf, Buffer oldtailbuf, BlockNumber free_next);
/* wal.cpp: the stamp and floats of a calibration-query page (caller locks
 * it), NULL when it is not one */
const float4 *GpuivfCalibPageData(Page page, uint32 *calib_id, uint32 *n);

/* page.cpp: the corruption error for a page that is not what was expected */
void        GpuivfBadPage(Relation index, BlockNumber blkno, const char *expected);  /* ERROR */
/* read.cpp: list pages (scan, batch search, calibration, the worker) */
const char *GpuivfDecodeListPage(Page page, int code_size, int capacity, uint64 *ids,
                                 uint8 *codes, int *n);   /* NULL, or what was expected */
int         GpuivfReadListPage(Relation index, BlockNumber blkno, int code_size, int capacity,
                               uint64 *ids, uint8 *codes, BlockNumber *next);
/* page.cpp: the vector tuple at off (NULL: not in use); value_bytes: what it must hold
 * (GpuivfVectorValueBytes) */
GpuivfVectorTuple *GpuivfPageVectorTuple(Relation index, Page page, BlockNumber blkno,
                                         OffsetNumber off, Size value_bytes);
/* a vector tuple of the given storage: heap TID and the values of x (float4,
 * narrowed to halves for GPUIVF_STORAGE_FLOAT16; none when from_table);
 * vt has room for GpuivfVectorTupleSizeFor(dims, storage, from_table) */
void        GpuivfFillVectorTuple(GpuivfVectorTuple *vt, ItemPointer heaptid, const float4 *x,
                                  int dims, int storage, bool from_table);
#endif                          /* GPUIVF_STORAGE_H */
