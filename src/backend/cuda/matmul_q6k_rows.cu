// Q6_K x int8 activations at M = 1: the decode product (see matmul_q6k_rows.h).
//
// Q6_K super-blocks are 210 bytes, so blocks and rows are only 2-byte aligned and a thread
// cannot take its own bytes in wide loads. Instead each warp copies a contiguous span of W,
// whole, into its own slot of shared memory with 16-byte cp.async (lane i takes the aligned
// pieces i, i + 32, ...: each copy instruction covers 512 contiguous bytes, and the bytes in
// flight are bounded by shared memory, not registers), then computes from the slot. A lane
// takes "half-units" (q6k_unit.cuh: the 128 values of half a super-block, its 64 ql, 32 qh
// and 8 scale bytes and d): 30 aligned 4-byte shared loads realigned by funnel shifts, 48
// dp4a, and the activations (128 int8 codes and four (dx, sx) pairs) in ten 16-byte loads
// through L1. Two ways to cut the work (Shape):
//   - whole rows (K <= 4096): a team of `team` lanes per row, so a warp stages 32 / team
//     consecutive rows; lane t of a team takes half-units t, t + team, ... The team starts at
//     the power of two >= K / 128 and halves (more rows per warp: more bytes in flight, the
//     activations shared by more lanes) while at least six warps per multiprocessor remain;
//   - slices (K > 4096): a row split into `slices` spans of at most 16 super-blocks, one warp
//     each (one half-unit per lane), the warps of a row in one block; their sums meet in
//     shared memory. Long rows on one warp were latency-bound (too few warps, long chains).
// The team's sums meet by shuffles. The copies are issued before the kernel waits on the
// kernel before it (programmatic dependent launch: weights never depend on it; activations
// and y are touched only after), and the next kernel is let start once a warp's weights have
// landed: earlier, its blocks took the places of this kernel's waiting ones.
#include <algorithm>
#include <string>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/matmul_q6k_rows.h"
#include "backend/cuda/q4k_chunk.cuh"
#include "backend/cuda/q6k_unit.cuh"
#include "core/quant_blocks.h"

namespace hablar::cuda {
namespace {

using q4k_chunk::allow_next_kernel_to_start;
using q4k_chunk::wait_for_previous_kernel;

static_assert(sizeof(BlockQ6_K) == q6k::kBlockBytes, "Q6_K super-block layout");

constexpr int kMaxWarps = 16;             // per block
constexpr int kSmemPerBlock = 48 * 1024;  // what a block gets without opting in
constexpr int64_t kMaxK = 49152;          // 12 slices of 16 super-blocks: 40.5 KB a block
constexpr int kSliceBlocks = 16;          // super-blocks per slice: one half-unit per lane
constexpr int kValuesPerHalfUnit = 128;

// Starts copying the bytes [begin, end) of W (which ends at w_end) to slot in aligned 16-byte
// pieces, lane i taking pieces i, i + 32, ...; a last piece that would reach past w_end is
// copied by 2-byte loads instead. Returns where begin lands in the slot (0..14).
__device__ __forceinline__ int stage_span(const uint8_t* begin, const uint8_t* end,
                                          const uint8_t* w_end, uint8_t* slot, int lane) {
  const int lead = (int)(reinterpret_cast<uintptr_t>(begin) & 15);
  const uint8_t* first = begin - lead;  // not before W, which is 16-byte aligned
  const int bytes = (int)(end - first), pieces = (bytes + 15) / 16;
  const int whole = first + 16 * pieces <= w_end ? pieces : pieces - 1;
  for (int i = lane; i < whole; i += 32) copy16_async(slot + 16 * i, first + 16 * i);
  if (whole < pieces && lane == 0)  // the matrix's last bytes (bytes is even)
    for (int b = 16 * whole; b < bytes; b += 2)
      *reinterpret_cast<uint16_t*>(slot + b) =
          __ldg(reinterpret_cast<const unsigned short*>(first + b));
  return lead;
}

// The activations of half-unit h: its 128 codes, four to a word, and its blocks' (dx, sx).
struct UnitX {
  int codes[32];
  float2 scales[4];
};
__device__ __forceinline__ void load_unit_x(const int8_t* xq, const float4* xs, int h, UnitX& x) {
  const int4* codes = reinterpret_cast<const int4*>(xq + (size_t)kValuesPerHalfUnit * h);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int4 v = __ldg(codes + i);
    x.codes[4 * i] = v.x, x.codes[4 * i + 1] = v.y, x.codes[4 * i + 2] = v.z;
    x.codes[4 * i + 3] = v.w;
  }
  const float4 s01 = __ldg(xs + 2 * h), s23 = __ldg(xs + 2 * h + 1);
  x.scales[0] = make_float2(s01.x, s01.y), x.scales[1] = make_float2(s01.z, s01.w);
  x.scales[2] = make_float2(s23.x, s23.y), x.scales[3] = make_float2(s23.z, s23.w);
}

// What a warp owns: rows row0 .. row0 + 32 / team - 1 (whole rows: slices == 1) or super-blocks
// b0 .. b1 - 1 of row row0 (slice `slice` of `slices`, team == 32).
struct WarpPlace {
  int row0, rows, slice, b0, b1;
};
__device__ __forceinline__ WarpPlace warp_place(int blocks_per_row, int team, int slices) {
  const int warp = threadIdx.x / 32, groups = blockDim.x / 32 / slices;
  const int slice = warp % slices, rows = 32 / team;
  const int row0 = (blockIdx.x * groups + warp / slices) * rows;
  return {row0, rows, slice, slice * blocks_per_row / slices,
          (slice + 1) * blocks_per_row / slices};
}

// Grid: blockDim.x / 32 warps per block, each with a slot of slot_bytes of dynamic shared
// memory; with slices > 1 a row's slices are consecutive warps of a block. xs: (dx, sx) pairs
// as float4.
__global__ void __launch_bounds__(kMaxWarps * 32)
    q6k_rows_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int n, int blocks_per_row,
                    int team, int slices, int slot_bytes, const int8_t* __restrict__ xq,
                    const float4* __restrict__ xs, float* __restrict__ y) {
  extern __shared__ __align__(16) uint8_t slots[];
  __shared__ float partial[kMaxWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const WarpPlace at = warp_place(blocks_per_row, team, slices);
  uint8_t* slot = slots + warp * slot_bytes;
  int lead = 0;
  if (at.row0 < n) {
    const uint8_t* begin = w + (size_t)at.row0 * row_bytes + (size_t)at.b0 * q6k::kBlockBytes;
    const uint8_t* end =
        w + (size_t)(min(at.row0 + at.rows, n) - 1) * row_bytes + (size_t)at.b1 * q6k::kBlockBytes;
    lead = stage_span(begin, end, w + (size_t)n * row_bytes, slot, lane);
  }
  wait_for_previous_kernel();  // x (and y) may be written by the kernel before this one

  const int t = lane % team, row = at.row0 + lane / team;
  const int h_end = 2 * at.b1;
  UnitX x;
  if (2 * at.b0 + t < h_end) load_unit_x(xq, xs, 2 * at.b0 + t, x);  // with the weights
  wait_async_all();
  __syncwarp();  // every lane's pieces are in the slot and visible to the warp
  allow_next_kernel_to_start();
  float acc = 0.0f;
  if (row < n) {
    const uint8_t* w_span = slot + lead + (size_t)(lane / team) * row_bytes;
    for (int h = 2 * at.b0 + t; h < h_end; h += team) {
      if (h != 2 * at.b0 + t) load_unit_x(xq, xs, h, x);
      const uint8_t* block = w_span + (h / 2 - at.b0) * q6k::kBlockBytes;
      acc += q6k::half_unit_dot(q6k::load_half_unit(block, h % 2), x.codes, x.scales);
    }
  }
  for (int off = team / 2; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (slices == 1) {
    if (t == 0 && row < n) y[row] = acc;
    return;
  }
  if (lane == 0) partial[warp] = acc;
  __syncthreads();
  if (at.slice == 0 && lane == 0 && row < n) {
    float sum = 0.0f;
    for (int s = 0; s < slices; ++s) sum += partial[warp + s];
    y[row] = sum;
  }
}

struct Shape {
  int team;        // lanes per row (a power of two, 1..32)
  int slices;      // warps per row (team 32 when more than one)
  int groups;      // rows (slices > 1) or warps of rows (slices == 1) per block
  int slot_bytes;  // shared memory per warp
};

// A warp's slot: its span of W plus up to 14 bytes before it, in whole 16-byte pieces.
int slot_bytes_for(size_t span_bytes) {
  return (int)((span_bytes + 14 + 15) / 16 * 16);
}

// Overrides (0: the default) serve the lab only: team, super-blocks per slice, groups.
Shape make_shape(const WeightView& w, int team = 0, int slice_blocks = 0, int groups = 0) {
  const int blocks_per_row = (int)(w.cols / 256), half_units = 2 * blocks_per_row;
  const int64_t sms = device_multiprocessors();
  if (slice_blocks == 0 && team == 0 && w.cols > 4096) slice_blocks = kSliceBlocks;
  if (slice_blocks > 0 && slice_blocks < blocks_per_row) {
    slice_blocks = std::max(slice_blocks, (blocks_per_row + kMaxWarps - 1) / kMaxWarps);
    const int slices = (blocks_per_row + slice_blocks - 1) / slice_blocks;
    const int slot = slot_bytes_for((size_t)((blocks_per_row + slices - 1) / slices) * 210);
    if (groups == 0) groups = std::max(1, 4 / slices);
    return {32, slices, groups, slot};
  }
  if (team == 0) {
    for (team = 1; team < 32 && team < half_units;) team *= 2;
    while (team > 2) {  // halve while the warps stay many enough and their slots small
      const int64_t rows = 64 / team, warps = (w.rows + rows - 1) / rows;
      if (slot_bytes_for(rows * w.row_bytes) > kSmemPerBlock / 2 || warps < 6 * sms) break;
      team /= 2;
    }
  }
  const int slot = slot_bytes_for((size_t)(32 / team) * w.row_bytes);
  if (groups == 0) {  // up to four warps per block, fewer while under four blocks per SM
    groups = std::min(4, kSmemPerBlock / slot);
    groups = groups >= 4 ? 4 : groups >= 2 ? 2 : 1;
    const int64_t warps = (w.rows + 32 / team - 1) / (32 / team);
    while (groups > 1 && (warps + groups - 1) / groups < 4 * sms) groups /= 2;
  }
  return {team, 1, groups, slot};
}

void launch(const WeightView& w, const int8_t* xq, const float2* xs, float* y, const Shape& s,
            cudaStream_t stream) {
  const int64_t rows_per_block = (int64_t)s.groups * (32 / s.team);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3((unsigned)((w.rows + rows_per_block - 1) / rows_per_block));
  config.blockDim = dim3(32 * s.groups * s.slices);
  config.dynamicSmemBytes = (size_t)s.groups * s.slices * s.slot_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = stream != nullptr ? 1 : 0;  // not on the legacy default stream
  HABLAR_CUDA_CHECK(cudaLaunchKernelEx(&config, q6k_rows_kernel,
                                       static_cast<const uint8_t*>(w.data), w.row_bytes,
                                       (int)w.rows, (int)(w.cols / 256), s.team, s.slices,
                                       s.slot_bytes, xq, reinterpret_cast<const float4*>(xs), y));
  HABLAR_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool q6k_rows_supported(const WeightView& w) {
  return w.type == DType::Q6_K && w.cols > 0 && w.cols % 256 == 0 && w.cols <= kMaxK &&
         w.row_bytes == (size_t)w.cols / 256 * sizeof(BlockQ6_K) && w.rows > 0 &&
         w.rows <= (int64_t{1} << 30) && reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
}

void matmul_q6k_rows(const WeightView& w, const int8_t* xq, const float2* xs, float* y,
                     cudaStream_t stream) {
  if (!q6k_rows_supported(w))
    throw_error(ErrorKind::kInvalidArgument,
                "matmul_q6k_rows: needs Q6_K weights, K a multiple of 256 up to " +
                    std::to_string(kMaxK) + ", packed rows and 16-byte aligned data");
  launch(w, xq, xs, y, make_shape(w), stream);
}

}  // namespace hablar::cuda
