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
#include "formats/hf_families.h"
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

// config.json -> <arch>.* keys, as llama.cpp's converter names them (hf_families.cpp).
Metadata config_metadata(const json& cfg, const std::string& path, const std::string& dir) {
  const std::string a = hf_arch_of(cfg, path);
  Metadata m;
  m.emplace_back("general.architecture", Value::string(a));
  m.emplace_back("general.name", Value::string(fs::path(dir).filename().string()));
  m.emplace_back("general.source.format", Value::string("huggingface"));
  for (auto& kv : hf_family_metadata(cfg, a, path)) m.push_back(std::move(kv));
  // transformers rotates q/k halves (NeoX order) for every family, llama included, but GLM-4,
  // ERNIE 4.5 and Cohere, whose modeling code interleaves (adjacent pairs, as llama.cpp turns
  // their files).
  m.emplace_back("hablar.rope.neox", Value::boolean(a != "glm4" && a != "ernie4_5" &&
                                                    a != "command-r" && a != "cohere2"));
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

// A sentence-transformers directory's pooling and Dense modules (hf_families.h): each Dense
// file's linear.weight under its GGUF name, in place in its own mapped file.
void add_dense_modules(const fs::path& dir, const std::string& arch, Metadata& meta, Keep& keep,
                       std::vector<gguf::TensorInfo>& tensors) {
  for (const DenseModule& d : hf_sentence_transformers(dir.string(), arch, meta)) {
    keep.shards.push_back(safetensors::File::open(d.file));
    const safetensors::Tensor* t = keep.shards.back().find("linear.weight");
    if (t == nullptr) throw_error(ErrorKind::kFormat, d.file + ": no linear.weight");
    if (!t->dtype || t->shape.size() != 2)
      throw_error(ErrorKind::kFormat, d.file + ": linear.weight must be a float matrix");
    gguf::TensorInfo info;
    info.name = d.gguf;
    info.dims.assign(t->shape.rbegin(), t->shape.rend());
    info.type = *t->dtype;
    info.nbytes = t->nbytes;
    info.data = t->data;
    tensors.push_back(std::move(info));
  }
}

}  // namespace

std::vector<std::pair<std::string, gguf::Value>> hf_config_metadata(std::string_view config_json,
                                                                    const std::string& name) {
  const json cfg = parse_json_text(config_json, name);
  if (!cfg.is_object()) throw_error(ErrorKind::kFormat, name + ": not a JSON object");
  return config_metadata(hf_text_config(cfg, name), name, name);
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
  const json full_cfg = parse_json_file(config_path, 16ull << 20);
  if (!full_cfg.is_object()) throw_error(ErrorKind::kFormat, config_path + ": not a JSON object");
  const json cfg = hf_text_config(full_cfg, config_path);
  Metadata meta = config_metadata(cfg, config_path, dir_arg);
  auto keep = std::make_shared<Keep>();
  keep->shards = open_shards(dir);
  std::vector<gguf::TensorInfo> tensors =
      hf_tensor_infos(keep->shards, cfg, config_path, options, keep->owned);
  add_dense_modules(dir, hf_arch_of(cfg, config_path), meta, *keep, tensors);
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
