/*
 * storage/meta.cpp — reading the metapage, checking the on-disk format, and
 * the per-backend model cache (rd_amcache).
 *
 * The cache holds the trained model (centroids, their squared norms,
 * codebooks) of one index in a single palloc chunk in the index's
 * rd_indexcxt, so the relcache's pfree(rd_amcache) on invalidation frees all
 * of it.  It is keyed by the metapage's train_id, which a build sets and
 * nothing else changes; the metapage copy in it is refreshed on every call.
 */
#include "gpuivf.h"
#include "storage/storage.h"

#include "utils/memutils.h"
#include "utils/rel.h"

/* The engine's view of an index's model: meta's shape over the arrays. */
gpuivf::IvfPqModel
GpuivfModelOf(const GpuivfMetaPageData *meta, const float *centroids, const float *centroid_norms,
              const float *codebook)
{
    gpuivf::IvfPqModel model;

    memset(&model, 0, sizeof(model));
    model.metric = (gpuivf::Metric) meta->metric;
    model.d = (int) meta->dims;
    model.nlist = (int) meta->lists;
    model.m = (int) meta->pq_m;
    model.nbits = (int) meta->pq_bits;
    model.centroids = centroids;
    model.centroid_norms = centroid_norms;
    model.codebook = codebook;
    return model;
}

/* Copy the metapage out under a share lock and check its format. */
void
GpuivfReadMeta(Relation index, GpuivfMetaPageData *meta)
{
    Buffer      buf;
    Page        page;

    if (RelationGetNumberOfBlocks(index) == 0)
        ereport(ERROR,
                (errcode(ERRCODE_INDEX_CORRUPTED),
                 errmsg("gpuivf index \"%s\" has no metapage", RelationGetRelationName(index)),
                 errhint("Rebuild the index with REINDEX.")));
    buf = ReadBuffer(index, GPUIVF_METAPAGE_BLKNO);
    LockBuffer(buf, BUFFER_LOCK_SHARE);
    page = BufferGetPage(buf);
    if (!GpuivfPageIsType(page, GPUIVF_PAGE_META))
    {
        UnlockReleaseBuffer(buf);
        ereport(ERROR,
                (errcode(ERRCODE_INDEX_CORRUPTED),
                 errmsg("gpuivf index \"%s\" has no valid metapage",
                        RelationGetRelationName(index)),
                 errhint("Rebuild the index with REINDEX.")));
    }
    memcpy(meta, GpuivfPageGetMeta(page), sizeof(GpuivfMetaPageData));
    UnlockReleaseBuffer(buf);
    GpuivfCheckFormat(index, meta);
}

/* The metapage a caller already read in this statement, else read now. */
void
GpuivfGivenOrReadMeta(Relation index, const GpuivfMetaPageData *given, GpuivfMetaPageData *meta)
{
    if (given != NULL)
        *meta = *given;
    else
        GpuivfReadMeta(index, meta);
}

/*
 * Magic and format version.  A version this build does not read is not
 * corruption: the index was written by another gpuivf version, and REINDEX
 * rewrites it in the current format.
 */
void
GpuivfCheckFormat(Relation index, const GpuivfMetaPageData *meta)
{
    if (meta->magic != GPUIVF_MAGIC)
        ereport(ERROR,
                (errcode(ERRCODE_INDEX_CORRUPTED),
                 errmsg("index \"%s\" is not a gpuivf index", RelationGetRelationName(index)),
                 errdetail("The metapage has magic number 0x%08X, expected 0x%08X.",
                           meta->magic, (uint32) GPUIVF_MAGIC),
                 errhint("Rebuild the index with REINDEX.")));
    if (meta->version != GPUIVF_FORMAT_VERSION)
        ereport(ERROR,
                (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                 errmsg("gpuivf index \"%s\" has unsupported format version %u",
                        RelationGetRelationName(index), meta->version),
                 errdetail("This version of gpuivf reads format version %d.",
                           GPUIVF_FORMAT_VERSION),
                 errhint("Rebuild the index with REINDEX INDEX %s.",
                         RelationGetRelationName(index))));
    if (GpuivfMetaIsTrained(meta) &&
        (meta->lists == 0 || meta->lists > (uint32) gpuivf::kMaxLists || meta->dims == 0 ||
         meta->pq_m == 0 || meta->dims % meta->pq_m != 0 ||
         (meta->pq_bits != 4 && meta->pq_bits != 8) ||
         meta->code_size != (uint16) gpuivf::pq_code_size(meta->pq_m, meta->pq_bits)))
        ereport(ERROR,
                (errcode(ERRCODE_INDEX_CORRUPTED),
                 errmsg("gpuivf index \"%s\" has an inconsistent metapage",
                        RelationGetRelationName(index)),
                 errdetail("lists %u, dims %u, pq_m %u, pq_bits %u, code size %u.",
                           meta->lists, meta->dims, meta->pq_m, meta->pq_bits, meta->code_size),
                 errhint("Rebuild the index with REINDEX.")));
    if (meta->dims > (uint32) gpuivf::kMaxDims)
        ereport(ERROR,
                (errcode(ERRCODE_INDEX_CORRUPTED),
                 errmsg("gpuivf index \"%s\" has an inconsistent metapage",
                        RelationGetRelationName(index)),
                 errdetail("dims is %u.", meta->dims),
                 errhint("Rebuild the index with REINDEX.")));
}

/* Index-time limit on dimensions (pgvector's: vectors larger than a page
 * are re-ranked from the table, GpuivfStorageFlags). */
void
GpuivfCheckMaxDims(int dims)
{
    if (dims > gpuivf::kMaxDims)
        ereport(ERROR,
                (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                 errmsg("column cannot have more than %d dimensions for gpuivf index",
                        gpuivf::kMaxDims)));
}

/* The storage of a column type's values in vector tuples. */
uint16
GpuivfStorageOf(GpuivfVectorType type)
{
    return type == GPUIVF_TYPE_HALFVEC ? GPUIVF_STORAGE_FLOAT16 : GPUIVF_STORAGE_FLOAT4;
}

/* See storage.h. */
uint16
GpuivfStorageFlags(Relation index, const GpuivfOptions *opts, int dims, bool trained)
{
    uint16      storage = GpuivfStorageOf(GpuivfGetOpclassInfo(index).type);
    Size        size = GpuivfVectorTupleSizeFor(Max(dims, 1), storage, false);
    bool        too_big = dims > 0 && size > GPUIVF_MAX_VECTOR_TUPLE_SIZE;
    bool        vectors = !trained || opts->rerank;     /* rows need exact values */
    uint16      flags = opts->rerank ? GPUIVF_META_RERANK : 0;

    if (!vectors)
        return flags;
    if (opts->rerank_from == GPUIVF_RERANK_FROM_TABLE ||
        (opts->rerank_from == GPUIVF_RERANK_FROM_AUTO && too_big))
        return flags | GPUIVF_META_RERANK_TABLE;
    if (too_big)
        ereport(ERROR,
                (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                 errmsg("vectors of %d dimensions do not fit a page of gpuivf index \"%s\"",
                        dims, RelationGetRelationName(index)),
                 errdetail("A copy of one vector takes %zu bytes; a page holds at most %zu.",
                           size, (Size) GPUIVF_MAX_VECTOR_TUPLE_SIZE),
                 storage == GPUIVF_STORAGE_FLOAT4
                 ? errhint("Set rerank_from to 'table' or 'auto' to re-rank from the table's column, "
                           "or index a halfvec expression of the column (up to 4072 dimensions fit).")
                 : errhint("Set rerank_from to 'table' or 'auto' to re-rank from the table's column.")));
    return flags;
}

/* Name of a metric as gpuivf_index_info shows it. */
const char *
GpuivfMetricName(int metric)
{
    switch ((gpuivf::Metric) metric)
    {
        case gpuivf::Metric::L2:
            return "l2";
        case gpuivf::Metric::InnerProduct:
            return "inner_product";
        case gpuivf::Metric::Cosine:
            return "cosine";
    }
    return "unknown";
}

/* Bytes of a raw float array of n elements, as stored across pages. */
static Size
FloatBytes(uint64 n)
{
    return (Size) n * sizeof(float4);
}

/* Load the model named by meta into one chunk allocated in rd_indexcxt. */
static GpuivfIndexState *
LoadIndexState(Relation index, const GpuivfMetaPageData *meta)
{
    Size        ncentroid = 0;
    Size        ncodebook = 0;
    Size        total;
    char       *chunk;
    GpuivfIndexState *st;

    if (GpuivfMetaIsTrained(meta))
    {
        ncentroid = (Size) meta->lists * meta->dims;
        ncodebook = GpuivfCodebookFloats((int) meta->dims, meta->pq_m, meta->pq_bits);
    }
    total = MAXALIGN(sizeof(GpuivfIndexState)) + MAXALIGN(FloatBytes(ncentroid)) +
        MAXALIGN(FloatBytes(meta->lists)) + MAXALIGN(FloatBytes(ncodebook));
    chunk = (char *) MemoryContextAllocExtended(index->rd_indexcxt, total,
                                                MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
    st = (GpuivfIndexState *) chunk;
    chunk += MAXALIGN(sizeof(GpuivfIndexState));
    st->meta = *meta;
    st->centroids = (float *) chunk;
    chunk += MAXALIGN(FloatBytes(ncentroid));
    st->centroid_norms = (float *) chunk;
    chunk += MAXALIGN(FloatBytes(meta->lists));
    st->codebook = (float *) chunk;

    if (GpuivfMetaIsTrained(meta))
    {
        GpuivfReadRawPages(index, meta->centroid_start, meta->centroid_pages,
                           GPUIVF_PAGE_CENTROIDS, st->centroids, FloatBytes(ncentroid));
        GpuivfReadRawPages(index, meta->codebook_start, meta->codebook_pages,
                           GPUIVF_PAGE_CODEBOOK, st->codebook, FloatBytes(ncodebook));
        gpuivf::row_norms(st->centroids, meta->lists, meta->dims, st->centroid_norms);
    }
    st->model = GpuivfModelOf(meta, st->centroids, st->centroid_norms, st->codebook);
    return st;
}

/*
 * The index's model, loaded once per backend and train_id.  The metapage is
 * read on every call (one share lock), so meta is always current; the arrays
 * are reloaded only when a rebuild changed train_id.
 */
GpuivfIndexState *
GpuivfGetIndexState(Relation index)
{
    GpuivfMetaPageData meta;
    GpuivfIndexState *st = (GpuivfIndexState *) index->rd_amcache;

    GpuivfReadMeta(index, &meta);
    if (st != NULL && st->meta.train_id == meta.train_id &&
        st->meta.flags == meta.flags && st->meta.lists == meta.lists)
    {
        /* an untrained index keeps train_id 0; its dims may be fixed since */
        st->meta = meta;
        st->model.d = (int) meta.dims;
        return st;
    }
    if (st != NULL)
    {
        index->rd_amcache = NULL;
        pfree(st);
    }
    st = LoadIndexState(index, &meta);
    index->rd_amcache = st;
    return st;
}
