// Tensor-core pieces the attention kernels share (attention_decode.cu, attention_prefill.cu,
// embed_attention.cu): mma.sync m16n8k16 with f16 or bf16 inputs and f32 accumulators, the
// packing of two floats into one input register, and ldmatrix's plain and transposing loads.
//
// Fragment layout of m16n8k16 (g = lane / 4, t = lane % 4): A (16 x 16, row-major) regs
// {(g, 2t..2t+1), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..)}; B (16 x 8, by column n)
// regs {(k 2t..2t+1, n g), (k 2t + 8.., n g)}; C (16 x 8) {(g, 2t), (g, 2t + 1), (g + 8, 2t),
// (g + 8, 2t + 1)}. Two C tiles of adjacent columns are exactly one A fragment.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace hablar::cuda {

// c += a · b on the tensor cores, m16n8k16, f32 accumulators.
template <bool kBf16>
__device__ __forceinline__ void mma_m16n8k16(float c[4], const uint32_t a[4], uint32_t b0,
                                             uint32_t b1) {
  if constexpr (kBf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// (lo, hi) rounded to the element type and packed into one register (lo in the low half).
template <bool kBf16>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  if constexpr (kBf16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// The A fragment of the weights P for keys [16kk, 16kk + 16) of a warp's 16 rows, from P's
// accumulator fragments s (C tiles of 8 keys: tiles 2kk and 2kk + 1), rounded to the element
// type: the step from S's softmax to P · V without leaving registers.
template <bool kBf16, int kTiles>
__device__ __forceinline__ void p_fragment(const float (&s)[kTiles][4], int kk, uint32_t (&pa)[4]) {
  pa[0] = pack_pair<kBf16>(s[2 * kk][0], s[2 * kk][1]);
  pa[1] = pack_pair<kBf16>(s[2 * kk][2], s[2 * kk][3]);
  pa[2] = pack_pair<kBf16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  pa[3] = pack_pair<kBf16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// Four 8 x 8 tiles of 16-bit elements from shared memory: lanes 8i..8i+7 give the row
// addresses of tile i, and register i of lane (g, t) receives the tile's elements (row g,
// columns 2t and 2t + 1) - a B fragment half of an N x K tile stored by rows of K.
__device__ __forceinline__ void ldmatrix_x4(const void* row, uint32_t (&r)[4]) {
  const unsigned addr = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Four transposed 8 x 8 tiles of 16-bit elements from shared memory: lanes 8i..8i+7 give
// the row addresses of tile i, and register i of lane (g, t) receives the tile's elements
// (row 2t, column g) and (row 2t + 1, column g) - a B fragment half of a row-major K x N tile.
__device__ __forceinline__ void ldmatrix_x4_trans(const void* row, uint32_t (&r)[4]) {
  const unsigned addr = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

}  // namespace hablar::cuda
