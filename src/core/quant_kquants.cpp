// Reference (de)quantization of the K-quants: 256-value super-blocks split in sub-blocks of
// 16 or 32 values, each with its own small integer scale (and min) relative to one or two
// half-precision super-block scales.
//
// Quantization fits each sub-block first (a search over candidate scales minimising a
// weighted squared error), then quantizes the sub-block scales against the super-block
// scale, then requantizes the values with the scales as they will be decoded.
#include <algorithm>
#include <cmath>
#include <cstring>

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

// Below this magnitude a group is treated as all zeros (its squares would underflow).
constexpr float kGroupEps = 1e-15f;

// Round half to even, as the scale searches need it (the default rounding mode).
int nearest_int(float v) {
  return qround::nearest_even(v);
}
int clamp_int(int v, int lo, int hi) {
  return std::min(hi, std::max(lo, v));
}

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

// Candidate inverse scales for fit_scale_min: (nmax + first + step * k) / (max - min) for
// k = 0..n_steps.
struct ScaleGrid {
  float first;
  float step;
  int n_steps;
};

// Fits x[i] ~= scale * q[i] - offset with q[i] in [0, nmax] and offset >= 0 (the group's
// minimum, clipped at zero, is represented exactly when it is negative), minimising
// sum w[i] * err(i), err the squared (or absolute) difference. For each candidate inverse
// scale the codes are assigned by rounding and (scale, offset) solved by weighted least
// squares. Returns the scale; q and *offset get the best fit's codes and offset.
float fit_scale_min(const float* x, const float* w, int n, int nmax, const ScaleGrid& grid,
                    bool abs_error, uint8_t* q, float* offset) {
  float min = x[0], max = x[0], sum_w = w[0], sum_x = w[0] * x[0];
  for (int i = 1; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(q, q + n, 0);
    *offset = -min;
    return 0.0f;
  }
  auto error_of = [&](const uint8_t* codes, float scale, float lowest) {
    float err = 0.0f;
    for (int i = 0; i < n; ++i) {
      const float diff = scale * (float)codes[i] + lowest - x[i];
      err += w[i] * (abs_error ? std::fabs(diff) : diff * diff);
    }
    return err;
  };
  float iscale = (float)nmax / (max - min);
  float scale = 1.0f / iscale;
  for (int i = 0; i < n; ++i)
    q[i] = (uint8_t)clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
  float best_error = error_of(q, scale, min);
  uint8_t trial[kQK];
  for (int k = 0; k <= grid.n_steps; ++k) {
    iscale = (grid.first + grid.step * (float)k + (float)nmax) / (max - min);
    float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
    for (int i = 0; i < n; ++i) {
      trial[i] = (uint8_t)clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
      const float l = (float)trial[i];
      sum_l += w[i] * l;
      sum_l2 += w[i] * l * l;
      sum_xl += w[i] * l * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (!(det > 0.0f)) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (this_min > 0.0f) {  // the offset may only lower values: refit the scale alone
      this_min = 0.0f;
      this_scale = sum_xl / sum_l2;
    }
    const float err = error_of(trial, this_scale, this_min);
    if (err < best_error) {
      std::copy(trial, trial + n, q);
      best_error = err;
      scale = this_scale;
      min = this_min;
    }
  }
  *offset = -min;
  return scale;
}

// Symmetric fit x[i] ~= scale * l[i], l in [-nmax, nmax - 1], weights x[i]^2: starts from
// rounding at the scale that maps the extreme value to -nmax, then moves single codes while
// that lowers the weighted error (at most 5 sweeps). q[i] = l[i] + nmax. Used by Q3_K.
float fit_symmetric_by_moves(const float* x, int n, int nmax, uint8_t* q) {
  const float max = signed_absmax(x, n);
  if (std::fabs(max) < kGroupEps) {  // all zero: scale 0, codes 0
    std::fill(q, q + n, 0);
    return 0.0f;
  }
  const float iscale = -(float)nmax / max;
  int l[16];
  float sum_lx = 0.0f, sum_l2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    l[i] = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    const float w = x[i] * x[i];
    sum_lx += w * x[i] * (float)l[i];
    sum_l2 += w * (float)l[i] * (float)l[i];
  }
  for (int sweep = 0; sweep < 5; ++sweep) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sum_lx - w * x[i] * (float)l[i];
      if (!(slx > 0.0f)) continue;
      float sl2 = sum_l2 - w * (float)l[i] * (float)l[i];
      const int candidate = clamp_int(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
      if (candidate == l[i]) continue;
      slx += w * x[i] * (float)candidate;
      sl2 += w * (float)candidate * (float)candidate;
      // Better when slx^2 / sl2 (the explained energy) grows.
      if (sl2 > 0.0f && slx * slx * sum_l2 > sum_lx * sum_lx * sl2) {
        l[i] = candidate;
        sum_lx = slx;
        sum_l2 = sl2;
        ++changed;
      }
    }
    if (changed == 0) break;
  }
  for (int i = 0; i < n; ++i) q[i] = (uint8_t)(l[i] + nmax);
  return sum_lx / sum_l2;
}

// Symmetric fit as above, searching 19 inverse scales around nmax / |max| instead of moving
// single codes. Used by Q6_K.
float fit_symmetric_by_grid(const float* x, int n, int nmax, uint8_t* q) {
  const float max = signed_absmax(x, n);
  if (std::fabs(max) < kGroupEps) {  // all zero: scale 0, codes 0
    std::fill(q, q + n, 0);
    return 0.0f;
  }
  float best_scale = 0.0f, best_energy = 0.0f;
  bool have_best = false;
  for (int k : {0, -9, -8, -7, -6, -5, -4, -3, -2, -1, 1, 2, 3, 4, 5, 6, 7, 8, 9}) {
    const float iscale = -((float)nmax + 0.1f * (float)k) / max;
    float sum_lx = 0.0f, sum_l2 = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      const float w = x[i] * x[i];
      sum_lx += w * x[i] * (float)l;
      sum_l2 += w * (float)l * (float)l;
    }
    const bool better =
        !have_best ? true : (sum_l2 > 0.0f && sum_lx * sum_lx > best_energy * sum_l2);
    if (!better) continue;
    for (int i = 0; i < n; ++i)
      q[i] = (uint8_t)(clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1) + nmax);
    best_scale = sum_l2 > 0.0f ? sum_lx / sum_l2 : 0.0f;
    best_energy = best_scale * sum_lx;
    have_best = true;
  }
  return best_scale;
}

// Packs 6-bit (scale, min) pairs into the 12 bytes of Q4_K / Q5_K (inverse of
// kquant_scale_min): pairs 0-3 in the low 6 bits of bytes 0-3 / 4-7, pairs 4-7 as nibbles
// of bytes 8-11 with their top 2 bits in the high bits of bytes 0-7.
void pack_scale_mins(const uint8_t* ls, const uint8_t* lm, uint8_t* packed) {
  std::memset(packed, 0, kKScaleBytes);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      packed[j] = ls[j];
      packed[j + 4] = lm[j];
    } else {
      packed[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
      packed[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
      packed[j] |= (uint8_t)((lm[j] >> 4) << 6);
    }
  }
}

// Shared by Q4_K and Q5_K: fits the 8 sub-blocks of 32, stores d, dmin and the packed
// scales, and leaves in codes the values requantized against the decoded scales.
void quantize_scale_min_superblock(const float* x, int nmax, const ScaleGrid& grid, uint16_t* d_out,
                                   uint16_t* dmin_out, uint8_t* packed, uint8_t* codes) {
  float scales[8], mins[8], weights[32];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0.0f;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32.0f);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = fit_scale_min(xs, weights, 32, nmax, grid, false, codes + 32 * j, &mins[j]);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = (uint8_t)clamp_int(nearest_int(inv_scale * scales[j]), 0, 63);
    lm[j] = (uint8_t)clamp_int(nearest_int(inv_min * mins[j]), 0, 63);
  }
  pack_scale_mins(ls, lm, packed);
  *d_out = f32_to_fp16(max_scale / 63.0f);
  *dmin_out = f32_to_fp16(max_min / 63.0f);
  const float d_all = fp16_to_f32(*d_out), dmin_all = fp16_to_f32(*dmin_out);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    kquant_scale_min(packed, j, &sc, &m);
    const float d = d_all * (float)sc;
    if (d == 0.0f) continue;
    const float dm = dmin_all * (float)m;
    for (int l = 0; l < 32; ++l)
      codes[32 * j + l] = (uint8_t)clamp_int(nearest_int((x[32 * j + l] + dm) / d), 0, nmax);
  }
}

// 2-bit codes of 128 values into 32 bytes: code l + 32k in bits 2k..2k+1 of byte l.
void pack_2bit(const uint8_t* codes, uint8_t* qs) {
  for (int l = 0; l < 32; ++l)
    qs[l] = (uint8_t)((codes[l] & 3) | ((codes[l + 32] & 3) << 2) | ((codes[l + 64] & 3) << 4) |
                      ((codes[l + 96] & 3) << 6));
}

}  // namespace

// ---- dequantization ----------------------------------------------------------------------

// Each routine copies the block to a local first: the output floats cannot alias it then,
// which lets the compiler vectorize the inner loops.

// Sub-block g (16 values) of the 2-bit layouts (Q2_K, Q3_K): bits 2 * ((g % 8) / 2) of
// bytes 32 * (g / 8) + 16 * (g % 2) ... + 15.
inline const uint8_t* two_bit_bytes(const uint8_t* qs, int g) {
  return qs + 32 * (g / 8) + 16 * (g % 2);
}
inline int two_bit_shift(int g) {
  return 2 * ((g % 8) / 2);
}

void dequantize_q2_k(const BlockQ2_K* x, float* y, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const BlockQ2_K blk = x[b];
    const float d = fp16_to_f32(blk.d), dmin = fp16_to_f32(blk.dmin);
    for (int g = 0; g < 16; ++g, y += 16) {
      const float dl = d * (float)(blk.scales[g] & 0xF), ml = dmin * (float)(blk.scales[g] >> 4);
      const uint8_t* q = two_bit_bytes(blk.qs, g);
      const int shift = two_bit_shift(g);
      for (int l = 0; l < 16; ++l) y[l] = dl * (float)((q[l] >> shift) & 3) - ml;
    }
  }
}

void dequantize_q3_k(const BlockQ3_K* x, float* y, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const BlockQ3_K blk = x[b];
    const float d = fp16_to_f32(blk.d);
    for (int g = 0; g < 16; ++g, y += 16) {
      const float dl = d * (float)q3k_scale(blk.scales, g);
      const uint8_t* q = two_bit_bytes(blk.qs, g);
      const uint8_t* hm = blk.hmask + 16 * (g % 2);  // bit g / 2: the value's third bit
      const int shift = two_bit_shift(g), hbit = g / 2;
      for (int l = 0; l < 16; ++l)
        y[l] = dl * (float)(((q[l] >> shift) & 3) - (((hm[l] >> hbit) & 1) ? 0 : 4));
    }
  }
}

// The 8 sub-block multipliers of a Q4_K / Q5_K super-block: x = dl[j] * q - ml[j].
void scale_min_multipliers(uint16_t d_half, uint16_t dmin_half, const uint8_t* packed, float* dl,
                           float* ml) {
  const float d = fp16_to_f32(d_half), dmin = fp16_to_f32(dmin_half);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    kquant_scale_min(packed, j, &sc, &m);
    dl[j] = d * (float)sc;
    ml[j] = dmin * (float)m;
  }
}

void dequantize_q4_k(const BlockQ4_K* x, float* y, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const BlockQ4_K blk = x[b];
    float dl[8], ml[8];
    scale_min_multipliers(blk.d, blk.dmin, blk.scales, dl, ml);
    for (int j = 0; j < 8; ++j, y += 32) {
      const uint8_t* qs = blk.qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) y[l] = dl[j] * (float)((qs[l] >> shift) & 0xF) - ml[j];
    }
  }
}

void dequantize_q5_k(const BlockQ5_K* x, float* y, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const BlockQ5_K blk = x[b];
    float dl[8], ml[8];
    scale_min_multipliers(blk.d, blk.dmin, blk.scales, dl, ml);
    for (int j = 0; j < 8; ++j, y += 32) {
      const uint8_t* qs = blk.qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) {
        const int q = ((qs[l] >> shift) & 0xF) | (((blk.qh[l] >> j) & 1) << 4);
        y[l] = dl[j] * (float)q - ml[j];
      }
    }
  }
}

// Value 128h + 32k + l (k < 4, l < 32): low nibble from ql[64h + l + 32(k % 2)] (the high
// nibble when k >= 2), top 2 bits from bits 2k of qh[32h + l].
void dequantize_q6_k(const BlockQ6_K* x, float* y, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const BlockQ6_K blk = x[b];
    const float d = fp16_to_f32(blk.d);
    for (int g = 0; g < 16; ++g, y += 16) {
      const int half = g / 8, k = (g % 8) / 2, l0 = 16 * (g % 2);
      const uint8_t* ql = blk.ql + 64 * half + 32 * (k % 2) + l0;
      const uint8_t* qh = blk.qh + 32 * half + l0;
      const int low_shift = 4 * (k / 2), high_shift = 2 * k;
      const float dl = d * (float)blk.scales[g];
      for (int l = 0; l < 16; ++l) {
        const int q = ((ql[l] >> low_shift) & 0xF) | (((qh[l] >> high_shift) & 3) << 4);
        y[l] = dl * (float)(q - 32);
      }
    }
  }
}

void dequantize_q8_k(const BlockQ8_K* x, float* y, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, y += kQK_K) {
    const BlockQ8_K blk = x[b];
    for (int i = 0; i < kQK_K; ++i) y[i] = blk.d * (float)blk.qs[i];
  }
}

// ---- quantization ------------------------------------------------------------------------

// 16 sub-blocks of 16 with 4-bit scale and min each (absolute-error fit, weights |x|).
void quantize_q2_k(const float* x, BlockQ2_K* y, int64_t n_blocks) {
  uint8_t codes[kQK_K];
  float weights[16], scales[16], mins[16];
  for (int64_t b = 0; b < n_blocks; ++b, x += kQK_K) {
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = fit_scale_min(x + 16 * j, weights, 16, 3, ScaleGrid{-0.5f, 0.1f, 15}, true,
                                codes + 16 * j, &mins[j]);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    BlockQ2_K& out = y[b];
    const float inv_scale = max_scale > 0.0f ? 15.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0.0f ? 15.0f / max_min : 0.0f;
    for (int j = 0; j < 16; ++j) {
      const int ls = clamp_int(nearest_int(inv_scale * scales[j]), 0, 15);
      const int lm = clamp_int(nearest_int(inv_min * mins[j]), 0, 15);
      out.scales[j] = (uint8_t)(ls | (lm << 4));
    }
    out.d = f32_to_fp16(max_scale / 15.0f);
    out.dmin = f32_to_fp16(max_min / 15.0f);
    const float d_all = fp16_to_f32(out.d), dmin_all = fp16_to_f32(out.dmin);
    for (int j = 0; j < 16; ++j) {
      const float d = d_all * (float)(out.scales[j] & 0xF);
      if (d == 0.0f) continue;
      const float dm = dmin_all * (float)(out.scales[j] >> 4);
      for (int l = 0; l < 16; ++l)
        codes[16 * j + l] = (uint8_t)clamp_int(nearest_int((x[16 * j + l] + dm) / d), 0, 3);
    }
    pack_2bit(codes, out.qs);
    pack_2bit(codes + 128, out.qs + 32);
  }
}

// 16 sub-blocks of 16, symmetric 3-bit codes, signed 6-bit scales.
void quantize_q3_k(const float* x, BlockQ3_K* y, int64_t n_blocks) {
  uint8_t codes[kQK_K];
  float scales[16];
  for (int64_t b = 0; b < n_blocks; ++b, x += kQK_K) {
    BlockQ3_K& out = y[b];
    float max_scale = 0.0f, amax = 0.0f;
    for (int j = 0; j < 16; ++j) {
      scales[j] = fit_symmetric_by_moves(x + 16 * j, 16, 4, codes + 16 * j);
      if (std::fabs(scales[j]) > amax) {
        amax = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    std::memset(out.scales, 0, sizeof out.scales);
    if (max_scale != 0.0f) {
      const float iscale = -32.0f / max_scale;
      for (int j = 0; j < 16; ++j) {
        const int l = clamp_int(nearest_int(iscale * scales[j]), -32, 31) + 32;
        if (j < 8) {
          out.scales[j] = (uint8_t)(l & 0xF);
        } else {
          out.scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
        }
        out.scales[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
      }
      out.d = f32_to_fp16(1.0f / iscale);
    } else {
      out.d = 0;
    }
    const float d_all = fp16_to_f32(out.d);
    for (int j = 0; j < 16; ++j) {
      const float d = d_all * (float)q3k_scale(out.scales, j);
      if (d == 0.0f) continue;
      for (int l = 0; l < 16; ++l)
        codes[16 * j + l] = (uint8_t)(clamp_int(nearest_int(x[16 * j + l] / d), -4, 3) + 4);
    }
    // Bit 2 of code i goes to bit i/32 of hmask[i % 32]; the low 2 bits are packed as Q2_K's.
    std::memset(out.hmask, 0, sizeof out.hmask);
    for (int i = 0; i < kQK_K; ++i) {
      if (codes[i] > 3) {
        out.hmask[i % 32] |= (uint8_t)(1u << (i / 32));
        codes[i] -= 4;
      }
    }
    pack_2bit(codes, out.qs);
    pack_2bit(codes + 128, out.qs + 32);
  }
}

// 8 sub-blocks of 32, 4-bit codes with 6-bit scale and min each.
void quantize_q4_k(const float* x, BlockQ4_K* y, int64_t n_blocks) {
  uint8_t codes[kQK_K];
  for (int64_t b = 0; b < n_blocks; ++b, x += kQK_K) {
    BlockQ4_K& out = y[b];
    quantize_scale_min_superblock(x, 15, ScaleGrid{-1.0f, 0.1f, 20}, &out.d, &out.dmin, out.scales,
                                  codes);
    for (int j = 0; j < kQK_K; j += 64)
      for (int l = 0; l < 32; ++l)
        out.qs[j / 2 + l] = (uint8_t)(codes[j + l] | (codes[j + l + 32] << 4));
  }
}

// As Q4_K with 5-bit codes: the fifth bit of value 32k + l is bit k of qh[l].
void quantize_q5_k(const float* x, BlockQ5_K* y, int64_t n_blocks) {
  uint8_t codes[kQK_K];
  for (int64_t b = 0; b < n_blocks; ++b, x += kQK_K) {
    BlockQ5_K& out = y[b];
    quantize_scale_min_superblock(x, 31, ScaleGrid{-0.5f, 0.1f, 15}, &out.d, &out.dmin, out.scales,
                                  codes);
    std::memset(out.qh, 0, sizeof out.qh);
    for (int i = 0; i < kQK_K; ++i) out.qh[i % 32] |= (uint8_t)((codes[i] >> 4) << (i / 32));
    for (int j = 0; j < kQK_K; j += 64)
      for (int l = 0; l < 32; ++l)
        out.qs[j / 2 + l] = (uint8_t)((codes[j + l] & 0xF) | ((codes[j + l + 32] & 0xF) << 4));
  }
}

// 16 sub-blocks of 16, symmetric 6-bit codes, signed 8-bit scales.
void quantize_q6_k(const float* x, BlockQ6_K* y, int64_t n_blocks) {
  uint8_t codes[kQK_K];
  float scales[16];
  for (int64_t b = 0; b < n_blocks; ++b, x += kQK_K) {
    BlockQ6_K& out = y[b];
    float max_scale = 0.0f, amax = 0.0f;
    for (int j = 0; j < 16; ++j) {
      scales[j] = fit_symmetric_by_grid(x + 16 * j, 16, 32, codes + 16 * j);
      if (std::fabs(scales[j]) > amax) {
        amax = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    if (amax < kGroupEps) {
      std::memset(&out, 0, sizeof out);
      continue;
    }
    const float iscale = -128.0f / max_scale;
    out.d = f32_to_fp16(1.0f / iscale);
    for (int j = 0; j < 16; ++j)
      out.scales[j] = (int8_t)std::min(127, nearest_int(iscale * scales[j]));
    const float d_all = fp16_to_f32(out.d);
    for (int j = 0; j < 16; ++j) {
      const float d = d_all * (float)out.scales[j];
      if (d == 0.0f) continue;
      for (int l = 0; l < 16; ++l)
        codes[16 * j + l] = (uint8_t)(clamp_int(nearest_int(x[16 * j + l] / d), -32, 31) + 32);
    }
    for (int half = 0; half < 2; ++half) {
      const uint8_t* c = codes + 128 * half;
      uint8_t* ql = out.ql + 64 * half;
      uint8_t* qh = out.qh + 32 * half;
      for (int l = 0; l < 32; ++l) {
        ql[l] = (uint8_t)((c[l] & 0xF) | ((c[l + 64] & 0xF) << 4));
        ql[l + 32] = (uint8_t)((c[l + 32] & 0xF) | ((c[l + 96] & 0xF) << 4));
        qh[l] = (uint8_t)((c[l] >> 4) | ((c[l + 32] >> 4) << 2) | ((c[l + 64] >> 4) << 4) |
                          ((c[l + 96] >> 4) << 6));
      }
    }
  }
}

// Activation super-block: x = d * q, the extreme value mapped to -127; bsums for the
// K-quant dot products' min terms.
void quantize_q8_k(const float* x, BlockQ8_K* y, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, x += kQK_K) {
    BlockQ8_K& out = y[b];
    const float max = signed_absmax(x, kQK_K);
    if (max == 0.0f) {
      std::memset(&out, 0, sizeof out);
      continue;
    }
    const float iscale = -127.0f / max;
    for (int i = 0; i < kQK_K; ++i) out.qs[i] = (int8_t)std::min(127, nearest_int(iscale * x[i]));
    for (int j = 0; j < kQK_K / 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += out.qs[16 * j + l];
      out.bsums[j] = (int16_t)sum;
    }
    out.d = 1.0f / iscale;
  }
}

}  // namespace hablar::qref
