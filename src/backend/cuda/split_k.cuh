// K split into slices for the batched tensor-core products (matmul_q4k_mma.cu,
// matmul_f16.cu): where a matrix gives too few blocks to fill the GPU, each block takes
// one slice of the super-blocks and writes its partial sums to part[slice][M][N]; the
// slices are then added in slice order by sum_slices (deterministic).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.h"

namespace hablar::cuda {

// y[i] = part[0][i] + part[1][i] + ... in slice order.
__global__ void sum_slices_kernel(const float* __restrict__ part, int slices, int64_t count,
                                  float* __restrict__ y);

inline void sum_slices(const float* part, int slices, int64_t count, float* y,
                       cudaStream_t stream) {
  sum_slices_kernel<<<(unsigned)((count + 255) / 256), 256, 0, stream>>>(part, slices, count, y);
  HABLAR_CUDA_CHECK_LAUNCH();
}

// The slice count (1 .. most) whose blocks fill whole waves of `slots` resident blocks
// best: time ~ waves / slices.
inline int choose_k_slices(int64_t blocks, int64_t slots, int most) {
  int best = 1;
  for (int s = 2; s <= most; ++s) {
    const int64_t waves = (blocks * s + slots - 1) / slots;
    const int64_t best_waves = (blocks * best + slots - 1) / slots;
    if (waves * best < best_waves * s) best = s;  // waves / s < best_waves / best
  }
  return best;
}

// The slice count (1 .. min(16, super_blocks)) of least estimated time, in units of one
// super-block step of a wave of blocks: waves x (super-blocks per slice + 1 for filling the
// pipeline), plus, with several slices, writing and reading back the partial sums (s + 1
// passes over out_bytes, and a launch) at about 6 MB per step (a step: ~2 us; ~3 TB/s).
inline int k_slices_by_cost(int64_t blocks, int64_t slots, int super_blocks, int64_t out_bytes) {
  constexpr double kBytesPerStep = 6e6, kLaunchSteps = 1.0;
  const int most = std::min(16, super_blocks);
  int best = 1;
  double best_cost = 0;
  for (int s = 1; s <= most; ++s) {
    const int64_t waves = (blocks * s + slots - 1) / slots;
    double cost = (double)waves * ((super_blocks + s - 1) / s + 1);
    if (s > 1) cost += (double)(2 * s + 1) * out_bytes / kBytesPerStep + kLaunchSteps;
    if (s == 1 || cost < best_cost) best = s, best_cost = cost;
  }
  return best;
}

}  // namespace hablar::cuda
