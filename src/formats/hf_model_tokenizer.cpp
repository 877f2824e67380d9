// The tokenizer files of a Hugging Face directory as metadata: tokenizer.json whole (the
// GGUF spec's tokenizer.huggingface.json), the chat template, and the special tokens and
// flags of tokenizer_config.json / generation_config.json under hablar.hf.* keys.
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/hf_json.h"
#include "formats/hf_model.h"

namespace hablar::formats {
namespace {

namespace fs = std::filesystem;
using gguf::Value;
using nlohmann::json;
using Metadata = std::vector<std::pair<std::string, Value>>;

// A special token of tokenizer_config.json: "text" or {"content": "text", ...}.
std::optional<std::string> token_content(const json& cfg, const char* key,
                                         const std::string& where) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) return json_string_or(*it, "content", "", where);
  throw_error(ErrorKind::kFormat, where + ": \"" + key + "\" must be a string or an object");
}

// chat_template: a string, or a list of {"name", "template"} (the "default" one is taken).
std::optional<std::string> chat_template_of(const json& cfg, const std::string& where) {
  auto it = cfg.find("chat_template");
  if (it == cfg.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    std::optional<std::string> first;
    for (const json& e : *it) {
      if (!e.is_object()) continue;
      const std::string name = json_string_or(e, "name", "", where);
      const std::string text = json_string_or(e, "template", "", where);
      if (name == "default") return text;
      if (!first) first = text;
    }
    return first;
  }
  throw_error(ErrorKind::kFormat, where + ": \"chat_template\" must be a string or a list");
}

void add_tokenizer_config(const fs::path& dir, Metadata& m) {
  const fs::path p = dir / "tokenizer_config.json";
  std::error_code ec;
  if (!fs::exists(p, ec)) return;
  const std::string where = p.string();
  const json cfg = parse_json_file(where, 64ull << 20);
  if (!cfg.is_object()) throw_error(ErrorKind::kFormat, where + ": not a JSON object");
  for (const char* role : {"bos", "eos", "unk", "pad"})
    if (auto t = token_content(cfg, (std::string(role) + "_token").c_str(), where))
      m.emplace_back(std::string("hablar.hf.") + role + "_token", Value::string(*t));
  for (const char* flag : {"add_bos_token", "add_eos_token"})
    if (cfg.contains(flag) && !cfg[flag].is_null())
      m.emplace_back(std::string("tokenizer.ggml.") + flag,
                     Value::boolean(json_bool_or(cfg, flag, false, where)));
  if (auto t = chat_template_of(cfg, where))
    m.emplace_back("tokenizer.chat_template", Value::string(*t));
}

// generation_config.json: eos_token_id (one id or a list) and the sampling defaults.
void add_generation_config(const fs::path& dir, Metadata& m) {
  const fs::path p = dir / "generation_config.json";
  std::error_code ec;
  if (!fs::exists(p, ec)) return;
  const std::string where = p.string();
  const json g = parse_json_file(where, 1ull << 20);
  if (!g.is_object()) throw_error(ErrorKind::kFormat, where + ": not a JSON object");
  std::vector<int32_t> eos;
  if (auto it = g.find("eos_token_id"); it != g.end() && !it->is_null()) {
    const json list = it->is_array() ? *it : json::array({*it});
    for (const json& v : list) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
        throw_error(ErrorKind::kFormat, where + ": eos_token_id must be token ids");
      eos.push_back((int32_t)v.get<int64_t>());
    }
  }
  if (!eos.empty()) m.emplace_back("hablar.hf.eos_token_ids", Value::i32_array(eos));
  const int64_t bos = json_int_or(g, "bos_token_id", -1, where);
  if (bos >= 0 && bos <= INT32_MAX)
    m.emplace_back("hablar.hf.bos_token_id", Value::u32((uint32_t)bos));
  // The sampling defaults under llama.cpp's general.sampling.* keys.
  if (g.contains("temperature"))
    m.emplace_back("general.sampling.temp",
                   Value::f32((float)json_number_or(g, "temperature", 1, where)));
  if (g.contains("top_p"))
    m.emplace_back("general.sampling.top_p",
                   Value::f32((float)json_number_or(g, "top_p", 1, where)));
  if (g.contains("top_k"))
    m.emplace_back("general.sampling.top_k",
                   Value::i32((int32_t)json_int_or(g, "top_k", 0, where)));
}

}  // namespace

void add_tokenizer_metadata(const fs::path& dir, Metadata& m) {
  const fs::path tj = dir / "tokenizer.json";
  std::error_code ec;
  if (!fs::exists(tj, ec))
    throw_error(ErrorKind::kUnsupported,
                dir.string() +
                    ": no tokenizer.json (a checkpoint with only a slow tokenizer, "
                    "tokenizer.model or vocab.json + merges.txt, is not supported)");
  std::string text = read_small_file(tj.string(), 512ull << 20);
  m.emplace_back("tokenizer.huggingface.json", Value::string(std::move(text)));
  add_tokenizer_config(dir, m);
  const fs::path jinja = dir / "chat_template.jinja";
  if (fs::exists(jinja, ec)) {
    std::string t = read_small_file(jinja.string(), 16ull << 20);
    for (auto& kv : m)
      if (kv.first == "tokenizer.chat_template") kv.second = Value::string(t);
    bool present = false;
    for (auto& kv : m) present |= kv.first == "tokenizer.chat_template";
    if (!present) m.emplace_back("tokenizer.chat_template", Value::string(std::move(t)));
  }
  add_generation_config(dir, m);
}

}  // namespace hablar::formats
