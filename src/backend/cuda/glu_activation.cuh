// The gated feed-forward's element function out = act(g) * u, one definition for every
// kernel that applies it (ops.cu's swiglu / geglu, the fused gate-up products of
// matmul_q4k_rows.cu), so a fused path rounds exactly as the unfused one.
#pragma once

#include "core/layer_spec.h"

namespace hablar::cuda {

// silu(g) * u.
__device__ __forceinline__ float swiglu_value(float g, float u) {
  return g / (1.0f + expf(-g)) * u;
}

// GELU with the tanh approximation, in float (the CPU's table of half-precision values differs
// from it by at most a half-precision rounding of the result), times u.
__device__ __forceinline__ float geglu_value(float g, float u) {
  constexpr float kCoefA = 0.044715f, kSqrt2OverPi = 0.79788456080286535587989211986876f;
  return 0.5f * g * (1.0f + tanhf(kSqrt2OverPi * g * (1.0f + kCoefA * g * g))) * u;
}

__device__ __forceinline__ float glu_value(GluActivation act, float g, float u) {
  return act == GluActivation::kGeluTanh ? geglu_value(g, u) : swiglu_value(g, u);
}

}  // namespace hablar::cuda
