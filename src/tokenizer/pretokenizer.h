// Pre-tokenizers of byte-level BPE vocabularies: split text into words before merging.
//
// Each tokenizer.ggml.pre value names a chain of patterns (the regexes of the model's
// tokenizer.json). A chain is applied like the reference tokenizer does: the first pattern
// splits the whole text into matches and the gaps between them; each later pattern splits
// every piece again on its own (so a lookahead or `$` sees the end of the piece). The
// patterns are matched by hand-written scanners over code-point classes, each exactly
// equivalent to its regex (tests check them against PCRE2 on a corpus).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hablar::tokenizer {

// One pattern of a chain.
struct PrePattern {
  enum class Kind {
    kGpt2,       // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    kLlama3,     // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}
                 //  | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
    kClassRun,   // \s?C+ (ws_prefix), C+ (count 0) or C{count}
    kTrailingWs  // \s+$
  };
  enum class Class {
    kNone,
    kNewline,              // [\r\n]
    kLetter,               // \p{L}
    kNumber,               // \p{N}
    kPunct,                // \p{P}
    kAsciiDigit,           // [0-9]
    kPunctSymbolsFalcon,   // [\p{P}\$\+<=>\^~\|`]
    kPunctSymbolsDefault,  // [\p{P}\$\+<=>\^~\|]
    kDeepseekLetters,      // the cased-letter ranges of the deepseek-llm pattern
    kDeepseekPunct,        // [!-/:-~！-／：-～‘-‟　-。]
    kCjkHangul,            // [一-龥ࠀ-一가-퟿]
  };
  Kind kind = Kind::kGpt2;
  Class cls = Class::kNone;
  bool ws_prefix = false;
  int count = 0;       // kClassRun: 0 = one or more, n = exactly n
  int max_digits = 3;  // kLlama3
  std::string regex;   // the equivalent regex (PCRE2 syntax), for tests and messages
};

class PreTokenizer {
 public:
  // Chain for a tokenizer.ggml.pre value; throws Error(kUnsupported) listing the known ones.
  static PreTokenizer for_name(std::string_view pre);
  static std::vector<std::string> supported_names();
  // A name of llama.cpp's Llama 3 pre-tokenizer ("llama-bpe", "llama3", "falcon3", ...).
  static bool is_llama3_name(std::string_view pre);

  // Splits code points cps (with their flags from unicode::flags_of) into words; appends
  // the length of each word, in code points, to `lengths`.
  void split(std::span<const uint32_t> cps, std::span<const uint8_t> flags,
             std::vector<uint32_t>& lengths) const;

  const std::vector<PrePattern>& patterns() const { return patterns_; }
  // Splits with one pattern of the chain only (tests compare it with PCRE2).
  static void split_piece(const PrePattern& p, const uint32_t* cps, const uint8_t* flags,
                          size_t begin, size_t end, std::vector<uint32_t>& lengths);

 private:
  std::vector<PrePattern> patterns_;
};

}  // namespace hablar::tokenizer
