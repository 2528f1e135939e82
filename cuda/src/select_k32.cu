/* select_k32.cu — the k-bucket 32: select_rows and ivfpq_scan instantiated once. */
#include "bucket.cuh"

GPUIVF_DEFINE_BUCKET(32)
