// The forward pass of the Llama family, for a batch of sequence chunks at once.
//
// Every token of every chunk goes through the same matmuls together (n_tokens = T rows of
// activations), so prompt processing reads each weight once per step. Attention is per token,
// over that token's own sequence in the paged cache, after the chunk's K/V are stored: a
// prefill token at position p sees positions [0, p] (causal). Per-token values never mix
// across tokens, which gives batch invariance as long as the kernels keep it.
#include <algorithm>
#include <cstring>

#include "backend/cpu/matmul_fused.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/dump.h"
#include "model/model.h"
#include "model/scratch.h"
#include "model/weights.h"

namespace hablar::model {
namespace {

// Runs fn(t) for t in [0, n) spread over the pool.
template <typename Fn>
void for_each_token(ThreadPool& pool, int64_t n, const Fn& fn) {
  if (n == 1) return fn(0);
  pool.run([&](int thread, int n_threads) {
    const IndexRange r = split_range(n, thread, n_threads);
    for (int64_t t = r.begin; t < r.end; ++t) fn(t);
  });
}

void grow(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// llama.cpp's default micro-batch: a prompt longer than this is evaluated in pieces.
constexpr int32_t kLlamaUbatch = 512;

// Token i's place in llama.cpp's batch (cpu::TokenRoles, for the K formats' summation
// orders). A sampled token is a batch of its own. A prompt token stands in its prompt's
// batch, known from where the prompt ends (generated_from) whatever the chunking; without it,
// the chunk is taken for the batch.
uint8_t token_role(const SequenceChunk& ch, size_t i, bool sampled) {
  if (sampled) return cpu::llama_batch_role(0, 1);
  if (ch.generated_from < 0) return cpu::llama_batch_role((int64_t)i, (int64_t)ch.tokens.size());
  const int32_t pos = ch.start_pos + (int32_t)i;
  const int32_t begin = pos / kLlamaUbatch * kLlamaUbatch;
  return cpu::llama_batch_role(pos - begin, std::min(kLlamaUbatch, ch.generated_from - begin));
}

}  // namespace

void Model::forward(std::span<const SequenceChunk> chunks, KvCache& cache,
                    std::vector<float>& logits) {
  check_chunks(chunks, cache);
  const ModelConfig& c = config_;
  const Weights& w = *weights_;
  Scratch& s = *scratch_;
  ThreadPool& pool = *pool_;
  const KvCacheLayout& layout = cache.layout();
  const int E = c.n_embd, QD = c.q_dim(), KVD = c.kv_dim(), FF = c.n_ff, HD = c.head_dim;

  // Flatten the chunks: token t has an id, a position and its sequence's block table.
  // Attention sums as llama.cpp does for a chunk of one token (decode) or of several
  // (cpu::SumOrder). When the caller says which positions hold sampled tokens
  // (generated_from), those take the one-token order and prompt tokens the other, however
  // the sequence is chunked: a sequence recomputed after preemption, or a prompt split so
  // that one token is left, gets the same values again. The order never depends on the
  // other sequences of the batch.
  s.tokens.clear(), s.positions.clear(), s.block_tables.clear(), s.logit_rows.clear();
  s.sum_orders.clear(), s.roles.clear(), s.logit_roles.clear();
  for (const SequenceChunk& ch : chunks) {
    for (size_t i = 0; i < ch.tokens.size(); ++i) {
      const bool sampled = ch.generated_from >= 0 ? ch.start_pos + (int32_t)i >= ch.generated_from
                                                  : ch.tokens.size() == 1;
      s.sum_orders.push_back(sampled ? cpu::SumOrder::kLanes64 : cpu::SumOrder::kLanes16);
      s.roles.push_back(token_role(ch, i, sampled));
      // llama.cpp's output matmul takes only the rows whose logits are wanted: all of the
      // batch's, or the last one alone.
      if (ch.all_logits || i + 1 == ch.tokens.size()) {
        s.logit_rows.push_back((int32_t)s.tokens.size());
        s.logit_roles.push_back(ch.all_logits ? s.roles.back() : cpu::llama_batch_role(0, 1));
      }
      s.tokens.push_back(ch.tokens[i]);
      s.positions.push_back(ch.start_pos + (int32_t)i);
      s.block_tables.push_back(ch.block_table.data());
    }
  }
  const int64_t T = (int64_t)s.tokens.size();
  grow(s.x, T * E), grow(s.xb, T * E), grow(s.q, T * QD), grow(s.k, T * KVD);
  grow(s.v, T * KVD), grow(s.att, T * QD), grow(s.gate, T * FF), grow(s.up, T * FF);
  float *x = s.x.data(), *xb = s.xb.data(), *q = s.q.data(), *k = s.k.data(), *v = s.v.data();
  float *att = s.att.data(), *gate = s.gate.data(), *up = s.up.data();
  s.queries.resize((size_t)T);
  for (int64_t t = 0; t < T; ++t)
    s.queries[(size_t)t] = {s.block_tables[(size_t)t], s.positions[(size_t)t], q + t * QD,
                            att + t * QD, s.sum_orders[(size_t)t]};
  // RoPE angles of each token's position, computed once for every layer, q and k.
  const int RP = c.rope.n_dims / 2;
  grow(s.rope_cos, T * RP), grow(s.rope_sin, T * RP);
  float *rope_cos = s.rope_cos.data(), *rope_sin = s.rope_sin.data();
  for_each_token(pool, T, [&](int64_t t) {
    cpu::rope_angles(s.positions[(size_t)t], c.rope, rope_cos + t * RP, rope_sin + t * RP);
  });

  // Intermediates for op-by-op comparison with a reference (HABLAR_DUMP_DIR; off: nullptr).
  ActivationDump* const dump = ActivationDump::instance();
  const auto dump_rows = [&](const char* name, int layer, const float* rows, int64_t width) {
    if (dump) dump->write(name, layer, rows, T, width);
  };

  // Token embeddings.
  for_each_token(pool, T, [&](int64_t t) {
    cpu::embedding_row(w.token_embd, s.tokens[(size_t)t], x + t * E);
  });

  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[(size_t)l];

    // Attention block: x += Wo · attention(rope(Wq·n), rope(Wk·n), Wv·n), n = rmsnorm(x).
    for_each_token(pool, T, [&](int64_t t) {
      cpu::rmsnorm(x + t * E, lw.attn_norm.data(), xb + t * E, E, c.rms_eps);
    });
    dump_rows("attn_norm", l, xb, E);
    const cpu::MatmulTarget qkv[] = {{&lw.wq, q}, {&lw.wk, k}, {&lw.wv, v}};
    cpu::matmul_many(qkv, xb, T, pool, s.roles);  // one quantization of xb, one parallel region
    for_each_token(pool, T, [&](int64_t t) {
      float *qt = q + t * QD, *kt = k + t * KVD, *vt = v + t * KVD;
      if (c.qkv_bias) {  // qwen2
        cpu::add_inplace(qt, lw.bq.data(), QD);
        cpu::add_inplace(kt, lw.bk.data(), KVD);
        cpu::add_inplace(vt, lw.bv.data(), KVD);
      }
      if (c.qk_norm) {  // qwen3: RMSNorm over each head's vector
        for (int h = 0; h < c.n_heads; ++h)
          cpu::rmsnorm(qt + h * HD, lw.q_norm.data(), qt + h * HD, HD, c.rms_eps);
        for (int h = 0; h < c.n_kv_heads; ++h)
          cpu::rmsnorm(kt + h * HD, lw.k_norm.data(), kt + h * HD, HD, c.rms_eps);
      }
      const int pos = s.positions[(size_t)t];
      cpu::rope_apply(qt, c.n_heads, HD, c.rope, rope_cos + t * RP, rope_sin + t * RP);
      cpu::rope_apply(kt, c.n_kv_heads, HD, c.rope, rope_cos + t * RP, rope_sin + t * RP);
      cpu::kv_store(cache.data(), layout, l, s.block_tables[(size_t)t], pos, kt, vt);
    });
    dump_rows("q_rope", l, q, QD), dump_rows("k_rope", l, k, KVD), dump_rows("v", l, v, KVD);
    cpu::attention_batch(cache.data(), layout, l, s.queries, c.n_heads, pool);
    dump_rows("attn_out", l, att, QD);
    cpu::matmul(lw.wo, att, T, xb, pool, s.roles);
    for_each_token(pool, T, [&](int64_t t) { cpu::add_inplace(x + t * E, xb + t * E, E); });
    dump_rows("ffn_inp", l, x, E);

    // Feed-forward block: x += W_down · (silu(W_gate·n) * W_up·n), n = rmsnorm(x).
    for_each_token(pool, T, [&](int64_t t) {
      cpu::rmsnorm(x + t * E, lw.ffn_norm.data(), xb + t * E, E, c.rms_eps);
    });
    dump_rows("ffn_norm", l, xb, E);
    cpu::matmul_swiglu(lw.w_gate, lw.w_up, xb, T, gate, up, pool, s.roles);  // silu(gate) * up
    dump_rows("ffn_swiglu", l, gate, FF);
    cpu::matmul(lw.w_down, gate, T, xb, pool, s.roles);
    dump_rows("ffn_out", l, xb, E);
    for_each_token(pool, T, [&](int64_t t) { cpu::add_inplace(x + t * E, xb + t * E, E); });
    dump_rows("l_out", l, x, E);
  }

  // Final norm and classifier, only for the rows that need logits.
  const int64_t R = (int64_t)s.logit_rows.size();
  grow(s.out_rows, R * E);
  for_each_token(pool, R, [&](int64_t r) {
    cpu::rmsnorm(x + (int64_t)s.logit_rows[(size_t)r] * E, w.output_norm.data(),
                 s.out_rows.data() + r * E, E, c.rms_eps);
  });
  logits.resize((size_t)(R * c.n_vocab));
  cpu::matmul(w.output, s.out_rows.data(), R, logits.data(), pool, s.logit_roles);
}

}  // namespace hablar::model
