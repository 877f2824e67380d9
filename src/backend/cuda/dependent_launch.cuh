// Programmatic dependent launch (sm_90) for the kernels of a step, so that a kernel is
// already launched and resident when the one before it on the stream ends, instead of paying
// the launch after it: a dependent kernel is launched with launch_dependent(); in it, every
// thread calls wait_for_previous_kernel() before it reads anything the kernel before wrote
// (which also makes its own end imply the end of every kernel before it), reads it with
// load_produced() or plain loads, never through the non-coherent path, and
// allow_next_kernel_to_start() lets the kernel after it launch.
//
// The step's kernels that read their inputs at once call both at their start, wait first
// (begin_dependent_kernel), so at most one kernel waits ahead of the running one. The
// one-token products allow first and load their weights (which nothing in a step writes)
// before they wait.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"

namespace hablar::cuda {

__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_kernel_to_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// A 16-byte load of what an earlier kernel of the step wrote, in a dependent kernel. Such a
// kernel overlaps the one before it, so that data is not read-only for its lifetime, as the
// non-coherent path assumes (ld.global.nc: __ldg, or loads through a const __restrict__
// pointer, which the compiler may turn into it): ptxas moves non-coherent loads above
// griddepcontrol.wait (seen in SASS: the looping Q4_K kernel read its activations before the
// quantizer had written them, and greedy outputs varied run to run). A plain (weak) global
// load stays after the wait, which makes the writes of the kernels before visible to it;
// written out here so that no __restrict__ turns it non-coherent, and volatile so that the
// compiler keeps it after the wait. (ld.global.cg stays after the wait too, but as a strong
// load it halved the one-token products' speed.) Weights and tables that no kernel writes
// keep __ldg.
template <typename T>
__device__ __forceinline__ T load_produced(const T* p) {
  static_assert(sizeof(T) == 16 && alignof(T) >= 16, "16-byte vectors");
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  T out;
  memcpy(&out, &v, sizeof(T));
  return out;
}

__device__ __forceinline__ void begin_dependent_kernel() {
  wait_for_previous_kernel();
  allow_next_kernel_to_start();
}

// kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent of the kernel
// before it on `stream` (a plain launch on the legacy default stream).
template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = stream != nullptr ? 1 : 0;
  HABLAR_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...));
  HABLAR_CUDA_CHECK_LAUNCH();
}

}  // namespace hablar::cuda
