// Hugging Face directories described as GGUF metadata + tensor infos (see hf_model.h).
#include "formats/hf_model.h"

#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_depth.h"
#include "core/log.h"
#include "formats/apr.h"
#include "formats/hf_json.h"
#include "formats/safetensors.h"
#include "formats/tensor_names.h"

namespace hablar::formats {
namespace {

namespace fs = std::filesystem;
using gguf::Value;
using nlohmann::json;
using Metadata = std::vector<std::pair<std::string, Value>>;

// What the assembled file's tensors point into: the mapped shards and converted copies.
struct Keep {
  std::vector<safetensors::File> shards;
  std::vector<std::vector<uint8_t>> owned;
};

std::string arch_of(const json& cfg, const std::string& path) {
  const std::string type = json_string_or(cfg, "model_type", "", path);
  if (type == "llama" || type == "mistral") return "llama";
  if (type == "qwen2" || type == "qwen3") return type;
  throw_error(ErrorKind::kUnsupported, path + ": unsupported model_type '" + type +
                                           "' (supported: llama, mistral, qwen2, qwen3)");
}

// rope_theta and rope_scaling (transformers 4) or rope_parameters (transformers 5).
void add_rope(Metadata& m, const json& cfg, const std::string& a, const std::string& path) {
  const json* params = json_object_or_null(cfg, "rope_parameters", path);
  const json* scaling = json_object_or_null(cfg, "rope_scaling", path);
  double theta = json_number_or(cfg, "rope_theta", 10000.0, path);
  if (params) theta = json_number_or(*params, "rope_theta", theta, path);
  m.emplace_back(a + ".rope.freq_base", Value::f32((float)theta));
  const json* s = scaling ? scaling : params;
  if (!s) return;
  std::string type = json_string_or(*s, "rope_type", "", path);
  if (type.empty()) type = json_string_or(*s, "type", "default", path);
  if (type == "default") return;
  m.emplace_back(a + ".rope.scaling.type", Value::string(type));
  m.emplace_back(a + ".rope.scaling.factor",
                 Value::f32((float)json_number_or(*s, "factor", 1.0, path)));
  for (const auto& [hf, gg] : {std::pair{"low_freq_factor", "low_freq_factor"},
                               std::pair{"high_freq_factor", "high_freq_factor"}})
    if (s->contains(hf))
      m.emplace_back(a + ".rope.scaling." + gg,
                     Value::f32((float)json_number_or(*s, hf, 1.0, path)));
  if (s->contains("original_max_position_embeddings"))
    m.emplace_back(
        a + ".rope.scaling.original_context_length",
        Value::u32((uint32_t)json_positive_int(*s, "original_max_position_embeddings", path)));
}

// config.json -> <arch>.* keys, as llama.cpp's converter names them.
Metadata config_metadata(const json& cfg, const std::string& path, const std::string& dir) {
  const std::string a = arch_of(cfg, path);
  Metadata m;
  m.emplace_back("general.architecture", Value::string(a));
  m.emplace_back("general.name", Value::string(fs::path(dir).filename().string()));
  m.emplace_back("general.source.format", Value::string("huggingface"));
  auto u32 = [&](const std::string& key, const char* hf) {
    m.emplace_back(a + "." + key, Value::u32((uint32_t)json_positive_int(cfg, hf, path)));
  };
  u32("block_count", "num_hidden_layers");
  u32("embedding_length", "hidden_size");
  u32("attention.head_count", "num_attention_heads");
  if (cfg.contains("num_key_value_heads") && !cfg["num_key_value_heads"].is_null())
    u32("attention.head_count_kv", "num_key_value_heads");
  u32("feed_forward_length", "intermediate_size");
  u32("context_length", "max_position_embeddings");
  if (cfg.contains("head_dim") && !cfg["head_dim"].is_null())
    u32("attention.key_length", "head_dim");
  m.emplace_back(a + ".attention.layer_norm_rms_epsilon",
                 Value::f32((float)json_number_or(cfg, "rms_norm_eps", 1e-6, path)));
  add_rope(m, cfg, a, path);
  // transformers rotates q/k halves (NeoX order) for every family, llama included.
  m.emplace_back("hablar.rope.neox", Value::boolean(true));
  return m;
}

// The shard files of the directory, opened: those the index names, else model.safetensors.
std::vector<safetensors::File> open_shards(const fs::path& dir) {
  std::vector<safetensors::File> shards;
  const fs::path index = dir / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(index, ec)) {
    const json j = parse_json_file(index.string(), 64ull << 20);
    const json* map = json_object_or_null(j, "weight_map", index.string());
    if (!map) throw_error(ErrorKind::kFormat, index.string() + ": no \"weight_map\" object");
    std::set<std::string> files;
    for (const auto& [name, file] : map->items()) {
      if (!file.is_string())
        throw_error(ErrorKind::kFormat,
                    index.string() + ": weight_map[" + name + "] is not a string");
      const std::string f = file.get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f.find('\\') != std::string::npos ||
          f == "." || f == "..")
        throw_error(ErrorKind::kFormat,
                    index.string() + ": shard name '" + f + "' is not a plain file name");
      files.insert(f);
    }
    for (const std::string& f : files)
      shards.push_back(safetensors::File::open((dir / f).string()));
    for (const auto& [name, file] : map->items()) {
      const std::string f = file.get<std::string>();
      const size_t i = (size_t)std::distance(files.begin(), files.find(f));
      if (shards[i].find(name) == nullptr)
        throw_error(ErrorKind::kFormat, index.string() + ": tensor " + name + " is not in " + f);
    }
    return shards;
  }
  const fs::path single = dir / "model.safetensors";
  if (!fs::exists(single, ec))
    throw_error(ErrorKind::kFormat,
                dir.string() + ": no model.safetensors or model.safetensors.index.json");
  shards.push_back(safetensors::File::open(single.string()));
  return shards;
}

}  // namespace

std::vector<std::pair<std::string, gguf::Value>> hf_config_metadata(std::string_view config_json,
                                                                    const std::string& name) {
  const json cfg = parse_json_text(config_json, name);
  if (!cfg.is_object()) throw_error(ErrorKind::kFormat, name + ": not a JSON object");
  return config_metadata(cfg, name, name);
}

// Defined in hf_model_tensors.cpp / hf_model_tokenizer.cpp.
std::vector<gguf::TensorInfo> hf_tensor_infos(const std::vector<safetensors::File>& shards,
                                              const json& cfg, const std::string& config_path,
                                              const HfOpenOptions& options,
                                              std::vector<std::vector<uint8_t>>& owned);
void add_tokenizer_metadata(const fs::path& dir, Metadata& m);

bool is_hf_model_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && (fs::is_regular_file(fs::path(path) / "config.json", ec) ||
                                        fs::is_regular_file(fs::path(path) / "tokenizer.json", ec));
}

gguf::GgufFile open_hf_model(const std::string& dir_arg, const HfOpenOptions& options) {
  const fs::path dir(dir_arg);
  const std::string config_path = (dir / "config.json").string();
  std::error_code ec;
  if (!fs::exists(config_path, ec)) {  // a tokenizer alone (tokenize, detokenize, tests)
    Metadata meta{{"general.name", Value::string(dir.filename().string())}};
    add_tokenizer_metadata(dir, meta);
    return gguf::GgufFile::assemble(dir_arg, std::move(meta), {}, nullptr);
  }
  const json cfg = parse_json_file(config_path, 16ull << 20);
  if (!cfg.is_object()) throw_error(ErrorKind::kFormat, config_path + ": not a JSON object");
  Metadata meta = config_metadata(cfg, config_path, dir_arg);
  auto keep = std::make_shared<Keep>();
  keep->shards = open_shards(dir);
  std::vector<gguf::TensorInfo> tensors =
      hf_tensor_infos(keep->shards, cfg, config_path, options, keep->owned);
  add_tokenizer_metadata(dir, meta);
  return gguf::GgufFile::assemble(dir_arg, std::move(meta), std::move(tensors), std::move(keep));
}

gguf::GgufFile open_model_file(const std::string& path, const HfOpenOptions& options) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (!is_hf_model_dir(path))
      throw_error(ErrorKind::kFormat,
                  path + ": a directory without config.json or tokenizer.json is not a model");
    return open_hf_model(path, options);
  }
  if (path.size() > 4 && path.ends_with(".apr")) return apr::open(path);
  return gguf::GgufFile::open(path);
}

std::string read_small_file(const std::string& path, size_t max_bytes) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) throw_error(ErrorKind::kIo, path + ": " + ec.message());
  if (size > max_bytes)
    throw_error(ErrorKind::kFormat, path + ": " + std::to_string(size) + " bytes, more than the " +
                                        std::to_string(max_bytes) + " accepted");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error(ErrorKind::kIo, path + ": cannot open");
  std::string s((size_t)size, '\0');
  in.read(s.data(), (std::streamsize)size);
  if ((size_t)in.gcount() != size) throw_error(ErrorKind::kIo, path + ": short read");
  return s;
}

}  // namespace hablar::formats
