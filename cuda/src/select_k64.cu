/* select_k64.cu — the k-bucket 64: select_rows and the IVF-PQ scans instantiated once. */
#include "bucket.cuh"

template struct gpuivf_cuda::KBucket<64>;
