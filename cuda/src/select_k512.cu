/* select_k512.cu — the k-bucket 512: select_rows and the IVF-PQ scans instantiated once. */
#include "bucket.cuh"

template struct gpuivf_cuda::KBucket<512>;
