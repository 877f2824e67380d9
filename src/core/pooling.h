// How a sequence's hidden rows become its embedding (llama.cpp's pooling types, with the
// numbers GGUF's <arch>.pooling_type uses): none (every token's row), mean, cls (the first
// token's row), last (the last token's row), rank (the cls row through the classifier head:
// one relevance score per label).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace hablar {

enum class Pooling : int8_t { kNone = 0, kMean = 1, kCls = 2, kLast = 3, kRank = 4 };

inline std::string_view pooling_name(Pooling p) {
  switch (p) {
    case Pooling::kNone:
      return "none";
    case Pooling::kMean:
      return "mean";
    case Pooling::kCls:
      return "cls";
    case Pooling::kLast:
      return "last";
    case Pooling::kRank:
      return "rank";
  }
  return "?";
}

// "none", "mean", "cls", "last", "rank" (llama-server's --pooling); nullopt otherwise.
inline std::optional<Pooling> pooling_from_name(std::string_view name) {
  for (Pooling p : {Pooling::kNone, Pooling::kMean, Pooling::kCls, Pooling::kLast, Pooling::kRank})
    if (pooling_name(p) == name) return p;
  return std::nullopt;
}

// GGUF's number (0..4); nullopt for another value (-1, "unspecified", included).
inline std::optional<Pooling> pooling_from_gguf(int64_t v) {
  if (v < 0 || v > 4) return std::nullopt;
  return (Pooling)v;
}

}  // namespace hablar
