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
#include "formats/hf_families.h"
#include "formats/hf_json.h"
#include "formats/hf_model.h"
#include "formats/safetensors.h"
#include "formats/tensor_names.h"

namespace hablar::formats {

using nlohmann::json;

std::optional<MappedName> gguf_name_of_hf(std::string_view name) {
  return gguf_name_in(kLlamaFamilyTensorNames, name);
}

std::optional<MappedName> gguf_name_in(std::span<const TensorNamePair> table,
                                       std::string_view name) {
  for (const TensorNamePair& p : table) {
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

namespace {

// Gemma's norm weights as llama.cpp's converter writes them: 1 + w, in F32.
void add_one_to_norm(gguf::TensorInfo& t, std::vector<std::vector<uint8_t>>& owned) {
  const int64_t n = t.n_elements();
  std::vector<float> v((size_t)n);
  dequantize_row(t.type, t.data, v.data(), n);
  for (float& x : v) x += 1.0f;
  owned.emplace_back((const uint8_t*)v.data(), (const uint8_t*)(v.data() + n));
  t.type = DType::F32, t.data = owned.back().data(), t.nbytes = owned.back().size();
}

// Each layer's experts, one matrix per expert, stacked into GGUF's 3-D tensor [cols, rows,
// n_experts] (a copy; every expert present, all of one shape and type).
struct ExpertStacks {
  std::map<std::string, std::vector<gguf::TensorInfo>> parts;  // GGUF name -> by expert

  void add(const ExpertName& e, gguf::TensorInfo t, const std::string& file) {
    std::vector<gguf::TensorInfo>& v = parts[e.gguf];
    if ((size_t)e.expert >= v.size()) v.resize((size_t)e.expert + 1);
    if (v[(size_t)e.expert].data != nullptr)
      throw_error(ErrorKind::kFormat, file + ": expert " + std::to_string(e.expert) + " of " +
                                          e.gguf + " is stored twice");
    v[(size_t)e.expert] = std::move(t);
  }

  void stack_into(std::vector<gguf::TensorInfo>& out, std::vector<std::vector<uint8_t>>& owned,
                  const std::string& where) const {
    for (const auto& [name, experts] : parts) {
      const gguf::TensorInfo& first = experts.front();
      std::vector<uint8_t> bytes;
      bytes.reserve(first.nbytes * experts.size());
      for (size_t e = 0; e < experts.size(); ++e) {
        const gguf::TensorInfo& t = experts[e];
        if (t.data == nullptr || t.dims != first.dims || t.type != first.type)
          throw_error(ErrorKind::kFormat, where + ": expert " + std::to_string(e) + " of " + name +
                                              " is missing or differs from expert 0");
        bytes.insert(bytes.end(), t.data, t.data + t.nbytes);
      }
      owned.push_back(std::move(bytes));
      gguf::TensorInfo s = first;
      s.name = name;
      s.dims = {first.dims[0], first.dims[1], (int64_t)experts.size()};
      s.data = owned.back().data(), s.nbytes = owned.back().size();
      out.push_back(std::move(s));
    }
  }
};

// Phi-3 LongRoPE's factor lists (rope_scaling.short_factor / long_factor) as the F32
// tensors llama.cpp's converter writes.
void add_longrope_factors(const json& cfg, const std::string& path,
                          std::vector<gguf::TensorInfo>& out,
                          std::vector<std::vector<uint8_t>>& owned) {
  const json* s = json_object_or_null(cfg, "rope_scaling", path);
  if (!s) s = json_object_or_null(cfg, "rope_parameters", path);
  if (!s) return;
  for (const auto& [key, name] : {std::pair{"short_factor", "rope_factors_short.weight"},
                                  std::pair{"long_factor", "rope_factors_long.weight"}}) {
    const json* list = json_array_or_null(*s, key, path);
    if (!list) continue;
    std::vector<float> v;
    for (const json& x : *list) {
      if (!x.is_number())
        throw_error(ErrorKind::kFormat, path + ": " + key + " holds a non-number");
      v.push_back(x.get<float>());
    }
    owned.emplace_back((const uint8_t*)v.data(), (const uint8_t*)(v.data() + v.size()));
    gguf::TensorInfo t;
    t.name = name, t.type = DType::F32, t.dims = {(int64_t)v.size()};
    t.data = owned.back().data(), t.nbytes = owned.back().size();
    out.push_back(std::move(t));
  }
}

// Matrices converted to `q` at load (2-D and the experts' 3-D tensors).
void quantize_tensors(std::vector<gguf::TensorInfo>& out, const HfOpenOptions& options,
                      std::vector<std::vector<uint8_t>>& owned) {
  const DType q = *options.quantize;
  if (!has_quantizer(q))
    throw_error(ErrorKind::kUnsupported,
                "--quantize " + std::string(dtype_name(q)) + ": no quantizer for that type");
  ThreadPool pool(options.n_threads > 0 ? options.n_threads
                                        : (int)std::max(1u, std::thread::hardware_concurrency()));
  owned.reserve(owned.size() + out.size());
  for (gguf::TensorInfo& t : out) {
    if (t.dims.size() < 2 || t.dims[0] % dtype_traits(q).block_elems != 0) continue;
    owned.push_back(quantize_matrix(t, q, pool));
    t.type = q;
    t.data = owned.back().data();
    t.nbytes = owned.back().size();
  }
}

}  // namespace

std::vector<gguf::TensorInfo> hf_tensor_infos(const std::vector<safetensors::File>& shards,
                                              const json& cfg, const std::string& config_path,
                                              const HfOpenOptions& options,
                                              std::vector<std::vector<uint8_t>>& owned) {
  const std::string arch = hf_arch_of(cfg, config_path);
  const int64_t n_layers = json_positive_int(cfg, "num_hidden_layers", config_path);
  const bool tied =
      json_bool_or(cfg, "tie_word_embeddings", arch.starts_with("gemma"), config_path);
  std::vector<gguf::TensorInfo> out;
  std::map<std::string, std::string> seen;  // GGUF name -> HF name
  ExpertStacks experts;
  size_t skipped = 0;
  for (const safetensors::File& shard : shards) {
    for (const safetensors::Tensor& t : shard.tensors()) {
      const std::string name = hf_text_tensor_name(t.name);
      if (const std::optional<ExpertName> e = expert_of_hf(arch, name)) {
        if (e->layer >= n_layers)
          throw_error(ErrorKind::kFormat, shard.path() + ": tensor " + t.name + " is past the " +
                                              std::to_string(n_layers) + " layers of config.json");
        experts.add(*e, info_of(t, e->gguf, shard.path()), shard.path());
        continue;
      }
      const std::optional<MappedName> m = gguf_name_of_hf(arch, name);
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
      gguf::TensorInfo& info = out.back();
      if (m->gguf.ends_with("ffn_gate_inp_shexp.weight") && info.n_elements() == info.dims[0])
        info.dims = {info.dims[0]};  // Qwen2-MoE's shared-expert gate [1 x n_embd]: a vector
      if (norm_gets_one_added(arch, m->gguf)) {
        add_one_to_norm(info, owned);
      } else if ((uintptr_t)info.data % 4 != 0) {
        // safetensors does not promise aligned data; kernels read whole elements, so a tensor
        // at an odd offset is copied once (writers pad the header, so this is rare).
        owned.emplace_back(info.data, info.data + info.nbytes);
        info.data = owned.back().data();
      }
    }
  }
  experts.stack_into(out, owned, config_path);
  if (arch == "phi3") add_longrope_factors(cfg, config_path, out, owned);
  if (!tied && !seen.count("output.weight") && seen.count("token_embd.weight"))
    log::warn("{}: no lm_head.weight; the classifier reuses embed_tokens", config_path);
  if (skipped) log::info("{}: {} tensors not used by the model skipped", config_path, skipped);
  if (options.quantize) quantize_tensors(out, options, owned);
  return out;
}

}  // namespace hablar::formats
