// cuBLAS, loaded with dlopen when the first handle is made rather than linked: libcublasLt
// alone maps over 500 MB, and its relocations cost every hablar process ~220 MB of resident
// memory at start even when it serves on the CPU. Only the few entry points hablar calls are
// resolved.
#pragma once

#include <cublas_api.h>

namespace hablar::cuda {

struct CublasLibrary {
  cublasStatus_t (*create)(cublasHandle_t* handle);
  cublasStatus_t (*destroy)(cublasHandle_t handle);
  cublasStatus_t (*set_stream)(cublasHandle_t handle, cudaStream_t stream);
  cublasStatus_t (*gemm_ex)(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* a, cudaDataType a_type, int lda, const void* b,
                            cudaDataType b_type, int ldb, const void* beta, void* c,
                            cudaDataType c_type, int ldc, cublasComputeType_t compute_type,
                            cublasGemmAlgo_t algo);
  const char* (*status_name)(cublasStatus_t status);
  const char* (*status_string)(cublasStatus_t status);
};

// The library, loaded on first use (libcublas.so.<major> through the loader's search path,
// then from the toolkit's directory hablar was built against). Throws Error(kUnsupported)
// naming what is missing when it cannot be loaded.
const CublasLibrary& cublas();

}  // namespace hablar::cuda
