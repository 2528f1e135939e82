/* select_k1024.cu — the k-bucket 1024: select_rows and ivfpq_scan instantiated once. */
#include "bucket.cuh"

GPUIVF_DEFINE_BUCKET(1024)
