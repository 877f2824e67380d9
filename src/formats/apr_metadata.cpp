// APR v2 metadata (one JSON object) as GGUF keys, and back (for the writer).
#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "formats/apr.h"
#include "formats/hf_json.h"

namespace hablar::apr {

using gguf::Value;
using nlohmann::json;
using Metadata = std::vector<std::pair<std::string, Value>>;

namespace {

std::vector<std::string> string_list(const json& j, const std::string& key,
                                     const std::string& name) {
  std::vector<std::string> out;
  for (const json& e : j) {
    if (!e.is_string()) throw_error(ErrorKind::kFormat, name + ": " + key + " must hold strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

// tokenizer.model / tokenizer.model_type spellings -> tokenizer.ggml.model.
std::string tokenizer_model(std::string m) {
  if (m == "bpe" || m == "gpt2" || m == "BPE" || m == "byte_level_bpe") return "gpt2";
  if (m == "spm" || m == "llama" || m == "sentencepiece") return "llama";
  if (m == "wordpiece" || m == "bert" || m == "WordPiece") return "bert";
  return m;
}

void tokenizer_metadata(const json& m, const std::string& name, Metadata& out) {
  const json* vocab = formats::json_array_or_null(m, "tokenizer.vocabulary", name);
  if (!vocab) return;
  out.emplace_back("tokenizer.ggml.tokens",
                   Value::string_array(string_list(*vocab, "tokenizer.vocabulary", name)));
  std::string model = formats::json_string_or(m, "tokenizer.model", "", name);
  if (model.empty()) model = formats::json_string_or(m, "tokenizer.model_type", "gpt2", name);
  out.emplace_back("tokenizer.ggml.model", Value::string(tokenizer_model(model)));
  if (const json* merges = formats::json_array_or_null(m, "tokenizer.merges", name))
    out.emplace_back("tokenizer.ggml.merges",
                     Value::string_array(string_list(*merges, "tokenizer.merges", name)));
  if (const json* scores = formats::json_array_or_null(m, "tokenizer.scores", name)) {
    std::vector<float> v;
    for (const json& e : *scores) {
      if (!e.is_number())
        throw_error(ErrorKind::kFormat, name + ": tokenizer.scores must hold numbers");
      v.push_back(e.get<float>());
    }
    out.emplace_back("tokenizer.ggml.scores", Value::f32_array(v));
  }
  if (const json* types = formats::json_array_or_null(m, "tokenizer.token_type", name)) {
    std::vector<int32_t> v;
    for (const json& e : *types) {
      if (!e.is_number_integer())
        throw_error(ErrorKind::kFormat, name + ": tokenizer.token_type must hold integers");
      v.push_back((int32_t)e.get<int64_t>());
    }
    out.emplace_back("tokenizer.ggml.token_type", Value::i32_array(v));
  }
  for (const char* role : {"bos", "eos"}) {
    const int64_t id =
        formats::json_int_or(m, (std::string("tokenizer.") + role + "_token_id").c_str(), -1, name);
    if (id >= 0 && id <= INT32_MAX)
      out.emplace_back(std::string("tokenizer.ggml.") + role + "_token_id",
                       Value::u32((uint32_t)id));
  }
  const std::string pre = formats::json_string_or(m, "tokenizer.pre_type", "", name);
  if (!pre.empty()) out.emplace_back("tokenizer.ggml.pre", Value::string(pre));
  if (m.contains("tokenizer.add_bos_token"))
    out.emplace_back(
        "tokenizer.ggml.add_bos_token",
        Value::boolean(formats::json_bool_or(m, "tokenizer.add_bos_token", false, name)));
}

// A JSON value as GGUF metadata: integers as u32 (u64 / i64 when out of range), other
// numbers as f32, booleans, strings, and arrays of one of those kinds; nullopt otherwise.
std::optional<Value> gguf_value_of(const json& j) {
  if (j.is_boolean()) return Value::boolean(j.get<bool>());
  if (j.is_string()) return Value::string(j.get<std::string>());
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    return u <= UINT32_MAX ? Value::u32((uint32_t)u) : Value::u64(u);
  }
  if (j.is_number_integer()) {
    const int64_t i = j.get<int64_t>();
    return i >= 0 && i <= UINT32_MAX ? Value::u32((uint32_t)i) : Value::i64(i);
  }
  if (j.is_number()) return Value::f32(j.get<float>());
  if (!j.is_array() || j.empty()) return std::nullopt;
  std::vector<Value> items;
  for (const json& e : j) {
    std::optional<Value> v = e.is_array() ? std::nullopt : gguf_value_of(e);
    if (!v || (!items.empty() && v->type != items.front().type)) return std::nullopt;
    items.push_back(std::move(*v));
  }
  const gguf::ValueType t = items.front().type;
  return Value::array(t, std::move(items));
}

// The writer's extra keys: GGUF's own <arch>.* and hablar.* keys, taken back unless a
// field above already gave the key.
void extra_gguf_keys(const json& m, const std::string& a, const std::string& name, Metadata& out) {
  for (const auto& item : m.items()) {
    const std::string& key = item.key();
    if (!key.starts_with(a + ".") && !key.starts_with("hablar.")) continue;
    const bool given =
        std::any_of(out.begin(), out.end(), [&](const auto& kv) { return kv.first == key; });
    if (given) continue;
    std::optional<Value> v = gguf_value_of(item.value());
    if (!v) throw_error(ErrorKind::kFormat, name + ": metadata " + key + " has an unusable value");
    out.emplace_back(key, std::move(*v));
  }
}

}  // namespace

void apr_metadata(const json& m, const std::string& name, Metadata& out) {
  const std::string a = formats::json_string_or(m, "architecture", "", name);
  if (a.empty()) throw_error(ErrorKind::kFormat, name + ": APR metadata has no \"architecture\"");
  out.emplace_back("general.architecture", Value::string(a));
  out.emplace_back("general.source.format", Value::string("apr"));
  auto u32 = [&](const char* key, const char* gguf_key) {
    if (m.contains(key) && !m[key].is_null())
      out.emplace_back(a + "." + gguf_key,
                       Value::u32((uint32_t)formats::json_positive_int(m, key, name)));
  };
  u32("num_layers", "block_count");
  u32("hidden_size", "embedding_length");
  u32("num_heads", "attention.head_count");
  u32("num_kv_heads", "attention.head_count_kv");
  u32("intermediate_size", "feed_forward_length");
  u32("head_dim", "attention.key_length");
  if (m.contains("max_position_embeddings"))
    u32("max_position_embeddings", "context_length");
  else
    out.emplace_back(a + ".context_length", Value::u32(4096));
  if (m.contains("rms_norm_eps"))
    out.emplace_back(a + ".attention.layer_norm_rms_epsilon",
                     Value::f32((float)formats::json_number_or(m, "rms_norm_eps", 1e-6, name)));
  if (m.contains("rope_theta"))
    out.emplace_back(a + ".rope.freq_base",
                     Value::f32((float)formats::json_number_or(m, "rope_theta", 1e4, name)));
  if (m.contains("rope_type"))
    out.emplace_back("hablar.rope.neox",
                     Value::boolean(formats::json_int_or(m, "rope_type", 0, name) == 2));
  extra_gguf_keys(m, a, name, out);
  std::string tmpl = formats::json_string_or(m, "chat_template", "", name);
  if (tmpl.empty()) tmpl = formats::json_string_or(m, "tokenizer.chat_template", "", name);
  if (!tmpl.empty()) out.emplace_back("tokenizer.chat_template", Value::string(tmpl));
  tokenizer_metadata(m, name, out);
}

}  // namespace hablar::apr
