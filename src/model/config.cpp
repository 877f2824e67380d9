// ModelConfig from GGUF metadata (the keys llama.cpp writes: <arch>.block_count, ...).
#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "model/model.h"

namespace hablar::model {

std::string_view arch_name(Arch arch) {
  switch (arch) {
    case Arch::kLlama:
      return "llama";
    case Arch::kQwen2:
      return "qwen2";
    case Arch::kQwen3:
      return "qwen3";
  }
  return "?";
}

std::string supported_arch_names() {
  return "llama, qwen2, qwen3";
}

namespace {

Arch parse_arch(const std::string& name, const std::string& path) {
  if (name == "llama") return Arch::kLlama;
  if (name == "qwen2") return Arch::kQwen2;
  if (name == "qwen3") return Arch::kQwen3;
  throw_error(ErrorKind::kUnsupported, path + ": unsupported architecture '" + name +
                                           "' (supported: " + supported_arch_names() + ")");
}

int positive_int(const gguf::GgufFile& f, const std::string& key) {
  const uint64_t v = f.get_uint(key);
  if (v == 0 || v > (1u << 30))
    throw_error(ErrorKind::kFormat,
                f.path() + ": metadata " + key + " = " + std::to_string(v) + " is out of range");
  return (int)v;
}

// RoPE scaling: linear (<arch>.rope.scaling.type = "linear", factor), Llama 3 (type "llama3" with
// factor / low_freq_factor / high_freq_factor / original_context_length, or a rope_freqs.weight
// tensor as llama.cpp's converter writes for Llama 3.1, whose largest entry is the factor).
void read_rope_scaling(const gguf::GgufFile& f, const std::string& a, RopeParams& rope) {
  const std::string type = f.get_string_or(a + ".rope.scaling.type", "none");
  const double factor = f.get_float_or(a + ".rope.scaling.factor", 1.0);
  const int original = (int)f.get_uint_or(a + ".rope.scaling.original_context_length", 8192);
  using Scaling = RopeParams::Scaling;
  if (type == "none" || ((type == "linear") && factor == 1.0)) {
    rope.scaling = Scaling::kNone;
  } else if (type == "linear") {
    rope.scaling = Scaling::kLinear;
    rope.factor = (float)factor;
  } else if (type == "llama3") {
    rope.scaling = Scaling::kLlama3;
    rope.factor = (float)factor;
    rope.low_freq_factor = (float)f.get_float_or(a + ".rope.scaling.low_freq_factor", 1.0);
    rope.high_freq_factor = (float)f.get_float_or(a + ".rope.scaling.high_freq_factor", 4.0);
    rope.original_context = original;
  } else {
    throw_error(ErrorKind::kUnsupported, f.path() + ": unsupported rope scaling type '" + type +
                                             "' (supported: none, linear, llama3)");
  }
  if (const gguf::TensorInfo* freqs = f.find_tensor("rope_freqs.weight");
      freqs != nullptr && rope.scaling == Scaling::kNone) {
    if (freqs->type != DType::F32)
      throw_error(ErrorKind::kFormat, f.path() + ": rope_freqs.weight must be f32");
    const auto* v = reinterpret_cast<const float*>(freqs->data);
    const float max_factor = *std::max_element(v, v + freqs->n_elements());
    rope.scaling = Scaling::kLlama3;
    rope.factor = max_factor;
    rope.original_context = original;
    log::info("rope_freqs.weight present: Llama 3 scaling with factor {}", max_factor);
  }
  if (!(rope.factor > 0.0f) || !std::isfinite(rope.factor))
    throw_error(ErrorKind::kFormat, f.path() + ": rope scaling factor must be > 0");
}

}  // namespace

ModelConfig config_from_gguf(const gguf::GgufFile& f) {
  ModelConfig c;
  c.arch = f.get_string("general.architecture");
  c.arch_kind = parse_arch(c.arch, f.path());
  const std::string& a = c.arch;
  c.n_layers = positive_int(f, a + ".block_count");
  c.n_embd = positive_int(f, a + ".embedding_length");
  c.n_heads = positive_int(f, a + ".attention.head_count");
  c.n_kv_heads = f.has(a + ".attention.head_count_kv")
                     ? positive_int(f, a + ".attention.head_count_kv")
                     : c.n_heads;
  c.n_ff = positive_int(f, a + ".feed_forward_length");
  c.n_ctx_train = positive_int(f, a + ".context_length");
  c.head_dim = f.has(a + ".attention.key_length") ? positive_int(f, a + ".attention.key_length")
                                                  : c.n_embd / c.n_heads;
  if (f.has(a + ".attention.value_length") &&
      positive_int(f, a + ".attention.value_length") != c.head_dim)
    throw_error(ErrorKind::kUnsupported,
                f.path() + ": attention.value_length differs from key_length (not supported)");
  if (c.n_heads % c.n_kv_heads != 0)
    throw_error(ErrorKind::kFormat, f.path() + ": head_count " + std::to_string(c.n_heads) +
                                        " is not a multiple of head_count_kv " +
                                        std::to_string(c.n_kv_heads));
  if (c.head_dim % 2 != 0)
    throw_error(ErrorKind::kFormat, f.path() + ": head dimension must be even");
  c.rms_eps = (float)f.get_float_or(a + ".attention.layer_norm_rms_epsilon", 1e-5);
  if (!(c.rms_eps > 0.0f) || !std::isfinite(c.rms_eps))
    throw_error(ErrorKind::kFormat, f.path() + ": layer_norm_rms_epsilon must be > 0");

  c.rope.n_dims = (int)f.get_uint_or(a + ".rope.dimension_count", (uint64_t)c.head_dim);
  if (c.rope.n_dims <= 0 || c.rope.n_dims > c.head_dim || c.rope.n_dims % 2 != 0)
    throw_error(ErrorKind::kFormat, f.path() + ": rope.dimension_count " +
                                        std::to_string(c.rope.n_dims) + " does not fit head dim " +
                                        std::to_string(c.head_dim));
  c.rope.freq_base = (float)f.get_float_or(a + ".rope.freq_base", 10000.0);
  if (!(c.rope.freq_base > 0.0f))
    throw_error(ErrorKind::kFormat, f.path() + ": rope.freq_base must be > 0");
  c.rope.neox = c.arch_kind != Arch::kLlama;  // llama: adjacent pairs; qwen2/qwen3: NeoX halves
  // A Hugging Face checkpoint keeps transformers' q/k order: NeoX halves for llama too.
  c.rope.neox = f.get_bool_or("hablar.rope.neox", c.rope.neox);
  read_rope_scaling(f, a, c.rope);

  c.qkv_bias = c.arch_kind == Arch::kQwen2;
  c.qk_norm = c.arch_kind == Arch::kQwen3;
  c.tied_output = f.find_tensor("output.weight") == nullptr;
  const gguf::TensorInfo& embd = f.tensor("token_embd.weight");
  c.n_vocab = (int)embd.rows();
  return c;
}

}  // namespace hablar::model
