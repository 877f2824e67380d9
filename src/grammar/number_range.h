// Bounded JSON numbers as GBNF (see number_range.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace hablar::grammar {

// A finite decimal: -(k + 0.frac) when neg, else k + 0.frac; frac has no trailing zeros.
struct Decimal {
  bool neg = false;
  int64_t k = 0;
  std::string frac;
};

// The decimal a JSON number's text spells ("12", "-0.5", "2.5e-3"). Throws
// Error(kInvalidArgument) for text that is not a number, magnitudes of 1e15 and beyond, and
// more than 15 significant digits (beyond them a double no longer keeps the bound exact).
Decimal parse_decimal(const std::string& number_text);

// -1, 0 or 1 as a < b, a == b, a > b (-0 == 0).
int decimal_compare(const Decimal& a, const Decimal& b);

// One end of a range: the bound and whether it is excluded.
struct NumBound {
  Decimal value;
  bool exclusive = false;
};

// A parenthesized GBNF expression for JSON numbers written without an exponent (-?k(.f)?, no
// "-0") whose value lies within the bounds (absent: unbounded), decided exactly in decimal.
// At most 15 significant digits are offered near a bound, so a reader that parses the
// number into a double compares it as the decimal compares. Throws Error(kInvalidArgument)
// when no number lies within the bounds.
std::string number_range_gbnf(const std::optional<NumBound>& lo, const std::optional<NumBound>& hi);

}  // namespace hablar::grammar
