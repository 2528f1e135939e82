/* select_k128.cu — the k-bucket 128: select_rows and the IVF-PQ scans instantiated once. */
#include "bucket.cuh"

template struct gpuivf_cuda::KBucket<128>;
