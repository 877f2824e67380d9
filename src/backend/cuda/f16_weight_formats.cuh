// The weight formats of the f16 tensor-core product (matmul_f16.cu) as traits: how a block
// stages the bytes of one super-block of its 128 weight rows, makes their scales once in
// shared memory, and turns them into f16 A fragments for mma.sync m16n8k16 against the staged
// f16 activation rows. The kernel, its pipeline and its epilogue are written once, in
// matmul_f16.cu.
//
// A block is 8 warps: 4 along the weight rows (32 rows each: two 16-row tiles, rt) times 2
// (warp_m), which either take different activation rows (8 * kC each: kC tiles of 8, ct) or
// the same activation rows and different halves of each super-block (kParts = 2: each weight
// is dequantized once per block instead of twice; the halves' sums meet in shared memory at
// the end). Lane (g = lane / 4, q = lane % 4) holds rows g and g + 8 of each weight tile (hr)
// and activation row g of each activation tile.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/q4k_f16_fragments.cuh"
#include "backend/cuda/q6k_f16_fragments.cuh"
#include "backend/cuda/q6k_unit.cuh"
#include "core/quant_blocks.h"

namespace hablar::cuda::f16_product {

constexpr int kWarpsN = 4, kWarpsM = 2, kThreads = 32 * kWarpsN * kWarpsM;
constexpr int kBlockRows = 32 * kWarpsN;  // weight rows per block
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
using Accumulators = float[accumulator_sets<kC>()][2][kC][4];

template <int kC, int kParts>
constexpr int tokens_per_block() {
  return kWarpsM / kParts * 8 * kC;
}

// One pipeline stage: the staged bytes of a super-block of each weight row, and the f16
// values of that super-block for each of kTokens activation rows.
template <typename Format, int kTokens>
struct Stage {
  uint8_t w[kBlockRows][Format::kSlotBytes];
  uint8_t x[kTokens][kRowStride];
};

// Which super-block of which rows a stage holds: rows row_blk .. row_blk + 127 (those past n
// repeat the last) of W (16-byte aligned, ending at w + n * row_bytes), super-block sb.
struct Tile {
  const uint8_t* w;
  size_t row_bytes;
  int n, row_blk, sb, block_bytes;
  __device__ __forceinline__ const uint8_t* source(int r) const {
    return w + (size_t)min(row_blk + r, n - 1) * row_bytes + (size_t)sb * block_bytes;
  }
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

// The rows of a lane's A fragments: [tile rt][row g, row g + 8] of the warp's 32 weight rows.
struct LaneRows {
  int index[2][2];
  __device__ __forceinline__ LaneRows(int warp_n, int g) {
#pragma unroll
    for (int rt = 0; rt < 2; ++rt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) index[rt][hr] = 32 * warp_n + 16 * rt + 8 * hr + g;
  }
};

// Multiplies the A fragments of 16 values (a[rt]) with the kC activation tiles of the lane
// (B: one 8-byte load at stored value `value` of its rows), into accumulator set `set`.
template <int kC>
__device__ __forceinline__ void multiply_tiles(const uint32_t (&a)[2][4], const uint8_t* x_rows,
                                               int value, int set, Accumulators<kC>& acc) {
#pragma unroll
  for (int ct = 0; ct < kC; ++ct) {
    const uint2 b = *reinterpret_cast<const uint2*>(x_rows + 8 * ct * kRowStride + 2 * value);
#pragma unroll
    for (int rt = 0; rt < 2; ++rt) mma_f16(acc[set][rt][ct], a[rt], b.x, b.y);
  }
}

// Q4_K: 144-byte super-blocks (rows 16-byte aligned, staged as they are); eight 32-value
// sub-blocks with six-bit scale and min. Weight value n (0..15) of sub-block s becomes
// d*scale_s*n - dmin*min_s in f16: one lop3, one subtraction and one fused multiply-add per
// f16 pair, with the (scale, -min) pairs made once per super-block by the block.
struct Q4kFormat {
  static constexpr int kBlockBytes = 144;
  static constexpr int kSlotBytes = 144;
  static_assert(sizeof(BlockQ4_K) == kBlockBytes, "Q4_K super-block layout");

  // Each an f16 pair holding the value twice (the form the fused multiply-add takes); rows
  // padded to 9 entries so that the 8-byte loads of a half warp (4 rows) fall in different
  // banks.
  struct ScalePair {
    uint32_t scale, neg_min;
  };
  struct SharedScales {
    ScalePair at[kBlockRows][9];
  };

  template <typename StageT>
  __device__ static void fill_weights(StageT& st, const Tile& tile) {
    constexpr int kPieces = kBlockBytes / 16;  // 9
    for (int i = threadIdx.x; i < kBlockRows * kPieces; i += kThreads) {
      const int r = i / kPieces, piece = i % kPieces;
      copy16_async(&st.w[r][16 * piece], tile.source(r) + 16 * piece);
    }
  }

  template <typename StageT>
  __device__ static void compute_scales(const StageT& st, const Tile&, SharedScales& scales) {
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

  // The warp's 32 weight rows times its 8 * kC activation rows over part `part` of kParts of
  // one staged super-block: per sub-block pair a lane loads two nibble words per row and
  // reuses each A fragment for all its kC activation tiles.
  template <int kC, int kParts, typename StageT>
  __device__ static void add_super_block(const StageT& st, const Tile&, const SharedScales& scales,
                                         const LaneRows& rows, const uint8_t* x_rows, int q,
                                         int part, Accumulators<kC>& acc) {
    const __half2 k1024 = as_half2(q4k_f16::kMagicPair);
#pragma unroll
    for (int jj = 0; jj < 4 / kParts; ++jj) {  // sub-block pair: 32 bytes of nibbles
      const int j = part * (4 / kParts) + jj;
      uint32_t words[2][2][2];  // [tile][row][value half h]
#pragma unroll
      for (int rt = 0; rt < 2; ++rt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            words[rt][hr][h] = *reinterpret_cast<const uint32_t*>(st.w[rows.index[rt][hr]] + 16 +
                                                                  32 * j + 16 * h + 4 * q);
#pragma unroll
      for (int odd = 0; odd < 2; ++odd) {
        const int s = 2 * j + odd;
        ScalePair scale[2][2];
#pragma unroll
        for (int rt = 0; rt < 2; ++rt)
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) scale[rt][hr] = scales.at[rows.index[rt][hr]][s];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t a[2][4];
#pragma unroll
          for (int rt = 0; rt < 2; ++rt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
              const q4k_f16::NibblePairs p = q4k_f16::nibble_pairs(words[rt][hr][h], odd);
              const __half2 step = as_half2(scale[rt][hr].scale);
              const __half2 neg_min = as_half2(scale[rt][hr].neg_min);
              a[rt][hr] = half2_bits(__hfma2(__hsub2(as_half2(p.v02), k1024), step, neg_min));
              a[rt][2 + hr] = half2_bits(__hfma2(__hsub2(as_half2(p.v13), k1024), step, neg_min));
            }
          multiply_tiles<kC>(a, x_rows, 32 * s + 16 * h + 4 * q, h % accumulator_sets<kC>(), acc);
        }
      }
    }
  }
};

// Q6_K: 210-byte super-blocks, so rows and blocks are only 2-byte aligned. A row's block is
// staged as the 14 aligned 16-byte pieces that cover it (240-byte slots, the block starting
// `lead` = its address mod 16 bytes in), and lanes read its words as two aligned words joined
// by a funnel shift. Sixteen 16-value sub-blocks, each the k extent of one instruction, with
// one f16 scale d * scales[s] made once per super-block by the block
// (q6k_f16_fragments.cuh says which values a lane holds).
struct Q6kFormat {
  static constexpr int kBlockBytes = 210;
  static constexpr int kPieces = 14;  // lead (0..14, even) + 210 bytes <= 224
  // 60 words: rows g = 0..7 of a half warp start 28 banks apart, so their 4-lane groups
  // differ in bank (up to the leads' shifts).
  static constexpr int kSlotBytes = 240;
  static_assert(sizeof(BlockQ6_K) == kBlockBytes, "Q6_K super-block layout");

  struct SharedScales {
    uint32_t at[kBlockRows][17];  // f16 pairs (scale, scale); rows 17 words apart
  };

  __device__ static const uint8_t* staged_block(const uint8_t* slot, const Tile& tile, int r) {
    return slot + (reinterpret_cast<uintptr_t>(tile.source(r)) & 15);
  }

  // The pieces of a row's block; the one piece that would reach past the end of W (the last
  // row's last block) is copied by 2-byte loads up to the end instead.
  template <typename StageT>
  __device__ static void fill_weights(StageT& st, const Tile& tile) {
    const uint8_t* w_end = tile.w + (size_t)tile.n * tile.row_bytes;
    for (int i = threadIdx.x; i < kBlockRows * kPieces; i += kThreads) {
      const int r = i / kPieces, piece = i % kPieces;
      const uint8_t* src = tile.source(r);
      const uint8_t* from = src - (reinterpret_cast<uintptr_t>(src) & 15) + 16 * piece;
      uint8_t* to = &st.w[r][16 * piece];
      if (from + 16 <= w_end) {
        copy16_async(to, from);
      } else {
        for (int b = 0; b < 16 && from + b < w_end; b += 2)
          *reinterpret_cast<uint16_t*>(to + b) =
              __ldg(reinterpret_cast<const unsigned short*>(from + b));
      }
    }
  }

  template <typename StageT>
  __device__ static void compute_scales(const StageT& st, const Tile& tile, SharedScales& scales) {
    for (int i = threadIdx.x; i < kBlockRows * 16; i += kThreads) {
      const int r = i / 16, s = i % 16;
      const uint8_t* block = staged_block(st.w[r], tile, r);
      const __half d = __ushort_as_half(*reinterpret_cast<const uint16_t*>(block + 208));
      const __half scale = __hmul(d, __int2half_rn((int8_t)block[192 + s]));
      scales.at[r][s] = half2_bits(__half2half2(scale));
    }
  }

  // The word at p (2-byte aligned) from the two aligned words around it.
  __device__ static uint32_t word_at(const uint8_t* p) {
    uint32_t word[1];
    q6k::load_words<1>(p, word);
    return word[0];
  }

  // For each of the lane's rows ([tile][row g, g + 8]) the words at offset(h), h = 0, 1.
  template <typename Offset>
  __device__ static void load_row_words(const uint8_t* const (&blocks)[2][2], Offset offset,
                                        uint32_t (&words)[2][2][2]) {
#pragma unroll
    for (int rt = 0; rt < 2; ++rt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr)
#pragma unroll
        for (int h = 0; h < 2; ++h) words[rt][hr][h] = word_at(blocks[rt][hr] + offset(h));
  }

  // Per half-block n a lane loads, per row, two qh words, then per ql pair (groups c and
  // c + 2 share their words) two ql words; each group of 32 values is two instructions (h),
  // each one sub-block with its own scale.
  template <int kC, int kParts, typename StageT>
  __device__ static void add_super_block(const StageT& st, const Tile& tile,
                                         const SharedScales& scales, const LaneRows& rows,
                                         const uint8_t* x_rows, int q, int part,
                                         Accumulators<kC>& acc) {
    const __half2 offset = as_half2(q6k_f16::kOffsetPair);
    const uint8_t* blocks[2][2];
#pragma unroll
    for (int rt = 0; rt < 2; ++rt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr)
        blocks[rt][hr] = staged_block(st.w[rows.index[rt][hr]], tile, rows.index[rt][hr]);
#pragma unroll
    for (int nn = 0; nn < 2 / kParts; ++nn) {
      const int n = part * (2 / kParts) + nn;
      uint32_t qh[2][2][2];  // [tile][row][h]
      load_row_words(
          blocks, [&](int h) { return q6k_f16::qh_offset(n, h, q); }, qh);
#pragma unroll
      for (int c1 = 0; c1 < 2; ++c1) {
        uint32_t ql[2][2][2];  // [tile][row][h]
        load_row_words(
            blocks, [&](int h) { return q6k_f16::ql_offset(n, c1, h, q); }, ql);
#pragma unroll
        for (int c = c1; c < 4; c += 2)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int s = q6k_f16::sub_block(n, c, h);
            uint32_t a[2][4];
#pragma unroll
            for (int rt = 0; rt < 2; ++rt)
#pragma unroll
              for (int hr = 0; hr < 2; ++hr) {
                const q4k_f16::NibblePairs p =
                    q6k_f16::six_bit_pairs(ql[rt][hr][h], qh[rt][hr][h], c);
                const __half2 scale = as_half2(scales.at[rows.index[rt][hr]][s]);
                a[rt][hr] = half2_bits(__hmul2(__hsub2(as_half2(p.v02), offset), scale));
                a[rt][2 + hr] = half2_bits(__hmul2(__hsub2(as_half2(p.v13), offset), scale));
              }
            multiply_tiles<kC>(a, x_rows, 128 * n + 32 * c + 16 * h + 4 * q,
                               h % accumulator_sets<kC>(), acc);
          }
      }
    }
  }
};

}  // namespace hablar::cuda::f16_product
