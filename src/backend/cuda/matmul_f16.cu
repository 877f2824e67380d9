// Q4_K and Q6_K x f16 activations for many rows on f16 tensor cores (mma.sync m16n8k16, f32
// accumulation). The weights are dequantized to f16 inside the A fragments, scales included
// (f16_weight_formats.cuh: one trait per format), so the tensor cores do all of a sub-block's
// arithmetic and the sums stay in f32 registers until the end; the int8 kernel
// (matmul_q4k_mma.cu) instead converts and scales every sub-block's integer result on the
// CUDA cores, which costs more than its tensor-core work.
//
// Block: 8 warps covering 128 weight rows x 16*kC activation rows. The block walks the
// super-blocks of K (or of its slice of K, grid z) in step: the raw bytes of its 128 rows'
// super-blocks and the f16 activations of its rows are copied into shared memory by a
// cp.async pipeline of kStages stages while the stage before is multiplied; the block makes
// the super-block's scales once in shared memory, then each warp multiplies its 32 weight rows
// by its 8*kC activation rows (each A fragment reused for all kC activation tiles, each B
// fragment, one 8-byte shared load, for both weight tiles).
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/f16_weight_formats.cuh"
#include "backend/cuda/glu_activation.cuh"
#include "backend/cuda/lab_knobs.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/matmul_f16.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/split_k.cuh"

namespace hablar::cuda {
namespace {

using namespace f16_product;

// All threads copy super-block tile.sb of the block's weight rows and of its activation rows
// (rows past M repeat the last) into the stage.
template <typename Format, int kTokens>
__device__ __forceinline__ void fill_stage(Stage<Format, kTokens>& st, const Tile& tile,
                                           const uint16_t* x, int k, int m, int tok0) {
  Format::fill_weights(st, tile);
  constexpr int kRowPieces = 256 * 2 / 16;  // 32
  for (int i = threadIdx.x; i < kTokens * kRowPieces; i += kThreads) {
    const int t = i / kRowPieces, piece = i % kRowPieces;
    const uint16_t* src = x + (size_t)min(tok0 + t, m - 1) * k + (size_t)tile.sb * 256 + 8 * piece;
    copy16_async(&st.x[t][16 * piece], src);
  }
}

// The block's sums into y (or its slice's part): with kParts = 2 the warps of part 1 first
// hand theirs to the warps of part 0 through shared memory (`spare`, free once the stages
// are done: kC * 1024 floats).
template <int kC, int kParts>
__device__ __forceinline__ void store_sums(Accumulators<kC>& acc, float* spare, int warp_n,
                                           int warp_m, int lane, int row_blk, int tok0, int n,
                                           int m, const float* out_scales, float* out) {
  constexpr int kSets = accumulator_sets<kC>();
  const int g = lane / 4, q = lane % 4;
  bool storing = true;
  if constexpr (kParts == 2) {
    float* mine = spare + (size_t)warp_n * (2 * kC * 4 * 32) + lane;
    __syncthreads();  // every warp is done with the stages
    if (warp_m == 1)
      for (int i = 0; i < 2 * kC * 4; ++i) {
        float sum = (&acc[0][0][0][0])[i];
        if constexpr (kSets > 1) sum += (&acc[1][0][0][0])[i];
        mine[32 * i] = sum;
      }
    __syncthreads();
    storing = warp_m == 0;
    if (storing)
      for (int i = 0; i < 2 * kC * 4; ++i) (&acc[0][0][0][0])[i] += mine[32 * i];
  }
  const int token_warp = kParts == 2 ? 0 : warp_m;
  float* dst = out + (size_t)blockIdx.z * m * n;
  if (storing) {
#pragma unroll
    for (int rt = 0; rt < 2; ++rt)
#pragma unroll
      for (int ct = 0; ct < kC; ++ct)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = row_blk + 32 * warp_n + 16 * rt + g + (i >= 2 ? 8 : 0);
          const int tok = tok0 + 8 * kC * token_warp + 8 * ct + 2 * q + (i & 1);
          float sum = acc[0][rt][ct][i];
          if constexpr (kSets > 1) sum += acc[1][rt][ct][i];
          if (row < n && tok < m) dst[(size_t)tok * n + row] = sum * out_scales[tok];
        }
  }
}

// Grid: (ceil(M / tokens_per_block), ceil(N / 128), slices of K). Shared memory: kStages
// stages, then the scales of the super-block being multiplied.
template <typename Format, int kC, int kStages, int kParts>
__global__ void __launch_bounds__(kThreads, 2)
    f16_product_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int n, int k,
                       const uint16_t* __restrict__ x, const float* __restrict__ out_scales, int m,
                       float* __restrict__ out) {
  constexpr int kTokens = tokens_per_block<kC, kParts>();
  using StageT = Stage<Format, kTokens>;
  static_assert(kParts == 1 || kC * 1024 * sizeof(float) <= sizeof(StageT) * kStages,
                "the halves' sums fit the stages");
  extern __shared__ __align__(16) uint8_t smem_raw[];
  StageT* stages = reinterpret_cast<StageT*>(smem_raw);
  auto& scales = *reinterpret_cast<typename Format::SharedScales*>(stages + kStages);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, q = lane % 4;
  const int warp_n = warp % kWarpsN, warp_m = warp / kWarpsN;
  const int token_warp = kParts == 2 ? 0 : warp_m, part = kParts == 2 ? warp_m : 0;
  const int tok0 = blockIdx.x * kTokens, row_blk = blockIdx.y * kBlockRows;
  const int super_blocks = k / 256;
  const int sb_begin = (int)((int64_t)blockIdx.z * super_blocks / gridDim.z);
  const int sb_end = (int)((int64_t)(blockIdx.z + 1) * super_blocks / gridDim.z);
  auto tile_of = [&](int sb) { return Tile{w, row_bytes, n, row_blk, sb, Format::kBlockBytes}; };
  auto fill = [&](int sb) {  // one commit group per stage, empty past the end
    if (sb < sb_end) fill_stage(stages[(sb - sb_begin) % kStages], tile_of(sb), x, k, m, tok0);
    commit_async();
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) fill(sb_begin + i);
  const LaneRows rows(warp_n, g);
  Accumulators<kC> acc = {};
  for (int sb = sb_begin; sb < sb_end; ++sb) {
    const StageT& st = stages[(sb - sb_begin) % kStages];
    const Tile tile = tile_of(sb);
    wait_async_but<kStages - 2>();  // stage of sb complete (later ones may be in flight)
    __syncthreads();                // visible to all; the stage refilled next and the scales free
    fill(sb + kStages - 1);
    Format::compute_scales(st, tile, scales);
    __syncthreads();
    Format::template add_super_block<kC, kParts>(st, tile, scales, rows,
                                                 st.x[8 * kC * token_warp + g], q, part, acc);
  }
  wait_async_all();  // only empty groups remain; the stages may be reused
  store_sums<kC, kParts>(acc, reinterpret_cast<float*>(smem_raw), warp_n, warp_m, lane, row_blk,
                         tok0, n, m, out_scales, out);
}

// The largest of every thread's `largest` in the block (any block size up to 1024).
__device__ __forceinline__ float block_largest(float largest) {
  for (int off = 16; off > 0; off /= 2)
    largest = fmaxf(largest, __shfl_xor_sync(0xFFFFFFFFu, largest, off));
  __shared__ float warp_largest[32];
  if (threadIdx.x % 32 == 0) warp_largest[threadIdx.x / 32] = largest;
  __syncthreads();
  largest = 0.0f;
  for (int i = 0; i < (int)blockDim.x / 32; ++i) largest = fmaxf(largest, warp_largest[i]);
  return largest;
}

// Four values times `up` as f16 in the stored order (0, 2, 1, 3).
__device__ __forceinline__ uint2 stored_f16(float4 v, float up) {
  const __half2 v02 = __floats2half2_rn(v.x * up, v.z * up);
  const __half2 v13 = __floats2half2_rn(v.y * up, v.w * up);
  return make_uint2(half2_bits(v02), half2_bits(v13));
}

// The register forms hold a row as kGroupsPerThread groups of four values per thread (K <= 4
// * kGroupsPerThread * blockDim.x).
constexpr int kGroupsPerThread = 8;

__device__ __forceinline__ float largest_of(float4 v) {
  return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
}

// The second half of the register forms below: the row's largest magnitude over the block,
// then its groups v (thread t holds groups t + blockDim.x i) as f16 times 2^(15 - e), and
// 2^(e - 15) as the row's output scale.
__device__ __forceinline__ void store_f16_row(const float4 (&v)[kGroupsPerThread], float largest,
                                              int groups, uint16_t* __restrict__ row_values,
                                              float* __restrict__ out_scale) {
  const int e = q4k_f16::f16_row_exponent(block_largest(largest));
  const float up = ldexpf(1.0f, 15 - e);
  uint2* dst = reinterpret_cast<uint2*>(row_values);
#pragma unroll
  for (int i = 0; i < kGroupsPerThread; ++i) {
    const int at = threadIdx.x + i * blockDim.x;
    if (at < groups) dst[at] = stored_f16(v[i], up);
  }
  if (threadIdx.x == 0) *out_scale = ldexpf(1.0f, e - 15);
}

// One block per row, held in registers: one read of the row with all its loads in flight at
// once, its largest magnitude, then its values times 2^(15 - e) in f16, and 2^(e - 15) as its
// output scale.
__global__ void rows_to_f16_kernel(const float* __restrict__ x, int k,
                                   uint16_t* __restrict__ values, float* __restrict__ out_scales) {
  const float4* src = reinterpret_cast<const float4*>(x + (size_t)blockIdx.x * k);
  const int groups = k / 4;
  float4 v[kGroupsPerThread];
  float largest = 0.0f;
#pragma unroll
  for (int i = 0; i < kGroupsPerThread; ++i) {
    const int at = threadIdx.x + i * blockDim.x;
    v[i] = at < groups ? src[at] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    largest = fmaxf(largest, largest_of(v[i]));
  }
  store_f16_row(v, largest, groups, values + (size_t)blockIdx.x * k, out_scales + blockIdx.x);
}

// The gated feed-forward's activation rows out = act(gate) * up (glu_activation.cuh, the same
// values as ops.cu's swiglu / geglu), written in f32 and as f16 rows in the same pass: one
// block per row held in registers, as rows_to_f16_kernel.
__global__ void glu_rows_to_f16_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                                       GluActivation act, int k, float* __restrict__ out,
                                       uint16_t* __restrict__ values,
                                       float* __restrict__ out_scales) {
  const size_t row = (size_t)blockIdx.x * k;
  const float4* g4 = reinterpret_cast<const float4*>(gate + row);
  const float4* u4 = reinterpret_cast<const float4*>(up + row);
  float4* o4 = reinterpret_cast<float4*>(out + row);
  const int groups = k / 4;
  float4 v[kGroupsPerThread];
  float largest = 0.0f;
#pragma unroll
  for (int i = 0; i < kGroupsPerThread; ++i) {
    const int at = threadIdx.x + i * blockDim.x;
    v[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (at >= groups) continue;
    const float4 g = g4[at], u = u4[at];
    v[i] = make_float4(glu_value(act, g.x, u.x), glu_value(act, g.y, u.y), glu_value(act, g.z, u.z),
                       glu_value(act, g.w, u.w));
    o4[at] = v[i];
    largest = fmaxf(largest, largest_of(v[i]));
  }
  store_f16_row(v, largest, groups, values + row, out_scales + blockIdx.x);
}

// The same for rows too long for the registers: two passes over the row.
__global__ void long_rows_to_f16_kernel(const float* __restrict__ x, int64_t k,
                                        uint16_t* __restrict__ values,
                                        float* __restrict__ out_scales) {
  const float4* src = reinterpret_cast<const float4*>(x + (size_t)blockIdx.x * k);
  float largest = 0.0f;
  for (int64_t i = threadIdx.x; i < k / 4; i += blockDim.x) {
    const float4 v = src[i];
    largest = fmaxf(largest, largest_of(v));
  }
  const int e = q4k_f16::f16_row_exponent(block_largest(largest));
  const float up = ldexpf(1.0f, 15 - e);
  uint2* dst = reinterpret_cast<uint2*>(values + (size_t)blockIdx.x * k);
  for (int64_t i = threadIdx.x; i < k / 4; i += blockDim.x) dst[i] = stored_f16(src[i], up);
  if (threadIdx.x == 0) out_scales[blockIdx.x] = ldexpf(1.0f, e - 15);
}

template <typename Format, int kC, int kStages, int kParts>
struct Launch {
  static constexpr auto kernel = f16_product_kernel<Format, kC, kStages, kParts>;
  static constexpr int kTokens = tokens_per_block<kC, kParts>();
  static size_t shared_bytes() {
    return kStages * sizeof(Stage<Format, kTokens>) + sizeof(typename Format::SharedScales);
  }
  // Resident blocks per multiprocessor (asked of the device once).
  static int blocks_per_sm() {
    static const int blocks = [] {
      HABLAR_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)shared_bytes()));
      int n = 0;
      HABLAR_CUDA_CHECK(
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, shared_bytes()));
      return std::max(n, 1);
    }();
    return blocks;
  }
  static dim3 grid(const WeightView& w, int m, int slices) {
    return dim3((unsigned)((m + kTokens - 1) / kTokens),
                (unsigned)((w.rows + kBlockRows - 1) / kBlockRows), (unsigned)slices);
  }
  static int slices(const WeightView& w, int m) {
    const dim3 g = grid(w, m, 1);
    return k_slices_by_cost((int64_t)g.x * g.y, (int64_t)blocks_per_sm() * device_multiprocessors(),
                            (int)(w.cols / 256), (int64_t)m * w.rows * (int64_t)sizeof(float));
  }
  static void run(const WeightView& w, const F16Rows& x, int m, int slices, float* out,
                  cudaStream_t stream) {
    blocks_per_sm();  // sets the shared-memory attribute
    kernel<<<grid(w, m, slices), kThreads, shared_bytes(), stream>>>(
        static_cast<const uint8_t*>(w.data), w.row_bytes, (int)w.rows, (int)w.cols, x.values,
        x.out_scales, m, out);
    HABLAR_CUDA_CHECK_LAUNCH();
  }
};

// The kernel for m rows of W: 16, 32 or 64 activation rows per block (kC tiles of 8 per
// warp: twice as many when the two warps of a column split each super-block, kParts = 2).
//   Q4_K: three stages at 16 and 32 (two blocks still fit a multiprocessor), two at 64 so
//   that two blocks fit, unless the lab knob HABLAR_Q4K_F16_STAGES says 3.
//   Q6_K (240-byte slots): two stages (two blocks per multiprocessor at 16 and 32, one at 64
//   either way; HABLAR_Q6K_F16_STAGES=3 measures three there).
// Lab knob HABLAR_F16_PARTS: 2 (the default: the two warps of a column split each
// super-block) or 1 (they take different activation rows).
template <typename Format, int kParts, typename Body>
auto with_format_launch(int m, const char* stages_knob, Body&& body) {
  constexpr int kUnit = kParts;  // kC of 16 activation rows per block
  constexpr int kSmallStages = std::is_same_v<Format, Q6kFormat> ? 2 : 3;
  if (m <= 16) return body(Launch<Format, kUnit, kSmallStages, kParts>{});
  if (m <= 32) return body(Launch<Format, 2 * kUnit, kSmallStages, kParts>{});
  return lab_knob(stages_knob, 2) == 3 ? body(Launch<Format, 4 * kUnit, 3, kParts>{})
                                       : body(Launch<Format, 4 * kUnit, 2, kParts>{});
}

int default_parts() {
  return lab_knob("HABLAR_F16_PARTS", 2) == 1 ? 1 : 2;
}

template <typename Body>
auto with_launch(const WeightView& w, int m, int parts, Body&& body) {
  const bool split = (parts == 0 ? default_parts() : parts) == 2;
  if (w.type == DType::Q6_K)
    return split ? with_format_launch<Q6kFormat, 2>(m, "HABLAR_Q6K_F16_STAGES", body)
                 : with_format_launch<Q6kFormat, 1>(m, "HABLAR_Q6K_F16_STAGES", body);
  return split ? with_format_launch<Q4kFormat, 2>(m, "HABLAR_Q4K_F16_STAGES", body)
               : with_format_launch<Q4kFormat, 1>(m, "HABLAR_Q4K_F16_STAGES", body);
}

int k_slices(const WeightView& w, int m, int parts) {
  return with_launch(w, m, parts, [&](auto launch) { return decltype(launch)::slices(w, m); });
}

// Threads per block for rows of k values held kGroupsPerThread groups of four to a thread
// (0: too long for the registers).
int register_row_threads(int64_t k) {
  constexpr int kMaxThreads = 1024;
  const int64_t groups = k / 4;
  if (groups > (int64_t)kGroupsPerThread * kMaxThreads) return 0;
  const int64_t threads = (groups + kGroupsPerThread - 1) / kGroupsPerThread;
  return (int)std::clamp<int64_t>((threads + 31) / 32 * 32, 64, kMaxThreads);
}

}  // namespace

size_t f16_rows_bytes(int m, int64_t k) {
  const size_t values = ((size_t)m * k * sizeof(uint16_t) + 255) / 256 * 256;
  return values + (size_t)m * sizeof(float);
}

F16Rows f16_rows_layout(void* workspace, int m, int64_t k) {
  auto* base = static_cast<uint8_t*>(workspace);
  const size_t values = ((size_t)m * k * sizeof(uint16_t) + 255) / 256 * 256;
  return {reinterpret_cast<uint16_t*>(base), reinterpret_cast<float*>(base + values)};
}

void convert_rows_to_f16(const float* x, int m, int64_t k, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream) {
  if (m < 1 || k < 4 || k % 4 != 0 || workspace_bytes < f16_rows_bytes(m, k))
    throw_error(ErrorKind::kInvalidArgument,
                "convert_rows_to_f16: needs M >= 1, K a multiple of 4 and f16_rows_bytes()");
  const F16Rows rows = f16_rows_layout(workspace, m, k);
  const int threads = register_row_threads(k);
  if (threads == 0) {
    long_rows_to_f16_kernel<<<(unsigned)m, 256, 0, stream>>>(x, k, rows.values, rows.out_scales);
  } else {
    rows_to_f16_kernel<<<(unsigned)m, threads, 0, stream>>>(x, (int)k, rows.values,
                                                            rows.out_scales);
  }
  HABLAR_CUDA_CHECK_LAUNCH();
}

void glu_rows_to_f16(const float* gate, const float* up, GluActivation act, float* out, int m,
                     int64_t k, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (m < 1 || k < 4 || k % 4 != 0 || workspace_bytes < f16_rows_bytes(m, k))
    throw_error(ErrorKind::kInvalidArgument,
                "glu_rows_to_f16: needs M >= 1, K a multiple of 4 and f16_rows_bytes()");
  const int threads = register_row_threads(k);
  if (threads == 0) {  // rows too long for the registers: the activation, then the conversion
    if (act == GluActivation::kGeluTanh) {
      geglu(gate, up, out, (int64_t)m * k, stream);
    } else {
      swiglu(gate, up, out, (int64_t)m * k, stream);
    }
    return convert_rows_to_f16(out, m, k, workspace, workspace_bytes, stream);
  }
  const F16Rows rows = f16_rows_layout(workspace, m, k);
  glu_rows_to_f16_kernel<<<(unsigned)m, threads, 0, stream>>>(gate, up, act, (int)k, out,
                                                              rows.values, rows.out_scales);
  HABLAR_CUDA_CHECK_LAUNCH();
}

bool f16_product_supported(const WeightView& w) {
  if (w.cols % 256 != 0 || w.rows <= 0 || reinterpret_cast<uintptr_t>(w.data) % 16 != 0)
    return false;
  if (w.type == DType::Q4_K) return w.row_bytes % 16 == 0;
  return w.type == DType::Q6_K && w.row_bytes % 2 == 0 &&
         w.row_bytes >= (size_t)w.cols / 256 * sizeof(BlockQ6_K);
}

int64_t f16_product_min_rows(DType type) {
  const int from = type == DType::Q6_K ? lab_knob("HABLAR_Q6K_F16_FROM", kGemvMaxRows + 1)
                                       : lab_knob("HABLAR_Q4K_F16_FROM", 16);
  return from > 0 ? from : INT64_MAX;
}

int64_t f16_product_max_rows() {
  const int upto = lab_knob("HABLAR_F16_PRODUCT_UPTO", kFusedMatmulMaxRows);
  return upto > 0 ? upto : INT64_MAX;
}

bool f16_product_preferred(const WeightView& w, int64_t m) {
  return f16_product_supported(w) && m >= f16_product_min_rows(w.type) &&
         m <= f16_product_max_rows();
}

// The scratch: the slices' parts [slices][M][N], added by sum_slices in slice order.
size_t f16_product_scratch_bytes(const WeightView& w, int m, int parts) {
  const int slices = k_slices(w, m, parts);
  return slices > 1 ? (size_t)slices * m * w.rows * sizeof(float) : 0;
}

void matmul_f16(const WeightView& w, const void* rows, int m, float* y, void* scratch,
                cudaStream_t stream, int parts) {
  if (!f16_product_supported(w) || m < 1 || parts < 0 || parts > 2)
    throw_error(ErrorKind::kInvalidArgument,
                "matmul_f16: needs Q4_K or Q6_K weights, K a multiple of 256, aligned rows, "
                "M >= 1 and parts 0..2");
  const int slices = k_slices(w, m, parts);
  if (slices > 1 && scratch == nullptr)
    throw_error(ErrorKind::kInvalidArgument, "matmul_f16: needs f16_product_scratch_bytes()");
  float* out = slices > 1 ? static_cast<float*>(scratch) : y;
  const F16Rows x = f16_rows_layout(const_cast<void*>(rows), m, w.cols);
  with_launch(w, m, parts,
              [&](auto launch) { decltype(launch)::run(w, x, m, slices, out, stream); });
  // A separate launch: adding the slices in each tile's last block, one block per tile, cost
  // 2-3x the product's time (1536 x 1536 at 128 rows: 37 against 13 us on the H200).
  if (slices > 1) sum_slices(out, slices, (int64_t)m * w.rows, y, stream);
}

}  // namespace hablar::cuda
