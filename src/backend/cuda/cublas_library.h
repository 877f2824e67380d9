// cuBLAS, loaded with dlopen when the first handle is made rather than linked: libcublasLt
// alone maps over 500 MB, and its relocations cost every hablar process ~220 MB of resident
// memory at start even when it serves on the CPU. Only the few entry points hablar calls are
// resolved.
#pragma once

#include <cublasLt.h>
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
  cublasStatus_t (*gemm_strided_batched_ex)(
      cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
      int k, const void* alpha, const void* a, cudaDataType a_type, int lda, long long stride_a,
      const void* b, cudaDataType b_type, int ldb, long long stride_b, const void* beta, void* c,
      cudaDataType c_type, int ldc, long long stride_c, int batch, cublasComputeType_t compute_type,
      cublasGemmAlgo_t algo);
  const char* (*status_name)(cublasStatus_t status);
  const char* (*status_string)(cublasStatus_t status);
};

// The library, loaded on first use (libcublas.so.<major> through the loader's search path,
// then from the toolkit's directory hablar was built against). Throws Error(kUnsupported)
// naming what is missing when it cannot be loaded.
const CublasLibrary& cublas();

// The cublasLt entry points the fused-epilogue GEMMs use (lt_gemm.h), loaded the same way
// (libcublasLt.so.<major>; libcublas itself depends on it, so it is mapped already once
// cuBLAS is in use).
struct CublasLtLibrary {
  cublasStatus_t (*create)(cublasLtHandle_t* handle);
  cublasStatus_t (*destroy)(cublasLtHandle_t handle);
  cublasStatus_t (*desc_create)(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                cudaDataType_t scale);
  cublasStatus_t (*desc_destroy)(cublasLtMatmulDesc_t desc);
  cublasStatus_t (*desc_set)(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                             const void* buf, size_t bytes);
  cublasStatus_t (*layout_create)(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                  uint64_t cols, int64_t ld);
  cublasStatus_t (*layout_destroy)(cublasLtMatrixLayout_t layout);
  cublasStatus_t (*pref_create)(cublasLtMatmulPreference_t* pref);
  cublasStatus_t (*pref_destroy)(cublasLtMatmulPreference_t pref);
  cublasStatus_t (*pref_set)(cublasLtMatmulPreference_t pref,
                             cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                             size_t bytes);
  cublasStatus_t (*heuristic)(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                              cublasLtMatmulPreference_t pref, int requested,
                              cublasLtMatmulHeuristicResult_t results[], int* returned);
  cublasStatus_t (*matmul)(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                           const void* a, cublasLtMatrixLayout_t a_layout, const void* b,
                           cublasLtMatrixLayout_t b_layout, const void* beta, const void* c,
                           cublasLtMatrixLayout_t c_layout, void* d,
                           cublasLtMatrixLayout_t d_layout, const cublasLtMatmulAlgo_t* algo,
                           void* workspace, size_t workspace_bytes, cudaStream_t stream);
};

// cublasLt, loaded on first use; throws Error(kUnsupported) when it cannot be loaded.
const CublasLtLibrary& cublas_lt();

}  // namespace hablar::cuda
