/*
 * am/verify_pages.cpp — gpuivf_verify's checks of the list chains and the
 * vector pages (page types, no cycle, no page in two chains, counts against
 * the directory and the metapage, line pointer bounds, vector tuples and
 * the entries pointing at them), and of codes against lists (the entry's
 * list is the nearest centroid of its vector, its code the best code).
 * The state and the steps: verify.h.
 */
#include "gpuivf.h"
#include "am/am.h"
#include "am/verify.h"
#include "calibration/calibration.h"
#include "storage/storage.h"

#include <cmath>

/* --------------------------------------------------------- codes vs lists */

/* Check the batch: list = nearest centroid and code = best code, both
 * within float tolerance (GEMM and loop rounding differ a little). */
void
VerifyCheckBatch(VerifyState *vs)
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
            VerifyCorrupt(vs, "The entry of heap row (%u,%u) is in list %d, but list %d is nearer (%g < %g).",
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
            VerifyCorrupt(vs, "The PQ code of heap row (%u,%u) does not encode its vector (error %g, best %g).",
                    ItemPointerGetBlockNumberNoCheck(&tid), ItemPointerGetOffsetNumberNoCheck(&tid),
                    err_s, err_b);
    }
    vs->bn = 0;
}

/* Queue one vector with its entry's list and code for VerifyCheckBatch. */
void
VerifyQueueCheck(VerifyState *vs, const float4 *x, const VerifyEntry *e)
{
    int         d = (int) vs->meta.dims;
    int         i = vs->bn++;

    memcpy(vs->bvec + (Size) i * d, x, sizeof(float) * d);
    vs->blist[i] = e->list;
    memcpy(vs->bcode + (Size) i * vs->meta.code_size,
           vs->codes + e->code_idx * vs->meta.code_size, vs->meta.code_size);
    vs->bid[i] = e->heap_id;
    if (vs->bn == VERIFY_BATCH)
        VerifyCheckBatch(vs);
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
        VerifyCorrupt(vs, "%s page %u has %u line pointers, more than the %d an index page may have.",
                kind, blkno, (unsigned) maxoff, (int) MaxIndexTuplesPerPage);
}

/* Walk one list's chain: page types, no cycle, counts, tail, insert_page. */
static void
VerifyList(VerifyState *vs, int list, const GpuivfListDirEntry *dir)
{
    BlockNumber blkno = dir->head;
    BlockNumber last = InvalidBlockNumber;
    bool        insert_seen = false;
    uint64      count = 0;
    Size        esize = GPUIVF_LIST_ENTRY_SIZE(vs->meta.code_size);

    if (blkno == InvalidBlockNumber &&
        (dir->count != 0 || dir->tail != InvalidBlockNumber || dir->insert_page != InvalidBlockNumber))
        VerifyCorrupt(vs, "List %d has no pages but its directory entry says otherwise.", list);
    while (blkno != InvalidBlockNumber)
    {
        Buffer      buf;
        Page        page;
        OffsetNumber maxoff;

        CHECK_FOR_INTERRUPTS();
        if (blkno >= vs->nblocks)
            VerifyCorrupt(vs, "List %d links to block %u, beyond the index's %u blocks.",
                    list, blkno, vs->nblocks);
        if (vs->role[blkno] != ROLE_NONE)
            VerifyCorrupt(vs, "List %d reaches block %u, which is already used (a cycle or a shared page).",
                    list, blkno);
        vs->role[blkno] = ROLE_LIST;
        buf = ReadBuffer(vs->index, blkno);
        LockBuffer(buf, BUFFER_LOCK_SHARE);
        page = BufferGetPage(buf);
        if (!GpuivfPageIsType(page, GPUIVF_PAGE_LIST))
            VerifyCorrupt(vs, "List %d reaches block %u, which is not a list page.", list, blkno);
        maxoff = PageGetMaxOffsetNumber(page);
        CheckLinePointers(vs, "List", blkno, maxoff);
        for (OffsetNumber off = FirstOffsetNumber; off <= maxoff; off++)
        {
            ItemId      iid = PageGetItemId(page, off);
            GpuivfListEntry *le;
            VerifyEntry *e;

            if (!ItemIdIsNormal(iid) || ItemIdGetLength(iid) != esize)
                VerifyCorrupt(vs, "List page %u has a bad item at offset %u.", blkno, off);
            le = (GpuivfListEntry *) PageGetItem(page, iid);
            if (!ItemPointerIsValid(&le->tid))
                VerifyCorrupt(vs, "List page %u has an entry with an invalid TID at offset %u.", blkno, off);
            e = VerifyAddEntry(vs);
            e->list = list;
            e->page = blkno;
            e->code_idx = VerifyAddCode(vs, le->code);
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
            VerifyCorrupt(vs, "List %d ends at block %u but its directory tail is %u.", list, last, dir->tail);
        if (!insert_seen)
            VerifyCorrupt(vs, "List %d has insert page %u, which is not on its chain.", list, dir->insert_page);
        if (count != dir->count)
            VerifyCorrupt(vs, "List %d has " UINT64_FORMAT " entries but its directory says %u.",
                    list, count, dir->count);
    }
}

/* The directory, then every chain (each holds its directory count; the
 * counts are the index's rows: no total on the metapage to compare). */
void
VerifyLists(VerifyState *vs)
{
    GpuivfMetaPageData *m = &vs->meta;
    GpuivfListDirEntry *dir = (GpuivfListDirEntry *)
        palloc_extended((Size) m->lists * sizeof(GpuivfListDirEntry), MCXT_ALLOC_HUGE);

    GpuivfReadRawPages(vs->index, m->directory_start, m->directory_pages, GPUIVF_PAGE_DIRECTORY,
                       dir, (Size) m->lists * sizeof(GpuivfListDirEntry));
    for (uint32 l = 0; l < m->lists; l++)
        VerifyList(vs, (int) l, &dir[l]);
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

int
VerifyCompareHeap(const void *a, const void *b)
{
    uint64      x = ((const VerifyEntry *) a)->heap_id;
    uint64      y = ((const VerifyEntry *) b)->heap_id;

    return x < y ? -1 : x > y ? 1 : 0;
}

/* Binary search of entries sorted by key (ref_id or heap_id). */
VerifyEntry *
VerifyFindEntry(VerifyState *vs, uint64 id, bool by_ref)
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
        VerifyCorrupt(vs, "Vector tuple (%u,%u) has an invalid heap TID.", blkno, off);
    /* (no values with re-rank from the table: x is NULL, and the untrained
     * entry's hash 0; heapallindexed then checks membership only) */
    if (x != NULL && !GpuivfValuesAcceptable(x, d))
        VerifyCorrupt(vs, "Vector tuple (%u,%u) has a NaN, infinite or out-of-range value.", blkno, off);
    if (!vs->trained)
    {
        e = VerifyAddEntry(vs);
        e->ref_id = ref;
        e->heap_id = GpuivfTidToId((ItemPointer) &vt->heaptid);
        e->hash = x != NULL ? VerifyVectorHash(x, d) : 0;
        e->page = blkno;
        e->refs = 1;
        return;
    }
    e = VerifyFindEntry(vs, ref, true);
    if (e == NULL)
        VerifyCorrupt(vs, "Vector tuple (%u,%u) is not referenced by any list entry.", blkno, off);
    e->refs++;
    e->heap_id = GpuivfTidToId((ItemPointer) &vt->heaptid);
    e->hash = VerifyVectorHash(x, d);
    VerifyQueueCheck(vs, x, e);
}

/* Every block: known role, or a vector page whose tuples are checked. */
void
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
                VerifyCorrupt(vs, "Two list entries point at the same vector tuple.");
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
            VerifyCorrupt(vs, "Block %u is not a gpuivf page.", blkno);
        type = GpuivfPageGetOpaque(page)->page_type;
        if (type != GPUIVF_PAGE_VECTOR)
        {
            uint8       expected = type == GPUIVF_PAGE_CENTROIDS ? ROLE_CENTROIDS
                : type == GPUIVF_PAGE_CODEBOOK ? ROLE_CODEBOOK
                : type == GPUIVF_PAGE_DIRECTORY ? ROLE_DIRECTORY
                : type == GPUIVF_PAGE_LIST ? ROLE_LIST
                : type == GPUIVF_PAGE_CALIB ? ROLE_CALIB : 255;

            if (vs->role[blkno] != expected)
                VerifyCorrupt(vs, "Block %u is a page of type %u that nothing refers to.", blkno, type);
            UnlockReleaseBuffer(buf);
            continue;
        }
        if (vs->role[blkno] != ROLE_NONE || !GpuivfMetaStoresVectors(&vs->meta))
            VerifyCorrupt(vs, "Block %u is a vector page where none belongs.", blkno);
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
                VerifyCorrupt(vs, "Vector page %u has a bad item at offset %u.", blkno, off);
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
        VerifyCheckBatch(vs);
    if (vs->by_vector)
    {
        for (int64 i = 0; i < vs->nentries; i++)
            if (vs->entries[i].refs != 1)
            {
                ItemPointerData t;

                GpuivfIdToTid(vs->entries[i].ref_id, &t);
                VerifyCorrupt(vs, "A list entry of list %d points at (%u,%u), which is no vector tuple.",
                        vs->entries[i].list, ItemPointerGetBlockNumberNoCheck(&t),
                        ItemPointerGetOffsetNumberNoCheck(&t));
            }
    }
    if (!vs->trained && (uint64) nvectors != vs->meta.vectors)
        VerifyCorrupt(vs, "The index holds " INT64_FORMAT " vectors but the metapage counts " UINT64_FORMAT ".",
                nvectors, vs->meta.vectors);
    pfree(x);
    pfree(copy);
}
