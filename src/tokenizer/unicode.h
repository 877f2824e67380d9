// Unicode helpers for the tokenizers: UTF-8 decoding with defined behaviour on invalid
// input, and per-code-point classes (Unicode general category and White_Space) taken from
// utf8proc's tables.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hablar::tokenizer::unicode {

// General category group of a code point (the first letter of its Unicode category).
enum Category : uint8_t {
  kUndefined = 0,    // Cn: unassigned
  kNumber = 1,       // N*
  kLetter = 2,       // L*
  kSeparator = 3,    // Z*
  kMark = 4,         // M*
  kPunctuation = 5,  // P*
  kSymbol = 6,       // S*
  kControl = 7,      // C* except Cn (Cc, Cf, Cs, Co)
};

// Flags of one code point: low 3 bits the Category, bit 3 the White_Space property.
using CpFlags = uint8_t;
inline constexpr CpFlags kWhitespaceBit = 0x08;
inline constexpr CpFlags kOutOfRange = 0xF0;  // code point > U+10FFFF (never from decode())

// Flags of `cp`; a 1.1 MB table built from utf8proc on first use (thread-safe).
CpFlags flags_of(uint32_t cp);
inline Category category_of(CpFlags f) {
  return static_cast<Category>(f & 0x07);
}
inline bool is_whitespace(CpFlags f) {
  return (f & kWhitespaceBit) != 0;
}
inline bool is_letter(CpFlags f) {
  return (f & 0x07) == kLetter && f != kOutOfRange;
}
inline bool is_number(CpFlags f) {
  return (f & 0x07) == kNumber && f != kOutOfRange;
}

// Byte length of the UTF-8 sequence that `lead` announces (1 for continuation bytes).
inline size_t utf8_len(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

// Decodes one code point at text[pos], advancing pos. A lead byte announces the length;
// the continuation bytes must be 10xxxxxx (overlong forms and surrogates are accepted, as
// the reference tokenizer does). Anything else, and any value above U+10FFFF, consumes one
// byte and gives U+FFFD.
uint32_t decode_one(std::string_view text, size_t& pos);

// Appends the UTF-8 encoding of cp (cp <= U+10FFFF).
void append_utf8(std::string& out, uint32_t cp);
std::string to_utf8(uint32_t cp);

// Code points of `text` per decode_one.
std::vector<uint32_t> decode(std::string_view text);

// True when re-encoding decode(text) gives text back byte for byte (no invalid bytes,
// no overlong forms).
bool is_canonical_utf8(std::string_view text);

// Simple lowercase mapping and the first code point of the canonical decomposition.
uint32_t to_lower(uint32_t cp);
uint32_t nfd_first(uint32_t cp);

}  // namespace hablar::tokenizer::unicode
