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
//
// With kM activation rows (a decode step of two to four sequences) the thread takes its chunks
// against each row's activations in turn: the weights are read once for all rows, and each row is
// summed exactly as a one-row call sums it (same teams, same chunk order), so its bits do not
// depend on the rows beside it.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/glu_activation.cuh"
#include "backend/cuda/lab_knobs.h"
#include "backend/cuda/matmul_q4k_rows.h"
#include "backend/cuda/q4k_chunk.cuh"
#include "core/error.h"
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

// Up to kMaxSegments products of one input in one launch (Q, K and V), or a gate and an up
// product with the gated activation applied (kGlu): segment s owns blocks
// [first_block[s], first_block[s + 1]) and writes y[s] (the GLU form: one segment, whose
// matrix is the gate, with up_w its up matrix of the same shape).
constexpr int kMaxSegments = 3;
struct RowsJob {
  const uint8_t* w[kMaxSegments];
  float* y[kMaxSegments];
  int n[kMaxSegments];
  int first_block[kMaxSegments];
  int segments;
  const uint8_t* up_w;
  GluActivation act;
};

// Grid: one team of team_threads threads per kR rows (kThreads / team_threads teams per
// block) of each segment. xs holds (dx, sx) of each block of 32 activations; as float4, one
// per chunk. kM activation rows: codes xq[kM][K], pairs xs[kM][K / 64] (as float4), and each
// segment's y[kM][n].
template <int kR, int kCpt, bool kGlu, int kM>
__global__ void __launch_bounds__(kThreads)
    q4k_rows_kernel(const RowsJob job, size_t row_bytes, int n_chunks,
                    const int8_t* __restrict__ xq, const float4* __restrict__ xs, int team_threads,
                    bool l2_hint) {
  allow_next_kernel_to_start();
  // The block's segment (constant indices only: the job stays in the parameter space).
  const uint8_t* w = job.w[0];
  float* y = job.y[0];
  int n = job.n[0], first_block = 0;
#pragma unroll
  for (int s = 1; s < kMaxSegments; ++s)
    if (s < job.segments && (int)blockIdx.x >= job.first_block[s])
      w = job.w[s], y = job.y[s], n = job.n[s], first_block = job.first_block[s];
  const int teams = kThreads / team_threads, team = threadIdx.x / team_threads;
  const TeamPlace at = team_place(w, row_bytes, n, n_chunks, team_threads, l2_hint);
  const int row0 = (((int)blockIdx.x - first_block) * teams + team) * kR;
  Chunk chunk[kR][kCpt];
  load_chunks<kR, kCpt>(at, row0, chunk);
  [[maybe_unused]] Chunk up_chunk[kGlu ? kR : 1][kGlu ? kCpt : 1];
  [[maybe_unused]] const TeamPlace up_at =
      team_place(kGlu ? job.up_w : w, row_bytes, n, n_chunks, team_threads, l2_hint);
  if constexpr (kGlu) load_chunks<kR, kCpt>(up_at, row0, up_chunk);
  wait_for_previous_kernel();  // x (and y) may be written by the kernel before this one

  // One shared-memory slot per team sum of the block, so that no sum waits on another's reads.
  __shared__ float partial[2 * kM][kThreads / 32][kR];
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    const int8_t* xq_m = xq + (size_t)m * n_chunks * 64;
    const float4* xs_m = xs + (size_t)m * n_chunks;
    float* y_m = y + (size_t)m * n;
    float acc[kR] = {};
    dot_chunks<kR, kCpt>(at, row0, chunk, xq_m, xs_m, acc);
    if constexpr (!kGlu) {
      team_sum_store<kR>(at, team, row0, acc, partial[2 * m], y_m);
    } else {
      float up_acc[kR] = {};
      dot_chunks<kR, kCpt>(up_at, row0, up_chunk, xq_m, xs_m, up_acc);
      const float g = team_total<kR>(at, team, acc, partial[2 * m]);
      const float u = team_total<kR>(at, team, up_acc, partial[2 * m + 1]);
      if (at.t < kR && row0 + at.t < n) y_m[row0 + at.t] = glu_value(job.act, g, u);
    }
  }
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
// `matrices`: 2 for the GLU form (a gate and an up row per row: twice the registers), which,
// like several segments, never loops.
Shape choose_shape(int n_chunks, int64_t n_rows, int matrices = 1, bool may_loop = true) {
  int team = 16;
  while (team < kThreads && team < n_chunks) team *= 2;
  team = lab_knob("HABLAR_Q4K_TEAM", team);
  if (team != 16 && team != 32 && team != 64 && team != 128) team = 128;
  while (team < kThreads && (n_chunks + team - 1) / team > 8 / matrices) team *= 2;
  const int chunks = (n_chunks + team - 1) / team;
  const bool tall_and_long = chunks >= 2 && n_rows >= 16 * (int64_t)device_multiprocessors();
  const int loop_grid = may_loop ? lab_knob("HABLAR_Q4K_GRID", tall_and_long ? 4 : 0) : 0;
  int rows = lab_knob("HABLAR_Q4K_ROWS", loop_grid != 0 ? 1 : 2);
  if (rows != 1 && rows != 2 && rows != 4) rows = 1;
  while (rows > 1 && rows * chunks * matrices > 8) rows /= 2;
  return {team, rows, chunks, loop_grid};
}

// One launch's work: the job (segments or the GLU pair), its weights' row bytes and K.
struct Launch {
  RowsJob job;
  size_t row_bytes;
  int n_chunks;
  const int8_t* xq;
  const float2* xs;
};

// The grid of the one-team-per-row-group kernel: each segment's blocks, in order.
int segment_blocks(RowsJob& job, int rows_per_block) {
  int blocks = 0;
  for (int s = 0; s < job.segments; ++s) {
    job.first_block[s] = blocks;
    blocks += (job.n[s] + rows_per_block - 1) / rows_per_block;
  }
  return blocks;
}

template <int kR, int kCpt, bool kGlu, int kM>
void launch_shape(Launch launch, const int8_t* xq, const float2* xs, const Shape& shape,
                  bool dependent_launch, cudaStream_t stream) {
  const int team_threads = shape.team_threads;
  const int rows_per_block = kThreads / team_threads * kR;
  const int blocks = segment_blocks(launch.job, rows_per_block);
  // loop_grid: the looping kernel with that many blocks per multiprocessor (negative: that
  // many blocks in all, which the tests use to make every block loop).
  const int loop_grid = shape.loop_grid;
  const int loop_blocks = loop_grid > 0 ? loop_grid * device_multiprocessors() : -loop_grid;
  const bool l2_hint = lab_knob("HABLAR_Q4K_L2HINT", 0) != 0;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(loop_grid != 0 ? std::min(blocks, loop_blocks) : blocks);
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = dependent_launch ? 1 : 0;
  const auto* x4 = reinterpret_cast<const float4*>(xs);
  if constexpr (!kGlu && kM == 1) {
    if (loop_grid != 0) {
      HABLAR_CUDA_CHECK(cudaLaunchKernelEx(&config, q4k_rows_loop_kernel<kR, kCpt>, launch.job.w[0],
                                           launch.row_bytes, launch.job.n[0], launch.n_chunks, xq,
                                           x4, launch.job.y[0], team_threads, l2_hint));
      HABLAR_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  HABLAR_CUDA_CHECK(cudaLaunchKernelEx(&config, q4k_rows_kernel<kR, kCpt, kGlu, kM>, launch.job,
                                       launch.row_bytes, launch.n_chunks, xq, x4, team_threads,
                                       l2_hint));
  HABLAR_CUDA_CHECK_LAUNCH();
}

// The kernel instance for the shape's rows (kR) and chunks per thread (kCpt): at most 8
// chunks in registers per thread (4 per matrix in the GLU form).
template <bool kGlu, int kM, int kR, int kCpt = 1>
void dispatch_chunks(const Shape& s, const Launch& launch, const int8_t* xq, const float2* xs,
                     bool dependent_launch, cudaStream_t stream) {
  constexpr int kMatrices = kGlu ? 2 : 1;
  if constexpr (kR * kCpt * kMatrices <= 8) {
    if (s.chunks == kCpt)
      return launch_shape<kR, kCpt, kGlu, kM>(launch, xq, xs, s, dependent_launch, stream);
    if constexpr (kCpt < 8 / (kR * kMatrices))
      return dispatch_chunks<kGlu, kM, kR, kCpt + 1>(s, launch, xq, xs, dependent_launch, stream);
  }
  throw_error(ErrorKind::kInternal,
              "matmul_q4k_rows: no kernel for " + std::to_string(s.chunks) + " chunks per thread");
}

template <bool kGlu, int kM>
void run_rows(const Launch& launch, const Shape& s, bool dependent_launch, cudaStream_t stream) {
  switch (s.rows) {
    case 4:
      return dispatch_chunks<kGlu, kM, 4>(s, launch, launch.xq, launch.xs, dependent_launch,
                                          stream);
    case 2:
      return dispatch_chunks<kGlu, kM, 2>(s, launch, launch.xq, launch.xs, dependent_launch,
                                          stream);
    default:
      return dispatch_chunks<kGlu, kM, 1>(s, launch, launch.xq, launch.xs, dependent_launch,
                                          stream);
  }
}

// m activation rows (1..kQ4kRowsMaxM). Several rows never loop (one team per row group; the
// teams, and so each row's sum, are those of one row).
template <bool kGlu>
void run(const Launch& launch, int64_t total_rows, bool may_loop, int m, cudaStream_t stream) {
  const Shape s = choose_shape(launch.n_chunks, total_rows, kGlu ? 2 : 1, may_loop && m == 1);
  // On a stream of its own (not the legacy default stream) and unless the lab turns it off
  // (HABLAR_Q4K_PDL=0).
  const bool dependent_launch = stream != nullptr && lab_knob("HABLAR_Q4K_PDL", 1) != 0;
  static_assert(kQ4kRowsMaxM == 4, "one instantiation per row count");
  switch (m) {
    case 4:
      return run_rows<kGlu, 4>(launch, s, dependent_launch, stream);
    case 3:
      return run_rows<kGlu, 3>(launch, s, dependent_launch, stream);
    case 2:
      return run_rows<kGlu, 2>(launch, s, dependent_launch, stream);
    default:
      return run_rows<kGlu, 1>(launch, s, dependent_launch, stream);
  }
}

}  // namespace

int q4k_rows_team(int64_t cols, int64_t rows, int matrices) {
  return choose_shape((int)(cols / 64), rows, matrices, false).team_threads;
}

bool q4k_rows_supported(const WeightView& w) {
  // The widest team (128 threads) with one row takes up to 8 chunks: K <= 65536.
  return w.type == DType::Q4_K && w.cols % 256 == 0 && w.cols <= 128 * 8 * 64 &&
         reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && w.row_bytes % 16 == 0;
}

bool q4k_rows_take(const WeightView& w, int64_t m) {
  if (m < 1 || m > kQ4kRowsMaxM || !q4k_rows_supported(w)) return false;
  return m <= 2 ||
         w.rows * (int64_t)w.row_bytes <= kQ4kRowsFewBytesPerSm * device_multiprocessors();
}

void matmul_q4k_rows(const WeightView& w, const int8_t* xq, const float2* xs, float* y,
                     cudaStream_t stream, int m) {
  const WeightView* ws[] = {&w};
  float* ys[] = {y};
  matmul_q4k_rows_multi(ws, ys, xq, xs, stream, m);
}

void matmul_q4k_rows_multi(std::span<const WeightView* const> ws, std::span<float* const> ys,
                           const int8_t* xq, const float2* xs, cudaStream_t stream, int m) {
  HABLAR_CHECK(!ws.empty() && ws.size() <= (size_t)kMaxSegments && ys.size() == ws.size(),
               "matmul_q4k_rows_multi: 1 to 3 matrices, an output each");
  HABLAR_CHECK(m >= 1 && m <= kQ4kRowsMaxM, "matmul_q4k_rows: 1 to 4 activation rows");
  Launch launch = {};
  launch.row_bytes = ws[0]->row_bytes;
  launch.n_chunks = (int)(ws[0]->cols / 64);
  launch.xq = xq, launch.xs = xs;
  int64_t rows = 0;
  for (size_t s = 0; s < ws.size(); ++s) {
    HABLAR_CHECK(q4k_rows_supported(*ws[s]) && ws[s]->cols == ws[0]->cols,
                 "matmul_q4k_rows_multi: Q4_K matrices of one K");
    launch.job.w[s] = static_cast<const uint8_t*>(ws[s]->data);
    launch.job.y[s] = ys[s];
    launch.job.n[s] = (int)ws[s]->rows;
    rows += ws[s]->rows;
  }
  launch.job.segments = (int)ws.size();
  run<false>(launch, rows, ws.size() == 1, m, stream);
}

bool q4k_rows_glu_supported(const WeightView& gate, const WeightView& up) {
  // Two matrices' chunks in registers: at most 4 per thread of the widest team, K <= 32768.
  return q4k_rows_supported(gate) && q4k_rows_supported(up) && gate.rows == up.rows &&
         gate.cols == up.cols && gate.cols <= 128 * 4 * 64;
}

void matmul_q4k_rows_glu(const WeightView& gate, const WeightView& up, const int8_t* xq,
                         const float2* xs, float* out, GluActivation act, cudaStream_t stream,
                         int m) {
  HABLAR_CHECK(q4k_rows_glu_supported(gate, up),
               "matmul_q4k_rows_glu: Q4_K gate and up matrices of one shape");
  HABLAR_CHECK(m >= 1 && m <= kQ4kRowsMaxM, "matmul_q4k_rows_glu: 1 to 4 activation rows");
  Launch launch = {};
  launch.row_bytes = gate.row_bytes;
  launch.n_chunks = (int)(gate.cols / 64);
  launch.xq = xq, launch.xs = xs;
  launch.job.w[0] = static_cast<const uint8_t*>(gate.data);
  launch.job.y[0] = out;
  launch.job.n[0] = (int)gate.rows;
  launch.job.segments = 1;
  launch.job.up_w = static_cast<const uint8_t*>(up.data);
  launch.job.act = act;
  run<true>(launch, gate.rows, false, m, stream);
}

}  // namespace hablar::cuda
