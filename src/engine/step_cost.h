// What one engine step costs on this executor, learned from the steps themselves (what a
// step adds between two tokens of a stream: its wall time one step at a time, its device
// span when the next step was launched before it was collected; Engine::collect).
//
// Two parts, because they scale differently:
//   - the decodes: a step of D decodes alone costs  base + per_decode * D  (the base is what
//     any forward pays whatever its width: on a CPU, streaming the weights once; on a GPU,
//     launches), a least-squares fit over exponentially weighted decode-only steps (and,
//     until there are two of those, mixed steps less their prompt tokens' priced share);
//   - the prompt tokens added to a step: their cost per token depends on the chunk width (a
//     handful of rows runs the matmuls far less efficiently than hundreds), so it is tracked
//     per width class (powers of two), as an exponentially weighted mean of what a step cost
//     beyond its decodes' prediction, per prompt token. The same excess is also fitted as a
//     line in the prompt tokens, overhead + marginal * P: the overhead is what any step with
//     prompt tokens pays beyond a decode-only one (on a GPU, decode-only steps replay CUDA
//     graphs while the others launch every kernel), and a step that pays it should carry
//     enough prompt tokens to be worth it (efficient_prompt_tokens).
//   - a speculative verification chunk's drafted tokens (speculation.h): rows in the
//     one-token order with a logits row each, priced apart from prompt tokens (at a 1.5k
//     context on 2 CPU threads one costs about 3x a prompt token in a chunk of 512), as one
//     exponentially weighted price per row over every verification step whatever its width,
//     so that no draft length is shut out by one noisy step of its width.
// Both follow the machine as contexts grow or other work shares it. Nothing is read from the
// environment: each executor's costs are what its own steps measured.
#pragma once

#include <array>
#include <cstdint>

namespace hablar::engine {

class StepCostModel {
 public:
  // `decay`: the weight a past observation keeps per new one of its kind (0.98: ~50 steps).
  explicit StepCostModel(double decay = 0.98);

  // `verify_tokens`: drafted tokens verified in the step (beside its decodes, which count
  // each verification chunk's first token).
  void observe(int32_t prompt_tokens, int32_t decode_tokens, double ms, int32_t verify_tokens = 0);
  // Whether both parts have been seen (decode-only steps, and steps with prompt tokens).
  bool ready() const;
  double decode_ms(int32_t decode_tokens) const;  // a step of only these decodes
  double predict_ms(int32_t prompt_tokens, int32_t decode_tokens, int32_t verify_tokens = 0) const;
  // The cost of one drafted token in a verification chunk of `width` (the prompt price of
  // that width until a verification step was seen).
  double per_verify_ms(int32_t width) const;
  int64_t n_verify_steps() const { return n_verify_; }
  // The most prompt tokens that fit beside `decode_tokens` decodes in `target_ms` (0 when the
  // decodes alone reach it; at most `cap`). Only meaningful when ready().
  int32_t prompt_tokens_within(double target_ms, int32_t decode_tokens, int32_t cap) const;

  double base_ms() const { return coef_[0]; }
  double per_decode_ms() const { return coef_[1]; }
  // The cost of one prompt token in a chunk of `width` prompt tokens (the nearest measured
  // width class when this one has not been seen, a narrower one first: the dearer guess).
  double per_prompt_ms(int32_t width) const;
  int64_t n_observed() const { return n_observed_; }
  // The line fitted to the prompt tokens' excess (0 until steps of two widths were seen).
  double mixed_overhead_ms() const { return overhead_ms_; }
  double marginal_prompt_ms() const { return marginal_ms_; }
  // The prompt tokens whose marginal cost equals the overhead any step with prompt tokens
  // pays (at most `cap`; 0 without an overhead): a narrower chunk spends more of the step on
  // the overhead than on prompt tokens.
  int32_t efficient_prompt_tokens(int32_t cap) const;
  int64_t n_decode_only() const { return n_decode_only_; }  // decode-only steps seen

  static constexpr int kWidthClasses = 12;  // 1, 2-3, 4-7, ..., 1024 and wider

 private:
  static int width_class(int32_t width);
  void observe_decodes(int32_t decode_tokens, double ms);
  void observe_excess(int32_t prompt_tokens, double extra_ms);

  double decay_;
  std::array<double, 4> xtx_{};  // weighted sums over decode-only steps: 1, D, D, D^2
  std::array<double, 2> xty_{};  // ms, D * ms
  std::array<double, 2> coef_{};
  static constexpr int32_t kFirstSteps = 4;              // a width's steps priced at their cheapest
  std::array<double, kWidthClasses> prompt_ms_{};        // per token; 0: none yet
  std::array<int32_t, kWidthClasses> n_prompt_class_{};  // steps seen of each width class
  int64_t n_observed_ = 0;
  int64_t n_decode_fit_ = 0;  // observations in the decode line
  int64_t n_with_prompt_ = 0;
  std::array<double, 5> excess_{};  // weighted sums over steps with prompt tokens: 1, P, P^2,
                                    // excess ms, P * excess ms
  double overhead_ms_ = 0, marginal_ms_ = 0;
  int64_t n_decode_only_ = 0;
  double verify_ms_ = 0;  // per drafted token; 0: not seen
  int64_t n_verify_ = 0;
};

}  // namespace hablar::engine
