// What one engine step costs on this executor, learned from the steps themselves.
//
// A step's wall time is modelled as  ms = base + per_prompt * P + per_decode * D  (P prompt
// tokens, D decode tokens). The base is what any forward pays regardless of its width (on a
// CPU, streaming the weights once; on a GPU, launches); the per-token costs are the matmul
// rows, with the decode rows also carrying attention over their whole context. The three
// coefficients are a least-squares fit over exponentially weighted past steps, so they follow
// the machine as contexts grow or other work shares it. Nothing is read from the environment:
// each executor's costs are what its own steps measured.
#pragma once

#include <array>
#include <cstdint>

namespace hablar::engine {

class StepCostModel {
 public:
  // `decay`: the weight a past step keeps per new observation (0.95: ~20 steps of memory).
  explicit StepCostModel(double decay = 0.95);

  void observe(int32_t prompt_tokens, int32_t decode_tokens, double ms);
  // Whether enough varied steps were seen (some with prompt tokens, some with decodes) for
  // the fit to price both kinds of token.
  bool ready() const;
  double predict_ms(int32_t prompt_tokens, int32_t decode_tokens) const;
  // The most prompt tokens that fit beside `decode_tokens` decodes in `target_ms` (0 when the
  // decodes alone reach it; capped at `cap`). Only meaningful when ready().
  int32_t prompt_tokens_within(double target_ms, int32_t decode_tokens, int32_t cap) const;

  double base_ms() const { return coef_[0]; }
  double per_prompt_ms() const { return coef_[1]; }
  double per_decode_ms() const { return coef_[2]; }
  int64_t n_observed() const { return n_observed_; }

 private:
  void refit();

  double decay_;
  std::array<double, 9> xtx_{};  // weighted sum of x x^T, x = (1, P, D)
  std::array<double, 3> xty_{};  // weighted sum of x * ms
  std::array<double, 3> coef_{};
  int64_t n_observed_ = 0;
  int64_t n_with_prompt_ = 0;
  int64_t n_with_decode_ = 0;
};

}  // namespace hablar::engine
