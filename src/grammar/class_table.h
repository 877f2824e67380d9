// The vocabulary split by one character class, for masks in "runs" of that class (a JSON
// string's characters, a pattern's [a-z]{0,23}, ...).
//
// A token is read as a run of j characters of the class (complete, valid UTF-8) followed by
// a rest that starts with a character outside it (or a cut-off or invalid sequence, or
// anything after kMaxRun characters). Tokens that are all run (rest empty) are "pure":
// upto[L] holds, as a bitset, the pure tokens of 1..L characters. Tokens with a rest are
// filed by j in rest[j], a trie of their rest bytes.
//
// When the class holds every non-ASCII character (a JSON string's), tokens whose rest is
// only the start of a character cut off by the token's end are filed apart, by j, in
// partial_upto: such a token is allowed exactly where one more character of the class is.
//
// Where a matcher's state takes every character of the class the same way (class-uniform:
// see GrammarMatcher), the mask is upto[longest run the state allows] plus, for each j, the
// rests that the state reached after j characters accepts: a walk over small tries instead
// of the whole vocabulary.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/token_trie.h"

namespace hablar::grammar {

class ClassTable {
 public:
  static constexpr int kMaxRun = 32;

  ClassTable(const CharClass& c, const std::vector<std::string>& bytes,
             const std::vector<bool>& usable);

  const std::vector<uint32_t>& upto(int length) const { return upto_[(size_t)length]; }
  const TokenTrie& rest(int run) const { return rest_[(size_t)run]; }
  // Tokens of 0..run characters of the class and then a cut-off character (empty unless
  // the class holds every non-ASCII character).
  const std::vector<uint32_t>& partial_upto(int run) const { return partial_[(size_t)run]; }

 private:
  std::vector<std::vector<uint32_t>> upto_;     // [0, kMaxRun]
  std::vector<std::vector<uint32_t>> partial_;  // [0, kMaxRun]
  std::vector<TokenTrie> rest_;                 // [0, kMaxRun]
};

// A key naming a class's content (negation and merged ranges).
std::string class_signature(const CharClass& c);

// Length of the valid UTF-8 character at the start of s (0: cut off or invalid: overlong,
// surrogate, above U+10FFFF), and its code point.
size_t decode_utf8_strict(const char* s, size_t n, uint32_t& cp);

}  // namespace hablar::grammar
