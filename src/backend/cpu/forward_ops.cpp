#include "backend/cpu/forward_ops.h"

#include <algorithm>

#include "backend/cpu/embed_kernels.h"
#include "backend/cpu/matmul_fused.h"
#include "core/error.h"
#include "core/llama_batch_roles.h"

namespace hablar::cpu {
namespace {

float* sized(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace

template <typename Fn>
void ForwardOps::for_each_token(int64_t n, const Fn& fn) {
  if (n == 1) return fn(0);
  pool_.run([&](int thread, int n_threads) {
    const IndexRange r = split_range(n, thread, n_threads);
    for (int64_t t = r.begin; t < r.end; ++t) fn(t);
  });
}

void ForwardOps::begin(std::span<const SequenceChunk> chunks, uint16_t* cache,
                       const KvCacheLayout& layout, const ActivationDims& dims,
                       std::span<const RopeParams> ropes, float rms_eps) {
  cache_ = cache, layout_ = layout, dims_ = dims, eps_ = rms_eps;
  ropes_.assign(ropes.begin(), ropes.end());
  pending_.clear();
  // Attention sums as llama.cpp does for a chunk of one token (decode) or of several
  // (SumOrder). When the chunk says which positions hold sampled tokens (prompt_len),
  // those take the one-token order and prompt tokens the other, however the sequence is
  // chunked: a sequence recomputed after preemption, or a prompt split so that one token is
  // left, gets the same values again. The order never depends on the other sequences.
  tokens_.clear(), positions_.clear(), block_tables_.clear(), logit_rows_.clear();
  sum_orders_.clear(), roles_.clear(), logit_roles_.clear();
  for (const SequenceChunk& ch : chunks) {
    for (size_t i = 0; i < ch.tokens.size(); ++i) {
      const TokenPlace place = token_place(ch, i);
      sum_orders_.push_back(place.sampled ? SumOrder::kLanes64 : SumOrder::kLanes16);
      roles_.push_back(place.role);
      // llama.cpp's output matmul takes only the rows whose logits are wanted: all of the
      // batch's, or the last one alone.
      if (ch.all_logits || i + 1 == ch.tokens.size()) {
        logit_rows_.push_back((int32_t)tokens_.size());
        logit_roles_.push_back(ch.all_logits ? roles_.back() : llama_batch_role(0, 1));
      }
      tokens_.push_back(ch.tokens[i]);
      positions_.push_back(ch.start_pos + (int32_t)i);
      block_tables_.push_back(ch.block_table.data());
    }
  }
  const size_t T = tokens_.size();
  act_.x = sized(x_, T * dims.n_embd), act_.xb = sized(xb_, T * dims.n_embd);
  act_.q = sized(q_, T * dims.q_dim()), act_.att = sized(att_, T * dims.q_dim());
  act_.k = sized(k_, T * dims.kv_dim()), act_.v = sized(v_, T * dims.kv_dim());
  act_.gate = sized(gate_, T * dims.n_ff), act_.up = sized(up_, T * dims.n_ff);
  // RoPE angles of each token's position, computed once per variant for every layer, q and k.
  rope_cos_.resize(ropes_.size()), rope_sin_.resize(ropes_.size());
  for (size_t r = 0; r < ropes_.size(); ++r) {
    const int RP = ropes_[r].n_dims / 2;
    float* cos_t = sized(rope_cos_[r], T * RP);
    float* sin_t = sized(rope_sin_[r], T * RP);
    for_each_token((int64_t)T, [&](int64_t t) {
      rope_angles(positions_[(size_t)t], ropes_[r], cos_t + t * RP, sin_t + t * RP);
    });
  }
}

void ForwardOps::apply_pending(int64_t t) {
  const int HD = dims_.head_dim;
  for (const TokenOp& op : pending_) {
    switch (op.kind) {
      case TokenOp::Kind::kBias:
        add_inplace(op.x + t * op.width, op.w, op.width);
        break;
      case TokenOp::Kind::kScale:
        for (float *v = op.x + t * op.width, *end = v + op.width; v != end; ++v) *v *= op.s;
        break;
      case TokenOp::Kind::kPositionScale: {
        const float s = op.by_position.factor(positions_[(size_t)t]);
        for (float *v = op.x + t * op.width, *end = v + op.width; v != end; ++v) *v *= s;
        break;
      }
      case TokenOp::Kind::kHeadNorm: {
        float* row = op.x + t * (int64_t)op.n_heads * HD;
        for (int h = 0; h < op.n_heads; ++h)
          cpu::rmsnorm(row + h * HD, op.w, row + h * HD, HD, eps_);
        break;
      }
      case TokenOp::Kind::kRope: {
        const RopeParams& rope = ropes_[(size_t)op.variant];
        const int RP = rope.n_dims / 2;
        rope_apply(op.x + t * (int64_t)op.n_heads * HD, op.n_heads, HD, rope,
                   rope_cos_[(size_t)op.variant].data() + t * RP,
                   rope_sin_[(size_t)op.variant].data() + t * RP);
        break;
      }
    }
  }
}

void ForwardOps::flush_pending() {
  if (pending_.empty()) return;
  for_each_token(n_tokens(), [&](int64_t t) { apply_pending(t); });
  pending_.clear();
}

void ForwardOps::embed(const WeightView& table, float* x) {
  const int64_t E = dims_.n_embd;
  for_each_token(n_tokens(),
                 [&](int64_t t) { embedding_row(table, tokens_[(size_t)t], x + t * E); });
}

void ForwardOps::rmsnorm(const float* x, const float* weight, float* out, int64_t width) {
  flush_pending();
  for_each_token(n_tokens(), [&](int64_t t) {
    cpu::rmsnorm(x + t * width, weight, out + t * width, width, eps_);
  });
}

void ForwardOps::matmul(const WeightView& w, const float* in, float* out) {
  flush_pending();
  cpu::matmul(w, in, n_tokens(), out, pool_, roles_);
}

void ForwardOps::matmul_qkv(const WeightView& wq, const WeightView& wk, const WeightView& wv,
                            const float* in, float* q, float* k, float* v) {
  flush_pending();
  const MatmulTarget targets[] = {{&wq, q}, {&wk, k}, {&wv, v}};
  matmul_many(targets, in, n_tokens(), pool_, roles_);  // one quantization of the input
}

void ForwardOps::matmul_glu(const WeightView& gate, const WeightView& up, const float* in,
                            float* out, float* up_scratch, GluActivation act) {
  flush_pending();
  cpu::matmul_glu(gate, up, in, n_tokens(), out, up_scratch, pool_, roles_, act);
}

void ForwardOps::add_bias(float* x, const float* bias, int64_t width) {
  pending_.push_back({TokenOp::Kind::kBias, x, bias, 0, width});
}

void ForwardOps::scale(float* x, float s, int64_t width) {
  TokenOp op{TokenOp::Kind::kScale, x, nullptr, 0, width};
  op.s = s;
  pending_.push_back(op);
}

void ForwardOps::scale_by_position(float* x, int64_t width, const PositionScale& ps) {
  TokenOp op{TokenOp::Kind::kPositionScale, x, nullptr, 0, width};
  op.by_position = ps;
  pending_.push_back(op);
}

void ForwardOps::head_rmsnorm(float* x, const float* weight, int n_heads) {
  pending_.push_back({TokenOp::Kind::kHeadNorm, x, weight, n_heads, 0});
}

void ForwardOps::rope(float* x, int n_heads, int variant) {
  HABLAR_CHECK(variant >= 0 && (size_t)variant < ropes_.size(), "rope: no such RoPE variant");
  TokenOp op{TokenOp::Kind::kRope, x, nullptr, n_heads, 0};
  op.variant = variant;
  pending_.push_back(op);
}

void ForwardOps::attention(int layer, const AttentionSpec& spec, const float* q, const float* k,
                           const float* v, float* out) {
  const int64_t QD = dims_.q_dim(), KVD = dims_.kv_dim();
  for_each_token(n_tokens(), [&](int64_t t) {
    apply_pending(t);  // bias, q/k norms, RoPE of this token, in the order the forward asked
    kv_store(cache_, layout_, layer, block_tables_[(size_t)t], positions_[(size_t)t], k + t * KVD,
             v + t * KVD);
  });
  pending_.clear();
  queries_.resize(tokens_.size());
  for (size_t t = 0; t < tokens_.size(); ++t)
    queries_[t] = {block_tables_[t],      positions_[t],  q + (int64_t)t * QD,
                   out + (int64_t)t * QD, sum_orders_[t], spec.first_position(positions_[t])};
  attention_batch(cache_, layout_, layer, queries_, dims_.n_heads, spec.scale, spec.softcap, pool_);
}

void ForwardOps::add(float* x, const float* y, int64_t width) {
  flush_pending();
  for_each_token(n_tokens(), [&](int64_t t) { add_inplace(x + t * width, y + t * width, width); });
}

void ForwardOps::moe_ffn(const ExpertsView& experts, const float* in, float* out) {
  flush_pending();
  cpu::moe_ffn(experts, in, n_tokens(), dims_.n_embd, out, pool_, moe_, roles_);
}

template <typename NormRow>
void ForwardOps::classify_rows(const WeightView& output, const NormRow& norm) {
  flush_pending();
  const int64_t R = (int64_t)logit_rows_.size(), E = dims_.n_embd;
  float* rows = sized(out_rows_, (size_t)(R * E));
  for_each_token(R, [&](int64_t r) { norm(logit_rows_[(size_t)r], rows + r * E); });
  logits_.resize((size_t)(R * output.rows));
  cpu::matmul(output, rows, R, logits_.data(), pool_, logit_roles_);
}

void ForwardOps::logits(const float* x, const float* norm_weight, const WeightView& output,
                        float softcap) {
  const int64_t E = dims_.n_embd;
  classify_rows(output,
                [&](int64_t t, float* row) { cpu::rmsnorm(x + t * E, norm_weight, row, E, eps_); });
  if (softcap > 0.0f) cpu::softcap(logits_.data(), (int64_t)logits_.size(), softcap);
}

void ForwardOps::relu_squared(float* x, int64_t width) {
  flush_pending();
  for_each_token(n_tokens(), [&](int64_t t) { cpu::relu_squared(x + t * width, width); });
}

void ForwardOps::scale_logits(float s) {
  for (float& v : logits_) v *= s;
}

void ForwardOps::layernorm(const float* x, const float* weight, const float* bias, float* out,
                           int64_t width) {
  flush_pending();
  for_each_token(n_tokens(), [&](int64_t t) {
    cpu::layernorm(x + t * width, weight, bias, out + t * width, width, eps_);
  });
}

void ForwardOps::gelu(float* x, int64_t width) {
  flush_pending();
  const bool simd = embed::embed_kernels_usable();  // the same bits as cpu::gelu
  for_each_token(n_tokens(), [&](int64_t t) {
    float* row = x + t * width;
    simd ? embed::gelu_inplace(row, width) : cpu::gelu(row, row, width);
  });
}

void ForwardOps::classify(const float* x, const WeightView& output, const float* bias) {
  const int64_t E = dims_.n_embd;
  classify_rows(output, [&](int64_t t, float* row) { std::copy(x + t * E, x + (t + 1) * E, row); });
  if (bias == nullptr) return;
  const int64_t V = output.rows, R = (int64_t)logit_rows_.size();
  for_each_token(R, [&](int64_t r) { add_inplace(logits_.data() + r * V, bias, V); });
}

}  // namespace hablar::cpu
