// The team pieces of the Q4_K products on int8 activations (matmul_q4k_rows.cu's decode
// kernels, persistent_step.cu's products): a team of team_threads threads owns kR rows, its
// thread t taking chunks t, t + team_threads, ... (q4k_chunk.cuh) of each; sums meet by
// shuffles and, for teams wider than a warp, through shared memory. One copy of this
// arithmetic keeps the two kernels' rows bit for bit equal.
#pragma once

#include <cstdint>

#include "backend/cuda/q4k_chunk.cuh"

namespace hablar::cuda::q4k_chunk {

// Where a team stands: its first row and its thread's index in it.
struct TeamPlace {
  const uint8_t* w;
  size_t row_bytes;
  int n, n_chunks, team_threads, t;
  bool l2_hint;
};

// This thread's place: team_threads threads per team, the thread's index within its team.
__device__ __forceinline__ TeamPlace team_place(const uint8_t* w, size_t row_bytes, int n,
                                                int n_chunks, int team_threads, bool l2_hint) {
  return {w, row_bytes, n, n_chunks, team_threads, (int)threadIdx.x % team_threads, l2_hint};
}

// Issues every weight load of rows row0 .. row0 + kR - 1 for the thread's chunks.
template <int kR, int kCpt>
__device__ __forceinline__ void load_chunks(const TeamPlace& at, int row0,
                                            Chunk (&chunk)[kR][kCpt]) {
#pragma unroll
  for (int i = 0; i < kCpt; ++i) {
    const int c = at.t + i * at.team_threads;
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      if (row0 < at.n && c < at.n_chunks) {
        const int row = min(row0 + r, at.n - 1);  // a missing last row repeats the one before
        const uint8_t* block =
            at.w + (size_t)row * at.row_bytes + (size_t)(c / 4) * kSuperBlockBytes;
        const uint8_t* nibbles = block + 16 + 32 * (c % 4);
        chunk[r][i].head = load_weights16(block, at.l2_hint);
        chunk[r][i].lo = load_weights16(nibbles, at.l2_hint);
        chunk[r][i].hi = load_weights16(nibbles + 16, at.l2_hint);
      }
    }
  }
}

// The team's sum of acc[r] for each of its kR rows, returned in the thread whose index in
// the team is r (other threads return 0): lanes of a warp by shuffles, then through
// `partial` the warps of a team wider than one. Every thread of the block must call it.
template <int kR>
__device__ __forceinline__ float team_total(const TeamPlace& at, int team, float (&acc)[kR],
                                            float (*partial)[kR]) {
  const int width = min(at.team_threads, 32);
#pragma unroll
  for (int r = 0; r < kR; ++r)
    for (int off = width / 2; off > 0; off /= 2)
      acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
  float mine = 0.0f;
  if (at.team_threads <= 32) {
#pragma unroll
    for (int r = 0; r < kR; ++r)
      if (at.t == r) mine = acc[r];
    return mine;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < kR; ++r) partial[warp][r] = acc[r];
  __syncthreads();
  const int warps_per_team = at.team_threads / 32;
  if (at.t < kR)
    for (int wi = 0; wi < warps_per_team; ++wi) mine += partial[team * warps_per_team + wi][at.t];
  return mine;
}

// Sums acc over the team and stores the rows that exist. Every thread of the block calls it.
template <int kR>
__device__ __forceinline__ void team_sum_store(const TeamPlace& at, int team, int row0,
                                               float (&acc)[kR], float (*partial)[kR], float* y) {
  const float total = team_total<kR>(at, team, acc, partial);
  if (at.t < kR && row0 + at.t < at.n) y[row0 + at.t] = total;
}

// The chunks of rows row0 .. row0 + kR - 1 against the activations: acc[r] += their dots.
template <int kR, int kCpt>
__device__ __forceinline__ void dot_chunks(const TeamPlace& at, int row0,
                                           const Chunk (&chunk)[kR][kCpt],
                                           const int8_t* __restrict__ xq,
                                           const float4* __restrict__ xs, float (&acc)[kR]) {
#pragma unroll
  for (int i = 0; i < kCpt; ++i) {
    const int c = at.t + i * at.team_threads;
    if (row0 >= at.n || c >= at.n_chunks) continue;
    const ChunkX x = load_x(xq, xs, c);
#pragma unroll
    for (int r = 0; r < kR; ++r)
      acc[r] += chunk_dot(chunk[r][i], c % 4, x.x0, x.x1, x.x2, x.x3, x.s);
  }
}

}  // namespace hablar::cuda::q4k_chunk
