// The tokenizer.json pipeline of Hugging Face `tokenizers`, implemented from its format:
//
//   text ─► added tokens split out (Tokenizer::Impl::partition, as for GGUF vocabularies)
//        ─► each remaining fragment: normalizer ─► pre-tokenizer ─► model ─► ids
//        ─► post-processor (the ids it adds around a sequence: BOS, CLS/SEP, ...)
//
// Normalizers map a string to a string (NFC/NFD/NFKC/NFKD, Lowercase, Strip, StripAccents,
// Replace, Prepend, BertNormalizer, Sequence). Pre-tokenizers split a list of pieces into a
// finer list (ByteLevel, Split, Metaspace, Whitespace, WhitespaceSplit, Digits,
// Punctuation, BertPreTokenizer, CharDelimiterSplit, Sequence). Models turn one piece into
// ids (BPE with merges / byte fallback / ignore_merges, WordPiece, WordLevel, Unigram).
// Decoders are not run on id lists here: tokenizer/hf_tokenizer.cpp folds the decoder
// chain into each token's decoded bytes, which keeps streaming detokenization exact.
// Every step is built from JSON with checks; an unknown type is an Error(kUnsupported)
// naming it and listing the supported ones.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace hablar::tokenizer::hf {

// A piece of text being pre-tokenized; `at_start`: it begins at offset 0 of the input
// (Metaspace's prepend_scheme "first" prepends only there).
struct Piece {
  std::string text;
  bool at_start = false;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void apply(std::string& s) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void apply(std::vector<Piece>& pieces) const = 0;
};

// Vocabulary shared by the model and the pipeline: token text -> id.
using Vocab = std::unordered_map<std::string, int32_t>;

class Model {
 public:
  virtual ~Model() = default;
  virtual void encode(std::string_view piece, std::vector<int32_t>& out) const = 0;
  // id -> token text of the model's vocabulary (size = largest id + 1; gaps empty).
  virtual const std::vector<std::string>& id_to_token() const = 0;
  virtual int32_t unk_id() const { return -1; }
  virtual bool byte_fallback() const { return false; }
};

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& where);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const std::string& where);
std::unique_ptr<Model> make_model(const nlohmann::json& j, const std::string& where);

// The per-fragment part of the pipeline.
class Pipeline {
 public:
  Pipeline(std::unique_ptr<Normalizer> n, std::unique_ptr<PreTokenizer> p, std::unique_ptr<Model> m)
      : normalizer_(std::move(n)), pre_(std::move(p)), model_(std::move(m)) {}
  // Appends the ids of one fragment of text (valid UTF-8) that holds no added token.
  void encode(std::string_view text, bool at_start, std::vector<int32_t>& out) const;
  const Model& model() const { return *model_; }

  std::vector<int32_t> prefix, suffix;  // the post-processor's ids around a sequence

 private:
  std::unique_ptr<Normalizer> normalizer_;  // may be null
  std::unique_ptr<PreTokenizer> pre_;       // may be null
  std::unique_ptr<Model> model_;
};

// Regex and literal matching shared by Split, Replace and the ByteLevel pre-tokenizer:
// the [start, end) byte spans of every non-overlapping match, left to right.
class Matcher {
 public:
  static std::shared_ptr<const Matcher> regex(const std::string& pattern, const std::string& where);
  static std::shared_ptr<const Matcher> literal(std::string text);
  // {"String": s} or {"Regex": r}, as Split and Replace store their pattern.
  static std::shared_ptr<const Matcher> from_json(const nlohmann::json& j,
                                                  const std::string& where);
  virtual ~Matcher() = default;
  virtual void find_all(std::string_view text,
                        std::vector<std::pair<size_t, size_t>>& spans) const = 0;
};

// U+2581, SentencePiece's visible space.
inline constexpr std::string_view kMetaspace = "\xE2\x96\x81";

}  // namespace hablar::tokenizer::hf
