// ModelConfig from GGUF metadata (the keys llama.cpp writes: <arch>.block_count, ...).
#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "formats/arch_rope.h"
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
    case Arch::kQwen3Moe:
      return "qwen3moe";
    case Arch::kQwen2Moe:
      return "qwen2moe";
    case Arch::kPhi3:
      return "phi3";
    case Arch::kPhi2:
      return "phi2";
    case Arch::kSmolLM3:
      return "smollm3";
    case Arch::kGranite:
      return "granite";
    case Arch::kGraniteMoe:
      return "granitemoe";
    case Arch::kOlmo2:
      return "olmo2";
    case Arch::kStarCoder2:
      return "starcoder2";
    case Arch::kExaone4:
      return "exaone4";
    case Arch::kHunyuanDense:
      return "hunyuan-dense";
    case Arch::kGlm4:
      return "glm4";
    case Arch::kArcee:
      return "arcee";
    case Arch::kMistral3:
      return "mistral3";
    case Arch::kSeedOss:
      return "seed_oss";
    case Arch::kMiniCpm:
      return "minicpm";
    case Arch::kOlmoe:
      return "olmoe";
    case Arch::kOrion:
      return "orion";
    case Arch::kNemotron:
      return "nemotron";
    case Arch::kStableLm:
      return "stablelm";
    case Arch::kCommandR:
      return "command-r";
    case Arch::kCohere2:
      return "cohere2";
    case Arch::kGemma:
      return "gemma";
    case Arch::kGemma2:
      return "gemma2";
    case Arch::kGemma3:
      return "gemma3";
    case Arch::kGemmaEmbedding:
      return "gemma-embedding";
    case Arch::kBert:
      return "bert";
    case Arch::kNomicBert:
      return "nomic-bert";
  }
  return "?";
}

std::string supported_arch_names() {
  // (Mixtral is llama; ernie4_5, exaone, xverse and internlm2 are the llama block.)
  return "llama, ernie4_5, exaone, xverse, internlm2, seed_oss, qwen2, qwen2moe, qwen3, "
         "qwen3moe, phi2, phi3, smollm3, granite, granitemoe, olmo2, exaone4, hunyuan-dense, "
         "glm4, arcee, mistral3, minicpm, olmoe, starcoder2, orion, nemotron, stablelm, "
         "command-r, cohere2, gemma, gemma2, gemma3, gemma-embedding, bert, nomic-bert";
}

namespace {

Arch parse_arch(const std::string& name, const std::string& path) {
  if (name == "llama") return Arch::kLlama;
  if (name == "qwen2") return Arch::kQwen2;
  if (name == "qwen3") return Arch::kQwen3;
  if (name == "qwen3moe") return Arch::kQwen3Moe;
  if (name == "qwen2moe") return Arch::kQwen2Moe;
  if (name == "phi3") return Arch::kPhi3;
  if (name == "phi2") return Arch::kPhi2;
  if (name == "smollm3") return Arch::kSmolLM3;
  if (name == "granite") return Arch::kGranite;
  if (name == "granitemoe") return Arch::kGraniteMoe;
  if (name == "ernie4_5") return Arch::kLlama;  // ERNIE 4.5 (dense): the llama block
  if (name == "olmo2") return Arch::kOlmo2;
  if (name == "starcoder2") return Arch::kStarCoder2;
  if (name == "exaone4") return Arch::kExaone4;
  if (name == "hunyuan-dense") return Arch::kHunyuanDense;
  if (name == "glm4") return Arch::kGlm4;
  if (name == "arcee") return Arch::kArcee;
  if (name == "mistral3") return Arch::kMistral3;
  if (name == "seed_oss") return Arch::kSeedOss;
  if (name == "command-r") return Arch::kCommandR;
  if (name == "orion") return Arch::kOrion;
  if (name == "nemotron") return Arch::kNemotron;
  if (name == "stablelm") return Arch::kStableLm;
  if (name == "minicpm") return Arch::kMiniCpm;
  if (name == "olmoe") return Arch::kOlmoe;
  if (name == "cohere2") return Arch::kCohere2;
  if (name == "exaone") return Arch::kLlama;     // EXAONE 3 / 3.5: the llama block (NeoX RoPE)
  if (name == "xverse") return Arch::kLlama;     // XVERSE: the llama block
  if (name == "internlm2") return Arch::kLlama;  // InternLM 2 / 2.5: the llama block
  if (name == "gemma") return Arch::kGemma;
  if (name == "gemma2") return Arch::kGemma2;
  if (name == "gemma3") return Arch::kGemma3;
  if (name == "gemma-embedding") return Arch::kGemmaEmbedding;
  if (name == "bert") return Arch::kBert;
  if (name == "nomic-bert") return Arch::kNomicBert;
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

// Hunyuan's NTK alpha (rope.scaling.alpha): the base becomes base * alpha^(d / (d - 2)),
// d = head_dim, in float as llama.cpp computes it.
void read_ntk_alpha(const gguf::GgufFile& f, ModelConfig& c) {
  const double alpha = f.get_float_or(c.arch + ".rope.scaling.alpha", 0.0);
  if (!std::isfinite(alpha) || alpha < 0.0)
    throw_error(ErrorKind::kFormat, f.path() + ": rope.scaling.alpha must be >= 0");
  if (alpha == 0.0) return;
  const float d = (float)c.head_dim;
  c.rope.freq_base *= std::pow((float)alpha, d / (d - 2.0f));
}

// RoPE scaling: linear (<arch>.rope.scaling.type = "linear", factor), Llama 3 (type "llama3" with
// factor / low_freq_factor / high_freq_factor / original_context_length, or a rope_freqs.weight
// tensor as llama.cpp's converter writes for Llama 3.1, whose largest entry is the factor).
void read_rope_scaling(const gguf::GgufFile& f, const std::string& a, RopeParams& rope) {
  const std::string type = f.get_string_or(a + ".rope.scaling.type", "none");
  const double factor = f.get_float_or(a + ".rope.scaling.factor", 1.0);
  const int original = (int)f.get_uint_or(a + ".rope.scaling.original_context_length", 8192);
  using Scaling = RopeParams::Scaling;
  // LongRoPE ("longrope", or "su" in older configs) scales by its per-pair factors, read with
  // the layers; its positions are not divided unless the file gives a factor (as llama.cpp).
  const bool longrope = type == "longrope" || type == "su";
  if (type == "none" || ((type == "linear" || longrope) && factor == 1.0)) {
    rope.scaling = Scaling::kNone;
  } else if (type == "linear" || longrope) {
    rope.scaling = Scaling::kLinear;
    rope.factor = (float)factor;
  } else if (type == "yarn") {
    // As llama.cpp sets it up: ext_factor 1; the attention factor from yarn_log_multiplier
    // (mscale_all_dims) when given, else 1 + 0.1 ln(factor), divided by the 1 + 0.1 ln(factor)
    // that every angle's magnitude is then multiplied by.
    rope.scaling = Scaling::kYarn;
    rope.factor = (float)factor;
    rope.original_context = (int)f.get_uint_or(a + ".rope.scaling.original_context_length",
                                               f.get_uint_or(a + ".context_length", 8192));
    rope.beta_fast = (float)f.get_float_or(a + ".rope.scaling.yarn_beta_fast", 32.0);
    rope.beta_slow = (float)f.get_float_or(a + ".rope.scaling.yarn_beta_slow", 1.0);
    const float scale = 1.0f / (1.0f / rope.factor);
    const auto mscale = [&](float m) {
      return scale <= 1.0f ? 1.0f : 0.1f * m * std::log(scale) + 1.0f;
    };
    const float log_mul = (float)f.get_float_or(a + ".rope.scaling.yarn_log_multiplier", 0.0);
    float attn = log_mul != 0.0f ? mscale(1.0f) / mscale(log_mul) : mscale(1.0f);
    attn *= 1.0f / (1.0f + 0.1f * std::log(scale));
    rope.attn_factor = attn * (float)f.get_float_or(a + ".rope.scaling.attn_factor", 1.0);
  } else if (type == "llama3") {
    rope.scaling = Scaling::kLlama3;
    rope.factor = (float)factor;
    rope.low_freq_factor = (float)f.get_float_or(a + ".rope.scaling.low_freq_factor", 1.0);
    rope.high_freq_factor = (float)f.get_float_or(a + ".rope.scaling.high_freq_factor", 4.0);
    rope.original_context = original;
  } else {
    throw_error(ErrorKind::kUnsupported, f.path() + ": unsupported rope scaling type '" + type +
                                             "' (supported: none, linear, llama3, yarn, longrope)");
  }
  // llama.cpp multiplies every scaling's cos and sin by this key (YaRN's own factor above).
  if (rope.scaling != Scaling::kYarn) {
    rope.attn_factor = (float)f.get_float_or(a + ".rope.scaling.attn_factor", 1.0);
    if (!(rope.attn_factor > 0.0f) || !std::isfinite(rope.attn_factor))
      throw_error(ErrorKind::kFormat, f.path() + ": rope.scaling.attn_factor must be > 0");
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

// Experts: <arch>.expert_count, expert_used_count and (qwen3moe) expert_feed_forward_length,
// which defaults to the FFN length.
void read_experts(const gguf::GgufFile& f, ModelConfig& c) {
  const std::string& a = c.arch;
  c.n_experts = (int)f.get_uint_or(a + ".expert_count", 0);
  const bool moe_arch = c.arch_kind == Arch::kQwen3Moe || c.arch_kind == Arch::kQwen2Moe ||
                        c.arch_kind == Arch::kOlmoe || c.arch_kind == Arch::kGraniteMoe;
  // (Granite's shared expert joins ungated, unlike Qwen2-MoE's: not supported.)
  if (c.arch_kind == Arch::kGraniteMoe &&
      f.get_uint_or(a + ".expert_shared_feed_forward_length", 0) > 0)
    throw_error(ErrorKind::kUnsupported,
                f.path() + ": granitemoe with a shared expert (GraniteMoeShared) is not supported");
  if (c.n_experts == 0) {
    if (moe_arch) throw_error(ErrorKind::kFormat, f.path() + ": " + a + " without expert_count");
    return;
  }
  if (c.arch_kind == Arch::kQwen2Moe) {
    c.experts_normalized = false;
    c.n_ff_shared = (int)f.get_uint_or(a + ".expert_shared_feed_forward_length", (uint64_t)c.n_ff);
    if (c.n_ff_shared <= 0 || c.n_ff_shared > (1 << 24))
      throw_error(ErrorKind::kFormat,
                  f.path() + ": expert_shared_feed_forward_length out of range");
  }
  if (c.arch_kind == Arch::kOlmoe) c.experts_normalized = false;  // (OLMoE's weights as they are)
  // <arch>.expert_weights_norm (as llama.cpp's key; a checkpoint's norm_topk_prob) overrides
  // the family's custom.
  c.experts_normalized = f.get_bool_or(a + ".expert_weights_norm", c.experts_normalized);
  c.n_experts_used = (int)f.get_uint_or(a + ".expert_used_count", 0);
  c.n_ff_expert = (int)f.get_uint_or(a + ".expert_feed_forward_length", (uint64_t)c.n_ff);
  if (c.n_experts > 4096 || c.n_experts_used <= 0 || c.n_experts_used > c.n_experts ||
      c.n_ff_expert <= 0 || c.n_ff_expert > (1 << 24))
    throw_error(ErrorKind::kFormat, f.path() + ": expert counts out of range (" +
                                        std::to_string(c.n_experts_used) + " of " +
                                        std::to_string(c.n_experts) + ")");
}

// One LongRoPE factor set: an F32 vector of n_dims / 2 positive, finite divisors.
std::vector<float> rope_factors(const gguf::GgufFile& f, const std::string& name, int n_dims) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (t == nullptr)
    throw_error(ErrorKind::kFormat,
                f.path() + ": LongRoPE needs both rope_factors_short and rope_factors_long; " +
                    name + " is missing");
  if (t->type != DType::F32 || t->n_elements() != (int64_t)(n_dims / 2))
    throw_error(ErrorKind::kFormat, f.path() + ": " + name + " must be f32 of " +
                                        std::to_string(n_dims / 2) + " values (n_rot / 2)");
  const auto* v = reinterpret_cast<const float*>(t->data);
  std::vector<float> out(v, v + n_dims / 2);
  for (float x : out)
    if (!(x > 0.0f) || !std::isfinite(x))
      throw_error(ErrorKind::kFormat, f.path() + ": " + name + " holds a factor <= 0");
  return out;
}

// Phi-3's LongRoPE (the 128k variants): short and long per-pair factors, the long ones used
// when the context exceeds the original one (rope.scaling.original_context_length, else the
// trained context), as llama.cpp chooses; the attention factor is read with the scaling.
void read_longrope(const gguf::GgufFile& f, ModelConfig& c) {
  if (!f.find_tensor("rope_factors_long.weight") && !f.find_tensor("rope_factors_short.weight"))
    return;
  if (c.rope.scaling == RopeParams::Scaling::kLlama3 ||
      c.rope.scaling == RopeParams::Scaling::kYarn)
    throw_error(ErrorKind::kUnsupported,
                f.path() + ": LongRoPE factors together with llama3 or YaRN scaling");
  c.rope_factors_short = rope_factors(f, "rope_factors_short.weight", c.rope.n_dims);
  c.rope_factors_long = rope_factors(f, "rope_factors_long.weight", c.rope.n_dims);
  c.rope.original_context =
      (int)f.get_uint_or(c.arch + ".rope.scaling.original_context_length", (uint64_t)c.n_ctx_train);
  if (c.rope.original_context <= 0)
    throw_error(ErrorKind::kFormat, f.path() + ": rope.scaling.original_context_length is 0");
  c.rope.freq_factors = c.rope_factors_short;
}

// The norms' epsilon: RMSNorm's (layer_norm_rms_epsilon), or for phi2, whose norms are
// LayerNorms with a bias, layer_norm_epsilon (required, as llama.cpp requires it). phi2's
// attention and MLP read the same normed rows, so its heads span the embedding (q_dim ==
// n_embd, as llama.cpp's tensor shapes assume).
void read_norm_epsilon(const gguf::GgufFile& f, ModelConfig& c) {
  const bool layer_norm = uses_layer_norm(c.arch_kind);  // (phi2, starcoder2)
  const std::string key =
      c.arch + (layer_norm ? ".attention.layer_norm_epsilon" : ".attention.layer_norm_rms_epsilon");
  c.rms_eps = (float)(layer_norm ? f.get_float(key) : f.get_float_or(key, 1e-5));
  if (!(c.rms_eps > 0.0f) || !std::isfinite(c.rms_eps))
    throw_error(ErrorKind::kFormat, f.path() + ": " + key + " must be > 0");
  if (layer_norm) c.norm_eps = c.rms_eps;  // (an embedding step's LayerNorms read norm_eps)
  if (layer_norm && c.q_dim() != c.n_embd)
    throw_error(ErrorKind::kFormat, f.path() + ": " + c.arch + " heads must span the embedding (" +
                                        std::to_string(c.n_heads) + " x " +
                                        std::to_string(c.head_dim) +
                                        " != " + std::to_string(c.n_embd) + ")");
}

// SmolLM3's layers that attend without RoPE: every fourth (3, 7, ...) as llama.cpp has it, or
// those a Hugging Face checkpoint's no_rope_layers names (hablar.no_rope_layers: one bool per
// layer, true for no RoPE).
void no_rope_layers(const gguf::GgufFile& f, ModelConfig& c) {
  const std::string key = "hablar.no_rope_layers";
  if (const gguf::Value* v = f.find(key); v != nullptr) {
    const gguf::Array* flags = v->type == gguf::ValueType::ARRAY ? &f.get_array(key) : nullptr;
    if (!flags || flags->elem_type != gguf::ValueType::BOOL ||
        (int)flags->packed.size() != c.n_layers)
      throw_error(ErrorKind::kFormat, f.path() + ": " + key + " must hold one bool per layer");
    for (int l = 0; l < c.n_layers; ++l)
      if (flags->packed[(size_t)l] != 0) c.layers[(size_t)l].rope = LayerSpec::kNoRope;
    return;
  }
  for (int l = 3; l < c.n_layers; l += 4) c.layers[(size_t)l].rope = LayerSpec::kNoRope;
}

// Granite's multipliers: the embedding's, the attention's scale (0 or absent: 1/sqrt(head_dim)),
// the residual's (0 or absent: none) and the logits' divisor (required, as llama.cpp requires
// it). Each must be finite; the scales and the divisor positive.
void granite_multipliers(const gguf::GgufFile& f, ModelConfig& c, LayerSpec& spec) {
  const auto read = [&](const std::string& key, double fallback, bool required) {
    const double v =
        required ? f.get_float(c.arch + "." + key) : f.get_float_or(c.arch + "." + key, fallback);
    if (!std::isfinite(v) || v < 0.0 || (required && v == 0.0))
      throw_error(ErrorKind::kFormat, f.path() + ": " + key + " must be a finite number above 0");
    return (float)v;
  };
  if (const float e = read("embedding_scale", 0.0, false); e != 0.0f) c.embed_scale = e;
  if (const float s = read("attention.scale", 0.0, false); s != 0.0f) spec.attention.scale = s;
  c.residual_scale = read("residual_scale", 0.0, false);
  c.logits_factor = 1.0f / read("logit_scale", 1.0, true);  // (llama.cpp's division, in float)
}

// MiniCPM's multipliers: Granite's keys, each optional, with the values older files imply
// (embedding 12, residual 1.4 / sqrt(layers), logits divided by 256 / n_embd) in llama.cpp's
// float arithmetic; its attention keeps 1/sqrt(head_dim), its RoPE always on.
void minicpm_multipliers(const gguf::GgufFile& f, ModelConfig& c) {
  const auto read = [&](const std::string& key, float fallback) {
    const double v = f.get_float_or(c.arch + "." + key, (double)fallback);
    if (!std::isfinite(v) || v <= 0.0)
      throw_error(ErrorKind::kFormat, f.path() + ": " + key + " must be a finite number above 0");
    return (float)v;
  };
  c.embed_scale = read("embedding_scale", 12.0f);
  c.residual_scale = read("residual_scale", 1.4f / std::sqrt((float)c.n_layers));
  c.logits_factor = 1.0f / read("logit_scale", 256.0f / (float)c.n_embd);
}

// Mistral 3's query temperature: attention.temperature_scale (absent or 0: none), its floor
// the YaRN original context (rope.scaling.original_context_length, else the trained
// context), as llama.cpp reads them. Its mixture-of-experts form is not supported.
void mistral3_temperature(const gguf::GgufFile& f, ModelConfig& c) {
  if (c.n_experts > 0)
    throw_error(ErrorKind::kUnsupported, f.path() + ": mistral3 with experts is not supported");
  const double scale = f.get_float_or(c.arch + ".attention.temperature_scale", 0.0);
  if (!std::isfinite(scale))
    throw_error(ErrorKind::kFormat, f.path() + ": attention.temperature_scale must be finite");
  if (scale == 0.0) return;
  const uint64_t floor_scale =
      f.get_uint_or(c.arch + ".rope.scaling.original_context_length", (uint64_t)c.n_ctx_train);
  if (floor_scale == 0 || floor_scale > (1u << 30))
    throw_error(
        ErrorKind::kFormat,
        f.path() + ": attention temperature needs rope.scaling.original_context_length > 0");
  c.query_temperature = {(float)scale, (int32_t)floor_scale, 0.0f};
}

// Cohere: the logits times <arch>.logit_scale (Command R: 0 or absent, none; required for
// cohere2, as llama.cpp reads them). cohere2's sliding layers (attention.sliding_window,
// three of every four unless sliding_window_pattern says otherwise) rotate with the model's
// RoPE (llama.cpp's graph reads no rope.freq_base_swa for them), its global layers not at all.
std::vector<bool> sliding_layers(const gguf::GgufFile& f, const std::string& a, int n_layers,
                                 uint64_t default_period);
void cohere_layers(const gguf::GgufFile& f, ModelConfig& c) {
  const std::string& a = c.arch;
  const bool cohere2 = c.arch_kind == Arch::kCohere2;
  const double scale =
      cohere2 ? f.get_float(a + ".logit_scale") : f.get_float_or(a + ".logit_scale", 0.0);
  if (!std::isfinite(scale) || scale < 0.0)
    throw_error(ErrorKind::kFormat, f.path() + ": logit_scale must be a finite number >= 0");
  if (scale != 0.0) c.logits_factor = (float)scale;
  if (!cohere2) return;
  const uint64_t window = f.get_uint(a + ".attention.sliding_window");
  if (window == 0 || window > (1u << 30))
    throw_error(ErrorKind::kFormat, f.path() + ": attention.sliding_window is out of range");
  const std::vector<bool> sliding = sliding_layers(f, a, c.n_layers, 4);
  for (int l = 0; l < c.n_layers; ++l) {
    const bool slides = sliding[(size_t)l];
    c.layers[(size_t)l].attention.window = slides ? (int32_t)window : 0;
    c.layers[(size_t)l].rope = slides ? 0 : LayerSpec::kNoRope;
  }
}

// Every layer rotated by the one RoPE, scaled by 1/sqrt(head_dim) (in attention, or on q for
// Phi-3 and Gemma 1), and global, except that a llama or mistral3 file with
// <arch>.attention.sliding_window (Mistral, as transformers runs it: every layer slides) attends
// through that window; llama.cpp's converter writes no such key for Mistral and its graphs
// ignore it. Phi-3's sliding window is ignored, as llama.cpp ignores it.
void llama_family_layers(const gguf::GgufFile& f, ModelConfig& c) {
  if (c.arch_kind == Arch::kPhi3 || c.arch_kind == Arch::kMiniCpm) read_longrope(f, c);
  c.ropes = {c.rope};
  LayerSpec spec;
  spec.attention.scale = 1.0f / std::sqrt((float)c.head_dim);
  if (c.arch_kind == Arch::kLlama || c.arch_kind == Arch::kMistral3) {
    const uint64_t window = f.get_uint_or(c.arch + ".attention.sliding_window", 0);
    if (window > (1u << 30))
      throw_error(ErrorKind::kFormat, f.path() + ": attention.sliding_window is out of range");
    spec.attention.window = (int32_t)window;
  }
  if (c.arch_kind == Arch::kPhi3 || c.arch_kind == Arch::kPhi2 || c.arch_kind == Arch::kGemma) {
    // q scaled, as llama.cpp does
    c.query_scale = spec.attention.scale;
    spec.attention.scale = 1.0f;
  }
  if (c.arch_kind == Arch::kGemma) {  // Gemma 1 (its norm weights already hold 1 + w)
    c.embed_scale = std::sqrt((float)c.n_embd);
    c.ffn_activation = GluActivation::kGeluTanh;
    c.tied_output = true;  // its classifier is token_embd, whatever else the file has
  }
  const bool granite = c.arch_kind == Arch::kGranite || c.arch_kind == Arch::kGraniteMoe;
  if (granite) granite_multipliers(f, c, spec);
  if (c.arch_kind == Arch::kMiniCpm) minicpm_multipliers(f, c);
  if (c.arch_kind == Arch::kNemotron) c.ffn_relu_squared = true;  // (up, relu^2, down)
  if (c.arch_kind == Arch::kArcee) {  // an ungated relu^2 MLP; the attention scale if given
    c.ffn_relu_squared = true;
    const double s = f.get_float_or(c.arch + ".attention.scale", 0.0);
    if (!std::isfinite(s) || s < 0.0)
      throw_error(ErrorKind::kFormat, f.path() + ": attention.scale must be >= 0");
    if (s > 0.0) spec.attention.scale = (float)s;
  }
  if (c.arch_kind == Arch::kGlm4) c.post_norms = true;  // (and a norm before each block)
  if (c.arch_kind == Arch::kMistral3) mistral3_temperature(f, c);
  c.layers.assign((size_t)c.n_layers, spec);
  if (c.arch_kind == Arch::kSmolLM3) no_rope_layers(f, c);
  // Granite: rope.scaling.finetuned = false switches RoPE off (llama.cpp reads it so).
  if (granite && !f.get_bool_or(c.arch + ".rope.scaling.finetuned", true))
    for (LayerSpec& l : c.layers) l.rope = LayerSpec::kNoRope;
  if (is_cohere_family(c.arch_kind)) cohere_layers(f, c);
}

// Which layers attend through a sliding window: <arch>.attention.sliding_window_pattern as
// an array of booleans (one per layer), or as a period n where every n-th layer (the last of
// each period) is global and the others slide; `default_period` when the key is absent.
std::vector<bool> sliding_layers(const gguf::GgufFile& f, const std::string& a, int n_layers,
                                 uint64_t default_period) {
  const std::string key = a + ".attention.sliding_window_pattern";
  std::vector<bool> sliding((size_t)n_layers);
  if (const gguf::Value* v = f.find(key); v != nullptr && v->type == gguf::ValueType::ARRAY) {
    const gguf::Array& flags = f.get_array(key);
    if (flags.elem_type != gguf::ValueType::BOOL || (int)flags.packed.size() != n_layers)
      throw_error(ErrorKind::kFormat, f.path() + ": " + key + " must hold one bool per layer (" +
                                          std::to_string(n_layers) + ")");
    for (int l = 0; l < n_layers; ++l) sliding[(size_t)l] = flags.packed[(size_t)l] != 0;
    return sliding;
  }
  const uint64_t period = f.get_uint_or(key, default_period);
  for (int l = 0; l < n_layers; ++l)
    sliding[(size_t)l] = period == 0 || (uint64_t)l % period < period - 1;
  return sliding;
}

// OLMo 2 and 3 (olmo2 files) and EXAONE 4: every layer scaled by 1/sqrt(head_dim); sliding-
// window layers (attention.sliding_window; three of every four unless sliding_window_pattern
// says otherwise). OLMo 3's rotate without the model's RoPE scaling, at rope.freq_base_swa if
// the file has it; EXAONE 4 with sliding windows (the 32B only: 4096 unless the file says
// otherwise) rotates only those, its global layers not at all. Post-norms only (forward.h's
// forward_post_norm); EXAONE 4's q/k norms per head, OLMo's over whole rows. (llama.cpp's
// readings.)
void post_norm_layers(const gguf::GgufFile& f, ModelConfig& c) {
  const std::string& a = c.arch;
  const bool exaone = c.arch_kind == Arch::kExaone4;
  c.post_norms = true;
  c.qk_norm = exaone;
  // (EXAONE 4: only the 32B's 64 layers slide, as llama.cpp reads the family.)
  int64_t window = (int64_t)f.get_uint_or(a + ".attention.sliding_window",
                                          exaone && c.n_layers == 64 ? 4096 : 0);
  if (exaone && c.n_layers != 64) window = 0;
  if (window < 0 || window > (1 << 30))
    throw_error(ErrorKind::kFormat, f.path() + ": attention.sliding_window is out of range");
  RopeParams local = c.rope;
  if (!exaone) local.scaling = RopeParams::Scaling::kNone, local.factor = 1.0f;
  local.freq_base = (float)f.get_float_or(a + ".rope.freq_base_swa", (double)c.rope.freq_base);
  if (!(local.freq_base > 0.0f))
    throw_error(ErrorKind::kFormat, f.path() + ": rope.freq_base_swa must be > 0");
  c.ropes = {c.rope, local};
  const std::vector<bool> sliding = sliding_layers(f, a, c.n_layers, 4);
  c.layers.resize((size_t)c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const bool slides = window > 0 && sliding[(size_t)l];
    c.layers[(size_t)l].attention = {1.0f / std::sqrt((float)c.head_dim),
                                     slides ? (int32_t)window : 0, 0.0f};
    c.layers[(size_t)l].rope = slides ? 1 : exaone && window > 0 ? LayerSpec::kNoRope : 0;
  }
}

// A soft-cap from metadata: 0 (off) or a positive, finite value.
float softcap_from(const gguf::GgufFile& f, const std::string& key, double fallback) {
  const double cap = f.get_float_or(key, fallback);
  if (!(cap >= 0.0) || !std::isfinite(cap))
    throw_error(ErrorKind::kFormat, f.path() + ": " + key + " must be >= 0");
  return (float)cap;
}

// The Gemma family (the defaults are those of the models' reference configurations):
//  - the embedding scaled by sqrt(n_embd); q scaled by 1/sqrt(query_pre_attn_scalar) before
//    attention (head_dim, except the 27B models, 46 layers for Gemma 2 and 62 for Gemma 3,
//    whose scalar is n_embd / n_heads); GeGLU; norms after attention and FFN;
//  - sliding-window layers: every other one for Gemma 2 (window 4096 by default), five of
//    six for Gemma 3 (no window key: every layer global); they rotate with their own RoPE
//    base (rope.freq_base_swa; Gemma 3: 10000, no scaling; Gemma 2: the model's);
//  - Gemma 2: attention scores and final logits soft-capped (50 and 30 by default); Gemma 3:
//    per-head q/k norms, and no soft-caps unless the file gives a final one;
//  - gemma-embedding (EmbeddingGemma): Gemma 3's blocks attending both ways (its windows
//    reach half their length on either side), q scaled by 1/sqrt(head_dim), the local RoPE
//    base the model's unless the file gives one, as llama.cpp reads it.
void gemma_layers(const gguf::GgufFile& f, ModelConfig& c) {
  const std::string& a = c.arch;
  const bool gemma2 = c.arch_kind == Arch::kGemma2;
  const bool embedder = c.arch_kind == Arch::kGemmaEmbedding;
  c.ffn_activation = GluActivation::kGeluTanh;
  c.embed_scale = std::sqrt((float)c.n_embd);
  const int big_layers = gemma2 ? 46 : 62;
  const float scalar = (float)f.get_float_or(
      a + ".attention.query_pre_attn_scalar",
      c.n_layers == big_layers ? (double)(c.n_embd / c.n_heads) : (double)c.head_dim);
  if (!(scalar > 0.0f))
    throw_error(ErrorKind::kFormat, f.path() + ": query_pre_attn_scalar must be > 0");
  c.query_scale = 1.0f / std::sqrt(embedder ? (float)c.head_dim : scalar);
  c.post_norms = true;
  c.qk_norm = !gemma2;
  if (gemma2) c.tied_output = true;  // its classifier is token_embd, whatever else the file has
  c.final_softcap = softcap_from(f, a + ".final_logit_softcapping", gemma2 ? 30.0 : 0.0);
  const float attn_softcap = gemma2 ? softcap_from(f, a + ".attn_logit_softcapping", 50.0) : 0.0f;
  const int64_t window = (int64_t)f.get_uint_or(a + ".attention.sliding_window", gemma2 ? 4096 : 0);
  if (window < 0 || window > (1 << 30))
    throw_error(ErrorKind::kFormat, f.path() + ": attention.sliding_window is out of range");
  RopeParams local = c.rope;
  if (!gemma2) local.scaling = RopeParams::Scaling::kNone, local.factor = 1.0f;
  local.freq_base = (float)f.get_float_or(a + ".rope.freq_base_swa",
                                          gemma2 || embedder ? (double)c.rope.freq_base : 10000.0);
  if (!(local.freq_base > 0.0f))
    throw_error(ErrorKind::kFormat, f.path() + ": rope.freq_base_swa must be > 0");
  c.ropes = {c.rope, local};
  const std::vector<bool> sliding = sliding_layers(f, a, c.n_layers, gemma2 ? 2 : 6);
  c.layers.resize((size_t)c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const bool slides = window > 0 && sliding[(size_t)l];
    c.layers[(size_t)l].attention = {1.0f, slides ? (int32_t)window : 0, attn_softcap};
    c.layers[(size_t)l].rope = slides ? 1 : 0;
  }
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
  read_norm_epsilon(f, c);

  c.rope.n_dims = (int)f.get_uint_or(a + ".rope.dimension_count", (uint64_t)c.head_dim);
  if (c.rope.n_dims <= 0 || c.rope.n_dims > c.head_dim || c.rope.n_dims % 2 != 0)
    throw_error(ErrorKind::kFormat, f.path() + ": rope.dimension_count " +
                                        std::to_string(c.rope.n_dims) + " does not fit head dim " +
                                        std::to_string(c.head_dim));
  c.rope.freq_base = (float)f.get_float_or(a + ".rope.freq_base", 10000.0);
  if (!(c.rope.freq_base > 0.0f))
    throw_error(ErrorKind::kFormat, f.path() + ": rope.freq_base must be > 0");
  if (c.arch_kind == Arch::kHunyuanDense) read_ntk_alpha(f, c);
  // llama and the families llama.cpp turns alike: adjacent pairs; the others NeoX halves.
  c.rope.neox = !formats::adjacent_pair_rope(c.arch);
  // A Hugging Face checkpoint keeps transformers' q/k order: NeoX halves for llama too.
  c.rope.neox = f.get_bool_or("hablar.rope.neox", c.rope.neox);
  read_rope_scaling(f, a, c.rope);

  c.qkv_bias = c.arch_kind == Arch::kQwen2 || c.arch_kind == Arch::kQwen2Moe ||
               c.arch_kind == Arch::kPhi2 || c.arch_kind == Arch::kStarCoder2;
  c.qk_norm = c.arch_kind == Arch::kQwen3 || c.arch_kind == Arch::kQwen3Moe ||
              c.arch_kind == Arch::kHunyuanDense;
  c.qk_norm_after_rope = c.arch_kind == Arch::kHunyuanDense;
  c.qk_norm_rows = c.arch_kind == Arch::kOlmo2 || c.arch_kind == Arch::kOlmoe;
  read_experts(f, c);
  // (phi2's classifier is its own, with a bias: never tied.)
  c.tied_output = f.find_tensor("output.weight") == nullptr && c.arch_kind != Arch::kPhi2;
  // (Command R's classifier is token_embd, whatever else the file has, as llama.cpp loads it.)
  if (is_cohere_family(c.arch_kind)) c.tied_output = true;
  if (is_gemma_family(c.arch_kind)) {
    gemma_layers(f, c);
  } else if (is_post_norm_family(c.arch_kind)) {
    post_norm_layers(f, c);
  } else {
    llama_family_layers(f, c);
  }
  read_embedding_config(f, c);
  const gguf::TensorInfo& embd = f.tensor("token_embd.weight");
  c.n_vocab = (int)embd.rows();
  return c;
}

}  // namespace hablar::model
