// FP8 GEMM lab: the products of a prompt step timed through cublasLt in bf16 and in e4m3 with
// each of three scalings (one scale per tensor, one per row of each operand, one per 128
// values along k), at the row counts of decode batches and prompt chunks. Prints the
// heuristic's first choice and the best of its (up to) eight candidates in microseconds, so
// an FP8 product path can be judged against the bf16 one by measurement before it is wired
// (docs/PERFORMANCE.md, stop 56: the per-row form, wired and measured end to end, was
// dropped). Operands are zeros: the timing does not depend on the values.
//
// Usage: cuda_fp8_gemm_lab   (the Qwen2.5-1.5B and Llama-3-8B shapes' matrices)
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "lab_util.h"

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;

struct Timing {
  float first_us = -1, best_us = -1;  // -1: no algorithm
};

struct Lab {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  void *a = nullptr, *b = nullptr, *d = nullptr;
  float *a_scales = nullptr, *b_scales = nullptr;
};

// Column-major view of row-major rows, as hablar calls cuBLAS: yᵀ [n x m] = (W as k x n)ᵀ ·
// (x as k x m), y in bf16. `scaling` is a cublasLtMatmulMatrixScale_t for e4m3 operands.
Timing time_product(const Lab& lab, cudaDataType operands, int scaling, int n, int k, int m) {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  if (operands == CUDA_R_8F_E4M3) {
    const auto mode = (cublasLtMatmulMatrixScale_t)scaling;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode);
    // The heuristic refuses vector scales without pointers.
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &lab.a_scales,
                                   sizeof lab.a_scales);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &lab.b_scales,
                                   sizeof lab.b_scales);
  }
  cublasLtMatrixLayoutCreate(&la, operands, k, n, k);
  cublasLtMatrixLayoutCreate(&lb, operands, k, m, k);
  cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, m, n);
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulPreferenceCreate(&pref);
  const size_t ws = kWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof ws);
  cublasLtMatmulHeuristicResult_t candidates[8];
  int found = 0;
  cublasLtMatmulAlgoGetHeuristic(lab.handle, desc, la, lb, ld, ld, pref, 8, candidates, &found);
  Timing t;
  const float alpha = 1.0f, beta = 0.0f;
  for (int i = 0; i < found; ++i) {
    auto call = [&] {
      return cublasLtMatmul(lab.handle, desc, &alpha, lab.a, la, lab.b, lb, &beta, lab.d, ld, lab.d,
                            ld, &candidates[i].algo, lab.workspace, kWorkspaceBytes, 0);
    };
    if (call() != CUBLAS_STATUS_SUCCESS) continue;
    const float us = time_ms(0, call) * 1000.0f;
    if (i == 0) t.first_us = us;
    if (t.best_us < 0 || us < t.best_us) t.best_us = us;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  return t;
}

}  // namespace

int main() {
  Lab lab;
  if (cublasLtCreate(&lab.handle) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasLt unavailable\n");
    return 1;
  }
  const size_t operand_bytes = 256u << 20, scale_bytes = 16u << 20;
  CHECK_CUDA(cudaMalloc(&lab.workspace, kWorkspaceBytes));
  CHECK_CUDA(cudaMalloc(&lab.a, operand_bytes));
  CHECK_CUDA(cudaMalloc(&lab.b, operand_bytes));
  CHECK_CUDA(cudaMalloc(&lab.d, operand_bytes));
  CHECK_CUDA(cudaMalloc(&lab.a_scales, scale_bytes));
  CHECK_CUDA(cudaMalloc(&lab.b_scales, scale_bytes));
  CHECK_CUDA(cudaMemset(lab.a, 0, operand_bytes));
  CHECK_CUDA(cudaMemset(lab.b, 0, operand_bytes));
  const std::vector<float> ones(scale_bytes / sizeof(float), 1.0f);
  CHECK_CUDA(cudaMemcpy(lab.a_scales, ones.data(), scale_bytes, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(lab.b_scales, ones.data(), scale_bytes, cudaMemcpyHostToDevice));
  const int shapes[][2] = {{1536, 1536}, {256, 1536},   {8960, 1536}, {1536, 8960},
                           {4096, 4096}, {14336, 4096}, {4096, 14336}};
  std::printf(
      "W n x k @ rows: bf16 | e4m3 per tensor | e4m3 per row | e4m3 per 128 along k "
      "(us: first choice / best of up to 8; -1: no algorithm)\n");
  for (const auto& s : shapes)
    for (int m : {64, 256, 512, 2048}) {
      const Timing t[4] = {
          time_product(lab, CUDA_R_16BF, 0, s[0], s[1], m),
          time_product(lab, CUDA_R_8F_E4M3, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, s[0], s[1], m),
          time_product(lab, CUDA_R_8F_E4M3, CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, s[0], s[1],
                       m),
          time_product(lab, CUDA_R_8F_E4M3, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, s[0], s[1],
                       m)};
      std::printf("%5d x %5d @ %4d:", s[0], s[1], m);
      for (const Timing& x : t) std::printf(" %7.1f / %7.1f |", x.first_us, x.best_us);
      std::printf("\n");
    }
  return 0;
}
