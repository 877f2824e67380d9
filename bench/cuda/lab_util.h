// What the CUDA lab tools (cuda_gemm_lab, cuda_fp8_gemm_lab) share: error checks that print the
// failing call and exit, and the mean time of a queued call.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(x)                                               \
  do {                                                              \
    cudaError_t e_ = (x);                                           \
    if (e_ != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                 \
    }                                                               \
  } while (0)
#define CHECK_BLAS(x)                                  \
  do {                                                 \
    int s_ = (int)(x);                                 \
    if (s_ != 0) {                                     \
      std::fprintf(stderr, "%s: status %d\n", #x, s_); \
      std::exit(1);                                    \
    }                                                  \
  } while (0)

// Milliseconds per call of f (which queues work on stream s): one call to warm up, then reps
// calls between two events.
template <typename F>
float time_ms(cudaStream_t s, F&& f, int reps = 20) {
  f();
  CHECK_CUDA(cudaStreamSynchronize(s));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaEventRecord(start, s));
  for (int i = 0; i < reps; ++i) f();
  CHECK_CUDA(cudaEventRecord(stop, s));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start), cudaEventDestroy(stop);
  return ms / reps;
}
