/* select_k1024.cu — the k-bucket 1024: select_rows and the IVF-PQ scans instantiated once. */
#include "bucket.cuh"

template struct gpuivf_cuda::KBucket<1024>;
