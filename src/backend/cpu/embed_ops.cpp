#include "backend/cpu/embed_ops.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/embed_kernels.h"
#include "backend/cpu/matmul_fused.h"
#include "core/cpu_features.h"
#include "core/error.h"

namespace hablar::cpu {
namespace {

// Dot product in 8 independent lanes (vectorizes without reassociation flags).
float dot(const float* a, const float* b, int n) {
  float lanes[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) lanes[l] += a[i + l] * b[i + l];
  float s = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
            ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

namespace embed {

bool embed_kernels_usable() {
  static const bool usable = cpu_features().has_avx512_kernels();
  return usable;
}

bool float_gemm_supports(const WeightView& w) {
  return embed_kernels_usable() && (w.type == DType::F16 || w.type == DType::F32) &&
         w.cols % 16 == 0 && w.data != nullptr && w.row_bytes >= dtype_row_bytes(w.type, w.cols);
}

}  // namespace embed

template <typename Fn>
void EmbedOps::for_each_token(int64_t n, const Fn& fn) {
  if (n == 1) return fn(0);
  pool_.run([&](int thread, int n_threads) {
    const IndexRange r = split_range(n, thread, n_threads);
    for (int64_t t = r.begin; t < r.end; ++t) fn(t);
  });
}

float* EmbedOps::rows(std::vector<float>& v, int64_t width) {
  const size_t n = (size_t)(n_tokens() * width);
  if (v.size() < n) v.resize(n);
  return v.data();
}

void EmbedOps::begin(std::span<const std::span<const int32_t>> sequences,
                     const ActivationDims& dims, std::span<const RopeParams> ropes, float rms_eps,
                     float norm_eps, bool causal) {
  dims_ = dims, rms_eps_ = rms_eps, norm_eps_ = norm_eps, causal_ = causal;
  ropes_.assign(ropes.begin(), ropes.end());
  tokens_.clear(), positions_.clear(), seq_begin_.assign(1, 0), seq_of_.clear(), roles_.clear();
  for (size_t s = 0; s < sequences.size(); ++s) {
    const std::span<const int32_t> seq = sequences[s];
    HABLAR_CHECK(!seq.empty(), "embedding step: an empty sequence");
    for (size_t i = 0; i < seq.size(); ++i) {
      tokens_.push_back(seq[i]);
      positions_.push_back((int32_t)i);
      seq_of_.push_back((int32_t)s);
      roles_.push_back(llama_batch_role((int64_t)i, (int64_t)seq.size()));
    }
    seq_begin_.push_back((int64_t)tokens_.size());
  }
  act_.x = rows(x_, dims.n_embd), act_.xb = rows(xb_, dims.n_embd);
  act_.q = rows(q_, dims.q_dim()), act_.att = rows(att_, dims.q_dim());
  act_.k = rows(k_, dims.kv_dim()), act_.v = rows(v_, dims.kv_dim());
  act_.gate = rows(gate_, dims.n_ff), act_.up = rows(up_, dims.n_ff);
  hidden_ = nullptr;
  if (causal) {  // the scratch cache's block tables: consecutive blocks per sequence
    scratch_layout_ = {1, dims.n_kv_heads, dims.head_dim, kDefaultKvBlockSize, 0, KvDType::F16};
    block_ids_.clear(), table_begin_.clear();
    for (size_t s = 0; s + 1 < seq_begin_.size(); ++s) {
      table_begin_.push_back((int64_t)block_ids_.size());
      const int64_t len = seq_begin_[s + 1] - seq_begin_[s];
      for (int64_t b = 0; b < (len + kDefaultKvBlockSize - 1) / kDefaultKvBlockSize; ++b)
        block_ids_.push_back(scratch_layout_.n_blocks++);
    }
    scratch_cache_.resize(scratch_layout_.total_elems());
  }
}

void EmbedOps::embed(const WeightView& table, float* x) {
  const int64_t E = dims_.n_embd;
  for_each_token(n_tokens(),
                 [&](int64_t t) { embedding_row(table, tokens_[(size_t)t], x + t * E); });
}

void EmbedOps::rmsnorm(const float* x, const float* weight, float* out, int64_t width) {
  for_each_token(n_tokens(), [&](int64_t t) {
    cpu::rmsnorm(x + t * width, weight, out + t * width, width, rms_eps_);
  });
}

void EmbedOps::matmul(const WeightView& w, const float* in, float* out) {
  cpu::matmul(w, in, n_tokens(), out, pool_, roles_);
}

void EmbedOps::matmul_qkv(const WeightView& wq, const WeightView& wk, const WeightView& wv,
                          const float* in, float* q, float* k, float* v) {
  const MatmulTarget targets[] = {{&wq, q}, {&wk, k}, {&wv, v}};
  matmul_many(targets, in, n_tokens(), pool_, roles_);
}

void EmbedOps::matmul_glu(const WeightView& gate, const WeightView& up, const float* in, float* out,
                          float* up_scratch, GluActivation act) {
  cpu::matmul_glu(gate, up, in, n_tokens(), out, up_scratch, pool_, roles_, act);
}

void EmbedOps::linear(const WeightView& w, const float* bias, const float* in, float* out,
                      bool gelu) {
  if (embed::float_gemm_supports(w) && n_tokens() > 1) {
    const embed::GemmJob job{&w, out, {bias, gelu}};
    return embed::float_gemm({&job, 1}, in, n_tokens(), pool_);
  }
  matmul(w, in, out);
  if (bias) add_bias(out, bias, w.rows);
  if (gelu) this->gelu(out, w.rows);
}

void EmbedOps::linear_qkv(const WeightView& wq, const float* bq, const WeightView& wk,
                          const float* bk, const WeightView& wv, const float* bv, const float* in,
                          float* q, float* k, float* v) {
  const bool fast = embed::float_gemm_supports(wq) && embed::float_gemm_supports(wk) &&
                    embed::float_gemm_supports(wv) && wq.type == wk.type && wq.type == wv.type &&
                    n_tokens() > 1;
  if (fast) {
    const embed::GemmJob jobs[] = {
        {&wq, q, {bq, false}}, {&wk, k, {bk, false}}, {&wv, v, {bv, false}}};
    return embed::float_gemm(jobs, in, n_tokens(), pool_);
  }
  matmul_qkv(wq, wk, wv, in, q, k, v);
  if (bq) add_bias(q, bq, wq.rows);
  if (bk) add_bias(k, bk, wk.rows);
  if (bv) add_bias(v, bv, wv.rows);
}

void EmbedOps::add_bias(float* x, const float* bias, int64_t width) {
  for_each_token(n_tokens(), [&](int64_t t) { add_inplace(x + t * width, bias, width); });
}

void EmbedOps::scale(float* x, float s, int64_t width) {
  for_each_token(n_tokens(), [&](int64_t t) {
    for (float *v = x + t * width, *end = v + width; v != end; ++v) *v *= s;
  });
}

void EmbedOps::scale_by_position(float* x, int64_t width, const PositionScale& ps) {
  for_each_token(n_tokens(), [&](int64_t t) {
    const float s = ps.factor(positions_[(size_t)t]);
    for (float *v = x + t * width, *end = v + width; v != end; ++v) *v *= s;
  });
}

void EmbedOps::head_rmsnorm(float* x, const float* weight, int n_heads) {
  const int HD = dims_.head_dim;
  for_each_token(n_tokens(), [&](int64_t t) {
    float* row = x + t * (int64_t)n_heads * HD;
    for (int h = 0; h < n_heads; ++h)
      cpu::rmsnorm(row + h * HD, weight, row + h * HD, HD, rms_eps_);
  });
}

void EmbedOps::rope(float* x, int n_heads, int variant) {
  HABLAR_CHECK(variant >= 0 && (size_t)variant < ropes_.size(), "rope: no such RoPE variant");
  const RopeParams& p = ropes_[(size_t)variant];
  const int HD = dims_.head_dim;
  for_each_token(n_tokens(), [&](int64_t t) {
    cpu::rope(x + t * (int64_t)n_heads * HD, n_heads, HD, positions_[(size_t)t], p);
  });
}

// Bidirectional, per (token, head): softmax(q·K^T * scale) · V over its whole sequence, in
// float (scores, then weights, then a weighted sum of value rows).
void EmbedOps::causal_attention(const AttentionSpec& spec, const float* q, const float* k,
                                const float* v, float* out) {
  const int64_t QD = dims_.q_dim(), KVD = dims_.kv_dim();
  const auto table = [&](int64_t t) {
    return block_ids_.data() + table_begin_[(size_t)seq_of_[(size_t)t]];
  };
  for_each_token(n_tokens(), [&](int64_t t) {
    kv_store(scratch_cache_.data(), scratch_layout_, 0, table(t), positions_[(size_t)t],
             k + t * KVD, v + t * KVD);
  });
  queries_.resize(tokens_.size());
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const int32_t pos = positions_[t];
    const int64_t len = seq_begin_[(size_t)seq_of_[t] + 1] - seq_begin_[(size_t)seq_of_[t]];
    // llama.cpp's one-token kernel for a one-token input, its batched one otherwise.
    const SumOrder order = len == 1 ? SumOrder::kLanes64 : SumOrder::kLanes16;
    queries_[t] = {table((int64_t)t),     pos,   q + (int64_t)t * QD,
                   out + (int64_t)t * QD, order, spec.first_position(pos)};
  }
  attention_batch(scratch_cache_.data(), scratch_layout_, 0, queries_, dims_.n_heads, spec.scale,
                  spec.softcap, pool_);
}

void EmbedOps::attention(int, const AttentionSpec& spec, const float* q, const float* k,
                         const float* v, float* out) {
  if (causal_) return causal_attention(spec, q, k, v, out);
  // Both ways, a window reaches half its length on either side (gemma-embedding's layers:
  // |i - j| <= window / 2, as llama.cpp's symmetric windows).
  const int64_t half = spec.window > 0 ? spec.window / 2 : -1;
  if (half < 0 && embed::embed_kernels_usable() && dims_.head_dim % 16 == 0) {
    const embed::AttentionShape shape{dims_.n_heads, dims_.n_kv_heads, dims_.head_dim, spec.scale,
                                      spec.softcap};
    return embed::bidirectional_attention(shape, seq_begin_, q, k, v, out, pool_);
  }
  const int H = dims_.n_heads, HD = dims_.head_dim, group = dims_.n_heads / dims_.n_kv_heads;
  const int64_t QD = dims_.q_dim(), KVD = dims_.kv_dim();
  const int64_t units = n_tokens() * H;
  pool_.run([&](int thread, int n_threads) {
    const IndexRange r = split_range(units, thread, n_threads);
    std::vector<float> w;
    for (int64_t u = r.begin; u < r.end; ++u) {
      const int64_t t = u / H;
      const int h = (int)(u % H), kvh = h / group;
      const int64_t base = seq_begin_[(size_t)seq_of_[(size_t)t]];
      const int64_t len = seq_begin_[(size_t)seq_of_[(size_t)t] + 1] - base;
      const int64_t i = t - base;  // bidirectional: the whole sequence, or the window
      const int64_t first = half < 0 ? 0 : std::max<int64_t>(0, i - half);
      const int64_t last = half < 0 ? len - 1 : std::min<int64_t>(len - 1, i + half);
      const float* qh = q + t * QD + (int64_t)h * HD;
      w.resize((size_t)(last - first + 1));
      float max_score = -INFINITY;
      for (int64_t j = first; j <= last; ++j) {
        float s = dot(qh, k + (base + j) * KVD + (int64_t)kvh * HD, HD) * spec.scale;
        if (spec.softcap > 0.0f) s = spec.softcap * std::tanh(s / spec.softcap);
        w[(size_t)(j - first)] = s;
        max_score = std::max(max_score, s);
      }
      double sum = 0;
      for (float& s : w) sum += (s = std::exp(s - max_score));
      const float inv = (float)(1.0 / sum);
      float* o = out + t * QD + (int64_t)h * HD;
      std::fill(o, o + HD, 0.0f);
      for (int64_t j = first; j <= last; ++j) {
        const float p = w[(size_t)(j - first)] * inv;
        const float* vr = v + (base + j) * KVD + (int64_t)kvh * HD;
        for (int d = 0; d < HD; ++d) o[d] += p * vr[d];
      }
    }
  });
}

void EmbedOps::add(float* x, const float* y, int64_t width) {
  for_each_token(n_tokens(), [&](int64_t t) { add_inplace(x + t * width, y + t * width, width); });
}

void EmbedOps::moe_ffn(const ExpertsView& experts, const float* in, float* out) {
  cpu::moe_ffn(experts, in, n_tokens(), dims_.n_embd, out, pool_, moe_, roles_);
}

void EmbedOps::logits(const float* x, const float* norm_weight, const WeightView&, float) {
  const int64_t E = dims_.n_embd;
  float* h = rows(hidden_rows_, E);
  for_each_token(n_tokens(),
                 [&](int64_t t) { cpu::rmsnorm(x + t * E, norm_weight, h + t * E, E, rms_eps_); });
  hidden_ = h;
}

void EmbedOps::classify(const float* x, const WeightView&, const float*) {
  const int64_t E = dims_.n_embd;
  float* h = rows(hidden_rows_, E);
  std::copy(x, x + n_tokens() * E, h);
  hidden_ = h;
}

void EmbedOps::add_table_row(const WeightView& table, int64_t row, float* x) {
  std::vector<float> r((size_t)table.cols);
  embedding_row(table, (int32_t)row, r.data());
  add_bias(x, r.data(), table.cols);
}

void EmbedOps::add_position_rows(const WeightView& table, float* x) {
  const int64_t E = dims_.n_embd;
  for_each_token(n_tokens(), [&](int64_t t) {
    std::vector<float> r((size_t)E);
    if (positions_[(size_t)t] >= table.rows)
      throw_error(ErrorKind::kInvalidArgument, "a sequence is longer than the model's " +
                                                   std::to_string(table.rows) + " positions");
    embedding_row(table, positions_[(size_t)t], r.data());
    // llama.cpp adds the position row first: pos + (token + type).
    for (int64_t i = 0; i < E; ++i) x[t * E + i] = r[(size_t)i] + x[t * E + i];
  });
}

// As llama.cpp's CPU norm: mean and variance summed in double, one float scale, then the
// weight and bias as separate float ops.
void EmbedOps::layernorm(const float* x, const float* weight, const float* bias, float* out,
                         int64_t width) {
  for_each_token(n_tokens(), [&](int64_t t) {
    cpu::layernorm(x + t * width, weight, bias, out + t * width, width, norm_eps_);
  });
}

void EmbedOps::relu_squared(float* x, int64_t width) {
  for_each_token(n_tokens(), [&](int64_t t) { cpu::relu_squared(x + t * width, width); });
}

void EmbedOps::gelu(float* x, int64_t width) {
  if (embed::embed_kernels_usable())
    return for_each_token(n_tokens(),
                          [&](int64_t t) { embed::gelu_inplace(x + t * width, width); });
  for_each_token(n_tokens(), [&](int64_t t) { cpu::gelu(x + t * width, x + t * width, width); });
}

// Sequence s's pooled row(s) appended to out: mean, first or last row, every row (none), or
// the classifier head's outputs for the first row (rank).
void EmbedOps::pool_one(int64_t s, Pooling pooling, const ClassifierHead& head,
                        std::vector<float>& out) {
  const int64_t E = dims_.n_embd, b = seq_begin_[(size_t)s], e = seq_begin_[(size_t)s + 1];
  if (pooling == Pooling::kNone) {
    const size_t at = out.size();
    out.insert(out.end(), hidden_ + b * E, hidden_ + e * E);
    project_dense(head, out.data() + at, e - b);
    return;
  }
  std::vector<float> p((size_t)E, 0.0f);
  if (pooling == Pooling::kMean) {
    const float inv = 1.0f / (float)(e - b);
    for (int64_t t = b; t < e; ++t)
      for (int64_t i = 0; i < E; ++i) p[(size_t)i] += hidden_[t * E + i] * inv;
  } else {
    const int64_t t = pooling == Pooling::kLast ? e - 1 : b;  // cls and rank: the first
    std::copy(hidden_ + t * E, hidden_ + (t + 1) * E, p.begin());
  }
  if (pooling == Pooling::kRank) {
    if (head.cls && head.cls->data) {
      std::vector<float> y((size_t)head.cls->rows);
      cpu::matmul(*head.cls, p.data(), 1, y.data(), pool_);
      for (size_t i = 0; i < y.size(); ++i)
        y[i] = std::tanh(head.cls_b ? y[i] + head.cls_b[i] : y[i]);
      p.swap(y);
    }
    if (head.cls_out && head.cls_out->data) {
      std::vector<float> y((size_t)head.cls_out->rows);
      cpu::matmul(*head.cls_out, p.data(), 1, y.data(), pool_);
      if (head.cls_out_b) add_inplace(y.data(), head.cls_out_b, (int64_t)y.size());
      p.swap(y);
    }
  } else {
    project_dense(head, p.data(), 1);
  }
  out.insert(out.end(), p.begin(), p.end());
}

void EmbedOps::project_dense(const ClassifierHead& head, float* rows, int64_t n) {
  if (!head.dense_2 || !head.dense_2->data || !head.dense_3 || !head.dense_3->data) return;
  std::vector<float> mid((size_t)(n * head.dense_2->rows));  // [n x d]
  cpu::matmul(*head.dense_2, rows, n, mid.data(), pool_);
  cpu::matmul(*head.dense_3, mid.data(), n, rows, pool_);  // back to [n x n_embd]
}

void EmbedOps::pool(std::span<const Pooling> pooling, const ClassifierHead& head,
                    std::vector<float>& out, std::vector<int64_t>& row_begin) {
  HABLAR_CHECK(hidden_ != nullptr, "pool: the forward left no hidden rows");
  const int64_t n_seq = (int64_t)seq_begin_.size() - 1;
  HABLAR_CHECK((int64_t)pooling.size() == n_seq, "pool: one pooling per sequence");
  row_begin.assign(1, 0);
  out.clear();
  for (int64_t s = 0; s < n_seq; ++s) {
    pool_one(s, pooling[(size_t)s], head, out);
    row_begin.push_back((int64_t)out.size());
  }
}

}  // namespace hablar::cpu
