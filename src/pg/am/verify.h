/*
 * am/verify.h — private to gpuivf_verify (verify*.cpp): what verify holds
 * while it reads an index, and the steps the files share.
 *
 *   verify.cpp        the SQL function, its retry loop, the state, the
 *                     metapage and model pages
 *   verify_pages.cpp  list chains, vector pages, codes against lists
 *   verify_heap.cpp   heapallindexed: the table against the index
 *
 * What is checked: verify.cpp's file comment.  Every inconsistency goes
 * through VerifyCorrupt.
 */
#ifndef GPUIVF_AM_VERIFY_H
#define GPUIVF_AM_VERIFY_H

#include "gpuivf.h"


/* Block roles seen by verify. */
#define ROLE_NONE       0
#define ROLE_META       1
#define ROLE_CENTROIDS  2
#define ROLE_CODEBOOK   3
#define ROLE_DIRECTORY  4
#define ROLE_LIST       5
#define ROLE_CALIB      6   /* calibration query pages, current or free */

#define VERIFY_BATCH    1024

/* One indexed row as verify sees it. */
typedef struct VerifyEntry
{
    uint64      heap_id;        /* heap TID, packed */
    uint64      ref_id;         /* vector tuple TID (rerank/untrained), else 0 */
    uint64      hash;           /* of the vector (rerank/untrained) */
    int32       list;           /* -1 when untrained */
    uint32      page;           /* list page (rerank = false) or vector page */
    int64       code_idx;       /* row of codes[], -1 when none */
    int32       refs;           /* vector tuples pointing back (rerank) */
    bool        seen;           /* by the heap scan */
} VerifyEntry;

typedef struct VerifyState
{
    Relation    index;
    Relation    heap;
    GpuivfMetaPageData meta;    /* vectors: the directory's rows (trained) */
    uint64      version;        /* the rows' version when the walk began */
    bool        have_version;   /* (read once the directory's range checked) */
    BlockNumber nblocks;
    uint8      *role;           /* ROLE_* per block */
    bool        trained;
    bool        by_vector;      /* entries point at vector tuples */

    float      *centroids;
    float      *norms;
    float      *codebook;
    gpuivf::IvfPqModel model;

    VerifyEntry *entries;
    int64       nentries;
    int64       cap;
    uint8      *codes;          /* code_size per entry with code_idx */
    int64       ncodes;
    int64       codes_cap;

    /* batch of vectors to check against their entries */
    float      *bvec;
    int32      *blist;
    uint8      *bcode;
    uint64     *bid;            /* heap ids, for messages */
    int         bn;
    float      *prep;
    int32      *labels;
    float      *scratch;        /* 3 * dims */
    uint8      *best;
} VerifyState;


/* verify.cpp: the state */
/* raises "index corrupted" with a sentence saying what, or a serialization
 * failure (retried) when a writer changed the index meanwhile */
void pg_attribute_noreturn() VerifyCorrupt(VerifyState *vs, const char *fmt,...)
    pg_attribute_printf(2, 3);
VerifyEntry *VerifyAddEntry(VerifyState *vs);                /* zeroed, list -1 */
int64       VerifyAddCode(VerifyState *vs, const uint8 *code);  /* its row of codes */
uint64      VerifyVectorHash(const float4 *x, int dims);   /* compared with the heap's */
/* verify.cpp: metapage, model pages */
void        VerifyMeta(VerifyState *vs);
void        LoadModel(VerifyState *vs);

/* verify_pages.cpp */
void        VerifyLists(VerifyState *vs);
void        VerifyPages(VerifyState *vs);
/* the entry of heap id (by_ref: of vector tuple id), NULL when none; entries
 * sorted by VerifyCompareHeap (or by ref) first */
VerifyEntry *VerifyFindEntry(VerifyState *vs, uint64 id, bool by_ref);
int         VerifyCompareHeap(const void *a, const void *b);
/* codes against lists: queue a stored vector with its entry; check the queue */
void        VerifyQueueCheck(VerifyState *vs, const float4 *x, const VerifyEntry *e);
void        VerifyCheckBatch(VerifyState *vs);

/* verify_heap.cpp */
void        VerifyHeapAllIndexed(VerifyState *vs, Snapshot snapshot);
#endif                          /* GPUIVF_AM_VERIFY_H */
