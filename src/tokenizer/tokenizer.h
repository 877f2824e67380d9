// Tokenizers: text <-> token ids for the vocabularies stored in GGUF metadata.
//
// Supported tokenizer.ggml.model values:
//   "llama"  SentencePiece-style: score-driven merges of symbols, byte fallback (<0xNN>),
//            "▁" (U+2581) for spaces, optional leading space (add_space_prefix).
//   "gpt2"   byte-level BPE: a regex pre-tokenizer chosen by tokenizer.ggml.pre splits the
//            text into words; each word's bytes are mapped to printable code points and
//            merged by rank (tokenizer.ggml.merges).
//   "bert"   WordPiece: lowercasing, accent stripping, punctuation splitting, greedy
//            longest-prefix with "##" continuation pieces.
//
// Invalid UTF-8 in the text is handled exactly as llama.cpp does (the golden tests check it):
//   - byte-level BPE and WordPiece decode the text first: a lead byte whose continuation
//     bytes (10xxxxxx) are missing or cut off by the end of the text, a stray continuation
//     byte, or a byte 0xF8..0xFF each become one U+FFFD; overlong forms and surrogates
//     decode to their code point (re-encoded in shortest form). BPE then encodes U+FFFD
//     like any character; WordPiece drops it.
//   - SentencePiece works on the bytes: a symbol is the lead byte plus the number of bytes
//     it announces; a symbol that is no token becomes byte tokens (<0xNN>), so decoding
//     gives the original bytes back.
//   - A 4-byte sequence above U+10FFFF (which makes llama.cpp abort) is treated as invalid:
//     U+FFFD for its lead byte and for each following continuation byte.
// Encoding is iterative (no recursion) and O(n log n) in the text length.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/gguf.h"

namespace hablar::tokenizer {

// Token attributes from tokenizer.ggml.token_type (GGUF numbering).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

class Tokenizer {
 public:
  // Reads the vocabulary from GGUF metadata. Throws Error naming an unsupported
  // tokenizer model or pre-tokenizer and listing the supported ones.
  static std::unique_ptr<Tokenizer> from_gguf(const gguf::GgufFile& file);
  virtual ~Tokenizer();

  // add_special: prepend BOS / append EOS as the vocabulary asks (add_bos / add_eos).
  // parse_special: control and user-defined tokens written in the text become their ids;
  // otherwise they are plain text. Empty text gives no ids (besides BOS/EOS).
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;
  // As above, except that no special token is matched where it would cover one of the byte
  // positions `text_only` (sorted): a prompt whose pieces came from a client keeps those
  // pieces as text while the rest (a chat template's markup) still gets its control tokens.
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special,
                              std::span<const uint32_t> text_only) const;
  // Where in `text` encode(text, _, true) would match a token that encode(text, _, false)
  // would not (control and unknown tokens, not user-defined ones): their start offsets.
  std::vector<size_t> control_token_starts(std::string_view text) const;
  // Concatenated text of the ids. Control tokens are shown only when show_special.
  // SentencePiece vocabularies drop the leading space of the first token that is not
  // hidden (the space encode() inserted), so decode(encode(t)) == t.
  // An id outside [0, n_vocab) throws Error(kInvalidArgument).
  std::string decode(std::span<const int32_t> ids, bool show_special = false) const;
  std::string token_piece(int32_t id) const;  // the vocabulary string of a token, as stored
  int32_t n_vocab() const;
  int32_t bos_id() const;  // -1 when none
  int32_t eos_id() const;  // -1 when none
  bool add_bos() const;
  bool add_eos() const;
  // End of generation: eos, eot, <|im_end|>, <|eot_id|>, ... (the control tokens that stop).
  bool is_eog(int32_t id) const;
  std::span<const int32_t> eog_ids() const;  // every id is_eog accepts, ascending
  bool is_control(int32_t id) const;
  std::optional<int32_t> find_token(std::string_view piece) const;
  // Fill-in-the-middle tokens of code models (<fim_prefix>, <|fim_prefix|>, <PRE>, ...):
  // from the GGUF keys, else found by their usual texts; -1 when the vocabulary has none.
  enum class FimRole : uint8_t { kPrefix, kSuffix, kMiddle, kPad, kRepo, kSeparator };
  int32_t fim_id(FimRole role) const;

  // The bytes a token stands for in decoded text (byte tokens become their byte, "▁" a
  // space, byte-level BPE pieces their raw bytes). Control tokens give "" unless
  // show_special. `first` is true for the first token of a text: SentencePiece then drops
  // the leading space that add_space_prefix inserted.
  std::string token_text(int32_t id, bool show_special, bool first) const;
  TokenType token_type(int32_t id) const;
  // True for control / unknown tokens that decode to nothing unless show_special.
  bool is_hidden(int32_t id, bool show_special) const;
  std::string_view model_name() const;  // "llama", "gpt2", "bert"
  std::string_view pre_name() const;    // tokenizer.ggml.pre, or "default"

  struct Impl;

 protected:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streaming decode: text for each new token as soon as it is final. Never emits half a
// UTF-8 character; the chunks of a stream add up to decode() of all its ids, so the
// SentencePiece leading-space rule applies to the first visible token of the stream only.
class IncrementalDetokenizer {
 public:
  // at_text_start = false: the stream continues a text (e.g. generated tokens after a
  // prompt), so its first token keeps its SentencePiece leading space.
  explicit IncrementalDetokenizer(const Tokenizer& tok, bool show_special = false,
                                  bool at_text_start = true);
  std::string push(int32_t id);  // text that became final with this token (may be "")
  std::string flush();           // whatever remains (incomplete UTF-8 at the end -> U+FFFD)

 private:
  const Tokenizer& tok_;
  bool show_special_;
  bool first_ = true;
  std::string pending_;  // bytes of an unfinished UTF-8 character
};

}  // namespace hablar::tokenizer
