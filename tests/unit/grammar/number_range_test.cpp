// Bounded JSON numbers: the grammar of number_range_gbnf against the exact decimal predicate,
// for every numeral on a grid (integer parts 0..4, fractions of up to 3 digits, both signs,
// trailing zeros included) and bounds of every kind (inclusive, exclusive, absent, fractional,
// negative, zero).
#include <gtest/gtest.h>

#include <optional>

#include "core/error.h"
#include "grammar/grammar.h"
#include "grammar/number_range.h"
#include "grammar/recognizer.h"

namespace hablar::grammar {
namespace {

bool accepts(const Grammar& g, std::string_view text) {
  Recognizer rec(g);
  RecState s = rec.initial();
  return rec.advance_bytes(s, text) && Recognizer::can_end(s);
}

// Value in thousandths of a numeral "-?k(.fff)?" (fractions of at most 3 digits).
int64_t milli(const Decimal& d) {
  std::string f = d.frac;
  f.resize(3, '0');
  const int64_t v = d.k * 1000 + std::stoll(f);
  return d.neg ? -v : v;
}

std::vector<std::string> numerals() {
  std::vector<std::string> out;
  for (int k = 0; k <= 4; ++k) {
    for (const std::string sign : {"", "-"}) {
      const std::string ks = sign + std::to_string(k);
      if (sign.empty() || k > 0) out.push_back(ks);
      for (int f = 0; f < 1000; f += 7) {
        std::string fs = std::to_string(f);
        fs.insert(0, 3 - fs.size(), '0');
        for (size_t len = 1; len <= 3; ++len) {
          const std::string frac = fs.substr(0, len);
          if (k == 0 && sign == "-" && frac.find_first_not_of('0') == std::string::npos) continue;
          out.push_back(ks + "." + frac);
        }
        if (!(k == 0 && sign == "-" && f == 0)) out.push_back(ks + "." + fs + "0");  // trailing 0
      }
    }
  }
  return out;
}

TEST(NumberRange, MatchesTheExactPredicate) {
  const std::vector<std::string> bounds = {"0",     "0.5", "-0.5",  "1",    "2.25",  "-2.125",
                                           "0.001", "-3",  "3.999", "1e-3", "2.5E0", "-0.0"};
  const auto nums = numerals();
  int checked = 0;
  for (size_t li = 0; li <= bounds.size(); ++li) {
    for (size_t hi_i = 0; hi_i <= bounds.size(); ++hi_i) {
      for (int excl = 0; excl < 4; ++excl) {
        std::optional<NumBound> lo, hi;
        if (li < bounds.size()) lo = NumBound{parse_decimal(bounds[li]), (excl & 1) != 0};
        if (hi_i < bounds.size()) hi = NumBound{parse_decimal(bounds[hi_i]), (excl & 2) != 0};
        auto in = [&](int64_t v) {
          if (lo && (lo->exclusive ? v <= milli(lo->value) : v < milli(lo->value))) return false;
          if (hi && (hi->exclusive ? v >= milli(hi->value) : v > milli(hi->value))) return false;
          return true;
        };
        std::string expr;
        try {
          expr = number_range_gbnf(lo, hi);
        } catch (const Error&) {
          for (const auto& n : nums) EXPECT_FALSE(in(milli(parse_decimal(n)))) << n;
          continue;
        }
        const Grammar g = parse_gbnf("root ::= " + expr + "\n", GbnfSource::kGenerated);
        for (const auto& n : nums) {
          const bool want = in(milli(parse_decimal(n)));
          EXPECT_EQ(accepts(g, n), want)
              << n << " in [" << (lo ? bounds[li] : "-inf") << (excl & 1 ? " excl" : "") << ", "
              << (hi ? bounds[hi_i] : "inf") << (excl & 2 ? " excl" : "") << "]\n"
              << expr;
          if (accepts(g, n) != want) return;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 100000);
}

TEST(NumberRange, NeverWritesNegativeZeroOrExponents) {
  const Grammar g = parse_gbnf(
      "root ::= " + number_range_gbnf(NumBound{parse_decimal("-1"), false}, std::nullopt) + "\n",
      GbnfSource::kGenerated);
  EXPECT_FALSE(accepts(g, "-0"));
  EXPECT_FALSE(accepts(g, "-0.0"));
  EXPECT_FALSE(accepts(g, "1e3"));
  EXPECT_FALSE(accepts(g, "01"));
  EXPECT_TRUE(accepts(g, "-0.25"));
  EXPECT_TRUE(accepts(g, "123456"));
}

TEST(NumberRange, DecimalsAndRefusals) {
  const Decimal d = parse_decimal("-2.50e1");
  EXPECT_TRUE(d.neg);
  EXPECT_EQ(d.k, 25);
  EXPECT_EQ(d.frac, "");
  EXPECT_EQ(parse_decimal("1.5e-3").frac, "0015");
  EXPECT_THROW(parse_decimal("0.3333333333333333"), Error);  // 16 significant digits
  EXPECT_THROW(parse_decimal("1e16"), Error);
  EXPECT_THROW(
      number_range_gbnf(NumBound{parse_decimal("1"), true}, NumBound{parse_decimal("1"), false}),
      Error);
}

}  // namespace
}  // namespace hablar::grammar
