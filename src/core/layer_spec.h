// Per-layer facts a forward hands to a backend's ops, in backend-neutral types: how a
// layer's attention is scaled and windowed, which RoPE variant rotates it, and which gated
// activation its feed-forward uses. The model's configuration holds one LayerSpec per layer
// (model/model.h); backends receive the pieces with each op.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

#include "core/tensor_view.h"

namespace hablar {

// The gate's nonlinearity of a gated feed-forward: out = act(x·Wgᵀ) * (x·Wuᵀ).
enum class GluActivation {
  kSilu,      // SwiGLU (llama, qwen): silu(g) = g / (1 + e^-g)
  kGeluTanh,  // GeGLU (gemma): 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))
};

struct AttentionSpec {
  float scale = 1.0f;  // multiplies q·k before the softmax
  // > 0: a query at position p sees keys [p - window + 1, p]; 0: [0, p]. Attention both
  // ways (non-causal embedders) sees [p - window / 2, p + window / 2] instead.
  int32_t window = 0;
  float softcap = 0.0f;  // > 0: scores become softcap * tanh(score / softcap) (Gemma 2)

  // The first position a query at `pos` sees.
  int32_t first_position(int32_t pos) const {
    return window > 0 && pos >= window ? pos - window + 1 : 0;
  }
};

// A layer's mixture of experts, as views: the router [n_experts x n_embd] and each expert's
// SwiGLU matrices. Each token's FFN output is the sum over its n_used likeliest experts
// (softmax over the router's logits, renormalized over the chosen when `normalize`) of
// weight * expert(x); plus, when shared_gate is set (Qwen2-MoE), a shared SwiGLU expert
// scaled by sigmoid(x · shared_gate_inp).
struct ExpertsView {
  const WeightView* router = nullptr;
  std::span<const WeightView> gate;  // [n_ff_expert x n_embd] each
  std::span<const WeightView> up;    // [n_ff_expert x n_embd] each
  std::span<const WeightView> down;  // [n_embd x n_ff_expert] each
  int n_used = 0;
  bool normalize = true;
  const WeightView* shared_gate_inp = nullptr;  // [1 x n_embd]
  const WeightView* shared_gate = nullptr;      // [n_ff_shared x n_embd]
  const WeightView* shared_up = nullptr;        // [n_ff_shared x n_embd]
  const WeightView* shared_down = nullptr;      // [n_embd x n_ff_shared]
};

#if defined(__CUDACC__)
#define HABLAR_SPEC_HD __host__ __device__
#else
#define HABLAR_SPEC_HD
#endif

// Llama 4's attention temperature (Mistral 3): the query rows of a token at position p are
// multiplied by 1 + scale * ln(floor((p + offset) / floor_scale) + 1), which is 1 for the first
// floor_scale positions and grows slowly past them.
struct PositionScale {
  float scale = 0.0f;  // 0: off
  int32_t floor_scale = 1;
  float offset = 0.0f;

  bool active() const { return scale != 0.0f; }
  // In llama.cpp's precisions: the position and its floor in float, the logarithm in double,
  // rounded to float once.
  HABLAR_SPEC_HD float factor(int32_t pos) const {
    const float steps = ::floorf(((float)pos + offset) / (float)floor_scale);
    return (float)(::log((double)steps + 1.0) * (double)scale + 1.0);
  }
};

struct LayerSpec {
  static constexpr int32_t kNoRope = -1;  // the layer's q and k are not rotated (SmolLM3)
  AttentionSpec attention;
  int32_t rope = 0;  // index into ModelConfig::ropes of the RoPE that rotates this layer's q, k
};

}  // namespace hablar
