// Every CUDA runtime and cuBLAS call goes through HABLAR_CUDA_CHECK / HABLAR_CUBLAS_CHECK:
// a failure becomes hablar::Error (ErrorKind::kDevice) naming the call, the reason and the
// source location. Kernel launches are followed by HABLAR_CUDA_CHECK_LAUNCH().
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <string>

#include "core/error.h"

namespace hablar::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file,
                                   int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file,
                                     int line);

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) throw_cuda_error(status, call, file, line);
}
inline void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) throw_cublas_error(status, call, file, line);
}

}  // namespace hablar::cuda

#define HABLAR_CUDA_CHECK(call) ::hablar::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define HABLAR_CUBLAS_CHECK(call) ::hablar::cuda::check_cublas((call), #call, __FILE__, __LINE__)
// After a <<<...>>> launch: reports bad launch configurations at once.
#define HABLAR_CUDA_CHECK_LAUNCH() \
  ::hablar::cuda::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
