// The CPU backend's side of the model seam: the ops model/forward.h calls, over host
// activation rows [T x width] and a host paged KV cache (F16).
//
// The forward is written once for every backend; what is particular to the CPU stays here.
// llama.cpp's summation orders, which the CPU matches bit for bit ("reference order"), are
// derived in begin() from the step's own data (which positions hold sampled tokens, where a
// prompt's llama.cpp batch begins), never passed through the forward or the engine.
//
// The per-token ops between the q/k/v products and attention (bias, per-head norm, RoPE)
// are deferred and run, in the order called, in attention()'s one pass over the tokens
// that also stores K/V: one parallel region instead of up to eight, the same bits.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/cpu/moe.h"
#include "backend/cpu/ops.h"
#include "core/kv_layout.h"
#include "core/layer_spec.h"
#include "core/rope.h"
#include "core/step_batch.h"
#include "core/tensor_view.h"
#include "core/thread_pool.h"

namespace hablar::cpu {

class ForwardOps {
 public:
  explicit ForwardOps(ThreadPool& pool) : pool_(pool) {}

  // Starts a step: flattens the chunks into T token rows, computes each token's RoPE angles
  // (for every variant in `ropes`) and summation roles, and sizes the activation rows.
  // `cache` must stay valid until the step ends. The chunks must have been checked (tokens
  // in range, block tables long enough).
  void begin(std::span<const SequenceChunk> chunks, uint16_t* cache, const KvCacheLayout& layout,
             const ActivationDims& dims, std::span<const RopeParams> ropes, float rms_eps);
  int64_t n_tokens() const { return (int64_t)tokens_.size(); }
  const Activations& activations() const { return act_; }

  void embed(const WeightView& table, float* x);
  void rmsnorm(const float* x, const float* weight, float* out, int64_t width);
  void matmul(const WeightView& w, const float* in, float* out);
  void matmul_qkv(const WeightView& wq, const WeightView& wk, const WeightView& wv, const float* in,
                  float* q, float* k, float* v);
  void matmul_glu(const WeightView& gate, const WeightView& up, const float* in, float* out,
                  float* up_scratch, GluActivation act);
  void add_bias(float* x, const float* bias, int64_t width);
  void scale(float* x, float s, int64_t width);
  // x[t] *= ps.factor(position of t), each in one rounding (ggml_mul by llama.cpp's factor).
  void scale_by_position(float* x, int64_t width, const PositionScale& ps);
  void head_rmsnorm(float* x, const float* weight, int n_heads);
  void rope(float* x, int n_heads, int variant);
  void attention(int layer, const AttentionSpec& spec, const float* q, const float* k,
                 const float* v, float* out);
  void add(float* x, const float* y, int64_t width);
  void moe_ffn(const ExpertsView& experts, const float* in, float* out);
  // Final norm of the rows that need logits, then the classifier: logits() [R x n_vocab],
  // one row per token of an all_logits chunk, else one for the chunk's last token; soft-capped
  // when softcap > 0.
  void logits(const float* x, const float* norm_weight, const WeightView& output, float softcap);
  // logits *= s, each in one rounding (ggml_scale's; Granite).
  void scale_logits(float s);
  // x = max(x, 0)^2 (ggml_relu then ggml_sqr; Arcee).
  void relu_squared(float* x, int64_t width);
  // phi2's ops (model::LayerNormBackend): LayerNorm with a bias per row (out may be x);
  // x = GELU-tanh(x) as llama.cpp's CPU computes it (cpu::gelu); logits() of rows normed
  // already, plus a bias per vocabulary entry.
  void layernorm(const float* x, const float* weight, const float* bias, float* out, int64_t width);
  void gelu(float* x, int64_t width);
  void classify(const float* x, const WeightView& output, const float* bias);
  std::vector<float>& logits() { return logits_; }
  // Host rows for a debug dump (the CPU's are host memory already; deferred ops done first).
  const float* host_rows(const float* rows, int64_t n, std::vector<float>&) {
    flush_pending();
    return rows;
  }

 private:
  template <typename Fn>
  void for_each_token(int64_t n, const Fn& fn);
  // A deferred per-token op on rows [T x width] (width = heads * head_dim for kHeadNorm and
  // kRope).
  struct TokenOp {
    enum class Kind { kBias, kScale, kPositionScale, kHeadNorm, kRope } kind;
    float* x;
    const float* w;               // bias or norm weight
    int n_heads;                  // kHeadNorm, kRope
    int64_t width;                // kBias, kScale, kPositionScale
    float s = 1.0f;               // kScale
    PositionScale by_position{};  // kPositionScale
    int variant = 0;              // kRope
  };
  // The classifier over the logit rows of `rows` (normed by `norm`), into logits_.
  template <typename NormRow>
  void classify_rows(const WeightView& output, const NormRow& norm);
  void apply_pending(int64_t t);
  void flush_pending();  // runs the deferred ops now (before an op that reads their rows)

  ThreadPool& pool_;
  uint16_t* cache_ = nullptr;
  KvCacheLayout layout_{};
  ActivationDims dims_{};
  std::vector<RopeParams> ropes_;
  float eps_ = 1e-5f;

  std::vector<int32_t> tokens_;               // [T]
  std::vector<int32_t> positions_;            // [T]
  std::vector<const int32_t*> block_tables_;  // [T] each token's sequence's block table
  std::vector<int32_t> logit_rows_;           // token indices whose logits are wanted
  std::vector<SumOrder> sum_orders_;          // [T] attention's summation order per token
  std::vector<uint8_t> roles_;                // [T] each token's place in llama.cpp's batch
  std::vector<uint8_t> logit_roles_;          // the same for the logit rows' output matmul
  std::vector<AttentionQuery> queries_;       // [T]
  std::vector<TokenOp> pending_;
  // Per RoPE variant: [T x n_dims/2] cosines and sines.
  std::vector<std::vector<float>> rope_cos_, rope_sin_;
  std::vector<float> x_, xb_, q_, k_, v_, att_, gate_, up_, out_rows_, logits_;
  MoeScratch moe_;
  Activations act_;
};

}  // namespace hablar::cpu
