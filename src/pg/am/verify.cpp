/*
 * am/verify.cpp — the SQL function gpuivf_verify(regclass, heapallindexed
 * boolean).
 *
 * gpuivf_verify is the amcheck of gpuivf.  It checks, under AccessShareLock:
 *   - the metapage (format, options, page ranges);
 *   - the model pages (types, finite values within gpuivf::kMaxModelComponent);
 *   - the directory and every list chain: page types, no cycle, no page in
 *     two chains, tail and insert_page on the chain, counts equal to the
 *     directory and, summed, to the metapage;
 *   - every page of the index has a known role (no orphan list page);
 *   - list and vector pages: at most MaxIndexTuplesPerPage line pointers;
 *   - vector pages: tuple sizes, values as input accepts them, each vector tuple referenced
 *     by exactly one list entry (rerank), or counted (untrained);
 *   - codes vs lists (rerank): the entry's list is the nearest centroid of
 *     its stored vector (within float tolerance) and its code is the best
 *     code of the residual (within tolerance);
 *   - with heapallindexed: every heap row with a non-NULL vector visible to a
 *     snapshot taken before the index is read is indexed exactly once, with
 *     the same vector (or, rerank = false, the right list and code); every
 *     other entry points at a heap line pointer still in use.
 * Any inconsistency raises ERRCODE_INDEX_CORRUPTED.
 */
#include "gpuivf.h"
#include "am/am.h"
#include "calibration/calibration.h"
#include "storage/storage.h"

#include <cmath>

extern "C" {
PG_FUNCTION_INFO_V1(gpuivf_verify);
}

/* Block roles seen by verify. */
#define ROLE_NONE       0
#define ROLE_META       1
#define ROLE_CENTROIDS  2
#define ROLE_CODEBOOK   3
#define ROLE_DIRECTORY  4
#define ROLE_LIST       5
#define ROLE_CALIB      6   /* calibration query pages, current or free */

#define VERIFY_BATCH    1024

/* ----------------------------------------------------------- verify state */

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
    GpuivfMetaPageData meta;
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

/* Raise "index corrupted" with a sentence saying what. */
static void pg_attribute_noreturn()
Corrupt(VerifyState *vs, const char *fmt,...) pg_attribute_printf(2, 3);

static void
Corrupt(VerifyState *vs, const char *fmt,...)
{
    char        detail[512];
    va_list     args;

    GpuivfMetaPageData now;

    va_start(args, fmt);
    vsnprintf(detail, sizeof(detail), fmt, args);
    va_end(args);

    /* a writer changed the index while we read it: not evidence */
    GpuivfReadMeta(vs->index, &now);
    if (now.generation != vs->meta.generation || now.calib_id != vs->meta.calib_id ||
        now.calib_free_pages != vs->meta.calib_free_pages)
        ereport(ERROR,
                (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                 errmsg("gpuivf index \"%s\" changed while it was being verified",
                        RelationGetRelationName(vs->index)),
                 errdetail_internal("Last inconsistency seen: %s", detail),
                 errhint("Run gpuivf_verify again when fewer rows are being written.")));
    ereport(ERROR,
            (errcode(ERRCODE_INDEX_CORRUPTED),
             errmsg("gpuivf index \"%s\" is corrupted", RelationGetRelationName(vs->index)),
             errdetail_internal("%s", detail),
             errhint("Rebuild the index with REINDEX.")));
    pg_unreachable();
}

/* Pages a raw array of bytes takes. */
static uint32
RawPages(Size bytes)
{
    return (uint32) ((bytes + GPUIVF_PAGE_CAPACITY - 1) / GPUIVF_PAGE_CAPACITY);
}

/* Claim blocks [start, start + n) for a role; overlaps are corruption. */
static void
ClaimRange(VerifyState *vs, BlockNumber start, uint32 n, uint8 role, const char *what)
{
    if (n == 0)
        return;
    if (start == InvalidBlockNumber || start >= vs->nblocks || n > vs->nblocks - start)
        Corrupt(vs, "The %s pages (%u at block %u) lie outside the index's %u blocks.",
                what, n, start, vs->nblocks);
    for (uint32 i = 0; i < n; i++)
    {
        if (vs->role[start + i] != ROLE_NONE)
            Corrupt(vs, "Block %u is used as %s page and for something else.", start + i, what);
        vs->role[start + i] = role;
    }
}

/* Append an entry; returns it. */
static VerifyEntry *
AddEntry(VerifyState *vs)
{
    if (vs->nentries == vs->cap)
    {
        vs->cap = vs->cap == 0 ? 4096 : vs->cap * 2;
        vs->entries = vs->entries == NULL
            ? (VerifyEntry *) palloc_extended(vs->cap * sizeof(VerifyEntry), MCXT_ALLOC_HUGE)
            : (VerifyEntry *) repalloc_huge(vs->entries, vs->cap * sizeof(VerifyEntry));
    }
    memset(&vs->entries[vs->nentries], 0, sizeof(VerifyEntry));
    vs->entries[vs->nentries].list = -1;
    vs->entries[vs->nentries].code_idx = -1;
    return &vs->entries[vs->nentries++];
}

/* Keep a copy of a code; returns its row. */
static int64
AddCode(VerifyState *vs, const uint8 *code)
{
    Size        cs = vs->meta.code_size;

    if (vs->ncodes == vs->codes_cap)
    {
        vs->codes_cap = vs->codes_cap == 0 ? 4096 : vs->codes_cap * 2;
        vs->codes = vs->codes == NULL
            ? (uint8 *) palloc_extended(vs->codes_cap * cs, MCXT_ALLOC_HUGE)
            : (uint8 *) repalloc_huge(vs->codes, vs->codes_cap * cs);
    }
    memcpy(vs->codes + vs->ncodes * cs, code, cs);
    return vs->ncodes++;
}

/* Hash of a vector's bytes (compared with the heap's value). */
static uint64
VectorHash(const float4 *x, int dims)
{
    return hash_bytes_extended((const unsigned char *) x, dims * (int) sizeof(float4), 0);
}

/* ------------------------------------------------------- metapage, model */

/* Metapage fields against each other and against the index's size. */
static void
VerifyMeta(VerifyState *vs)
{
    GpuivfMetaPageData *m = &vs->meta;

    GpuivfReadMeta(vs->index, m);       /* magic, version, trained shape */
    vs->trained = GpuivfMetaIsTrained(m);
    vs->by_vector = vs->trained && GpuivfMetaStoresVectors(m);
    vs->role[GPUIVF_METAPAGE_BLKNO] = ROLE_META;
    if (m->metric != (uint16) GpuivfGetMetric(vs->index))
        Corrupt(vs, "The metapage says metric %u but the operator class is for metric %d.",
                m->metric, (int) GpuivfGetMetric(vs->index));
    if (m->storage != GpuivfStorageOf(GpuivfGetOpclassInfo(vs->index).type))
        Corrupt(vs, "The metapage says storage %u but the operator class is for %s.",
                m->storage, GpuivfVectorTypeName(GpuivfGetOpclassInfo(vs->index).type));
    if (vs->trained && GpuivfMetaRerankFromTable(m) && (m->flags & GPUIVF_META_RERANK) == 0)
        Corrupt(vs, "The metapage re-ranks from the table but does not re-rank.");
    if (!GpuivfMetaRerankFromTable(m) && GpuivfVectorTupleSize(m) > GPUIVF_MAX_VECTOR_TUPLE_SIZE)
        Corrupt(vs, "Vectors of %u dimensions are kept in the index but do not fit a page.",
                m->dims);
    if (m->vector_insert_page != InvalidBlockNumber && m->vector_insert_page >= vs->nblocks)
        Corrupt(vs, "The vector insert page %u is beyond the index's %u blocks.",
                m->vector_insert_page, vs->nblocks);
    if (!vs->trained)
    {
        if (m->lists != 0 || m->centroid_pages != 0 || m->codebook_pages != 0 ||
            m->directory_pages != 0)
            Corrupt(vs, "An untrained metapage has %u lists and model pages.", m->lists);
        if (m->dims == 0 && m->vectors != 0)
            Corrupt(vs, "The metapage counts " UINT64_FORMAT " vectors but has no dimensions.",
                    m->vectors);
        return;
    }
    if (m->centroid_pages != RawPages((Size) m->lists * m->dims * sizeof(float)))
        Corrupt(vs, "%u centroid pages do not hold %u lists of %u dimensions.",
                m->centroid_pages, m->lists, m->dims);
    if (m->codebook_pages !=
        RawPages(GpuivfCodebookFloats((int) m->dims, m->pq_m, m->pq_bits) * sizeof(float)))
        Corrupt(vs, "%u codebook pages do not hold the codebooks.", m->codebook_pages);
    if (m->directory_pages != RawPages((Size) m->lists * sizeof(GpuivfListDirEntry)))
        Corrupt(vs, "%u directory pages do not hold %u lists.", m->directory_pages, m->lists);
    ClaimRange(vs, m->centroid_start, m->centroid_pages, ROLE_CENTROIDS, "centroid");
    ClaimRange(vs, m->codebook_start, m->codebook_pages, ROLE_CODEBOOK, "codebook");
    ClaimRange(vs, m->directory_start, m->directory_pages, ROLE_DIRECTORY, "directory");
    {
        char       *wrong = GpuivfCheckCalibChains(vs->index, m, vs->nblocks, vs->role, ROLE_CALIB);

        if (wrong != NULL)
            Corrupt(vs, "%s", wrong);
    }
}

/* Read centroids and codebooks into local memory (not rd_amcache). */
static void
LoadModel(VerifyState *vs)
{
    GpuivfMetaPageData *m = &vs->meta;
    Size        nc = (Size) m->lists * m->dims;
    Size        nb = GpuivfCodebookFloats((int) m->dims, m->pq_m, m->pq_bits);

    vs->centroids = (float *) palloc_extended(nc * sizeof(float), MCXT_ALLOC_HUGE);
    vs->norms = (float *) palloc(m->lists * sizeof(float));
    vs->codebook = (float *) palloc_extended(nb * sizeof(float), MCXT_ALLOC_HUGE);
    GpuivfReadRawPages(vs->index, m->centroid_start, m->centroid_pages, GPUIVF_PAGE_CENTROIDS,
                       vs->centroids, nc * sizeof(float));
    GpuivfReadRawPages(vs->index, m->codebook_start, m->codebook_pages, GPUIVF_PAGE_CODEBOOK,
                       vs->codebook, nb * sizeof(float));
    if (!gpuivf::components_within(vs->centroids, nc, gpuivf::kMaxModelComponent))
        Corrupt(vs, "A centroid has a NaN, infinite or out-of-range value.");
    if (!gpuivf::components_within(vs->codebook, nb, gpuivf::kMaxModelComponent))
        Corrupt(vs, "A codebook has a NaN, infinite or out-of-range value.");
    gpuivf::row_norms(vs->centroids, m->lists, m->dims, vs->norms);
    vs->model = GpuivfModelOf(m, vs->centroids, vs->norms, vs->codebook);

    vs->bvec = (float *) palloc((Size) VERIFY_BATCH * m->dims * sizeof(float));
    vs->prep = (float *) palloc((Size) VERIFY_BATCH * m->dims * sizeof(float));
    vs->blist = (int32 *) palloc(VERIFY_BATCH * sizeof(int32));
    vs->labels = (int32 *) palloc(VERIFY_BATCH * sizeof(int32));
    vs->bcode = (uint8 *) palloc((Size) VERIFY_BATCH * m->code_size);
    vs->bid = (uint64 *) palloc(VERIFY_BATCH * sizeof(uint64));
    vs->scratch = (float *) palloc(3 * (Size) m->dims * sizeof(float));
    vs->best = (uint8 *) palloc(m->code_size);
    vs->bn = 0;
}

/* --------------------------------------------------------- codes vs lists */

/* Check the batch: list = nearest centroid and code = best code, both
 * within float tolerance (GEMM and loop rounding differ a little). */
static void
CheckBatch(VerifyState *vs)
{
    int         d = (int) vs->meta.dims;
    int         cs = vs->meta.code_size;
    gpuivf::CancelHook cancel;
    gpuivf::Status status;
    float      *resid = vs->scratch;
    float      *recon = vs->scratch + d;

    if (vs->bn == 0)
        return;
    cancel = GpuivfCancelHook();
    for (int i = 0; i < vs->bn; i++)
        gpuivf::prepare_vector(vs->model.metric, vs->bvec + (Size) i * d, vs->prep + (Size) i * d, d);
    status = gpuivf::assign_nearest(vs->centroids, vs->norms, vs->model.nlist, d, vs->prep,
                                    vs->bn, vs->labels, NULL, &cancel);
    GpuivfRaiseStatus(status);  /* serves a pending interrupt when canceled */
    for (int i = 0; i < vs->bn; i++)
    {
        const float *x = vs->prep + (Size) i * d;
        int         stored = vs->blist[i];
        const float *cs_ = vs->centroids + (Size) stored * d;
        const float *cn = vs->centroids + (Size) vs->labels[i] * d;
        double      dist_s = gpuivf::l2_squared(x, cs_, d);
        double      dist_n = gpuivf::l2_squared(x, cn, d);
        double      scale = (double) gpuivf::inner_product(x, x, d) +
            Max(vs->norms[stored], vs->norms[vs->labels[i]]);
        const uint8 *code = vs->bcode + (Size) i * cs;
        double      err_s;
        double      err_b;
        double      rnorm;
        ItemPointerData tid;

        GpuivfIdToTid(vs->bid[i], &tid);
        if (dist_s > dist_n + 1e-4 * scale + 1e-6)
            Corrupt(vs, "The entry of heap row (%u,%u) is in list %d, but list %d is nearer (%g < %g).",
                    ItemPointerGetBlockNumberNoCheck(&tid), ItemPointerGetOffsetNumberNoCheck(&tid),
                    stored, vs->labels[i], dist_n, dist_s);
        for (int j = 0; j < d; j++)
            resid[j] = x[j] - cs_[j];
        gpuivf::pq_encode(vs->codebook, d, vs->model.m, vs->model.nbits, resid, 1, vs->best);
        gpuivf::pq_decode(vs->codebook, d, vs->model.m, vs->model.nbits, code, 1, recon);
        err_s = gpuivf::l2_squared(resid, recon, d);
        gpuivf::pq_decode(vs->codebook, d, vs->model.m, vs->model.nbits, vs->best, 1, recon);
        err_b = gpuivf::l2_squared(resid, recon, d);
        rnorm = gpuivf::inner_product(resid, resid, d);
        if (err_s > err_b + 1e-4 * (rnorm + err_b) + 1e-6)
            Corrupt(vs, "The PQ code of heap row (%u,%u) does not encode its vector (error %g, best %g).",
                    ItemPointerGetBlockNumberNoCheck(&tid), ItemPointerGetOffsetNumberNoCheck(&tid),
                    err_s, err_b);
    }
    vs->bn = 0;
}

/* Queue one vector with its entry's list and code for CheckBatch. */
static void
QueueCheck(VerifyState *vs, const float4 *x, const VerifyEntry *e)
{
    int         d = (int) vs->meta.dims;
    int         i = vs->bn++;

    memcpy(vs->bvec + (Size) i * d, x, sizeof(float) * d);
    vs->blist[i] = e->list;
    memcpy(vs->bcode + (Size) i * vs->meta.code_size,
           vs->codes + e->code_idx * vs->meta.code_size, vs->meta.code_size);
    vs->bid[i] = e->heap_id;
    if (vs->bn == VERIFY_BATCH)
        CheckBatch(vs);
}

/* ------------------------------------------------------------ list chains */

/*
 * An item page may have at most MaxIndexTuplesPerPage line pointers (the
 * bound PostgreSQL's page routines size their arrays by; storage/page.cpp's
 * GpuivfPageFreeSpace keeps it).  Indexes built before that bound was kept
 * can have list pages with more: VACUUM compacts such pages safely, and
 * verify reports them so that a REINDEX rewrites them.
 */
static void
CheckLinePointers(VerifyState *vs, const char *kind, BlockNumber blkno, OffsetNumber maxoff)
{
    if (maxoff > MaxIndexTuplesPerPage)
        Corrupt(vs, "%s page %u has %u line pointers, more than the %d an index page may have.",
                kind, blkno, (unsigned) maxoff, (int) MaxIndexTuplesPerPage);
}

/* Walk one list's chain: page types, no cycle, counts, tail, insert_page. */
static uint64
VerifyList(VerifyState *vs, int list, const GpuivfListDirEntry *dir)
{
    BlockNumber blkno = dir->head;
    BlockNumber last = InvalidBlockNumber;
    bool        insert_seen = false;
    uint64      count = 0;
    Size        esize = GPUIVF_LIST_ENTRY_SIZE(vs->meta.code_size);

    if (blkno == InvalidBlockNumber &&
        (dir->count != 0 || dir->tail != InvalidBlockNumber || dir->insert_page != InvalidBlockNumber))
        Corrupt(vs, "List %d has no pages but its directory entry says otherwise.", list);
    while (blkno != InvalidBlockNumber)
    {
        Buffer      buf;
        Page        page;
        OffsetNumber maxoff;

        CHECK_FOR_INTERRUPTS();
        if (blkno >= vs->nblocks)
            Corrupt(vs, "List %d links to block %u, beyond the index's %u blocks.",
                    list, blkno, vs->nblocks);
        if (vs->role[blkno] != ROLE_NONE)
            Corrupt(vs, "List %d reaches block %u, which is already used (a cycle or a shared page).",
                    list, blkno);
        vs->role[blkno] = ROLE_LIST;
        buf = ReadBuffer(vs->index, blkno);
        LockBuffer(buf, BUFFER_LOCK_SHARE);
        page = BufferGetPage(buf);
        if (!GpuivfPageIsType(page, GPUIVF_PAGE_LIST))
            Corrupt(vs, "List %d reaches block %u, which is not a list page.", list, blkno);
        maxoff = PageGetMaxOffsetNumber(page);
        CheckLinePointers(vs, "List", blkno, maxoff);
        for (OffsetNumber off = FirstOffsetNumber; off <= maxoff; off++)
        {
            ItemId      iid = PageGetItemId(page, off);
            GpuivfListEntry *le;
            VerifyEntry *e;

            if (!ItemIdIsNormal(iid) || ItemIdGetLength(iid) != esize)
                Corrupt(vs, "List page %u has a bad item at offset %u.", blkno, off);
            le = (GpuivfListEntry *) PageGetItem(page, iid);
            if (!ItemPointerIsValid(&le->tid))
                Corrupt(vs, "List page %u has an entry with an invalid TID at offset %u.", blkno, off);
            e = AddEntry(vs);
            e->list = list;
            e->page = blkno;
            e->code_idx = AddCode(vs, le->code);
            if (vs->by_vector)
                e->ref_id = GpuivfTidToId(&le->tid);
            else
                e->heap_id = GpuivfTidToId(&le->tid);
            count++;
        }
        if (blkno == dir->insert_page)
            insert_seen = true;
        last = blkno;
        blkno = GpuivfPageGetOpaque(page)->nextblkno;
        UnlockReleaseBuffer(buf);
    }
    if (dir->head != InvalidBlockNumber)
    {
        if (last != dir->tail)
            Corrupt(vs, "List %d ends at block %u but its directory tail is %u.", list, last, dir->tail);
        if (!insert_seen)
            Corrupt(vs, "List %d has insert page %u, which is not on its chain.", list, dir->insert_page);
        if (count != dir->count)
            Corrupt(vs, "List %d has " UINT64_FORMAT " entries but its directory says %u.",
                    list, count, dir->count);
    }
    return count;
}

/* The directory, then every chain; sum of counts = metapage vectors. */
static void
VerifyLists(VerifyState *vs)
{
    GpuivfMetaPageData *m = &vs->meta;
    GpuivfListDirEntry *dir = (GpuivfListDirEntry *)
        palloc_extended((Size) m->lists * sizeof(GpuivfListDirEntry), MCXT_ALLOC_HUGE);
    uint64      total = 0;

    GpuivfReadRawPages(vs->index, m->directory_start, m->directory_pages, GPUIVF_PAGE_DIRECTORY,
                       dir, (Size) m->lists * sizeof(GpuivfListDirEntry));
    for (uint32 l = 0; l < m->lists; l++)
        total += VerifyList(vs, (int) l, &dir[l]);
    if (total != m->vectors)
        Corrupt(vs, "The lists hold " UINT64_FORMAT " entries but the metapage counts " UINT64_FORMAT ".",
                total, m->vectors);
    pfree(dir);
}

/* ------------------------------------------------------------ vector pages */

static int
CompareRef(const void *a, const void *b)
{
    uint64      x = ((const VerifyEntry *) a)->ref_id;
    uint64      y = ((const VerifyEntry *) b)->ref_id;

    return x < y ? -1 : x > y ? 1 : 0;
}

static int
CompareHeap(const void *a, const void *b)
{
    uint64      x = ((const VerifyEntry *) a)->heap_id;
    uint64      y = ((const VerifyEntry *) b)->heap_id;

    return x < y ? -1 : x > y ? 1 : 0;
}

/* Binary search of entries sorted by key (ref_id or heap_id). */
static VerifyEntry *
FindEntry(VerifyState *vs, uint64 id, bool by_ref)
{
    int64       lo = 0;
    int64       hi = vs->nentries;

    while (lo < hi)
    {
        int64       mid = lo + (hi - lo) / 2;
        uint64      key = by_ref ? vs->entries[mid].ref_id : vs->entries[mid].heap_id;

        if (key < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < vs->nentries &&
        (by_ref ? vs->entries[lo].ref_id : vs->entries[lo].heap_id) == id)
        return &vs->entries[lo];
    return NULL;
}

/* One vector tuple: size, values; match it to its list entry (rerank) or
 * make it an entry (untrained).  x is a copy made under the page lock. */
static void
VerifyVectorTuple(VerifyState *vs, BlockNumber blkno, OffsetNumber off,
                  const GpuivfVectorTuple *vt, const float4 *x)
{
    ItemPointerData vtid;
    uint64      ref;
    int         d = (int) vs->meta.dims;
    VerifyEntry *e;

    ItemPointerSet(&vtid, blkno, off);
    ref = GpuivfTidToId(&vtid);
    if (!ItemPointerIsValid(&vt->heaptid))
        Corrupt(vs, "Vector tuple (%u,%u) has an invalid heap TID.", blkno, off);
    /* (no values with re-rank from the table: x is NULL, and the untrained
     * entry's hash 0; heapallindexed then checks membership only) */
    if (x != NULL && !GpuivfValuesAcceptable(x, d))
        Corrupt(vs, "Vector tuple (%u,%u) has a NaN, infinite or out-of-range value.", blkno, off);
    if (!vs->trained)
    {
        e = AddEntry(vs);
        e->ref_id = ref;
        e->heap_id = GpuivfTidToId((ItemPointer) &vt->heaptid);
        e->hash = x != NULL ? VectorHash(x, d) : 0;
        e->page = blkno;
        e->refs = 1;
        return;
    }
    e = FindEntry(vs, ref, true);
    if (e == NULL)
        Corrupt(vs, "Vector tuple (%u,%u) is not referenced by any list entry.", blkno, off);
    e->refs++;
    e->heap_id = GpuivfTidToId((ItemPointer) &vt->heaptid);
    e->hash = VectorHash(x, d);
    QueueCheck(vs, x, e);
}

/* Every block: known role, or a vector page whose tuples are checked. */
static void
VerifyPages(VerifyState *vs)
{
    int         d = (int) vs->meta.dims;
    Size        vsize = GpuivfVectorTupleSize(&vs->meta);
    bool        values = !GpuivfMetaRerankFromTable(&vs->meta);
    float4     *x = (float4 *) palloc(sizeof(float4) * Max(d, 1));
    Page        copy = (Page) palloc(BLCKSZ);
    int64       nvectors = 0;

    if (vs->by_vector)
    {
        qsort(vs->entries, vs->nentries, sizeof(VerifyEntry), CompareRef);
        for (int64 i = 1; i < vs->nentries; i++)
            if (vs->entries[i].ref_id == vs->entries[i - 1].ref_id)
                Corrupt(vs, "Two list entries point at the same vector tuple.");
    }
    for (BlockNumber blkno = 1; blkno < vs->nblocks; blkno++)
    {
        Buffer      buf = ReadBuffer(vs->index, blkno);
        Page        page;
        uint16      type;
        OffsetNumber maxoff;

        CHECK_FOR_INTERRUPTS();
        LockBuffer(buf, BUFFER_LOCK_SHARE);
        page = BufferGetPage(buf);
        if (PageIsNew(page))
        {
            /* left by an extension whose record never came: free space */
            UnlockReleaseBuffer(buf);
            continue;
        }
        if (PageGetSpecialSize(page) != MAXALIGN(sizeof(GpuivfPageOpaqueData)) ||
            GpuivfPageGetOpaque(page)->page_id != GPUIVF_PAGE_ID)
            Corrupt(vs, "Block %u is not a gpuivf page.", blkno);
        type = GpuivfPageGetOpaque(page)->page_type;
        if (type != GPUIVF_PAGE_VECTOR)
        {
            uint8       expected = type == GPUIVF_PAGE_CENTROIDS ? ROLE_CENTROIDS
                : type == GPUIVF_PAGE_CODEBOOK ? ROLE_CODEBOOK
                : type == GPUIVF_PAGE_DIRECTORY ? ROLE_DIRECTORY
                : type == GPUIVF_PAGE_LIST ? ROLE_LIST
                : type == GPUIVF_PAGE_CALIB ? ROLE_CALIB : 255;

            if (vs->role[blkno] != expected)
                Corrupt(vs, "Block %u is a page of type %u that nothing refers to.", blkno, type);
            UnlockReleaseBuffer(buf);
            continue;
        }
        if (vs->role[blkno] != ROLE_NONE || !GpuivfMetaStoresVectors(&vs->meta))
            Corrupt(vs, "Block %u is a vector page where none belongs.", blkno);
        /* check a copy, so the engine never runs under the page lock */
        memcpy(copy, page, BLCKSZ);
        UnlockReleaseBuffer(buf);
        maxoff = PageGetMaxOffsetNumber(copy);
        CheckLinePointers(vs, "Vector", blkno, maxoff);
        for (OffsetNumber off = FirstOffsetNumber; off <= maxoff; off++)
        {
            ItemId      iid = PageGetItemId(copy, off);
            GpuivfVectorTuple *vt;

            if (!ItemIdIsUsed(iid))
                continue;
            if (!ItemIdIsNormal(iid) || ItemIdGetLength(iid) != vsize || d == 0)
                Corrupt(vs, "Vector page %u has a bad item at offset %u.", blkno, off);
            vt = (GpuivfVectorTuple *) PageGetItem(copy, iid);
            if (vs->meta.storage == GPUIVF_STORAGE_FLOAT16)
                gpuivf::half_to_float_n((const uint16_t *) vt->x, x, d);
            else if (values)
                memcpy(x, vt->x, sizeof(float4) * d);
            VerifyVectorTuple(vs, blkno, off, vt, values ? x : NULL);
            nvectors++;
        }
    }
    if (vs->trained)
        CheckBatch(vs);
    if (vs->by_vector)
    {
        for (int64 i = 0; i < vs->nentries; i++)
            if (vs->entries[i].refs != 1)
            {
                ItemPointerData t;

                GpuivfIdToTid(vs->entries[i].ref_id, &t);
                Corrupt(vs, "A list entry of list %d points at (%u,%u), which is no vector tuple.",
                        vs->entries[i].list, ItemPointerGetBlockNumberNoCheck(&t),
                        ItemPointerGetOffsetNumberNoCheck(&t));
            }
    }
    if (!vs->trained && (uint64) nvectors != vs->meta.vectors)
        Corrupt(vs, "The index holds " INT64_FORMAT " vectors but the metapage counts " UINT64_FORMAT ".",
                nvectors, vs->meta.vectors);
    pfree(x);
    pfree(copy);
}

/* ------------------------------------------------------- heapallindexed */

/* Heap scan callback: every visible row with a vector is indexed, once,
 * with the same vector (or list and code when the index stores none). */
static void
HeapRowCallback(Relation index, ItemPointer tid, Datum *values, bool *isnull,
                bool tupleIsAlive, void *arg)
{
    VerifyState *vs = (VerifyState *) arg;
    VerifyEntry *e;
    float4     *x;
    int         dims;

    if (isnull[0])
        return;
    e = FindEntry(vs, GpuivfTidToId(tid), false);
    if (e == NULL)
        Corrupt(vs, "Heap row (%u,%u) has a vector but is not in the index.",
                ItemPointerGetBlockNumber(tid), ItemPointerGetOffsetNumber(tid));
    if (e->seen)
        Corrupt(vs, "Heap row (%u,%u) was reported twice by the table scan.",
                ItemPointerGetBlockNumber(tid), ItemPointerGetOffsetNumber(tid));
    e->seen = true;
    x = GpuivfDatumGetVector(GpuivfGetOpclassInfo(index).type, values[0], &dims);
    if ((uint32) dims != vs->meta.dims)
        Corrupt(vs, "Heap row (%u,%u) has %d dimensions but the index has %u.",
                ItemPointerGetBlockNumber(tid), ItemPointerGetOffsetNumber(tid), dims,
                vs->meta.dims);
    if (GpuivfMetaStoresVectors(&vs->meta))
    {
        if (!GpuivfMetaRerankFromTable(&vs->meta) && VectorHash(x, dims) != e->hash)
            Corrupt(vs, "The index stores a different vector for heap row (%u,%u).",
                    ItemPointerGetBlockNumber(tid), ItemPointerGetOffsetNumber(tid));
    }
    else
        QueueCheck(vs, x, e);
    pfree(x);
}

/* Is the index entry still there?  (A concurrent VACUUM may have removed
 * it, and then freed the heap line pointer, after we read the index.) */
static bool
EntryStillPresent(VerifyState *vs, const VerifyEntry *e)
{
    Buffer      buf = ReadBuffer(vs->index, e->page);
    Page        page;
    bool        found = false;
    OffsetNumber maxoff;

    LockBuffer(buf, BUFFER_LOCK_SHARE);
    page = BufferGetPage(buf);
    maxoff = PageGetMaxOffsetNumber(page);
    if (GpuivfMetaStoresVectors(&vs->meta))
    {
        ItemPointerData ref;

        GpuivfIdToTid(e->ref_id, &ref);
        if (GpuivfPageIsType(page, GPUIVF_PAGE_VECTOR) &&
            ItemPointerGetOffsetNumber(&ref) <= maxoff &&
            ItemIdIsNormal(PageGetItemId(page, ItemPointerGetOffsetNumber(&ref))))
        {
            GpuivfVectorTuple *vt = (GpuivfVectorTuple *)
                PageGetItem(page, PageGetItemId(page, ItemPointerGetOffsetNumber(&ref)));

            found = GpuivfTidToId(&vt->heaptid) == e->heap_id;
        }
    }
    else if (GpuivfPageIsType(page, GPUIVF_PAGE_LIST))
    {
        for (OffsetNumber off = FirstOffsetNumber; off <= maxoff && !found; off++)
        {
            GpuivfListEntry *le = (GpuivfListEntry *) PageGetItem(page, PageGetItemId(page, off));

            found = GpuivfTidToId(&le->tid) == e->heap_id;
        }
    }
    UnlockReleaseBuffer(buf);
    return found;
}

/* Does the heap still have a line pointer in use at id? */
static bool
HeapSlotInUse(Relation heap, uint64 id, BlockNumber heap_blocks)
{
    ItemPointerData tid;
    Buffer      buf;
    Page        page;
    bool        used = false;

    GpuivfIdToTid(id, &tid);
    if (ItemPointerGetBlockNumber(&tid) >= heap_blocks)
        return false;
    buf = ReadBuffer(heap, ItemPointerGetBlockNumber(&tid));
    LockBuffer(buf, BUFFER_LOCK_SHARE);
    page = BufferGetPage(buf);
    if (!PageIsNew(page) && ItemPointerGetOffsetNumber(&tid) <= PageGetMaxOffsetNumber(page))
        used = ItemIdIsUsed(PageGetItemId(page, ItemPointerGetOffsetNumber(&tid)));
    UnlockReleaseBuffer(buf);
    return used;
}

/* Forward: table_index_build_scan under the snapshot.  Reverse: entries the
 * scan did not report must point at a heap line pointer still in use. */
static void
VerifyHeapAllIndexed(VerifyState *vs, Snapshot snapshot)
{
    IndexInfo  *indexInfo = BuildIndexInfo(vs->index);
    TableScanDesc scan;
    BlockNumber heap_blocks;

    qsort(vs->entries, vs->nentries, sizeof(VerifyEntry), CompareHeap);
    for (int64 i = 1; i < vs->nentries; i++)
        if (vs->entries[i].heap_id == vs->entries[i - 1].heap_id)
        {
            ItemPointerData t;

            GpuivfIdToTid(vs->entries[i].heap_id, &t);
            Corrupt(vs, "Heap row (%u,%u) is indexed more than once.",
                    ItemPointerGetBlockNumberNoCheck(&t), ItemPointerGetOffsetNumberNoCheck(&t));
        }
    indexInfo->ii_Concurrent = true;    /* only rows visible to the snapshot */
    scan = table_beginscan_strat(vs->heap, snapshot, 0, NULL, true, false);
    table_index_build_scan(vs->heap, vs->index, indexInfo, true, false, HeapRowCallback,
                           (void *) vs, scan);
    if (vs->trained && !GpuivfMetaStoresVectors(&vs->meta))
        CheckBatch(vs);

    heap_blocks = RelationGetNumberOfBlocks(vs->heap);
    for (int64 i = 0; i < vs->nentries; i++)
    {
        VerifyEntry *e = &vs->entries[i];

        CHECK_FOR_INTERRUPTS();
        if (e->seen || HeapSlotInUse(vs->heap, e->heap_id, heap_blocks))
            continue;
        if (EntryStillPresent(vs, e))
        {
            ItemPointerData t;

            GpuivfIdToTid(e->heap_id, &t);
            Corrupt(vs, "The index has an entry for heap row (%u,%u), which does not exist.",
                    ItemPointerGetBlockNumberNoCheck(&t), ItemPointerGetOffsetNumberNoCheck(&t));
        }
    }
}

/* One complete verification pass in memory context ctx. */
static void
RunVerify(Relation index, Relation heap, bool heapallindexed, MemoryContext ctx)
{
    MemoryContext old = MemoryContextSwitchTo(ctx);
    Snapshot    snapshot = InvalidSnapshot;
    VerifyState *vs;

    /* rows visible to this snapshot were inserted into the index before */
    if (heapallindexed)
        snapshot = RegisterSnapshot(GetTransactionSnapshot());

    vs = (VerifyState *) palloc0(sizeof(VerifyState));
    vs->index = index;
    vs->heap = heap;
    vs->nblocks = RelationGetNumberOfBlocks(index);
    vs->role = (uint8 *) palloc_extended(vs->nblocks, MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
    VerifyMeta(vs);
    if (vs->trained)
    {
        LoadModel(vs);
        VerifyLists(vs);
    }
    VerifyPages(vs);
    if (heapallindexed)
    {
        VerifyHeapAllIndexed(vs, snapshot);
        UnregisterSnapshot(snapshot);
    }
    MemoryContextSwitchTo(old);
}

/*
 * Writers may run meanwhile (AccessShareLock only): an inconsistency seen
 * while the metapage generation moved is retried in a fresh subtransaction
 * rather than reported, up to GPUIVF_VERIFY_ATTEMPTS times.
 */
#define GPUIVF_VERIFY_ATTEMPTS 5

/* Verify one (leaf) index; see the file comment. */
static void
VerifyIndex(Oid relid, Oid heapid, bool heapallindexed)
{
    Relation    heap;
    Relation    index = GpuivfOpenCheckedIndex(relid, heapid, &heap);
    MemoryContext outer = CurrentMemoryContext;
    ResourceOwner owner = CurrentResourceOwner;

    if (!index->rd_index->indisvalid)
        ereport(ERROR,
                (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                 errmsg("cannot verify index \"%s\"", RelationGetRelationName(index)),
                 errdetail("Index is not valid.")));
    gpuivf::init_blas_single_threaded();

    for (int attempt = 1;; attempt++)
    {
        MemoryContext ctx = AllocSetContextCreate(outer, "gpuivf verify", ALLOCSET_DEFAULT_SIZES);
        volatile bool done = false;

        BeginInternalSubTransaction(NULL);
        MemoryContextSwitchTo(outer);
        PG_TRY();
        {
            RunVerify(index, heap, heapallindexed, ctx);
            ReleaseCurrentSubTransaction();
            MemoryContextSwitchTo(outer);
            CurrentResourceOwner = owner;
            done = true;
        }
        PG_CATCH();
        {
            ErrorData  *edata;

            MemoryContextSwitchTo(outer);
            edata = CopyErrorData();
            FlushErrorState();
            RollbackAndReleaseCurrentSubTransaction();
            MemoryContextSwitchTo(outer);
            CurrentResourceOwner = owner;
            if (edata->sqlerrcode != ERRCODE_T_R_SERIALIZATION_FAILURE ||
                attempt >= GPUIVF_VERIFY_ATTEMPTS)
                ReThrowError(edata);
            FreeErrorData(edata);
            /* let the writers get ahead, hoping for a quiet moment */
            pg_usleep(100000L * attempt);
        }
        PG_END_TRY();
        MemoryContextDelete(ctx);
        if (done)
            break;
    }

    index_close(index, AccessShareLock);
    table_close(heap, AccessShareLock);
}

/* gpuivf_verify(regclass, heapallindexed): one index, or every partition's
 * index of a partitioned one (the first problem found is raised). */
Datum
gpuivf_verify(PG_FUNCTION_ARGS)
{
    Oid         relid = PG_GETARG_OID(0);
    bool        heapallindexed = PG_ARGISNULL(1) ? false : PG_GETARG_BOOL(1);
    bool        partitioned;
    Oid         heapid = GpuivfCheckIndexArg(relid, &partitioned);

    if (!partitioned)
        VerifyIndex(relid, heapid, heapallindexed);
    else
    {
        List       *leaves = GpuivfLockPartitionIndexes(relid, heapid);
        ListCell   *lc;

        foreach(lc, leaves)
            VerifyIndex(lfirst_oid(lc), IndexGetRelation(lfirst_oid(lc), false), heapallindexed);
    }
    PG_RETURN_VOID();
}
