/*
 * am/scan.h — private to the index scan (scan*.cpp): the scan's state and
 * the steps its files share.
 *
 *   scan.cpp         the AM callbacks, the start of a (re)scan, round 1 and
 *                    exact scans, the planner's hints
 *   scan_rows.cpp    the rows a scan holds: results (sorted lazily),
 *                    collected candidates, the done set, re-ranking a chunk
 *   scan_deepen.cpp  past round 1: revisiting the round-1 lists, further
 *                    rounds of lists, the next chunk of rows
 *
 * The rounds and the memory they use: scan.cpp's file comment.
 */
#ifndef GPUIVF_AM_SCAN_H
#define GPUIVF_AM_SCAN_H

#include "gpuivf.h"
#include "am/am.h"
#include "search/search.h"

/* where a scan stands */
typedef enum GpuivfScanPhase
{
    GPUIVF_PHASE_START,         /* round 1 returned, nothing deeper yet */
    GPUIVF_PHASE_REVISIT,       /* chunks from the round-1 lists */
    GPUIVF_PHASE_MORE,          /* chunks from later rounds of lists */
    GPUIVF_PHASE_EXACT_REST,    /* exact round 1 returned: the rest, sorted */
    GPUIVF_PHASE_DONE           /* nothing more to load */
} GpuivfScanPhase;


typedef struct GpuivfScanOpaqueData
{
    MemoryContext scan_ctx;     /* lives as long as the scan */
    MemoryContext query_ctx;    /* reset at every rescan */
    BufferAccessStrategy bas;   /* for exact scans over all pages (made by the first) */

    /* the query, set by rescan (in query_ctx) */
    bool        no_rows;        /* ORDER BY col <op> NULL */
    float4     *query;          /* raw query vector */
    int         query_dims;
    int64       limit_hint;     /* rows the query needs, 0 = unknown (kept) */
    double      filter_sel;     /* selectivity of the filter above (kept) */
    GpuivfScanStats stats;      /* summed over rescans (kept) */

    /* fixed at the first gettuple of a (re)scan */
    GpuivfScanPhase phase;
    GpuivfMetaPageData meta;    /* metapage as the scan started */
    gpuivf::Metric metric;
    bool        rerank;         /* candidates are re-ranked exactly: */
    bool        rerank_table;   /* from the table (entries hold heap TIDs), else
                                 * from the vector tuples entries point at */
    GpuivfRowDistance rd;       /* the re-rank's distance */
    GpuivfRowDistance rd_exact; /* an exact scan's (search/rows.cpp) */
    int         nlist;
    GpuivfQuery q;              /* round 1 */
    int         depth;          /* its re-rank depth (GpuivfChooseProbes) */
    bool        exact;          /* round 1 was exact */
    int         rerank_k;       /* candidates per later chunk */
    float4     *query_prepared; /* the vector that is ADC-scored */

    /* heap ids round 1 returned, sorted */
    uint64     *round1_ids;
    int         nround1;

    /* lists: probe order and which were visited */
    int32      *list_order;     /* best first */
    int         list_order_len;
    int         list_order_pos; /* next entry of list_order to consider */
    bool       *visited;        /* nlist flags */
    int         lists_visited;

    /* per-page buffers of list entries */
    int         page_capacity;
    uint8      *page_codes;
    uint64     *page_ids;
    float      *lut;

    /* all entries of the current revisit/more round, ADC order */
    float      *cand_scores;
    uint64     *cand_ids;
    int64       ncand;
    int64       cand_cap;
    int64       cand_pos;

    /* list-entry ids already handed to a chunk: [0, ndone_sorted) sorted */
    uint64     *done_ids;
    int64       ndone;
    int64       ndone_sorted;
    int64       done_cap;

    /* rows to return, in order */
    GpuivfResult *results;
    int64       nresults;
    int64       results_cap;
    int64       results_pos;
    int64       nsorted;        /* results[0, nsorted) are in final order */

    /* scratch for one chunk */
    uint64     *chunk_ids;
    float      *chunk_scores;
} GpuivfScanOpaqueData;

/* scan.cpp: every row's distance, sorted lazily (exact mode) */
void        GpuivfScanExact(Relation index, GpuivfScanOpaque so);

/* scan_rows.cpp */
void        GpuivfEnsureSorted(GpuivfScanOpaque so, int64 pos);  /* results[0..pos] final */
void        GpuivfReserveResults(GpuivfScanOpaque so, int64 n);
void        GpuivfAddExactResult(void *arg, const GpuivfRow *row);  /* GpuivfForEachRow visitor */
void        GpuivfReserveCandidates(GpuivfScanOpaque so, int64 n);
void        GpuivfAddDone(GpuivfScanOpaque so, const uint64 *ids, int64 n);
void        GpuivfSortDone(GpuivfScanOpaque so);
bool        GpuivfIsDone(GpuivfScanOpaque so, uint64 id);
/* n candidates (list-entry ids, ADC scores) -> sorted results */
void        GpuivfRerank(Relation index, GpuivfScanOpaque so, const uint64 *ids,
                         const float *scores, int n);

/* scan_deepen.cpp: the next chunk of rows past round 1; false when none */
bool        GpuivfLoadNextChunk(Relation index, GpuivfScanOpaque so);
#endif                          /* GPUIVF_AM_SCAN_H */
