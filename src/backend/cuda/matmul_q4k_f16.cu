// Q4_K x f16 activations for many rows on f16 tensor cores (mma.sync m16n8k16, f32
// accumulation). Weight value q (0..15) of sub-block s becomes d*scale_s*q - dmin*min_s in
// f16 inside the A fragments (q4k_f16_fragments.cuh says which values a lane holds), so the
// tensor cores do all of a sub-block's arithmetic and the sums stay in f32 registers until
// the end; the int8 kernel (matmul_q4k_mma.cu) instead converts and scales every sub-block's
// integer result on the CUDA cores, which costs more than its tensor-core work.
//
// Block: 8 warps, 4 along the weight rows (32 rows each: two 16-row tiles) and 2 along the
// activation rows (8*kC each), so a block covers 128 weight rows x 16*kC activation rows.
// The block walks the super-blocks of K (or of its slice of K, grid z) in step: the raw
// Q4_K bytes of its 128 rows and the f16 activations of its rows are copied into shared
// memory by a three-stage cp.async pipeline while the stage before is multiplied. Per
// sub-block pair a lane loads two nibble words per weight row, dequantizes them with one
// lop3, one subtraction and one fused multiply-add per f16 pair, and reuses each A fragment
// for all its kC activation tiles; each B fragment (one 8-byte shared load) serves both
// weight tiles.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/lab_knobs.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/matmul_q4k_f16.h"
#include "backend/cuda/q4k_f16_fragments.cuh"
#include "backend/cuda/split_k.cuh"
#include "core/quant_blocks.h"

namespace hablar::cuda {
namespace {

using q4k_f16::nibble_pairs;
using q4k_f16::NibblePairs;

constexpr int kWarpsN = 4, kWarpsM = 2, kThreads = 32 * kWarpsN * kWarpsM;
constexpr int kBlockRows = 32 * kWarpsN;  // weight rows per block
constexpr int kBlockBytes = sizeof(BlockQ4_K);
static_assert(kBlockBytes == 144, "Q4_K super-block layout");
// Bytes per staged activation row: 256 f16 values plus 32, so that the 8-byte B loads of a
// half warp (4 rows x 32 bytes) fall in different banks.
constexpr int kRowStride = 256 * 2 + 32;

// Independent accumulator sets: with few activation tiles per warp the tensor cores' chain
// of dependent multiply-adds on one accumulator would stall the warp, so the two value
// halves of a sub-block add into separate sets (summed at the end).
template <int kC>
constexpr int accumulator_sets() {
  return kC <= 2 ? 2 : 1;
}

template <int kC>
constexpr int tokens_per_block() {
  return kWarpsM * 8 * kC;
}

template <int kC>
struct Stage {
  uint8_t w[kBlockRows][kBlockBytes];
  uint8_t x[tokens_per_block<kC>()][kRowStride];
};

__device__ __forceinline__ __half2 as_half2(uint32_t bits) {
  __half2 h;
  memcpy(&h, &bits, sizeof h);
  return h;
}

__device__ __forceinline__ uint32_t half2_bits(__half2 h) {
  uint32_t bits;
  memcpy(&bits, &h, sizeof bits);
  return bits;
}

__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// (1024 + n0, 1024 + n1) -> (n0 * scale - min, n1 * scale - min), one rounding each.
__device__ __forceinline__ uint32_t dequantize_pair(uint32_t magic_pair, __half2 scale,
                                                    __half2 neg_min) {
  const __half2 k1024 = as_half2(q4k_f16::kMagicPair);
  return half2_bits(__hfma2(__hsub2(as_half2(magic_pair), k1024), scale, neg_min));
}

// All threads copy super-block sb of the block's weight rows (rows past N repeat the last)
// and of its activation rows (rows past M repeat the last) into the stage.
template <int kC>
__device__ __forceinline__ void fill_stage(Stage<kC>& st, const uint8_t* w, size_t row_bytes, int n,
                                           int row_blk, const uint16_t* x, int k, int m, int tok0,
                                           int sb) {
  constexpr int kWeightPieces = kBlockBytes / 16;  // 9
  for (int i = threadIdx.x; i < kBlockRows * kWeightPieces; i += kThreads) {
    const int r = i / kWeightPieces, piece = i % kWeightPieces;
    const uint8_t* src =
        w + (size_t)min(row_blk + r, n - 1) * row_bytes + (size_t)sb * kBlockBytes + 16 * piece;
    copy16_async(&st.w[r][16 * piece], src);
  }
  constexpr int kRowPieces = 256 * 2 / 16;  // 32
  for (int i = threadIdx.x; i < tokens_per_block<kC>() * kRowPieces; i += kThreads) {
    const int t = i / kRowPieces, piece = i % kRowPieces;
    const uint16_t* src = x + (size_t)min(tok0 + t, m - 1) * k + (size_t)sb * 256 + 8 * piece;
    copy16_async(&st.x[t][16 * piece], src);
  }
}

// The (scale, -min) of each sub-block of the block's weight rows for the staged
// super-block, each as an f16 pair holding it twice (the form the fused multiply-add takes):
// made once per super-block by the whole block, 4 per thread, instead of by each of the
// eight lanes that use one. Rows padded to 9 entries so that the 8-byte loads of a half warp
// (4 rows) fall in different banks.
struct ScalePair {
  uint32_t scale, neg_min;
};
struct SharedScales {
  ScalePair at[kBlockRows][9];
};

template <typename Stage>
__device__ __forceinline__ void compute_scales(const Stage& st, SharedScales& scales) {
  const __half2 k1024 = as_half2(q4k_f16::kMagicPair);
  for (int i = threadIdx.x; i < kBlockRows * 8; i += kThreads) {
    const int r = i / 8, s = i % 8;
    const uint4 head = *reinterpret_cast<const uint4*>(st.w[r]);
    const __half2 d_neg_dmin = as_half2(head.x ^ 0x80000000u);  // (d, -dmin)
    const uint32_t pair = q4k_f16::scale_min_pair(head.y, head.z, head.w, s);
    const __half2 scaled = __hmul2(__hsub2(as_half2(pair), k1024), d_neg_dmin);
    scales.at[r][s] = {half2_bits(__low2half2(scaled)), half2_bits(__high2half2(scaled))};
  }
}

// The warp's 32 weight rows times its 8*kC activation rows over one staged super-block.
template <int kC, typename Stage>
__device__ __forceinline__ void add_super_block(const Stage& st, const SharedScales& scales,
                                                int warp_n, int warp_m, int g, int q,
                                                float (&acc)[accumulator_sets<kC>()][2][kC][4]) {
  const uint8_t* rows[2][2];  // [tile][row g, row g + 8]
  int row_index[2][2];
#pragma unroll
  for (int rt = 0; rt < 2; ++rt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      row_index[rt][hr] = 32 * warp_n + 16 * rt + 8 * hr + g;
      rows[rt][hr] = st.w[row_index[rt][hr]];
    }
  const uint8_t* x_rows = st.x[8 * kC * warp_m + g];
#pragma unroll
  for (int j = 0; j < 4; ++j) {  // sub-block pair: 32 bytes of nibbles
    uint32_t words[2][2][2];     // [tile][row][value half h]
#pragma unroll
    for (int rt = 0; rt < 2; ++rt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          words[rt][hr][h] =
              *reinterpret_cast<const uint32_t*>(rows[rt][hr] + 16 + 32 * j + 16 * h + 4 * q);
#pragma unroll
    for (int odd = 0; odd < 2; ++odd) {
      const int s = 2 * j + odd;
      ScalePair scale[2][2];
#pragma unroll
      for (int rt = 0; rt < 2; ++rt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) scale[rt][hr] = scales.at[row_index[rt][hr]][s];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t a[2][4];
#pragma unroll
        for (int rt = 0; rt < 2; ++rt)
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            const NibblePairs p = nibble_pairs(words[rt][hr][h], odd);
            const __half2 step = as_half2(scale[rt][hr].scale);
            const __half2 neg_min = as_half2(scale[rt][hr].neg_min);
            a[rt][hr] = dequantize_pair(p.v02, step, neg_min);
            a[rt][2 + hr] = dequantize_pair(p.v13, step, neg_min);
          }
#pragma unroll
        for (int ct = 0; ct < kC; ++ct) {
          const uint2 b = *reinterpret_cast<const uint2*>(x_rows + 8 * ct * kRowStride +
                                                          2 * (32 * s + 16 * h + 4 * q));
#pragma unroll
          for (int rt = 0; rt < 2; ++rt)
            mma_f16(acc[h % accumulator_sets<kC>()][rt][ct], a[rt], b.x, b.y);
        }
      }
    }
  }
}

// Grid: (ceil(M / (16 * kC)), ceil(N / 128), slices). With one slice the sums go to
// y [M][N]; with several to part [slice][M][N] (added by sum_slices). Shared memory:
// kStages stages, then the scales of the super-block being multiplied.
template <int kC, int kStages>
__global__ void __launch_bounds__(kThreads, 2)
    q4k_f16_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int n, int k,
                   const uint16_t* __restrict__ x, const float* __restrict__ out_scales, int m,
                   float* __restrict__ out) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  Stage<kC>* stages = reinterpret_cast<Stage<kC>*>(smem_raw);
  SharedScales& scales = *reinterpret_cast<SharedScales*>(stages + kStages);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, q = lane % 4;
  const int warp_n = warp % kWarpsN, warp_m = warp / kWarpsN;
  const int tok0 = blockIdx.x * tokens_per_block<kC>(), row_blk = blockIdx.y * kBlockRows;
  const int super_blocks = k / 256;
  const int sb_begin = (int)((int64_t)blockIdx.z * super_blocks / gridDim.z);
  const int sb_end = (int)((int64_t)(blockIdx.z + 1) * super_blocks / gridDim.z);
  auto fill = [&](int sb) {  // one commit group per stage, empty past the end
    if (sb < sb_end)
      fill_stage<kC>(stages[(sb - sb_begin) % kStages], w, row_bytes, n, row_blk, x, k, m, tok0,
                     sb);
    commit_async();
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) fill(sb_begin + i);
  float acc[accumulator_sets<kC>()][2][kC][4] = {};
  for (int sb = sb_begin; sb < sb_end; ++sb) {
    const Stage<kC>& st = stages[(sb - sb_begin) % kStages];
    wait_async_but<kStages - 2>();  // stage of sb complete (later ones may be in flight)
    __syncthreads();                // visible to all; the stage refilled next and the scales free
    fill(sb + kStages - 1);
    compute_scales(st, scales);
    __syncthreads();
    add_super_block<kC>(st, scales, warp_n, warp_m, g, q, acc);
  }
  float* dst = out + (size_t)blockIdx.z * m * n;
#pragma unroll
  for (int rt = 0; rt < 2; ++rt)
#pragma unroll
    for (int ct = 0; ct < kC; ++ct)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = row_blk + 32 * warp_n + 16 * rt + g + (i >= 2 ? 8 : 0);
        const int tok = tok0 + 8 * kC * warp_m + 8 * ct + 2 * q + (i & 1);
        float sum = acc[0][rt][ct][i];
        if constexpr (accumulator_sets<kC>() > 1) sum += acc[1][rt][ct][i];
        if (row < n && tok < m) dst[(size_t)tok * n + row] = sum * out_scales[tok];
      }
}

// One block per row: the row's largest magnitude, then its values times 2^(15 - e) in f16
// (each group of four in the order 0, 2, 1, 3), and 2^(e - 15) as the row's output scale.
__global__ void rows_to_f16_kernel(const float* __restrict__ x, int64_t k,
                                   uint16_t* __restrict__ values, float* __restrict__ out_scales) {
  const float* row = x + (size_t)blockIdx.x * k;
  float largest = 0.0f;
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) largest = fmaxf(largest, fabsf(row[i]));
  for (int off = 16; off > 0; off /= 2)
    largest = fmaxf(largest, __shfl_xor_sync(0xFFFFFFFFu, largest, off));
  __shared__ float warp_largest[32];
  if (threadIdx.x % 32 == 0) warp_largest[threadIdx.x / 32] = largest;
  __syncthreads();
  largest = 0.0f;
  for (int i = 0; i < (int)blockDim.x / 32; ++i) largest = fmaxf(largest, warp_largest[i]);
  int e = 15;  // rows of zeros and rows with inf or nan keep their values (scale 1)
  if (largest > 0.0f && isfinite(largest)) frexpf(largest, &e);  // largest < 2^e
  const float up = ldexpf(1.0f, 15 - e);
  uint2* dst = reinterpret_cast<uint2*>(values + (size_t)blockIdx.x * k);
  const float4* src = reinterpret_cast<const float4*>(row);
  for (int64_t i = threadIdx.x; i < k / 4; i += blockDim.x) {
    const float4 v = src[i];
    const __half2 v02 = __floats2half2_rn(v.x * up, v.z * up);
    const __half2 v13 = __floats2half2_rn(v.y * up, v.w * up);
    dst[i] = make_uint2(half2_bits(v02), half2_bits(v13));
  }
  if (threadIdx.x == 0) out_scales[blockIdx.x] = ldexpf(1.0f, e - 15);
}

int tile_tokens(int m) {
  return m <= 16 ? 1 : (m <= 32 ? 2 : 4);
}

template <int kC, int kStages>
struct Launch {
  static constexpr auto kernel = q4k_f16_kernel<kC, kStages>;
  static size_t shared_bytes() { return kStages * sizeof(Stage<kC>) + sizeof(SharedScales); }
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
    return dim3((unsigned)((m + tokens_per_block<kC>() - 1) / tokens_per_block<kC>()),
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

// The kernel for m rows: 16, 32 or 64 activation rows per block; at 64 two stages (two
// blocks fit a multiprocessor) unless the lab knob HABLAR_Q4K_F16_STAGES says 3.
template <typename Body>
auto with_launch(int m, Body&& body) {
  switch (tile_tokens(m)) {
    case 1:
      return body(Launch<1, 3>{});
    case 2:
      return body(Launch<2, 3>{});
    default:
      return lab_knob("HABLAR_Q4K_F16_STAGES", 2) == 3 ? body(Launch<4, 3>{})
                                                       : body(Launch<4, 2>{});
  }
}

int k_slices(const WeightView& w, int m) {
  return with_launch(m, [&](auto launch) { return decltype(launch)::slices(w, m); });
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
  rows_to_f16_kernel<<<(unsigned)m, 256, 0, stream>>>(x, k, rows.values, rows.out_scales);
  HABLAR_CUDA_CHECK_LAUNCH();
}

bool q4k_f16_supported(const WeightView& w) {
  return w.type == DType::Q4_K && w.cols % 256 == 0 && w.rows > 0 &&
         reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && w.row_bytes % 16 == 0;
}

int64_t q4k_f16_min_rows() {
  const int from = lab_knob("HABLAR_Q4K_F16_FROM", 32);
  return from > 0 ? from : INT64_MAX;
}

int64_t q4k_f16_max_rows() {
  const int upto = lab_knob("HABLAR_Q4K_F16_UPTO", kFusedMatmulMaxRows);
  return upto > 0 ? upto : INT64_MAX;
}

bool q4k_f16_preferred(const WeightView& w, int64_t m) {
  return q4k_f16_supported(w) && m >= q4k_f16_min_rows() && m <= q4k_f16_max_rows();
}

size_t q4k_f16_scratch_bytes(const WeightView& w, int m) {
  const int slices = k_slices(w, m);
  return slices > 1 ? (size_t)slices * m * w.rows * sizeof(float) : 0;
}

void matmul_q4k_f16(const WeightView& w, const void* rows, int m, float* y, void* scratch,
                    cudaStream_t stream) {
  if (!q4k_f16_supported(w) || m < 1)
    throw_error(ErrorKind::kInvalidArgument,
                "matmul_q4k_f16: needs Q4_K weights, K a multiple of 256, aligned rows and M >= 1");
  const int slices = k_slices(w, m);
  if (slices > 1 && scratch == nullptr)
    throw_error(ErrorKind::kInvalidArgument, "matmul_q4k_f16: needs q4k_f16_scratch_bytes()");
  float* out = slices > 1 ? static_cast<float*>(scratch) : y;
  const F16Rows x = f16_rows_layout(const_cast<void*>(rows), m, w.cols);
  with_launch(m, [&](auto launch) { decltype(launch)::run(w, x, m, slices, out, stream); });
  if (slices > 1) sum_slices(out, slices, (int64_t)m * w.rows, y, stream);
}

}  // namespace hablar::cuda
