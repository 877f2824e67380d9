#include "late_writer.h"

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dependent_launch.cuh"

namespace hablar::test {
namespace {

__device__ __forceinline__ uint64_t global_nanoseconds() {
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

__global__ void late_copy_kernel(uint8_t* to, const uint8_t* from, size_t bytes,
                                 uint64_t delay_ns) {
  cuda::allow_next_kernel_to_start();
  const uint64_t start = global_nanoseconds();
  while (global_nanoseconds() - start < delay_ns) __nanosleep(1000);
  for (size_t i = threadIdx.x; i < bytes; i += blockDim.x) to[i] = from[i];
}

}  // namespace

void launch_late_copy(void* to, const void* from, size_t bytes, unsigned delay_us,
                      cudaStream_t stream) {
  late_copy_kernel<<<1, 256, 0, stream>>>(static_cast<uint8_t*>(to),
                                          static_cast<const uint8_t*>(from), bytes,
                                          (uint64_t)delay_us * 1000);
  HABLAR_CUDA_CHECK_LAUNCH();
}

}  // namespace hablar::test
