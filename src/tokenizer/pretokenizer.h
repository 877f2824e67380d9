// Pre-tokenizers of byte-level BPE vocabularies: split text into words before merging.
//
// Each tokenizer.ggml.pre value names a chain of patterns (the regexes of the model's
// tokenizer.json). A chain is applied like the reference tokenizer does: the first pattern
// splits the whole text into matches and the gaps between them; each later pattern splits
// every piece again on its own (so a lookahead or `$` sees the end of the piece). The
// patterns are matched by hand-written scanners over code-point classes, each exactly
// equivalent to its regex (tests check them against PCRE2 on a corpus); the scanners
// llama.cpp itself hard-codes (Kimi-K2, digit groups, newline runs) as it runs them; and
// every other regex by LlamaRegex, with llama.cpp's matching rules.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hablar::tokenizer {

// A pre-tokenizer regex matched as llama.cpp matches the regexes it has no scanner for
// (ECMAScript rules: leftmost alternative first, `$` only at the end of the piece, \s \d
// \w ASCII only). A regex that names a Unicode category (\p{L}, \p{N}, \p{P}, \p{M},
// \p{S}, \p{Lu} ...) runs over a "collapsed" text: ASCII stays, every other code point
// becomes one stand-in per category (white space 0x0B, number 0xD1, letter 0xD2,
// punctuation 0xD3, mark 0xD4, symbol 0xD5, anything else 0xD0) and each \p{..} becomes
// [stand-in + its ASCII members] (so \p{Lu} is every letter). Any other regex runs over
// the code points with non-ASCII white space as 0x0B. Compiled once by PCRE2 (32-bit code
// units, no UTF, no UCP); copies share the compiled code.
class LlamaRegex {
 public:
  // Throws Error(kFormat) when the regex does not compile.
  explicit LlamaRegex(const std::string& regex);
  // Appends the lengths (code points) of the matches in cps[begin, end) and of the gaps
  // between them; an empty match only splits.
  void split(const uint32_t* cps, const uint8_t* flags, size_t begin, size_t end,
             std::vector<uint32_t>& lengths) const;
  bool collapsed() const { return collapsed_; }
  // The regex PCRE2 runs (the collapsed form where collapsed()), for messages and tests.
  const std::string& compiled_form() const { return compiled_form_; }

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
  bool collapsed_ = false;
  std::string compiled_form_;
};

// One pattern of a chain.
struct PrePattern {
  enum class Kind {
    kGpt2,         // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    kLlama3,       // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}
                   //  | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
    kClassRun,     // \s?C+ (ws_prefix), C+ (count 0) or C{count}
    kTrailingWs,   // \s+$
    kKimiK2,       // llama.cpp's scanner for Kimi-K2's whole pattern (\p{Han}+ first, ...)
    kDigitGroups,  // llama.cpp's digit scanner (AFMoE, Tiny Aya): a run of n digits splits
                   //  into n % 3 leading digits (with the text before them), then threes
    kNewlineRuns,  // [^\n]+|[\n]+
    kRegex,        // any other regex: `re`, with llama.cpp's matching rules
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
  bool marks = false;  // kLlama3: letters take combining marks ([\p{L}\p{M}], Qwen3.5)
  std::shared_ptr<const LlamaRegex> re;  // kRegex
};

// What llama.cpp ties to a pre-tokenizer name besides its splits (llama-vocab.cpp).
struct PreOptions {
  bool ignore_merges = false;  // a word that is one token becomes that token unmerged
  bool add_bos = false;        // default of tokenizer.ggml.add_bos_token
  bool add_sep = false;        // a separator token ends the encoding (RoBERTa-style)
  bool byte_level = true;      // GPT-2 byte alphabet; false: symbols are raw UTF-8
                               //  characters, byte fallback through <0xXX> tokens
  bool escape_spaces = false;  // ' ' becomes U+2581 before splitting (SentencePiece-style)
  bool newline_words = false;  // a word of newlines only that is a token becomes it (Gemma 4),
                               //  and BOS is always added
};

class PreTokenizer {
 public:
  // Chain for a tokenizer.ggml.pre value; throws Error(kUnsupported) listing the known ones.
  static PreTokenizer for_name(std::string_view pre);
  static std::vector<std::string> supported_names();
  // A name of llama.cpp's Llama 3 pre-tokenizer ("llama-bpe", "llama3", "falcon3", ...).
  static bool is_llama3_name(std::string_view pre);
  const PreOptions& options() const { return options_; }

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
  PreOptions options_;
};

}  // namespace hablar::tokenizer
