// Bounded JSON numbers as GBNF, exactly in decimal.
//
// A number is a sign, an integer part k (a numeral of int_range_gbnf) and an optional fraction
// ".f". The value range splits into a non-negative part (k(.f)? with lo' <= value <= hi') and
// a negative part ("-" then a magnitude range, strictly above zero so "-0" is never written).
// A magnitude range [lo, hi] over (k, f) splits on k: k == lo.k takes fractions >= lo.frac,
// lo.k < k < hi.k any fraction, k == hi.k fractions <= hi.frac (both when lo.k == hi.k).
// Fractions compare as digit strings padded with zeros; each constraint is built digit by
// digit: at the first digit it pins, a larger (smaller) digit frees the rest, an equal digit
// hands the rest to the same constraint one position on.
#include "grammar/number_range.h"

#include <algorithm>
#include <cctype>
#include <vector>

#include "core/error.h"
#include "grammar/int_range.h"

namespace hablar::grammar {

namespace {

constexpr int kMaxSignificant = 15;

[[noreturn]] void bad(const std::string& what) {
  throw_error(ErrorKind::kInvalidArgument, what);
}

int digits_of(int64_t k) {
  int n = 1;
  while (k >= 10) {
    k /= 10;
    ++n;
  }
  return n;
}

// Alternatives of a fraction constraint: each starts with a digit; `empty` says whether the
// absent fraction (value 0) also satisfies it.
struct Frac {
  std::vector<std::string> alts;
  bool empty = false;
};

std::string any_digits(int room) {
  return room <= 0 ? std::string() : " [0-9]{0," + std::to_string(room) + "}";
}
std::string digit_range(char a, char b) {
  if (a == b) return std::string("\"") + a + "\"";
  return std::string("[") + a + "-" + b + "]";
}
// The rest after a pinned digit: the alternatives, or "" when only the empty rest is left.
std::string rest_of(const Frac& f) {
  if (f.alts.empty()) return "";
  std::string e = " (";
  for (size_t i = 0; i < f.alts.size(); ++i) e += (i ? " | " : " ") + f.alts[i];
  return e + (f.empty ? " | \"\" )" : " )");
}
bool satisfiable(const Frac& f) {
  return f.empty || !f.alts.empty();
}
char at(const std::string& s, size_t i) {
  return i < s.size() ? s[i] : '0';
}

// Fraction digits s (from position i on) with 0.s >= 0.a (> when strict).
Frac frac_ge(const std::string& a, size_t i, bool strict, int room) {
  Frac f;
  if (room <= 0) {
    f.empty = i >= a.size() && !strict;
    return f;
  }
  if (i >= a.size()) {  // the rest of a is zero
    f.empty = !strict;
    if (strict) {
      f.alts.push_back("[1-9]" + any_digits(room - 1));
      const Frac z = frac_ge(a, i + 1, strict, room - 1);
      if (!z.alts.empty()) f.alts.push_back("\"0\"" + rest_of(z));
    } else {
      f.alts.push_back("[0-9]" + any_digits(room - 1));
    }
    return f;
  }
  const char d = a[i];
  if (d < '9') f.alts.push_back(digit_range((char)(d + 1), '9') + any_digits(room - 1));
  const Frac sub = frac_ge(a, i + 1, strict, room - 1);
  if (satisfiable(sub)) f.alts.push_back(std::string("\"") + d + "\"" + rest_of(sub));
  return f;
}

// Fraction digits s with 0.s <= 0.b (< when strict).
Frac frac_le(const std::string& b, size_t i, bool strict, int room) {
  Frac f;
  if (i >= b.size()) {  // the rest of b is zero: only zeros, and only when not strict
    f.empty = !strict;
    if (!strict && room > 0) f.alts.push_back("\"0\"{1," + std::to_string(room) + "}");
    return f;
  }
  f.empty = true;  // b has a nonzero digit from here
  if (room <= 0) return f;
  const char d = b[i];
  if (d > '0') f.alts.push_back(digit_range('0', (char)(d - 1)) + any_digits(room - 1));
  const Frac sub = frac_le(b, i + 1, strict, room - 1);
  if (satisfiable(sub)) f.alts.push_back(std::string("\"") + d + "\"" + rest_of(sub));
  return f;
}

// Fraction digits s with a <= s <= b (each end strict or not), a <= b.
Frac frac_between(const std::string& a, bool sa, const std::string& b, bool sb, size_t i,
                  int room) {
  Frac f;
  f.empty = i >= a.size() && !sa && (i < b.size() || !sb);
  if (i >= a.size() && i >= b.size()) {  // a == b from here
    if (!sa && !sb && room > 0) f.alts.push_back("\"0\"{1," + std::to_string(room) + "}");
    return f;
  }
  if (room <= 0) return f;
  const char da = at(a, i), db = at(b, i);
  if (da == db) {
    const Frac sub = frac_between(a, sa, b, sb, i + 1, room - 1);
    if (satisfiable(sub)) f.alts.push_back(std::string("\"") + da + "\"" + rest_of(sub));
    return f;
  }
  const Frac lo = frac_ge(a, i + 1, sa, room - 1);
  if (satisfiable(lo)) f.alts.push_back(std::string("\"") + da + "\"" + rest_of(lo));
  if (db - da > 1)
    f.alts.push_back(digit_range((char)(da + 1), (char)(db - 1)) + any_digits(room - 1));
  const Frac hi = frac_le(b, i + 1, sb, room - 1);
  if (satisfiable(hi)) f.alts.push_back(std::string("\"") + db + "\"" + rest_of(hi));
  return f;
}

// "k" followed by the fraction constraint, as one alternative ("" when none is possible).
std::string with_frac(const std::string& k, const Frac& f) {
  if (f.alts.empty()) return f.empty ? k : "";
  std::string e = k + " ( \".\" (";
  for (size_t i = 0; i < f.alts.size(); ++i) e += (i ? " | " : " ") + f.alts[i];
  return e + (f.empty ? " ) )?" : " ) )");
}

int frac_cmp(const std::string& a, const std::string& b) {
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i)
    if (at(a, i) != at(b, i)) return at(a, i) < at(b, i) ? -1 : 1;
  return 0;
}

// Magnitudes m = k + 0.f (non-negative) with lo <= m (< when lo.exclusive) and m <= hi.
void magnitude_range(const NumBound& lo, const std::optional<NumBound>& hi,
                     std::vector<std::string>& out) {
  const int64_t lk = lo.value.k;
  auto room = [](int64_t k) { return std::max(1, kMaxSignificant - digits_of(k)); };
  auto push = [&](const std::string& alt) {
    if (!alt.empty()) out.push_back(alt);
  };
  auto numeral = [](int64_t a, std::optional<int64_t> b) { return int_range_gbnf(a, b); };
  if (!hi) {
    push(with_frac(numeral(lk, lk), frac_ge(lo.value.frac, 0, lo.exclusive, room(lk))));
    if (lk < INT64_MAX)
      push(numeral(lk + 1, std::nullopt) + " ( \".\" [0-9]{1," + std::to_string(room(lk + 1)) +
           "} )?");
    return;
  }
  const int64_t hk = hi->value.k;
  if (lk == hk) {
    push(with_frac(numeral(lk, lk), frac_between(lo.value.frac, lo.exclusive, hi->value.frac,
                                                 hi->exclusive, 0, room(lk))));
    return;
  }
  push(with_frac(numeral(lk, lk), frac_ge(lo.value.frac, 0, lo.exclusive, room(lk))));
  if (hk - lk > 1)
    push(numeral(lk + 1, hk - 1) + " ( \".\" [0-9]{1," + std::to_string(room(hk - 1)) + "} )?");
  push(with_frac(numeral(hk, hk), frac_le(hi->value.frac, 0, hi->exclusive, room(hk))));
}

bool is_negative(const Decimal& d) {
  return d.neg && (d.k != 0 || !d.frac.empty());
}

}  // namespace

int decimal_compare(const Decimal& a, const Decimal& b) {
  const bool az = a.k == 0 && a.frac.empty(), bz = b.k == 0 && b.frac.empty();
  const bool an = a.neg && !az, bn = b.neg && !bz;
  if (an != bn) return an ? -1 : 1;
  int c = a.k != b.k ? (a.k < b.k ? -1 : 1) : frac_cmp(a.frac, b.frac);
  return an ? -c : c;
}

Decimal parse_decimal(const std::string& text) {
  size_t i = 0;
  Decimal d;
  if (i < text.size() && text[i] == '-') {
    d.neg = true;
    ++i;
  }
  std::string digits;  // all digits of the mantissa, point at `point`
  int point = -1;
  for (; i < text.size() && (std::isdigit((unsigned char)text[i]) || text[i] == '.'); ++i) {
    if (text[i] == '.') {
      point = (int)digits.size();
    } else {
      digits += text[i];
    }
  }
  if (digits.empty()) bad("not a number: " + text);
  if (point < 0) point = (int)digits.size();
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    try {
      point += std::stoi(text.substr(i + 1));
    } catch (const std::exception&) {
      bad("not a number: " + text);
    }
    i = text.size();
  }
  if (i != text.size()) bad("not a number: " + text);
  const size_t first = digits.find_first_not_of('0');
  const size_t last = digits.find_last_not_of('0');
  if (first == std::string::npos) return {};  // zero
  if ((int)(last - first + 1) > kMaxSignificant)
    bad("the bound " + text + " has more than 15 significant digits");
  if (point > 15) bad("the bound " + text + " is too large to enforce");
  if (point < -30) bad("the bound " + text + " is too small to enforce");
  if (point <= 0) digits.insert(0, (size_t)(-point + 1), '0'), point = 1;
  if ((int)digits.size() < point) digits.append((size_t)point - digits.size(), '0');
  d.k = std::stoll(digits.substr(0, (size_t)point));
  d.frac = digits.substr((size_t)point);
  while (!d.frac.empty() && d.frac.back() == '0') d.frac.pop_back();
  return d;
}

std::string number_range_gbnf(const std::optional<NumBound>& lo,
                              const std::optional<NumBound>& hi) {
  if (lo && hi) {
    const int c = decimal_compare(lo->value, hi->value);
    if (c > 0 || (c == 0 && (lo->exclusive || hi->exclusive)))
      bad("no number lies within the bounds");
  }
  std::vector<std::string> alts;
  // Non-negative values: from max(lo, 0) to hi, when hi >= 0.
  const bool hi_nonneg = !hi || !is_negative(hi->value);
  if (hi_nonneg && !(hi && hi->exclusive && hi->value.k == 0 && hi->value.frac.empty())) {
    NumBound from{};  // 0, included
    if (lo && !is_negative(lo->value)) from = *lo;
    std::optional<NumBound> to;
    if (hi) to = NumBound{Decimal{false, hi->value.k, hi->value.frac}, hi->exclusive};
    magnitude_range(from, to, alts);
  }
  // Negative values: magnitude above max(-hi, 0) (strictly above 0), at most -lo.
  if (!lo || is_negative(lo->value)) {
    NumBound from{Decimal{}, true};
    if (hi && is_negative(hi->value))
      from = NumBound{Decimal{false, hi->value.k, hi->value.frac}, hi->exclusive};
    std::optional<NumBound> to;
    if (lo) to = NumBound{Decimal{false, lo->value.k, lo->value.frac}, lo->exclusive};
    std::vector<std::string> neg;
    magnitude_range(from, to, neg);
    for (const std::string& a : neg) alts.push_back("\"-\" " + a);
  }
  if (alts.empty()) bad("no number lies within the bounds");
  std::string e = "(";
  for (size_t i = 0; i < alts.size(); ++i) e += (i ? " | " : " ") + alts[i];
  return e + " )";
}

}  // namespace hablar::grammar
