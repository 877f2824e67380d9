// tokenizer.json models: BPE, WordPiece, WordLevel and Unigram, each turning one
// pre-tokenized piece into ids.
#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>

#include "core/error.h"
#include "formats/hf_json.h"
#include "tokenizer/hf_pipeline.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace hablar::tokenizer::hf {
namespace {

using formats::json_bool_or;
using formats::json_string_or;
using nlohmann::json;

constexpr int32_t kMaxVocab = 1 << 22;  // ids beyond 4M would only allocate

std::string byte_token_text(uint8_t b) {
  static const char* kHex = "0123456789ABCDEF";
  return std::string{'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
}

// {"token": id, ...} -> the map and its inverse.
void read_vocab_object(const json& j, const std::string& at, Vocab& vocab,
                       std::vector<std::string>& by_id) {
  if (!j.is_object()) throw_error(ErrorKind::kFormat, at + ": vocab must be an object");
  for (const auto& [text, id] : j.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxVocab)
      throw_error(ErrorKind::kFormat,
                  at + ": vocab id of '" + text + "' must be an integer in [0, 2^22)");
    const int32_t i = (int32_t)id.get<int64_t>();
    vocab[text] = i;
    if ((size_t)i >= by_id.size()) by_id.resize((size_t)i + 1);
    by_id[(size_t)i] = text;
  }
}

int32_t optional_token(const Vocab& vocab, const json& j, const char* key, const std::string& at) {
  const std::string t = json_string_or(j, key, "", at);
  if (t.empty()) return -1;
  auto it = vocab.find(t);
  return it == vocab.end() ? -1 : it->second;
}

// Byte-pair encoding: characters (or their bytes as <0xNN> tokens, or unk) merged by rank.
class Bpe final : public Model {
 public:
  Bpe(const json& j, const std::string& at) {
    read_vocab_object(j.value("vocab", json::object()), at, vocab_, by_id_);
    unk_ = optional_token(vocab_, j, "unk_token", at);
    prefix_ = json_string_or(j, "continuing_subword_prefix", "", at);
    suffix_ = json_string_or(j, "end_of_word_suffix", "", at);
    fuse_unk_ = json_bool_or(j, "fuse_unk", false, at);
    byte_fallback_ = json_bool_or(j, "byte_fallback", false, at);
    ignore_merges_ = json_bool_or(j, "ignore_merges", false, at);
    for (int b = 0; b < 256; ++b) {
      auto it = vocab_.find(byte_token_text((uint8_t)b));
      byte_ids_[(size_t)b] = it == vocab_.end() ? -1 : it->second;
    }
    read_merges(formats::json_array_or_null(j, "merges", at), at);
  }

  void encode(std::string_view piece, std::vector<int32_t>& out) const override {
    if (ignore_merges_) {
      if (auto it = vocab_.find(std::string(piece)); it != vocab_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    std::vector<int32_t> sym = initial_symbols(piece);
    merge(sym);
    out.insert(out.end(), sym.begin(), sym.end());
  }
  const std::vector<std::string>& id_to_token() const override { return by_id_; }
  int32_t unk_id() const override { return unk_; }
  bool byte_fallback() const override { return byte_fallback_; }

 private:
  int32_t lookup(const std::string& s) const {
    auto it = vocab_.find(s);
    return it == vocab_.end() ? -1 : it->second;
  }

  void read_merges(const json* merges, const std::string& at) {
    if (!merges) return;
    merges_.reserve(merges->size());
    uint32_t rank = 0;
    for (const json& m : *merges) {
      std::string a, b;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ', 1);
        if (sp == std::string::npos)
          throw_error(ErrorKind::kFormat, at + ": merge '" + s + "' has no space");
        a = s.substr(0, sp), b = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0].get<std::string>(), b = m[1].get<std::string>();
      } else {
        throw_error(ErrorKind::kFormat, at + ": a merge must be \"a b\" or [\"a\", \"b\"]");
      }
      const int32_t ia = lookup(a), ib = lookup(b);
      const std::string joined =
          a + (!prefix_.empty() && b.starts_with(prefix_) ? b.substr(prefix_.size()) : b);
      const int32_t ij = lookup(joined);
      if (ia < 0 || ib < 0 || ij < 0)
        throw_error(ErrorKind::kFormat,
                    at + ": merge '" + a + " " + b + "' uses a token outside the vocabulary");
      merges_.insert(PairTable::key_of(ia, ib), ((uint64_t)rank++ << 32) | (uint32_t)ij);
    }
  }

  std::vector<int32_t> initial_symbols(std::string_view piece) const {
    std::vector<int32_t> sym;
    bool last_unk = false;
    for (size_t pos = 0; pos < piece.size();) {
      const size_t start = pos;
      pos += std::min(unicode::utf8_len((uint8_t)piece[pos]), piece.size() - pos);
      std::string s(piece.substr(start, pos - start));
      if (start > 0 && !prefix_.empty()) s.insert(0, prefix_);
      if (pos == piece.size() && !suffix_.empty()) s += suffix_;
      if (const int32_t id = lookup(s); id >= 0) {
        sym.push_back(id), last_unk = false;
        continue;
      }
      if (byte_fallback_) {
        bool all = true;
        for (size_t i = start; i < pos; ++i) all &= byte_ids_[(uint8_t)piece[i]] >= 0;
        if (all) {
          for (size_t i = start; i < pos; ++i) sym.push_back(byte_ids_[(uint8_t)piece[i]]);
          last_unk = false;
          continue;
        }
      }
      if (unk_ >= 0 && !(fuse_unk_ && last_unk)) sym.push_back(unk_);
      last_unk = unk_ >= 0;
    }
    return sym;
  }

  // Lowest rank first, leftmost on ties; a queued pair is dropped when either side changed.
  void merge(std::vector<int32_t>& sym) const {
    const int32_t n = (int32_t)sym.size();
    if (n < 2) return;
    std::vector<int32_t> next(n), prev(n);
    for (int32_t i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
    using Entry = std::pair<uint64_t, int32_t>;  // (rank << 32 | merged id, left position)
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> q;
    auto consider = [&](int32_t l) {
      if (l < 0 || next[l] < 0) return;
      if (const uint64_t* m = merges_.find(PairTable::key_of(sym[l], sym[next[l]])))
        q.push({*m, l});
    };
    for (int32_t i = 0; i + 1 < n; ++i) consider(i);
    while (!q.empty()) {
      const auto [m, l] = q.top();
      q.pop();
      if (sym[l] < 0 || next[l] < 0) continue;
      const uint64_t* now = merges_.find(PairTable::key_of(sym[l], sym[next[l]]));
      if (now == nullptr || *now != m) continue;
      const int32_t r = next[l];
      sym[l] = (int32_t)(m & 0xFFFFFFFFu);
      sym[r] = -1;
      next[l] = next[r];
      if (next[l] >= 0) prev[next[l]] = l;
      consider(prev[l]);
      consider(l);
    }
    std::vector<int32_t> out;
    for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(sym[i]);
    sym = std::move(out);
  }

  Vocab vocab_;
  std::vector<std::string> by_id_;
  PairTable merges_;
  std::array<int32_t, 256> byte_ids_{};
  int32_t unk_ = -1;
  std::string prefix_, suffix_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
};

// Greedy longest match from the left; pieces after the first carry the prefix ("##").
class WordPiece final : public Model {
 public:
  WordPiece(const json& j, const std::string& at) {
    read_vocab_object(j.value("vocab", json::object()), at, vocab_, by_id_);
    unk_ = optional_token(vocab_, j, "unk_token", at);
    prefix_ = json_string_or(j, "continuing_subword_prefix", "##", at);
    max_chars_ = (size_t)formats::json_int_or(j, "max_input_chars_per_word", 100, at);
  }
  void encode(std::string_view piece, std::vector<int32_t>& out) const override {
    std::vector<size_t> bounds;  // char boundaries
    for (size_t pos = 0; pos < piece.size();
         pos += std::min(unicode::utf8_len((uint8_t)piece[pos]), piece.size() - pos))
      bounds.push_back(pos);
    bounds.push_back(piece.size());
    std::vector<int32_t> ids;
    bool bad = bounds.size() - 1 > max_chars_;
    for (size_t s = 0; !bad && s + 1 < bounds.size();) {
      size_t e = bounds.size() - 1;
      int32_t found = -1;
      for (; e > s; --e) {
        std::string sub(piece.substr(bounds[s], bounds[e] - bounds[s]));
        if (s > 0) sub.insert(0, prefix_);
        if (auto it = vocab_.find(sub); it != vocab_.end()) {
          found = it->second;
          break;
        }
      }
      if (found < 0) bad = true;
      ids.push_back(found);
      s = e;
    }
    if (bad) {
      if (unk_ >= 0) out.push_back(unk_);
      return;
    }
    out.insert(out.end(), ids.begin(), ids.end());
  }
  const std::vector<std::string>& id_to_token() const override { return by_id_; }
  int32_t unk_id() const override { return unk_; }

 private:
  Vocab vocab_;
  std::vector<std::string> by_id_;
  int32_t unk_ = -1;
  std::string prefix_;
  size_t max_chars_ = 100;
};

class WordLevel final : public Model {
 public:
  WordLevel(const json& j, const std::string& at) {
    read_vocab_object(j.value("vocab", json::object()), at, vocab_, by_id_);
    unk_ = optional_token(vocab_, j, "unk_token", at);
  }
  void encode(std::string_view piece, std::vector<int32_t>& out) const override {
    auto it = vocab_.find(std::string(piece));
    if (it != vocab_.end())
      out.push_back(it->second);
    else if (unk_ >= 0)
      out.push_back(unk_);
  }
  const std::vector<std::string>& id_to_token() const override { return by_id_; }
  int32_t unk_id() const override { return unk_; }

 private:
  Vocab vocab_;
  std::vector<std::string> by_id_;
  int32_t unk_ = -1;
};

}  // namespace

std::unique_ptr<Model> make_unigram(const json& j, const std::string& at);  // hf_unigram.cpp

std::unique_ptr<Model> make_model(const json& j, const std::string& where) {
  if (!j.is_object()) throw_error(ErrorKind::kFormat, where + ": model must be an object");
  std::string type = json_string_or(j, "type", "", where);
  if (type.empty()) {  // older files omit the type; the fields tell
    if (j.contains("merges"))
      type = "BPE";
    else if (j.contains("vocab") && j["vocab"].is_array())
      type = "Unigram";
    else if (j.contains("continuing_subword_prefix"))
      type = "WordPiece";
    else
      type = "WordLevel";
  }
  const std::string at = where + " model " + type;
  if (type == "BPE") return std::make_unique<Bpe>(j, at);
  if (type == "WordPiece") return std::make_unique<WordPiece>(j, at);
  if (type == "WordLevel") return std::make_unique<WordLevel>(j, at);
  if (type == "Unigram") return make_unigram(j, at);
  throw_error(ErrorKind::kUnsupported, where + ": unsupported model '" + type +
                                           "' (supported: BPE, WordPiece, WordLevel, Unigram)");
}

}  // namespace hablar::tokenizer::hf
