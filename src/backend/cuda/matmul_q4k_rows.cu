// Q4_K x int8 activations at M = 1: the decode product, written to keep many weight bytes in
// flight per thread with few instructions per byte (see matmul_q4k_rows.h).
//
// Unit of work: a "chunk", the 32 bytes of nibbles that hold sub-blocks 2c and 2c + 1 of a
// super-block (64 weights; byte i carries value i of the first in its low nibble and value
// i of the second in its high nibble), plus the super-block's 16-byte header (d, dmin and
// the twelve bytes of 6-bit scales and mins). A team of P threads (P = 16 .. 128) owns kR
// rows; thread t takes chunks t, t + P, ... (kCpt of them) of each of its rows. Per chunk:
//   three 16-byte loads (header, two halves of the nibbles), none read twice by a thread;
//   the two (scale, min) pairs unpacked from the header with shifts and masks;
//   sixteen dp4a: low nibbles (q & 0x0F0F0F0F) against sub-block 2c's int8 activations,
//   high nibbles in place (q & 0xF0F0F0F0, i.e. 16 x the value, unsigned x signed) against
//   sub-block 2c + 1's, the factor 16 folded into the float scale.
//   y += d*sc_lo*dx_lo*dot_lo + d*sc_hi*dx_hi*dot_hi/16 - dmin*(m_lo*sx_lo + m_hi*sx_hi)
// (dx: activation scale of a block of 32, sx = dx * sum of its codes.)
//
// Every weight load of the thread (kR x kCpt chunks) is issued before any arithmetic and
// before the kernel waits on the previous kernel (programmatic dependent launch: weights
// never depend on it; the activations and y are touched only after the wait).
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/lab_knobs.h"
#include "backend/cuda/matmul_q4k_rows.h"
#include "backend/cuda/q4k_chunk.cuh"
#include "core/quant_blocks.h"

namespace hablar::cuda {
namespace {
using namespace q4k_chunk;

constexpr int kThreads = 128;
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

// Sums acc over the team (lanes of a warp, then through `partial` the warps of a team wider
// than one) and stores the rows that exist. Every thread of the block must call it.
template <int kR>
__device__ __forceinline__ void team_sum_store(const TeamPlace& at, int team, int row0,
                                               float (&acc)[kR], float (*partial)[kR], float* y) {
  const int width = min(at.team_threads, 32);
#pragma unroll
  for (int r = 0; r < kR; ++r)
    for (int off = width / 2; off > 0; off /= 2)
      acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
  if (at.team_threads <= 32) {
#pragma unroll
    for (int r = 0; r < kR; ++r)
      if (at.t == r && row0 + r < at.n) y[row0 + r] = acc[r];
    return;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < kR; ++r) partial[warp][r] = acc[r];
  __syncthreads();
  const int warps_per_team = at.team_threads / 32;
  if (at.t < kR && row0 + at.t < at.n) {
    float sum = 0.0f;
    for (int wi = 0; wi < warps_per_team; ++wi) sum += partial[team * warps_per_team + wi][at.t];
    y[row0 + at.t] = sum;
  }
}

// Grid: one team of team_threads threads per kR rows (kThreads / team_threads teams per
// block). xs holds (dx, sx) of each block of 32 activations; as float4, one per chunk.
template <int kR, int kCpt>
__global__ void __launch_bounds__(kThreads)
    q4k_rows_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int n, int n_chunks,
                    const int8_t* __restrict__ xq, const float4* __restrict__ xs,
                    float* __restrict__ y, int team_threads, bool l2_hint) {
  allow_next_kernel_to_start();
  const int teams = kThreads / team_threads, team = threadIdx.x / team_threads;
  const TeamPlace at = team_place(w, row_bytes, n, n_chunks, team_threads, l2_hint);
  const int row0 = (blockIdx.x * teams + team) * kR;
  Chunk chunk[kR][kCpt];
  load_chunks<kR, kCpt>(at, row0, chunk);
  wait_for_previous_kernel();  // x (and y) may be written by the kernel before this one

  float acc[kR] = {};
#pragma unroll
  for (int i = 0; i < kCpt; ++i) {
    const int c = at.t + i * team_threads;
    if (row0 >= n || c >= n_chunks) continue;
    const ChunkX x = load_x(xq, xs, c);
#pragma unroll
    for (int r = 0; r < kR; ++r)
      acc[r] += chunk_dot(chunk[r][i], c % 4, x.x0, x.x1, x.x2, x.x3, x.s);
  }
  __shared__ float partial[kThreads / 32][kR];
  team_sum_store<kR>(at, team, row0, acc, partial, y);
}

// The rows of one group of a block's teams from chunks already loaded, while the loads of
// the next group (issued by the caller) are in flight.
template <int kR, int kCpt>
__device__ __forceinline__ void loop_step(const TeamPlace& at, int team, int row0,
                                          const Chunk (&chunk)[kR][kCpt], const ChunkX (&x)[kCpt],
                                          float (*partial)[kR], float* y) {
  float acc[kR] = {};
#pragma unroll
  for (int i = 0; i < kCpt; ++i) {
    const int c = at.t + i * at.team_threads;
    if (row0 >= at.n || c >= at.n_chunks) continue;
#pragma unroll
    for (int r = 0; r < kR; ++r)
      acc[r] += chunk_dot(chunk[r][i], c % 4, x[i].x0, x[i].x1, x[i].x2, x[i].x3, x[i].s);
  }
  team_sum_store<kR>(at, team, row0, acc, partial, y);
}

// The lab's looping form (HABLAR_Q4K_GRID): each block walks
// row groups bg = blockIdx.x, + gridDim.x, ...; the thread keeps its chunks' activations in
// registers for every group, and two register sets of weights alternate, the next group's
// loads issued before the current group's arithmetic.
template <int kR, int kCpt>
__global__ void __launch_bounds__(kThreads)
    q4k_rows_loop_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int n, int n_chunks,
                         const int8_t* __restrict__ xq, const float4* __restrict__ xs,
                         float* __restrict__ y, int team_threads, bool l2_hint) {
  allow_next_kernel_to_start();
  const int teams = kThreads / team_threads, team = threadIdx.x / team_threads;
  const TeamPlace at = team_place(w, row_bytes, n, n_chunks, team_threads, l2_hint);
  const int rows_per_block = teams * kR;
  const int groups = (n + rows_per_block - 1) / rows_per_block;
  auto first_row = [&](int bg) { return (bg * teams + team) * kR; };
  Chunk a[kR][kCpt], b[kR][kCpt];
  int bg = blockIdx.x;
  load_chunks<kR, kCpt>(at, first_row(bg), a);
  wait_for_previous_kernel();
  ChunkX x[kCpt];
#pragma unroll
  for (int i = 0; i < kCpt; ++i) {
    const int c = at.t + i * team_threads;
    if (c < n_chunks) x[i] = load_x(xq, xs, c);
  }
  __shared__ float partial[2][kThreads / 32][kR];  // alternate: one barrier per group
  while (bg < groups) {  // the same trip count for every thread of the block
    if (bg + (int)gridDim.x < groups) load_chunks<kR, kCpt>(at, first_row(bg + gridDim.x), b);
    loop_step<kR, kCpt>(at, team, first_row(bg), a, x, partial[0], y);
    bg += gridDim.x;
    if (bg >= groups) break;
    if (bg + (int)gridDim.x < groups) load_chunks<kR, kCpt>(at, first_row(bg + gridDim.x), a);
    loop_step<kR, kCpt>(at, team, first_row(bg), b, x, partial[1], y);
    bg += gridDim.x;
  }
}

struct Shape {
  int team_threads;
  int rows;       // kR
  int chunks;     // kCpt
  int loop_grid;  // 0: one team per row group; else the looping kernel (see launch_shape)
};

// Threads per row: one chunk per thread where a row has at most 128 chunks (K <= 8192),
// else the widest team (128 threads, ceil(chunks / 128) each). Two rows per team, except
// for long rows (K > 8192) in tall matrices (at least 16 rows per multiprocessor): there
// the looping kernel, four blocks per multiprocessor, one row per team. Measured on the
// H200 against narrower teams, one or four rows per team, and looping grids (docs/CUDA.md);
// HABLAR_Q4K_TEAM, HABLAR_Q4K_ROWS and HABLAR_Q4K_GRID override each choice for the lab.
Shape choose_shape(int n_chunks, int64_t n_rows) {
  int team = 16;
  while (team < kThreads && team < n_chunks) team *= 2;
  team = lab_knob("HABLAR_Q4K_TEAM", team);
  if (team != 16 && team != 32 && team != 64 && team != 128) team = 128;
  while (team < kThreads && (n_chunks + team - 1) / team > 8) team *= 2;
  const int chunks = (n_chunks + team - 1) / team;
  const bool tall_and_long = chunks >= 2 && n_rows >= 16 * (int64_t)device_multiprocessors();
  const int loop_grid = lab_knob("HABLAR_Q4K_GRID", tall_and_long ? 4 : 0);
  int rows = lab_knob("HABLAR_Q4K_ROWS", loop_grid != 0 ? 1 : 2);
  if (rows != 1 && rows != 2 && rows != 4) rows = 1;
  while (rows > 1 && rows * chunks > 8) rows /= 2;
  return {team, rows, chunks, loop_grid};
}

template <int kR, int kCpt>
void launch_shape(const WeightView& w, const int8_t* xq, const float2* xs, float* y,
                  const Shape& shape, bool dependent_launch, cudaStream_t stream) {
  const int team_threads = shape.team_threads;
  const int rows_per_block = kThreads / team_threads * kR;
  const int groups = (int)((w.rows + rows_per_block - 1) / rows_per_block);
  // loop_grid: the looping kernel with that many blocks per multiprocessor (negative: that
  // many blocks in all, which the tests use to make every block loop).
  const int loop_grid = shape.loop_grid;
  const int loop_blocks = loop_grid > 0 ? loop_grid * device_multiprocessors() : -loop_grid;
  const bool l2_hint = lab_knob("HABLAR_Q4K_L2HINT", 0) != 0;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(loop_grid != 0 ? std::min(groups, loop_blocks) : groups);
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = dependent_launch ? 1 : 0;
  auto kernel = loop_grid != 0 ? q4k_rows_loop_kernel<kR, kCpt> : q4k_rows_kernel<kR, kCpt>;
  HABLAR_CUDA_CHECK(cudaLaunchKernelEx(
      &config, kernel, static_cast<const uint8_t*>(w.data), w.row_bytes, (int)w.rows,
      (int)(w.cols / 64), xq, reinterpret_cast<const float4*>(xs), y, team_threads, l2_hint));
  HABLAR_CUDA_CHECK_LAUNCH();
}

template <int kR, int kCpt = 1>
void dispatch_chunks(const Shape& s, const WeightView& w, const int8_t* xq, const float2* xs,
                     float* y, bool dependent_launch, cudaStream_t stream) {
  if constexpr (kR * kCpt <= 8) {
    if (s.chunks == kCpt) return launch_shape<kR, kCpt>(w, xq, xs, y, s, dependent_launch, stream);
    if constexpr (kCpt < 8 / kR)
      return dispatch_chunks<kR, kCpt + 1>(s, w, xq, xs, y, dependent_launch, stream);
  }
  throw_error(ErrorKind::kInternal,
              "matmul_q4k_rows: no kernel for " + std::to_string(s.chunks) + " chunks per thread");
}

}  // namespace

bool q4k_rows_supported(const WeightView& w) {
  // The widest team (128 threads) with one row takes up to 8 chunks: K <= 65536.
  return w.type == DType::Q4_K && w.cols % 256 == 0 && w.cols <= 128 * 8 * 64 &&
         reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && w.row_bytes % 16 == 0;
}

void matmul_q4k_rows(const WeightView& w, const int8_t* xq, const float2* xs, float* y,
                     cudaStream_t stream) {
  const Shape s = choose_shape((int)(w.cols / 64), w.rows);
  // On a stream of its own (not the legacy default stream) and unless the lab turns it off
  // (HABLAR_Q4K_PDL=0).
  const bool dependent_launch = stream != nullptr && lab_knob("HABLAR_Q4K_PDL", 1) != 0;
  switch (s.rows) {
    case 4:
      return dispatch_chunks<4>(s, w, xq, xs, y, dependent_launch, stream);
    case 2:
      return dispatch_chunks<2>(s, w, xq, xs, y, dependent_launch, stream);
    default:
      return dispatch_chunks<1>(s, w, xq, xs, y, dependent_launch, stream);
  }
}

}  // namespace hablar::cuda
