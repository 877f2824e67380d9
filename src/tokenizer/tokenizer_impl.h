// Internal state of a Tokenizer: the vocabulary as loaded from GGUF plus the tables each
// algorithm needs. Shared by the per-algorithm sources of this folder only.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace hablar::tokenizer {

// Open-addressing hash map from a 64-bit key to a 64-bit value (pair tables of BPE / SPM).
class PairTable {
 public:
  void reserve(size_t n);
  // Inserts unless the key is present (the first insertion wins).
  void insert(uint64_t key, uint64_t value);
  const uint64_t* find(uint64_t key) const {
    if (slots_.empty()) return nullptr;
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.value;
      if (s.key == kEmpty) return nullptr;
    }
  }
  static uint64_t key_of(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key = kEmpty;
    uint64_t value = 0;
  };
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  void grow();
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

struct StringViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept;
};
using TextIndex = std::unordered_map<std::string_view, int32_t, StringViewHash, std::equal_to<>>;

enum class ModelKind { kSpm, kBpe, kWpm, kUgm, kHf };  // kHf: a tokenizer.json pipeline

namespace hf {
class Pipeline;
}

// A piece of encoder input after special tokens are split out: raw text or one token.
struct Fragment {
  size_t offset = 0;
  size_t length = 0;
  int32_t token = -1;  // >= 0: a special token
};

// Prefix tree over the texts of special tokens: finds every special token that starts at
// a position in one walk.
class SpecialTrie {
 public:
  void add(std::string_view text, int32_t rank);
  bool empty() const { return nodes_.size() <= 1; }
  // Calls fn(rank) for each special token whose text starts at text[pos].
  template <typename Fn>
  void match_at(std::string_view text, size_t pos, Fn&& fn) const {
    int32_t node = root_[static_cast<uint8_t>(text[pos])];
    for (size_t i = pos + 1; node > 0; ++i) {
      const Node& n = nodes_[node];
      if (n.rank >= 0) fn(n.rank);
      if (i >= text.size()) break;
      node = child(n, static_cast<uint8_t>(text[i]));
    }
  }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> edges;
    int32_t rank = -1;
  };
  static int32_t child(const Node& n, uint8_t b) {
    for (const auto& e : n.edges)
      if (e.first == b) return e.second;
    return 0;
  }
  std::vector<Node> nodes_{Node{}};
  std::array<int32_t, 256> root_{};
};

struct Tokenizer::Impl {
  ModelKind kind = ModelKind::kSpm;
  std::string model_name;
  std::string pre_name = "default";

  // Vocabulary, by id.
  std::vector<std::string> texts;
  std::vector<float> scores;
  std::vector<TokenType> types;
  std::vector<uint8_t> lstrip, rstrip;  // strip white space around a special match
  std::vector<uint8_t> eog;
  std::vector<int32_t> eog_ids;  // the ids eog marks, ascending (filled by Tokenizer's constructor)
  std::vector<std::string> pieces;  // decoded bytes of each token (normal tokens)
  TextIndex text_to_id;             // stored text -> id (the last id wins)
  size_t max_token_len = 0;

  int32_t bos = -1, eos = -1, unk = -1, sep = -1, pad = -1, eot = -1;
  int32_t fim[6] = {-1, -1, -1, -1, -1, -1};  // by Tokenizer::FimRole
  bool add_bos = false, add_eos = false, add_sep = false, add_space_prefix = false;

  // Control, user-defined and unknown tokens, longest text first: split out of the text
  // before encoding (control and unknown only with parse_special).
  std::vector<int32_t> special_tokens;
  SpecialTrie all_specials;   // every special token, by rank in special_tokens
  SpecialTrie user_specials;  // user-defined ones only (split even without parse_special)
  SpecialTrie wpm_pieces;     // WordPiece: every token text, for longest-prefix matching

  // Byte-level BPE.
  PreTokenizer pre;
  bool ignore_merges = false;
  bool byte_level = true;        // false: symbols are raw UTF-8 characters (pre.options())
  bool escape_spaces = false;    // ' ' -> U+2581 before splitting
  bool newline_words = false;    // a newline-only word that is a token is taken whole
  bool drop_whitespace = false;  // "whitespace" model: white space only separates words
  bool lowercase = false;        // "whitespace" model: words are lowercased
  std::array<int32_t, 256> byte_symbol{};  // raw byte -> symbol id of its byte character
  std::vector<std::string> raw_texts;      // decoded bytes of every token ("" if not bytes)
  TextIndex raw_to_id;                     // raw_texts -> id, for ignore_merges
  PairTable merges;                        // (left, right) -> rank << 32 | merged symbol
  std::vector<std::string> extra_symbols;  // symbols that are not tokens (id n_vocab + i)
  std::unordered_map<std::string, int32_t> extra_index;

  // tokenizer.json (hf_pipeline.h): the pipeline and the ids its post-processor adds.
  std::shared_ptr<const hf::Pipeline> hf;

  // Unigram (ugm.cpp).
  std::string ugm_charsmap;       // tokenizer.ggml.precompiled_charsmap, as stored
  SpecialTrie ugm_tokens;         // normal, user-defined and unused tokens, by id
  SpecialTrie ugm_user;           // user-defined tokens, by id
  float ugm_unk_score = 0.0f;     // lowest normal score - 10
  bool ugm_merge_spaces = false;  // tokenizer.ggml.remove_extra_whitespaces

  // SentencePiece.
  PairTable spm_pairs;                    // (left, right) -> id of the concatenation
  std::array<int32_t, 256> byte_token{};  // <0xNN> tokens

  int32_t n_vocab() const { return static_cast<int32_t>(texts.size()); }
  int32_t lookup(std::string_view text) const {
    auto it = text_to_id.find(text);
    return it == text_to_id.end() ? -1 : it->second;
  }

  // text_only: sorted byte positions no special-token match may cover.
  std::vector<Fragment> partition(std::string_view text, bool parse_special,
                                  std::span<const uint32_t> text_only = {}) const;
  void encode_bpe(std::string_view text, std::vector<int32_t>& out) const;
  void encode_spm(std::string_view text, std::vector<int32_t>& out) const;
  void encode_wpm(std::string_view text, std::vector<int32_t>& out) const;
  void encode_ugm(std::string_view text, std::vector<int32_t>& out) const;
};

// Loading (vocab.cpp).
std::unique_ptr<Tokenizer::Impl> load_vocab(const gguf::GgufFile& file);
// Unigram tables: the charsmap, the token tries, the unknown score, pieces (ugm.cpp).
void build_ugm(const gguf::GgufFile& file, Tokenizer::Impl& v);
// After the ids of bos/eos/... are set: end-of-turn, fill-in-the-middle and
// end-of-generation tokens found by their texts (made control tokens).
void finish_special_ids(Tokenizer::Impl& v);
// A tokenizer.json pipeline (tokenizer.huggingface.json and hablar.hf.* keys; hf_tokenizer.cpp).
std::unique_ptr<Tokenizer::Impl> load_hf_vocab(const gguf::GgufFile& file);
// GPT-2 byte alphabet: byte -> code point of its printable stand-in, and back (-1: none).
uint32_t byte_to_cp(uint8_t b);
int byte_from_cp(uint32_t cp);

}  // namespace hablar::tokenizer
