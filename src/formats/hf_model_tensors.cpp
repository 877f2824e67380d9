// The tensors of a Hugging Face checkpoint under their GGUF names (tensor_names.h), in
// place in the mapped shards, or converted to a quantized type when asked.
#include <algorithm>
#include <cstdint>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/quant.h"
#include "core/thread_pool.h"
#include "formats/hf_json.h"
#include "formats/hf_model.h"
#include "formats/safetensors.h"
#include "formats/tensor_names.h"

namespace hablar::formats {

using nlohmann::json;

std::optional<MappedName> gguf_name_of_hf(std::string_view name) {
  for (const TensorNamePair& p : kLlamaFamilyTensorNames) {
    const size_t at = p.hf.find("{}");
    if (at == std::string_view::npos) {
      if (name == p.hf) return MappedName{std::string(p.gguf), -1};
      continue;
    }
    const std::string_view prefix = p.hf.substr(0, at), suffix = p.hf.substr(at + 2);
    if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) ||
        !name.ends_with(suffix))
      continue;
    const std::string_view digits =
        name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    if (digits.size() > 6 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    const int layer = std::stoi(std::string(digits));
    return MappedName{tensor_name(p.gguf, layer), layer};
  }
  return std::nullopt;
}

namespace {

// Rows of a [rows x cols] matrix converted to `type`, spread over the pool's threads.
std::vector<uint8_t> quantize_matrix(const gguf::TensorInfo& t, DType type, ThreadPool& pool) {
  const int64_t cols = t.dims[0], rows = t.rows();
  const size_t in_row = dtype_row_bytes(t.type, cols), out_row = dtype_row_bytes(type, cols);
  std::vector<uint8_t> out((size_t)rows * out_row);
  pool.run([&](int ti, int nt) {
    std::vector<float> row((size_t)cols);
    for (int64_t r = ti; r < rows; r += nt) {
      dequantize_row(t.type, t.data + (size_t)r * in_row, row.data(), cols);
      quantize_row(type, row.data(), out.data() + (size_t)r * out_row, cols);
    }
  });
  return out;
}

gguf::TensorInfo info_of(const safetensors::Tensor& t, std::string gguf_name,
                         const std::string& file) {
  if (!t.dtype || (*t.dtype != DType::F32 && *t.dtype != DType::F16 && *t.dtype != DType::BF16))
    throw_error(ErrorKind::kUnsupported, file + ": tensor " + t.name + " has dtype " +
                                             t.dtype_name + " (supported: F32, F16, BF16)");
  if (t.shape.empty() || t.shape.size() > 2)
    throw_error(ErrorKind::kFormat, file + ": tensor " + t.name + " has " +
                                        std::to_string(t.shape.size()) + " dims (expected 1 or 2)");
  gguf::TensorInfo info;
  info.name = std::move(gguf_name);
  info.dims.assign(t.shape.rbegin(), t.shape.rend());  // innermost first, as GGUF
  info.type = *t.dtype;
  info.nbytes = t.nbytes;
  info.data = t.data;
  return info;
}

}  // namespace

std::vector<gguf::TensorInfo> hf_tensor_infos(const std::vector<safetensors::File>& shards,
                                              const json& cfg, const std::string& config_path,
                                              const HfOpenOptions& options,
                                              std::vector<std::vector<uint8_t>>& owned) {
  const int64_t n_layers = json_positive_int(cfg, "num_hidden_layers", config_path);
  const bool tied = json_bool_or(cfg, "tie_word_embeddings", false, config_path);
  std::vector<gguf::TensorInfo> out;
  std::map<std::string, std::string> seen;  // GGUF name -> HF name
  size_t skipped = 0;
  for (const safetensors::File& shard : shards) {
    for (const safetensors::Tensor& t : shard.tensors()) {
      const std::optional<MappedName> m = gguf_name_of_hf(t.name);
      if (!m || (tied && m->gguf == "output.weight")) {
        ++skipped;
        continue;
      }
      if (m->layer >= n_layers)
        throw_error(ErrorKind::kFormat, shard.path() + ": tensor " + t.name + " is past the " +
                                            std::to_string(n_layers) + " layers of config.json");
      if (auto [it, added] = seen.emplace(m->gguf, t.name); !added)
        throw_error(ErrorKind::kFormat, shard.path() + ": tensor " + t.name + " is stored twice");
      out.push_back(info_of(t, m->gguf, shard.path()));
      // safetensors does not promise aligned data; kernels read whole elements, so a tensor
      // at an odd offset is copied once (writers pad the header, so this is rare).
      if ((uintptr_t)out.back().data % 4 != 0) {
        owned.emplace_back(out.back().data, out.back().data + out.back().nbytes);
        out.back().data = owned.back().data();
      }
    }
  }
  if (!tied && !seen.count("output.weight") && seen.count("token_embd.weight"))
    log::warn("{}: no lm_head.weight; the classifier reuses embed_tokens", config_path);
  if (skipped) log::info("{}: {} tensors not used by the model skipped", config_path, skipped);
  if (!options.quantize) return out;
  const DType q = *options.quantize;
  if (!has_quantizer(q))
    throw_error(ErrorKind::kUnsupported,
                "--quantize " + std::string(dtype_name(q)) + ": no quantizer for that type");
  ThreadPool pool(options.n_threads > 0 ? options.n_threads
                                        : (int)std::max(1u, std::thread::hardware_concurrency()));
  owned.reserve(out.size());
  for (gguf::TensorInfo& t : out) {
    if (t.dims.size() != 2 || t.dims[0] % dtype_traits(q).block_elems != 0) continue;
    owned.push_back(quantize_matrix(t, q, pool));
    t.type = q;
    t.data = owned.back().data();
    t.nbytes = owned.back().size();
  }
  return out;
}

}  // namespace hablar::formats
