// Reference (de)quantization of the 32-value block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
// and the Q8_1 activation blocks. Quantization is plain round to nearest with the scale
// taken from the block's extreme value, as the format defines it (no search).
#include <algorithm>
#include <cmath>

#include "core/fp16.h"
#include "core/quant.h"
#include "core/quant_round.h"

// Keep float expressions exactly as written (no fused multiply-add), so that results match
// the format's reference arithmetic bit for bit on every target.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace hablar::qref {
namespace {

constexpr int kHalf = kQK / 2;

// The value of largest magnitude in x[0..n) (the first one on ties), with its sign.
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

float inverse_or_zero(float d) {
  return d != 0.0f ? 1.0f / d : 0.0f;
}

// 5-bit codes: low nibbles packed as in the 4-bit formats, bit 4 of code j in bit j of qh.
void pack_5bit(const uint8_t* codes, uint8_t* qs, uint8_t* qh_bytes) {
  uint32_t qh = 0;
  for (int j = 0; j < kHalf; ++j) {
    qs[j] = (uint8_t)((codes[j] & 0xF) | ((codes[j + kHalf] & 0xF) << 4));
    qh |= (uint32_t)(codes[j] >> 4) << j;
    qh |= (uint32_t)(codes[j + kHalf] >> 4) << (j + kHalf);
  }
  for (int k = 0; k < 4; ++k) qh_bytes[k] = (uint8_t)(qh >> (8 * k));
}

uint32_t load_qh(const uint8_t* qh_bytes) {
  return (uint32_t)qh_bytes[0] | ((uint32_t)qh_bytes[1] << 8) | ((uint32_t)qh_bytes[2] << 16) |
         ((uint32_t)qh_bytes[3] << 24);
}

}  // namespace

void dequantize_q4_0(const BlockQ4_0* x, float* y, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, y += kQK) {
    const BlockQ4_0 blk = x[b];  // a local copy cannot alias y
    const float d = fp16_to_f32(blk.d);
    for (int j = 0; j < kHalf; ++j) {
      y[j] = d * (float)((blk.qs[j] & 0xF) - 8);
      y[j + kHalf] = d * (float)((blk.qs[j] >> 4) - 8);
    }
  }
}

void dequantize_q4_1(const BlockQ4_1* x, float* y, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, y += kQK) {
    const BlockQ4_1 blk = x[b];  // a local copy cannot alias y
    const float d = fp16_to_f32(blk.d);
    const float m = fp16_to_f32(blk.m);
    for (int j = 0; j < kHalf; ++j) {
      y[j] = d * (float)(blk.qs[j] & 0xF) + m;
      y[j + kHalf] = d * (float)(blk.qs[j] >> 4) + m;
    }
  }
}

void dequantize_q5_0(const BlockQ5_0* x, float* y, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, y += kQK) {
    const BlockQ5_0 blk = x[b];  // a local copy cannot alias y
    const float d = fp16_to_f32(blk.d);
    const uint32_t qh = load_qh(blk.qh);
    for (int j = 0; j < kHalf; ++j) {
      const int q0 = (blk.qs[j] & 0xF) | (int)(((qh >> j) & 1u) << 4);
      const int q1 = (blk.qs[j] >> 4) | (int)(((qh >> (j + kHalf)) & 1u) << 4);
      y[j] = d * (float)(q0 - 16);
      y[j + kHalf] = d * (float)(q1 - 16);
    }
  }
}

void dequantize_q5_1(const BlockQ5_1* x, float* y, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, y += kQK) {
    const BlockQ5_1 blk = x[b];  // a local copy cannot alias y
    const float d = fp16_to_f32(blk.d);
    const float m = fp16_to_f32(blk.m);
    const uint32_t qh = load_qh(blk.qh);
    for (int j = 0; j < kHalf; ++j) {
      const int q0 = (blk.qs[j] & 0xF) | (int)(((qh >> j) & 1u) << 4);
      const int q1 = (blk.qs[j] >> 4) | (int)(((qh >> (j + kHalf)) & 1u) << 4);
      y[j] = d * (float)q0 + m;
      y[j + kHalf] = d * (float)q1 + m;
    }
  }
}

void dequantize_q8_0(const BlockQ8_0* x, float* y, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, y += kQK) {
    const BlockQ8_0 blk = x[b];  // a local copy cannot alias y
    const float d = fp16_to_f32(blk.d);
    for (int j = 0; j < kQK; ++j) y[j] = d * (float)blk.qs[j];
  }
}

void dequantize_q8_1(const BlockQ8_1* x, float* y, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, y += kQK) {
    const BlockQ8_1 blk = x[b];  // a local copy cannot alias y
    const float d = fp16_to_f32(blk.d);
    for (int j = 0; j < kQK; ++j) y[j] = d * (float)blk.qs[j];
  }
}

// x = d * (q - 8) with d = -max / 8: the extreme value maps exactly to code 0.
void quantize_q4_0(const float* x, BlockQ4_0* y, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, x += kQK) {
    const float d = signed_absmax(x, kQK) / -8.0f;
    const float id = inverse_or_zero(d);
    y[b].d = f32_to_fp16(d);
    for (int j = 0; j < kHalf; ++j) {
      const int q0 = std::min(15, (int)(x[j] * id + 8.5f));
      const int q1 = std::min(15, (int)(x[j + kHalf] * id + 8.5f));
      y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
  }
}

// x = d * q + m with m = min, d = (max - min) / 15.
void quantize_q4_1(const float* x, BlockQ4_1* y, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, x += kQK) {
    const float min = *std::min_element(x, x + kQK);
    const float max = *std::max_element(x, x + kQK);
    const float d = (max - min) / 15.0f;
    const float id = inverse_or_zero(d);
    y[b].d = f32_to_fp16(d);
    y[b].m = f32_to_fp16(min);
    for (int j = 0; j < kHalf; ++j) {
      const int q0 = std::min(15, (int)((x[j] - min) * id + 0.5f));
      const int q1 = std::min(15, (int)((x[j + kHalf] - min) * id + 0.5f));
      y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
  }
}

void quantize_q5_0(const float* x, BlockQ5_0* y, int64_t n_blocks) {
  uint8_t codes[kQK];
  for (int64_t b = 0; b < n_blocks; ++b, x += kQK) {
    const float d = signed_absmax(x, kQK) / -16.0f;
    const float id = inverse_or_zero(d);
    y[b].d = f32_to_fp16(d);
    for (int j = 0; j < kQK; ++j) codes[j] = (uint8_t)std::min(31, (int)(x[j] * id + 16.5f));
    pack_5bit(codes, y[b].qs, y[b].qh);
  }
}

void quantize_q5_1(const float* x, BlockQ5_1* y, int64_t n_blocks) {
  uint8_t codes[kQK];
  for (int64_t b = 0; b < n_blocks; ++b, x += kQK) {
    const float min = *std::min_element(x, x + kQK);
    const float max = *std::max_element(x, x + kQK);
    const float d = (max - min) / 31.0f;
    const float id = inverse_or_zero(d);
    y[b].d = f32_to_fp16(d);
    y[b].m = f32_to_fp16(min);
    for (int j = 0; j < kQK; ++j) codes[j] = (uint8_t)std::min(31, (int)((x[j] - min) * id + 0.5f));
    pack_5bit(codes, y[b].qs, y[b].qh);
  }
}

// x = d * q, d = max|x| / 127, q rounded half away from zero.
void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, x += kQK) {
    const float d = std::fabs(signed_absmax(x, kQK)) / 127.0f;
    const float id = inverse_or_zero(d);
    y[b].d = f32_to_fp16(d);
    for (int j = 0; j < kQK; ++j) y[b].qs[j] = (int8_t)qround::nearest_away(x[j] * id);
  }
}

// As Q8_0, plus s = d * sum(q) for the *_1 formats' offset term in dot products.
void quantize_q8_1(const float* x, BlockQ8_1* y, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, x += kQK) {
    const float d = std::fabs(signed_absmax(x, kQK)) / 127.0f;
    const float id = inverse_or_zero(d);
    int sum = 0;
    for (int j = 0; j < kQK; ++j) {
      y[b].qs[j] = (int8_t)qround::nearest_away(x[j] * id);
      sum += y[b].qs[j];
    }
    y[b].d = f32_to_fp16(d);
    y[b].s = f32_to_fp16((float)sum * d);
  }
}

}  // namespace hablar::qref
