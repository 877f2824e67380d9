// Hugging Face model families in GGUF's vocabulary (hf_families.h): the keys llama.cpp's
// converter writes from each config.json, and each family's tensor names.
#include "formats/hf_families.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "formats/hf_json.h"

namespace hablar::formats {

using gguf::Value;
using nlohmann::json;

json hf_text_config(const json& cfg, const std::string& path) {
  // The language model's model_type inside each multimodal one, with the defaults of its
  // transformers configuration class (config.json writes only the fields that differ).
  struct Wrapped {
    const char* outer;
    const char* text_type;
    json defaults;
  };
  static const Wrapped kWrapped[] = {
      {"gemma3",
       "gemma3_text",
       {{"vocab_size", 262208},
        {"hidden_size", 2304},
        {"intermediate_size", 9216},
        {"num_hidden_layers", 26},
        {"num_attention_heads", 8},
        {"num_key_value_heads", 4},
        {"head_dim", 256},
        {"max_position_embeddings", 131072},
        {"rms_norm_eps", 1e-6},
        {"query_pre_attn_scalar", 256},
        {"sliding_window", 4096},
        {"rope_theta", 1000000.0},
        {"rope_local_base_freq", 10000.0}}},
      {"mistral3",
       "mistral",
       {{"vocab_size", 32000},
        {"hidden_size", 4096},
        {"intermediate_size", 14336},
        {"num_hidden_layers", 32},
        {"num_attention_heads", 32},
        {"num_key_value_heads", 8},
        {"max_position_embeddings", 131072},
        {"rms_norm_eps", 1e-6},
        {"rope_theta", 10000.0},
        {"sliding_window", 4096}}},
      // Ministral 3 (the text model's model_type says which)
      {"mistral3",
       "ministral3",
       {{"vocab_size", 131072},
        {"hidden_size", 4096},
        {"intermediate_size", 14336},
        {"num_hidden_layers", 34},
        {"num_attention_heads", 32},
        {"num_key_value_heads", 8},
        {"head_dim", 128},
        {"max_position_embeddings", 262144},
        {"rms_norm_eps", 1e-5},
        {"rope_parameters",
         {{"rope_type", "yarn"},
          {"rope_theta", 1000000.0},
          {"factor", 16.0},
          {"original_max_position_embeddings", 16384},
          {"beta_fast", 32.0},
          {"beta_slow", 1.0},
          {"mscale_all_dim", 1.0},
          {"mscale", 1.0},
          {"llama_4_scaling_beta", 0.1}}}}},
  };
  const std::string type = json_string_or(cfg, "model_type", "", path);
  for (const Wrapped& w : kWrapped) {
    if (type != w.outer) continue;
    const json* text = json_object_or_null(cfg, "text_config", path);
    if (!text)
      throw_error(ErrorKind::kFormat, path + ": a " + type + " config without text_config");
    // (A text model_type other than this entry's: a later entry's, or the first one's if none.)
    const std::string text_type = json_string_or(*text, "model_type", w.text_type, path);
    if (text_type != w.text_type &&
        std::any_of(std::begin(kWrapped), std::end(kWrapped), [&](const Wrapped& other) {
          return type == other.outer && text_type == other.text_type;
        }))
      continue;
    json out = w.defaults;
    for (const auto& [key, value] : text->items()) out[key] = value;
    out["model_type"] = w.text_type;
    if (!text->contains("tie_word_embeddings") && cfg.contains("tie_word_embeddings"))
      out["tie_word_embeddings"] = cfg["tie_word_embeddings"];
    return out;
  }
  return cfg;
}

std::string hf_text_tensor_name(std::string_view name) {
  // A base model saved alone (Gemma3TextModel, as sentence-transformers keeps EmbeddingGemma)
  // names its tensors without the "model." of the causal-LM wrapper.
  if (name.starts_with("layers.") || name == "embed_tokens.weight" || name == "norm.weight")
    return "model." + std::string(name);
  for (const auto& [prefix, replacement] :
       {std::pair<std::string_view, std::string_view>{"model.language_model.", "model."},
        {"language_model.model.", "model."},
        {"language_model.lm_head.", "lm_head."}})
    if (name.starts_with(prefix))
      return std::string(replacement) + std::string(name.substr(prefix.size()));
  return std::string(name);
}

std::string hf_arch_of(const json& cfg, const std::string& path) {
  const std::string type = json_string_or(cfg, "model_type", "", path);
  // EmbeddingGemma: Gemma 3's text model attending both ways.
  if (type == "gemma3_text" && json_bool_or(cfg, "use_bidirectional_attention", false, path))
    return "gemma-embedding";
  static const std::map<std::string, std::string> kArches = {{"llama", "llama"},
                                                             {"mistral", "llama"},
                                                             {"mixtral", "llama"},
                                                             {"qwen2", "qwen2"},
                                                             {"qwen3", "qwen3"},
                                                             {"qwen2_moe", "qwen2moe"},
                                                             {"qwen3_moe", "qwen3moe"},
                                                             {"phi3", "phi3"},
                                                             {"phi", "phi2"},
                                                             {"smollm3", "smollm3"},
                                                             {"granite", "granite"},
                                                             {"gemma", "gemma"},
                                                             {"gemma2", "gemma2"},
                                                             {"gemma3_text", "gemma3"},
                                                             {"olmo2", "olmo2"},
                                                             {"olmo3", "olmo2"},
                                                             {"starcoder2", "starcoder2"},
                                                             {"exaone4", "exaone4"},
                                                             {"glm4", "glm4"},
                                                             {"arcee", "arcee"},
                                                             {"ernie4_5", "ernie4_5"},
                                                             {"ministral3", "mistral3"},
                                                             {"seed_oss", "seed_oss"},
                                                             {"cohere", "command-r"},
                                                             {"cohere2", "cohere2"},
                                                             {"olmoe", "olmoe"},
                                                             {"nemotron", "nemotron"},
                                                             {"stablelm", "stablelm"}};
  if (const auto it = kArches.find(type); it != kArches.end()) return it->second;
  std::string names;
  for (const auto& [name, arch] : kArches) names += (names.empty() ? "" : ", ") + name;
  throw_error(ErrorKind::kUnsupported,
              path + ": unsupported model_type '" + type + "' (supported: " + names + ")");
}

namespace {

bool is_gemma(const std::string& a) {
  return a == "gemma" || a == "gemma2" || a == "gemma3" || a == "gemma-embedding";
}

// A number member, or nullopt when absent or null.
std::optional<double> number_or_null(const json& j, const char* key, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  return json_number_or(j, key, 0.0, path);
}

// A count member in [0, 2^30], or nullopt when absent or null.
std::optional<uint32_t> count_or_null(const json& j, const char* key, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const int64_t v = json_int_or(j, key, 0, path);
  if (v < 0 || v > (1 << 30))
    throw_error(ErrorKind::kFormat,
                path + ": " + key + " = " + std::to_string(v) + " is out of range");
  return (uint32_t)v;
}

// YaRN's ramp (beta_fast, beta_slow) and attention factor as transformers computes it:
// mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are given, which
// llama.cpp's yarn_log_multiplier expresses for mscale 1; else mscale(factor).
void add_yarn_parameters(HfMetadata& m, const json& params, const std::string& a,
                         const std::string& path) {
  for (const auto& [hf, key] :
       {std::pair{"beta_fast", "yarn_beta_fast"}, std::pair{"beta_slow", "yarn_beta_slow"}})
    if (const auto v = number_or_null(params, hf, path))
      m.emplace_back(a + ".rope.scaling." + key, Value::f32((float)*v));
  if (params.contains("attention_factor") && !params["attention_factor"].is_null())
    throw_error(ErrorKind::kUnsupported, path + ": YaRN with an explicit attention_factor");
  if (!json_bool_or(params, "truncate", true, path))
    throw_error(ErrorKind::kUnsupported, path + ": YaRN with truncate = false");
  const auto mscale = number_or_null(params, "mscale", path);
  const auto all_dims = number_or_null(params, "mscale_all_dim", path);
  if (!mscale || !all_dims || *mscale == 0.0 || *all_dims == 0.0) return;
  if (*mscale != 1.0)
    throw_error(ErrorKind::kUnsupported, path + ": YaRN with mscale other than 1");
  m.emplace_back(a + ".rope.scaling.yarn_log_multiplier", Value::f32((float)*all_dims));
}

// The RoPE base and scaling of `params` (a rope_parameters / rope_scaling object, or null),
// with `theta` as the base when params has none. LongRoPE (Phi-3) writes no scaling type:
// llama.cpp's converter gives its factor lists as tensors (hf_model_tensors.cpp), its
// original context and its attention factor.
void add_rope_scaling(HfMetadata& m, const json& cfg, const json* params, double theta,
                      const std::string& a, const std::string& path) {
  if (params) theta = json_number_or(*params, "rope_theta", theta, path);
  m.emplace_back(a + ".rope.freq_base", Value::f32((float)theta));
  if (!params) return;
  std::string type = json_string_or(*params, "rope_type", "", path);
  if (type.empty()) type = json_string_or(*params, "type", "default", path);
  if (type == "default") return;
  const auto original_context = [&]() -> int64_t {
    if (params->contains("original_max_position_embeddings"))
      return json_positive_int(*params, "original_max_position_embeddings", path);
    return json_int_or(cfg, "original_max_position_embeddings", 0, path);
  };
  if (type == "longrope" || type == "su") {
    const int64_t original = original_context();
    const int64_t context = json_positive_int(cfg, "max_position_embeddings", path);
    if (original <= 0 || original > (1 << 30))
      throw_error(ErrorKind::kFormat,
                  path + ": LongRoPE needs original_max_position_embeddings in [1, 2^30]");
    const double scale = (double)context / (double)original;
    double attn =
        scale <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(scale) / std::log((double)original));
    if (const auto given = number_or_null(*params, "attention_factor", path)) attn = *given;
    m.emplace_back(a + ".rope.scaling.original_context_length", Value::u32((uint32_t)original));
    m.emplace_back(a + ".rope.scaling.attn_factor", Value::f32((float)attn));
    return;
  }
  m.emplace_back(a + ".rope.scaling.type", Value::string(type));
  m.emplace_back(a + ".rope.scaling.factor",
                 Value::f32((float)json_number_or(*params, "factor", 1.0, path)));
  for (const char* key : {"low_freq_factor", "high_freq_factor"})
    if (params->contains(key))
      m.emplace_back(a + ".rope.scaling." + key,
                     Value::f32((float)json_number_or(*params, key, 1.0, path)));
  if (const int64_t original = original_context(); original > 0 && original <= (1 << 30))
    m.emplace_back(a + ".rope.scaling.original_context_length", Value::u32((uint32_t)original));
  if (type == "yarn") add_yarn_parameters(m, *params, a, path);
}

// rope_theta with rope_scaling (transformers 4) or rope_parameters (transformers 5; Gemma 3's
// holds one object per layer type, the global layers' here), and Gemma 3's local base.
void add_rope(HfMetadata& m, const json& cfg, const std::string& a, const std::string& path) {
  const json* params = json_object_or_null(cfg, "rope_parameters", path);
  const json* scaling = json_object_or_null(cfg, "rope_scaling", path);
  const double theta = json_number_or(cfg, "rope_theta", 10000.0, path);
  const json* global = params && params->contains("full_attention")
                           ? json_object_or_null(*params, "full_attention", path)
                           : (scaling ? scaling : params);
  add_rope_scaling(m, cfg, global, theta, a, path);
  if (a == "olmo2") {  // OLMo 3: its sliding layers' base, when the file gives one
    if (params && params->contains("sliding_attention"))
      if (const json* s = json_object_or_null(*params, "sliding_attention", path))
        m.emplace_back(a + ".rope.freq_base_swa",
                       Value::f32((float)json_number_or(*s, "rope_theta", theta, path)));
    return;
  }
  if (a != "gemma3" && a != "gemma-embedding") return;
  double local = json_number_or(cfg, "rope_local_base_freq", 10000.0, path);
  if (params && params->contains("sliding_attention"))
    if (const json* s = json_object_or_null(*params, "sliding_attention", path))
      local = json_number_or(*s, "rope_theta", local, path);
  m.emplace_back(a + ".rope.freq_base_swa", Value::f32((float)local));
}

// Rotated values per head: partial_rotary_factor of the head (Phi-2, Phi-4-mini; in
// rope_parameters with transformers 5), else all.
void add_rope_dims(HfMetadata& m, const json& cfg, const std::string& a, const std::string& path) {
  // (Nemotron's configuration class rotates half of each head unless told otherwise.)
  // (StableLM's a quarter.)
  const double by_default = a == "nemotron" ? 0.5 : a == "stablelm" ? 0.25 : 1.0;
  double part = json_number_or(cfg, "partial_rotary_factor", by_default, path);
  if (const json* params = json_object_or_null(cfg, "rope_parameters", path))
    part = json_number_or(*params, "partial_rotary_factor", part, path);
  if (part == 1.0) return;
  if (!(part > 0.0 && part < 1.0))
    throw_error(ErrorKind::kFormat, path + ": partial_rotary_factor must be in (0, 1]");
  const int64_t heads = json_positive_int(cfg, "num_attention_heads", path);
  const int64_t head_dim = cfg.contains("head_dim") && !cfg["head_dim"].is_null()
                               ? json_positive_int(cfg, "head_dim", path)
                               : json_positive_int(cfg, "hidden_size", path) / heads;
  m.emplace_back(a + ".rope.dimension_count",
                 Value::u32((uint32_t)std::floor(part * (double)head_dim)));
}

// The window (null: none) and which layers use it (layer_types, or a period).
void add_sliding_windows(HfMetadata& m, const json& cfg, const std::string& a,
                         const std::string& path) {
  if (const auto w = count_or_null(cfg, "sliding_window", path))
    m.emplace_back(a + ".attention.sliding_window", Value::u32(*w));
  if (const json* types = json_array_or_null(cfg, "layer_types", path)) {
    std::vector<Value> sliding;
    for (const json& t : *types) {
      if (!t.is_string())
        throw_error(ErrorKind::kFormat, path + ": layer_types holds a non-string");
      sliding.push_back(Value::boolean(t.get<std::string>() == "sliding_attention"));
    }
    m.emplace_back(a + ".attention.sliding_window_pattern",
                   Value::array(gguf::ValueType::BOOL, std::move(sliding)));
  } else if (const auto period = count_or_null(cfg, "sliding_window_pattern", path)) {
    m.emplace_back(a + ".attention.sliding_window_pattern", Value::u32(*period));
  }
}

// Gemma 2 and 3: the q scalar, soft-caps (null: none), the window and which layers use it.
void add_gemma_attention(HfMetadata& m, const json& cfg, const std::string& a,
                         const std::string& path) {
  if (const auto s = number_or_null(cfg, "query_pre_attn_scalar", path))
    m.emplace_back(a + ".attention.query_pre_attn_scalar", Value::f32((float)*s));
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"})
    m.emplace_back(a + "." + key, Value::f32((float)number_or_null(cfg, key, path).value_or(0.0)));
  add_sliding_windows(m, cfg, a, path);
}

// Mixtral, Qwen2-MoE, Qwen3-MoE: expert counts and widths; every layer sparse.
void add_experts(HfMetadata& m, const json& cfg, const std::string& a, const std::string& path) {
  const char* count_key = cfg.contains("num_local_experts") ? "num_local_experts" : "num_experts";
  if (!cfg.contains(count_key) || cfg[count_key].is_null()) return;
  m.emplace_back(a + ".expert_count",
                 Value::u32((uint32_t)json_positive_int(cfg, count_key, path)));
  m.emplace_back(a + ".expert_used_count",
                 Value::u32((uint32_t)json_positive_int(cfg, "num_experts_per_tok", path)));
  if (cfg.contains("moe_intermediate_size"))
    m.emplace_back(a + ".expert_feed_forward_length",
                   Value::u32((uint32_t)json_positive_int(cfg, "moe_intermediate_size", path)));
  if (cfg.contains("shared_expert_intermediate_size"))
    m.emplace_back(
        a + ".expert_shared_feed_forward_length",
        Value::u32((uint32_t)json_positive_int(cfg, "shared_expert_intermediate_size", path)));
  if (cfg.contains("norm_topk_prob") && !cfg["norm_topk_prob"].is_null())
    m.emplace_back(a + ".expert_weights_norm",
                   Value::boolean(json_bool_or(cfg, "norm_topk_prob", true, path)));
  const json* dense = json_array_or_null(cfg, "mlp_only_layers", path);
  if (json_int_or(cfg, "decoder_sparse_step", 1, path) != 1 || (dense && !dense->empty()))
    throw_error(
        ErrorKind::kUnsupported,
        path + ": dense layers among the sparse ones (decoder_sparse_step, mlp_only_layers)");
}

// SmolLM3's no_rope_layers (1: the layer rotates q, k; 0: it does not) as
// hablar.no_rope_layers (true: no RoPE); without the list, every no_rope_layer_interval-th.
void add_no_rope_layers(HfMetadata& m, const json& cfg, const std::string& path) {
  const int64_t n = json_positive_int(cfg, "num_hidden_layers", path);
  std::vector<Value> flags;
  if (const json* list = json_array_or_null(cfg, "no_rope_layers", path)) {
    if ((int64_t)list->size() != n)
      throw_error(ErrorKind::kFormat, path + ": no_rope_layers needs one entry per layer");
    for (const json& e : *list) {
      if (!e.is_number_integer())
        throw_error(ErrorKind::kFormat, path + ": no_rope_layers holds a non-integer");
      flags.push_back(Value::boolean(e.get<int64_t>() == 0));
    }
  } else {
    const int64_t every = json_int_or(cfg, "no_rope_layer_interval", 4, path);
    if (every < 1 || every > (1 << 20))
      throw_error(ErrorKind::kFormat, path + ": no_rope_layer_interval must be >= 1");
    for (int64_t l = 0; l < n; ++l) flags.push_back(Value::boolean((l + 1) % every == 0));
  }
  m.emplace_back("hablar.no_rope_layers", Value::array(gguf::ValueType::BOOL, std::move(flags)));
}

// Granite's multipliers under llama.cpp's names (transformers' defaults where absent; an
// attention multiplier of 0 would mean 1/sqrt(head_dim) there too, so it is kept as given).
void add_granite_multipliers(HfMetadata& m, const json& cfg, const std::string& path) {
  const auto f32 = [&](const char* key, const char* hf, double fallback) {
    m.emplace_back(std::string("granite.") + key,
                   Value::f32((float)json_number_or(cfg, hf, fallback, path)));
  };
  f32("embedding_scale", "embedding_multiplier", 1.0);
  f32("residual_scale", "residual_multiplier", 1.0);
  f32("logit_scale", "logits_scaling", 1.0);
  f32("attention.scale", "attention_multiplier", 1.0);
}

// Ministral 3's query temperature: rope_parameters.llama_4_scaling_beta (its floor the
// original context that the YaRN parameters give).
void add_query_temperature(HfMetadata& m, const json& cfg, const std::string& path) {
  const json* params = json_object_or_null(cfg, "rope_parameters", path);
  if (!params) params = json_object_or_null(cfg, "rope_scaling", path);
  if (!params) return;
  if (const auto beta = number_or_null(*params, "llama_4_scaling_beta", path))
    m.emplace_back("mistral3.attention.temperature_scale", Value::f32((float)*beta));
}

// Command R and Command R7B: the logit scale, cohere2's windows and which layers use them;
// the classifier is always the embedding (as llama.cpp runs them), per-head q/k LayerNorms
// (Command R+) are not supported.
void add_cohere(HfMetadata& m, const json& cfg, const std::string& a, const std::string& path) {
  if (json_bool_or(cfg, "use_qk_norm", false, path))
    throw_error(ErrorKind::kUnsupported, path + ": use_qk_norm (Command R+) is not supported");
  if (!json_bool_or(cfg, "tie_word_embeddings", true, path))
    throw_error(ErrorKind::kUnsupported,
                path + ": a " + a + " checkpoint with its own lm_head is not supported");
  m.emplace_back(a + ".logit_scale",
                 Value::f32((float)json_number_or(cfg, "logit_scale", 0.0625, path)));
  if (a == "cohere2") add_sliding_windows(m, cfg, a, path);
}

}  // namespace

HfMetadata hf_family_metadata(const json& cfg, const std::string& a, const std::string& path) {
  // Biases on the output and MLP projections of llama-style blocks have no op here: refused,
  // not skipped (the tensors would otherwise be dropped silently).
  // (GLM-4's and Seed-OSS's attention_bias are their q, k, v biases; Nemotron reads them all.)
  for (const char* key : {"attention_bias", "mlp_bias", "attention_out_bias"})
    if (a != "phi2" && a != "starcoder2" && a != "nemotron" &&
        !((a == "glm4" || a == "seed_oss") && std::string_view(key) == "attention_bias") &&
        json_bool_or(cfg, key, false, path))
      throw_error(ErrorKind::kUnsupported,
                  path + ": " + key + " = true (biased projections) is not supported for " + a);
  HfMetadata m;
  const auto u32 = [&](const std::string& key, const char* hf) {
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
  const bool cohere = a == "command-r" || a == "cohere2";
  if (a == "phi2" || a == "starcoder2" || cohere || a == "nemotron" || a == "stablelm") {
    const char* key = a == "starcoder2" ? "norm_epsilon"
                      : a == "nemotron" ? "norm_eps"
                                        : "layer_norm_eps";
    m.emplace_back(a + ".attention.layer_norm_epsilon",
                   Value::f32((float)json_number_or(cfg, key, 1e-5, path)));
  } else {
    m.emplace_back(a + ".attention.layer_norm_rms_epsilon",
                   Value::f32((float)json_number_or(cfg, "rms_norm_eps", 1e-6, path)));
  }
  add_rope(m, cfg, a, path);
  add_rope_dims(m, cfg, a, path);
  // Mistral (v0.1) attends through a window on every layer, as transformers runs it (and
  // Ministral 3 when its config gives one).
  if (const std::string type = json_string_or(cfg, "model_type", "", path);
      type == "mistral" || type == "ministral3")
    if (const auto w = count_or_null(cfg, "sliding_window", path); w && *w > 0)
      m.emplace_back(a + ".attention.sliding_window", Value::u32(*w));
  if (a == "gemma2" || a == "gemma3" || a == "gemma-embedding")
    add_gemma_attention(m, cfg, a, path);
  add_experts(m, cfg, a, path);
  if (a == "smollm3") add_no_rope_layers(m, cfg, path);
  if (a == "granite") add_granite_multipliers(m, cfg, path);
  if (a == "mistral3") add_query_temperature(m, cfg, path);
  if (cohere) add_cohere(m, cfg, a, path);
  for (const char* key : {"use_parallel_residual", "qk_layernorm"})
    if (a == "stablelm" && json_bool_or(cfg, key, false, path))
      throw_error(ErrorKind::kUnsupported,
                  path + ": " + key +
                      " = true (StableLM's parallel or q/k-normed blocks) is "
                      "not supported");
  if (a == "olmoe" && cfg.contains("clip_qkv") && !cfg["clip_qkv"].is_null())
    throw_error(ErrorKind::kUnsupported, path + ": OLMoE with clip_qkv is not supported");
  if (a == "olmo2" || a == "exaone4") add_sliding_windows(m, cfg, a, path);
  return m;
}

namespace {

using Names = std::vector<TensorNamePair>;

Names with(const Names& base, const Names& extra) {
  Names out = base;
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

Names llama_names() {
  return Names(std::begin(kLlamaFamilyTensorNames), std::end(kLlamaFamilyTensorNames));
}

// Gemma 2 and 3: a norm on each side of attention and of the MLP.
Names gemma2_names() {
  Names n;
  for (const TensorNamePair& p : kLlamaFamilyTensorNames)
    if (p.gguf != "blk.{}.ffn_norm.weight") n.push_back(p);
  return with(
      n, {{"blk.{}.post_attention_norm.weight", "model.layers.{}.post_attention_layernorm.weight"},
          {"blk.{}.ffn_norm.weight", "model.layers.{}.pre_feedforward_layernorm.weight"},
          {"blk.{}.post_ffw_norm.weight", "model.layers.{}.post_feedforward_layernorm.weight"}});
}

// OLMo 2 and 3: no input norm; post_attention_layernorm follows attention (not before the
// MLP as in llama's names), post_feedforward_layernorm the MLP.
Names olmo2_names() {
  Names n;
  for (const TensorNamePair& p : kLlamaFamilyTensorNames)
    if (p.gguf != "blk.{}.ffn_norm.weight" && p.gguf != "blk.{}.attn_norm.weight") n.push_back(p);
  return with(
      n, {{"blk.{}.post_attention_norm.weight", "model.layers.{}.post_attention_layernorm.weight"},
          {"blk.{}.post_ffw_norm.weight", "model.layers.{}.post_feedforward_layernorm.weight"}});
}

// GLM-4: llama's names with a fused gate-up (gate rows first), a norm after attention
// (post_self_attn_layernorm) and after the MLP (post_mlp_layernorm); post_attention_layernorm
// is the pre-MLP norm, as in llama's names.
Names glm4_names() {
  Names n;
  for (const TensorNamePair& p : kLlamaFamilyTensorNames)
    if (p.gguf != "blk.{}.ffn_gate.weight" && p.gguf != "blk.{}.ffn_up.weight") n.push_back(p);
  return with(
      n, {{"blk.{}.ffn_up.weight", "model.layers.{}.mlp.gate_up_proj.weight"},
          {"blk.{}.post_attention_norm.weight", "model.layers.{}.post_self_attn_layernorm.weight"},
          {"blk.{}.post_ffw_norm.weight", "model.layers.{}.post_mlp_layernorm.weight"}});
}

// Seed-OSS: llama's names, its pre-MLP norm (post_attention_layernorm) kept under the GGUF
// name llama.cpp gives it (post_attention_norm).
Names seed_oss_names() {
  Names n;
  for (const TensorNamePair& p : kLlamaFamilyTensorNames)
    if (p.gguf != "blk.{}.ffn_norm.weight") n.push_back(p);
  return with(n, {{"blk.{}.post_attention_norm.weight",
                   "model.layers.{}.post_attention_layernorm.weight"}});
}

// Command R: llama's names without the pre-MLP norm (one LayerNorm feeds both branches) and
// without a classifier of its own.
Names cohere_names() {
  Names n;
  for (const TensorNamePair& p : kLlamaFamilyTensorNames)
    if (p.gguf != "blk.{}.ffn_norm.weight" && p.gguf != "output.weight") n.push_back(p);
  return n;
}

Names phi3_names() {
  return {{"token_embd.weight", "model.embed_tokens.weight"},
          {"output_norm.weight", "model.norm.weight"},
          {"output.weight", "lm_head.weight"},
          {"blk.{}.attn_norm.weight", "model.layers.{}.input_layernorm.weight"},
          {"blk.{}.attn_qkv.weight", "model.layers.{}.self_attn.qkv_proj.weight"},
          {"blk.{}.attn_output.weight", "model.layers.{}.self_attn.o_proj.weight"},
          {"blk.{}.ffn_norm.weight", "model.layers.{}.post_attention_layernorm.weight"},
          {"blk.{}.ffn_up.weight", "model.layers.{}.mlp.gate_up_proj.weight"},
          {"blk.{}.ffn_down.weight", "model.layers.{}.mlp.down_proj.weight"}};
}

// The pairs phi2 and starcoder2 share: the input LayerNorm and the biased q, k, v.
void add_biased_attention_names(Names& n) {
  static const TensorNamePair kPairs[] = {
      {"blk.{}.attn_norm.weight", "model.layers.{}.input_layernorm.weight"},
      {"blk.{}.attn_norm.bias", "model.layers.{}.input_layernorm.bias"},
      {"blk.{}.attn_q.weight", "model.layers.{}.self_attn.q_proj.weight"},
      {"blk.{}.attn_q.bias", "model.layers.{}.self_attn.q_proj.bias"},
      {"blk.{}.attn_k.weight", "model.layers.{}.self_attn.k_proj.weight"},
      {"blk.{}.attn_k.bias", "model.layers.{}.self_attn.k_proj.bias"},
      {"blk.{}.attn_v.weight", "model.layers.{}.self_attn.v_proj.weight"},
      {"blk.{}.attn_v.bias", "model.layers.{}.self_attn.v_proj.bias"}};
  n.insert(n.end(), std::begin(kPairs), std::end(kPairs));
}

Names phi2_names() {
  Names n = {{"token_embd.weight", "model.embed_tokens.weight"}};
  const auto pair = [&](std::string_view gguf, std::string_view hf) {
    // (string literals below: the views stay valid)
    n.push_back({gguf, hf});
  };
  pair("output_norm.weight", "model.final_layernorm.weight");
  pair("output_norm.bias", "model.final_layernorm.bias");
  pair("output.weight", "lm_head.weight");
  pair("output.bias", "lm_head.bias");
  add_biased_attention_names(n);
  pair("blk.{}.attn_output.weight", "model.layers.{}.self_attn.dense.weight");
  pair("blk.{}.attn_output.bias", "model.layers.{}.self_attn.dense.bias");
  pair("blk.{}.ffn_up.weight", "model.layers.{}.mlp.fc1.weight");
  pair("blk.{}.ffn_up.bias", "model.layers.{}.mlp.fc1.bias");
  pair("blk.{}.ffn_down.weight", "model.layers.{}.mlp.fc2.weight");
  pair("blk.{}.ffn_down.bias", "model.layers.{}.mlp.fc2.bias");
  return n;
}

// The LayerNorm blocks (StarCoder2, Nemotron, StableLM): LayerNorms and q/k/v with biases,
// the output projection (and its bias where the family has one), the pre-MLP LayerNorm, then
// the MLP's own names; a classifier tied to the embedding unless lm_head is there.
Names layernorm_block_names(bool output_bias, std::initializer_list<TensorNamePair> mlp) {
  Names n = {{"token_embd.weight", "model.embed_tokens.weight"},
             {"output_norm.weight", "model.norm.weight"},
             {"output_norm.bias", "model.norm.bias"},
             {"output.weight", "lm_head.weight"}};
  add_biased_attention_names(n);
  n.push_back({"blk.{}.attn_output.weight", "model.layers.{}.self_attn.o_proj.weight"});
  if (output_bias)
    n.push_back({"blk.{}.attn_output.bias", "model.layers.{}.self_attn.o_proj.bias"});
  n.push_back({"blk.{}.ffn_norm.weight", "model.layers.{}.post_attention_layernorm.weight"});
  n.push_back({"blk.{}.ffn_norm.bias", "model.layers.{}.post_attention_layernorm.bias"});
  n.insert(n.end(), mlp.begin(), mlp.end());
  return n;
}

// StarCoder2: an ungated MLP named c_fc, c_proj, every projection biased.
Names starcoder2_names() {
  return layernorm_block_names(true,
                               {{"blk.{}.ffn_up.weight", "model.layers.{}.mlp.c_fc.weight"},
                                {"blk.{}.ffn_up.bias", "model.layers.{}.mlp.c_fc.bias"},
                                {"blk.{}.ffn_down.weight", "model.layers.{}.mlp.c_proj.weight"},
                                {"blk.{}.ffn_down.bias", "model.layers.{}.mlp.c_proj.bias"}});
}

// Nemotron: q/k/v/o and the MLP's two products biased where the checkpoint has them
// (attention_bias, mlp_bias), an ungated MLP (up, relu^2, down).
Names nemotron_names() {
  return layernorm_block_names(true,
                               {{"blk.{}.ffn_up.weight", "model.layers.{}.mlp.up_proj.weight"},
                                {"blk.{}.ffn_up.bias", "model.layers.{}.mlp.up_proj.bias"},
                                {"blk.{}.ffn_down.weight", "model.layers.{}.mlp.down_proj.weight"},
                                {"blk.{}.ffn_down.bias", "model.layers.{}.mlp.down_proj.bias"}});
}

// StableLM 2: q/k/v biased where use_qkv_bias says, a SwiGLU MLP without biases.
Names stablelm_names() {
  return layernorm_block_names(
      false, {{"blk.{}.ffn_gate.weight", "model.layers.{}.mlp.gate_proj.weight"},
              {"blk.{}.ffn_up.weight", "model.layers.{}.mlp.up_proj.weight"},
              {"blk.{}.ffn_down.weight", "model.layers.{}.mlp.down_proj.weight"}});
}

// The router (and Qwen2-MoE's shared expert with its gate) beside the llama names.
Names moe_names(const std::string& a) {
  if (a == "llama")
    return with(llama_names(),
                {{"blk.{}.ffn_gate_inp.weight", "model.layers.{}.block_sparse_moe.gate.weight"}});
  Names n =
      with(llama_names(), {{"blk.{}.ffn_gate_inp.weight", "model.layers.{}.mlp.gate.weight"}});
  if (a == "qwen2moe")
    n = with(
        n, {{"blk.{}.ffn_gate_shexp.weight", "model.layers.{}.mlp.shared_expert.gate_proj.weight"},
            {"blk.{}.ffn_up_shexp.weight", "model.layers.{}.mlp.shared_expert.up_proj.weight"},
            {"blk.{}.ffn_down_shexp.weight", "model.layers.{}.mlp.shared_expert.down_proj.weight"},
            {"blk.{}.ffn_gate_inp_shexp.weight", "model.layers.{}.mlp.shared_expert_gate.weight"}});
  return n;
}

}  // namespace

const std::vector<TensorNamePair>& hf_tensor_names(const std::string& a) {
  static const std::map<std::string, Names> kTables = {
      {"llama", moe_names("llama")},  // (Mixtral's router beside llama's names)
      {"qwen2", llama_names()},
      {"qwen3", llama_names()},
      {"smollm3", llama_names()},
      {"granite", llama_names()},
      {"olmo2", olmo2_names()},
      {"exaone4", olmo2_names()},  // (its q/k norms per head, under the same names)
      {"glm4", glm4_names()},
      {"arcee", llama_names()},  // (no gate_proj)
      {"ernie4_5", llama_names()},
      {"mistral3", llama_names()},
      {"seed_oss", seed_oss_names()},
      {"command-r", cohere_names()},
      {"cohere2", cohere_names()},
      {"qwen2moe", moe_names("qwen2moe")},
      {"qwen3moe", moe_names("qwen3moe")},
      {"olmoe", moe_names("olmoe")},
      {"nemotron", nemotron_names()},
      {"stablelm", stablelm_names()},
      {"phi3", phi3_names()},
      {"phi2", phi2_names()},
      {"starcoder2", starcoder2_names()},
      {"gemma", llama_names()},
      {"gemma2", gemma2_names()},
      {"gemma3", gemma2_names()},
      {"gemma-embedding", gemma2_names()}};
  const auto it = kTables.find(a);
  if (it == kTables.end()) throw_error(ErrorKind::kUnsupported, "no tensor names for " + a);
  return it->second;
}

std::optional<MappedName> gguf_name_of_hf(const std::string& arch, std::string_view name) {
  return gguf_name_in(hf_tensor_names(arch), name);
}

std::optional<ExpertName> expert_of_hf(const std::string& a, std::string_view name) {
  // model.layers.L.<block>.experts.E.<matrix>.weight
  constexpr std::string_view kLayers = "model.layers.";
  if (!name.starts_with(kLayers)) return std::nullopt;
  const std::string_view block = a == "llama" ? ".block_sparse_moe.experts." : ".mlp.experts.";
  const size_t b = name.find(block, kLayers.size());
  if (b == std::string_view::npos) return std::nullopt;
  const auto number = [](std::string_view digits) -> int {
    if (digits.empty() || digits.size() > 6 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return -1;
    return std::stoi(std::string(digits));
  };
  const int layer = number(name.substr(kLayers.size(), b - kLayers.size()));
  const std::string_view rest = name.substr(b + block.size());
  const size_t dot = rest.find('.');
  if (layer < 0 || dot == std::string_view::npos) return std::nullopt;
  const int expert = number(rest.substr(0, dot));
  const std::string_view matrix = rest.substr(dot + 1);
  static const std::map<std::string_view, std::string_view> kMatrices = {
      {"w1.weight", "ffn_gate_exps"},    {"w3.weight", "ffn_up_exps"},
      {"w2.weight", "ffn_down_exps"},    {"gate_proj.weight", "ffn_gate_exps"},
      {"up_proj.weight", "ffn_up_exps"}, {"down_proj.weight", "ffn_down_exps"}};
  const auto it = kMatrices.find(matrix);
  if (expert < 0 || it == kMatrices.end()) return std::nullopt;
  return ExpertName{"blk." + std::to_string(layer) + "." + std::string(it->second) + ".weight",
                    layer, expert};
}

std::vector<DenseModule> hf_sentence_transformers(const std::string& dir, const std::string& a,
                                                  HfMetadata& m) {
  namespace fs = std::filesystem;
  const fs::path root(dir);
  std::error_code ec;
  if (!fs::is_regular_file(root / "modules.json", ec)) return {};
  const json mods = parse_json_file((root / "modules.json").string(), 1 << 20);
  std::vector<DenseModule> dense;
  if (!mods.is_array()) return dense;
  for (const json& mod : mods) {
    if (!mod.is_object()) continue;
    const std::string where = (root / "modules.json").string();
    const std::string type = json_string_or(mod, "type", "", where);
    const std::string sub = json_string_or(mod, "path", "", where);
    if (sub.empty() || sub.find("..") != std::string::npos || sub[0] == '/') continue;
    if (type.ends_with("Pooling") && fs::is_regular_file(root / sub / "config.json", ec)) {
      const std::string cfg_path = (root / sub / "config.json").string();
      const json pc = parse_json_file(cfg_path, 1 << 20);
      // llama.cpp's pooling_type numbers: 1 mean, 2 cls, 3 last.
      uint32_t pooling = 0;
      if (json_bool_or(pc, "pooling_mode_mean_tokens", false, cfg_path)) pooling = 1;
      if (json_bool_or(pc, "pooling_mode_cls_token", false, cfg_path)) pooling = 2;
      if (json_bool_or(pc, "pooling_mode_lasttoken", false, cfg_path)) pooling = 3;
      if (pooling != 0) m.emplace_back(a + ".pooling_type", Value::u32(pooling));
    } else if (type.ends_with("Dense") && a == "gemma-embedding" && dense.size() < 2 &&
               fs::is_regular_file(root / sub / "model.safetensors", ec)) {
      dense.push_back({(root / sub / "model.safetensors").string(),
                       dense.empty() ? "dense_2.weight" : "dense_3.weight"});
    }
  }
  return dense;
}

bool norm_gets_one_added(const std::string& arch, const std::string& gguf_name) {
  // (Gemma's RMSNorms and Nemotron's LayerNorm1P apply 1 + w.)
  return (is_gemma(arch) || arch == "nemotron") && gguf_name.ends_with("norm.weight");
}

}  // namespace hablar::formats
