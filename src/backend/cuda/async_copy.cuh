// Asynchronous global -> shared copies (cp.async, sm_80 and later), shared by the kernels
// that stage tiles in shared memory (matmul_q4k_mma.cu, embed_attention.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace hablar::cuda {

// 16 bytes from global src to shared dst without passing through registers.
__device__ __forceinline__ void copy16_async(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src)
               : "memory");
#endif
}

// As copy16_async, or 16 zero bytes when !valid (src is then not read, but must still be an
// address of the global space).
__device__ __forceinline__ void copy16_async_or_zero(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src), "r"(valid ? 16 : 0)
               : "memory");
#endif
}

__device__ __forceinline__ void commit_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Waits until at most kPending committed groups of this thread's copies are in flight.
template <int kPending>
__device__ __forceinline__ void wait_async_but() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
#endif
}

// Waits for every copy this thread issued.
__device__ __forceinline__ void wait_async_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

}  // namespace hablar::cuda
