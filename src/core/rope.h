// Rotary position embedding parameters and angles, shared by every backend: the model's
// configuration holds a RopeParams, and each backend rotates q and k by the angles computed
// here (the CPU per token; the CUDA runner uploads them with the step's inputs), so both
// rotate by the same float angles.
#pragma once

#include <vector>

namespace hablar {

struct RopeParams {
  int n_dims = 0;  // rotated dimensions per head (<= head_dim; the rest pass through)
  float freq_base = 10000.0f;
  bool neox = false;  // pairs (i, i + n_dims/2) instead of (2i, 2i+1)
  enum class Scaling { kNone, kLinear, kLlama3, kYarn } scaling = Scaling::kNone;
  float factor = 1.0f;  // linear: positions divided by factor; llama3: low-frequency divisor;
                        // yarn: the context extension
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_context = 8192;
  // YaRN: dimensions below the beta_fast correction dimension keep their frequency, those
  // above beta_slow's are interpolated (divided by factor), a linear ramp between; cos and
  // sin are multiplied by attn_factor * (1 + 0.1 ln(factor)).
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  // Every scaling: cos and sin multiplied by attn_factor (<arch>.rope.scaling.attn_factor;
  // LongRoPE's sqrt(1 + ln(context / original) / ln(original))).
  float attn_factor = 1.0f;
  // LongRoPE (Phi-3 128k, "su"): one divisor per pair [n_dims / 2], pair i turning by
  // theta_i / freq_factors[i]; the file's short or long factors, chosen by the context the
  // model runs with (model::ropes_for_context). Empty: none.
  std::vector<float> freq_factors;
};

inline constexpr int kMaxRopePairs = 512;

// The rotation angles of position pos as cos_t / sin_t [n_dims / 2], computed as llama.cpp
// does (theta multiplied by base^(-2/n_dims) pair after pair, in float, divided by the pair's
// freq_factor; cosf/sinf). Throws for n_dims odd or <= 0, a scaling factor <= 0, or
// freq_factors of another length than n_dims / 2 (or beside Llama 3 scaling).
void rope_angles(int pos, const RopeParams& p, float* cos_t, float* sin_t);

}  // namespace hablar
