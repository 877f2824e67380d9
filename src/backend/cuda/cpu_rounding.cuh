// The CPU backend's rounding, as functions that a CUDA kernel and a host test both compile:
// the activation quantizers (backend/cpu/act_quant.h), the integer-sum dot products in the
// float orders of each weight type and token role (backend/cpu/matmul_reference.cpp), the
// dequantization of an embedding row (core/quant.h), RMSNorm, exp_approx and SwiGLU
// (backend/cpu/ops.h) and the per-head attention (backend/cpu/attention.cpp). The CUDA
// backend's deterministic mode runs them, so that its values are the CPU's bit for bit;
// tests/unit/cuda/cpu_rounding_host_test.cpp holds every function here equal to the CPU's
// scalar reference, on the host.
//
// Every float operation is written out (mul, add, fmaf): nvcc would otherwise contract a
// product and a sum into one fused multiply-add, which the CPU's reference does not do.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/fp16.h"
#include "core/kv_layout.h"
#include "core/quant_blocks.h"

#if defined(__CUDACC__)
#define HABLAR_RHD __host__ __device__ inline
#else
#define HABLAR_RHD inline
#endif

namespace hablar::cpu_rounding {

// ---- single roundings ---------------------------------------------------------------------

HABLAR_RHD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
HABLAR_RHD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
HABLAR_RHD float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
HABLAR_RHD float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
HABLAR_RHD double add_d(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
HABLAR_RHD float half_round(float x) {
  return fp16_to_f32(f32_to_fp16(x));
}
HABLAR_RHD float bf16_round(float x) {
  return bf16_to_f32(f32_to_bf16(x));
}

// ---- activation quantizers ----------------------------------------------------------------

// One 32-value block of an Act32 row (act_quant.h): codes, d and s rounded to half, sum.
HABLAR_RHD void quantize_block32(const float* x, int8_t* qs, float* d_out, float* s_out,
                                 int32_t* sum_out) {
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) amax = fmaxf(amax, fabsf(x[j]));
  const float d = div(amax, 127.0f);
  const float id = amax != 0.0f ? div(127.0f, amax) : 0.0f;
  int32_t sum = 0;
  for (int j = 0; j < kQK; ++j) {
    qs[j] = (int8_t)rintf(mul(x[j], id));
    sum += qs[j];
  }
  *d_out = half_round(d);
  *s_out = half_round(mul((float)sum, d));
  *sum_out = sum;
}

// One 256-value Q8_K block (act_quant.h quantize_q8k_scalar).
HABLAR_RHD void quantize_block_q8k(const float* x, BlockQ8_K* y) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kQK_K; ++j) {
    const float ax = fabsf(x[j]);
    if (ax > amax) amax = ax, max = x[j];
  }
  if (amax == 0.0f) {
    y->d = 0.0f;
    for (int j = 0; j < kQK_K; ++j) y->qs[j] = 0;
    for (int g = 0; g < kQK_K / 16; ++g) y->bsums[g] = 0;
    return;
  }
  const float iscale = div(-127.0f, max);
  for (int j = 0; j < kQK_K; ++j) {
    const int v = (int)rintf(mul(iscale, x[j]));
    y->qs[j] = (int8_t)(v < 127 ? v : 127);
  }
  for (int g = 0; g < kQK_K / 16; ++g) {
    int sum = 0;
    for (int j = 0; j < 16; ++j) sum += y->qs[16 * g + j];
    y->bsums[g] = (int16_t)sum;
  }
  y->d = div(1.0f, iscale);
}

// ---- weight codes -------------------------------------------------------------------------

// Value j (0..31) of a 32-value block, as the integer the dot product multiplies (Q4_0's and
// Q5_0's offsets removed; Q4_1's and Q5_1's minimum is a separate term).
HABLAR_RHD int code32(DType type, const uint8_t* block, int j) {
  const int half = j / (kQK / 2), i = j % (kQK / 2);
  switch (type) {
    case DType::Q4_0: {
      const auto* b = reinterpret_cast<const BlockQ4_0*>(block);
      return ((b->qs[i] >> (4 * half)) & 0xF) - 8;
    }
    case DType::Q4_1: {
      const auto* b = reinterpret_cast<const BlockQ4_1*>(block);
      return (b->qs[i] >> (4 * half)) & 0xF;
    }
    case DType::Q5_0:
    case DType::Q5_1: {
      const uint8_t* qs = type == DType::Q5_0 ? reinterpret_cast<const BlockQ5_0*>(block)->qs
                                              : reinterpret_cast<const BlockQ5_1*>(block)->qs;
      const uint8_t* qh = type == DType::Q5_0 ? reinterpret_cast<const BlockQ5_0*>(block)->qh
                                              : reinterpret_cast<const BlockQ5_1*>(block)->qh;
      const uint32_t h =
          (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
      const int q = ((qs[i] >> (4 * half)) & 0xF) | (int)(((h >> j) & 1u) << 4);
      return type == DType::Q5_0 ? q - 16 : q;
    }
    default:
      return reinterpret_cast<const BlockQ8_0*>(block)->qs[j];
  }
}

// The block's scale d and, for Q4_1/Q5_1, its minimum m (else 0).
HABLAR_RHD void block32_factors(DType type, const uint8_t* block, float* d, float* m) {
  const auto* h = reinterpret_cast<const uint16_t*>(block);
  *d = fp16_to_f32(h[0]);
  *m = (type == DType::Q4_1 || type == DType::Q5_1) ? fp16_to_f32(h[1]) : 0.0f;
}

HABLAR_RHD size_t block32_bytes(DType type) {
  switch (type) {
    case DType::Q4_0:
      return sizeof(BlockQ4_0);
    case DType::Q4_1:
      return sizeof(BlockQ4_1);
    case DType::Q5_0:
      return sizeof(BlockQ5_0);
    case DType::Q5_1:
      return sizeof(BlockQ5_1);
    default:
      return sizeof(BlockQ8_0);
  }
}

// Q4_K / Q5_K: the 6-bit scale and min of 32-value group j (0..7).
HABLAR_RHD void k4_scale_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Value v (0..255) of a K super-block as the dot product multiplies it: Q4_K/Q5_K unsigned,
// Q6_K signed (its offset of 32 removed).
HABLAR_RHD int code_k(DType type, const uint8_t* block, int v) {
  if (type == DType::Q6_K) {
    const auto* b = reinterpret_cast<const BlockQ6_K*>(block);
    const int h = v / 128, k = (v % 128) / 32, l = v % 32;
    const int low = (b->ql[64 * h + l + 32 * (k % 2)] >> (4 * (k / 2))) & 0xF;
    const int high = (b->qh[32 * h + l] >> (2 * k)) & 3;
    return (low | high << 4) - 32;
  }
  const uint8_t* qs = type == DType::Q4_K ? reinterpret_cast<const BlockQ4_K*>(block)->qs
                                          : reinterpret_cast<const BlockQ5_K*>(block)->qs;
  const int g = v / 64, hi = (v % 64) / 32, l = v % 32;
  int q = (qs[32 * g + l] >> (4 * hi)) & 0xF;
  if (type == DType::Q5_K)
    q |= ((reinterpret_cast<const BlockQ5_K*>(block)->qh[l] >> (2 * g + hi)) & 1) << 4;
  return q;
}

// The integer scale and min of 16-value sub-block k (0..15) and the super-block's factors.
HABLAR_RHD void k_sub_block(DType type, const uint8_t* block, int k, int* scale, int* min) {
  if (type == DType::Q6_K) {
    *scale = reinterpret_cast<const BlockQ6_K*>(block)->scales[k];
    *min = 0;
    return;
  }
  const uint8_t* s = type == DType::Q4_K ? reinterpret_cast<const BlockQ4_K*>(block)->scales
                                         : reinterpret_cast<const BlockQ5_K*>(block)->scales;
  k4_scale_min(s, k / 2, scale, min);
}
HABLAR_RHD void k_factors(DType type, const uint8_t* block, float* d, float* dmin) {
  if (type == DType::Q6_K) {
    *d = fp16_to_f32(reinterpret_cast<const BlockQ6_K*>(block)->d);
    *dmin = 0.0f;
    return;
  }
  const auto* h = reinterpret_cast<const uint16_t*>(block);
  *d = fp16_to_f32(h[0]);
  *dmin = fp16_to_f32(h[1]);
}
HABLAR_RHD size_t k_block_bytes(DType type) {
  return type == DType::Q4_K   ? sizeof(BlockQ4_K)
         : type == DType::Q5_K ? sizeof(BlockQ5_K)
                               : sizeof(BlockQ6_K);
}

// ---- dot products (matmul_reference.cpp) --------------------------------------------------

// The summation orders a token's role selects (backend/cpu/matmul_internal.h KOrder).
enum class KOrder : uint8_t { kOneToken, kGroupOf4, kTiled };
HABLAR_RHD KOrder k_order_for(DType type, uint8_t role) {
  if (type == DType::Q4_K) return (role & 2) ? KOrder::kGroupOf4 : KOrder::kOneToken;
  if (type == DType::Q5_K || type == DType::Q6_K)
    return (role & 1) ? KOrder::kTiled : KOrder::kOneToken;
  return KOrder::kOneToken;
}

HABLAR_RHD float sum_lanes(const float* l) {
  return add(add(add(l[0], l[4]), add(l[2], l[6])), add(add(l[1], l[5]), add(l[3], l[7])));
}

// A row of nb 32-value blocks against an Act32 row (qs, d, s per block).
HABLAR_RHD float dot_act32(DType type, const uint8_t* w, const int8_t* qs, const float* ad,
                           const float* as, int64_t nb) {
  const size_t bytes = block32_bytes(type);
  if (type == DType::Q4_0) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + b * bytes;
      int32_t dot = 0;
      for (int j = 0; j < kQK; ++j) dot += code32(type, blk, j) * qs[b * kQK + j];
      float d, m;
      block32_factors(type, blk, &d, &m);
      acc = fmaf((float)dot, mul(d, ad[b]), acc);
    }
    return acc;
  }
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float summs = 0.0f;
  const bool with_min = type == DType::Q4_1 || type == DType::Q5_1;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * bytes;
    float dw, m;
    block32_factors(type, blk, &dw, &m);
    const float d = mul(dw, ad[b]);
    if (with_min) summs = fmaf(m, as[b], summs);
    for (int k = 0; k < 8; ++k) {
      int32_t part = 0;
      for (int j = 4 * k; j < 4 * k + 4; ++j) part += code32(type, blk, j) * qs[b * kQK + j];
      lanes[k] = fmaf(d, (float)part, lanes[k]);
    }
  }
  return add(sum_lanes(lanes), summs);
}

// Exact integer sums of sub-blocks [k0, k1): sum_k scale_k * dot_k and sum_k min_k * bsum_k.
HABLAR_RHD void k_sums(DType type, const uint8_t* blk, const BlockQ8_K& a, int k0, int k1,
                       int32_t* isum, int32_t* msum) {
  *isum = 0, *msum = 0;
  for (int k = k0; k < k1; ++k) {
    int scale, min;
    k_sub_block(type, blk, k, &scale, &min);
    int32_t part = 0;
    for (int j = 0; j < 16; ++j) part += code_k(type, blk, 16 * k + j) * a.qs[16 * k + j];
    *isum += scale * part;
    *msum += min * a.bsums[k];
  }
}

// A row of nb K super-blocks against Q8_K blocks, in the order of the type and role.
HABLAR_RHD float dot_q8k(DType type, const uint8_t* w, const BlockQ8_K* a, int64_t nb,
                         KOrder order) {
  const size_t bytes = k_block_bytes(type);
  if (type == DType::Q4_K) {  // mins apart, one step per `step` sub-blocks
    const int step = order == KOrder::kGroupOf4 ? 4 : 16;
    float acc = 0.0f, accm = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + b * bytes;
      float d, dmin;
      k_factors(type, blk, &d, &dmin);
      for (int k0 = 0; k0 < 16; k0 += step) {
        int32_t isum, msum;
        k_sums(type, blk, a[b], k0, k0 + step, &isum, &msum);
        acc = fmaf((float)isum, mul(d, a[b].d), acc);
        accm = fmaf((float)msum, mul(dmin, a[b].d), accm);
      }
    }
    return sub(acc, accm);
  }
  if (order == KOrder::kTiled) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + b * bytes;
      float d, dmin;
      k_factors(type, blk, &d, &dmin);
      int32_t isum, msum;
      k_sums(type, blk, a[b], 0, 16, &isum, &msum);
      float r = mul((float)isum, d);
      if (type == DType::Q5_K) r = fmaf(-dmin, (float)msum, r);
      acc = fmaf(r, a[b].d, acc);
    }
    return acc;
  }
  // Q5_K / Q6_K one-token: 8 lanes of unsigned-code partial sums.
  const int offset = type == DType::Q6_K ? 32 : 0;
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float summs = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * bytes;
    float d, dmin;
    k_factors(type, blk, &d, &dmin);
    int32_t part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int scale[16], min[16];
    for (int k = 0; k < 16; ++k) k_sub_block(type, blk, k, &scale[k], &min[k]);
    for (int v = 0; v < kQK_K; ++v)
      part[(v % 32) / 4] += scale[v / 16] * (code_k(type, blk, v) + offset) * a[b].qs[v];
    for (int k = 0; k < 8; ++k) {
      part[k] -=
          offset * (a[b].bsums[2 * k] * scale[2 * k] + a[b].bsums[2 * k + 1] * scale[2 * k + 1]);
      lanes[k] = fmaf(mul(a[b].d, d), (float)part[k], lanes[k]);
    }
    int32_t msum = 0;
    for (int k = 0; k < 16; ++k) msum += min[k] * a[b].bsums[k];
    if (type == DType::Q5_K) summs = fmaf(mul(-a[b].d, dmin), (float)msum, summs);
  }
  return type == DType::Q5_K ? add(sum_lanes(lanes), summs) : sum_lanes(lanes);
}

HABLAR_RHD float float_weight(DType type, const uint8_t* w, int64_t c) {
  if (type == DType::F32) return reinterpret_cast<const float*>(w)[c];
  const uint16_t h = reinterpret_cast<const uint16_t*>(w)[c];
  return type == DType::F16 ? fp16_to_f32(h) : bf16_to_f32(h);
}

// ---- the same dot products as fma chains (for kernels that split a row over threads) ------
//
// Every quantized dot product above is a few independent chains of fused multiply-adds over
// the row's blocks (acc_c = fma(x, y, acc_c), block after block), combined at the end. The
// integer work that makes each (x, y) is per block and can run anywhere; only the chains
// need their order. block_terms() gives a block's entries in chain order, combine_chains()
// the final sum; dot_by_chains() is the sequential form, equal to dot_act32 / dot_q8k.

inline constexpr int kMaxChains = 9;
struct BlockTerms {
  int n = 0;
  uint8_t chain[kMaxChains];
  float x[kMaxChains], y[kMaxChains];
  HABLAR_RHD void put(int c, float a, float b) { chain[n] = (uint8_t)c, x[n] = a, y[n] = b, ++n; }
};

// Chains of a type and order: 8 lanes (+ the minimum or mins term) for the lane formats,
// Q4_K's scaled codes and mins, one for Q4_0 and the tiled order.
HABLAR_RHD bool lane_format(DType type, KOrder order) {
  return type == DType::Q4_1 || type == DType::Q5_0 || type == DType::Q5_1 || type == DType::Q8_0 ||
         ((type == DType::Q5_K || type == DType::Q6_K) && order == KOrder::kOneToken);
}

// Block b's entries. Act32 rows: qs, ad, as; K rows: a8.
HABLAR_RHD void block_terms(DType type, KOrder order, const uint8_t* w, const int8_t* qs,
                            const float* ad, const float* as, const BlockQ8_K* a8, int64_t b,
                            BlockTerms& t) {
  t.n = 0;
  if (type == DType::Q4_0 || type == DType::Q4_1 || type == DType::Q5_0 || type == DType::Q5_1 ||
      type == DType::Q8_0) {
    const uint8_t* blk = w + b * block32_bytes(type);
    const int8_t* q = qs + b * kQK;
    float dw, m;
    block32_factors(type, blk, &dw, &m);
    if (type == DType::Q4_0) {
      int32_t dot = 0;
      for (int j = 0; j < kQK; ++j) dot += code32(type, blk, j) * q[j];
      t.put(0, (float)dot, mul(dw, ad[b]));
      return;
    }
    const float d = mul(dw, ad[b]);
    for (int k = 0; k < 8; ++k) {
      int32_t part = 0;
      for (int j = 4 * k; j < 4 * k + 4; ++j) part += code32(type, blk, j) * q[j];
      t.put(k, d, (float)part);
    }
    if (type == DType::Q4_1 || type == DType::Q5_1) t.put(8, m, as[b]);
    return;
  }
  const uint8_t* blk = w + b * k_block_bytes(type);
  const BlockQ8_K& a = a8[b];
  float d, dmin;
  k_factors(type, blk, &d, &dmin);
  if (type == DType::Q4_K) {
    const int step = order == KOrder::kGroupOf4 ? 4 : 16;
    for (int k0 = 0; k0 < 16; k0 += step) {
      int32_t isum, msum;
      k_sums(type, blk, a, k0, k0 + step, &isum, &msum);
      t.put(0, (float)isum, mul(d, a.d));
      t.put(1, (float)msum, mul(dmin, a.d));
    }
    return;
  }
  if (order == KOrder::kTiled) {
    int32_t isum, msum;
    k_sums(type, blk, a, 0, 16, &isum, &msum);
    float r = mul((float)isum, d);
    if (type == DType::Q5_K) r = fmaf(-dmin, (float)msum, r);
    t.put(0, r, a.d);
    return;
  }
  const int offset = type == DType::Q6_K ? 32 : 0;
  int32_t part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int scale[16], min[16];
  for (int k = 0; k < 16; ++k) k_sub_block(type, blk, k, &scale[k], &min[k]);
  for (int v = 0; v < kQK_K; ++v)
    part[(v % 32) / 4] += scale[v / 16] * (code_k(type, blk, v) + offset) * a.qs[v];
  for (int k = 0; k < 8; ++k) {
    part[k] -= offset * (a.bsums[2 * k] * scale[2 * k] + a.bsums[2 * k + 1] * scale[2 * k + 1]);
    t.put(k, mul(a.d, d), (float)part[k]);
  }
  if (type == DType::Q5_K) {
    int32_t msum = 0;
    for (int k = 0; k < 16; ++k) msum += min[k] * a.bsums[k];
    t.put(8, mul(-a.d, dmin), (float)msum);
  }
}

HABLAR_RHD float combine_chains(DType type, KOrder order, const float* acc) {
  if (lane_format(type, order)) {
    const bool with_min = type == DType::Q4_1 || type == DType::Q5_1 || type == DType::Q5_K;
    return with_min ? add(sum_lanes(acc), acc[8]) : sum_lanes(acc);
  }
  if (type == DType::Q4_K) return sub(acc[0], acc[1]);
  return acc[0];
}

HABLAR_RHD float dot_by_chains(DType type, KOrder order, const uint8_t* w, const int8_t* qs,
                               const float* ad, const float* as, const BlockQ8_K* a8, int64_t nb) {
  float acc[kMaxChains];
  for (int c = 0; c < kMaxChains; ++c) acc[c] = 0.0f;
  BlockTerms t;
  for (int64_t b = 0; b < nb; ++b) {
    block_terms(type, order, w, qs, ad, as, a8, b, t);
    for (int e = 0; e < t.n; ++e) acc[t.chain[e]] = fmaf(t.x[e], t.y[e], acc[t.chain[e]]);
  }
  return combine_chains(type, order, acc);
}

// Float weights as the CPU's float tiles sum them on a machine with `lanes`-wide vectors (16
// with AVX-512, 8 with AVX2; 1: its scalar form): one fma chain per lane, the lanes' sum in
// the order of a horizontal add, then the tail in order. F16 weights multiply the
// activations rounded to half.
HABLAR_RHD float dot_float(DType type, const uint8_t* w, const float* x, int64_t n, int lanes) {
  const bool round = type == DType::F16;
  float v = 0.0f;
  int64_t c = 0;
  if (lanes > 1) {
    float acc[16];
    for (int l = 0; l < 16; ++l) acc[l] = 0.0f;
    for (; c + lanes <= n; c += lanes)
      for (int l = 0; l < lanes; ++l) {
        const float xc = round ? half_round(x[c + l]) : x[c + l];
        acc[l] = fmaf(float_weight(type, w, c + l), xc, acc[l]);
      }
    if (lanes == 16)
      for (int l = 0; l < 8; ++l) acc[l] = add(acc[l], acc[l + 8]);
    v = sum_lanes(acc);
  }
  for (; c < n; ++c) v = add(v, mul(float_weight(type, w, c), round ? half_round(x[c]) : x[c]));
  return v;
}

// ---- dequantization (core/quant.h), for the embedding lookup ------------------------------

HABLAR_RHD float dequantize_value(DType type, const uint8_t* row, int64_t c) {
  switch (type) {
    case DType::F32:
      return reinterpret_cast<const float*>(row)[c];
    case DType::F16:
      return fp16_to_f32(reinterpret_cast<const uint16_t*>(row)[c]);
    case DType::BF16:
      return bf16_to_f32(reinterpret_cast<const uint16_t*>(row)[c]);
    case DType::Q4_K:
    case DType::Q5_K: {
      const uint8_t* blk = row + c / kQK_K * k_block_bytes(type);
      const int v = (int)(c % kQK_K);
      float d, dmin;
      k_factors(type, blk, &d, &dmin);
      int sc, m;
      k_sub_block(type, blk, v / 16, &sc, &m);
      return sub(mul(mul(d, (float)sc), (float)code_k(type, blk, v)), mul(dmin, (float)m));
    }
    case DType::Q6_K: {
      const uint8_t* blk = row + c / kQK_K * k_block_bytes(type);
      const int v = (int)(c % kQK_K);
      float d, dmin;
      k_factors(type, blk, &d, &dmin);
      int sc, m;
      k_sub_block(type, blk, v / 16, &sc, &m);
      return mul(mul(d, (float)sc), (float)code_k(type, blk, v));
    }
    default: {
      const uint8_t* blk = row + c / kQK * block32_bytes(type);
      float d, m;
      block32_factors(type, blk, &d, &m);
      const float q = mul(d, (float)code32(type, blk, (int)(c % kQK)));
      return (type == DType::Q4_1 || type == DType::Q5_1) ? add(q, m) : q;
    }
  }
}

// ---- element-wise ops (ops.h) -------------------------------------------------------------

HABLAR_RHD float exp_approx(float x) {
  if (x != x) return x;
  const float shifter = 0x1.8p23f;
  const float n = sub(fmaf(x, 0x1.715476p+0f, shifter), shifter);
  const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
  if (fabsf(n) > 192.0f) return n > 0.0f ? INFINITY : 0.0f;
  const float u = mul(b, b);
  const float j = fmaf(
      fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
      fmaf(0x1.ffffecp-1f, b, 1.0f));
  const int ni = (int)n, half = ni / 2;
  return mul(mul(j, ldexpf(1.0f, ni - half)), ldexpf(1.0f, half));
}

HABLAR_RHD float swiglu(float g, float up) {
  return mul(div(g, add(1.0f, exp_approx(-g))), up);
}

// GELU (tanh form) as the CPU's table holds it before rounding to half (ops.cpp): built on
// the host, where tanhf is the CPU's own.
HABLAR_RHD float gelu_tanh(float x) {
  const float a = 0.044715f, k = 0.79788456080286535587989211986876f;
  return mul(mul(0.5f, x), add(1.0f, tanhf(mul(mul(k, x), fmaf(mul(a, x), x, 1.0f)))));
}
// out = gelu(gate) * up through the CPU's table of gelu values at every half (`table`, 65536
// floats indexed by the half bits of gate), 0 below -10 and gate * up above 10.
HABLAR_RHD float geglu(float g, float up, const float* table) {
  if (g <= -10.0f) return 0.0f;
  if (g >= 10.0f) return mul(g, up);
  return mul(table[f32_to_fp16(g)], up);
}

// The table: gelu_tanh at every half value, rounded to half (host code: the host's tanhf).
inline std::vector<float> gelu_half_table() {
  std::vector<float> t(65536);
  for (uint32_t i = 0; i < 65536; ++i) t[i] = half_round(gelu_tanh(fp16_to_f32((uint16_t)i)));
  return t;
}

// 1 / sqrt(mean(x^2) + eps): squares rounded to float and summed in order in double.
HABLAR_RHD float rms_scale(const float* x, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum = add_d(sum, (double)mul(x[i], x[i]));
#if defined(__CUDA_ARCH__)
  const float mean = (float)__ddiv_rn(sum, (double)n);
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
#else
  const float mean = (float)(sum / (double)n);
  return 1.0f / std::sqrt(mean + eps);
#endif
}

// LayerNorm with a bias as cpu::layernorm rounds it (y may alias x): the mean in float from
// a double sum; the deviations' squares 16 at a time (reduce16, below), those sums in double;
// then the scale, the weight and the bias each in its own rounding.
HABLAR_RHD float reduce16(const float* a);
HABLAR_RHD void layernorm_row(const float* x, const float* w, const float* b, float* y, int n,
                              float eps) {
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum = add_d(sum, (double)x[i]);
  const float mean = div((float)sum, (float)n);
  double squares = 0.0;
  int i = 0;
  for (float block[16]; i + 16 <= n; i += 16) {
    for (int l = 0; l < 16; ++l) {
      const float d = sub(x[i + l], mean);
      y[i + l] = d;
      block[l] = mul(d, d);
    }
    squares = add_d(squares, (double)reduce16(block));
  }
  for (; i < n; ++i) {
    const float d = sub(x[i], mean);
    y[i] = d;
    squares = add_d(squares, (double)mul(d, d));
  }
#if defined(__CUDA_ARCH__)
  const float variance = (float)__ddiv_rn(squares, (double)n);
  const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(variance, eps)));
#else
  const float variance = (float)(squares / (double)n);
  const float scale = 1.0f / std::sqrt(variance + eps);
#endif
  for (int j = 0; j < n; ++j) {  // (b null: a LayerNorm without a bias, Cohere's)
    const float weighted = mul(mul(y[j], scale), w[j]);
    y[j] = b != nullptr ? add(weighted, b[j]) : weighted;
  }
}

// ---- attention (attention.cpp, F16/BF16 caches) --------------------------------------------

HABLAR_RHD float reduce16(const float* a) {
  float b[8], c[4];
  for (int i = 0; i < 8; ++i) b[i] = add(a[i], a[i + 8]);
  for (int i = 0; i < 4; ++i) c[i] = add(b[i], b[i + 4]);
  return add(add(c[0], c[2]), add(c[1], c[3]));
}
HABLAR_RHD void fold64(const float* s, float* t) {
  for (int l = 0; l < 16; ++l) t[l] = add(add(s[l], s[l + 32]), add(s[l + 16], s[l + 48]));
}

HABLAR_RHD float kv_value(const uint16_t* row, int d, bool bf16) {
  return bf16 ? bf16_to_f32(row[d]) : fp16_to_f32(row[d]);
}

// q·k with q already rounded to the cache type; lanes64: the one-token order (64 partial
// sums folded, a tail past the last 64 added in double), else 16 partial sums.
HABLAR_RHD float dot_qk(const float* q, const uint16_t* k, int hd, bool bf16, bool lanes64) {
  if (!lanes64 && hd % 16 == 0) {
    float lanes[16];
    for (int l = 0; l < 16; ++l) lanes[l] = 0.0f;
    for (int d = 0; d < hd; ++d) lanes[d % 16] = fmaf(q[d], kv_value(k, d, bf16), lanes[d % 16]);
    return reduce16(lanes);
  }
  const int main_dims = hd / 64 * 64;
  float part[64], folded[16];
  for (int l = 0; l < 64; ++l) part[l] = 0.0f;
  for (int d = 0; d < main_dims; ++d) part[d % 64] = fmaf(q[d], kv_value(k, d, bf16), part[d % 64]);
  fold64(part, folded);
  double sum = (double)reduce16(folded);
  for (int d = main_dims; d < hd; ++d) sum = add_d(sum, (double)mul(q[d], kv_value(k, d, bf16)));
  return (float)sum;
}

// A score after scaling and the optional soft-cap (cap * tanh(s * (1 / cap))).
HABLAR_RHD float scaled_score(float dot, float scale, float cap) {
  float s = mul(dot, scale);
  if (cap > 0.0f) s = mul(cap, tanhf(mul(s, div(1.0f, cap))));
  return s;
}

// One query head's attention over positions [first, pos] of a paged F16/BF16 cache, in
// pieces a kernel runs in parallel (a thread per position, then per dimension) and
// attend_head() runs in turn; every value is computed by one thread in one order, so both
// give the same bits.
struct HeadView {
  const uint16_t* cache;
  const KvCacheLayout* layout;
  const int32_t* block_table;
  int layer;
  int kv_head;
  HABLAR_RHD const uint16_t* row(int kv, int p) const {
    return cache + layout->position_offset(block_table, layer, kv, kv_head, p);
  }
};

// The weights' normalizer: exps summed in blocks of 16 positions (each reduce16'd in float,
// positions outside [first, pos] as zeros) in double; 1 / sum.
HABLAR_RHD float softmax_inverse(const float* exps, int first, int pos) {
  double sum = 0.0;
  for (int p0 = first / 16 * 16; p0 <= pos; p0 += 16) {
    float block[16];
    for (int i = 0; i < 16; ++i) {
      const int p = p0 + i;
      block[i] = p >= first && p <= pos ? exps[p] : 0.0f;
    }
    sum = add_d(sum, (double)reduce16(block));
  }
#if defined(__CUDA_ARCH__)
  return (float)__ddiv_rn(1.0, sum);
#else
  return (float)(1.0 / sum);
#endif
}

// Output dimension d: weights rounded to the cache type times V, 16 or 64 partial sums by
// position, folded and reduced.
HABLAR_RHD float weighted_v(const HeadView& h, const float* exps, float inv, int first, int pos,
                            int d, bool bf16, bool lanes64) {
  const int rows = lanes64 ? 64 : 16;
  float acc[64];
  for (int r = 0; r < 64; ++r) acc[r] = 0.0f;
  for (int p = first; p <= pos; ++p) {
    const float w = mul(exps[p], inv);
    const float wr = bf16 ? bf16_round(w) : half_round(w);
    acc[p % rows] = fmaf(wr, kv_value(h.row(1, p), d, bf16), acc[p % rows]);
  }
  float lanes[16];
  if (lanes64) {
    fold64(acc, lanes);
  } else {
    for (int l = 0; l < 16; ++l) lanes[l] = acc[l];
  }
  return reduce16(lanes);
}

// The whole head in turn: q [hd] (not yet rounded), scores [pos + 1] scratch, out [hd].
HABLAR_RHD void attend_head(const HeadView& h, const float* q_in, int first, int pos, float scale,
                            float cap, bool lanes64, float* q, float* scores, float* out) {
  const int hd = h.layout->head_dim;
  const bool bf16 = h.layout->dtype == KvDType::BF16;
  for (int d = 0; d < hd; ++d) q[d] = bf16 ? bf16_round(q_in[d]) : half_round(q_in[d]);
  float max_score = -INFINITY;
  for (int p = first; p <= pos; ++p) {
    scores[p] = scaled_score(dot_qk(q, h.row(0, p), hd, bf16, lanes64), scale, cap);
    max_score = fmaxf(max_score, scores[p]);
  }
  for (int p = first; p <= pos; ++p) scores[p] = exp_approx(sub(scores[p], max_score));
  const float inv = softmax_inverse(scores, first, pos);
  for (int d = 0; d < hd; ++d) out[d] = weighted_v(h, scores, inv, first, pos, d, bf16, lanes64);
}

}  // namespace hablar::cpu_rounding
