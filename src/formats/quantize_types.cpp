// Which type each tensor gets under a llama-quantize file type: llama.cpp's rules
// (src/llama-quant.cpp, no importance matrix, no overrides), written for the file types we
// can produce. The rules walk the tensors in output order and count attn_v / ffn_down /
// ffn_gate / ffn_up tensors as they go: "layer i of n" for those tensors is that count, not
// the layer in the name (except in mixture-of-experts models).
#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "formats/quantize.h"

namespace hablar::formats {
namespace {

struct FtypeName {
  std::string_view name;
  Ftype ftype;
};
// llama-quantize's names, in its order; the Q3_K / Q4_K / Q5_K aliases name the _M mixes.
constexpr FtypeName kFtypeNames[] = {
    {"Q4_0", Ftype::kQ4_0},     {"Q4_1", Ftype::kQ4_1},     {"Q5_0", Ftype::kQ5_0},
    {"Q5_1", Ftype::kQ5_1},     {"Q2_K", Ftype::kQ2_K},     {"Q3_K", Ftype::kQ3_K_M},
    {"Q3_K_S", Ftype::kQ3_K_S}, {"Q3_K_M", Ftype::kQ3_K_M}, {"Q3_K_L", Ftype::kQ3_K_L},
    {"IQ4_NL", Ftype::kIQ4_NL}, {"IQ4_XS", Ftype::kIQ4_XS}, {"Q4_K", Ftype::kQ4_K_M},
    {"Q4_K_S", Ftype::kQ4_K_S}, {"Q4_K_M", Ftype::kQ4_K_M}, {"Q5_K", Ftype::kQ5_K_M},
    {"Q5_K_S", Ftype::kQ5_K_S}, {"Q5_K_M", Ftype::kQ5_K_M}, {"Q6_K", Ftype::kQ6_K},
    {"Q8_0", Ftype::kQ8_0},     {"F16", Ftype::kF16},       {"BF16", Ftype::kBF16},
    {"F32", Ftype::kF32},
};

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'a' && c <= 'z') c = (char)(c - 'a' + 'A');
  return out;
}

bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

// The N of a "blk.N." prefix; -1 without one (as llama.cpp's sscanf leaves it).
int layer_of(std::string_view name) {
  if (!name.starts_with("blk.")) return -1;
  const std::string rest(name.substr(4));
  char* end = nullptr;
  const long v = std::strtol(rest.c_str(), &end, 10);
  return end == rest.c_str() ? -1 : (int)v;
}

enum class Category {
  kOutput,
  kTokenEmbd,
  kAttnQkv,
  kAttnKvB,
  kAttnV,
  kAttnK,
  kAttnQ,
  kAttnOutput,
  kFfnUp,
  kFfnGate,
  kFfnDown,
  kOther
};

// llama.cpp's tensor categories, tested in its order (first match wins).
Category category_of(std::string_view name) {
  if (name == "output.weight") return Category::kOutput;
  if (name == "token_embd.weight" || name == "per_layer_token_embd.weight")
    return Category::kTokenEmbd;
  if (contains(name, "attn_qkv.weight")) return Category::kAttnQkv;
  if (contains(name, "attn_kv_b.weight")) return Category::kAttnKvB;
  if (contains(name, "attn_v.weight")) return Category::kAttnV;
  if (contains(name, "attn_k.weight")) return Category::kAttnK;
  if (contains(name, "attn_q.weight")) return Category::kAttnQ;
  if (contains(name, "attn_output.weight")) return Category::kAttnOutput;
  if (contains(name, "ffn_up")) return Category::kFfnUp;
  if (contains(name, "ffn_gate")) return Category::kFfnGate;
  if (contains(name, "ffn_down")) return Category::kFfnDown;
  return Category::kOther;
}

bool is_attn_v_like(Category c) {
  return c == Category::kAttnV || c == Category::kAttnQkv || c == Category::kAttnKvB;
}

// Whether llama.cpp quantizes the tensor at all (tensor_allows_quantization, for the
// architectures hablar knows; the names of other families' small tensors are kept too).
bool allows_quantization(const gguf::TensorInfo& t, const std::vector<int64_t>& dims) {
  if (dims.size() < 2) return false;
  const std::string_view n = t.name;
  if (!n.ends_with("weight")) return false;
  for (std::string_view skip : {"_norm.weight",
                                "ffn_gate_inp.weight",
                                "ffn_gate_tid2eid.weight",
                                "altup",
                                "laurel",
                                "per_layer_model_proj",
                                "ssm_conv1d",
                                "shortconv.conv.weight",
                                "indexer.k_proj.weight",
                                "indexer.q_proj.weight",
                                "time_mix_first.weight",
                                "time_mix_w0.weight",
                                "time_mix_w1.weight",
                                "time_mix_w2.weight",
                                "time_mix_v0.weight",
                                "time_mix_v1.weight",
                                "time_mix_v2.weight",
                                "time_mix_a0.weight",
                                "time_mix_a1.weight",
                                "time_mix_a2.weight",
                                "time_mix_g1.weight",
                                "time_mix_g2.weight",
                                "time_mix_decay_w1.weight",
                                "time_mix_decay_w2.weight",
                                "time_mix_lerp_fused.weight",
                                "attn_rel_b.weight",
                                ".position_embd",
                                "sam.pos_embd",
                                "sam.neck.",
                                "sam.net_",
                                ".rel_pos",
                                ".patch_embd",
                                ".patch_merger",
                                "a.rvq.codebook",
                                "mm.a.code_embd"})
    if (contains(n, skip)) return false;
  return n != "position_embd.weight" && n != "token_types.weight";
}

// More bits for the first and last eighth of the layers and every third layer between.
bool use_more_bits(int i, int n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

// The counters of the walk (llama.cpp's quantize_state_impl).
struct Walk {
  const QuantizeModelFacts& m;
  Ftype ftype;
  int i_attention_wv = 0, i_ffn_down = 0, i_ffn_gate = 0, i_ffn_up = 0;

  // (layer, layer count) of an FFN tensor: the running count, or the name's layer when
  // the model has experts (their tensors need not come in layer order).
  std::pair<int, int> layer_info(int counter, const std::string& name) const {
    if (m.n_expert <= 1) return {counter, m.n_layers};
    const int layer = layer_of(name);
    if (layer < 0 || layer >= m.n_layers)
      throw_error(ErrorKind::kInvalidArgument,
                  "quantize: cannot tell the layer of expert tensor " + name);
    return {layer, m.n_layers};
  }

  DType output_type(DType t, int64_t n_cols) const {
    if (m.arch == "falcon" || n_cols % dtype_traits(t).block_elems != 0) return DType::Q8_0;
    return t != DType::Q8_0 ? DType::Q6_K : t;
  }

  DType attn_v_type(DType t) {
    const Ftype f = ftype;
    if (f == Ftype::kQ2_K) {
      t = m.n_gqa >= 4 ? DType::Q4_K : DType::Q3_K;
    } else if (f == Ftype::kQ3_K_M) {
      t = i_attention_wv < 2 ? DType::Q5_K : DType::Q4_K;
    } else if (f == Ftype::kQ3_K_L) {
      t = DType::Q5_K;
    } else if ((f == Ftype::kIQ4_NL || f == Ftype::kIQ4_XS) && m.n_gqa >= 4) {
      t = DType::Q5_K;
    } else if ((f == Ftype::kQ4_K_M || f == Ftype::kQ5_K_M) &&
               use_more_bits(i_attention_wv, m.n_attention_wv)) {
      t = DType::Q6_K;
    } else if (f == Ftype::kQ4_K_S && i_attention_wv < 4) {
      t = DType::Q5_K;
    }
    if (m.is_70b && (t == DType::Q3_K || t == DType::Q4_K)) t = DType::Q5_K;
    if (m.n_expert == 8) t = DType::Q8_0;
    ++i_attention_wv;
    return t;
  }

  DType ffn_down_type(DType t, const std::string& name) {
    const auto [i, n] = layer_info(i_ffn_down, name);
    const Ftype f = ftype;
    const bool falcon = m.arch == "falcon";
    if (f == Ftype::kQ2_K) {
      t = DType::Q3_K;
    } else if (f == Ftype::kQ3_K_M) {
      t = i < n / 16 ? DType::Q5_K : !falcon || use_more_bits(i, n) ? DType::Q4_K : DType::Q3_K;
    } else if (f == Ftype::kQ3_K_L) {
      t = falcon ? DType::Q4_K : DType::Q5_K;
    } else if (f == Ftype::kQ4_K_M) {
      if (falcon)
        t = i < n / 16 ? DType::Q6_K : use_more_bits(i, n) ? DType::Q5_K : DType::Q4_K;
      else if (use_more_bits(i, n))
        t = DType::Q6_K;
    } else if (i < n / 8 && (f == Ftype::kIQ4_NL || f == Ftype::kIQ4_XS)) {
      t = DType::Q5_K;
    } else if (f == Ftype::kQ5_K_M && use_more_bits(i, n)) {
      t = DType::Q6_K;
    } else if (f == Ftype::kQ4_K_S && !falcon && i < n / 8) {
      t = DType::Q5_K;
    }
    ++i_ffn_down;
    return t;
  }

  DType attn_output_type(DType t) const {
    const Ftype f = ftype;
    if (m.arch == "falcon") return f == Ftype::kQ3_K_L ? DType::Q4_K : t;
    if (m.n_expert == 8) {
      const bool bump = f == Ftype::kQ2_K || f == Ftype::kQ3_K_S || f == Ftype::kQ3_K_M ||
                        f == Ftype::kIQ4_NL || f == Ftype::kQ4_K_S || f == Ftype::kQ4_K_M ||
                        f == Ftype::kIQ4_XS;
      return bump ? DType::Q5_K : t;
    }
    if (f == Ftype::kQ2_K) return DType::Q3_K;
    if (f == Ftype::kQ3_K_M) return DType::Q4_K;
    if (f == Ftype::kQ3_K_L) return DType::Q5_K;
    return t;
  }

  // llama_tensor_get_type_impl for one quantizable tensor.
  DType mix_type(DType t, const gguf::TensorInfo& tensor, Category c) {
    const std::string& name = tensor.name;
    if (c == Category::kOutput || (m.tied_output && c == Category::kTokenEmbd))
      return output_type(t, tensor.dims[0]);
    if (c == Category::kTokenEmbd) return t;
    if (is_attn_v_like(c)) return attn_v_type(t);
    if (c == Category::kAttnK) return m.n_expert == 8 ? DType::Q8_0 : t;
    if (c == Category::kFfnDown) return ffn_down_type(t, name);
    if (c == Category::kAttnOutput) return attn_output_type(t);
    if (c == Category::kFfnGate) {
      layer_info(i_ffn_gate++, name);  // checks the name as llama.cpp does
    } else if (c == Category::kFfnUp) {
      layer_info(i_ffn_up++, name);
    }
    return t;
  }
};

// A type whose block divides n_cols: llama.cpp's fallbacks, F16 when even those do not fit.
DType fit_row(DType t, int64_t n_cols) {
  const uint32_t block = dtype_traits(t).block_elems;
  if (n_cols % block == 0) return t;
  DType fallback = t;
  switch (t) {
    case DType::IQ4_XS:
      fallback = DType::IQ4_NL;
      break;
    case DType::Q2_K:
    case DType::Q3_K:
      fallback = DType::Q4_0;
      break;
    case DType::Q4_K:
      fallback = DType::Q5_0;
      break;
    case DType::Q5_K:
      fallback = DType::Q5_1;
      break;
    case DType::Q6_K:
      fallback = DType::Q8_0;
      break;
    default:
      break;
  }
  return n_cols % dtype_traits(fallback).block_elems == 0 ? fallback : DType::F16;
}

// The per-layer value of an integer key that may be an array; `fallback` when absent.
int64_t first_int(const gguf::GgufFile& f, const std::string& key, int64_t fallback) {
  const gguf::Value* v = f.find(key);
  if (!v) return fallback;
  if (v->type == gguf::ValueType::ARRAY) {
    const gguf::Array& a = std::get<gguf::Array>(v->data);
    if (a.size() == 0) return fallback;
    const gguf::Value e = a.at(0);
    if (const auto* u = std::get_if<uint64_t>(&e.data)) return (int64_t)*u;
    if (const auto* s = std::get_if<int64_t>(&e.data)) return *s;
    return fallback;
  }
  return f.get_int(key);
}

}  // namespace

std::optional<Ftype> ftype_from_name(std::string_view name) {
  const std::string want = upper(name);
  for (const FtypeName& n : kFtypeNames)
    if (n.name == want) return n.ftype;
  return std::nullopt;
}

std::string ftype_name(Ftype ftype) {
  for (const FtypeName& n : kFtypeNames)
    if (n.ftype == ftype && n.name != "Q3_K" && n.name != "Q4_K" && n.name != "Q5_K")
      return std::string(n.name);
  return "?";
}

std::string ftype_names() {
  std::string out;
  for (const FtypeName& n : kFtypeNames) out += (out.empty() ? "" : ", ") + std::string(n.name);
  return out;
}

DType ftype_default_type(Ftype ftype) {
  switch (ftype) {
    case Ftype::kF32:
      return DType::F32;
    case Ftype::kF16:
      return DType::F16;
    case Ftype::kBF16:
      return DType::BF16;
    case Ftype::kQ4_0:
      return DType::Q4_0;
    case Ftype::kQ4_1:
      return DType::Q4_1;
    case Ftype::kQ5_0:
      return DType::Q5_0;
    case Ftype::kQ5_1:
      return DType::Q5_1;
    case Ftype::kQ8_0:
      return DType::Q8_0;
    case Ftype::kQ2_K:
      return DType::Q2_K;
    case Ftype::kQ3_K_S:
    case Ftype::kQ3_K_M:
    case Ftype::kQ3_K_L:
      return DType::Q3_K;
    case Ftype::kQ4_K_S:
    case Ftype::kQ4_K_M:
      return DType::Q4_K;
    case Ftype::kQ5_K_S:
    case Ftype::kQ5_K_M:
      return DType::Q5_K;
    case Ftype::kQ6_K:
      return DType::Q6_K;
    case Ftype::kIQ4_NL:
      return DType::IQ4_NL;
    case Ftype::kIQ4_XS:
      return DType::IQ4_XS;
  }
  return DType::F32;
}

QuantizeModelFacts quantize_model_facts(const gguf::GgufFile& f) {
  QuantizeModelFacts m;
  m.arch = f.get_string("general.architecture");
  m.n_layers = (int)f.get_uint(m.arch + ".block_count");
  const int64_t heads = first_int(f, m.arch + ".attention.head_count", 0);
  const int64_t kv_heads = first_int(f, m.arch + ".attention.head_count_kv", heads);
  m.n_gqa = kv_heads > 0 ? (int)(heads / kv_heads) : 0;
  m.n_expert = (int)f.get_uint_or(m.arch + ".expert_count", 0);
  const bool seventy = m.arch == "llama"
                           ? heads != kv_heads
                           : m.arch == "qwen2" || m.arch == "olmo" || m.arch == "deci";
  m.is_70b = m.n_layers == 80 && seventy;
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (t.name == "output.weight") m.tied_output = false;
    if (is_attn_v_like(category_of(t.name))) ++m.n_attention_wv;
  }
  return m;
}

std::vector<QuantizedTensorPlan> plan_quantization(const gguf::GgufFile& f, Ftype ftype) {
  const QuantizeModelFacts facts = quantize_model_facts(f);
  std::vector<QuantizedTensorPlan> plan;
  for (const gguf::TensorInfo& t : f.tensors()) {
    std::vector<int64_t> dims = t.dims;
    while (dims.size() > 1 && dims.back() == 1) dims.pop_back();
    plan.push_back({&t, t.type, std::move(dims)});
  }
  // llama.cpp's loader keeps its tensors in a map ordered by (layer, name).
  std::stable_sort(plan.begin(), plan.end(), [](const auto& a, const auto& b) {
    const int la = layer_of(a.source->name), lb = layer_of(b.source->name);
    return la != lb ? la < lb : a.source->name < b.source->name;
  });
  const DType base = ftype_default_type(ftype);
  const bool quantized = dtype_traits(base).quantized;
  Walk walk{facts, ftype};
  for (QuantizedTensorPlan& p : plan) {
    if (!allows_quantization(*p.source, p.dims)) continue;
    DType t = base;
    if (quantized)
      t = fit_row(walk.mix_type(base, *p.source, category_of(p.source->name)), p.source->dims[0]);
    p.type = t;
  }
  return plan;
}

}  // namespace hablar::formats
