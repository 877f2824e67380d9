// The experts' products over a step's grouped rows, sized on the device (moe.h
// grouped_product). Grid: x over the weight rows of one expert (gemv_rows.cuh's blocks),
// y over the active slots; slot s reads its expert from active[s] (-1: nothing to do) and
// that expert's rows from offsets, and walks them 8 at a time.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/gemv_rows.cuh"
#include "backend/cuda/matmul.h"
#include "backend/cuda/moe.h"
#include "core/error.h"

namespace hablar::cuda::moe {
namespace {

template <DType T>
__global__ void __launch_bounds__(kGemvThreads)
    grouped_kernel(const uint8_t* __restrict__ w0, size_t stride, size_t row_bytes, int n, int k,
                   const float* __restrict__ rows, const int32_t* __restrict__ offsets,
                   const int32_t* __restrict__ active, float* __restrict__ y, int group_threads) {
  const int e = active[blockIdx.y];
  if (e < 0) return;  // the whole block: fewer experts have rows than there are slots
  const uint8_t* w = w0 + (size_t)e * stride;
  const int end = offsets[e + 1];
  for (int r = offsets[e]; r < end; r += kGemvMaxRows) {
    const float* x = rows + (size_t)r * k;
    float* out = y + (size_t)r * n;
    switch (min(end - r, kGemvMaxRows)) {
      case 1:
        gemv_rows<T, 1>(w, row_bytes, n, k, x, out, group_threads);
        break;
      case 2:
        gemv_rows<T, 2>(w, row_bytes, n, k, x, out, group_threads);
        break;
      case 3:
        gemv_rows<T, 3>(w, row_bytes, n, k, x, out, group_threads);
        break;
      case 4:
        gemv_rows<T, 4>(w, row_bytes, n, k, x, out, group_threads);
        break;
      case 5:
        gemv_rows<T, 5>(w, row_bytes, n, k, x, out, group_threads);
        break;
      case 6:
        gemv_rows<T, 6>(w, row_bytes, n, k, x, out, group_threads);
        break;
      case 7:
        gemv_rows<T, 7>(w, row_bytes, n, k, x, out, group_threads);
        break;
      default:
        gemv_rows<T, 8>(w, row_bytes, n, k, x, out, group_threads);
        break;
    }
    __syncthreads();  // the reduction's shared partial sums are written again next round
  }
}

// Threads per row pair: the grid (rows of one expert times the slots) fills the GPU with
// about 32 warps per multiprocessor while each thread keeps at least 4 groups of 8 values.
int grouped_group_threads(int64_t rows, int64_t cols, int slots) {
  const int64_t row_pairs = (rows + 1) / 2 * slots;
  const int64_t target_warps = (int64_t)device_multiprocessors() * 32;
  int group_threads = 32;
  while (group_threads < kGemvThreads && row_pairs * (group_threads / 32) < target_warps &&
         cols / 8 / (group_threads * 2) >= 4)
    group_threads *= 2;
  return group_threads;
}

}  // namespace

void grouped_product(const WeightView& first, size_t stride, int E, const float* rows, int64_t N,
                     const int32_t* offsets, const int32_t* active, float* y, cudaStream_t stream) {
  validate_weight(first, "moe::grouped_product");
  HABLAR_CHECK(E >= 1 && stride >= (size_t)first.rows * first.row_bytes,
               "moe::grouped_product: experts overlap");
  if (N == 0) return;
  const int slots = active_slots(N, E);
  const int group_threads = grouped_group_threads(first.rows, first.cols, slots);
  const int rows_per_block = kGemvThreads / group_threads * kRowsPerGroup;
  const dim3 grid((unsigned)((first.rows + rows_per_block - 1) / rows_per_block), (unsigned)slots);
  dispatch_weight_type(first.type, [&]<DType T>() {
    grouped_kernel<T><<<grid, kGemvThreads, 0, stream>>>(
        static_cast<const uint8_t*>(first.data), stride, first.row_bytes, (int)first.rows,
        (int)first.cols, rows, offsets, active, y, group_threads);
  });
  HABLAR_CUDA_CHECK_LAUNCH();
}

}  // namespace hablar::cuda::moe
