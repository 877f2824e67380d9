// Q4_K x int8 activations for a batch of M = 4 .. 256 rows of activations (batched decode):
// integer tensor cores (mma.sync m16n8k32, s8 x s8 -> s32), one instruction per sub-block of
// 32 weights for 16 weight rows x 8 activation rows.
//
// Per sub-block s of a weight row r (32 values q in 0..15, scale d*sc, offset dmin*m) and an
// activation row t (32 int8 codes c, block scale dx, and sx = dx * sum of the codes):
//   sum_i (d*sc*q_i - dmin*m) * dx*c_i = (d*sc) * dx * (q . c) - (dmin*m) * sx
// so the tensor cores give (q . c) for 16 x 8 (r, t) pairs at once and each thread then adds
// its four results into f32 sums with two multiply-adds each.
//
// Fragments (PTX m16n8k32 with 8-bit operands; g = lane / 4, q = lane % 4):
//   A (16 weight rows x 32 values): a0 row g, values 4q..4q+3; a1 row g+8, same values;
//      a2 row g, values 16+4q..; a3 row g+8, values 16+4q..
//   B (32 values x 8 activation rows): b0 values 4q..4q+3 of row g; b1 values 16+4q.. of row g
//   C (16 x 8): c0, c1 weight row g, activation rows 2q, 2q+1; c2, c3 weight row g+8.
// A Q4_K super-block stores sub-blocks 2j and 2j+1 in the low and high nibbles of the same
// 32 bytes, so one 32-bit load feeds both: (word >> 4h) & 0x0F0F0F0F for sub-block 2j+h.
//
// Block: kWarps warps over 16 * kWarps weight rows (a 16-row tile each) and T = 8*kNT
// activation rows, all on the same super-blocks in step: the weights and activations of the
// super-blocks ahead are copied into shared memory (cp.async, three stages) while the
// current one is multiplied, so each activation byte is read from memory once per block and
// every weight byte once per T activation rows. Where that gives too few blocks to fill the GPU, K
// is split into slices (grid z) whose partial sums are added afterwards in slice order
// (deterministic).
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/matmul_q4k_mma.h"
#include "backend/cuda/split_k.cuh"
#include "core/quant_blocks.h"

namespace hablar::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kBlockBytes = sizeof(BlockQ4_K);  // 144: d, dmin, 12 scale bytes, 128 nibbles
static_assert(kBlockBytes == 144, "Q4_K super-block layout");

__device__ __forceinline__ void mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// Byte i (0..11) of a super-block's scale bytes, held in head.y, head.z, head.w.
__device__ __forceinline__ uint32_t scale_byte(const uint4& head, int i) {
  const uint32_t word = i < 4 ? head.y : (i < 8 ? head.z : head.w);
  return (word >> (8 * (i & 3))) & 0xFFu;
}

// (d, dmin) of a super-block.
__device__ __forceinline__ float2 super_block_scales(const uint4& head) {
  return make_float2(__half2float(__ushort_as_half((unsigned short)(head.x & 0xFFFFu))),
                     __half2float(__ushort_as_half((unsigned short)(head.x >> 16))));
}

// (d * scale, dmin * min) of sub-block s (0..7): 6-bit values packed as in Q4_K.
__device__ __forceinline__ float2 sub_block_scale(const uint4& head, float2 dd, int s) {
  uint32_t sc, mn;
  if (s < 4) {
    sc = scale_byte(head, s) & 63u;
    mn = scale_byte(head, s + 4) & 63u;
  } else {
    sc = (scale_byte(head, s + 4) & 0xFu) | ((scale_byte(head, s - 4) >> 6) << 4);
    mn = (scale_byte(head, s + 4) >> 4) | ((scale_byte(head, s) >> 6) << 4);
  }
  return make_float2(dd.x * (float)sc, dd.y * (float)mn);
}

struct SuperBlockRows {  // what a thread needs of one super-block for weight rows g and g+8
  uint4 head[2];
  uint32_t lo[2][4], hi[2][4];  // [row][chunk j]: nibble words at 4q and 16+4q of chunk j
};

// Loads them from a super-block staged in shared memory (rows 144 bytes apart, so the eight
// rows of a fragment fall in different banks).
__device__ __forceinline__ void load_staged_super_block(const uint8_t* row_g, const uint8_t* row_g8,
                                                        int q, SuperBlockRows& out) {
  const uint8_t* rows[2] = {row_g, row_g8};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    out.head[r] = *reinterpret_cast<const uint4*>(rows[r]);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint8_t* nibbles = rows[r] + 16 + 32 * j;
      out.lo[r][j] = *reinterpret_cast<const uint32_t*>(nibbles + 4 * q);
      out.hi[r][j] = *reinterpret_cast<const uint32_t*>(nibbles + 16 + 4 * q);
    }
  }
}

// The block's activation tile for one super-block, staged in shared memory: codes of its
// T = 8*kNT activation rows (256 each, rows padded to 272 bytes so that the eight rows a
// B fragment reads fall in different banks) and their eight (scale, scale * sum) pairs.
constexpr int kCodeStride = 256 + 16;
template <int kNT>
struct XTile {
  int8_t codes[8 * kNT][kCodeStride];
  float2 scales[8 * kNT][8];
};

// All threads of the block copy super-block sb of activation rows tok0 .. tok0 + T - 1 (rows
// past M repeat the last one) into the tile.
template <int kNT>
__device__ __forceinline__ void stage_x(XTile<kNT>& tile, const int8_t* codes, const float2* scales,
                                        int k, int m, int tok0, int sb) {
  constexpr int kT = 8 * kNT;
  for (int i = threadIdx.x; i < kT * 16; i += blockDim.x) {  // 16 pieces of 16 bytes per row
    const int t = i / 16, piece = i % 16;
    const int8_t* src = codes + (size_t)min(tok0 + t, m - 1) * k + (size_t)sb * 256 + 16 * piece;
    copy16_async(&tile.codes[t][16 * piece], src);
  }
  for (int i = threadIdx.x; i < kT * 4; i += blockDim.x) {  // 4 pieces (2 pairs) per row
    const int t = i / 4, piece = i % 4;
    const float2* src =
        scales + (size_t)min(tok0 + t, m - 1) * (k / 32) + (size_t)sb * 8 + 2 * piece;
    copy16_async(&tile.scales[t][2 * piece], src);
  }
}

// This warp's 16 weight rows times the tile's activation rows, for the eight sub-blocks of
// one super-block.
template <int kNT>
__device__ __forceinline__ void add_super_block(const SuperBlockRows& w, const XTile<kNT>& tile,
                                                int g, int q, float (&acc)[kNT][4]) {
  const float2 dd_g = super_block_scales(w.head[0]), dd_g8 = super_block_scales(w.head[1]);
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    const int j = s / 2, shift = 4 * (s % 2);
    const uint32_t a0 = (w.lo[0][j] >> shift) & 0x0F0F0F0Fu;
    const uint32_t a1 = (w.lo[1][j] >> shift) & 0x0F0F0F0Fu;
    const uint32_t a2 = (w.hi[0][j] >> shift) & 0x0F0F0F0Fu;
    const uint32_t a3 = (w.hi[1][j] >> shift) & 0x0F0F0F0Fu;
    const float2 sg = sub_block_scale(w.head[0], dd_g, s);
    const float2 sg8 = sub_block_scale(w.head[1], dd_g8, s);
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int8_t* row = tile.codes[nt * 8 + g] + 32 * s;
      const uint32_t b0 = *reinterpret_cast<const uint32_t*>(row + 4 * q);
      const uint32_t b1 = *reinterpret_cast<const uint32_t*>(row + 16 + 4 * q);
      int c[4] = {0, 0, 0, 0};
      mma_s8(c, a0, a1, a2, a3, b0, b1);
      const float2 x0 = tile.scales[nt * 8 + 2 * q][s];
      const float2 x1 = tile.scales[nt * 8 + 2 * q + 1][s];
      acc[nt][0] += sg.x * x0.x * (float)c[0] - sg.y * x0.y;
      acc[nt][1] += sg.x * x1.x * (float)c[1] - sg.y * x1.y;
      acc[nt][2] += sg8.x * x0.x * (float)c[2] - sg8.y * x0.y;
      acc[nt][3] += sg8.x * x1.x * (float)c[3] - sg8.y * x1.y;
    }
  }
}

// One pipeline stage of the multi-stage kernel: the block's 128 weight rows of one
// super-block and its activation tile.
template <int kNT>
struct Stage {
  uint8_t w[16 * kWarps][kBlockBytes];
  XTile<kNT> x;
};
constexpr int kStages = 3;

// All threads copy super-block sb of weight rows row_blk .. row_blk + 127 (rows past N
// repeat the last one) into the stage.
template <int kNT>
__device__ __forceinline__ void stage_weights(Stage<kNT>& st, const uint8_t* w, size_t row_bytes,
                                              int n, int row_blk, int sb) {
  constexpr int kPieces = kBlockBytes / 16;  // 9
  for (int i = threadIdx.x; i < 16 * kWarps * kPieces; i += blockDim.x) {
    const int r = i / kPieces, piece = i % kPieces;
    const uint8_t* src =
        w + (size_t)min(row_blk + r, n - 1) * row_bytes + (size_t)sb * kBlockBytes + 16 * piece;
    copy16_async(&st.w[r][16 * piece], src);
  }
}

// Grid: (ceil(N / (16 * kWarps)), ceil(M / T), slices). Block: kWarps warps, warp w on weight
// rows row_blk + 16w .. + 15 and all T activation rows, all warps on the same super-blocks
// (those of slice blockIdx.z), both operands staged in shared memory through a kStages-deep
// cp.async pipeline (dynamic shared memory: kStages * sizeof(Stage<kNT>)). With one slice
// the sums go to y [M][N]; with several, to part [slice][M][N] (summed by
// sum_slices_kernel). kMinBlocks: blocks per multiprocessor the registers must allow.
template <int kNT, int kMinBlocks>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    q4k_mma_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int n, int k,
                   const int8_t* __restrict__ codes, const float2* __restrict__ scales, int m,
                   float* __restrict__ out) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  Stage<kNT>* stages = reinterpret_cast<Stage<kNT>*>(smem_raw);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, q = lane % 4;
  const int row_blk = blockIdx.x * 16 * kWarps, row0 = row_blk + 16 * warp;
  const int tok0 = blockIdx.y * 8 * kNT;
  const int super_blocks = k / 256;
  const int sb_begin = (int)((int64_t)blockIdx.z * super_blocks / gridDim.z);
  const int sb_end = (int)((int64_t)(blockIdx.z + 1) * super_blocks / gridDim.z);
  auto fill = [&](int sb) {  // one commit group per stage, empty past the end
    if (sb < sb_end) {
      Stage<kNT>& st = stages[(sb - sb_begin) % kStages];
      stage_weights<kNT>(st, w, row_bytes, n, row_blk, sb);
      stage_x<kNT>(st.x, codes, scales, k, m, tok0, sb);
    }
    commit_async();
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) fill(sb_begin + i);
  float acc[kNT][4] = {};
  for (int sb = sb_begin; sb < sb_end; ++sb) {
    wait_async_but<kStages - 2>();  // stage of sb complete (later ones may be in flight)
    __syncthreads();                // visible to all; the stage refilled next is free
    fill(sb + kStages - 1);
    const Stage<kNT>& st = stages[(sb - sb_begin) % kStages];
    SuperBlockRows wr;
    load_staged_super_block(st.w[16 * warp + g], st.w[16 * warp + g + 8], q, wr);
    add_super_block<kNT>(wr, st.x, g, q, acc);
  }
  float* dst = out + (size_t)blockIdx.z * m * n;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = row0 + g + (i >= 2 ? 8 : 0);
      const int tok = tok0 + nt * 8 + 2 * q + (i & 1);
      if (row < n && tok < m) dst[(size_t)tok * n + row] = acc[nt][i];
    }
}

int tokens_per_block(int m) {
  return m <= 8 ? 8 : (m <= 16 ? 16 : 32);
}

// K slices: the count (1 .. 16, at most one per super-block) whose blocks fill whole waves
// of two blocks per multiprocessor best.
int k_slices(const WeightView& w, int m) {
  const int64_t blocks = (w.rows + 16 * kWarps - 1) / (16 * kWarps) *
                         ((m + tokens_per_block(m) - 1) / tokens_per_block(m));
  return choose_k_slices(blocks, 2 * (int64_t)device_multiprocessors(),
                         (int)std::min<int64_t>(16, w.cols / 256));
}

template <int kNT>
void launch(const WeightView& w, const int8_t* codes, const float2* scales, int m, int slices,
            float* out, cudaStream_t stream) {
  const dim3 grid((unsigned)((w.rows + 16 * kWarps - 1) / (16 * kWarps)),
                  (unsigned)((m + 8 * kNT - 1) / (8 * kNT)), (unsigned)slices);
  const size_t bytes = kStages * sizeof(Stage<kNT>);
  static const bool configured = [bytes] {
    HABLAR_CUDA_CHECK(cudaFuncSetAttribute(
        q4k_mma_kernel<kNT, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return true;
  }();
  (void)configured;
  q4k_mma_kernel<kNT, 2><<<grid, kWarps * 32, bytes, stream>>>(static_cast<const uint8_t*>(w.data),
                                                               w.row_bytes, (int)w.rows,
                                                               (int)w.cols, codes, scales, m, out);
  HABLAR_CUDA_CHECK_LAUNCH();
}

}  // namespace

__global__ void sum_slices_kernel(const float* __restrict__ part, int slices, int64_t count,
                                  float* __restrict__ y) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  float sum = 0.0f;
  for (int s = 0; s < slices; ++s) sum += part[(size_t)s * count + i];
  y[i] = sum;
}

bool q4k_mma_supported(const WeightView& w) {
  return w.type == DType::Q4_K && w.cols % 256 == 0 && w.rows > 0 &&
         reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && w.row_bytes % 16 == 0;
}

size_t q4k_mma_scratch_bytes(const WeightView& w, int m) {
  const int slices = k_slices(w, m);
  return slices > 1 ? (size_t)slices * m * w.rows * sizeof(float) : 0;
}

void matmul_q4k_mma(const WeightView& w, const int8_t* codes, const float2* scales, int m, float* y,
                    void* scratch, cudaStream_t stream) {
  if (!q4k_mma_supported(w) || m < 1 || m > 256)
    throw_error(ErrorKind::kInvalidArgument,
                "matmul_q4k_mma: needs Q4_K weights, K a multiple of 256, aligned rows and "
                "M in 1..256");
  const int slices = k_slices(w, m);
  float* out = slices > 1 ? static_cast<float*>(scratch) : y;
  if (slices > 1 && scratch == nullptr)
    throw_error(ErrorKind::kInvalidArgument, "matmul_q4k_mma: needs q4k_mma_scratch_bytes()");
  switch (tokens_per_block(m)) {
    case 8:
      launch<1>(w, codes, scales, m, slices, out, stream);
      break;
    case 16:
      launch<2>(w, codes, scales, m, slices, out, stream);
      break;
    default:
      launch<4>(w, codes, scales, m, slices, out, stream);
  }
  if (slices > 1) {
    sum_slices(out, slices, (int64_t)m * w.rows, y, stream);
  }
}

}  // namespace hablar::cuda
