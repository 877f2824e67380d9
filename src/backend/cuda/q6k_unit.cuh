// Q6_K weights against int8 activations, 128 values at a time (matmul_q6k_rows.cu); every
// function is __host__ __device__ so that q6k_unit_host_test.cu checks the arithmetic on the
// host against quant_device.cuh's QuantTraits<Q6_K>::unit.
//
// A "half-unit" is half h (0 or 1) of a 210-byte Q6_K super-block (ggml's layout: ql[128] at
// byte 0, qh[64] at 128, int8 scales[16] at 192, f16 d at 208): four 32-value units
// j = 4h + q (quarter q = 0..3) made of ql[64h .. 64h+64), qh[32h .. 32h+32), scales[8h .. 8h+8)
// and d. Value i (0..31) of quarter q is
//   q6 = nibble (low for q < 2, high for q >= 2) of ql[64h + 32(q & 1) + i]
//        | ((qh[32h + i] >> 2q) & 3) << 4                                  (0..63)
//   weight = d * scales[8h + 2q + (i >= 16)] * (q6 - 32).
// Against the 32 int8 codes x_i of its activation block (value ≈ dx * x_i, sx = dx * Σ x_i), a
// quarter takes the q6 bytes as they are (0..63, so signed dp4a is exact): with D0, D1 the dp4a
// sums over values 0..15 and 16..31, X0 the sum of codes 0..15 and X32 of all 32,
//   Σ_i s_i (q6_i - 32) x_i = [s0 D0 + s1 D1 - 32 (s0 - s1) X0] - 32 s1 X32,
// and dx * X32 = sx: no per-byte subtraction of 32, 12 dp4a per 32 values.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "backend/cuda/quant_device.cuh"

namespace hablar::cuda::q6k {

constexpr int kBlockBytes = 210;  // sizeof(BlockQ6_K)

// Sum of the four signed byte products of a and b, plus c.
__host__ __device__ __forceinline__ int dot4(int a, int b, int c) {
#if defined(__CUDA_ARCH__)
  return __dp4a(a, b, c);
#else
  for (int i = 0; i < 4; ++i) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
  return c;
#endif
}

// The low word of (hi:lo) >> bits, bits < 32.
__host__ __device__ __forceinline__ uint32_t shift_pair_right(uint32_t lo, uint32_t hi,
                                                              uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(lo, hi, bits);
#else
  return (uint32_t)(((((uint64_t)hi) << 32) | lo) >> bits);
#endif
}

__host__ __device__ __forceinline__ uint32_t aligned_word(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t w;
  std::memcpy(&w, p, sizeof w);
  return w;
#endif
}

// The kN little-endian words at p, any alignment, from the kN + 1 aligned words that start at p
// rounded down to 4 bytes (when p is 4-byte aligned the last of them is read and unused).
template <int kN>
__host__ __device__ __forceinline__ void load_words(const uint8_t* p, uint32_t (&out)[kN]) {
  const uint32_t misalign = (uint32_t)(reinterpret_cast<uintptr_t>(p) & 3);
  const uint8_t* base = p - misalign;
  uint32_t w[kN + 1];
#pragma unroll
  for (int i = 0; i <= kN; ++i) w[i] = aligned_word(base + 4 * i);
#pragma unroll
  for (int i = 0; i < kN; ++i) out[i] = shift_pair_right(w[i], w[i + 1], 8 * misalign);
}

struct HalfUnit {
  uint32_t ql[16];     // values 0..31 of quarters 0 / 2 (low / high nibbles), then of 1 / 3
  uint32_t qh[8];      // byte i: bits 2q..2q+1 for value i of quarter q
  uint32_t scales[2];  // int8: quarter q's two at bytes 2q and 2q + 1
  float d;
};

// Half `half` of the super-block at `block` (2-byte aligned). Every aligned word it reads
// overlaps the block's 210 bytes (so reaches at most 2 bytes before or after them): a copy of
// the block in whole aligned 16-byte pieces is enough to read it from.
__host__ __device__ __forceinline__ HalfUnit load_half_unit(const uint8_t* block, int half) {
  HalfUnit u;
  load_words(block + 64 * half, u.ql);
  load_words(block + 128 + 32 * half, u.qh);
  load_words(block + 192 + 8 * half, u.scales);
  u.d = half_at(block + 208);
  return u;
}

// int8 scale s (0..7) of the half-unit.
__host__ __device__ __forceinline__ int scale_of(const HalfUnit& u, int s) {
  return (int)(int8_t)(u.scales[s / 4] >> (8 * (s % 4)));
}

// Quarter kQ against its 32 codes x[0..7] (four to a word): s0 D0 + s1 D1 - 32 (s0 - s1) X0,
// which is Σ_i s_i (q6_i - 32) x_i + 32 s1 X32 (see the top of the file).
template <int kQ>
__host__ __device__ __forceinline__ int quarter_dot(const HalfUnit& u, const int* x) {
  int d0 = 0, d1 = 0, x0 = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uint32_t l = u.ql[8 * (kQ & 1) + k], h = u.qh[k];
    const uint32_t lo = (kQ < 2 ? l : l >> 4) & 0x0F0F0F0Fu;
    const uint32_t hi = (kQ == 0 ? h << 4 : kQ == 1 ? h << 2 : kQ == 2 ? h : h >> 2) & 0x30303030u;
    const int q6 = (int)(lo | hi);
    if (k < 4) {
      d0 = dot4(q6, x[k], d0);
      x0 = dot4(0x01010101, x[k], x0);
    } else {
      d1 = dot4(q6, x[k], d1);
    }
  }
  const int s0 = scale_of(u, 2 * kQ), s1 = scale_of(u, 2 * kQ + 1);
  return s0 * d0 + s1 * d1 - 32 * (s0 - s1) * x0;
}

// Quarter kQ's share of the dot product, xs = (dx, sx) of its activation block, without d.
template <int kQ>
__host__ __device__ __forceinline__ float quarter_product(const HalfUnit& u, const int* x,
                                                          float2 xs) {
  const float s1 = (float)scale_of(u, 2 * kQ + 1);
  return xs.x * (float)quarter_dot<kQ>(u, x) - 32.0f * s1 * xs.y;
}

// Σ weight * activation over the half-unit's 128 values: x holds their codes (four to a word,
// quarter q's in x[8q .. 8q+8)), xs the (dx, sx) of the four blocks of 32.
__host__ __device__ __forceinline__ float half_unit_dot(const HalfUnit& u, const int (&x)[32],
                                                        const float2 (&xs)[4]) {
  const float sum = quarter_product<0>(u, x, xs[0]) + quarter_product<1>(u, x + 8, xs[1]) +
                    quarter_product<2>(u, x + 16, xs[2]) + quarter_product<3>(u, x + 24, xs[3]);
  return u.d * sum;
}

}  // namespace hablar::cuda::q6k
