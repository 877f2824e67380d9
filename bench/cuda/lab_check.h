// Error checks of the CUDA lab tools (cuda_gemm_lab, cuda_fp8_gemm_lab): print the failing
// call and exit.
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
