// Weight views from a GGUF file, with every tensor checked against the configuration.
#include "model/weights.h"

#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "core/quant.h"

namespace hablar::model {
namespace {

std::string shape_str(int64_t cols, int64_t rows) {
  return rows == 0 ? fmt::format("[{}]", cols) : fmt::format("[{}, {}]", cols, rows);
}

const gguf::TensorInfo& require_shape(const gguf::GgufFile& f, const std::string& name,
                                      int64_t cols, int64_t rows) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (t == nullptr) throw_error(ErrorKind::kFormat, f.path() + ": tensor " + name + " is missing");
  const bool is_vector = rows == 0;
  const bool ok = is_vector ? (t->dims.size() == 1 && t->dims[0] == cols)
                            : (t->dims.size() == 2 && t->dims[0] == cols && t->dims[1] == rows);
  if (!ok)
    throw_error(ErrorKind::kFormat, f.path() + ": tensor " + name + " has shape " +
                                        t->shape_string() + ", metadata implies " +
                                        shape_str(cols, rows));
  if (!dtype_traits(t->type).supported)
    throw_error(ErrorKind::kUnsupported,
                f.path() + ": tensor " + name + " has type " + std::string(dtype_name(t->type)) +
                    ", not supported (supported: " + supported_dtype_names() + ")");
  return *t;
}

WeightView view_of(const gguf::TensorInfo& t) {
  WeightView w;
  w.type = t.type;
  w.cols = t.dims[0];
  w.rows = t.dims[1];
  w.row_bytes = dtype_row_bytes(t.type, w.cols);
  w.data = t.data;
  return w;
}

WeightView matrix(const gguf::GgufFile& f, const std::string& name, int64_t cols, int64_t rows) {
  return view_of(require_shape(f, name, cols, rows));
}

// A 1-D tensor as float32, stored in w.vectors; returns its data.
const float* vector_f32(Weights& w, const gguf::GgufFile& f, const std::string& name, int64_t n) {
  const gguf::TensorInfo& t = require_shape(f, name, n, 0);
  std::vector<float>& out = w.vectors.emplace_back((size_t)n);
  dequantize_row(t.type, t.data, out.data(), n);
  return out.data();
}

// A 1-D tensor [n] as a matrix of one row [1 x n].
WeightView view_of_vector(const gguf::TensorInfo& t) {
  WeightView w;
  w.type = t.type;
  w.cols = t.dims[0];
  w.rows = 1;
  w.row_bytes = dtype_row_bytes(t.type, w.cols);
  w.data = t.data;
  return w;
}

// Rows [first, first + n) of a matrix, as a matrix of its own.
WeightView row_slice(const WeightView& w, int64_t first, int64_t n) {
  WeightView s = w;
  s.rows = n;
  s.data = static_cast<const uint8_t*>(w.data) + (size_t)first * w.row_bytes;
  return s;
}

// The n slices [rows x cols] of a 3-D tensor [cols, rows, n] (GGUF order).
std::vector<WeightView> expert_slices(const gguf::GgufFile& f, const std::string& name,
                                      int64_t cols, int64_t rows, int64_t n) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (t == nullptr) throw_error(ErrorKind::kFormat, f.path() + ": tensor " + name + " is missing");
  if (t->dims.size() != 3 || t->dims[0] != cols || t->dims[1] != rows || t->dims[2] != n)
    throw_error(ErrorKind::kFormat, f.path() + ": tensor " + name + " has shape " +
                                        t->shape_string() + ", metadata implies " +
                                        fmt::format("[{}, {}, {}]", cols, rows, n));
  if (!dtype_traits(t->type).supported)
    throw_error(ErrorKind::kUnsupported, f.path() + ": tensor " + name + " has type " +
                                             std::string(dtype_name(t->type)) + ", not supported");
  std::vector<WeightView> out((size_t)n);
  for (int64_t e = 0; e < n; ++e) {
    WeightView& w = out[(size_t)e];
    w.type = t->type, w.cols = cols, w.rows = rows;
    w.row_bytes = dtype_row_bytes(t->type, cols);
    w.data = static_cast<const uint8_t*>(t->data) + (size_t)(e * rows) * w.row_bytes;
  }
  return out;
}

// A 1-D tensor when the file has it, else null.
const float* optional_vector(Weights& w, const gguf::GgufFile& f, const std::string& name,
                             int64_t n) {
  return f.find_tensor(name) ? vector_f32(w, f, name, n) : nullptr;
}

// Whether a layer's q, k and v projections have biases.
enum class QkvBias { kNone, kOptional, kRequired };

// A layer's q, k, v projections [q_dim | kv_dim | kv_dim rows x n_embd]: apart (attn_q, attn_k,
// attn_v) or fused in attn_qkv (the three row blocks in that order, its bias likewise), with
// their biases as `bias` says.
void load_qkv(Weights& w, const gguf::GgufFile& f, const std::string& p, int64_t E, int64_t QD,
              int64_t KVD, QkvBias bias, LayerWeights& l) {
  const auto vec = [&](const std::string& name, int64_t n) {
    if (bias == QkvBias::kNone) return (const float*)nullptr;
    return bias == QkvBias::kRequired ? vector_f32(w, f, name, n) : optional_vector(w, f, name, n);
  };
  if (f.find_tensor(p + "attn_qkv.weight")) {
    const WeightView qkv = matrix(f, p + "attn_qkv.weight", E, QD + 2 * KVD);
    l.wq = row_slice(qkv, 0, QD), l.wk = row_slice(qkv, QD, KVD);
    l.wv = row_slice(qkv, QD + KVD, KVD);
    if (const float* b = vec(p + "attn_qkv.bias", QD + 2 * KVD))
      l.bq = b, l.bk = b + QD, l.bv = b + QD + KVD;
    return;
  }
  l.wq = matrix(f, p + "attn_q.weight", E, QD);
  l.wk = matrix(f, p + "attn_k.weight", E, KVD);
  l.wv = matrix(f, p + "attn_v.weight", E, KVD);
  l.bq = vec(p + "attn_q.bias", QD);
  l.bk = vec(p + "attn_k.bias", KVD);
  l.bv = vec(p + "attn_v.bias", KVD);
}

// The encoders' tensors (llama.cpp's names): q/k/v apart with biases, or fused attn_qkv
// (nomic-bert); post-norm LayerNorms with biases; GELU FFN with biases (bert) or SwiGLU
// (nomic-bert).
Weights load_encoder_weights(const gguf::GgufFile& f, const ModelConfig& c) {
  Weights w;
  const int64_t E = c.n_embd, FF = c.n_ff;
  w.token_embd = matrix(f, "token_embd.weight", E, c.n_vocab);
  if (f.find_tensor("token_types.weight"))
    w.token_types = matrix(f, "token_types.weight", E, c.n_token_types);
  if (c.arch_kind == Arch::kBert) w.pos_embd = matrix(f, "position_embd.weight", E, c.n_ctx_train);
  w.embd_norm = vector_f32(w, f, "token_embd_norm.weight", E);
  w.embd_norm_b = vector_f32(w, f, "token_embd_norm.bias", E);
  if (c.n_cls_out > 0) {
    if (f.find_tensor("cls.weight")) {
      w.cls = matrix(f, "cls.weight", E, E);
      w.cls_b = optional_vector(w, f, "cls.bias", E);
    }
    if (f.find_tensor("cls.output.weight")) {
      w.cls_out = matrix(f, "cls.output.weight", E, c.n_cls_out);
      w.cls_out_b = optional_vector(w, f, "cls.output.bias", c.n_cls_out);
    }
  }
  w.layers.resize((size_t)c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    LayerWeights& l = w.layers[(size_t)i];
    const std::string p = "blk." + std::to_string(i) + ".";
    load_qkv(w, f, p, E, E, E, QkvBias::kOptional, l);
    l.wo = matrix(f, p + "attn_output.weight", E, E);
    l.bo = optional_vector(w, f, p + "attn_output.bias", E);
    l.attn_out_norm = vector_f32(w, f, p + "attn_output_norm.weight", E);
    l.attn_out_norm_b = vector_f32(w, f, p + "attn_output_norm.bias", E);
    l.w_up = matrix(f, p + "ffn_up.weight", E, FF);
    l.b_up = optional_vector(w, f, p + "ffn_up.bias", FF);
    if (c.arch_kind == Arch::kNomicBert) l.w_gate = matrix(f, p + "ffn_gate.weight", E, FF);
    l.w_down = matrix(f, p + "ffn_down.weight", FF, E);
    l.b_down = optional_vector(w, f, p + "ffn_down.bias", E);
    l.layer_out_norm = vector_f32(w, f, p + "layer_output_norm.weight", E);
    l.layer_out_norm_b = vector_f32(w, f, p + "layer_output_norm.bias", E);
  }
  return w;
}

// phi2 (llama.cpp's names): LayerNorms with biases (one per block, the final one); q, k, v
// apart or fused in attn_qkv, each with its bias; the output projection, the MLP (ffn_up,
// ffn_down) and the classifier with biases.
// Command R's (command-r, cohere2): LayerNorms without biases (llama.cpp reads none), q, k, v
// with optional biases, a SwiGLU MLP, the classifier token_embd. Command R+'s per-head q/k
// LayerNorms are refused.
Weights load_cohere_weights(const gguf::GgufFile& f, const ModelConfig& c) {
  Weights w;
  const int64_t E = c.n_embd, FF = c.n_ff, QD = c.q_dim(), KVD = c.kv_dim();
  w.token_embd = matrix(f, "token_embd.weight", E, c.n_vocab);
  w.output_norm = vector_f32(w, f, "output_norm.weight", E);
  w.output = w.token_embd;
  w.layers.resize((size_t)c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    LayerWeights& l = w.layers[(size_t)i];
    const std::string p = "blk." + std::to_string(i) + ".";
    if (f.find_tensor(p + "attn_q_norm.weight"))
      throw_error(ErrorKind::kUnsupported, f.path() + ": " + p +
                                               "attn_q_norm.weight: Command R+'s per-head q/k "
                                               "LayerNorms are not supported");
    l.attn_norm = vector_f32(w, f, p + "attn_norm.weight", E);
    load_qkv(w, f, p, E, QD, KVD, QkvBias::kOptional, l);
    l.wo = matrix(f, p + "attn_output.weight", QD, E);
    l.w_gate = matrix(f, p + "ffn_gate.weight", E, FF);
    l.w_up = matrix(f, p + "ffn_up.weight", E, FF);
    l.w_down = matrix(f, p + "ffn_down.weight", FF, E);
  }
  return w;
}

// phi2's and starcoder2's: LayerNorms with biases, biased projections, an ungated MLP; Orion's,
// Nemotron's and StableLM's the same LayerNorms, their projections' biases optional (as
// llama.cpp reads them), Orion's and StableLM's MLP gated.
Weights load_layernorm_weights(const gguf::GgufFile& f, const ModelConfig& c) {
  if (is_cohere_family(c.arch_kind)) return load_cohere_weights(f, c);
  Weights w;
  const int64_t E = c.n_embd, FF = c.n_ff, QD = c.q_dim(), KVD = c.kv_dim();
  w.token_embd = matrix(f, "token_embd.weight", E, c.n_vocab);
  w.output_norm = vector_f32(w, f, "output_norm.weight", E);
  w.output_norm_b = vector_f32(w, f, "output_norm.bias", E);
  const bool phi2 = c.arch_kind == Arch::kPhi2;  // (else starcoder2: a sequential block)
  w.output = c.tied_output ? w.token_embd : matrix(f, "output.weight", E, c.n_vocab);
  if (phi2) w.output_b = vector_f32(w, f, "output.bias", c.n_vocab);
  w.layers.resize((size_t)c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    LayerWeights& l = w.layers[(size_t)i];
    const std::string p = "blk." + std::to_string(i) + ".";
    l.attn_norm = vector_f32(w, f, p + "attn_norm.weight", E);
    l.attn_norm_b = vector_f32(w, f, p + "attn_norm.bias", E);
    const bool biased = phi2 || c.arch_kind == Arch::kStarCoder2;  // (every bias required)
    const auto bias = [&](const std::string& name, int64_t n) {
      return biased ? vector_f32(w, f, name, n) : optional_vector(w, f, name, n);
    };
    load_qkv(w, f, p, E, QD, KVD, biased ? QkvBias::kRequired : QkvBias::kOptional, l);
    l.wo = matrix(f, p + "attn_output.weight", QD, E);
    l.bo = bias(p + "attn_output.bias", E);
    if (c.arch_kind == Arch::kStableLm && !f.find_tensor(p + "ffn_norm.weight"))
      throw_error(ErrorKind::kUnsupported, f.path() + ": " + p +
                                               "ffn_norm.weight is absent: StableLM's parallel "
                                               "residual blocks are not supported");
    if (f.find_tensor(p + "attn_q_norm.weight"))
      throw_error(ErrorKind::kUnsupported, f.path() + ": " + p +
                                               "attn_q_norm.weight: per-head "
                                               "q/k LayerNorms are not supported");
    if (!phi2) {
      l.ffn_norm = vector_f32(w, f, p + "ffn_norm.weight", E);
      l.ffn_norm_b = vector_f32(w, f, p + "ffn_norm.bias", E);
    }
    const bool gated = c.arch_kind == Arch::kOrion || c.arch_kind == Arch::kStableLm;
    if (gated) l.w_gate = matrix(f, p + "ffn_gate.weight", E, FF);
    l.w_up = matrix(f, p + "ffn_up.weight", E, FF);
    l.w_down = matrix(f, p + "ffn_down.weight", FF, E);
    if (!gated) {  // (Orion's and StableLM's SwiGLU have none)
      l.b_up = bias(p + "ffn_up.bias", FF);
      l.b_down = bias(p + "ffn_down.bias", E);
    }
  }
  return w;
}

// gemma-embedding's dense_2 [d x n_embd] and dense_3 [n_embd x d], both or neither.
void load_dense_projections(const gguf::GgufFile& f, const ModelConfig& c, Weights& w) {
  const gguf::TensorInfo* d2 = f.find_tensor("dense_2.weight");
  const gguf::TensorInfo* d3 = f.find_tensor("dense_3.weight");
  if (d2 == nullptr && d3 == nullptr) return;
  if (d2 == nullptr || d3 == nullptr || d2->dims.size() != 2)
    throw_error(ErrorKind::kFormat, f.path() + ": dense_2.weight and dense_3.weight come together");
  const int64_t d = d2->dims[1];
  w.dense_2 = matrix(f, "dense_2.weight", c.n_embd, d);
  w.dense_3 = matrix(f, "dense_3.weight", d, c.n_embd);
}

}  // namespace

Weights load_weights(const gguf::GgufFile& f, const ModelConfig& c) {
  if (c.encoder) return load_encoder_weights(f, c);
  if (uses_layer_norm(c.arch_kind)) return load_layernorm_weights(f, c);
  Weights w;
  const gguf::TensorInfo& embd = require_shape(f, "token_embd.weight", c.n_embd, c.n_vocab);
  w.token_embd = view_of(embd);
  w.output_norm = vector_f32(w, f, "output_norm.weight", c.n_embd);
  w.output = c.tied_output ? w.token_embd : matrix(f, "output.weight", c.n_embd, c.n_vocab);
  if (c.arch_kind == Arch::kGemmaEmbedding) load_dense_projections(f, c, w);
  w.layers.resize((size_t)c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    LayerWeights& l = w.layers[(size_t)i];
    const std::string p = "blk." + std::to_string(i) + ".";
    const bool olmo2 = is_post_norm_family(c.arch_kind);  // (norms after the blocks only)
    if (!olmo2) l.attn_norm = vector_f32(w, f, p + "attn_norm.weight", c.n_embd);
    // (fused in attn_qkv: Phi-3; biases: qwen2 always, GLM-4-0414 and any llama-style or
    // Gemma file that has them, as llama.cpp reads them; the post-norm blocks have none)
    if (olmo2 && (f.find_tensor(p + "attn_q.bias") || f.find_tensor(p + "attn_qkv.bias")))
      throw_error(ErrorKind::kUnsupported, f.path() + ": " + p + "attn_q.bias: " + c.arch +
                                               " models with q/k/v biases "
                                               "are not supported");
    load_qkv(w, f, p, c.n_embd, c.q_dim(), c.kv_dim(),
             c.qkv_bias ? QkvBias::kRequired
             : olmo2    ? QkvBias::kNone
                        : QkvBias::kOptional,
             l);
    if (c.qk_norm) {
      l.q_norm = vector_f32(w, f, p + "attn_q_norm.weight", c.head_dim);
      l.k_norm = vector_f32(w, f, p + "attn_k_norm.weight", c.head_dim);
    }
    if (c.qk_norm_rows) {  // over the whole q and k rows (OLMo 2, OLMoE)
      l.q_norm = vector_f32(w, f, p + "attn_q_norm.weight", c.q_dim());
      l.k_norm = vector_f32(w, f, p + "attn_k_norm.weight", c.kv_dim());
    }
    l.wo = matrix(f, p + "attn_output.weight", c.q_dim(), c.n_embd);
    for (const char* bias : {"attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"})
      if (f.find_tensor(p + bias))
        throw_error(ErrorKind::kUnsupported,
                    f.path() + ": " + p + bias + ": " + c.arch +
                        " models with biases on the output or feed-forward projections are not "
                        "supported");
    if (c.post_norms) {
      l.post_attn_norm = vector_f32(w, f, p + "post_attention_norm.weight", c.n_embd);
      l.post_ffn_norm = vector_f32(w, f, p + "post_ffw_norm.weight", c.n_embd);
    }
    // (Seed-OSS names its FFN norm post_attention_norm, the norm after attention in others)
    if (!olmo2)
      l.ffn_norm = vector_f32(
          w, f,
          p + (c.arch_kind == Arch::kSeedOss ? "post_attention_norm.weight" : "ffn_norm.weight"),
          c.n_embd);
    if (c.n_experts > 0) {
      const int64_t E = c.n_experts, FE = c.n_ff_expert;
      l.router = matrix(f, p + "ffn_gate_inp.weight", c.n_embd, E);
      l.exp_gate = expert_slices(f, p + "ffn_gate_exps.weight", c.n_embd, FE, E);
      l.exp_up = expert_slices(f, p + "ffn_up_exps.weight", c.n_embd, FE, E);
      l.exp_down = expert_slices(f, p + "ffn_down_exps.weight", FE, c.n_embd, E);
      if (c.n_ff_shared > 0) {
        const int64_t FS = c.n_ff_shared;
        l.shared_gate_inp =
            view_of_vector(require_shape(f, p + "ffn_gate_inp_shexp.weight", c.n_embd, 0));
        l.shared_gate = matrix(f, p + "ffn_gate_shexp.weight", c.n_embd, FS);
        l.shared_up = matrix(f, p + "ffn_up_shexp.weight", c.n_embd, FS);
        l.shared_down = matrix(f, p + "ffn_down_shexp.weight", FS, c.n_embd);
      }
      continue;
    }
    if (c.ffn_relu_squared) {  // (Arcee: no gate)
      l.w_up = matrix(f, p + "ffn_up.weight", c.n_embd, c.n_ff);
    } else if (f.find_tensor(p + "ffn_gate.weight")) {
      l.w_gate = matrix(f, p + "ffn_gate.weight", c.n_embd, c.n_ff);
      l.w_up = matrix(f, p + "ffn_up.weight", c.n_embd, c.n_ff);
    } else {  // fused (Phi-3): ffn_up holds the gate's rows, then the up projection's
      const WeightView gate_up = matrix(f, p + "ffn_up.weight", c.n_embd, 2 * (int64_t)c.n_ff);
      l.w_gate = row_slice(gate_up, 0, c.n_ff);
      l.w_up = row_slice(gate_up, c.n_ff, c.n_ff);
    }
    l.w_down = matrix(f, p + "ffn_down.weight", c.n_ff, c.n_embd);
  }
  return w;
}

std::vector<const WeightView*> Weights::matrices() const {
  std::vector<const WeightView*> out;
  for (const WeightView* m : {&output, &cls, &cls_out, &dense_2, &dense_3})  // (all optional)
    if (m->data != nullptr) out.push_back(m);
  for (const LayerWeights& l : layers) {
    out.insert(out.end(), {&l.wq, &l.wk, &l.wv, &l.wo});
    if (l.exp_gate.empty()) {
      for (const WeightView* m : {&l.w_gate, &l.w_up, &l.w_down})
        if (m->data != nullptr) out.push_back(m);  // (bert, phi2: no gate)
      continue;
    }
    out.push_back(&l.router);
    if (l.shared_gate.data != nullptr)
      out.insert(out.end(), {&l.shared_gate_inp, &l.shared_gate, &l.shared_up, &l.shared_down});
    for (size_t e = 0; e < l.exp_gate.size(); ++e)
      out.insert(out.end(), {&l.exp_gate[e], &l.exp_up[e], &l.exp_down[e]});
  }
  return out;
}

std::span<const WeightVectorField> weight_vector_fields() {
  using C = const ModelConfig&;
  using W = const Weights&;
  static const WeightVectorField kFields[] = {
      {&Weights::output_norm, [](C c, W) { return (int64_t)c.n_embd; }},
      {&Weights::output_norm_b, [](C c, W) { return (int64_t)c.n_embd; }},
      {&Weights::output_b, [](C c, W) { return (int64_t)c.n_vocab; }},
      {&Weights::embd_norm, [](C c, W) { return (int64_t)c.n_embd; }},
      {&Weights::embd_norm_b, [](C c, W) { return (int64_t)c.n_embd; }},
      {&Weights::cls_b, [](C c, W) { return (int64_t)c.n_embd; }},
      {&Weights::cls_out_b, [](C c, W) { return (int64_t)c.n_cls_out; }},
  };
  return kFields;
}

std::span<const LayerVectorField> layer_vector_fields() {
  using C = const ModelConfig&;
  using L = const LayerWeights&;
  const auto embd = [](C c, L) { return (int64_t)c.n_embd; };
  static const LayerVectorField kFields[] = {
      {&LayerWeights::attn_norm, embd},
      {&LayerWeights::attn_norm_b, embd},
      {&LayerWeights::bq, [](C c, L) { return (int64_t)c.q_dim(); }},
      {&LayerWeights::bk, [](C c, L) { return (int64_t)c.kv_dim(); }},
      {&LayerWeights::bv, [](C c, L) { return (int64_t)c.kv_dim(); }},
      // (OLMo 2 norms q and k over whole rows; the others per head.)
      {&LayerWeights::q_norm,
       [](C c, L) { return (int64_t)(c.qk_norm_rows ? c.q_dim() : c.head_dim); }},
      {&LayerWeights::k_norm,
       [](C c, L) { return (int64_t)(c.qk_norm_rows ? c.kv_dim() : c.head_dim); }},
      {&LayerWeights::post_attn_norm, embd},
      {&LayerWeights::ffn_norm, embd},
      {&LayerWeights::ffn_norm_b, embd},
      {&LayerWeights::post_ffn_norm, embd},
      {&LayerWeights::bo, embd},
      {&LayerWeights::b_up, [](C c, L) { return (int64_t)c.n_ff; }},
      {&LayerWeights::b_down, embd},
      {&LayerWeights::attn_out_norm, embd},
      {&LayerWeights::attn_out_norm_b, embd},
      {&LayerWeights::layer_out_norm, embd},
      {&LayerWeights::layer_out_norm_b, embd},
  };
  return kFields;
}

}  // namespace hablar::model
