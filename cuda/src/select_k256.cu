/* select_k256.cu — the k-bucket 256: select_rows and the IVF-PQ scans instantiated once. */
#include "bucket.cuh"

template struct gpuivf_cuda::KBucket<256>;
