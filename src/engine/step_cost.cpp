#include "engine/step_cost.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace hablar::engine {

StepCostModel::StepCostModel(double decay) : decay_(decay) {}

int StepCostModel::width_class(int32_t width) {
  return std::min(kWidthClasses - 1, (int)std::bit_width((uint32_t)std::max(1, width)) - 1);
}

void StepCostModel::observe(int32_t prompt_tokens, int32_t decode_tokens, double ms,
                            int32_t verify_tokens) {
  if (prompt_tokens < 0 || decode_tokens < 0 || verify_tokens < 0 ||
      prompt_tokens + decode_tokens + verify_tokens == 0 || !(ms >= 0))
    return;
  if (verify_tokens > 0) {
    // Verification rows beside decodes alone teach their own price (once the decode line is
    // known); beside prompt tokens they are taken off at their price and the rest is the
    // prompt tokens' (before any price is known, the step is not used at all).
    const bool decodes_known = n_decode_fit_ >= 2;
    if (prompt_tokens == 0) {
      if (!decodes_known) return;
      n_observed_ += 1;
      const double per = std::max(0.0, ms - decode_ms(decode_tokens)) / verify_tokens;
      constexpr double kVerifyDecay = 0.8;  // per verification step: ~5 steps
      verify_ms_ = n_verify_ == 0 ? per : kVerifyDecay * verify_ms_ + (1 - kVerifyDecay) * per;
      n_verify_ += 1;
      return;
    }
    const double per = per_verify_ms(verify_tokens);
    if (!(per > 0)) return;
    ms = std::max(0.0, ms - verify_tokens * per);
  }
  n_observed_ += 1;
  if (prompt_tokens == 0) {
    n_decode_only_ += 1;
    observe_decodes(decode_tokens, ms);
    return;
  }
  // Until the decode line is known, a step of decodes beside prompt tokens teaches it with
  // the prompt tokens' priced share taken off (a server busy from the start may run no
  // decode-only step for a long while).
  if (decode_tokens > 0 && n_decode_fit_ < 2) {
    const double per = per_prompt_ms(prompt_tokens);
    if (per > 0) observe_decodes(decode_tokens, std::max(0.0, ms - prompt_tokens * per));
    return;
  }
  // What the prompt tokens added beyond the decodes (or, with no decodes, beyond the base).
  const double extra = std::max(0.0, ms - decode_ms(decode_tokens));
  const size_t k = (size_t)width_class(prompt_tokens);
  double& m = prompt_ms_[k];
  const double per_token = extra / prompt_tokens;
  // A width's first steps can pay one-time costs no flag shows (a GPU loads each kernel on
  // its first launch): until a few were seen its price is the cheapest of them. A price too
  // high would keep the scheduler from chunks of that width, so it would never be corrected;
  // one too low is corrected by the next steps of that width. (A price of 0, prompt tokens
  // that cost nothing measurable, counts as none yet: the next step of the width sets it.)
  if (m == 0)
    m = per_token;
  else if (n_prompt_class_[k] < kFirstSteps)
    m = std::min(m, per_token);
  else
    m = decay_ * m + (1 - decay_) * per_token;
  n_prompt_class_[k] += 1;
  n_with_prompt_ += 1;
  observe_excess(prompt_tokens, extra);
}

// Weighted least squares of excess = overhead + marginal * P, refitted only while the widths
// seen differ enough to tell the two apart (else the last fit stands).
void StepCostModel::observe_excess(int32_t prompt_tokens, double extra_ms) {
  const double p = prompt_tokens;
  for (double& v : excess_) v *= decay_;
  excess_[0] += 1;
  excess_[1] += p;
  excess_[2] += p * p;
  excess_[3] += extra_ms;
  excess_[4] += p * extra_ms;
  const double a = excess_[0], b = excess_[1], c = excess_[2];
  const double det = a * c - b * b;
  if (!(det > 1e-2 * a * c)) return;  // widths' spread under 10% of their size
  marginal_ms_ = std::max(0.0, (a * excess_[4] - b * excess_[3]) / det);
  overhead_ms_ = std::max(0.0, (excess_[3] - b * marginal_ms_) / a);
}

int32_t StepCostModel::efficient_prompt_tokens(int32_t cap) const {
  if (!(overhead_ms_ > 0) || !(marginal_ms_ > 0) || cap <= 0) return 0;
  return (int32_t)std::min<double>(cap, std::ceil(overhead_ms_ / marginal_ms_ - 1e-6));
}

void StepCostModel::observe_decodes(int32_t decode_tokens, double ms) {
  const double d = decode_tokens;
  for (double& v : xtx_) v *= decay_;
  for (double& v : xty_) v *= decay_;
  xtx_[0] += 1;
  xtx_[1] += d;
  xtx_[2] += d;
  xtx_[3] += d * d;
  xty_[0] += ms;
  xty_[1] += d * ms;
  // 2x2 least squares; a small ridge on the slope keeps it solvable while every step so far
  // had the same batch size (then the base carries the whole cost).
  const double a = xtx_[0], b = xtx_[1], c = xtx_[3] + 1e-6 * std::max(1.0, xtx_[3]);
  const double det = a * c - b * b;
  if (det > 0) {
    coef_[1] = std::max(0.0, (a * xty_[1] - b * xty_[0]) / det);
    coef_[0] = std::max(0.0, (xty_[0] - b * coef_[1]) / a);
  }
  n_decode_fit_ += 1;
}

bool StepCostModel::ready() const {
  return n_decode_fit_ >= 2 && n_with_prompt_ >= 1;
}

double StepCostModel::decode_ms(int32_t decode_tokens) const {
  return coef_[0] + coef_[1] * decode_tokens;
}

double StepCostModel::per_prompt_ms(int32_t width) const {
  const int k = width_class(width);
  for (int d = 0; d < kWidthClasses; ++d) {
    if (k - d >= 0 && prompt_ms_[(size_t)(k - d)] > 0) return prompt_ms_[(size_t)(k - d)];
    if (k + d < kWidthClasses && prompt_ms_[(size_t)(k + d)] > 0)
      return prompt_ms_[(size_t)(k + d)];
  }
  return 0;
}

double StepCostModel::per_verify_ms(int32_t width) const {
  return n_verify_ > 0 ? verify_ms_ : per_prompt_ms(width);
}

double StepCostModel::predict_ms(int32_t prompt_tokens, int32_t decode_tokens,
                                 int32_t verify_tokens) const {
  double ms = decode_ms(decode_tokens);
  if (prompt_tokens > 0) ms += prompt_tokens * per_prompt_ms(prompt_tokens);
  if (verify_tokens > 0) ms += verify_tokens * per_verify_ms(verify_tokens);
  return ms;
}

int32_t StepCostModel::prompt_tokens_within(double target_ms, int32_t decode_tokens,
                                            int32_t cap) const {
  const double left = target_ms - decode_ms(decode_tokens);
  if (left <= 0 || cap <= 0) return 0;
  // From the widest class down: the first width whose own price fits.
  for (int k = kWidthClasses - 1; k >= 0; --k) {
    const int32_t lo = 1 << k;
    if (lo > cap) continue;
    const double per = per_prompt_ms(lo);
    if (per <= 0) return cap;  // prompt tokens measured as free: only the cap binds
    const int32_t hi = k == kWidthClasses - 1 ? cap : std::min(cap, (lo << 1) - 1);
    const int32_t fit = (int32_t)std::min<double>(hi, std::floor(left / per + 1e-3));
    if (fit >= lo) return fit;
  }
  return 0;
}

}  // namespace hablar::engine
