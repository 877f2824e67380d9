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
//   linear(w, bias, in, out, gelu)      out = W·in (+ bias) (then GELU): one fused pass
//   linear_qkv(wq, bq, wk, bk, wv, bv, in, q, k, v)   the three biased projections at once
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
  b.linear(w, x, x, x, bool{});
  b.linear_qkv(w, x, w, x, w, x, x, x, x, x);
};

template <EncoderBackend B>
void forward_encoder(const ModelConfig& c, const Weights& w, B& b) {
  const Activations& a = b.activations();
  const int E = c.n_embd;
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
    b.linear_qkv(lw.wq, lw.bq, lw.wk, lw.bk, lw.wv, lw.bv, a.x, a.q, a.k, a.v);
    if (c.arch_kind == Arch::kNomicBert) {
      b.rope(a.q, c.n_heads, spec.rope);
      b.rope(a.k, c.n_kv_heads, spec.rope);
    }
    b.attention(l, spec.attention, a.q, a.k, a.v, a.att);
    dump_rows("attn_out", l, a.att, E);
    b.linear(lw.wo, lw.bo, a.att, a.xb, false);
    b.add(a.xb, a.x, E);  // llama.cpp: attention output + layer input
    b.layernorm(a.xb, lw.attn_out_norm, lw.attn_out_norm_b, a.x, E);
    dump_rows("ffn_inp", l, a.x, E);

    if (c.arch_kind == Arch::kNomicBert) {
      b.matmul_glu(lw.w_gate, lw.w_up, a.x, a.gate, a.up, GluActivation::kSilu);
    } else {
      b.linear(lw.w_up, lw.b_up, a.x, a.gate, true);
    }
    b.linear(lw.w_down, lw.b_down, a.gate, a.xb, false);
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
