/*
 * pgvector.cpp — pgvector's vector and halfvec as gpuivf reads them, and the
 * support functions of gpuivf_vector's operator classes.
 *
 * gpuivf.so does not link pgvector (gpuivf must load where pgvector is not
 * installed).  It reads the two types by their documented layout, which is
 * pgvector's on-disk format (src/vector.h, src/halfvec.h of pgvector):
 *
 *     int32 vl_len_ (varlena header), int16 dim, int16 unused (0),
 *     then dim float4 (vector) or dim IEEE 754 binary16 (halfvec) values,
 *
 * so VARSIZE = 8 + dim * element size.  A datum is detoasted first (the
 * types have STORAGE external; a short varlena header is expanded), and
 * every field is checked before it is trusted.
 *
 * The SQL functions gpuivf_l2_distance(vector, vector) etc. are what the
 * index computes: the float32 distance of the (for halfvec, exactly widened)
 * values in the engine's fixed summation order (src/core/distance.cpp) — the
 * formula of pgvector's operators, whose own summation order depends on how
 * pgvector was compiled.  The operators themselves stay pgvector's.
 */
#include "gpuivf.h"

#include "fmgr.h"

/* the layout shared by vector and halfvec */
typedef struct PgvectorHeader
{
    int32       vl_len_;
    int16       dim;
    int16       unused;
} PgvectorHeader;

#define PGVECTOR_VALUES(v) ((char *) (v) + sizeof(PgvectorHeader))

/* pgvector's own limit (VECTOR_MAX_DIM, HALFVEC_MAX_DIM) */
#define PGVECTOR_MAX_DIM 16000

/* A detoasted vector/halfvec datum with a checked header: its dimensions. */
static int
CheckedDim(const PgvectorHeader *v, Size elem, const char *type_name)
{
    Size        size = VARSIZE(v);

    if (size < sizeof(PgvectorHeader) || v->dim < 1 || v->dim > PGVECTOR_MAX_DIM ||
        size != sizeof(PgvectorHeader) + elem * (Size) v->dim)
        ereport(ERROR,
                (errcode(ERRCODE_DATA_CORRUPTED),
                 errmsg("invalid %s value", type_name),
                 errdetail("A %s of %d dimensions has %zu bytes.", type_name, (int) v->dim,
                           size)));
    return v->dim;
}

/* The float4 values of a vector datum (inside the detoasted datum). */
const float4 *
GpuivfPgvectorValues(Datum value, int *dims)
{
    const PgvectorHeader *v = (const PgvectorHeader *) PG_DETOAST_DATUM(value);

    *dims = CheckedDim(v, sizeof(float4), "vector");
    return (const float4 *) PGVECTOR_VALUES(v);
}

/* The raw IEEE half values of a halfvec datum (inside the detoasted datum). */
const uint16 *
GpuivfHalfvecValues(Datum value, int *dims)
{
    const PgvectorHeader *v = (const PgvectorHeader *) PG_DETOAST_DATUM(value);
    const uint16 *h;
    int         n = CheckedDim(v, sizeof(uint16), "halfvec");

    h = (const uint16 *) PGVECTOR_VALUES(v);
    for (int i = 0; i < n; i++)
    {
        /* all exponent bits set: infinity or NaN, which pgvector never stores */
        if ((h[i] & 0x7c00) == 0x7c00)
            ereport(ERROR,
                    (errcode(ERRCODE_DATA_EXCEPTION),
                     errmsg("halfvec must not contain NaN or infinite values")));
    }
    *dims = n;
    return h;
}

/* A palloc'd vector (type GPUIVF_TYPE_VECTOR) or halfvec datum
 * holding x[0..dims). */
Datum
GpuivfPgvectorDatum(GpuivfVectorType type, const float4 *x, int dims)
{
    Size        elem = type == GPUIVF_TYPE_HALFVEC ? sizeof(uint16) : sizeof(float4);
    Size        size = sizeof(PgvectorHeader) + elem * (Size) dims;
    PgvectorHeader *v = (PgvectorHeader *) palloc(size);

    SET_VARSIZE(v, size);
    v->dim = (int16) dims;
    v->unused = 0;
    if (type == GPUIVF_TYPE_HALFVEC)
        gpuivf::float_to_half_n(x, (uint16_t *) PGVECTOR_VALUES(v), dims);
    else
        memcpy(PGVECTOR_VALUES(v), x, sizeof(float4) * dims);
    return PointerGetDatum(v);
}

/* ------------------------------------------------- the support functions */

/* Both arguments' values as float4 (halfvec: widened into palloc'd copies). */
static int
GetPair(FunctionCallInfo fcinfo, GpuivfVectorType type, const float4 **a, const float4 **b)
{
    int         da;
    int         db;

    *a = GpuivfVectorValues(type, PG_GETARG_DATUM(0), &da);
    *b = GpuivfVectorValues(type, PG_GETARG_DATUM(1), &db);
    GpuivfCheckDims(da, db);
    return da;
}

extern "C" {
PG_FUNCTION_INFO_V1(gpuivf_vector_l2_distance);
PG_FUNCTION_INFO_V1(gpuivf_vector_negative_inner_product);
PG_FUNCTION_INFO_V1(gpuivf_vector_cosine_distance);
PG_FUNCTION_INFO_V1(gpuivf_halfvec_l2_distance);
PG_FUNCTION_INFO_V1(gpuivf_halfvec_negative_inner_product);
PG_FUNCTION_INFO_V1(gpuivf_halfvec_cosine_distance);
}

#define GPUIVF_PGVECTOR_DISTANCE(fname, type, call)                         \
    Datum                                                                   \
    fname(PG_FUNCTION_ARGS)                                                 \
    {                                                                       \
        const float4 *a;                                                    \
        const float4 *b;                                                    \
        int         d = GetPair(fcinfo, type, &a, &b);                      \
                                                                            \
        PG_RETURN_FLOAT8(call(a, b, d));                                    \
    }

/* gpuivf_l2_distance(vector, vector): support function of vector_l2_ops */
GPUIVF_PGVECTOR_DISTANCE(gpuivf_vector_l2_distance, GPUIVF_TYPE_VECTOR, gpuivf::l2_distance)
/* gpuivf_negative_inner_product(vector, vector): vector_ip_ops */
GPUIVF_PGVECTOR_DISTANCE(gpuivf_vector_negative_inner_product, GPUIVF_TYPE_VECTOR,
                         gpuivf::negative_inner_product)
/* gpuivf_cosine_distance(vector, vector): vector_cosine_ops */
GPUIVF_PGVECTOR_DISTANCE(gpuivf_vector_cosine_distance, GPUIVF_TYPE_VECTOR, gpuivf::cosine_distance)
/* the same on halfvec (halfvec_l2_ops, halfvec_ip_ops, halfvec_cosine_ops) */
GPUIVF_PGVECTOR_DISTANCE(gpuivf_halfvec_l2_distance, GPUIVF_TYPE_HALFVEC, gpuivf::l2_distance)
GPUIVF_PGVECTOR_DISTANCE(gpuivf_halfvec_negative_inner_product, GPUIVF_TYPE_HALFVEC,
                         gpuivf::negative_inner_product)
GPUIVF_PGVECTOR_DISTANCE(gpuivf_halfvec_cosine_distance, GPUIVF_TYPE_HALFVEC,
                         gpuivf::cosine_distance)
