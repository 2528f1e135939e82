/* select_k64.cu — the k-bucket 64: select_rows and ivfpq_scan instantiated once. */
#include "bucket.cuh"

GPUIVF_DEFINE_BUCKET(64)
