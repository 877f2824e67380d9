// Loading a vocabulary from GGUF metadata (tokenizer.ggml.*) into Tokenizer::Impl.
#include <algorithm>
#include <cctype>
#include <string_view>
#include <unordered_set>

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace hablar::tokenizer {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// Texts of the tokens that end generation, and of end-of-turn / fill-in-the-middle tokens;
// a vocabulary that stores them as plain tokens still gets them treated as control tokens.
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>",      "<|im_end|>",         "<|end|>",    "<|return|>", "<|call|>",
    "<end_of_turn>",   "<|endoftext|>",      "<|eom_id|>", "<EOT>",      "_<EOT>",
    "<|end_of_text|>", "<end_of_utterance>", "</s>"};
constexpr std::string_view kEotTexts[] = {"<|eot_id|>",
                                          "<|im_end|>",
                                          "<|end|>",
                                          "<end_of_turn>",
                                          "<|endoftext|>",
                                          "<EOT>",
                                          "_<EOT>",
                                          "<\xEF\xBD\x9C"
                                          "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
                                          "<end_of_utterance>"};
// One list per fill-in-the-middle role (prefix, suffix, middle, pad, repo, separator).
const std::vector<std::vector<std::string_view>>& fim_texts() {
  static const std::vector<std::vector<std::string_view>> kFim = {
      {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
       "<\xEF\xBD\x9C"
       "fim\xE2\x96\x81"
       "begin\xEF\xBD\x9C>",
       "<PRE>", "\xE2\x96\x81<PRE>"},
      {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
       "<\xEF\xBD\x9C"
       "fim\xE2\x96\x81hole\xEF\xBD\x9C>",
       "<SUF>", "\xE2\x96\x81<SUF>"},
      {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
       "<\xEF\xBD\x9C"
       "fim\xE2\x96\x81"
       "end\xEF\xBD\x9C>",
       "<MID>", "\xE2\x96\x81<MID>"},
      {"<|fim_pad|>", "<fim-pad>", "<fim_pad>"},
      {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"},
      {"<|file_sep|>", "<|file_separator|>"},
      {"<|eom_id|>"},
  };
  return kFim;
}

template <size_t N>
bool in_list(const std::string_view (&list)[N], std::string_view s) {
  return std::find(std::begin(list), std::end(list), s) != std::end(list);
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string_view::npos; pos = hit + from.size()) {
    out.append(s.substr(pos, hit - pos));
    out.append(to);
  }
  out.append(s.substr(pos));
  return out;
}

int32_t id_key(const gguf::GgufFile& f, const char* key, int32_t fallback, int32_t n_vocab) {
  const auto v = f.uint_or_none(key);
  if (!v) return fallback;
  return *v < static_cast<uint64_t>(n_vocab) ? static_cast<int32_t>(*v) : -1;
}

void load_tokens(const gguf::GgufFile& f, Tokenizer::Impl& v) {
  v.texts = f.get_string_array("tokenizer.ggml.tokens");
  const size_t n = v.texts.size();
  if (n == 0) throw_error(ErrorKind::kFormat, f.path() + ": tokenizer.ggml.tokens is empty");
  v.scores.assign(n, 0.0f);
  if (f.has("tokenizer.ggml.scores")) {
    auto s = f.get_f32_array("tokenizer.ggml.scores");
    if (s.size() != n)
      throw_error(ErrorKind::kFormat, f.path() + ": tokenizer.ggml.scores has " +
                                          std::to_string(s.size()) + " entries for " +
                                          std::to_string(n) + " tokens");
    v.scores = std::move(s);
  }
  v.types.assign(n, TokenType::kNormal);
  if (f.has("tokenizer.ggml.token_type")) {
    auto t = f.get_i32_array("tokenizer.ggml.token_type");
    if (t.size() != n)
      throw_error(ErrorKind::kFormat, f.path() + ": tokenizer.ggml.token_type has " +
                                          std::to_string(t.size()) + " entries for " +
                                          std::to_string(n) + " tokens");
    for (size_t i = 0; i < n; ++i)
      v.types[i] = (t[i] >= 1 && t[i] <= 6) ? static_cast<TokenType>(t[i]) : TokenType::kUndefined;
  }
  v.text_to_id.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    v.text_to_id[v.texts[i]] = static_cast<int32_t>(i);
    v.max_token_len = std::max(v.max_token_len, v.texts[i].size());
  }
  v.lstrip.assign(n, 0);
  v.rstrip.assign(n, 0);
  v.eog.assign(n, 0);
}

void load_special_ids(const gguf::GgufFile& f, Tokenizer::Impl& v) {
  const int32_t n = v.n_vocab();
  v.bos = id_key(f, "tokenizer.ggml.bos_token_id", v.bos, n);
  v.eos = id_key(f, "tokenizer.ggml.eos_token_id", v.eos, n);
  v.unk = id_key(f, "tokenizer.ggml.unknown_token_id", v.unk, n);
  v.sep = id_key(f, "tokenizer.ggml.seperator_token_id", v.sep, n);
  v.pad = id_key(f, "tokenizer.ggml.padding_token_id", v.pad, n);
  v.eot = id_key(f, "tokenizer.ggml.eot_token_id", -1, n);
  // Fill-in-the-middle ids: today's keys, then the older names of the first three.
  const char* fim_keys[6] = {"fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep"};
  const char* old_keys[3] = {"prefix", "suffix", "middle"};
  for (int r = 0; r < 6; ++r) {
    v.fim[r] =
        id_key(f, (std::string("tokenizer.ggml.") + fim_keys[r] + "_token_id").c_str(), -1, n);
    if (v.fim[r] < 0 && r < 3)
      v.fim[r] =
          id_key(f, (std::string("tokenizer.ggml.") + old_keys[r] + "_token_id").c_str(), -1, n);
  }
  v.add_bos = f.get_bool_or("tokenizer.ggml.add_bos_token", v.add_bos);
  v.add_eos = f.get_bool_or("tokenizer.ggml.add_eos_token", v.add_eos);
  v.add_space_prefix = f.get_bool_or("tokenizer.ggml.add_space_prefix", v.add_space_prefix);
  finish_special_ids(v);
}

// The ids whose texts are in any list above, in id order: one hash lookup per token, so that
// the per-role searches below cost nothing on a large (or sparse, gap-filled) vocabulary.
std::vector<int32_t> listed_ids(const Tokenizer::Impl& v) {
  static const std::unordered_set<std::string_view> kListed = [] {
    std::unordered_set<std::string_view> set(std::begin(kEogTexts), std::end(kEogTexts));
    set.insert(std::begin(kEotTexts), std::end(kEotTexts));
    for (const auto& role : fim_texts()) set.insert(role.begin(), role.end());
    return set;
  }();
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < v.n_vocab(); ++id)
    if (!v.texts[id].empty() && kListed.contains(v.texts[id])) ids.push_back(id);
  return ids;
}

}  // namespace

// End-of-turn, fill-in-the-middle and end-of-generation tokens found by their texts (the
// lowest id of each role).
void finish_special_ids(Tokenizer::Impl& v) {
  const std::vector<int32_t> listed = listed_ids(v);
  auto force_control = [&](int32_t id) {
    if (v.types[id] != TokenType::kControl) v.types[id] = TokenType::kControl;
  };
  if (v.eot < 0) {
    for (size_t i = 0; i < listed.size() && v.eot < 0; ++i)
      if (in_list(kEotTexts, v.texts[listed[i]])) v.eot = listed[i];
  }
  if (v.eot >= 0) force_control(v.eot);
  // Fill-in-the-middle roles; pad, repo, separator and end-of-message also end generation.
  const auto& roles = fim_texts();
  for (size_t r = 0; r < roles.size(); ++r) {
    for (int32_t id : listed) {
      if (std::find(roles[r].begin(), roles[r].end(), v.texts[id]) != roles[r].end()) {
        force_control(id);
        if (r < 6 && v.fim[r] < 0) v.fim[r] = id;
        if (r >= 3) v.eog[id] = 1;
        break;
      }
    }
  }
  for (int32_t id : listed) {
    if (in_list(kEogTexts, v.texts[id])) {
      v.eog[id] = 1;
      force_control(id);
    }
  }
  if (v.eos >= 0) v.eog[v.eos] = 1;
  if (v.eot >= 0) v.eog[v.eot] = 1;
}

namespace {

// Special tokens split out of the text before encoding, longest first; the white-space
// stripping some models ask for around them.
void build_special_tokens(const gguf::GgufFile& f, Tokenizer::Impl& v) {
  for (int32_t id = 0; id < v.n_vocab(); ++id) {
    const TokenType t = v.types[id];
    if (t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown)
      v.special_tokens.push_back(id);
  }
  std::stable_sort(v.special_tokens.begin(), v.special_tokens.end(),
                   [&](int32_t a, int32_t b) { return v.texts[a].size() > v.texts[b].size(); });
  for (size_t rank = 0; rank < v.special_tokens.size(); ++rank) {
    const int32_t id = v.special_tokens[rank];
    if (v.texts[id].empty()) continue;
    v.all_specials.add(v.texts[id], static_cast<int32_t>(rank));
    if (v.types[id] == TokenType::kUserDefined)
      v.user_specials.add(v.texts[id], static_cast<int32_t>(rank));
  }
  std::string name = f.get_string_or("general.name", "");
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    for (int32_t id : v.special_tokens) v.rstrip[id] = 1;
    if (int32_t id = v.lookup("</s>"); id >= 0) v.rstrip[id] = 1;
    for (const char* t : {"<unk>", "<s>", "<|endoftext|>"})
      if (int32_t id = v.lookup(t); id >= 0) v.rstrip[id] = 0;
  }
}

int32_t bpe_symbol(Tokenizer::Impl& v, const std::string& encoded) {
  if (int32_t id = v.lookup(encoded); id >= 0) return id;
  auto [it, added] =
      v.extra_index.emplace(encoded, v.n_vocab() + static_cast<int32_t>(v.extra_symbols.size()));
  if (added) v.extra_symbols.push_back(encoded);
  return it->second;
}

// The bytes token `id` stands for when decoded: normal tokens' text (U+2581 back to a space
// when `unescape_spaces`), a <0xXX> byte token's byte, special tokens' text as written;
// other types keep the empty piece.
void set_piece(Tokenizer::Impl& v, int32_t id, bool unescape_spaces) {
  const std::string& text = v.texts[id];
  switch (v.types[id]) {
    case TokenType::kNormal:
      v.pieces[id] = unescape_spaces ? replace_all(text, kSpaceMark, " ") : text;
      break;
    case TokenType::kByte:
      if (text.size() == 6 && text.rfind("<0x", 0) == 0)
        v.pieces[id] = std::string(1, static_cast<char>(std::stoi(text.substr(3, 2), nullptr, 16)));
      break;
    case TokenType::kControl:
    case TokenType::kUnknown:
    case TokenType::kUserDefined:
      v.pieces[id] = text;
      break;
    default:
      break;
  }
}

// BPE over raw UTF-8 (Gemma 4 style): token texts are the bytes themselves, U+2581 stands
// for a space where spaces are escaped, and <0xXX> tokens are the byte fallback.
void build_raw_bpe_tokens(Tokenizer::Impl& v) {
  static const char* kHex = "0123456789ABCDEF";
  const int32_t n = v.n_vocab();
  for (int b = 0; b < 256; ++b) {
    const char name[7] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>', 0};
    v.byte_token[b] = v.lookup(name);
  }
  for (int32_t id = 0; id < n; ++id) {
    const std::string& text = v.texts[id];
    set_piece(v, id, v.escape_spaces);
    v.raw_texts[id] = text;
    v.raw_to_id[text] = id;
  }
}

void build_bpe(const gguf::GgufFile& f, Tokenizer::Impl& v) {
  const int32_t n = v.n_vocab();
  v.pieces.assign(n, std::string());
  v.raw_texts.assign(n, std::string());
  v.raw_to_id.reserve(n * 2);
  if (!v.byte_level) build_raw_bpe_tokens(v);
  for (int32_t id = 0; id < n && v.byte_level; ++id) {
    const std::string& text = v.texts[id];
    std::string raw;
    bool all_bytes = true;
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t start = pos;
      const uint32_t cp = unicode::decode_one(text, pos);
      const int b = byte_from_cp(cp);
      if (b < 0) {
        all_bytes = false;
        raw.append(text, start, pos - start);
      } else {
        raw.push_back(static_cast<char>(b));
      }
    }
    const TokenType t = v.types[id];
    if (t == TokenType::kNormal) {
      v.pieces[id] = raw;
    } else if (t == TokenType::kControl || t == TokenType::kUnknown ||
               t == TokenType::kUserDefined) {
      v.pieces[id] = text;
    }
    if (all_bytes) {
      v.raw_texts[id] = std::move(raw);
      v.raw_to_id[v.raw_texts[id]] = id;
    }
  }
  for (int b = 0; b < 256 && v.byte_level; ++b)
    v.byte_symbol[b] = bpe_symbol(v, unicode::to_utf8(byte_to_cp(static_cast<uint8_t>(b))));

  // Kimi-K2's vocabulary may come without merges (llama.cpp accepts that for it alone).
  const bool merges_optional = v.pre_name == "kimi-k2";
  const auto merges = merges_optional && !f.has("tokenizer.ggml.merges")
                          ? std::vector<std::string>{}
                          : f.get_string_array("tokenizer.ggml.merges");
  v.merges.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& m = merges[rank];
    const size_t space = m.find(' ', 1);
    if (space == std::string::npos) continue;
    const std::string left = m.substr(0, space), right = m.substr(space + 1);
    const int32_t a = bpe_symbol(v, left), b = bpe_symbol(v, right);
    const int32_t merged = bpe_symbol(v, left + right);
    v.merges.insert(PairTable::key_of(a, b),
                    (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(merged));
  }
}

void build_spm(Tokenizer::Impl& v) {
  static const char* kHex = "0123456789ABCDEF";
  const int32_t n = v.n_vocab();
  for (int b = 0; b < 256; ++b) {
    const char name[7] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>', 0};
    int32_t id = v.lookup(name);
    if (id < 0) id = v.lookup(std::string(1, static_cast<char>(b)));
    v.byte_token[b] = id;
  }
  v.pieces.assign(n, std::string());
  // Most splits of a token are not two tokens: start at one slot pair per token and let the
  // table grow (reserving for every split point would cost tens of MB on large vocabularies).
  v.spm_pairs.reserve(static_cast<size_t>(n));
  for (int32_t id = 0; id < n; ++id) {
    const std::string& text = v.texts[id];
    set_piece(v, id, true);
    // Every split of the token into two tokens merges into it (the id its text maps to).
    const int32_t canonical = v.lookup(text);
    const std::string_view view = text;
    for (size_t k = 1; k < view.size(); ++k) {
      const int32_t a = v.lookup(view.substr(0, k));
      if (a < 0) continue;
      const int32_t b = v.lookup(view.substr(k));
      if (b >= 0) v.spm_pairs.insert(PairTable::key_of(a, b), static_cast<uint32_t>(canonical));
    }
  }
}

void build_wpm(Tokenizer::Impl& v) {
  v.pieces.assign(v.n_vocab(), std::string());
  // Added last id first, so that a text stored twice maps to its last id, as in text_to_id.
  for (int32_t id = v.n_vocab() - 1; id >= 0; --id)
    if (!v.texts[id].empty()) v.wpm_pieces.add(v.texts[id], id);
  for (int32_t id = 0; id < v.n_vocab(); ++id) {
    const TokenType t = v.types[id];
    if (t == TokenType::kNormal)
      v.pieces[id] = replace_all(v.texts[id], kSpaceMark, " ");
    else if (t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kUserDefined)
      v.pieces[id] = v.texts[id];
  }
}

}  // namespace

uint32_t byte_to_cp(uint8_t b) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (int c = 0; c < 256; ++c) {
      const bool printable = (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
      t[c] = printable ? static_cast<uint32_t>(c) : next++;
    }
    return t;
  }();
  return table[b];
}

int byte_from_cp(uint32_t cp) {
  static const std::vector<int> table = [] {
    std::vector<int> t(512, -1);
    for (int b = 0; b < 256; ++b) t[byte_to_cp(static_cast<uint8_t>(b))] = b;
    return t;
  }();
  return cp < table.size() ? table[cp] : -1;
}

std::unique_ptr<Tokenizer::Impl> load_vocab(const gguf::GgufFile& f) {
  auto v = std::make_unique<Tokenizer::Impl>();
  v->model_name = f.get_string_or("tokenizer.ggml.model", "");
  v->pre_name = f.get_string_or("tokenizer.ggml.pre", "default");
  if (v->pre_name.empty()) v->pre_name = "default";
  if (v->model_name == "llama") {
    v->kind = ModelKind::kSpm;
    v->bos = 1, v->eos = 2, v->unk = 0;
    v->add_bos = true, v->add_space_prefix = true;
  } else if (v->model_name == "gpt2" || v->model_name == "gemma4" ||
             v->model_name == "whitespace") {
    // Byte-level BPE, or (Gemma 4's model name) BPE over raw UTF-8 with U+2581 for spaces,
    // or ("whitespace") BPE over the text's non-white-space runs, lowercased by default.
    v->kind = ModelKind::kBpe;
    if (v->model_name == "whitespace") {
      v->drop_whitespace = true;
      v->lowercase =
          f.get_bool_or("tokenizer.ggml.normalizer.lowercase", v->pre_name != "whitespace");
    }
    if (v->model_name == "gemma4") v->pre_name = "gemma4";
    v->pre = PreTokenizer::for_name(v->pre_name);
    const PreOptions& o = v->pre.options();
    v->ignore_merges = o.ignore_merges;
    v->add_bos = o.add_bos;
    v->add_sep = o.add_sep;
    v->byte_level = o.byte_level;
    v->escape_spaces = o.escape_spaces;
    v->newline_words = o.newline_words;
  } else if (v->model_name == "t5") {
    v->kind = ModelKind::kUgm;  // Unigram; llama.cpp's defaults for its special ids
    v->eos = 1, v->unk = 2, v->pad = 0;
    v->add_eos = true;
  } else if (v->model_name == "bert") {
    v->kind = ModelKind::kWpm;
    v->bos = 101, v->unk = 100, v->sep = 102, v->pad = 0;
    v->add_bos = true, v->add_sep = true;
  } else {
    throw_error(ErrorKind::kUnsupported,
                f.path() + ": unsupported tokenizer model (tokenizer.ggml.model) '" +
                    v->model_name +
                    "'; supported: llama (SentencePiece), gpt2 (byte-level BPE), "
                    "gemma4 (BPE over UTF-8), whitespace (BPE over words), bert (WordPiece), "
                    "t5 (Unigram)");
  }
  load_tokens(f, *v);
  const int32_t n = v->n_vocab();
  for (int32_t* id : {&v->bos, &v->eos, &v->unk, &v->sep, &v->pad})
    if (*id >= n) *id = -1;
  load_special_ids(f, *v);
  if (v->newline_words) v->add_bos = true;  // llama.cpp adds BOS to Gemma 4 prompts regardless
  build_special_tokens(f, *v);
  switch (v->kind) {
    case ModelKind::kBpe:
      build_bpe(f, *v);
      break;
    case ModelKind::kSpm:
      build_spm(*v);
      break;
    case ModelKind::kWpm:
      build_wpm(*v);
      break;
    case ModelKind::kUgm:
      build_ugm(f, *v);
      break;
    case ModelKind::kHf:  // built by load_hf_vocab (hf_tokenizer.cpp), never here
      break;
  }
  return v;
}

}  // namespace hablar::tokenizer
