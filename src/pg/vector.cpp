/*
 * vector.cpp — vectors as gpuivf reads them: the metric and column type of
 * an index (from its operator class), checked vector input of every type
 * (real[] here, pgvector's vector and halfvec in pgvector.cpp: shape, NULLs,
 * NaN and infinity, dimensions), and the real[] SQL
 * distance functions behind the operators <-> (l2_distance), <#>
 * (negative_inner_product) and <=> (cosine_distance), plus inner_product.
 * They call the engine's functions, the same ones the index re-rank calls,
 * so an index scan and a sequential scan compute bit-identical distances.
 */
#include "gpuivf.h"
#include "storage/storage.h"

#include <cmath>

/* gpuivf's distance functions: what each says about an index's opclass */
static const struct
{
    PGFunction  fn;
    gpuivf::Metric metric;
    GpuivfVectorType type;
}           gpuivf_distance_functions[] = {
    {gpuivf_l2_distance, gpuivf::Metric::L2, GPUIVF_TYPE_REAL_ARRAY},
    {gpuivf_negative_inner_product, gpuivf::Metric::InnerProduct, GPUIVF_TYPE_REAL_ARRAY},
    {gpuivf_cosine_distance, gpuivf::Metric::Cosine, GPUIVF_TYPE_REAL_ARRAY},
    {gpuivf_vector_l2_distance, gpuivf::Metric::L2, GPUIVF_TYPE_VECTOR},
    {gpuivf_vector_negative_inner_product, gpuivf::Metric::InnerProduct, GPUIVF_TYPE_VECTOR},
    {gpuivf_vector_cosine_distance, gpuivf::Metric::Cosine, GPUIVF_TYPE_VECTOR},
    {gpuivf_halfvec_l2_distance, gpuivf::Metric::L2, GPUIVF_TYPE_HALFVEC},
    {gpuivf_halfvec_negative_inner_product, gpuivf::Metric::InnerProduct, GPUIVF_TYPE_HALFVEC},
    {gpuivf_halfvec_cosine_distance, gpuivf::Metric::Cosine, GPUIVF_TYPE_HALFVEC},
};

/* Is fn one of gpuivf's distance functions?  Then *info says its metric and
 * the column type it takes. */
bool
GpuivfDistanceFunctionInfo(PGFunction fn, GpuivfOpclassInfo *info)
{
    for (const auto &f : gpuivf_distance_functions)
    {
        if (f.fn == fn)
        {
            info->metric = f.metric;
            info->type = f.type;
            return true;
        }
    }
    return false;
}

/*
 * The metric and column type of an index, recognised by its support
 * function 1: the opclasses (gpuivf's for real[], gpuivf_vector's for
 * pgvector's types) name one of gpuivf's own distance functions there.
 */
GpuivfOpclassInfo
GpuivfGetOpclassInfo(Relation index)
{
    FmgrInfo   *proc = index_getprocinfo(index, 1, GPUIVF_DISTANCE_PROC);
    GpuivfOpclassInfo info;

    if (!GpuivfDistanceFunctionInfo(proc->fn_addr, &info))
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
                 errmsg("support function %d of index \"%s\" is not a gpuivf distance function",
                        GPUIVF_DISTANCE_PROC, RelationGetRelationName(index)),
                 errhint("Use one of gpuivf's operator classes: float4_l2_ops, float4_ip_ops or "
                         "float4_cosine_ops for real[]; vector_*_ops or halfvec_*_ops of the "
                         "extension gpuivf_vector for pgvector's types.")));
    return info;
}

gpuivf::Metric
GpuivfGetMetric(Relation index)
{
    return GpuivfGetOpclassInfo(index).metric;
}

/* The SQL name of a column type gpuivf indexes (gpuivf_index_info). */
const char *
GpuivfVectorTypeName(GpuivfVectorType type)
{
    switch (type)
    {
        case GPUIVF_TYPE_REAL_ARRAY:
            return "real[]";
        case GPUIVF_TYPE_VECTOR:
            return "vector";
        case GPUIVF_TYPE_HALFVEC:
            return "halfvec";
    }
    return "unknown";
}

/*
 * Dimensions from the index column's typmod: pgvector's vector(n) and
 * halfvec(n) store n there.  0 when there is none (real[] has no such
 * typmod; a pgvector column may be declared without one).
 */
int
GpuivfTypmodDims(Relation index)
{
    Form_pg_attribute att = TupleDescAttr(RelationGetDescr(index), 0);

    if (att->atttypid == FLOAT4ARRAYOID || att->atttypmod <= 0)
        return 0;
    return att->atttypmod <= gpuivf::kMaxDims ? att->atttypmod : 0;
}

/*
 * Are all of x[0..n) acceptable vector values: finite, and no larger in
 * magnitude than gpuivf::kMaxComponent (1e15, chosen so that no distance or
 * training sum overflows float32; see gpuivf_core.h)?  The fast test flags
 * every float of magnitude 2^49 (5.6e14) or more, NaN and infinities
 * included: those whose exponent field is at least 127 + 49, so that adding
 * 256 - 176 to the field carries into the sign bit.  Written on four lanes at
 * a time (GCC/Clang vector extensions: SSE2, NEON): every kNN statement
 * checks the query and each returned row's vector through the distance
 * operator (the executor projects the ORDER BY expression), and the
 * element-wise loop took about twice the CPU of this one.  Only flagged
 * arrays take the exact element-wise test.
 */
typedef uint32 GpuivfU32x4 __attribute__((vector_size(16)));

static inline bool
GpuivfAnyLarge(const float4 *x, int n)
{
    const uint32 exp_mask = 0x7f800000;
    const uint32 exp_carry = (uint32) (256 - (127 + 49)) << 23;
    GpuivfU32x4 acc = {0, 0, 0, 0};
    uint32      bad = 0;
    int         i = 0;

    for (; i + 4 <= n; i += 4)
    {
        GpuivfU32x4 b;

        memcpy(&b, x + i, sizeof(b));
        acc |= (b & exp_mask) + exp_carry;
    }
    for (; i < n; i++)
    {
        uint32      b;

        memcpy(&b, x + i, sizeof(b));
        bad |= (b & exp_mask) + exp_carry;
    }
    bad |= acc[0] | acc[1] | acc[2] | acc[3];
    return (bad & 0x80000000) != 0;
}

bool
GpuivfValuesAcceptable(const float4 *x, int n)
{
    return !GpuivfAnyLarge(x, n) || gpuivf::components_within(x, n, gpuivf::kMaxComponent);
}

/*
 * The error for the first value of x[0..n) that GpuivfValuesAcceptable
 * refuses; what names its element: "array" with its lower bound, "vector"
 * (pgvector's, numbered from 1).
 */
static void
RaiseBadValue(const float4 *x, int n, const char *what, int first)
{
    for (int i = 0; i < n; i++)
    {
        if (std::isnan(x[i]))
            ereport(ERROR,
                    (errcode(ERRCODE_DATA_EXCEPTION),
                     errmsg("vector must not contain NaN")));
        if (std::isinf(x[i]))
            ereport(ERROR,
                    (errcode(ERRCODE_DATA_EXCEPTION),
                     errmsg("vector must not contain infinite values")));
        if (std::fabs(x[i]) > gpuivf::kMaxComponent)
            ereport(ERROR,
                    (errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
                     errmsg("vector value %g is out of range", (double) x[i]),
                     errdetail("Element %d of the %s; vector values must lie between -1e+15 and 1e+15, so that no distance overflows single precision.",
                               first + i, what)));
    }
}

/*
 * Checks a detoasted real[] for use as a vector and returns its values in
 * place: real elements, no NULLs, one dimension, not empty, all finite and
 * within +-gpuivf::kMaxComponent.
 */
const float4 *
GpuivfArrayGetValues(ArrayType *array, int *dims)
{
    const float4 *x;
    int         n;

    if (ARR_ELEMTYPE(array) != FLOAT4OID)
        ereport(ERROR,
                (errcode(ERRCODE_DATATYPE_MISMATCH),
                 errmsg("vector must be an array of real")));
    if (ARR_NDIM(array) == 0)
        ereport(ERROR,
                (errcode(ERRCODE_DATA_EXCEPTION),
                 errmsg("array must not be empty")));
    if (ARR_NDIM(array) > 1)
        ereport(ERROR,
                (errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
                 errmsg("array must be one-dimensional"),
                 errdetail("The array has %d dimensions.", ARR_NDIM(array))));
    if (ARR_HASNULL(array) && array_contains_nulls(array))
        ereport(ERROR,
                (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                 errmsg("array must not contain nulls")));

    n = ARR_DIMS(array)[0];
    if (n <= 0)
        ereport(ERROR,
                (errcode(ERRCODE_DATA_EXCEPTION),
                 errmsg("array must not be empty")));

    /* without NULLs the elements are a plain, aligned float4 array; the
     * element-wise loop only runs to name the first bad element's error */
    x = (const float4 *) ARR_DATA_PTR(array);
    if (unlikely(!GpuivfValuesAcceptable(x, n)))
        RaiseBadValue(x, n, "array", ARR_LBOUND(array)[0]);
    *dims = n;
    return x;
}

/* The index's dimension limit (kMaxDims), on top of the type's checks. */
static void
CheckIndexableDims(int n)
{
    if (n > gpuivf::kMaxDims)
        ereport(ERROR,
                (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                 errmsg("column cannot have more than %d dimensions for gpuivf index",
                        gpuivf::kMaxDims),
                 errdetail("The vector has %d dimensions.", n)));
}

/*
 * The checked float4 values of a vector datum of the given type: in place
 * for real[] and vector (inside the datum, detoasted into the current
 * context when it had to be), a palloc'd exact widening for halfvec.
 */
const float4 *
GpuivfVectorValues(GpuivfVectorType type, Datum value, int *dims)
{
    const float4 *x;

    switch (type)
    {
        case GPUIVF_TYPE_VECTOR:
            x = GpuivfPgvectorValues(value, dims);
            /* pgvector's values are finite; gpuivf's bound is tighter */
            if (unlikely(!GpuivfValuesAcceptable(x, *dims)))
                RaiseBadValue(x, *dims, "vector", 1);
            break;
        case GPUIVF_TYPE_HALFVEC:
            {
                const uint16 *h = GpuivfHalfvecValues(value, dims);
                float4     *w = (float4 *) palloc(sizeof(float4) * *dims);

                gpuivf::half_to_float_n(h, w, *dims);
                x = w;
                /* pgvector refuses infinite and NaN halves on input */
                if (unlikely(!GpuivfValuesAcceptable(x, *dims)))
                    RaiseBadValue(x, *dims, "vector", 1);
                break;
            }
        default:
            x = GpuivfArrayGetValues(DatumGetArrayTypeP(value), dims);
            break;
    }
    CheckIndexableDims(*dims);
    return x;
}

/*
 * GpuivfVectorValues without the errors: NULL for a malformed vector (not
 * one-dimensional, NULLs, empty, non-finite, a bad pgvector header) or one
 * above the index's dimension limit.  For a caller that searches ahead and
 * leaves the error to the scan that would raise it (planner/batch_node.cpp).
 */
const float4 *
GpuivfVectorValuesIfValid(GpuivfVectorType type, Datum value, int *dims)
{
    const float4 *x;
    int         n;

    if (type == GPUIVF_TYPE_REAL_ARRAY)
    {
        ArrayType  *array = DatumGetArrayTypeP(value);

        if (ARR_ELEMTYPE(array) != FLOAT4OID || ARR_NDIM(array) != 1 || ARR_HASNULL(array))
            return NULL;
        n = ArrayGetNItems(ARR_NDIM(array), ARR_DIMS(array));
        x = (const float4 *) ARR_DATA_PTR(array);
    }
    else
    {
        /* pgvector's layout (pgvector.cpp): header, int16 dim, int16 unused, values */
        const char *v = (const char *) PG_DETOAST_DATUM(value);
        Size        elem = type == GPUIVF_TYPE_HALFVEC ? sizeof(uint16) : sizeof(float4);
        int16       dim;

        memcpy(&dim, v + sizeof(int32), sizeof(int16));
        if (dim < 1 || VARSIZE(v) != 2 * sizeof(int32) + elem * (Size) dim)
            return NULL;
        n = dim;
        if (type == GPUIVF_TYPE_HALFVEC)
        {
            const uint16 *h = (const uint16 *) (v + 2 * sizeof(int32));
            float4     *w = (float4 *) palloc(sizeof(float4) * n);

            gpuivf::half_to_float_n(h, w, n);
            x = w;
        }
        else
            x = (const float4 *) (v + 2 * sizeof(int32));
    }
    if (n <= 0 || n > gpuivf::kMaxDims || !GpuivfValuesAcceptable(x, n))
        return NULL;
    *dims = n;
    return x;
}

/* A checked, palloc'd copy of the vector in a datum, for indexing. */
float4 *
GpuivfDatumGetVector(GpuivfVectorType type, Datum value, int *dims)
{
    const float4 *x = GpuivfVectorValues(type, value, dims);
    float4     *copy;

    if (type == GPUIVF_TYPE_HALFVEC)
        return (float4 *) x;    /* already a copy */
    copy = (float4 *) palloc(sizeof(float4) * *dims);
    memcpy(copy, x, sizeof(float4) * *dims);
    return copy;
}

/*
 * The vector of an index-build-scan row (first column), validated as
 * GpuivfVectorValues does, not copied (but for halfvec's widening): valid
 * until the callback returns and rowctx is reset.  NULL when the row's
 * vector is NULL.  Scans of every row call this once per row: a copy was a
 * palloc and a memcpy per row for nothing.
 */
const float4 *
GpuivfRowVector(GpuivfVectorType type, Datum *values, bool *isnull, MemoryContext rowctx,
                int *dims)
{
    MemoryContext old;
    const float4 *x;

    if (isnull[0])
        return NULL;
    old = MemoryContextSwitchTo(rowctx);
    x = GpuivfVectorValues(type, values[0], dims);
    MemoryContextSwitchTo(old);
    return x;
}

/* A palloc'd datum of the type holding x[0..dims). */
Datum
GpuivfVectorDatum(GpuivfVectorType type, const float4 *x, int dims)
{
    if (type == GPUIVF_TYPE_REAL_ARRAY)
    {
        Datum      *elems = (Datum *) palloc(sizeof(Datum) * dims);
        ArrayType  *a;

        for (int i = 0; i < dims; i++)
            elems[i] = Float4GetDatum(x[i]);
        a = construct_array(elems, dims, FLOAT4OID, sizeof(float4), true, TYPALIGN_INT);
        pfree(elems);
        return PointerGetDatum(a);
    }
    return GpuivfPgvectorDatum(type, x, dims);
}

/* Raises the dimension mismatch error unless the two counts agree. */
void
GpuivfCheckDims(int expected, int actual)
{
    if (expected != actual)
        ereport(ERROR,
                (errcode(ERRCODE_DATA_EXCEPTION),
                 errmsg("different vector dimensions %d and %d", expected, actual)));
}

/*
 * A row of dims dimensions for the index of meta.  Returns false when it has
 * the index's dimensions, true when the index takes it as its new
 * dimension: an untrained index that holds no vector (built on a table
 * without vectors, or emptied by DELETE and VACUUM) has no data and no
 * model of the old dimension, so the next row fixes it again, as the first
 * did.  Any other mismatch is an error that names the index and says what
 * helps.
 */
/* The rows meta's index holds now (a trained index counts them in its
 * directory: GpuivfReadRows); only on the paths of a mismatch. */
static uint64
RowsNow(Relation index, const GpuivfMetaPageData *meta)
{
    GpuivfMetaPageData now = *meta;

    (void) GpuivfReadRows(index, &now);
    return now.vectors;
}

bool
GpuivfIndexTakesDims(Relation index, const GpuivfMetaPageData *meta, int dims)
{
    uint64      rows;

    if (meta->dims == 0 || (uint32) dims == meta->dims)
        return meta->dims == 0;
    if (!GpuivfMetaIsTrained(meta) && meta->vectors == 0)
        return true;
    rows = RowsNow(index, meta);
    ereport(ERROR,
            (errcode(ERRCODE_DATA_EXCEPTION),
             errmsg("vector has %d dimensions, but gpuivf index \"%s\" has %u",
                    dims, RelationGetRelationName(index), meta->dims),
             rows == 0
             ? errdetail("The index holds no vectors, but it was trained on vectors of %u dimensions.",
                         meta->dims)
             : errdetail("All vectors of a gpuivf index have the same number of dimensions."),
             errhint("To index vectors of another dimension, rebuild the index with REINDEX INDEX %s once the table holds only those; an index built on a table without vectors takes the dimension of the first vector inserted.",
                     quote_identifier(RelationGetRelationName(index)))));
    return false;
}

/*
 * Does a query of dims dimensions search the index of meta?  True when the
 * dimensions agree; false when the index holds no vector at all (the scan
 * returns no rows, as a sequential scan finds none to compare); otherwise
 * an error that names the index.
 */
bool
GpuivfQueryMatchesIndex(Relation index, const GpuivfMetaPageData *meta, int dims)
{
    if ((uint32) dims == meta->dims)
        return true;
    if (RowsNow(index, meta) == 0)
        return false;
    ereport(ERROR,
            (errcode(ERRCODE_DATA_EXCEPTION),
             errmsg("query vector has %d dimensions, but gpuivf index \"%s\" has %u",
                    dims, RelationGetRelationName(index), meta->dims)));
    return false;
}

/* Both arguments as checked vectors of the same dimension. */
static int
GpuivfGetVectorPair(FunctionCallInfo fcinfo, const float4 **a, const float4 **b)
{
    ArrayType  *x = PG_GETARG_ARRAYTYPE_P(0);
    ArrayType  *y = PG_GETARG_ARRAYTYPE_P(1);
    int         da;
    int         db;

    *a = GpuivfArrayGetValues(x, &da);
    *b = GpuivfArrayGetValues(y, &db);
    GpuivfCheckDims(da, db);
    return da;
}

extern "C" {
PG_FUNCTION_INFO_V1(gpuivf_l2_distance);
PG_FUNCTION_INFO_V1(gpuivf_inner_product);
PG_FUNCTION_INFO_V1(gpuivf_negative_inner_product);
PG_FUNCTION_INFO_V1(gpuivf_cosine_distance);
}

/* l2_distance(real[], real[]) and <->: Euclidean distance. */
Datum
gpuivf_l2_distance(PG_FUNCTION_ARGS)
{
    const float4 *a;
    const float4 *b;
    int         d = GpuivfGetVectorPair(fcinfo, &a, &b);

    PG_RETURN_FLOAT8(gpuivf::l2_distance(a, b, d));
}

/* inner_product(real[], real[]): the dot product. */
Datum
gpuivf_inner_product(PG_FUNCTION_ARGS)
{
    const float4 *a;
    const float4 *b;
    int         d = GpuivfGetVectorPair(fcinfo, &a, &b);

    PG_RETURN_FLOAT8((double) gpuivf::inner_product(a, b, d));
}

/* negative_inner_product(real[], real[]) and <#>: minus the dot product,
 * so that ascending order puts the largest product first. */
Datum
gpuivf_negative_inner_product(PG_FUNCTION_ARGS)
{
    const float4 *a;
    const float4 *b;
    int         d = GpuivfGetVectorPair(fcinfo, &a, &b);

    PG_RETURN_FLOAT8(gpuivf::negative_inner_product(a, b, d));
}

/* cosine_distance(real[], real[]) and <=>: 1 - cosine similarity; NaN when
 * either vector has norm zero. */
Datum
gpuivf_cosine_distance(PG_FUNCTION_ARGS)
{
    const float4 *a;
    const float4 *b;
    int         d = GpuivfGetVectorPair(fcinfo, &a, &b);

    PG_RETURN_FLOAT8(gpuivf::cosine_distance(a, b, d));
}
