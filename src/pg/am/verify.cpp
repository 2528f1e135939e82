/*
 * am/verify.cpp — the SQL function gpuivf_verify(regclass, heapallindexed
 * boolean).
 *
 * gpuivf_verify is the amcheck of gpuivf.  It checks, under AccessShareLock:
 *   - the metapage (format, options, page ranges, the calibration's curves
 *     and re-rank depths);
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
 *
 * This file: the SQL function, the retry loop, the state and the metapage
 * and model checks; the other checks: verify.h.
 */
#include "gpuivf.h"
#include "am/am.h"
#include "am/verify.h"
#include "calibration/calibration.h"
#include "storage/storage.h"

#include <cmath>

extern "C" {
PG_FUNCTION_INFO_V1(gpuivf_verify);
}

/* Raise "index corrupted" with a sentence saying what. */
void
VerifyCorrupt(VerifyState *vs, const char *fmt,...)
{
    char        detail[512];
    va_list     args;

    GpuivfMetaPageData now;
    bool        changed;

    va_start(args, fmt);
    vsnprintf(detail, sizeof(detail), fmt, args);
    va_end(args);

    /* a writer changed the index while we read it: not evidence (inserts
     * into a trained index move only its version: storage/storage.h) */
    GpuivfReadMeta(vs->index, &now);
    changed = now.generation != vs->meta.generation || now.calib_id != vs->meta.calib_id ||
        now.calib_free_pages != vs->meta.calib_free_pages;
    if (!changed && vs->have_version)
        changed = GpuivfReadRows(vs->index, &now) != vs->version;
    if (changed)
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
        VerifyCorrupt(vs, "The %s pages (%u at block %u) lie outside the index's %u blocks.",
                what, n, start, vs->nblocks);
    for (uint32 i = 0; i < n; i++)
    {
        if (vs->role[start + i] != ROLE_NONE)
            VerifyCorrupt(vs, "Block %u is used as %s page and for something else.", start + i, what);
        vs->role[start + i] = role;
    }
}

/* Append an entry; returns it. */
VerifyEntry *
VerifyAddEntry(VerifyState *vs)
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
int64
VerifyAddCode(VerifyState *vs, const uint8 *code)
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
uint64
VerifyVectorHash(const float4 *x, int dims)
{
    return hash_bytes_extended((const unsigned char *) x, dims * (int) sizeof(float4), 0);
}

/* ------------------------------------------------------- metapage, model */

/* One recall point: a mean in [0, 1] with a finite, non-negative error. */
static bool
RecallPointValid(const GpuivfRecallPoint *p)
{
    return std::isfinite(p->recall) && p->recall >= 0 && p->recall <= 1 &&
        std::isfinite(p->recall_se) && p->recall_se >= 0;
}

/*
 * The calibration's curves: what scans choose their probes and re-rank
 * depth from (search/probes.cpp clamps what it reads, so a bad curve gives
 * wrong probes, not a crash; this says so).  Points within the curve
 * array, their probe counts ascending within 1 .. lists, k ascending,
 * recalls within [0, 1], the deeper re-rank depths within the array,
 * ascending above the first, within kMaxK, and only with re-rank.
 */
static void
VerifyCalibration(VerifyState *vs)
{
    const GpuivfMetaPageData *m = &vs->meta;
    int         npoints = m->calib_npoints;
    int         prev_depth;

    if (m->calib_sample == 0)
        return;
    if (npoints > GPUIVF_CURVE_POINTS)
        VerifyCorrupt(vs, "The calibration has %d points; a curve holds %d at most.",
                      npoints, GPUIVF_CURVE_POINTS);
    for (int j = 0; j < npoints; j++)
        if (m->calib_nprobe[j] < 1 || m->calib_nprobe[j] > m->lists ||
            (j > 0 && m->calib_nprobe[j] <= m->calib_nprobe[j - 1]))
            VerifyCorrupt(vs, "The calibration's probe counts are not ascending within 1 to %u lists (point %d: %u).",
                          m->lists, j, m->calib_nprobe[j]);
    for (int c = 1; c < GPUIVF_CURVE_KS; c++)
        if (m->calib_k[c] != 0 && m->calib_k[c] <= m->calib_k[c - 1])
            VerifyCorrupt(vs, "The calibration's curves are not in ascending k (%u after %u).",
                          m->calib_k[c], m->calib_k[c - 1]);
    if (m->calib_deep_count > GPUIVF_CALIB_DEEPER)
        VerifyCorrupt(vs, "The calibration has %u deeper re-rank curves; the metapage holds %d at most.",
                      m->calib_deep_count, GPUIVF_CALIB_DEEPER);
    if (m->calib_deep_count > 0 && !GpuivfMetaReranks(m))
        VerifyCorrupt(vs, "The calibration has deeper re-rank curves but the index does not re-rank.");
    if (m->calib_depth > (uint32) gpuivf::kMaxK)
        VerifyCorrupt(vs, "The calibration's re-rank depth %u is above %d.", m->calib_depth, gpuivf::kMaxK);
    prev_depth = GpuivfCalibDepthAt(m, 0);
    for (int d = 1; d < GpuivfCalibDepthCount(m); d++)
    {
        int         depth = GpuivfCalibDepthAt(m, d);

        if (depth <= prev_depth || depth > gpuivf::kMaxK)
            VerifyCorrupt(vs, "The calibration's re-rank depth %d follows depth %d; depths ascend up to %d.",
                          depth, prev_depth, gpuivf::kMaxK);
        prev_depth = depth;
    }
    for (int d = 0; d < GpuivfCalibDepthCount(m); d++)
        for (int c = 0; c < GPUIVF_CURVE_KS; c++)
        {
            if (m->calib_k[c] == 0)
                continue;
            for (int j = 0; j < npoints; j++)
                if (!RecallPointValid(&GpuivfCalibPoints(m, d, c)[j]))
                    VerifyCorrupt(vs, "A calibration recall (depth %d, k %u, point %d) is outside 0 to 1.",
                                  GpuivfCalibDepthAt(m, d), m->calib_k[c], j);
        }
}

/* Metapage fields against each other and against the index's size. */
void
VerifyMeta(VerifyState *vs)
{
    GpuivfMetaPageData *m = &vs->meta;

    GpuivfReadMeta(vs->index, m);       /* magic, version, trained shape */
    vs->trained = GpuivfMetaIsTrained(m);
    vs->by_vector = vs->trained && GpuivfMetaStoresVectors(m);
    vs->role[GPUIVF_METAPAGE_BLKNO] = ROLE_META;
    if (m->metric != (uint16) GpuivfGetMetric(vs->index))
        VerifyCorrupt(vs, "The metapage says metric %u but the operator class is for metric %d.",
                m->metric, (int) GpuivfGetMetric(vs->index));
    if (m->storage != GpuivfStorageOf(GpuivfGetOpclassInfo(vs->index).type))
        VerifyCorrupt(vs, "The metapage says storage %u but the operator class is for %s.",
                m->storage, GpuivfVectorTypeName(GpuivfGetOpclassInfo(vs->index).type));
    if (vs->trained && GpuivfMetaRerankFromTable(m) && (m->flags & GPUIVF_META_RERANK) == 0)
        VerifyCorrupt(vs, "The metapage re-ranks from the table but does not re-rank.");
    if (!GpuivfMetaRerankFromTable(m) && GpuivfVectorTupleSize(m) > GPUIVF_MAX_VECTOR_TUPLE_SIZE)
        VerifyCorrupt(vs, "Vectors of %u dimensions are kept in the index but do not fit a page.",
                m->dims);
    if (m->vector_insert_page != InvalidBlockNumber && m->vector_insert_page >= vs->nblocks)
        VerifyCorrupt(vs, "The vector insert page %u is beyond the index's %u blocks.",
                m->vector_insert_page, vs->nblocks);
    if (!vs->trained)
    {
        if (m->lists != 0 || m->centroid_pages != 0 || m->codebook_pages != 0 ||
            m->directory_pages != 0)
            VerifyCorrupt(vs, "An untrained metapage has %u lists and model pages.", m->lists);
        if (m->dims == 0 && m->vectors != 0)
            VerifyCorrupt(vs, "The metapage counts " UINT64_FORMAT " vectors but has no dimensions.",
                    m->vectors);
        return;
    }
    if (m->centroid_pages != RawPages((Size) m->lists * m->dims * sizeof(float)))
        VerifyCorrupt(vs, "%u centroid pages do not hold %u lists of %u dimensions.",
                m->centroid_pages, m->lists, m->dims);
    if (m->codebook_pages !=
        RawPages(GpuivfCodebookFloats((int) m->dims, m->pq_m, m->pq_bits) * sizeof(float)))
        VerifyCorrupt(vs, "%u codebook pages do not hold the codebooks.", m->codebook_pages);
    if (m->directory_pages != RawPages((Size) m->lists * sizeof(GpuivfListDirEntry)))
        VerifyCorrupt(vs, "%u directory pages do not hold %u lists.", m->directory_pages, m->lists);
    ClaimRange(vs, m->centroid_start, m->centroid_pages, ROLE_CENTROIDS, "centroid");
    ClaimRange(vs, m->codebook_start, m->codebook_pages, ROLE_CODEBOOK, "codebook");
    ClaimRange(vs, m->directory_start, m->directory_pages, ROLE_DIRECTORY, "directory");
    VerifyCalibration(vs);
    vs->version = GpuivfReadRows(vs->index, m);
    vs->have_version = true;
    {
        char       *wrong = GpuivfCheckCalibChains(vs->index, m, vs->nblocks, vs->role, ROLE_CALIB);

        if (wrong != NULL)
            VerifyCorrupt(vs, "%s", wrong);
    }
}

/* Read centroids and codebooks into local memory (not rd_amcache). */
void
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
        VerifyCorrupt(vs, "A centroid has a NaN, infinite or out-of-range value.");
    if (!gpuivf::components_within(vs->codebook, nb, gpuivf::kMaxModelComponent))
        VerifyCorrupt(vs, "A codebook has a NaN, infinite or out-of-range value.");
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
 * while the metapage generation or the rows' version moved is retried in a fresh subtransaction
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