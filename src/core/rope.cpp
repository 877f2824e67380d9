#include "core/rope.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace hablar {
namespace {

// Frequency of pair i after Llama-3 scaling: long wavelengths are divided by `factor`, short
// ones kept, and the band between blended smoothly.
float llama3_scaled_freq(float freq, const RopeParams& p) {
  const float kPi = 3.14159265358979323846f;
  const float wavelen = 2.0f * kPi / freq;
  const float low_freq_wavelen = (float)p.original_context / p.low_freq_factor;
  const float high_freq_wavelen = (float)p.original_context / p.high_freq_factor;
  if (wavelen < high_freq_wavelen) return freq;
  if (wavelen > low_freq_wavelen) return freq / p.factor;
  const float smooth = ((float)p.original_context / wavelen - p.low_freq_factor) /
                       (p.high_freq_factor - p.low_freq_factor);
  return (1.0f - smooth) * freq / p.factor + smooth * freq;
}

// YaRN's correction dimensions [start, end] (floats, as llama.cpp computes them).
void yarn_corr_dims(const RopeParams& p, float dims[2]) {
  const float kPi = 3.14159265358979323846f;
  const auto corr_dim = [&](float n_rot) {
    return (float)p.n_dims * std::log((float)p.original_context / (n_rot * 2.0f * kPi)) /
           (2.0f * std::log(p.freq_base));
  };
  dims[0] = std::max(0.0f, std::floor(corr_dim(p.beta_fast)));
  dims[1] = std::min((float)(p.n_dims - 1), std::ceil(corr_dim(p.beta_slow)));
}

// The extrapolated angle's weight for pair i: 1 below the ramp, 0 above it.
float yarn_ramp(const float dims[2], int i) {
  const float y = ((float)i - dims[0]) / std::max(0.001f, dims[1] - dims[0]);
  return 1.0f - std::min(1.0f, std::max(0.0f, y));
}

}  // namespace

void rope_angles(int pos, const RopeParams& p, float* cos_t, float* sin_t) {
  if (p.n_dims <= 0 || p.n_dims % 2 != 0)
    throw_error(ErrorKind::kInvalidArgument,
                "rope: n_dims " + std::to_string(p.n_dims) + " must be even and positive");
  if (p.scaling != RopeParams::Scaling::kNone && !(p.factor > 0.0f))
    throw_error(ErrorKind::kInvalidArgument, "rope: scaling factor must be > 0");
  const bool factors = !p.freq_factors.empty();
  if (factors &&
      ((int)p.freq_factors.size() != p.n_dims / 2 || p.scaling == RopeParams::Scaling::kLlama3))
    throw_error(ErrorKind::kInvalidArgument, "rope: " + std::to_string(p.freq_factors.size()) +
                                                 " frequency factors for n_dims " +
                                                 std::to_string(p.n_dims) +
                                                 " (one per pair; not with Llama 3 scaling)");
  // theta_i = pos * base^(-2i/n_dims), built by repeated multiplication as the reference does.
  const float theta_scale = std::pow(p.freq_base, -2.0f / (float)p.n_dims);
  float theta = (float)pos;
  float freq = 1.0f;
  float yarn_dims[2] = {0.0f, 0.0f}, mscale = p.attn_factor;
  if (p.scaling == RopeParams::Scaling::kYarn) {
    yarn_corr_dims(p, yarn_dims);
    mscale = p.attn_factor * (1.0f + 0.1f * std::log(1.0f / (1.0f / p.factor)));
  }
  for (int i = 0; i < p.n_dims / 2; ++i) {
    // LongRoPE divides the pair's angle before any scaling (an exact no-op without factors).
    const float extrap = factors ? theta / p.freq_factors[(size_t)i] : theta;
    float angle = extrap;
    if (p.scaling == RopeParams::Scaling::kLinear) {
      angle = (1.0f / p.factor) * extrap;  // llama.cpp's freq_scale * theta
    } else if (p.scaling == RopeParams::Scaling::kLlama3) {
      angle = (float)pos * llama3_scaled_freq(freq, p);
    } else if (p.scaling == RopeParams::Scaling::kYarn) {
      const float interp = (1.0f / p.factor) * extrap;
      const float mix = yarn_ramp(yarn_dims, i);
      angle = interp * (1.0f - mix) + extrap * mix;
    }
    cos_t[i] = std::cos(angle) * mscale;
    sin_t[i] = std::sin(angle) * mscale;
    theta *= theta_scale;
    freq *= theta_scale;
  }
}

}  // namespace hablar
