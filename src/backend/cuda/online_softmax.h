// Online softmax with rescale: the one algorithm every attention path uses (the decode
// kernel, the prefill kernel's row state, the split-K reduce, and the host twin the CI runs).
//
// A running state over scores s_0..s_t keeps   max = max_i s_i   and   sum = sum_i exp(s_i - max),
// and the caller keeps acc = sum_i exp(s_i - max) * v_i. When a new score raises the maximum,
// everything accumulated so far was weighted against the OLD maximum and must be multiplied
// by exp(old_max - new_max): that factor is the "rescale". A rescale stuck at 1 (the old
// maximum aliased to the new one) over-weights early positions and silently corrupts every
// batched decode; HABLAR_ONLINE_SOFTMAX_BREAK_RESCALE compiles exactly that fault so the
// tests can prove they catch it.
//
// This header builds with g++ (host only) and with nvcc (host and device).
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define HABLAR_SOFTMAX_HD __host__ __device__ __forceinline__
#else
#define HABLAR_SOFTMAX_HD inline
#endif

namespace hablar::cuda {

// Running softmax state of one (query head, score stream).
struct SoftmaxState {
  float max;  // largest score so far (-inf when empty)
  float sum;  // sum of exp(score - max)
};

HABLAR_SOFTMAX_HD float softmax_exp(float x) {
#if defined(__CUDA_ARCH__)
  return __expf(x);
#else
  return std::exp(x);
#endif
}

HABLAR_SOFTMAX_HD SoftmaxState softmax_empty() {
  return SoftmaxState{-INFINITY, 0.0f};
}

// exp(old_max - new_max): the factor that re-bases what was accumulated against old_max.
// An empty side (old_max = -inf) contributes nothing, whatever the factor.
HABLAR_SOFTMAX_HD float softmax_rescale(float old_max, float new_max) {
#if defined(HABLAR_ONLINE_SOFTMAX_BREAK_RESCALE)
  (void)old_max;
  (void)new_max;
  return 1.0f;  // the fault under test: old maximum aliased to the new one
#else
  return old_max == -INFINITY ? 0.0f : softmax_exp(old_max - new_max);
#endif
}

// Adds one score. Returns the weight of the new value; *rescale receives the factor the
// caller must apply to its accumulator before adding weight * v.
HABLAR_SOFTMAX_HD float softmax_push(SoftmaxState& state, float score, float* rescale) {
  const float new_max = fmaxf(state.max, score);
  const float factor = softmax_rescale(state.max, new_max);
  const float weight = softmax_exp(score - new_max);
  state.sum = state.sum * factor + weight;
  state.max = new_max;
  *rescale = factor;
  return weight;
}

// Merges state b into state a (two disjoint score sets). The caller combines accumulators
// as acc = acc_a * factor_a + acc_b * factor_b with the returned factors.
struct SoftmaxMerge {
  float factor_a;
  float factor_b;
};
HABLAR_SOFTMAX_HD SoftmaxMerge softmax_merge(SoftmaxState& a, const SoftmaxState& b) {
  const float new_max = fmaxf(a.max, b.max);
  SoftmaxMerge merge{softmax_rescale(a.max, new_max), softmax_rescale(b.max, new_max)};
#if defined(HABLAR_ONLINE_SOFTMAX_BREAK_RESCALE)
  // With the fault compiled in, an empty side must still add nothing.
  if (a.max == -INFINITY) merge.factor_a = 0.0f;
  if (b.max == -INFINITY) merge.factor_b = 0.0f;
#endif
  a.sum = a.sum * merge.factor_a + b.sum * merge.factor_b;
  a.max = new_max;
  return merge;
}

// 1 / sum, or 0 for an empty state (no positions attended: output zeros, never NaN).
HABLAR_SOFTMAX_HD float softmax_inverse_sum(const SoftmaxState& state) {
  return state.sum > 0.0f ? 1.0f / state.sum : 0.0f;
}

}  // namespace hablar::cuda
