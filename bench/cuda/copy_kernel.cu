// A plain 16-byte-per-thread device copy: the bandwidth limit as a kernel sees it (the
// copy engine behind cudaMemcpy can be slower than what kernels reach).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace hablar::cuda {

__global__ void copy16_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

void bench_copy_kernel(const void* src, void* dst, size_t bytes, cudaStream_t stream) {
  copy16_kernel<<<132 * 16, 512, 0, stream>>>(static_cast<const uint4*>(src),
                                              static_cast<uint4*>(dst), bytes / 16);
}

}  // namespace hablar::cuda
