// The decoder forward passes hablar runs, written once for every backend: the Llama family
// (llama and Mixtral, qwen2 and Qwen2-MoE, qwen3 and Qwen3-MoE, phi3, smollm3, granite, mistral3,
// gemma), the Gemma family (gemma2, gemma3, gemma-embedding), OLMo 2's post-norm block and
// phi2's parallel block.
//
// `B` is a backend's op set for one step (cpu::ForwardOps, cuda::ForwardOps): begin() has
// flattened the step's sequence chunks into T token rows, and every op works on activation
// rows [T x width] in the backend's memory. Every token of every chunk goes through the same
// products together, so a prompt reads each weight once per step. Attention is per token,
// over that token's own sequence in the paged cache after the step's K/V are stored: a token
// at position p sees positions [0, p]. Per-token values never mix across tokens, which gives
// batch invariance as far as the backend's kernels keep it.
//
// What the ops promise (each backend states its own tolerance against the CPU reference):
//   embed(table, x)                        x[t] = row tokens[t] of the table
//   rmsnorm(x, w, out, width)              per row: x / sqrt(mean(x^2) + eps) * w
//   matmul(W, in, out)                     out[T x W.rows] = in · Wᵀ
//   matmul_qkv(Wq, Wk, Wv, in, q, k, v)    three products of one input
//   matmul_glu(Wg, Wu, in, out, up, act)   out = act(in · Wgᵀ) * (in · Wuᵀ); up is scratch
//                                          (act: SiLU or GELU-tanh, core/layer_spec.h)
//   add_bias(x, b, width)                  x[t] += b
//   scale(x, s, width)                     x[t] *= s
//   scale_by_position(x, width, ps)        x[t] *= ps.factor(position of token t) (Mistral 3's
//                                          query temperature, core/layer_spec.h)
//   head_rmsnorm(x, w, n_heads)            rmsnorm over each head's head_dim values
//   rope(x, n_heads, variant)              rotate each head by its token's position, with the
//                                          angles of RoPE `variant` (ModelConfig::ropes)
//   attention(layer, spec, q, k, v, out)   store k, v at each token's position, then causal
//                                          attention of q over its sequence (GQA), scaled
//                                          and windowed as spec says
//   add(x, y, width)                       x += y
//   matmul_add(W, in, tmp, x, s)           optional: x += s · (in · Wᵀ) (s = 0: unscaled), tmp
//                                          scratch (residual_product below)
//   rmsnorm_for_products(x, w, out, width, Ws)  optional: rmsnorm whose out only the next op's
//                                          products of the matrices Ws read (norm_for_products)
//   attention_for_products(..., out, Ws)   optional: the same for attention's out
//   moe_ffn(experts, in, out)              out = the mixture of experts of in (layer_spec.h);
//                                          out may be in
//   logits(x, norm_w, W_out, cap)          final norm of the rows that need logits, then the
//                                          classifier (rows kept by the backend, in chunk
//                                          order); cap > 0: cap * tanh(logit / cap)
//   relu_squared(x, width)                 x = max(x, 0)^2 (Arcee's ungated MLP)
//   scale_logits(s)                        the logits of this step *= s (Granite); embedders,
//                                          whose rows are the normed hidden ones, ignore it
// and, for phi2's and starcoder2's blocks (LayerNormBackend; a backend without them refuses
// those models):
//   layernorm(x, w, b, out, width)         per row: (x - mean) / sqrt(var + eps) * w + b
//   gelu(x, width)                         x = GELU-tanh(x)
//   classify(x, W_out, bias)               logits() without the norm (x is normed already),
//                                          plus a bias per vocabulary entry (null: none)
#pragma once

#include <concepts>
#include <initializer_list>
#include <span>
#include <vector>

#include "core/error.h"
#include "core/step_batch.h"
#include "model/dump.h"
#include "model/model.h"
#include "model/weights.h"

namespace hablar::model {

inline ActivationDims activation_dims(const ModelConfig& c) {
  return {c.n_embd, c.n_heads, c.n_kv_heads, c.head_dim, c.n_ff, c.n_vocab};
}

// The op set above, as the compiler checks it: a backend's ForwardOps for one step.
template <class B>
concept ForwardBackend = requires(B& b, const WeightView& w, const float* in, float* out,
                                  std::vector<float>& host) {
  { b.activations() } -> std::convertible_to<const Activations&>;
  { b.n_tokens() } -> std::convertible_to<int64_t>;
  b.embed(w, out);
  b.rmsnorm(in, in, out, int64_t{});
  b.matmul(w, in, out);
  b.matmul_qkv(w, w, w, in, out, out, out);
  b.matmul_glu(w, w, in, out, out, GluActivation::kSilu);
  b.add_bias(out, in, int64_t{});
  b.scale(out, 1.0f, int64_t{});
  b.scale_by_position(out, int64_t{}, PositionScale{});
  b.head_rmsnorm(out, in, 0);
  b.rope(out, 0, 0);
  b.attention(0, AttentionSpec{}, in, in, in, out);
  b.add(out, in, int64_t{});
  b.moe_ffn(ExpertsView{}, in, out);
  b.logits(in, in, w, 0.0f);
  b.scale_logits(1.0f);
  b.relu_squared(out, int64_t{});
  { b.host_rows(in, int64_t{}, host) } -> std::convertible_to<const float*>;
};

// The ops phi2's block needs beyond those (cpu::ForwardOps and cpu::EmbedOps have them).
template <class B>
concept LayerNormBackend = ForwardBackend<B> &&
    requires(B& b, const WeightView& w, const float* in, float* out) {
  b.layernorm(in, in, in, out, int64_t{});
  b.gelu(out, int64_t{});
  b.classify(in, w, in);
};

// Intermediates for op-by-op comparison with a reference (HABLAR_DUMP_DIR; off: nullptr).
template <ForwardBackend B>
auto row_dumper(B& b, std::vector<float>& host) {
  return [&b, &host, dump = ActivationDump::instance()](const char* name, int layer,
                                                        const float* rows, int64_t width) {
    if (dump)
      dump->write(name, layer, b.host_rows(rows, b.n_tokens() * width, host), b.n_tokens(), width);
  };
}

// A residual branch's last product: x += s · (in · Wᵀ) (s == 0: unscaled, Granite's
// residual_scale otherwise), `tmp` [T x W.rows] scratch. A backend with matmul_add takes it as
// one op (a GEMM that accumulates into x); the others, and any run that dumps the product's
// rows (`dump_as`, null: none), as matmul, scale and add.
template <class B, class Dump>
void residual_product(B& b, const WeightView& w, const float* in, float* tmp, float* x, float s,
                      const Dump& dump_rows, const char* dump_as, int layer) {
  if constexpr (requires { b.matmul_add(w, in, tmp, x, s); }) {
    if (ActivationDump::instance() == nullptr) return b.matmul_add(w, in, tmp, x, s);
  }
  b.matmul(w, in, tmp);
  if (dump_as != nullptr) dump_rows(dump_as, layer, tmp, w.rows);
  if (s != 0.0f) b.scale(tmp, s, w.rows);
  b.add(x, tmp, w.rows);
}

// rmsnorm(x, w, out) whose rows only the next op's products of `readers` read (matmul_qkv,
// matmul_glu, matmul): a backend with rmsnorm_for_products may keep them only in the form those
// products read (bf16 rows for kept bf16 copies), without out's f32 values. A run that dumps
// activations reads those, so it gets the plain norm.
template <class B>
void norm_for_products(B& b, const float* x, const float* w, float* out, int64_t width,
                       std::initializer_list<const WeightView*> readers) {
  const std::span<const WeightView* const> matrices(readers.begin(), readers.size());
  if constexpr (requires { b.rmsnorm_for_products(x, w, out, width, matrices); }) {
    if (ActivationDump::instance() == nullptr)
      return b.rmsnorm_for_products(x, w, out, width, matrices);
  }
  b.rmsnorm(x, w, out, width);
}

// attention(...) whose rows only the next op's products of `readers` read (the output
// projection), as norm_for_products.
template <class B>
void attention_for_products(B& b, int layer, const AttentionSpec& spec, const float* q,
                            const float* k, const float* v, float* out,
                            std::initializer_list<const WeightView*> readers) {
  const std::span<const WeightView* const> matrices(readers.begin(), readers.size());
  if constexpr (requires { b.attention_for_products(layer, spec, q, k, v, out, matrices); }) {
    if (ActivationDump::instance() == nullptr)
      return b.attention_for_products(layer, spec, q, k, v, out, matrices);
  }
  b.attention(layer, spec, q, k, v, out);
}

// Llama (and Mixtral), Qwen2, Qwen3 (and Qwen3-MoE), Phi-3, SmolLM3, Granite, Mistral 3, Gemma 1:
// pre-norm blocks, SwiGLU (Gemma: GeGLU) or a mixture of SwiGLU experts, one RoPE, global
// attention; Gemma 1 scales the embedding by sqrt(n_embd); Granite scales the embedding, each
// block's output and the logits by its multipliers; Mistral 3 tempers q by its position.
template <ForwardBackend B>
void forward_llama_family(const ModelConfig& c, const Weights& w, B& b) {
  const Activations& a = b.activations();
  const int E = c.n_embd, QD = c.q_dim(), KVD = c.kv_dim(), FF = c.n_ff;
  std::vector<float> host;
  const auto dump_rows = row_dumper(b, host);

  b.embed(w.token_embd, a.x);
  if (c.embed_scale != 1.0f) b.scale(a.x, c.embed_scale, E);  // Gemma 1
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[(size_t)l];
    const LayerSpec& spec = c.layers[(size_t)l];

    // Attention block: x += Wo · attention(rope(Wq·n), rope(Wk·n), Wv·n), n = rmsnorm(x).
    norm_for_products(b, a.x, lw.attn_norm, a.xb, E, {&lw.wq, &lw.wk, &lw.wv});
    dump_rows("attn_norm", l, a.xb, E);
    b.matmul_qkv(lw.wq, lw.wk, lw.wv, a.xb, a.q, a.k, a.v);
    // q, k, v biases where the file has them (qwen2 always; any llama-style file may)
    if (lw.bq != nullptr) b.add_bias(a.q, lw.bq, QD);
    if (lw.bk != nullptr) b.add_bias(a.k, lw.bk, KVD);
    if (lw.bv != nullptr) b.add_bias(a.v, lw.bv, KVD);
    const auto qk_norm = [&] {  // qwen3 (before RoPE), hunyuan-dense (after): per head
      b.head_rmsnorm(a.q, lw.q_norm, c.n_heads);
      b.head_rmsnorm(a.k, lw.k_norm, c.n_kv_heads);
    };
    if (c.qk_norm_rows) {  // OLMoE: over whole rows, before RoPE
      b.rmsnorm(a.q, lw.q_norm, a.q, QD);
      b.rmsnorm(a.k, lw.k_norm, a.k, KVD);
    }
    if (c.qk_norm && !c.qk_norm_after_rope) qk_norm();
    if (spec.rope != LayerSpec::kNoRope) {  // (SmolLM3: every fourth layer keeps q, k as they are)
      b.rope(a.q, c.n_heads, spec.rope);
      b.rope(a.k, c.n_kv_heads, spec.rope);
    }
    if (c.qk_norm_after_rope) qk_norm();
    if (c.query_temperature.active()) b.scale_by_position(a.q, QD, c.query_temperature);
    dump_rows("q_rope", l, a.q, QD), dump_rows("k_rope", l, a.k, KVD), dump_rows("v", l, a.v, KVD);
    if (c.query_scale > 0.0f) b.scale(a.q, c.query_scale, QD);  // Phi-3, Gemma 1
    attention_for_products(b, l, spec.attention, a.q, a.k, a.v, a.att, {&lw.wo});
    dump_rows("attn_out", l, a.att, QD);
    residual_product(b, lw.wo, a.att, a.xb, a.x, c.residual_scale, dump_rows, nullptr, l);
    dump_rows("ffn_inp", l, a.x, E);

    // Feed-forward block: x += W_down · (silu(W_gate·n) * W_up·n), n = rmsnorm(x), or the
    // mixture of such experts the router picks for each token.
    if (c.n_experts > 0)  // the router reads the normed rows as they are
      b.rmsnorm(a.x, lw.ffn_norm, a.xb, E);
    else  // (Arcee's FFN has no gate: W_up alone reads them)
      norm_for_products(b, a.x, lw.ffn_norm, a.xb, E,
                        {c.ffn_relu_squared ? &lw.w_up : &lw.w_gate, &lw.w_up});
    dump_rows("ffn_norm", l, a.xb, E);
    const float* down_in = nullptr;  // a dense FFN's input to W_down
    if (c.n_experts > 0) {
      const bool shared = c.n_ff_shared > 0;  // Qwen2-MoE
      b.moe_ffn(ExpertsView{&lw.router, lw.exp_gate, lw.exp_up, lw.exp_down, c.n_experts_used,
                            c.experts_normalized, shared ? &lw.shared_gate_inp : nullptr,
                            shared ? &lw.shared_gate : nullptr, shared ? &lw.shared_up : nullptr,
                            shared ? &lw.shared_down : nullptr},
                a.xb, a.xb);
    } else if (c.ffn_relu_squared) {  // Arcee: W_down · relu(W_up·n)^2, no gate
      b.matmul(lw.w_up, a.xb, a.gate);
      b.relu_squared(a.gate, FF);
      down_in = a.gate;
    } else {
      b.matmul_glu(lw.w_gate, lw.w_up, a.xb, a.gate, a.up, c.ffn_activation);
      dump_rows("ffn_swiglu", l, a.gate, FF);
      down_in = a.gate;
    }
    if (down_in != nullptr) {
      residual_product(b, lw.w_down, down_in, a.xb, a.x, c.residual_scale, dump_rows, "ffn_out", l);
    } else {
      dump_rows("ffn_out", l, a.xb, E);
      if (c.residual_scale != 0.0f) b.scale(a.xb, c.residual_scale, E);  // Granite
      b.add(a.x, a.xb, E);
    }
    dump_rows("l_out", l, a.x, E);
  }
  b.logits(a.x, w.output_norm, w.output, 0.0f);
  if (c.logits_factor != 1.0f) b.scale_logits(c.logits_factor);  // Granite, MiniCPM
}

// Gemma 2 and 3, GLM-4: "sandwich" norms (RMSNorm before and after attention and FFN, the
// residual taking the normed output). Gemma: the embedding scaled by sqrt(n_embd); per-head
// q/k norms; q scaled before attention; sliding-window and global layers with their own RoPE;
// GeGLU; Gemma 2's soft-capped attention scores (in the layer's AttentionSpec) and logits.
// (The file's norm weights already hold Gemma's 1 + w, so rmsnorm multiplies by them.)
// GLM-4: q, k, v with biases (where the file has them), SwiGLU, partial RoPE.
template <ForwardBackend B>
void forward_sandwich(const ModelConfig& c, const Weights& w, B& b) {
  const Activations& a = b.activations();
  const int E = c.n_embd, QD = c.q_dim(), KVD = c.kv_dim(), FF = c.n_ff;
  std::vector<float> host;
  const auto dump_rows = row_dumper(b, host);

  b.embed(w.token_embd, a.x);
  if (c.embed_scale != 1.0f) b.scale(a.x, c.embed_scale, E);  // Gemma
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[(size_t)l];
    const LayerSpec& spec = c.layers[(size_t)l];

    // x += postnorm(Wo · attention(rope(qnorm(Wq·n)) * s, rope(knorm(Wk·n)), Wv·n)).
    norm_for_products(b, a.x, lw.attn_norm, a.xb, E, {&lw.wq, &lw.wk, &lw.wv});
    dump_rows("attn_norm", l, a.xb, E);
    b.matmul_qkv(lw.wq, lw.wk, lw.wv, a.xb, a.q, a.k, a.v);
    if (lw.bq != nullptr) b.add_bias(a.q, lw.bq, QD);  // (GLM-4; any of them a file has)
    if (lw.bk != nullptr) b.add_bias(a.k, lw.bk, KVD);
    if (lw.bv != nullptr) b.add_bias(a.v, lw.bv, KVD);
    if (c.qk_norm) b.head_rmsnorm(a.q, lw.q_norm, c.n_heads);  // Gemma 3
    b.rope(a.q, c.n_heads, spec.rope);
    if (c.qk_norm) b.head_rmsnorm(a.k, lw.k_norm, c.n_kv_heads);
    b.rope(a.k, c.n_kv_heads, spec.rope);
    if (c.query_scale > 0.0f) b.scale(a.q, c.query_scale, QD);
    dump_rows("q_rope", l, a.q, QD), dump_rows("k_rope", l, a.k, KVD), dump_rows("v", l, a.v, KVD);
    attention_for_products(b, l, spec.attention, a.q, a.k, a.v, a.att, {&lw.wo});
    dump_rows("attn_out", l, a.att, QD);
    b.matmul(lw.wo, a.att, a.xb);
    b.rmsnorm(a.xb, lw.post_attn_norm, a.xb, E);
    b.add(a.x, a.xb, E);
    dump_rows("ffn_inp", l, a.x, E);

    // x += postnorm(W_down · (act(W_gate·n) * W_up·n)), n = rmsnorm(x).
    norm_for_products(b, a.x, lw.ffn_norm, a.xb, E, {&lw.w_gate, &lw.w_up});
    dump_rows("ffn_norm", l, a.xb, E);
    b.matmul_glu(lw.w_gate, lw.w_up, a.xb, a.gate, a.up, c.ffn_activation);
    dump_rows("ffn_swiglu", l, a.gate, FF);
    b.matmul(lw.w_down, a.gate, a.xb);
    b.rmsnorm(a.xb, lw.post_ffn_norm, a.xb, E);
    dump_rows("ffn_out", l, a.xb, E);
    b.add(a.x, a.xb, E);
    dump_rows("l_out", l, a.x, E);
  }
  b.logits(a.x, w.output_norm, w.output, c.final_softcap);
}

// The attention of phi2's and starcoder2's blocks: att = attention(rope(Wq·n + bq),
// rope(Wk·n + bk), Wv·n + bv), n = layernorm(x) (left in xb), q scaled first when the model
// says so (phi2).
template <LayerNormBackend B, typename Dump>
void layernorm_attention(const ModelConfig& c, const LayerWeights& lw, int l, B& b,
                         const Dump& dump_rows) {
  const Activations& a = b.activations();
  const int E = c.n_embd, KVD = c.kv_dim();
  const LayerSpec& spec = c.layers[(size_t)l];
  b.layernorm(a.x, lw.attn_norm, lw.attn_norm_b, a.xb, E);
  dump_rows("attn_norm", l, a.xb, E);
  b.matmul_qkv(lw.wq, lw.wk, lw.wv, a.xb, a.q, a.k, a.v);
  if (lw.bq != nullptr) b.add_bias(a.q, lw.bq, E);  // (Orion, Nemotron: as the file has them)
  if (lw.bk != nullptr) b.add_bias(a.k, lw.bk, KVD);
  if (lw.bv != nullptr) b.add_bias(a.v, lw.bv, KVD);
  b.rope(a.q, c.n_heads, spec.rope);
  b.rope(a.k, c.n_kv_heads, spec.rope);
  dump_rows("q_rope", l, a.q, E), dump_rows("k_rope", l, a.k, KVD), dump_rows("v", l, a.v, KVD);
  if (c.query_scale > 0.0f) b.scale(a.q, c.query_scale, E);
  b.attention(l, spec.attention, a.q, a.k, a.v, a.att);
}

// phi2 (Phi-1, 1.5, 2): one LayerNorm per block feeds attention and the MLP side by side,
// x += (Wo·attention(...) + bo) + (W_down·gelu(W_up·n + b_up) + b_down), n = layernorm(x);
// q, k, v with biases, NeoX RoPE over the first rope.n_dims values of each head, q scaled
// before attention; a final LayerNorm and a classifier with a bias. Heads span the
// embedding (q_dim == n_embd, checked at load), so q and att hold the two branches' outputs.
template <LayerNormBackend B>
void forward_phi2(const ModelConfig& c, const Weights& w, B& b) {
  const Activations& a = b.activations();
  const int E = c.n_embd, FF = c.n_ff;
  std::vector<float> host;
  const auto dump_rows = row_dumper(b, host);

  b.embed(w.token_embd, a.x);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[(size_t)l];

    layernorm_attention(c, lw, l, b, dump_rows);
    dump_rows("attn_out", l, a.att, E);
    b.matmul(lw.wo, a.att, a.q);  // the attention branch [T x E], in q's rows
    b.add_bias(a.q, lw.bo, E);

    b.matmul(lw.w_up, a.xb, a.gate);  // the MLP branch [T x E], in att's rows
    b.add_bias(a.gate, lw.b_up, FF);
    b.gelu(a.gate, FF);
    b.matmul(lw.w_down, a.gate, a.att);
    b.add_bias(a.att, lw.b_down, E);
    dump_rows("ffn_out", l, a.att, E);
    b.add(a.q, a.att, E);  // (attention + MLP), then + x, as llama.cpp adds them
    b.add(a.x, a.q, E);
    dump_rows("l_out", l, a.x, E);
  }
  b.layernorm(a.x, w.output_norm, w.output_norm_b, a.xb, E);
  b.classify(a.xb, w.output, w.output_b);
}

// OLMo 2 and 3, EXAONE 4: no norm before attention or the FFN; q and k RMS-normed before RoPE
// (EXAONE: per head; OLMo: over whole rows, all heads together); the attention and FFN
// outputs normed before each joins the residual. Sliding windows and unrotated layers in the
// LayerSpecs.
template <ForwardBackend B>
void forward_post_norm(const ModelConfig& c, const Weights& w, B& b) {
  const Activations& a = b.activations();
  const int E = c.n_embd, QD = c.q_dim(), KVD = c.kv_dim();
  std::vector<float> host;
  const auto dump_rows = row_dumper(b, host);

  b.embed(w.token_embd, a.x);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[(size_t)l];
    const LayerSpec& spec = c.layers[(size_t)l];

    // x += post_norm(Wo · attention(rope(norm(Wq·x)), rope(norm(Wk·x)), Wv·x))
    b.matmul_qkv(lw.wq, lw.wk, lw.wv, a.x, a.q, a.k, a.v);
    if (c.qk_norm) {  // EXAONE 4
      b.head_rmsnorm(a.q, lw.q_norm, c.n_heads);
      b.head_rmsnorm(a.k, lw.k_norm, c.n_kv_heads);
    } else {  // OLMo
      b.rmsnorm(a.q, lw.q_norm, a.q, QD);
      b.rmsnorm(a.k, lw.k_norm, a.k, KVD);
    }
    if (spec.rope != LayerSpec::kNoRope) {
      b.rope(a.q, c.n_heads, spec.rope);
      b.rope(a.k, c.n_kv_heads, spec.rope);
    }
    dump_rows("q_rope", l, a.q, QD), dump_rows("k_rope", l, a.k, KVD), dump_rows("v", l, a.v, KVD);
    attention_for_products(b, l, spec.attention, a.q, a.k, a.v, a.att, {&lw.wo});
    dump_rows("attn_out", l, a.att, QD);
    b.matmul(lw.wo, a.att, a.xb);
    b.rmsnorm(a.xb, lw.post_attn_norm, a.xb, E);
    b.add(a.x, a.xb, E);
    dump_rows("ffn_inp", l, a.x, E);

    // x += post_norm(W_down · (silu(W_gate·x) * W_up·x))
    b.matmul_glu(lw.w_gate, lw.w_up, a.x, a.gate, a.up, c.ffn_activation);
    b.matmul(lw.w_down, a.gate, a.xb);
    b.rmsnorm(a.xb, lw.post_ffn_norm, a.xb, E);
    dump_rows("ffn_out", l, a.xb, E);
    b.add(a.x, a.xb, E);
    dump_rows("l_out", l, a.x, E);
  }
  b.logits(a.x, w.output_norm, w.output, 0.0f);
}

// StarCoder2: the pre-norm block of LayerNorms with biases; q, k, v, the output projection
// and the MLP's two products all biased; the MLP GELU(W_up·n + b) ungated; NeoX RoPE. Orion
// and Nemotron run it too: biases only where their files have them, Orion's MLP SwiGLU,
// Nemotron's relu^2(W_up·n + b).
template <LayerNormBackend B>
void forward_starcoder2(const ModelConfig& c, const Weights& w, B& b) {
  const Activations& a = b.activations();
  const int E = c.n_embd, FF = c.n_ff;
  std::vector<float> host;
  const auto dump_rows = row_dumper(b, host);

  b.embed(w.token_embd, a.x);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[(size_t)l];

    layernorm_attention(c, lw, l, b, dump_rows);
    dump_rows("attn_out", l, a.att, E);
    b.matmul(lw.wo, a.att, a.xb);
    if (lw.bo != nullptr) b.add_bias(a.xb, lw.bo, E);
    b.add(a.x, a.xb, E);
    dump_rows("ffn_inp", l, a.x, E);

    b.layernorm(a.x, lw.ffn_norm, lw.ffn_norm_b, a.xb, E);
    if (lw.w_gate.data != nullptr) {  // Orion, StableLM
      b.matmul_glu(lw.w_gate, lw.w_up, a.xb, a.gate, a.up, GluActivation::kSilu);
    } else {
      b.matmul(lw.w_up, a.xb, a.gate);
      if (lw.b_up != nullptr) b.add_bias(a.gate, lw.b_up, FF);
      if (c.ffn_relu_squared) {  // Nemotron
        b.relu_squared(a.gate, FF);
      } else {
        b.gelu(a.gate, FF);
      }
    }
    b.matmul(lw.w_down, a.gate, a.xb);
    if (lw.b_down != nullptr) b.add_bias(a.xb, lw.b_down, E);
    dump_rows("ffn_out", l, a.xb, E);
    b.add(a.x, a.xb, E);
    dump_rows("l_out", l, a.x, E);
  }
  b.layernorm(a.x, w.output_norm, w.output_norm_b, a.xb, E);
  b.classify(a.xb, w.output, nullptr);
}

// Command R (command-r, cohere2): one LayerNorm without a bias per block feeds attention and
// a SwiGLU MLP side by side, x += W_down·(silu(W_gate·n) * W_up·n) + Wo·attention(...),
// n = layernorm(x); q, k, v biased if the file says so; cohere2's sliding layers rotated, its
// global ones not (LayerSpecs); a final LayerNorm, the classifier token_embd, the logits
// scaled. Heads span the embedding (checked at load), so q and att hold the two branches.
template <LayerNormBackend B>
void forward_cohere(const ModelConfig& c, const Weights& w, B& b) {
  const Activations& a = b.activations();
  const int E = c.n_embd, KVD = c.kv_dim(), FF = c.n_ff;
  std::vector<float> host;
  const auto dump_rows = row_dumper(b, host);

  b.embed(w.token_embd, a.x);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[(size_t)l];
    const LayerSpec& spec = c.layers[(size_t)l];

    b.layernorm(a.x, lw.attn_norm, nullptr, a.xb, E);
    dump_rows("attn_norm", l, a.xb, E);
    b.matmul_qkv(lw.wq, lw.wk, lw.wv, a.xb, a.q, a.k, a.v);
    if (lw.bq != nullptr) b.add_bias(a.q, lw.bq, E);
    if (lw.bk != nullptr) b.add_bias(a.k, lw.bk, KVD);
    if (lw.bv != nullptr) b.add_bias(a.v, lw.bv, KVD);
    if (spec.rope != LayerSpec::kNoRope) {
      b.rope(a.q, c.n_heads, spec.rope);
      b.rope(a.k, c.n_kv_heads, spec.rope);
    }
    dump_rows("q_rope", l, a.q, E), dump_rows("k_rope", l, a.k, KVD), dump_rows("v", l, a.v, KVD);
    b.attention(l, spec.attention, a.q, a.k, a.v, a.att);
    dump_rows("attn_out", l, a.att, E);
    b.matmul(lw.wo, a.att, a.q);  // the attention branch [T x E], in q's rows

    b.matmul_glu(lw.w_gate, lw.w_up, a.xb, a.gate, a.up, GluActivation::kSilu);
    dump_rows("ffn_swiglu", l, a.gate, FF);
    b.matmul(lw.w_down, a.gate, a.att);  // the MLP branch [T x E], in att's rows
    dump_rows("ffn_out", l, a.att, E);
    b.add(a.x, a.att, E);  // (x + MLP) + attention, as llama.cpp adds them
    b.add(a.x, a.q, E);
    dump_rows("l_out", l, a.x, E);
  }
  b.layernorm(a.x, w.output_norm, nullptr, a.xb, E);
  b.classify(a.xb, w.output, nullptr);
  if (c.logits_factor != 1.0f) b.scale_logits(c.logits_factor);
}

template <ForwardBackend B>
void forward(const ModelConfig& c, const Weights& w, B& b) {
  if (uses_layer_norm(c.arch_kind)) {
    if constexpr (LayerNormBackend<B>) {
      if (c.arch_kind == Arch::kPhi2) {
        forward_phi2(c, w, b);
      } else if (is_cohere_family(c.arch_kind)) {
        forward_cohere(c, w, b);
      } else {
        forward_starcoder2(c, w, b);
      }
    } else {
      throw_error(ErrorKind::kUnsupported, "this backend has no LayerNorm block for " + c.arch +
                                               " models (run them on the CPU)");
    }
  } else if (has_sandwich_norms(c.arch_kind)) {
    forward_sandwich(c, w, b);
  } else if (is_post_norm_family(c.arch_kind)) {
    forward_post_norm(c, w, b);
  } else {
    forward_llama_family(c, w, b);
  }
}

}  // namespace hablar::model
