// A byte-level BPE tokenizer.json as llama.cpp's tokenizer.ggml.* keys, so that a GGUF
// converted from a Hugging Face directory carries a vocabulary llama.cpp (and every GGUF
// reader) understands, as llama.cpp's own converter writes it for these families:
//   tokenizer.ggml.model      "gpt2"
//   tokenizer.ggml.pre        named from the pre-tokenizer's structure (see pre_name)
//   tokenizer.ggml.tokens     every id's string (byte-level alphabet), gaps as [PAD<id>]
//   tokenizer.ggml.token_type 1 normal, 3 control (special added tokens), 4 user-defined
//                             (other added tokens), 5 unused (gaps)
//   tokenizer.ggml.merges     "left right" per merge, in rank order
//   tokenizer.ggml.{bos,eos,unk,padding}_token_id from tokenizer_config.json's tokens
//   (hablar.hf.*_token) or generation_config.json's ids.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/hf_json.h"
#include "formats/hf_model.h"

namespace hablar::formats {
namespace {

using gguf::Value;
using nlohmann::json;
using Metadata = std::vector<std::pair<std::string, Value>>;

// The Split patterns of the Llama 3 and Qwen2 tokenizer.json files: the same expression,
// digits in runs of up to three (Llama 3) or one at a time (Qwen2).
constexpr const char* kSplitPrefix =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})";
constexpr const char* kSplitSuffix = R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

bool is_byte_level(const json& p, bool use_regex) {
  return p.is_object() && p.value("type", "") == "ByteLevel" &&
         p.value("use_regex", true) == use_regex && !p.value("add_prefix_space", false);
}

// llama.cpp's name for the pre-tokenizer whose splits this one makes; nullopt when it is
// none of the byte-level families hablar converts.
std::optional<std::string> pre_name(const json& pre) {
  if (is_byte_level(pre, true)) return "gpt-2";  // ByteLevel's own regex is GPT-2's
  if (!pre.is_object() || pre.value("type", "") != "Sequence") return std::nullopt;
  const json* steps = pre.contains("pretokenizers") ? &pre["pretokenizers"] : nullptr;
  if (!steps || !steps->is_array() || steps->size() != 2) return std::nullopt;
  const json& a = (*steps)[0];
  const json& b = (*steps)[1];
  if (a.value("type", "") == "Digits" && a.value("individual_digits", false) &&
      is_byte_level(b, true))
    return "smollm";  // single digits, then GPT-2's splits
  if (a.value("type", "") != "Split" || !is_byte_level(b, false)) return std::nullopt;
  const json* pattern = a.contains("pattern") ? &a["pattern"] : nullptr;
  if (!pattern || !pattern->is_object() || !(*pattern).contains("Regex")) return std::nullopt;
  const json& regex = (*pattern)["Regex"];
  if (!regex.is_string() || a.value("behavior", "") != "Isolated" || a.value("invert", false))
    return std::nullopt;
  const std::string r = regex.get<std::string>();
  if (r == std::string(kSplitPrefix) + "{1,3}" + kSplitSuffix) return "llama-bpe";
  if (r == std::string(kSplitPrefix) + kSplitSuffix) return "qwen2";
  return std::nullopt;
}

std::string merge_text(const json& m, const std::string& where) {
  if (m.is_string()) return m.get<std::string>();
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
    return m[0].get<std::string>() + " " + m[1].get<std::string>();
  throw_error(ErrorKind::kFormat, where + ": a BPE merge must be \"a b\" or [\"a\", \"b\"]");
}

// tokens[id] / types[id] from the model's vocab and the added tokens, gaps padded.
void collect_tokens(const json& model, const json& tj, int64_t min_size, const std::string& where,
                    std::vector<std::string>& tokens, std::vector<int32_t>& types) {
  const json* vocab = json_object_or_null(model, "vocab", where);
  if (!vocab) throw_error(ErrorKind::kFormat, where + ": BPE model without a vocab");
  auto put = [&](int64_t id, const std::string& text, int32_t type) {
    if (id < 0 || id > (int64_t)INT32_MAX - 1)
      throw_error(ErrorKind::kFormat, where + ": token id " + std::to_string(id) + " out of range");
    if ((size_t)id >= tokens.size()) {
      tokens.resize((size_t)id + 1);
      types.resize((size_t)id + 1, 0);
    }
    tokens[(size_t)id] = text;
    types[(size_t)id] = type;
  };
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer())
      throw_error(ErrorKind::kFormat, where + ": vocab ids must be integers");
    put(it.value().get<int64_t>(), it.key(), 1);
  }
  if (const json* added = json_array_or_null(tj, "added_tokens", where))
    for (const json& t : *added) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer())
        throw_error(ErrorKind::kFormat, where + ": an added token needs an integer id");
      put(t["id"].get<int64_t>(), json_string_or(t, "content", "", where),
          json_bool_or(t, "special", false, where) ? 3 : 4);
    }
  if ((int64_t)tokens.size() < min_size) {
    tokens.resize((size_t)min_size);
    types.resize((size_t)min_size, 0);
  }
  for (size_t i = 0; i < tokens.size(); ++i)
    if (types[i] == 0) {
      tokens[i] = "[PAD" + std::to_string(i) + "]";
      types[i] = 5;
    }
}

// The special token ids: tokenizer_config.json's tokens by content, else the ids of
// generation_config.json.
void add_special_ids(const gguf::GgufFile& f, const std::vector<std::string>& tokens, Metadata& m) {
  auto id_of = [&](const std::string& text) -> std::optional<uint32_t> {
    for (size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] == text) return (uint32_t)i;
    return std::nullopt;
  };
  const std::pair<const char*, const char*> roles[] = {
      {"bos", "bos"}, {"eos", "eos"}, {"unk", "unknown"}, {"pad", "padding"}};
  for (const auto& [hf, ggml] : roles) {
    std::optional<uint32_t> id;
    if (const Value* v = f.find(std::string("hablar.hf.") + hf + "_token"))
      if (const auto* s = std::get_if<std::string>(&v->data)) id = id_of(*s);
    if (!id && std::string(hf) == "bos" && f.has("hablar.hf.bos_token_id"))
      id = (uint32_t)f.get_uint("hablar.hf.bos_token_id");
    if (!id && std::string(hf) == "eos" && f.has("hablar.hf.eos_token_ids")) {
      const std::vector<int32_t> ids = f.get_i32_array("hablar.hf.eos_token_ids");
      if (!ids.empty()) id = (uint32_t)ids[0];
    }
    if (id) m.emplace_back(std::string("tokenizer.ggml.") + ggml + "_token_id", Value::u32(*id));
  }
}

}  // namespace

std::optional<std::vector<std::pair<std::string, gguf::Value>>> ggml_vocab_from_hf(
    const gguf::GgufFile& f) {
  if (!f.has("tokenizer.huggingface.json") || f.has("tokenizer.ggml.model")) return std::nullopt;
  const std::string where = f.path() + ": tokenizer.json";
  const json tj = parse_json_text(f.get_string("tokenizer.huggingface.json"), where);
  const json* model = tj.is_object() ? json_object_or_null(tj, "model", where) : nullptr;
  if (!model || model->value("type", "") != "BPE" || model->value("byte_fallback", false))
    return std::nullopt;
  if (tj.contains("normalizer") && !tj["normalizer"].is_null()) return std::nullopt;
  const std::optional<std::string> pre =
      tj.contains("pre_tokenizer") ? pre_name(tj["pre_tokenizer"]) : std::nullopt;
  if (!pre) return std::nullopt;
  int64_t rows = 0;
  if (const gguf::TensorInfo* e = f.find_tensor("token_embd.weight"); e && e->dims.size() > 1)
    rows = e->dims[1];
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  collect_tokens(*model, tj, rows, where, tokens, types);
  std::vector<std::string> merges;
  if (const json* ms = json_array_or_null(*model, "merges", where))
    for (const json& mg : *ms) merges.push_back(merge_text(mg, where));
  Metadata m;
  m.emplace_back("tokenizer.ggml.model", Value::string("gpt2"));
  m.emplace_back("tokenizer.ggml.pre", Value::string(*pre));
  m.emplace_back("tokenizer.ggml.tokens", Value::string_array(tokens));
  m.emplace_back("tokenizer.ggml.token_type", Value::i32_array(types));
  m.emplace_back("tokenizer.ggml.merges", Value::string_array(merges));
  add_special_ids(f, tokens, m);
  return m;
}

}  // namespace hablar::formats
