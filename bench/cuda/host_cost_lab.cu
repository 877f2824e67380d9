// Host time per call of what a prompt step queues: cuBLAS GEMMs of the 1.5B shape's products
// (bf16 over kept copies, f32 or bf16 out) at a row count seen before and at row counts never
// seen before (a serving step's row count changes every step, and cuBLAS chooses an algorithm
// per problem shape), and kernel launches with and without programmatic dependent launch.
// Prints microseconds of the calling thread per call, beside the device's time per call, so
// that one can tell whether a step of a few hundred such calls is bound by its host.
//
// Usage: cuda_host_cost_lab
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "lab_fill.cuh"
#include "lab_util.h"

namespace {

__global__ void empty_kernel(int) {}

struct Product {
  const char* name;
  int n, k;       // W [n][k]
  bool bf16_out;  // the gate and up products write bf16
  int batch;      // 2: K and V as one strided-batched GEMM
};

constexpr int kMaxRows = 4096;
constexpr int kCallsPerBurst = 32;  // few enough that no launch waits for queue room

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void gemm(cublasHandle_t h, const Product& p, const __nv_bfloat16* w, const __nv_bfloat16* x,
          void* y, int m) {
  const float one = 1.0f, zero = 0.0f;
  const cudaDataType out = p.bf16_out ? CUDA_R_16BF : CUDA_R_32F;
  if (p.batch == 1) {
    CHECK_BLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, p.n, m, p.k, &one, w, CUDA_R_16BF, p.k, x,
                            CUDA_R_16BF, p.k, &zero, y, out, p.n, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
  } else {
    CHECK_BLAS(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, p.n, m, p.k, &one, w,
                                          CUDA_R_16BF, p.k, (long long)p.n * p.k, x, CUDA_R_16BF,
                                          p.k, 0, &zero, y, out, p.n, (long long)p.n * kMaxRows,
                                          p.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

// Host microseconds per call over bursts of calls, the stream drained between bursts (not
// timed), and device microseconds per call of the last burst. row_of(i): the rows of call i.
template <typename Call, typename Rows>
void measure(const char* what, cudaStream_t s, int calls, Call&& call, Rows&& row_of) {
  double host_us = 0;
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  float device_ms = 0;
  for (int first = 0; first < calls; first += kCallsPerBurst) {
    const int last = first + kCallsPerBurst < calls ? first + kCallsPerBurst : calls;
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaEventRecord(start, s));
    const double t0 = now_us();
    for (int i = first; i < last; ++i) call(row_of(i));
    host_us += now_us() - t0;
    CHECK_CUDA(cudaEventRecord(stop, s));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(cudaEventElapsedTime(&device_ms, start, stop));
    device_ms /= (float)(last - first);
  }
  std::printf("| %-46s | %8.1f | %8.1f |\n", what, host_us / calls, device_ms * 1e3);
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
}

}  // namespace

int main() {
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cublasHandle_t h;
  CHECK_BLAS(cublasCreate(&h));
  CHECK_BLAS(cublasSetStream(h, s));
  const Product products[] = {
      {"Q, O (1536 x 1536)", 1536, 1536, false, 1},
      {"K and V, batched (2 x 256 x 1536)", 256, 1536, false, 2},
      {"gate, up (8960 x 1536, bf16 out)", 8960, 1536, true, 1},
      {"down (1536 x 8960)", 1536, 8960, false, 1},
  };
  __nv_bfloat16 *w, *x;
  float* y;
  CHECK_CUDA(cudaMalloc(&w, (size_t)2 * 8960 * 1536 * sizeof(__nv_bfloat16)));
  CHECK_CUDA(cudaMalloc(&x, (size_t)kMaxRows * 8960 * sizeof(__nv_bfloat16)));
  CHECK_CUDA(cudaMalloc(&y, (size_t)2 * kMaxRows * 8960 * sizeof(float)));
  lab_fill<<<1024, 256, 0, s>>>(w, (size_t)2 * 8960 * 1536, 1);
  lab_fill<<<1024, 256, 0, s>>>(x, (size_t)kMaxRows * 8960, 2);
  CHECK_CUDA(cudaStreamSynchronize(s));

  std::printf("| call (1.5B shape) | host us/call | device us/call |\n| --- | ---: | ---: |\n");
  int fresh = 1000;  // row counts never used before, one per call
  for (const Product& p : products) {
    auto call = [&](int m) { gemm(h, p, w, x, y, m); };
    char what[96];
    std::snprintf(what, sizeof what, "%s, 1,280 rows every call", p.name);
    measure(what, s, 256, call, [](int) { return 1280; });
    const int seen = fresh + 1;  // this product's first new row count
    std::snprintf(what, sizeof what, "%s, rows new each call", p.name);
    measure(what, s, 128, call, [&](int) { return ++fresh; });
    std::snprintf(what, sizeof what, "%s, 64 row counts seen before", p.name);
    measure(what, s, 256, call, [seen](int i) { return seen + i % 64; });
    std::snprintf(what, sizeof what, "%s, 32 rows every call", p.name);
    measure(what, s, 256, call, [](int) { return 32; });
  }

  cudaLaunchAttribute pdl{};
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(132), config.blockDim = dim3(256), config.stream = s;
  measure(
      "empty kernel, <<< >>>", s, 512, [&](int i) { empty_kernel<<<132, 256, 0, s>>>(i); },
      [](int i) { return i; });
  measure(
      "empty kernel, cudaLaunchKernelEx", s, 512,
      [&](int i) {
        config.numAttrs = 0;
        CHECK_CUDA(cudaLaunchKernelEx(&config, empty_kernel, i));
      },
      [](int i) { return i; });
  measure(
      "empty kernel, cudaLaunchKernelEx + dependent launch", s, 512,
      [&](int i) {
        config.attrs = &pdl, config.numAttrs = 1;
        CHECK_CUDA(cudaLaunchKernelEx(&config, empty_kernel, i));
      },
      [](int i) { return i; });
  measure(
      "cudaMemcpyAsync 64 KB host to device (pageable)", s, 128,
      [&](int) {
        static std::vector<char> host(65536, 1);
        CHECK_CUDA(cudaMemcpyAsync(y, host.data(), host.size(), cudaMemcpyHostToDevice, s));
      },
      [](int i) { return i; });
  cublasDestroy(h);
  cudaFree(w), cudaFree(x), cudaFree(y);
  cudaStreamDestroy(s);
  return 0;
}
