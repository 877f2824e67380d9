#include "engine/step_cost.h"

#include <algorithm>
#include <cmath>

namespace hablar::engine {

namespace {

// Solves the 3x3 system a x = b by Gaussian elimination with partial pivoting; false when
// it is singular (e.g. every step so far had the same shape).
bool solve3(std::array<double, 9> a, std::array<double, 3> b, std::array<double, 3>& x) {
  for (int col = 0; col < 3; ++col) {
    int pivot = col;
    for (int r = col + 1; r < 3; ++r)
      if (std::fabs(a[r * 3 + col]) > std::fabs(a[pivot * 3 + col])) pivot = r;
    if (std::fabs(a[pivot * 3 + col]) < 1e-12) return false;
    if (pivot != col) {
      for (int c = 0; c < 3; ++c) std::swap(a[col * 3 + c], a[pivot * 3 + c]);
      std::swap(b[col], b[pivot]);
    }
    for (int r = col + 1; r < 3; ++r) {
      const double f = a[r * 3 + col] / a[col * 3 + col];
      for (int c = col; c < 3; ++c) a[r * 3 + c] -= f * a[col * 3 + c];
      b[r] -= f * b[col];
    }
  }
  for (int r = 2; r >= 0; --r) {
    double s = b[r];
    for (int c = r + 1; c < 3; ++c) s -= a[r * 3 + c] * x[c];
    x[r] = s / a[r * 3 + r];
  }
  return true;
}

}  // namespace

StepCostModel::StepCostModel(double decay) : decay_(decay) {}

void StepCostModel::observe(int32_t prompt_tokens, int32_t decode_tokens, double ms) {
  if (prompt_tokens + decode_tokens <= 0 || !(ms >= 0)) return;
  const std::array<double, 3> x = {1.0, (double)prompt_tokens, (double)decode_tokens};
  for (double& v : xtx_) v *= decay_;
  for (double& v : xty_) v *= decay_;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) xtx_[i * 3 + j] += x[i] * x[j];
    xty_[i] += x[i] * ms;
  }
  n_observed_ += 1;
  n_with_prompt_ += prompt_tokens > 0 ? 1 : 0;
  n_with_decode_ += decode_tokens > 0 ? 1 : 0;
  refit();
}

void StepCostModel::refit() {
  // A small ridge keeps the system solvable while the steps do not yet vary in both counts
  // (e.g. only decodes of one batch size); it barely moves a well-determined fit.
  std::array<double, 9> a = xtx_;
  const double ridge = 1e-6 * std::max(1.0, a[0]);
  for (int i = 0; i < 3; ++i) a[i * 3 + i] += ridge;
  std::array<double, 3> c{};
  if (!solve3(a, xty_, c)) return;
  // Negative costs are noise in a fit with little spread; a token never makes a step faster.
  for (double& v : c) v = std::max(0.0, v);
  coef_ = c;
}

bool StepCostModel::ready() const {
  return n_with_prompt_ >= 2 && n_with_decode_ >= 2 && n_observed_ >= 4 && coef_[1] > 0;
}

double StepCostModel::predict_ms(int32_t prompt_tokens, int32_t decode_tokens) const {
  return coef_[0] + coef_[1] * prompt_tokens + coef_[2] * decode_tokens;
}

int32_t StepCostModel::prompt_tokens_within(double target_ms, int32_t decode_tokens,
                                            int32_t cap) const {
  const double left = target_ms - predict_ms(0, decode_tokens);
  if (left <= 0 || coef_[1] <= 0) return 0;
  return (int32_t)std::min<double>(cap, std::floor(left / coef_[1]));
}

}  // namespace hablar::engine
