// A Tokenizer from tokenizer.json (carried as tokenizer.huggingface.json): the pipeline of
// hf_pipeline.h for encoding; the decoder chain folded into each token's decoded bytes;
// added tokens split out by Impl::partition as GGUF control / user-defined tokens are.
#include <algorithm>
#include <unordered_map>

#include "core/error.h"
#include "formats/hf_json.h"
#include "tokenizer/hf_pipeline.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace hablar::tokenizer {
namespace hf {

void Pipeline::encode(std::string_view text, bool at_start, std::vector<int32_t>& out) const {
  std::string s;
  if (unicode::is_canonical_utf8(text)) {
    s.assign(text);
  } else {  // invalid UTF-8 -> U+FFFD, as a Rust String could never hold it
    for (uint32_t cp : unicode::decode(text)) unicode::append_utf8(s, cp);
  }
  if (normalizer_) normalizer_->apply(s);
  std::vector<Piece> pieces{{std::move(s), at_start}};
  if (pre_) pre_->apply(pieces);
  for (const Piece& p : pieces)
    if (!p.text.empty()) model_->encode(p.text, out);
}

}  // namespace hf

namespace {

using formats::json_bool_or;
using formats::json_string_or;
using nlohmann::json;

struct AddedToken {
  int32_t id;  // as `tokenizers` assigns it (assign_added_ids), not as the file writes it
  std::string content;
  bool special, lstrip, rstrip;
};

std::vector<AddedToken> read_added(const json& j, const std::string& at) {
  std::vector<AddedToken> out;
  const json* list = formats::json_array_or_null(j, "added_tokens", at);
  if (!list) return out;
  for (const json& e : *list) {
    const std::string content = json_string_or(e, "content", "", at + " added_tokens");
    if (content.empty()) throw_error(ErrorKind::kFormat, at + ": an added token needs content");
    out.push_back({-1, content, json_bool_or(e, "special", false, at),
                   json_bool_or(e, "lstrip", false, at), json_bool_or(e, "rstrip", false, at)});
  }
  return out;
}

// `tokenizers` gives added tokens their ids when it loads the file, whatever "id" says: a text
// already added or in the model's vocabulary keeps that id; any other text takes the next id
// past the vocabulary (its count of entries) and the largest added id so far. Models are
// trained with these ids, so the file's "id" fields (usually the same) are not read.
void assign_added_ids(const hf::Model& model, std::vector<AddedToken>& added) {
  const std::vector<std::string>& by_id = model.id_to_token();
  std::unordered_map<std::string_view, int32_t> in_vocab, in_added;
  int64_t vocab_size = 0, max_added = -1;
  for (size_t i = 0; i < by_id.size(); ++i) {
    if (by_id[i].empty()) continue;
    in_vocab[by_id[i]] = (int32_t)i;
    ++vocab_size;
  }
  for (AddedToken& a : added) {
    if (auto it = in_added.find(a.content); it != in_added.end())
      a.id = it->second;
    else if (auto hit = in_vocab.find(a.content); hit != in_vocab.end())
      a.id = hit->second;
    else
      a.id =
          (int32_t)(max_added >= vocab_size || (max_added >= 0 && vocab_size == 0) ? max_added + 1
                                                                                   : vocab_size);
    in_added[a.content] = a.id;
    max_added = std::max<int64_t>(max_added, a.id);
  }
}

// The decoder chain, folded per token: each step read from tokenizer.json once (a vocabulary
// of 10^5..10^6 tokens goes through it), and whether the decoded text drops its first space
// (Metaspace, WordPiece, Strip after Fuse, or no decoder at all).
enum class DecodeKind {
  kByteLevel,
  kReplace,
  kByteFallback,
  kStrip,
  kMetaspace,
  kWordPiece,
  kSuffix
};

struct DecodeStep {
  DecodeKind kind;
  std::string from, to;         // Replace / Metaspace / BPEDecoder: from -> to; WordPiece: prefix
  int64_t start = 0, stop = 0;  // Strip: occurrences of `from` taken off each end
  bool cleanup = false;         // WordPiece
};

struct DecoderFold {
  std::vector<DecodeStep> steps;
  bool no_decoder = true;  // `tokenizers` then joins the tokens with spaces
  bool strip_first_space = false;
};

void read_decode_step(const json& d, const std::string& type, DecoderFold& f, bool& fused,
                      const std::string& at) {
  DecodeStep s{DecodeKind::kByteLevel, {}, {}};
  if (type == "ByteLevel") {
  } else if (type == "Replace") {
    const json& p = d.value("pattern", json::object());
    if (!p.is_object() || !p.contains("String") || !p["String"].is_string())
      throw_error(ErrorKind::kUnsupported,
                  at + ": a Replace decoder with a regex pattern is not supported");
    s = {DecodeKind::kReplace, p["String"].get<std::string>(),
         json_string_or(d, "content", "", at)};
  } else if (type == "ByteFallback") {
    s.kind = DecodeKind::kByteFallback;
  } else if (type == "Fuse") {
    fused = true;
    return;
  } else if (type == "Strip") {
    s = {DecodeKind::kStrip, json_string_or(d, "content", " ", at), {}};
    s.start = formats::json_int_or(d, "start", 0, at);
    s.stop = formats::json_int_or(d, "stop", 0, at);
    if (fused) {  // on the whole text: only one leading space is supported
      if (s.from == " " && s.start == 1 && s.stop == 0)
        f.strip_first_space = true;
      else if (s.start != 0 || s.stop != 0)
        throw_error(ErrorKind::kUnsupported,
                    at + ": Strip decoder after Fuse other than one leading space");
      return;
    }
  } else if (type == "Metaspace") {
    s = {DecodeKind::kMetaspace, json_string_or(d, "replacement", std::string(hf::kMetaspace), at),
         " "};
    const std::string scheme = json_string_or(d, "prepend_scheme", "always", at);
    if (scheme != "never" && json_bool_or(d, "add_prefix_space", true, at))
      f.strip_first_space = true;
  } else if (type == "WordPiece") {
    s = {DecodeKind::kWordPiece, json_string_or(d, "prefix", "##", at), {}};
    s.cleanup = json_bool_or(d, "cleanup", true, at);
    f.strip_first_space = true;
  } else if (type == "BPEDecoder") {
    s = {DecodeKind::kSuffix, json_string_or(d, "suffix", "</w>", at), " "};
  } else {
    throw_error(ErrorKind::kUnsupported,
                at + ": unsupported decoder '" + type +
                    "' (supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, "
                    "Metaspace, WordPiece, BPEDecoder, Sequence)");
  }
  f.steps.push_back(std::move(s));
}

// A decoder, a Sequence flattened into its steps; Fuse and the Strip after it are folded into
// strip_first_space (per-token pieces are already fused).
void read_decoder(const json& d, DecoderFold& f, bool& fused, const std::string& at) {
  if (d.is_null()) return;
  if (!d.is_object()) throw_error(ErrorKind::kFormat, at + ": decoder must be an object");
  f.no_decoder = false;
  const std::string type = json_string_or(d, "type", "", at);
  if (type == "Sequence") {
    if (const json* list = formats::json_array_or_null(d, "decoders", at))
      for (const json& e : *list) read_decoder(e, f, fused, at);
    return;
  }
  read_decode_step(d, type, f, fused, at);
}

DecoderFold read_decoder_fold(const json& d, const std::string& at) {
  DecoderFold f;
  bool fused = false;
  read_decoder(d, f, fused, at);
  if (f.no_decoder) f.strip_first_space = true;
  return f;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size())
    out.append(s, pos, hit - pos).append(to);
  return out.append(s, pos, std::string::npos);
}

std::string word_piece_cleanup(std::string t) {
  for (const auto& [from, to] : {std::pair{" .", "."},
                                 {" ?", "?"},
                                 {" !", "!"},
                                 {" ,", ","},
                                 {" ' ", "'"},
                                 {" n't", "n't"},
                                 {" 'm", "'m"},
                                 {" do not", " don't"},
                                 {" 's", "'s"},
                                 {" 've", "'ve"},
                                 {" 're", "'re"}})
    t = replace_all(t, from, to);
  return t;
}

// One token's text through the chain.
std::string decode_token(std::string t, const DecoderFold& f) {
  if (f.no_decoder) return " " + t;
  for (const DecodeStep& s : f.steps) {
    switch (s.kind) {
      case DecodeKind::kByteLevel: {
        std::string raw;
        for (size_t pos = 0; pos < t.size();) {
          const size_t start = pos;
          const int b = byte_from_cp(unicode::decode_one(t, pos));
          b >= 0 ? raw.push_back((char)b) : (void)raw.append(t, start, pos - start);
        }
        t = std::move(raw);
        break;
      }
      case DecodeKind::kByteFallback:
        if (t.size() == 6 && t.starts_with("<0x") && t[5] == '>' &&
            std::isxdigit((unsigned char)t[3]) && std::isxdigit((unsigned char)t[4]))
          t = std::string(1, (char)std::stoi(t.substr(3, 2), nullptr, 16));
        break;
      case DecodeKind::kStrip:
        for (int64_t i = 0; i < s.start && !s.from.empty() && t.starts_with(s.from); ++i)
          t.erase(0, s.from.size());
        for (int64_t i = 0; i < s.stop && !s.from.empty() && t.ends_with(s.from); ++i)
          t.erase(t.size() - s.from.size());
        break;
      case DecodeKind::kWordPiece:
        t = t.starts_with(s.from) ? t.substr(s.from.size()) : " " + t;
        if (s.cleanup) t = word_piece_cleanup(std::move(t));  // per token, as `tokenizers` does
        break;
      case DecodeKind::kReplace:
      case DecodeKind::kMetaspace:
      case DecodeKind::kSuffix:
        t = replace_all(t, s.from, s.to);
        break;
    }
  }
  return t;
}

// The ids the post-processor puts before and after a single sequence.
void read_post_processor(const json& p, hf::Pipeline& pipe, const std::string& at) {
  if (p.is_null()) return;
  if (!p.is_object()) throw_error(ErrorKind::kFormat, at + ": post_processor must be an object");
  const std::string type = json_string_or(p, "type", "", at);
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    if (const json* list = formats::json_array_or_null(p, "processors", at))
      for (const json& e : *list) read_post_processor(e, pipe, at);
    return;
  }
  auto id_of_pair = [&](const char* key) -> int32_t {
    const json& v = p.value(key, json());
    if (!v.is_array() || v.size() != 2 || !v[1].is_number_integer())
      throw_error(ErrorKind::kFormat, at + ": post_processor " + key + " must be [token, id]");
    return (int32_t)v[1].get<int64_t>();
  };
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    pipe.prefix.push_back(id_of_pair("cls"));
    pipe.suffix.insert(pipe.suffix.begin(), id_of_pair("sep"));
    return;
  }
  if (type != "TemplateProcessing")
    throw_error(ErrorKind::kUnsupported, at + ": unsupported post_processor '" + type +
                                             "' (supported: TemplateProcessing, BertProcessing, "
                                             "RobertaProcessing, ByteLevel, Sequence)");
  const json* single = formats::json_array_or_null(p, "single", at);
  const json* specials = formats::json_object_or_null(p, "special_tokens", at);
  bool after = false;
  for (const json& item : single ? *single : json::array()) {
    if (item.contains("Sequence")) {
      after = true;
      continue;
    }
    const std::string name =
        json_string_or(item.value("SpecialToken", json::object()), "id", "", at);
    const json* st = specials && specials->contains(name) ? &(*specials)[name] : nullptr;
    const json* ids = st ? formats::json_array_or_null(*st, "ids", at) : nullptr;
    if (!ids)
      throw_error(ErrorKind::kFormat,
                  at + ": TemplateProcessing names an unknown special token '" + name + "'");
    for (const json& id : *ids) {
      if (!id.is_number_integer())
        throw_error(ErrorKind::kFormat, at + ": special token ids must be integers");
      (after ? pipe.suffix : pipe.prefix).push_back((int32_t)id.get<int64_t>());
    }
  }
}

// The vocabulary by id: the model's tokens, then added tokens over them (gaps in the model's
// ids stay empty).
void fill_vocab(Tokenizer::Impl& v, const hf::Model& model, const std::vector<AddedToken>& added) {
  size_t n = model.id_to_token().size();
  for (const AddedToken& a : added) n = std::max(n, (size_t)a.id + 1);
  v.texts.assign(n, std::string());
  v.types.assign(n, TokenType::kNormal);
  for (size_t i = 0; i < model.id_to_token().size(); ++i) v.texts[i] = model.id_to_token()[i];
  for (size_t i = 0; i < n; ++i) {
    if (v.texts[i].empty()) v.types[i] = TokenType::kUnused;
    const std::string& t = v.texts[i];
    if (model.byte_fallback() && t.size() == 6 && t.starts_with("<0x") && t[5] == '>')
      v.types[i] = TokenType::kByte;
  }
  if (model.unk_id() >= 0 && (size_t)model.unk_id() < n)
    v.types[(size_t)model.unk_id()] = TokenType::kUnknown;
  v.scores.assign(n, 0.0f);
  v.lstrip.assign(n, 0);
  v.rstrip.assign(n, 0);
  v.eog.assign(n, 0);
  for (const AddedToken& a : added) {
    v.texts[(size_t)a.id] = a.content;
    v.types[(size_t)a.id] = a.special ? TokenType::kControl : TokenType::kUserDefined;
    v.lstrip[(size_t)a.id] = a.lstrip;
    v.rstrip[(size_t)a.id] = a.rstrip;
  }
  // A model's vocabulary may leave gaps in its ids: the map is sized by texts.
  v.text_to_id.reserve((size_t)std::count_if(v.texts.begin(), v.texts.end(),
                                             [](const std::string& t) { return !t.empty(); }));
  for (size_t i = 0; i < n; ++i) {
    if (v.texts[i].empty()) continue;
    v.text_to_id[v.texts[i]] = (int32_t)i;
    v.max_token_len = std::max(v.max_token_len, v.texts[i].size());
  }
}

// bos / eos / unk / pad from tokenizer_config.json's token texts and generation_config.json's ids.
void read_special_ids(const gguf::GgufFile& f, Tokenizer::Impl& v, const hf::Model& model) {
  auto by_text = [&](const char* key) -> int32_t {
    const std::string t = f.get_string_or(key, "");
    return t.empty() ? -1 : v.lookup(t);
  };
  v.bos = by_text("hablar.hf.bos_token");
  if (v.bos < 0 && f.has("hablar.hf.bos_token_id")) {
    const uint64_t id = f.get_uint("hablar.hf.bos_token_id");
    v.bos = id < (uint64_t)v.n_vocab() ? (int32_t)id : -1;
  }
  v.unk = model.unk_id() >= 0 ? model.unk_id() : by_text("hablar.hf.unk_token");
  v.pad = by_text("hablar.hf.pad_token");
  v.eos = by_text("hablar.hf.eos_token");
  std::vector<int32_t> eos_ids;
  if (f.has("hablar.hf.eos_token_ids")) eos_ids = f.get_i32_array("hablar.hf.eos_token_ids");
  if (v.eos < 0 && !eos_ids.empty() && eos_ids[0] >= 0 && eos_ids[0] < v.n_vocab())
    v.eos = eos_ids[0];
  finish_special_ids(v);
  for (int32_t id : eos_ids)
    if (id >= 0 && id < v.n_vocab()) v.eog[(size_t)id] = 1;
  if (v.eos >= 0) v.eog[(size_t)v.eos] = 1;
}

// Added tokens (and tokens made control by their text) split out before the pipeline runs.
void build_specials(Tokenizer::Impl& v, const std::vector<AddedToken>& added) {
  for (const AddedToken& a : added) v.special_tokens.push_back(a.id);
  std::sort(v.special_tokens.begin(), v.special_tokens.end());
  v.special_tokens.erase(std::unique(v.special_tokens.begin(), v.special_tokens.end()),
                         v.special_tokens.end());
  std::stable_sort(v.special_tokens.begin(), v.special_tokens.end(), [&](int32_t a, int32_t b) {
    return v.texts[(size_t)a].size() > v.texts[(size_t)b].size();
  });
  for (size_t rank = 0; rank < v.special_tokens.size(); ++rank) {
    const int32_t id = v.special_tokens[rank];
    v.all_specials.add(v.texts[(size_t)id], (int32_t)rank);
    if (v.types[(size_t)id] == TokenType::kUserDefined)
      v.user_specials.add(v.texts[(size_t)id], (int32_t)rank);
  }
}

// tokenizer_config.json's add_bos_token / add_eos_token, where present, decide.
void apply_add_flags(const gguf::GgufFile& f, Tokenizer::Impl& v, hf::Pipeline& pipe) {
  auto set = [&](const char* key, std::vector<int32_t>& ids, int32_t id, bool front) {
    if (!f.has(key) || id < 0) return;
    const bool want = f.get_bool(key);
    const bool has = !ids.empty() && (front ? ids.front() : ids.back()) == id;
    if (want && !has) front ? (void)ids.insert(ids.begin(), id) : ids.push_back(id);
    if (!want && has) front ? (void)ids.erase(ids.begin()) : ids.pop_back();
  };
  set("tokenizer.ggml.add_bos_token", pipe.prefix, v.bos, true);
  set("tokenizer.ggml.add_eos_token", pipe.suffix, v.eos, false);
  v.add_bos = !pipe.prefix.empty() && pipe.prefix.front() == v.bos;
  v.add_eos = !pipe.suffix.empty() && pipe.suffix.back() == v.eos;
}

}  // namespace

std::unique_ptr<Tokenizer::Impl> load_hf_vocab(const gguf::GgufFile& f) {
  const std::string at = f.path() + " tokenizer.json";
  const json j = formats::parse_json_text(f.get_string("tokenizer.huggingface.json"), at);
  if (!j.is_object() || !j.contains("model"))
    throw_error(ErrorKind::kFormat, at + ": no \"model\"");
  auto model = hf::make_model(j["model"], at);
  auto pipe = std::make_shared<hf::Pipeline>(
      hf::make_normalizer(j.value("normalizer", json()), at),
      hf::make_pre_tokenizer(j.value("pre_tokenizer", json()), at), std::move(model));
  read_post_processor(j.value("post_processor", json()), *pipe, at);
  auto v = std::make_unique<Tokenizer::Impl>();
  v->kind = ModelKind::kHf;
  std::string type = json_string_or(j["model"], "type", "bpe", at);
  std::transform(type.begin(), type.end(), type.begin(),
                 [](unsigned char c) { return (char)std::tolower(c); });
  v->model_name = "hf-" + type;
  v->pre_name = "tokenizer.json";
  std::vector<AddedToken> added = read_added(j, at);
  assign_added_ids(pipe->model(), added);
  fill_vocab(*v, pipe->model(), added);
  read_special_ids(f, *v, pipe->model());
  for (int32_t id : pipe->prefix)
    if (id < 0 || id >= v->n_vocab())
      throw_error(ErrorKind::kFormat, at + ": post_processor id outside the vocabulary");
  for (int32_t id : pipe->suffix)
    if (id < 0 || id >= v->n_vocab())
      throw_error(ErrorKind::kFormat, at + ": post_processor id outside the vocabulary");
  apply_add_flags(f, *v, *pipe);
  build_specials(*v, added);
  const DecoderFold fold = read_decoder_fold(j.value("decoder", json()), at);
  v->pieces.assign((size_t)v->n_vocab(), std::string());
  for (int32_t id = 0; id < v->n_vocab(); ++id) {
    const TokenType t = v->types[(size_t)id];
    if (v->texts[(size_t)id].empty()) continue;  // a gap in the ids decodes to nothing
    v->pieces[(size_t)id] =
        (t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown)
            ? v->texts[(size_t)id]
            : decode_token(v->texts[(size_t)id], fold);
  }
  v->add_space_prefix = fold.strip_first_space;
  v->hf = std::move(pipe);
  return v;
}

}  // namespace hablar::tokenizer
