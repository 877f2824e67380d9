// Integer ranges as GBNF: decimal numerals (no leading zeros, "-" for negatives) of exactly
// the integers in [lo, hi]. Built digit by digit: numerals of one length between two bounds
// split at the first digit where the bounds differ into (low digit, rest >= low's rest),
// (digits strictly between, anything), (high digit, rest <= high's rest).
#include "grammar/int_range.h"

#include <string>
#include <vector>

#include "core/error.h"

namespace hablar::grammar {

namespace {

constexpr int kMaxDigits = 18;  // numerals longer than this are not offered

std::string digit_class(char a, char b) {
  if (a == b) return std::string("\"") + a + "\"";
  return std::string("[") + a + "-" + b + "]";
}

// Numerals of a's length between a and b (same length, a <= b), as alternatives.
void same_length(const std::string& a, const std::string& b, const std::string& prefix,
                 std::vector<std::string>& out) {
  if (a.empty()) {
    out.push_back(prefix.empty() ? "\"\"" : prefix);
    return;
  }
  const auto join = [&](const std::string& x) { return prefix.empty() ? x : prefix + " " + x; };
  if (a[0] == b[0]) {
    same_length(a.substr(1), b.substr(1), join(digit_class(a[0], a[0])), out);
    return;
  }
  const size_t rest = a.size() - 1;
  const std::string any_rest = rest == 0 ? "" : " [0-9]{" + std::to_string(rest) + "}";
  const bool a_rest_min = a.find_first_not_of('0', 1) == std::string::npos;
  const bool b_rest_max = b.find_first_not_of('9', 1) == std::string::npos;
  char mid_lo = a[0], mid_hi = b[0];
  if (!a_rest_min) {
    same_length(a.substr(1), std::string(rest, '9'), join(digit_class(a[0], a[0])), out);
    mid_lo = (char)(a[0] + 1);
  }
  if (!b_rest_max) mid_hi = (char)(b[0] - 1);
  if (mid_lo <= mid_hi) out.push_back(join(digit_class(mid_lo, mid_hi) + any_rest));
  if (!b_rest_max)
    same_length(std::string(rest, '0'), b.substr(1), join(digit_class(b[0], b[0])), out);
}

uint64_t pow10(int n) {
  uint64_t v = 1;
  for (int i = 0; i < n; ++i) v *= 10;
  return v;
}

// Alternatives for non-negative numerals in [lo, hi]; hi < 0 means no upper bound.
void non_negative(uint64_t lo, std::optional<uint64_t> hi, std::vector<std::string>& out) {
  const int lo_digits = (int)std::to_string(lo).size();
  const int hi_digits = hi ? (int)std::to_string(*hi).size() : kMaxDigits;
  for (int d = lo_digits; d <= hi_digits; ++d) {
    const uint64_t first = d == 1 ? 0 : pow10(d - 1);
    const uint64_t last = pow10(d) - 1;
    const uint64_t a = std::max(lo, first);
    const uint64_t b = hi ? std::min(*hi, last) : last;
    if (a > b) continue;
    if (!hi && a == first && d > lo_digits) {  // every longer numeral: one alternative
      out.push_back("[1-9] [0-9]{" + std::to_string(d - 1) + "," + std::to_string(kMaxDigits - 1) +
                    "}");
      return;
    }
    same_length(std::to_string(a), std::to_string(b), "", out);
  }
}

std::string alternatives(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? " | " : "") + v[i];
  return s;
}

}  // namespace

std::string int_range_gbnf(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  if (lo && hi && *lo > *hi) throw_error(ErrorKind::kInvalidArgument, "an empty integer range");
  std::vector<std::string> pos, neg;
  // Negative part: "-" then magnitudes in [max(1, -hi), -lo].
  if (!lo || *lo < 0) {
    const uint64_t mlo = (hi && *hi < 0) ? (uint64_t)(-*hi) : 1;
    std::optional<uint64_t> mhi;
    if (lo) mhi = (uint64_t)(-*lo);
    non_negative(mlo, mhi, neg);
  }
  if (!hi || *hi >= 0) {
    const uint64_t plo = (lo && *lo > 0) ? (uint64_t)*lo : 0;
    std::optional<uint64_t> phi;
    if (hi) phi = (uint64_t)*hi;
    non_negative(plo, phi, pos);
  }
  std::string s;
  if (!neg.empty()) s = "\"-\" ( " + alternatives(neg) + " )";
  if (!pos.empty()) s += (s.empty() ? "" : " | ") + alternatives(pos);
  return "( " + s + " )";
}

}  // namespace hablar::grammar
