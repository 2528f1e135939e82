/* select_k128.cu — the k-bucket 128: select_rows and ivfpq_scan instantiated once. */
#include "bucket.cuh"

GPUIVF_DEFINE_BUCKET(128)
