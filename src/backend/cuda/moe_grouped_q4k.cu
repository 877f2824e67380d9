// Q4_K experts on int8 activations, sized on the device (moe.h grouped_q4k_*): the decode
// form of the expert products. The step's rows are first quantized in grouped order
// (quantize_rows: int8 codes in blocks of 32 in q8_layout, as quantize_activations_q8's); then a
// team of threads owns two weight rows of one expert (two rows of one matrix, or a gate row
// and its up row), loads their Q4_K chunks into registers once (q4k_chunk.cuh), and takes
// them against each of the expert's rows: one read of the weights per step however many
// tokens chose the expert. Grid: x over an expert's row groups, y over the active slots.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/q4k_chunk.cuh"
#include "core/error.h"

namespace hablar::cuda::moe {
namespace {
using namespace q4k_chunk;

constexpr int kThreads = 128;
constexpr int kRows = 2;       // weight rows per team
constexpr int kMaxChunks = 4;  // chunks per thread and row: kRows x 4 x 48 bytes of registers

// Sorted row r = in[order[r] / K] (order null: in[r]), a warp per block of 32 values.
__global__ void quantize_rows_kernel(const float* __restrict__ in,
                                     const int32_t* __restrict__ order, int K, int64_t N,
                                     int64_t width, int8_t* __restrict__ codes,
                                     float2* __restrict__ scales) {
  const int64_t blocks_per_row = width / 32;
  const int64_t block = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (block >= N * blocks_per_row) return;  // whole warps leave together
  const int64_t r = block / blocks_per_row, b = block % blocks_per_row;
  const int64_t source = order != nullptr ? order[r] / K : r;
  quantize_block32(in[source * width + b * 32 + lane], lane, codes + block * 32 + lane,
                   scales + block);
}

struct GroupedArgs {
  const uint8_t* w0;  // expert 0 of the first matrix (gate, or the only one)
  const uint8_t* w1;  // expert 0 of the up matrix (GLU form only)
  size_t stride0, stride1, row_bytes;
  int n, n_chunks, team_threads;  // n rows of K = 64 * n_chunks
  const int8_t* codes;
  const float4* scales;  // per row n_chunks float4: (dx, sx) of the chunk's two blocks
  const int32_t* offsets;
  const int32_t* active;
  float* y;  // [N][n]
};

// Sums acc over the team; the team's thread 0 holds the totals. Every thread of the block
// calls it (a barrier when teams are wider than a warp).
__device__ __forceinline__ void team_sums(float (&acc)[kRows], int team_threads, int team, int t,
                                          float (*partial)[kRows]) {
  const int width = min(team_threads, 32);
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    for (int off = width / 2; off > 0; off /= 2)
      acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
  if (team_threads <= 32) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // the previous row's partial sums are read
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < kRows; ++r) partial[warp][r] = acc[r];
  __syncthreads();
  if (t == 0) {
    const int warps_per_team = team_threads / 32;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      acc[r] = 0.0f;
      for (int wi = 0; wi < warps_per_team; ++wi) acc[r] += partial[team * warps_per_team + wi][r];
    }
  }
}

// kGlu: row r0 of the gate (w0) and of the up matrix (w1), y = silu(gate) * up; else rows
// r0 and r0 + 1 of w0.
template <int kCpt, bool kGlu>
__global__ void __launch_bounds__(kThreads) grouped_q4k_kernel(GroupedArgs a) {
  const int e = a.active[blockIdx.y];
  if (e < 0) return;  // the whole block: fewer experts have rows than there are slots
  const int teams = kThreads / a.team_threads, team = threadIdx.x / a.team_threads;
  const int t = threadIdx.x % a.team_threads;
  const int row0 = (blockIdx.x * teams + team) * (kGlu ? 1 : kRows);
  const uint8_t* rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int row = min(row0 + (kGlu ? 0 : r), a.n - 1);  // a missing last row repeats
    rows[r] =
        (kGlu && r == 1 ? a.w1 + e * a.stride1 : a.w0 + e * a.stride0) + (size_t)row * a.row_bytes;
  }
  Chunk chunk[kRows][kCpt];
#pragma unroll
  for (int i = 0; i < kCpt; ++i) {
    const int c = t + i * a.team_threads;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (row0 < a.n && c < a.n_chunks) {
        const uint8_t* block = rows[r] + (size_t)(c / 4) * kSuperBlockBytes;
        const uint8_t* nibbles = block + 16 + 32 * (c % 4);
        chunk[r][i].head = load_weights16(block, false);
        chunk[r][i].lo = load_weights16(nibbles, false);
        chunk[r][i].hi = load_weights16(nibbles + 16, false);
      }
  }
  __shared__ float partial[kThreads / 32][kRows];
  const int end = a.offsets[e + 1];
  for (int s = a.offsets[e]; s < end; ++s) {  // the same trip count for the whole block
    const int8_t* xq = a.codes + (size_t)s * a.n_chunks * 64;
    const float4* xs = a.scales + (size_t)s * a.n_chunks;
    float acc[kRows] = {};
#pragma unroll
    for (int i = 0; i < kCpt; ++i) {
      const int c = t + i * a.team_threads;
      if (row0 >= a.n || c >= a.n_chunks) continue;
      const ChunkX x = load_x(xq, xs, c);
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        acc[r] += chunk_dot(chunk[r][i], c % 4, x.x0, x.x1, x.x2, x.x3, x.s);
    }
    team_sums(acc, a.team_threads, team, t, partial);
    if (t != 0 || row0 >= a.n) continue;
    float* out = a.y + (size_t)s * a.n + row0;
    if (kGlu) {
      out[0] = acc[0] / (1.0f + expf(-acc[0])) * acc[1];
    } else {
      out[0] = acc[0];
      if (row0 + 1 < a.n) out[1] = acc[1];
    }
  }
}

// Threads per team: one chunk per thread where a row has at most 128 chunks, never more
// than kMaxChunks per thread.
int team_threads_for(int n_chunks) {
  int team = 16;
  while (team < kThreads && team < n_chunks) team *= 2;
  return team;
}

template <bool kGlu, int kCpt = 1>
void launch_grouped(GroupedArgs a, int cpt, int slots, cudaStream_t stream) {
  if constexpr (kCpt <= kMaxChunks) {
    if (cpt != kCpt) return launch_grouped<kGlu, kCpt + 1>(a, cpt, slots, stream);
    const int rows_per_block = kThreads / a.team_threads * (kGlu ? 1 : kRows);
    const dim3 grid((unsigned)((a.n + rows_per_block - 1) / rows_per_block), (unsigned)slots);
    grouped_q4k_kernel<kCpt, kGlu><<<grid, kThreads, 0, stream>>>(a);
    HABLAR_CUDA_CHECK_LAUNCH();
  } else {
    throw_error(ErrorKind::kInternal, "moe::grouped_q4k: too many chunks per thread");
  }
}

GroupedArgs grouped_args(const WeightView& first, size_t stride, const void* q8, int64_t N,
                         const int32_t* offsets, const int32_t* active, float* y) {
  GroupedArgs a{};
  a.w0 = static_cast<const uint8_t*>(first.data);
  a.stride0 = stride, a.row_bytes = first.row_bytes;
  a.n = (int)first.rows, a.n_chunks = (int)(first.cols / 64);
  a.team_threads = team_threads_for(a.n_chunks);
  const Q8Activations x = q8_layout(const_cast<void*>(q8), (int)N, first.cols);
  a.codes = x.codes, a.scales = reinterpret_cast<const float4*>(x.scales);
  a.offsets = offsets, a.active = active, a.y = y;
  return a;
}

int chunks_per_thread(const GroupedArgs& a) {
  return (a.n_chunks + a.team_threads - 1) / a.team_threads;
}

}  // namespace

bool grouped_q4k_supported(const WeightView& first, size_t stride) {
  return first.type == DType::Q4_K && first.cols % 256 == 0 &&
         first.cols <= (int64_t)kThreads * kMaxChunks * 64 && first.rows < (1 << 30) &&
         reinterpret_cast<uintptr_t>(first.data) % 16 == 0 && first.row_bytes % 16 == 0 &&
         stride % 16 == 0;
}

void quantize_rows(const float* in, const int32_t* order, int K, int64_t N, int64_t width, void* q8,
                   cudaStream_t stream) {
  HABLAR_CHECK(width % 64 == 0 && K >= 1, "moe::quantize_rows: width a multiple of 64");
  if (N == 0) return;
  const Q8Activations x = q8_layout(q8, (int)N, width);
  const int64_t threads = N * width;  // a thread per value
  quantize_rows_kernel<<<(unsigned)((threads + 255) / 256), 256, 0, stream>>>(
      in, order, K, N, width, x.codes, x.scales);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void grouped_q4k_product(const WeightView& first, size_t stride, int E, const void* q8, int64_t N,
                         const int32_t* offsets, const int32_t* active, float* y,
                         cudaStream_t stream) {
  validate_weight(first, "moe::grouped_q4k_product");
  HABLAR_CHECK(E >= 1 && grouped_q4k_supported(first, stride) &&
                   stride >= (size_t)first.rows * first.row_bytes,
               "moe::grouped_q4k_product: Q4_K experts at one 16-byte aligned stride");
  if (N == 0) return;
  const GroupedArgs a = grouped_args(first, stride, q8, N, offsets, active, y);
  launch_grouped<false>(a, chunks_per_thread(a), active_slots(N, E), stream);
}

void grouped_q4k_glu(const WeightView& gate, size_t gate_stride, const WeightView& up,
                     size_t up_stride, int E, const void* q8, int64_t N, const int32_t* offsets,
                     const int32_t* active, float* y, cudaStream_t stream) {
  validate_weight(gate, "moe::grouped_q4k_glu");
  validate_weight(up, "moe::grouped_q4k_glu");
  HABLAR_CHECK(E >= 1 && grouped_q4k_supported(gate, gate_stride) &&
                   grouped_q4k_supported(up, up_stride) && gate.rows == up.rows &&
                   gate.cols == up.cols && gate.row_bytes == up.row_bytes &&
                   gate_stride >= (size_t)gate.rows * gate.row_bytes &&
                   up_stride >= (size_t)up.rows * up.row_bytes,
               "moe::grouped_q4k_glu: gate and up Q4_K experts of one shape");
  if (N == 0) return;
  GroupedArgs a = grouped_args(gate, gate_stride, q8, N, offsets, active, y);
  a.w1 = static_cast<const uint8_t*>(up.data), a.stride1 = up_stride;
  launch_grouped<true>(a, chunks_per_thread(a), active_slots(N, E), stream);
}

}  // namespace hablar::cuda::moe
