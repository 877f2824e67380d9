// Integer ranges as GBNF expressions (see int_range.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace hablar::grammar {

// A parenthesized group of alternatives matching exactly the decimal numerals of the integers in
// [lo, hi] (an absent bound: unbounded, up to 18 digits). Throws Error(kInvalidArgument) for an
// empty range.
std::string int_range_gbnf(std::optional<int64_t> lo, std::optional<int64_t> hi);

}  // namespace hablar::grammar
