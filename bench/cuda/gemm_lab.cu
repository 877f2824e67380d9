// GEMM lab for the encoder's products (embeddings on the GPU): the F16 shapes of one BERT
// layer at M tokens, timed through cublasGemmEx (what EmbedOps calls) and through cublasLt with
// each of its heuristic's candidate algorithms, with and without a bias / bias+GELU epilogue.
// Prints TFLOP/s beside the best of them, so a change of call can be chosen by measurement.
//
// Usage: cuda_gemm_lab [M=65536] [width=768] [ffn=3072]
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cuda/embed_kernels.h"

#include "lab_fill.cuh"
#include "lab_util.h"

namespace {

struct Shape {
  const char* name;
  int n, k;  // weight rows (outputs), columns
};

// The encoder step's other kernels on the same M tokens (sequences of 128): attention,
// LayerNorm (F16 x + F16 residual + f32 bias -> F16) and the up product's bias + GELU, with
// the bytes each moves and the resulting GB/s.
void time_other_kernels(cudaStream_t s, int M, int W, int F, half* buf_a, half* buf_b) {
  namespace e = hablar::cuda::embed;
  const int seq = 128, heads = W / 64;
  std::vector<hablar::cuda::EmbedTile> tiles;
  for (int b = 0; b + seq <= M; b += seq)
    for (int q0 = 0; q0 < seq; q0 += hablar::cuda::kEmbedQueryTile) tiles.push_back({b, seq, q0});
  hablar::cuda::EmbedTile* dtiles;
  CHECK_CUDA(cudaMalloc(&dtiles, tiles.size() * sizeof tiles[0]));
  CHECK_CUDA(
      cudaMemcpy(dtiles, tiles.data(), tiles.size() * sizeof tiles[0], cudaMemcpyHostToDevice));
  float* fparams;
  CHECK_CUDA(cudaMalloc(&fparams, 3 * (size_t)F * sizeof(float)));
  CHECK_CUDA(cudaMemset(fparams, 0, 3 * (size_t)F * sizeof(float)));
  e::AttentionArgs a;
  const size_t T = (size_t)M * W;
  a.q = reinterpret_cast<const uint16_t*>(buf_a);
  a.k = reinterpret_cast<const uint16_t*>(buf_a + T);
  a.v = reinterpret_cast<const uint16_t*>(buf_a + 2 * T);
  a.out = reinterpret_cast<uint16_t*>(buf_b);
  a.bq = a.bk = a.bv = fparams;
  a.tiles = dtiles, a.n_tiles = (int)tiles.size(), a.n_heads = heads, a.n_kv_heads = heads;
  a.head_dim = 64, a.scale = 0.125f, a.max_len = seq;
  const float att = time_ms(s, [&] { e::attention(a, s); });
  std::printf("attention %d x %d tokens, %d heads x 64: %.3f ms, %.0f GB/s (q, k, v, out once)\n",
              M / seq, seq, heads, att, 4.0 * T * 2 / att / 1e6);
  const e::RowsIn x{buf_a, true}, res{buf_a + T, true};
  const float ln = time_ms(s, [&] {
    e::layernorm(x, fparams, res, fparams, fparams, nullptr, reinterpret_cast<uint16_t*>(buf_b), M,
                 W, 1e-12f, s);
  });
  std::printf("layernorm %d x %d (F16 x + residual + bias -> F16): %.3f ms, %.0f GB/s\n", M, W, ln,
              3.0 * T * 2 / ln / 1e6);
  const float ba = time_ms(
      s, [&] { e::bias_act_f16(reinterpret_cast<uint16_t*>(buf_b), fparams, M, F, true, s); });
  std::printf("bias + GELU %d x %d F16 in place: %.3f ms, %.0f GB/s\n", M, F, ba,
              2.0 * M * F * 2 / ba / 1e6);
  cudaFree(dtiles), cudaFree(fparams);
}

}  // namespace

int main(int argc, char** argv) {
  const int M = argc > 1 ? std::atoi(argv[1]) : 65536;
  const int W = argc > 2 ? std::atoi(argv[2]) : 768;
  const int F = argc > 3 ? std::atoi(argv[3]) : 3072;
  const Shape shapes[] = {
      {"q|k|v|o", W, W}, {"qkv merged", 3 * W, W}, {"up", F, W}, {"down", W, F}};
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreate(&s));
  const size_t max_in = (size_t)M * F, max_w = (size_t)F * 3 * W, max_out = (size_t)M * 3 * W;
  half *x, *w, *y, *bias;
  CHECK_CUDA(cudaMalloc(&x, std::max(max_in, (size_t)M * 3 * W) * 2));
  CHECK_CUDA(cudaMalloc(&w, max_w * 2));
  CHECK_CUDA(cudaMalloc(&y, std::max(max_out, (size_t)M * F) * 2));
  CHECK_CUDA(cudaMalloc(&bias, 4 * (size_t)F * 2));
  lab_fill<<<1024, 256, 0, s>>>(x, std::max(max_in, (size_t)M * 3 * W), 1);
  lab_fill<<<1024, 256, 0, s>>>(w, max_w, 2);
  lab_fill<<<64, 256, 0, s>>>(bias, 4 * (size_t)F, 3);
  size_t ws_bytes = 64u << 20;
  void* ws;
  CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
  cublasHandle_t blas;
  CHECK_BLAS(cublasCreate(&blas));
  CHECK_BLAS(cublasSetStream(blas, s));
  cublasLtHandle_t lt;
  CHECK_BLAS(cublasLtCreate(&lt));
  int dev = 0;
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, dev);
  std::printf("device %s, %d SMs; M = %d tokens\n", prop.name, prop.multiProcessorCount, M);
  double layer_gemmex = 0, layer_best = 0;
  for (const Shape& sh : shapes) {
    const double flop = 2.0 * M * sh.n * sh.k;
    const float alpha = 1, beta = 0;
    // y^T [n x M] = W^T(op) · x^T: W stored row-major [n x k] = column-major [k x n], op T.
    const float ms_ex = time_ms(s, [&] {
      CHECK_BLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, sh.n, M, sh.k, &alpha, w, CUDA_R_16F,
                              sh.k, x, CUDA_R_16F, sh.k, &beta, y, CUDA_R_16F, sh.n,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    });
    std::printf("%-11s n=%5d k=%5d  gemmEx          %7.3f ms %6.1f TFLOP/s\n", sh.name, sh.n, sh.k,
                ms_ex, flop / ms_ex / 1e9);
    for (int epi = 0; epi < 3; ++epi) {
      cublasLtMatmulDesc_t desc;
      CHECK_BLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
      CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
      const cublasLtEpilogue_t e = epi == 0   ? CUBLASLT_EPILOGUE_DEFAULT
                                   : epi == 1 ? CUBLASLT_EPILOGUE_BIAS
                                              : CUBLASLT_EPILOGUE_GELU_BIAS;
      CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
      if (epi) {
        cudaDataType bt = CUDA_R_16F;
        CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                                  sizeof bt));
        CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                  sizeof bias));
      }
      cublasLtMatrixLayout_t la, lb, lc;
      CHECK_BLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_16F, sh.k, sh.n, sh.k));
      CHECK_BLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16F, sh.k, M, sh.k));
      CHECK_BLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16F, sh.n, M, sh.n));
      cublasLtMatmulPreference_t pref;
      CHECK_BLAS(cublasLtMatmulPreferenceCreate(&pref));
      CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
      cublasLtMatmulHeuristicResult_t res[16];
      int found = 0;
      CHECK_BLAS(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 16, res, &found));
      float first = 0, best = 1e30f;
      int best_i = -1;
      for (int i = 0; i < found; ++i) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
        const float ms = time_ms(s, [&] {
          CHECK_BLAS(cublasLtMatmul(lt, desc, &alpha, w, la, x, lb, &beta, y, lc, y, lc,
                                    &res[i].algo, ws, ws_bytes, s));
        });
        if (i == 0) first = ms;
        if (ms < best) best = ms, best_i = i;
      }
      const char* en = epi == 0 ? "" : epi == 1 ? "+bias" : "+bias+gelu";
      std::printf(
          "%-11s n=%5d k=%5d  lt%-11s first %7.3f ms %6.1f, best (#%d of %d) %7.3f ms %6.1f "
          "TFLOP/s\n",
          sh.name, sh.n, sh.k, en, first, flop / first / 1e9, best_i, found, best,
          flop / best / 1e9);
      if (epi == 0) {
        const int times = sh.name[0] == 'q' && sh.name[1] == '|' ? 4 : 1;
        if (sh.name[1] != 'k') layer_gemmex += times * ms_ex, layer_best += times * best;
      }
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb),
          cublasLtMatrixLayoutDestroy(lc);
      cublasLtMatmulDescDestroy(desc);
    }
  }
  std::printf("one layer's products (4 x width^2, up, down): gemmEx %.3f ms, lt best %.3f ms\n",
              layer_gemmex, layer_best);
  time_other_kernels(s, M, W, F, x, y);  // both hold M x F halves
  return 0;
}
