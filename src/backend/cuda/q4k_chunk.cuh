// Device helpers of the Q4_K products on int8 activations (matmul_q4k_rows.cu for dense
// decode, moe_grouped_q4k.cu for the experts):
//   - the activations: quantize_block32 turns 32 floats (one warp, a value per lane) into
//     int8 codes and the pair (d, d * sum of codes), quantize_activations_q8's layout;
//   - the weights: a "chunk" is the 32 bytes of nibbles that hold sub-blocks 2c and 2c + 1 of
//     a super-block (64 weights; byte i carries value i of the first in its low nibble and
//     value i of the second in its high nibble), plus the super-block's 16-byte header (d,
//     dmin and the twelve bytes of 6-bit scales and mins); chunk_dot takes it against the
//     chunk's 64 int8 activations in sixteen dp4a:
//       y += d*sc_lo*dx_lo*dot_lo + d*sc_hi*dx_hi*dot_hi/16 - dmin*(m_lo*sx_lo + m_hi*sx_hi)
//     (dx: activation scale of a block of 32, sx = dx * sum of its codes);
//   - programmatic dependent launch (dependent_launch.cuh): wait for the kernel before, let the
//     next one start.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/dependent_launch.cuh"
#include "core/quant_blocks.h"

namespace hablar::cuda::q4k_chunk {

constexpr int kSuperBlockBytes = sizeof(BlockQ4_K);  // 144
static_assert(kSuperBlockBytes == 144, "Q4_K super-block layout");

using cuda::allow_next_kernel_to_start;  // dependent_launch.cuh
using cuda::load_produced;
using cuda::wait_for_previous_kernel;

// One block of 32 activations, value v of each lane of the warp (every lane calls it, in
// control flow the whole warp takes): its int8 code (round to nearest of v / d, d = max |v|
// / 127), d, and the sum of the warp's codes.
struct Block32Code {
  int q;
  float d;
  int sum;
};

// kN blocks at once, block j's value of this lane in v[j] (warp-uniform control flow, as
// above): each reduction step's kN shuffles are issued together. One block after another
// would wait out a chain of ten dependent shuffles each (a 4096-wide row on 256 threads: 16
// blocks a warp, ~3 us).
template <int kN>
__device__ __forceinline__ void quantize_blocks32_code(const float (&v)[kN], int (&q)[kN],
                                                       float (&d)[kN], int (&sum)[kN]) {
  float amax[kN];
#pragma unroll
  for (int j = 0; j < kN; ++j) amax[j] = fabsf(v[j]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2)
#pragma unroll
    for (int j = 0; j < kN; ++j)
      amax[j] = fmaxf(amax[j], __shfl_xor_sync(0xffffffffu, amax[j], off));
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    d[j] = amax[j] / 127.0f;
    q[j] = d[j] > 0.0f ? __float2int_rn(v[j] / d[j]) : 0;
    sum[j] = q[j];
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2)
#pragma unroll
    for (int j = 0; j < kN; ++j) sum[j] += __shfl_xor_sync(0xffffffffu, sum[j], off);
}

// One block: value v of each lane.
__device__ __forceinline__ Block32Code quantize_block32_code(float v) {
  const float values[1] = {v};
  int q[1], sum[1];
  float d[1];
  quantize_blocks32_code<1>(values, q, d, sum);
  return {q[0], d[0], sum[0]};
}

// The same with its code to *code, and lane 0 writing (d, d * sum of the codes) to *scales.
__device__ __forceinline__ void quantize_block32(float v, int lane, int8_t* code, float2* scales) {
  const Block32Code c = quantize_block32_code(v);
  *code = (int8_t)c.q;
  if (lane == 0) *scales = make_float2(c.d, c.d * (float)c.sum);
}

// Unsigned bytes of a times signed bytes of b, summed into c.
__device__ __forceinline__ int dp4a_unsigned_signed(uint32_t a, int b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

struct Chunk {
  uint4 head;    // d | dmin << 16, scale bytes 0-3, 4-7, 8-11
  uint4 lo, hi;  // the 32 bytes of nibbles
};

// The (scale, min) pairs of sub-blocks 2cs and 2cs + 1 (cs = chunk within the super-block),
// each pair as two bytes of a word: 6-bit values packed as in ggml's get_scale_min_k4.
__device__ __forceinline__ void chunk_scales(const uint4& head, int cs, uint32_t* sc,
                                             uint32_t* mn) {
  const int shift = (cs & 1) * 16;
  const uint32_t a = head.y >> shift, b = head.z >> shift, e = head.w >> shift;
  if (cs < 2) {
    *sc = a & 0x3F3Fu;
    *mn = b & 0x3F3Fu;
  } else {
    *sc = (e & 0x0F0Fu) | ((a >> 2) & 0x3030u);
    *mn = ((e >> 4) & 0x0F0Fu) | ((b >> 2) & 0x3030u);
  }
}

__device__ __forceinline__ float chunk_dot(const Chunk& ch, int cs, const int4& x0, const int4& x1,
                                           const int4& x2, const int4& x3, const float4& xs) {
  const uint32_t q[8] = {ch.lo.x, ch.lo.y, ch.lo.z, ch.lo.w, ch.hi.x, ch.hi.y, ch.hi.z, ch.hi.w};
  const int xlo[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
  const int xhi[8] = {x2.x, x2.y, x2.z, x2.w, x3.x, x3.y, x3.z, x3.w};
  int dot_lo = 0, dot_hi16 = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    dot_lo = dp4a_unsigned_signed(q[i] & 0x0F0F0F0Fu, xlo[i], dot_lo);
    dot_hi16 = dp4a_unsigned_signed(q[i] & 0xF0F0F0F0u, xhi[i], dot_hi16);
  }
  uint32_t sc, mn;
  chunk_scales(ch.head, cs, &sc, &mn);
  const float d = __half2float(__ushort_as_half((unsigned short)(ch.head.x & 0xFFFFu)));
  const float dmin = __half2float(__ushort_as_half((unsigned short)(ch.head.x >> 16)));
  const float scaled = (float)(sc & 0xFFu) * xs.x * (float)dot_lo +
                       (float)(sc >> 8) * (xs.z * (1.0f / 16.0f)) * (float)dot_hi16;
  const float mins = (float)(mn & 0xFFu) * xs.y + (float)(mn >> 8) * xs.w;
  return d * scaled - dmin * mins;
}

// 16 bytes of weights; with l2_hint the L2 fetches the whole 256-byte span around them.
__device__ __forceinline__ uint4 load_weights16(const uint8_t* p, bool l2_hint) {
  if (!l2_hint) return __ldg(reinterpret_cast<const uint4*>(p));
  uint4 v;
  asm("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// The int8 activations of one chunk (64 codes) and its two blocks' (dx, sx).
struct ChunkX {
  int4 x0, x1, x2, x3;
  float4 s;
};
__device__ __forceinline__ ChunkX load_x(const int8_t* xq, const float4* xs, int c) {
  const int4* xv = reinterpret_cast<const int4*>(xq + (size_t)64 * c);
  return {load_produced(xv), load_produced(xv + 1), load_produced(xv + 2), load_produced(xv + 3),
          load_produced(xs + c)};
}

}  // namespace hablar::cuda::q4k_chunk
