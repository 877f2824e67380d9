#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cublas_library.h"

namespace hablar::cuda {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  throw_error(ErrorKind::kDevice, std::string("CUDA call failed: ") + call + ": " +
                                      cudaGetErrorName(status) + " (" + cudaGetErrorString(status) +
                                      ") at " + file + ":" + std::to_string(line));
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  throw_error(ErrorKind::kDevice, std::string("cuBLAS call failed: ") + call + ": " +
                                      cublas().status_name(status) + " (" +
                                      cublas().status_string(status) + ") at " + file + ":" +
                                      std::to_string(line));
}

}  // namespace hablar::cuda
