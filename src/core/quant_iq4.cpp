// Reference (de)quantization of the non-linear 4-bit formats IQ4_NL (blocks of 32, one half
// scale) and IQ4_XS (super-blocks of 256: a half scale and a signed 6-bit scale per 32).
// Codes index the fixed codebook kIQ4NLValues; quantization searches the group scale that
// best fits the codebook (weighted least squares over 15 candidate scales).
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

constexpr int kGroup = 32;           // values per scale in both formats
constexpr int kScaleTries = 7;       // candidate scales searched on each side of the first
constexpr float kGroupEps = 1e-15f;  // below this a group is all zeros

// Index of the codebook entry nearest to v (the lower one on ties).
int nearest_code(float v) {
  const int8_t* values = kIQ4NLValues;
  if (v <= values[0]) return 0;
  if (v >= values[15]) return 15;
  int lo = 0, hi = 15;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (v < values[mid]) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return v - values[hi - 1] < values[hi] - v ? hi - 1 : hi;
}

// Best scale for x[0..32) ~= scale * kIQ4NLValues[code], weights x^2: starts from the scale
// mapping the extreme value to the codebook's end (-127), then tries the inverse scales
// (k - 127) / max for k in [-7, 7], keeping the least-squares scale of the best code choice.
float fit_group_scale(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kGroup; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  if (amax < kGroupEps) return 0.0f;
  auto fit = [&](float inverse_scale, float* sum_qx, float* sum_q2) {
    *sum_qx = 0.0f;
    *sum_q2 = 0.0f;
    for (int j = 0; j < kGroup; ++j) {
      const float q = (float)kIQ4NLValues[nearest_code(inverse_scale * x[j])];
      const float w = x[j] * x[j];
      *sum_qx += w * q * x[j];
      *sum_q2 += w * q * q;
    }
  };
  float sum_qx, sum_q2;
  fit(1.0f / (-max / (float)kIQ4NLValues[0]), &sum_qx, &sum_q2);
  float scale = sum_q2 > 0.0f ? sum_qx / sum_q2 : 0.0f;
  float best = scale * sum_qx;
  for (int k = -kScaleTries; k <= kScaleTries; ++k) {
    fit(((float)k + (float)kIQ4NLValues[0]) / max, &sum_qx, &sum_q2);
    if (sum_q2 > 0.0f && sum_qx * sum_qx > best * sum_q2) {
      scale = sum_qx / sum_q2;
      best = scale * sum_qx;
    }
  }
  return scale;
}

// Codes of 32 values at scale d, packed: value j in the low nibble of qs[j], j + 16 high.
void pack_codes(const float* x, float d, uint8_t* qs) {
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < kGroup / 2; ++j)
    qs[j] = (uint8_t)(nearest_code(id * x[j]) | (nearest_code(id * x[j + kGroup / 2]) << 4));
}

}  // namespace

void dequantize_iq4_nl(const BlockIQ4_NL* x, float* y, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, y += kQK) {
    const BlockIQ4_NL blk = x[b];  // a local copy cannot alias y
    const float d = fp16_to_f32(blk.d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * (float)kIQ4NLValues[blk.qs[j] & 0xF];
      y[j + kQK / 2] = d * (float)kIQ4NLValues[blk.qs[j] >> 4];
    }
  }
}

void dequantize_iq4_xs(const BlockIQ4_XS* x, float* y, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const BlockIQ4_XS blk = x[b];  // a local copy cannot alias y
    const float d = fp16_to_f32(blk.d);
    for (int g = 0; g < kQK_K / kGroup; ++g, y += kGroup) {
      const float dl = d * (float)iq4xs_scale(blk, g);
      const uint8_t* qs = blk.qs + 16 * g;
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * (float)kIQ4NLValues[qs[j] & 0xF];
        y[j + 16] = dl * (float)kIQ4NLValues[qs[j] >> 4];
      }
    }
  }
}

void quantize_iq4_nl(const float* x, BlockIQ4_NL* y, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, x += kQK) {
    const float scale = fit_group_scale(x);
    y[b].d = f32_to_fp16(scale);
    pack_codes(x, scale, y[b].qs);
  }
}

// Each group's fitted scale is stored as a signed 6-bit multiple of d = -max_scale / 32
// (max_scale the fitted scale of largest magnitude); codes are then chosen for the scale
// as stored.
void quantize_iq4_xs(const float* x, BlockIQ4_XS* y, int64_t n_blocks) {
  constexpr int kGroups = kQK_K / kGroup;
  float scales[kGroups];
  for (int64_t b = 0; b < n_blocks; ++b, x += kQK_K) {
    BlockIQ4_XS& out = y[b];
    float max_scale = 0.0f, amax_scale = 0.0f;
    for (int g = 0; g < kGroups; ++g) {
      scales[g] = fit_group_scale(x + kGroup * g);
      if (std::fabs(scales[g]) > amax_scale) {
        amax_scale = std::fabs(scales[g]);
        max_scale = scales[g];
      }
    }
    const float d = -max_scale / 32.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out.d = f32_to_fp16(d);
    out.scales_h = 0;
    std::memset(out.scales_l, 0, sizeof out.scales_l);
    for (int g = 0; g < kGroups; ++g) {
      const int l = std::clamp(qround::nearest_even(id * scales[g]), -32, 31);
      pack_codes(x + kGroup * g, d * (float)l, out.qs + 16 * g);
      const int biased = l + 32;
      out.scales_l[g / 2] |= (uint8_t)((biased & 0xF) << (4 * (g % 2)));
      out.scales_h |= (uint16_t)((biased >> 4) << (2 * g));
    }
  }
}

}  // namespace hablar::qref
