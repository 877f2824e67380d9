// DRY penalties (dry_penalty.h). With r(i) the token i places from the end of the window:
//   1. the latest breaker in the window bounds how far back a match of the end may reach;
//   2. z[k] (the Z-function of r) is how many tokens before position k, read backwards, equal
//      the window's last tokens: the sequence ending at k repeats the window's end;
//   3. the token that followed it, r(k - 1), would extend that repetition by one.
#include "engine/dry_penalty.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace hablar::engine {

bool DryBreakers::breaks_alone(int32_t token) const {
  auto [first, last] = heads.equal_range(token);
  for (auto it = first; it != last; ++it)
    if (it->second.empty()) return true;
  return false;
}

void DryParams::validate() const {
  auto bad = [](const std::string& m) { throw_error(ErrorKind::kInvalidArgument, m); };
  if (!std::isfinite(multiplier) || multiplier < 0.0f) bad("dry_multiplier must be >= 0");
  if (!std::isfinite(base)) bad("dry_base must be finite");
  if (allowed_length < 0) bad("dry_allowed_length must be >= 0");
  if (penalty_last_n < -1) bad("dry_penalty_last_n must be >= -1 (-1: all the history)");
}

namespace {

// How many of the window's last tokens a match may cover: up to the most recent complete
// breaker (its head at distance i from the end, its tail after it).
int32_t repetition_limit(const DryBreakers* breakers, std::span<const int32_t> window) {
  const int32_t n = (int32_t)window.size();
  if (breakers == nullptr) return n;
  auto r = [&](int32_t i) { return window[(size_t)(n - 1 - i)]; };
  for (int32_t i = 0; i < n; ++i) {
    auto [first, last] = breakers->heads.equal_range(r(i));
    int32_t longest = -1;
    for (auto it = first; it != last; ++it) {
      const int32_t tail = (int32_t)it->second.size();
      if (tail <= longest || tail > i) continue;
      bool match = true;
      for (int32_t k = 0; k < tail && match; ++k) match = it->second[(size_t)k] == r(i - 1 - k);
      if (match) longest = tail;
    }
    if (longest >= 0) return i - longest;
  }
  return n;
}

// z[k]: length of the longest common prefix of r and r shifted by k (z[0] unused).
std::vector<int32_t> z_function(std::span<const int32_t> window) {
  const int32_t n = (int32_t)window.size();
  auto r = [&](int32_t i) { return window[(size_t)(n - 1 - i)]; };
  std::vector<int32_t> z((size_t)n, 0);
  for (int32_t k = 1, left = 0, right = 0; k < n; ++k) {
    int32_t len = k < right ? std::min(right - k, z[(size_t)(k - left)]) : 0;
    while (k + len < n && r(len) == r(k + len)) ++len;
    z[(size_t)k] = len;
    if (k + len > right) left = k, right = k + len;
  }
  return z;
}

}  // namespace

std::unordered_map<int32_t, float> dry_penalties(const DryParams& p,
                                                 std::span<const int32_t> history) {
  std::unordered_map<int32_t, float> out;
  if (!p.on()) return out;
  const size_t n =
      p.penalty_last_n < 0 ? history.size() : std::min(history.size(), (size_t)p.penalty_last_n);
  if ((int64_t)n <= p.allowed_length) return out;
  const std::span<const int32_t> window = history.subspan(history.size() - n);
  const int32_t limit = repetition_limit(p.breakers.get(), window);
  if (limit < p.allowed_length) return out;

  const std::vector<int32_t> z = z_function(window);
  std::unordered_map<int32_t, int32_t> longest;  // token -> longest repetition it extends
  for (size_t k = 1; k < n; ++k) {
    const int32_t len = std::min(z[k], limit);
    if (len < p.allowed_length) continue;
    const int32_t next = window[n - k];  // r(k - 1): what followed the earlier occurrence
    int32_t& best = longest[next];
    best = std::max(best, len);
  }
  // base^exponent stays below FLT_MAX: exponent <= ln(FLT_MAX) / ln(base).
  const int32_t max_exponent = p.base > 1.000001f ? (int32_t)(88.7228391f / std::log(p.base)) : 0;
  for (const auto& [token, len] : longest) {
    if (p.breakers && p.breakers->breaks_alone(token)) continue;
    int32_t exponent = len - p.allowed_length;
    if (max_exponent > 0) exponent = std::min(exponent, max_exponent);
    out[token] = p.multiplier * std::pow(p.base, (float)exponent);
  }
  return out;
}

}  // namespace hablar::engine
