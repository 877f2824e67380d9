// Q, K and V products of one input over kept bf16 copies, three ways, at the row counts of
// decode, serving and prompt steps: what the forward does now (Q through cublasGemmEx, K and
// V in one strided-batched GEMM), the three in one cublasGemmGroupedBatchedEx call (Q a group
// of one, K and V a group of two; outputs where they are now), and one GEMM over the three
// copies stored one after another (N = q + 2 kv: the bound a fused output layout would
// reach). Prints microseconds and TFLOP/s, so a change of call can be chosen by measurement.
// (The cuBLAS of CUDA 13 refuses the grouped call for bf16 inputs with f32 outputs: its column
// prints -1, stop 60 on an H100.)
//
// Usage: cuda_qkv_gemm_lab
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "lab_fill.cuh"
#include "lab_util.h"

namespace {

struct Shape {
  const char* name;
  int width, q, kv;  // K of every product; rows of Wq; rows of Wk and of Wv
};

// Device buffers of one shape at up to max_m rows: the three copies back to back
// ([q + 2 kv][width]), the input rows and the outputs (q, k, v apart; and one [m][q + 2 kv]).
struct Buffers {
  __nv_bfloat16 *w, *x;
  float *q, *k, *v, *qkv;
};

Buffers make_buffers(const Shape& s, int max_m) {
  Buffers b{};
  const size_t n = (size_t)s.q + 2 * (size_t)s.kv;
  CHECK_CUDA(cudaMalloc(&b.w, n * s.width * sizeof(__nv_bfloat16)));
  CHECK_CUDA(cudaMalloc(&b.x, (size_t)max_m * s.width * sizeof(__nv_bfloat16)));
  CHECK_CUDA(cudaMalloc(&b.q, (size_t)max_m * s.q * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&b.k, (size_t)max_m * s.kv * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&b.v, (size_t)max_m * s.kv * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&b.qkv, (size_t)max_m * n * sizeof(float)));
  lab_fill<<<1024, 256>>>(b.w, n * s.width, 1);
  lab_fill<<<1024, 256>>>(b.x, (size_t)max_m * s.width, 2);
  return b;
}

void free_buffers(Buffers& b) {
  for (void* p : {(void*)b.w, (void*)b.x, (void*)b.q, (void*)b.k, (void*)b.v, (void*)b.qkv})
    cudaFree(p);
}

// Column-major view as the forward's: yᵀ [N x M] = (W as K x N)ᵀ · (x as K x M).
void separate(cublasHandle_t h, const Shape& s, const Buffers& b, int m) {
  const float one = 1.0f, zero = 0.0f;
  CHECK_BLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.q, m, s.width, &one, b.w, CUDA_R_16BF,
                          s.width, b.x, CUDA_R_16BF, s.width, &zero, b.q, CUDA_R_32F, s.q,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  const __nv_bfloat16* wk = b.w + (size_t)s.q * s.width;
  CHECK_BLAS(cublasGemmStridedBatchedEx(
      h, CUBLAS_OP_T, CUBLAS_OP_N, s.kv, m, s.width, &one, wk, CUDA_R_16BF, s.width,
      (long long)s.kv * s.width, b.x, CUDA_R_16BF, s.width, 0, &zero, b.k, CUDA_R_32F, s.kv,
      (long long)(b.v - b.k), 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// The grouped call's pointer arrays live on the device (as cuBLAS's batched calls need).
struct GroupedArgs {
  const void** a;
  const void** x;
  void** y;
};

GroupedArgs make_grouped(const Shape& s, const Buffers& b) {
  const void* a[3] = {b.w, b.w + (size_t)s.q * s.width, b.w + ((size_t)s.q + s.kv) * s.width};
  const void* x[3] = {b.x, b.x, b.x};
  void* y[3] = {b.q, b.k, b.v};
  GroupedArgs g{};
  CHECK_CUDA(cudaMalloc(&g.a, sizeof a));
  CHECK_CUDA(cudaMalloc(&g.x, sizeof x));
  CHECK_CUDA(cudaMalloc(&g.y, sizeof y));
  CHECK_CUDA(cudaMemcpy(g.a, a, sizeof a, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(g.x, x, sizeof x, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(g.y, y, sizeof y, cudaMemcpyHostToDevice));
  return g;
}

cublasStatus_t grouped(cublasHandle_t h, const Shape& s, const GroupedArgs& g, int m) {
  const cublasOperation_t ta[2] = {CUBLAS_OP_T, CUBLAS_OP_T}, tb[2] = {CUBLAS_OP_N, CUBLAS_OP_N};
  const int ms[2] = {s.q, s.kv}, ns[2] = {m, m}, ks[2] = {s.width, s.width};
  const int lda[2] = {s.width, s.width}, ldb[2] = {s.width, s.width}, ldc[2] = {s.q, s.kv};
  const float alpha[2] = {1.0f, 1.0f}, beta[2] = {0.0f, 0.0f};
  const int sizes[2] = {1, 2};
  return cublasGemmGroupedBatchedEx(h, ta, tb, ms, ns, ks, alpha, g.a, CUDA_R_16BF, lda, g.x,
                                    CUDA_R_16BF, ldb, beta, g.y, CUDA_R_32F, ldc, 2, sizes,
                                    CUBLAS_COMPUTE_32F);
}

void one_gemm(cublasHandle_t h, const Shape& s, const Buffers& b, int m) {
  const float one = 1.0f, zero = 0.0f;
  const int n = s.q + 2 * s.kv;
  CHECK_BLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, s.width, &one, b.w, CUDA_R_16BF,
                          s.width, b.x, CUDA_R_16BF, s.width, &zero, b.qkv, CUDA_R_32F, n,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Largest |a - b| over n values copied back (the grouped call against the separate ones).
float max_diff(const float* a, const float* b, size_t n) {
  std::vector<float> ha(n), hb(n);
  CHECK_CUDA(cudaMemcpy(ha.data(), a, n * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(hb.data(), b, n * sizeof(float), cudaMemcpyDeviceToHost));
  float d = 0;
  for (size_t i = 0; i < n; ++i) d = std::max(d, std::fabs(ha[i] - hb[i]));
  return d;
}

void run_shape(cublasHandle_t h, cudaStream_t st, const Shape& s) {
  const int ms[] = {32, 64, 256, 512, 1024, 1280, 2048, 4096};
  Buffers b = make_buffers(s, 4096);
  GroupedArgs g = make_grouped(s, b);
  std::printf("\n%s (width %d, q %d, k and v %d)\n", s.name, s.width, s.q, s.kv);
  std::printf(
      "| rows | Q + KV pair us | grouped us | one GEMM us | TFLOP/s now / grouped / one | "
      "grouped max |d| |\n| ---: | ---: | ---: | ---: | --- | ---: |\n");
  for (int m : ms) {
    const double flop = 2.0 * m * s.width * ((double)s.q + 2.0 * s.kv);
    const float t_sep = time_ms(st, [&] { separate(h, s, b, m); }) * 1e3f;
    float t_grp = -1, diff = -1;
    if (grouped(h, s, g, m) == CUBLAS_STATUS_SUCCESS) {
      t_grp = time_ms(st, [&] { CHECK_BLAS(grouped(h, s, g, m)); }) * 1e3f;
      CHECK_CUDA(cudaMemcpy(b.qkv, b.q, (size_t)m * s.q * sizeof(float), cudaMemcpyDeviceToDevice));
      separate(h, s, b, m);
      CHECK_CUDA(cudaDeviceSynchronize());
      // Same q after the separate call as after the grouped one: compare the grouped call's q
      // (saved in qkv) with the separate call's.
      diff = max_diff(b.qkv, b.q, (size_t)m * s.q);
    }
    const float t_one = time_ms(st, [&] { one_gemm(h, s, b, m); }) * 1e3f;
    std::printf("| %d | %.1f | %.1f | %.1f | %.0f / %.0f / %.0f | %.2g |\n", m, t_sep, t_grp, t_one,
                flop / t_sep / 1e6, t_grp > 0 ? flop / t_grp / 1e6 : 0.0, flop / t_one / 1e6, diff);
  }
  cudaFree(g.a), cudaFree(g.x), cudaFree(g.y);
  free_buffers(b);
}

}  // namespace

int main() {
  cudaStream_t st;
  CHECK_CUDA(cudaStreamCreate(&st));
  cublasHandle_t h;
  CHECK_BLAS(cublasCreate(&h));
  CHECK_BLAS(cublasSetStream(h, st));
  const Shape shapes[] = {{"1.5B shape", 1536, 1536, 256}, {"8B shape", 4096, 4096, 1024}};
  for (const Shape& s : shapes) run_shape(h, st, s);
  return 0;
}
