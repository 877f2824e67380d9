// The fewest bytes that finish a sentence: from every element of a compiled Grammar, and so
// from any recognizer state. Sampling uses it to keep a constrained output completable within
// the tokens it has left (GrammarMatcher::restrict_to_budget): every byte has a token of its
// own in byte-level and byte-fallback vocabularies, so a state k bytes from the end needs at
// most k more tokens.
//
//   tail[i]  for element position i of Grammar::elems: the fewest bytes of a string that
//            the rest of i's alternative (elements i, i + 1, ... up to its kEnd) matches;
//            0 at a kEnd; kNoCompletion where nothing finite completes it (a rule that only
//            recurses, an empty class).
// A character class costs the UTF-8 length of its shortest code point; a rule reference
// costs the cheapest of its alternatives (computed to a fixed point: rules may recurse).
#pragma once

#include <cstdint>
#include <vector>

#include "grammar/grammar.h"

namespace hablar::grammar {

inline constexpr int32_t kNoCompletion = 1 << 29;

// Bytes of the shortest UTF-8 encoding of a code point in the class (kNoCompletion: none).
int32_t class_min_bytes(const CharClass& c);

std::vector<int32_t> completion_tails(const Grammar& g);

// a + b, saturating at kNoCompletion.
inline int32_t add_lengths(int32_t a, int32_t b) {
  const int64_t s = (int64_t)a + b;
  return s >= kNoCompletion ? kNoCompletion : (int32_t)s;
}

}  // namespace hablar::grammar
