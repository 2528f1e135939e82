/*
 * gpuivfvector.cpp — the SQL distance functions on real[] behind the
 * operators <-> (l2_distance), <#> (negative_inner_product) and <=>
 * (cosine_distance), plus inner_product.  They call the engine's functions,
 * the same ones the index re-rank calls, so an index scan and a sequential
 * scan compute bit-identical distances.
 */
#include "gpuivf.h"

#include "fmgr.h"
#include "utils/array.h"

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
