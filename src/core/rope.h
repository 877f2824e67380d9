// Rotary position embedding parameters and angles, shared by every backend: the model's
// configuration holds a RopeParams, and each backend rotates q and k by the angles computed
// here (the CPU per token; the CUDA runner uploads them with the step's inputs), so both
// rotate by the same float angles.
#pragma once

namespace hablar {

struct RopeParams {
  int n_dims = 0;  // rotated dimensions per head (<= head_dim; the rest pass through)
  float freq_base = 10000.0f;
  bool neox = false;  // pairs (i, i + n_dims/2) instead of (2i, 2i+1)
  enum class Scaling { kNone, kLinear, kLlama3 } scaling = Scaling::kNone;
  float factor = 1.0f;  // linear: positions divided by factor; llama3: low-frequency divisor
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_context = 8192;
};

inline constexpr int kMaxRopePairs = 512;

// The rotation angles of position pos as cos_t / sin_t [n_dims / 2], computed as llama.cpp
// does (theta multiplied by base^(-2/n_dims) pair after pair, in float; cosf/sinf). Throws
// for n_dims odd or <= 0, or a scaling factor <= 0.
void rope_angles(int pos, const RopeParams& p, float* cos_t, float* sin_t);

}  // namespace hablar
