// The encoder family's forward (BERT, nomic-bert), written once over a backend's embedding
// ops, and the embedding forward of every model (encoders here, decoders through their own
// forward in model/forward.h with the final-normed hidden rows kept instead of logits).
//
// BERT: x = LayerNorm(tok[t] + type[0] + pos[p]); per layer (post-norm):
//   a = softmax(q·kᵀ / sqrt(hd)) v over the whole input (bidirectional), q/k/v with biases;
//   x = LayerNorm(x + Wo·a + bo); x = LayerNorm(x + W_down·GELU(W_up·x + b_up) + b_down).
// nomic-bert: no absolute positions; fused qkv rotated by NeoX RoPE; SwiGLU FFN without
// biases. The result is the last x: one hidden row per token, pooled by the backend.
//
// The encoder ops beyond model::ForwardBackend (cpu::EmbedOps has them):
//   add_table_row(table, row, x)        x[t] += table[row]
//   add_position_rows(table, x)         x[t] += table[position of t]
//   layernorm(x, w, b, out, width)      (x - mean) / sqrt(var + eps) * w + b
//   gelu(x, width)                      x = GELU(x)
//   set_hidden(x)                       the rows the pooling reads
#pragma once

#include <cmath>

#include "model/forward.h"

namespace hablar::model {

template <class B>
concept EncoderBackend = ForwardBackend<B> && requires(B& b, const WeightView& w, float* x) {
  b.add_table_row(w, int64_t{}, x);
  b.add_position_rows(w, x);
  b.layernorm(x, x, x, x, int64_t{});
  b.gelu(x, int64_t{});
  b.set_hidden(x);
};

template <EncoderBackend B>
void forward_encoder(const ModelConfig& c, const Weights& w, B& b) {
  const Activations& a = b.activations();
  const int E = c.n_embd, FF = c.n_ff;
  std::vector<float> host;
  const auto dump_rows = row_dumper(b, host);

  b.embed(w.token_embd, a.x);
  if (w.token_types.data != nullptr) b.add_table_row(w.token_types, 0, a.x);
  if (w.pos_embd.data != nullptr) b.add_position_rows(w.pos_embd, a.x);
  b.layernorm(a.x, w.embd_norm, w.embd_norm_b, a.x, E);
  dump_rows("inp_norm", 0, a.x, E);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[(size_t)l];
    const LayerSpec& spec = c.layers[(size_t)l];
    b.matmul_qkv(lw.wq, lw.wk, lw.wv, a.x, a.q, a.k, a.v);
    if (lw.bq) b.add_bias(a.q, lw.bq, E);
    if (lw.bk) b.add_bias(a.k, lw.bk, E);
    if (lw.bv) b.add_bias(a.v, lw.bv, E);
    if (c.arch_kind == Arch::kNomicBert) {
      b.rope(a.q, c.n_heads, spec.rope);
      b.rope(a.k, c.n_kv_heads, spec.rope);
    }
    b.attention(l, spec.attention, a.q, a.k, a.v, a.att);
    dump_rows("attn_out", l, a.att, E);
    b.matmul(lw.wo, a.att, a.xb);
    if (lw.bo) b.add_bias(a.xb, lw.bo, E);
    b.add(a.xb, a.x, E);  // llama.cpp: attention output + layer input
    b.layernorm(a.xb, lw.attn_out_norm, lw.attn_out_norm_b, a.x, E);
    dump_rows("ffn_inp", l, a.x, E);

    if (c.arch_kind == Arch::kNomicBert) {
      b.matmul_glu(lw.w_gate, lw.w_up, a.x, a.gate, a.up, GluActivation::kSilu);
    } else {
      b.matmul(lw.w_up, a.x, a.gate);
      if (lw.b_up) b.add_bias(a.gate, lw.b_up, FF);
      b.gelu(a.gate, FF);
    }
    b.matmul(lw.w_down, a.gate, a.xb);
    if (lw.b_down) b.add_bias(a.xb, lw.b_down, E);
    b.add(a.xb, a.x, E);
    b.layernorm(a.xb, lw.layer_out_norm, lw.layer_out_norm_b, a.x, E);
    dump_rows("l_out", l, a.x, E);
  }
  b.set_hidden(a.x);
}

// The hidden rows of an embedding step, for any model: the encoder forward, or a decoder
// family's forward whose logits() op keeps the final-normed rows.
template <EncoderBackend B>
void forward_embeddings(const ModelConfig& c, const Weights& w, B& b) {
  if (c.encoder) {
    forward_encoder(c, w, b);
  } else {
    forward(c, w, b);
  }
}

}  // namespace hablar::model
