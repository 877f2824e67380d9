// The f32 CUDA-core product of M <= 8 activation rows with one weight matrix, as a device
// function (matmul_fused.cu's gemv_kernel; the grouped expert products of matmul_grouped.cu):
// a block of kGemvThreads threads owns kRowsPerGroup weight rows per "group" of
// group_threads threads (blockIdx.x picks the block's groups); every thread walks 8-value
// units of its rows, dequantizes each once and multiplies it with all kM rows of x.
//   w [n x k] (row_bytes a row), x [kM x k], y [kM x n]; every thread of the block calls it.
#pragma once

#include <cstdint>

#include "backend/cuda/quant_device.cuh"
#include "core/dtype.h"

namespace hablar::cuda {

inline constexpr int kGemvThreads = 128;
inline constexpr int kRowsPerGroup = 2;

template <DType T, int kM>
__device__ __forceinline__ void gemv_rows(const uint8_t* __restrict__ w, size_t row_bytes, int n,
                                          int k, const float* __restrict__ x, float* __restrict__ y,
                                          int group_threads) {
  const int groups = kGemvThreads / group_threads;
  const int group = threadIdx.x / group_threads, t = threadIdx.x % group_threads;
  const int row0 = (blockIdx.x * groups + group) * kRowsPerGroup;
  const int n_eights = k / 8;
  float acc[kRowsPerGroup][kM] = {};
  if (row0 < n) {
    const uint8_t* rows[kRowsPerGroup];
#pragma unroll
    for (int r = 0; r < kRowsPerGroup; ++r)
      rows[r] = w + (size_t)min(row0 + r, n - 1) * row_bytes;  // a missing last row repeats
      // Consecutive threads take consecutive groups of 8 values: weight bytes and activations
      // are both read coalesced. Unrolled so several groups' loads are in flight at once.
#pragma unroll 4
    for (int e = t; e < n_eights; e += group_threads) {
      float wv[kRowsPerGroup][8];
#pragma unroll
      for (int r = 0; r < kRowsPerGroup; ++r) dequant_group<T>(rows[r], e, wv[r]);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        const float4* xv = reinterpret_cast<const float4*>(x + (size_t)m * k + 8 * e);
        const float4 x0 = __ldg(xv), x1 = __ldg(xv + 1);
#pragma unroll
        for (int r = 0; r < kRowsPerGroup; ++r) {
          float a = wv[r][0] * x0.x;
          float b = wv[r][1] * x0.y;
          a = fmaf(wv[r][2], x0.z, a);
          b = fmaf(wv[r][3], x0.w, b);
          a = fmaf(wv[r][4], x1.x, a);
          b = fmaf(wv[r][5], x1.y, b);
          a = fmaf(wv[r][6], x1.z, a);
          b = fmaf(wv[r][7], x1.w, b);
          acc[r][m] += a + b;
        }
      }
    }
  }
  // Reduce within the warp, then across the group's warps through shared memory.
  __shared__ float partial[kGemvThreads / 32][kRowsPerGroup][kM];
#pragma unroll
  for (int r = 0; r < kRowsPerGroup; ++r)
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
      acc[r][m] = v;
    }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < kRowsPerGroup; ++r)
#pragma unroll
      for (int m = 0; m < kM; ++m) partial[warp][r][m] = acc[r][m];
  __syncthreads();
  const int warps_per_group = group_threads / 32;
  if (t < kRowsPerGroup * kM) {
    const int r = t / kM, m = t % kM;
    float sum = 0.0f;
    for (int wi = 0; wi < warps_per_group; ++wi) sum += partial[group * warps_per_group + wi][r][m];
    if (row0 + r < n) y[(size_t)m * n + row0 + r] = sum;
  }
}

}  // namespace hablar::cuda
