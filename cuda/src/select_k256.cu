/* select_k256.cu — the k-bucket 256: select_rows and ivfpq_scan instantiated once. */
#include "bucket.cuh"

GPUIVF_DEFINE_BUCKET(256)
