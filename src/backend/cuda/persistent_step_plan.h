// The persistent decode step's phase list, recorded from the model's own forward: a backend
// for model::forward (the ForwardBackend concept) whose ops launch nothing but append what
// they would compute, fused into persistent_step.h's phases:
//   rmsnorm + matmul_qkv / matmul_glu / matmul / logits   -> kNormProducts (with a queued
//                                                            residual add)
//   add_bias and rope of q and k, then attention           -> kAttention
//   matmul of the attention's output, of any other rows    -> kProduct
//   add(x, y)                                              -> queued into the next norm
// The residual stream (the model's x) alternates between x and a spare buffer: a phase
// reads it whole in every block while some blocks write its next value.
// Anything else (a scale, q/k norms, experts, a window or soft-cap, a matrix that
// `matrix_rule` does not take, a second embedding) makes the forward unsupported, with the
// reason, and the step keeps its launch-per-op form. Header-only host code: the CUDA
// executor records with it, and a host test checks the phases without a GPU.
#pragma once

#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "backend/cuda/persistent_step.h"
#include "core/step_batch.h"
#include "core/tensor_view.h"

namespace hablar::cuda {

// How the persistent kernel runs a matrix (type and team), or nothing when it cannot;
// `matrices` 2 for the gated pair.
using PersistentMatrixRule =
    std::function<bool(const WeightView& w, int matrices, PersistentMatrix* out)>;

class PersistentStepPlan {
 public:
  PersistentStepPlan(const Activations& a, const PersistentStepContext& ctx, float* spare_residual,
                     float* logits, PersistentMatrixRule matrix_rule)
      : a_(a), ctx_(ctx), spare_(spare_residual), logits_(logits), rule_(std::move(matrix_rule)) {}

  // ---- model::ForwardBackend
  const Activations& activations() const { return a_; }
  int64_t n_tokens() const { return 1; }
  void embed(const WeightView& table, float* x) {
    if (embedded_) return fail("a second embedding");
    embedded_ = true, embed_table_ = table, residual_ = x;
  }
  void rmsnorm(const float* x, const float* weight, float* out, int64_t width) {
    if (x != a_.x || width != ctx_.n_embd) return fail("a norm of rows other than the residual");
    if (norm_.weight != nullptr) return fail("a norm whose rows no product takes");
    norm_ = {weight, out};
  }
  void matmul(const WeightView& w, const float* in, float* out) {
    if (norm_.weight != nullptr && in == norm_.out) return norm_products({&w}, {out}, false);
    PersistentPhase p;
    p.kind = PersistentPhaseKind::kProduct;
    p.input = in == attention_out_ ? PersistentInput::kAttentionCodes : PersistentInput::kF32;
    p.in = in, p.width = (int32_t)w.cols;
    if (p.input == PersistentInput::kF32 && !rows_written(in))
      return fail("a product of rows no phase wrote");
    if (add_matrix(p, w, out, 1)) phases_.push_back(p);
  }
  void matmul_qkv(const WeightView& wq, const WeightView& wk, const WeightView& wv, const float* in,
                  float* q, float* k, float* v) {
    if (norm_.weight == nullptr || in != norm_.out) return fail("Q, K and V of unnormed rows");
    norm_products({&wq, &wk, &wv}, {q, k, v}, false);
    qkv_ = {q, k, v};
  }
  void matmul_glu(const WeightView& gate, const WeightView& up, const float* in, float* out, float*,
                  GluActivation act) {
    if (norm_.weight == nullptr || in != norm_.out) return fail("a gated product of unnormed rows");
    norm_products({&gate, &up}, {out, out}, true, act);
  }
  void add_bias(float* x, const float* bias, int64_t) {
    if (x == qkv_.q) return set_once(bias_.q, bias);
    if (x == qkv_.k) return set_once(bias_.k, bias);
    if (x == qkv_.v) return set_once(bias_.v, bias);
    fail("a bias on rows other than this layer's q, k, v");
  }
  void rope(float* x, int, int variant) {
    if (variant < 0 || variant >= ctx_.n_rope_variants) return fail("an unknown RoPE variant");
    if (x == qkv_.q && rope_q_ < 0) return void(rope_q_ = variant);
    if (x == qkv_.k && rope_k_ < 0) return void(rope_k_ = variant);
    fail("RoPE on rows other than this layer's q and k");
  }
  void attention(int layer, const AttentionSpec& spec, const float* q, const float* k,
                 const float* v, float* out) {
    if (q != qkv_.q || k != qkv_.k || v != qkv_.v) return fail("attention over other rows");
    if (spec.window > 0 || spec.softcap > 0.0f) return fail("a sliding window or soft-cap");
    if (rope_q_ != rope_k_) return fail("q and k turned by different RoPE variants");
    PersistentPhase p;
    p.kind = PersistentPhaseKind::kAttention;
    p.layer = layer, p.q = q, p.k = k, p.v = v;
    p.bq = bias_.q, p.bk = bias_.k, p.bv = bias_.v;
    p.rope_variant = rope_q_, p.scale = spec.scale, p.out = out;
    phases_.push_back(p);
    attention_out_ = out;
    qkv_ = {}, bias_ = {}, rope_q_ = rope_k_ = -1;
  }
  void add(float* x, const float* y, int64_t width) {
    if (x != a_.x || width != ctx_.n_embd || pending_add_ != nullptr)
      return fail("an add into rows other than the residual");
    pending_add_ = y;
  }
  void scale(float*, float, int64_t) { fail("a scale op"); }
  void scale_by_position(float*, int64_t, const PositionScale&) { fail("a query temperature"); }
  void head_rmsnorm(float*, const float*, int) { fail("per-head norms"); }
  void moe_ffn(const ExpertsView&, const float*, float*) { fail("a mixture of experts"); }
  void scale_logits(float) { fail("scaled logits"); }
  void relu_squared(float*, int64_t) { fail("an ungated MLP"); }
  void logits(const float* x, const float* norm_weight, const WeightView& output, float softcap) {
    if (x != a_.x || softcap > 0.0f) return fail("soft-capped logits");
    rmsnorm(x, norm_weight, const_cast<float*>(x), ctx_.n_embd);
    norm_products({&output}, {logits_}, false);
    done_ = true;
  }
  const float* host_rows(const float*, int64_t, std::vector<float>&) {
    fail("activation dumps");
    return nullptr;
  }

  // ---- The result
  bool supported() const { return reason_.empty() && done_ && embedded_; }
  const std::string& reason() const { return reason_; }
  const std::vector<PersistentPhase>& phases() const { return phases_; }
  const WeightView& embedding() const { return embed_table_; }
  float* embedded_rows() const { return residual_; }

 private:
  struct Norm {
    const float* weight = nullptr;
    const float* out = nullptr;
  };
  struct Qkv {
    float *q = nullptr, *k = nullptr, *v = nullptr;
  };
  struct Biases {
    const float *q = nullptr, *k = nullptr, *v = nullptr;
  };

  void fail(const std::string& why) {
    if (reason_.empty()) reason_ = why;
  }
  void set_once(const float*& slot, const float* bias) {
    if (slot != nullptr) return fail("two biases on one buffer");
    slot = bias;
  }
  bool rows_written(const float* in) const {
    for (const PersistentPhase& p : phases_)
      for (int i = 0; i < p.n_matrices; ++i)
        if (p.matrices[i].out == in) return true;
    return false;
  }
  bool add_matrix(PersistentPhase& p, const WeightView& w, float* out, int matrices) {
    PersistentMatrix m;
    if (p.n_matrices == kPersistentMaxMatrices || w.cols != p.width || !rule_(w, matrices, &m)) {
      fail("a matrix the persistent kernel does not take (" + std::string(dtype_name(w.type)) +
           ", " + std::to_string(w.rows) + " x " + std::to_string(w.cols) + ")");
      return false;
    }
    m.out = out;
    p.matrices[p.n_matrices++] = m;
    return true;
  }
  // The queued norm (and residual add) with the products of its rows.
  void norm_products(std::initializer_list<const WeightView*> ws,
                     std::initializer_list<float*> outs, bool glu,
                     GluActivation act = GluActivation::kSilu) {
    PersistentPhase p;
    p.kind = PersistentPhaseKind::kNormProducts;
    p.x = residual_, p.norm_weight = norm_.weight, p.width = ctx_.n_embd;
    if (residual_ == nullptr) return fail("a norm before the embedding");
    if (pending_add_ != nullptr) {
      p.add = pending_add_;
      p.x_out = residual_ == a_.x ? spare_ : a_.x;  // the stream moves to the other buffer
      residual_ = p.x_out;
      pending_add_ = nullptr;
    }
    p.glu = glu, p.act = act;
    auto out = outs.begin();
    for (const WeightView* w : ws)
      if (!add_matrix(p, *w, *out++, glu ? 2 : 1)) return;
    phases_.push_back(p);
    norm_ = {};
  }

  Activations a_;
  PersistentStepContext ctx_;
  float* spare_;
  float* logits_;
  PersistentMatrixRule rule_;
  std::vector<PersistentPhase> phases_;
  std::string reason_;
  bool embedded_ = false, done_ = false;
  WeightView embed_table_;
  float* residual_ = nullptr;  // where the residual stream is now
  const float* pending_add_ = nullptr;
  const float* attention_out_ = nullptr;
  Norm norm_;
  Qkv qkv_;
  Biases bias_;
  int rope_q_ = -1, rope_k_ = -1;
};

}  // namespace hablar::cuda
