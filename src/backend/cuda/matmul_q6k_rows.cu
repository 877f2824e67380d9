// Q6_K x int8 activations at M = 1 or 2: the decode product (see matmul_q6k_rows.h).
//
// Q6_K super-blocks are 210 bytes, so blocks and rows are only 2-byte aligned and a thread
// cannot take its own bytes in wide loads. Instead each warp (a block of its own) copies its
// rows, whole and consecutive, into shared memory with 16-byte cp.async (lane i takes the
// aligned pieces i, i + 32, ...: each copy instruction covers 512 contiguous bytes, and the
// bytes in flight are bounded by shared memory, not registers), then computes from there:
//   - a team of `team` lanes per row, so a warp owns 32 / team rows; lane t of a team takes
//     half-units t, t + team, ... of its row (q6k_unit.cuh: the 128 values of half a
//     super-block, its 64 ql, 32 qh and 8 scale bytes and d): 30 aligned 4-byte shared loads
//     realigned by funnel shifts, 48 dp4a, and the activations (128 int8 codes and four
//     (dx, sx) pairs) in ten 16-byte loads through L1;
//   - the team starts at the power of two >= K / 128 (at most 32) and halves while a warp's
//     rows fit 24 KB and warps remain many enough to hide the lanes' longer chains: six per
//     multiprocessor up to 4 half-units per lane, 32 beyond. More rows per warp means more
//     bytes in flight per warp and each activation load shared by more lanes (on the H200, a
//     151936 x 1536 matrix went from 44% of the copy bandwidth at 16 lanes per row to 91% at
//     2; 4096 x 4096 is fastest at 8, 4096 x 14336 at 32);
//   - the team's sums meet by shuffles and its first lane stores y.
// With M activation rows (kM > 1: a decode step of two sequences) a lane unpacks each
// half-unit once and takes it against the M rows' codes in turn, each row summed exactly as a
// one-row call sums it (same team, same half-units in the same order): a row's result does
// not depend on the rows beside it. The weights are read once for all M rows; the lanes'
// instructions grow with M, which bounds the rows this kernel takes (kQ6kRowsMaxM).
// One row per warp (team 32: long rows, few of them) at M = 1 takes q6k_rows_shared_x_kernel
// instead: blocks of up to 8 such warps stage x once in shared memory, where each warp of the
// kernel above reads all of x from L2 for its one row (4096 x 14336 on an H100: 31.2 -> 24.2
// us, 53% -> 69% of the copy bandwidth; 1536 x 8960: 7.9 -> 6.9 us), with the same bits.
// The copies are issued before the kernel waits on the kernel before it (programmatic
// dependent launch: weights never depend on it; activations and y are touched only after),
// and the next kernel is let start once a warp's weights have landed: at the start, its
// blocks took the places of this kernel's (1536 x 1536: 4.8 us a call, 2.6 us so).
#include <algorithm>
#include <string>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/lab_knobs.h"
#include "backend/cuda/matmul_q6k_rows.h"
#include "backend/cuda/q4k_chunk.cuh"
#include "backend/cuda/q6k_unit.cuh"
#include "core/quant_blocks.h"

namespace hablar::cuda {
namespace {

static_assert(sizeof(BlockQ6_K) == q6k::kBlockBytes, "Q6_K super-block layout");

constexpr int kSmemPerBlock = 48 * 1024;  // what a block gets without opting in
constexpr int64_t kMaxK = 49152;          // one row of it, 40,320 bytes, fits a warp's slot
constexpr int kValuesPerHalfUnit = 128;

// The activations of half-unit h: its 128 codes, four to a word, and its blocks' (dx, sx).
struct UnitX {
  int codes[32];
  float2 scales[4];
};
// From codes (8 int4) and pairs (2 float4) in global memory (written by the kernel before:
// load_produced) or in shared memory.
template <bool kGlobal, typename T>
__device__ __forceinline__ T load_x_word(const T* p) {
  if constexpr (kGlobal) return load_produced(p);
  return *p;
}
template <bool kGlobal>
__device__ __forceinline__ void unpack_unit_x(const int4* codes, const float4* pairs, UnitX& x) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int4 v = load_x_word<kGlobal>(codes + i);
    x.codes[4 * i] = v.x, x.codes[4 * i + 1] = v.y, x.codes[4 * i + 2] = v.z;
    x.codes[4 * i + 3] = v.w;
  }
  const float4 s01 = load_x_word<kGlobal>(pairs), s23 = load_x_word<kGlobal>(pairs + 1);
  x.scales[0] = make_float2(s01.x, s01.y), x.scales[1] = make_float2(s01.z, s01.w);
  x.scales[2] = make_float2(s23.x, s23.y), x.scales[3] = make_float2(s23.z, s23.w);
}
__device__ __forceinline__ void load_unit_x(const int8_t* xq, const float4* xs, int h, UnitX& x) {
  unpack_unit_x<true>(reinterpret_cast<const int4*>(xq + (size_t)kValuesPerHalfUnit * h),
                      xs + 2 * h, x);
}

// Grid: one warp per block, 32 / team consecutive rows per warp, staged in slot_bytes of
// dynamic shared memory. kM activation rows: codes xq[kM][K], their (dx, sx) pairs xs (as
// float4, K / 64 of them a row); y[kM][n].
template <int kM>
__global__ void __launch_bounds__(32)
    q6k_rows_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int n, int half_units,
                    int team, const int8_t* __restrict__ xq, const float4* __restrict__ xs,
                    float* __restrict__ y) {
  extern __shared__ __align__(16) uint8_t slot[];
  const int lane = threadIdx.x, rows = 32 / team, row0 = blockIdx.x * rows;
  const uint8_t* w_end = w + (size_t)n * row_bytes;
  const int lead = stage_span(w + (size_t)row0 * row_bytes,
                              w + (size_t)min(row0 + rows, n) * row_bytes, w_end, slot, lane);
  wait_for_previous_kernel();  // x (and y) may be written by the kernel before this one

  const int t = lane % team, row = row0 + lane / team;
  const size_t x_codes = (size_t)half_units * kValuesPerHalfUnit,
               x_pairs = x_codes / 64;  // float4s (two (dx, sx) pairs each) a row
  UnitX x;
  if (t < half_units) load_unit_x(xq, xs, t, x);  // in flight with the weights
  wait_async_all();
  __syncwarp();  // every lane's pieces are in the slot and visible to the warp
  allow_next_kernel_to_start();
  float acc[kM];
#pragma unroll
  for (int m = 0; m < kM; ++m) acc[m] = 0.0f;
  if (row < n) {
    const uint8_t* w_row = slot + lead + (size_t)(lane / team) * row_bytes;
    for (int h = t; h < half_units; h += team) {
      const q6k::HalfUnit unit = q6k::load_half_unit(w_row + (h / 2) * q6k::kBlockBytes, h % 2);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        if (h != t || m > 0) load_unit_x(xq + m * x_codes, xs + m * x_pairs, h, x);
        acc[m] += q6k::half_unit_dot(unit, x.codes, x.scales);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    for (int off = team / 2; off > 0; off /= 2) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], off);
    if (t == 0 && row < n) y[(size_t)m * n + row] = acc[m];
  }
}

// ---- One-row warps (team 32: long rows, few of them) sharing the activations. Each warp of
// the kernel above reads the whole x from L2, as many bytes as its row of weights (4096 x
// 14336: 60 MB of x for 48 MB of weights). Here a block of `warps` warps stages x once in
// shared memory (cp.async, after the wait on the kernel before), each warp staging its row as
// above; the lanes then take x from shared memory. Same lanes, half-units, order and
// arithmetic as the kernel above at team 32: the same bits.
// x in shared memory: per half-unit kXUnitBytes, its 128 codes then its four (dx, sx) pairs
// and 16 bytes of padding: lanes reading consecutive half-units at a 176-byte stride hit
// distinct banks in each 8-lane phase of a 16-byte load.
constexpr int kXUnitBytes = 176;
constexpr int kSharedXMaxWarps = 8;

__device__ __forceinline__ void load_unit_x_shared(const uint8_t* x_unit, UnitX& x) {
  unpack_unit_x<false>(reinterpret_cast<const int4*>(x_unit),
                       reinterpret_cast<const float4*>(x_unit + kValuesPerHalfUnit), x);
}

// Grid: one warp per row, `warps` rows per block; dynamic shared memory: x (half_units *
// kXUnitBytes), then each warp's slot of slot_bytes. One activation row (xq [K], xs as float4
// [K / 64]).
__global__ void __launch_bounds__(32 * kSharedXMaxWarps)
    q6k_rows_shared_x_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int n, int half_units,
                             int slot_bytes, const int8_t* __restrict__ xq,
                             const float4* __restrict__ xs, float* __restrict__ y) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x * (blockDim.x / 32) + warp;
  uint8_t* x_units = smem;
  uint8_t* slot = smem + (size_t)half_units * kXUnitBytes + (size_t)warp * slot_bytes;
  const uint8_t* w_row = w + (size_t)min(row, n - 1) * row_bytes;
  const int lead = stage_span(w_row, w_row + row_bytes, w + (size_t)n * row_bytes, slot, lane);
  wait_for_previous_kernel();  // x (and y) may be written by the kernel before this one
  // x's 16-byte pieces: 8 of codes and 2 of pairs per half-unit.
  for (int i = threadIdx.x; i < 10 * half_units; i += blockDim.x) {
    const int h = i / 10, piece = i % 10;
    const uint8_t* from = piece < 8 ? reinterpret_cast<const uint8_t*>(xq) +
                                          (size_t)h * kValuesPerHalfUnit + 16 * piece
                                    : reinterpret_cast<const uint8_t*>(xs + 2 * h + piece - 8);
    copy16_async(x_units + (size_t)h * kXUnitBytes + 16 * piece, from);
  }
  wait_async_all();
  __syncthreads();  // every thread's pieces (x and the rows) are visible to the block
  allow_next_kernel_to_start();
  float acc = 0.0f;
  const uint8_t* staged = slot + lead;
  UnitX x;
  for (int h = lane; h < half_units; h += 32) {
    const q6k::HalfUnit unit = q6k::load_half_unit(staged + (h / 2) * q6k::kBlockBytes, h % 2);
    load_unit_x_shared(x_units + (size_t)h * kXUnitBytes, x);
    acc += q6k::half_unit_dot(unit, x.codes, x.scales);
  }
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0 && row < n) y[row] = acc;
}

// A warp's slot: its rows plus up to 14 bytes before them, in whole 16-byte pieces.
int slot_bytes_for(int team, size_t row_bytes) {
  return (int)(((size_t)(32 / team) * row_bytes + 14 + 15) / 16 * 16);
}

// Lanes per row (see the top of the file).
int choose_team(const WeightView& w) {
  const int half_units = (int)(w.cols / kValuesPerHalfUnit);
  int team = 1;
  while (team < 32 && team < half_units) team *= 2;
  const int64_t sms = device_multiprocessors();
  while (team > 2) {  // halving: twice the rows per warp, twice the half-units per lane
    const int64_t rows = 64 / team, warps = (w.rows + rows - 1) / rows;
    const int per_lane = (half_units + team / 2 - 1) / (team / 2);
    const bool enough_warps = warps >= 32 * sms || (warps >= 6 * sms && per_lane <= 4);
    if (!enough_warps || slot_bytes_for(team / 2, w.row_bytes) > kSmemPerBlock / 2) break;
    team /= 2;
  }
  return team;
}

template <int kM>
void launch(const WeightView& w, const int8_t* xq, const float2* xs, float* y, int team,
            cudaStream_t stream) {
  const int64_t rows = 32 / team;
  launch_dependent(q6k_rows_kernel<kM>, dim3((unsigned)((w.rows + rows - 1) / rows)), dim3(32),
                   (size_t)slot_bytes_for(team, w.row_bytes), stream,
                   static_cast<const uint8_t*>(w.data), w.row_bytes, (int)w.rows,
                   (int)(w.cols / kValuesPerHalfUnit), team, xq,
                   reinterpret_cast<const float4*>(xs), y);
}

// Warps per block of the shared-x kernel for w (0: none fits): up to kSharedXMaxWarps, as
// many as fit half the opt-in shared memory (so that two blocks fit a multiprocessor).
int shared_x_warps(const WeightView& w) {
  static const int optin = [] {
    int device = 0, bytes = 0;
    HABLAR_CUDA_CHECK(cudaGetDevice(&device));
    HABLAR_CUDA_CHECK(
        cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return bytes;
  }();
  const int64_t x_bytes = w.cols / kValuesPerHalfUnit * kXUnitBytes;
  const int64_t room = optin / 2 - x_bytes;
  const int64_t warps = room / slot_bytes_for(32, w.row_bytes);
  return (int)std::clamp<int64_t>(warps, 0, kSharedXMaxWarps);
}

void launch_shared_x(const WeightView& w, const int8_t* xq, const float2* xs, float* y, int warps,
                     cudaStream_t stream) {
  const int half_units = (int)(w.cols / kValuesPerHalfUnit);
  const int slot = slot_bytes_for(32, w.row_bytes);
  const size_t smem = (size_t)half_units * kXUnitBytes + (size_t)warps * slot;
  HABLAR_CUDA_CHECK(cudaFuncSetAttribute(q6k_rows_shared_x_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  launch_dependent(q6k_rows_shared_x_kernel, dim3((unsigned)((w.rows + warps - 1) / warps)),
                   dim3(32 * warps), smem, stream, static_cast<const uint8_t*>(w.data), w.row_bytes,
                   (int)w.rows, half_units, slot, xq, reinterpret_cast<const float4*>(xs), y);
}

// The instantiation for m rows (1..kQ6kRowsMaxM).
template <int kM = kQ6kRowsMaxM>
void launch_rows(const WeightView& w, int m, const int8_t* xq, const float2* xs, float* y, int team,
                 cudaStream_t stream) {
  if constexpr (kM > 1)
    if (m < kM) return launch_rows<kM - 1>(w, m, xq, xs, y, team, stream);
  launch<kM>(w, xq, xs, y, team, stream);
}

}  // namespace

int q6k_rows_team(const WeightView& w) {
  return choose_team(w);
}

bool q6k_rows_supported(const WeightView& w) {
  return w.type == DType::Q6_K && w.cols > 0 && w.cols % 256 == 0 && w.cols <= kMaxK &&
         w.row_bytes == (size_t)w.cols / 256 * sizeof(BlockQ6_K) && w.rows > 0 &&
         w.rows <= (int64_t{1} << 30) && reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
}

void matmul_q6k_rows(const WeightView& w, const int8_t* xq, const float2* xs, float* y,
                     cudaStream_t stream, int m) {
  if (!q6k_rows_supported(w))
    throw_error(ErrorKind::kInvalidArgument,
                "matmul_q6k_rows: needs Q6_K weights, K a multiple of 256 up to " +
                    std::to_string(kMaxK) + ", packed rows and 16-byte aligned data");
  if (m < 1 || m > kQ6kRowsMaxM)
    throw_error(ErrorKind::kInvalidArgument, "matmul_q6k_rows: M " + std::to_string(m) +
                                                 " outside 1.." + std::to_string(kQ6kRowsMaxM));
  const int team = choose_team(w);
  if (m == 1 && team == 32 && lab_knob("HABLAR_Q6K_SHARED_X", 1) != 0)
    if (const int warps = shared_x_warps(w); warps > 0)
      return launch_shared_x(w, xq, xs, y, warps, stream);
  launch_rows(w, m, xq, xs, y, team, stream);
}

}  // namespace hablar::cuda
