// The CPU ops of an embedding step: whole sequences (an encoder's input, or a decoder
// embedder's prompt) with no KV cache. Every token row of every sequence goes through the
// same products together; attention reads the step's own K/V rows of the token's sequence:
// all of them (encoders, bidirectional) or those up to the token (causal decoders).
//
// It satisfies model::ForwardBackend, so a decoder family's forward (model/forward.h) runs
// over it unchanged: logits() then keeps the final-normed hidden rows instead of computing
// a classifier. The encoder forward (model/forward_encoder.h) uses the extra ops below.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/cpu/moe.h"
#include "backend/cpu/ops.h"
#include "core/kv_layout.h"
#include "core/layer_spec.h"
#include "core/pooling.h"
#include "core/rope.h"
#include "core/step_batch.h"
#include "core/tensor_view.h"
#include "core/thread_pool.h"

namespace hablar::cpu {

// A reranker's classifier head: tanh(cls · x + cls_b) when cls is present, then
// cls_out · x + cls_out_b when it is (llama.cpp's rank pooling). dense_2 / dense_3: the
// projections gemma-embedding applies to every pooled row (every token's for pooling none)
// but rank's, dense_3 · (dense_2 · x).
struct ClassifierHead {
  const WeightView* cls = nullptr;  // null or data == nullptr: absent
  const float* cls_b = nullptr;
  const WeightView* cls_out = nullptr;
  const float* cls_out_b = nullptr;
  const WeightView* dense_2 = nullptr;
  const WeightView* dense_3 = nullptr;
};

class EmbedOps {
 public:
  explicit EmbedOps(ThreadPool& pool) : pool_(pool) {}

  // Starts a step over whole sequences (positions 0..n-1 each). `causal`: a token sees the
  // tokens before it only (decoder embedders), else its whole sequence.
  void begin(std::span<const std::span<const int32_t>> sequences, const ActivationDims& dims,
             std::span<const RopeParams> ropes, float rms_eps, float norm_eps, bool causal);
  int64_t n_tokens() const { return (int64_t)tokens_.size(); }
  const Activations& activations() const { return act_; }

  // model::ForwardBackend (every op applies at once; attention stores nothing).
  void embed(const WeightView& table, float* x);
  void rmsnorm(const float* x, const float* weight, float* out, int64_t width);
  void matmul(const WeightView& w, const float* in, float* out);
  void matmul_qkv(const WeightView& wq, const WeightView& wk, const WeightView& wv, const float* in,
                  float* q, float* k, float* v);
  void matmul_glu(const WeightView& gate, const WeightView& up, const float* in, float* out,
                  float* up_scratch, GluActivation act);
  void add_bias(float* x, const float* bias, int64_t width);
  void scale(float* x, float s, int64_t width);
  void scale_by_position(float* x, int64_t width, const PositionScale& ps);
  void head_rmsnorm(float* x, const float* weight, int n_heads);
  void rope(float* x, int n_heads, int variant);
  void attention(int layer, const AttentionSpec& spec, const float* q, const float* k,
                 const float* v, float* out);
  void add(float* x, const float* y, int64_t width);
  void moe_ffn(const ExpertsView& experts, const float* in, float* out);
  // A decoder's end: the rows of x after the final RMSNorm become the hidden rows (no
  // classifier: embeddings are pooled from them).
  void logits(const float* x, const float* norm_weight, const WeightView& output, float softcap);
  // (The hidden rows are the normed ones: a multiplier of the logits leaves them.)
  void scale_logits(float) {}
  void relu_squared(float* x, int64_t width);
  // The same for a decoder whose final norm is its own op (phi2): x's rows, normed already.
  void classify(const float* x, const WeightView& output, const float* bias);
  const float* host_rows(const float* rows, int64_t, std::vector<float>&) { return rows; }

  // Encoder ops. x[t] += row `row` of the table (token type 0 for every token, as llama.cpp).
  void add_table_row(const WeightView& table, int64_t row, float* x);
  // x[t] += the table's row at token t's position (absolute position embeddings).
  void add_position_rows(const WeightView& table, float* x);
  // LayerNorm with bias: (x - mean) / sqrt(var + eps) * w + b, per row (out may be x).
  void layernorm(const float* x, const float* weight, const float* bias, float* out, int64_t width);
  // x = GELU(x) as llama.cpp's CPU computes it (half-precision table, cpu::gelu).
  void gelu(float* x, int64_t width);
  // out = W·in + bias (bias may be null), then GELU when `gelu`: the AVX-512 GEMM of
  // embed_kernels.h with the bias and GELU in its epilogue where it takes the weight, else
  // matmul, add_bias and gelu (the same values either way).
  void linear(const WeightView& w, const float* bias, const float* in, float* out, bool gelu);
  // q, k, v = the three biased projections of in (biases may be null), in one pass.
  void linear_qkv(const WeightView& wq, const float* bq, const WeightView& wk, const float* bk,
                  const WeightView& wv, const float* bv, const float* in, float* q, float* k,
                  float* v);
  // The encoder's last rows: what pool() reads.
  void set_hidden(const float* x) { hidden_ = x; }

  // Pools the hidden rows [T x n_embd] of each sequence as pooling[s] says (core/pooling.h)
  // into `out`: none gives every token's row, rank the head's outputs for the first token,
  // the others one row of n_embd. row_begin[s] is sequence s's first float in out (size
  // n_seq + 1).
  void pool(std::span<const Pooling> pooling, const ClassifierHead& head, std::vector<float>& out,
            std::vector<int64_t>& row_begin);

 private:
  template <typename Fn>
  void for_each_token(int64_t n, const Fn& fn);
  float* rows(std::vector<float>& v, int64_t width);
  void pool_one(int64_t s, Pooling pooling, const ClassifierHead& head, std::vector<float>& out);
  // rows [n x n_embd] through the head's dense projections in place (when it has them).
  void project_dense(const ClassifierHead& head, float* rows, int64_t n);
  // Causal attention as the decode path computes it (llama.cpp's rounding, cpu::
  // attention_batch) over a one-layer scratch cache that holds this step's K/V.
  void causal_attention(const AttentionSpec& spec, const float* q, const float* k, const float* v,
                        float* out);

  ThreadPool& pool_;
  ActivationDims dims_{};
  std::vector<RopeParams> ropes_;
  float rms_eps_ = 1e-5f, norm_eps_ = 1e-12f;
  bool causal_ = false;
  std::vector<int32_t> tokens_;     // [T]
  std::vector<int32_t> positions_;  // [T] position inside its sequence
  std::vector<int64_t> seq_begin_;  // [n_seq + 1] first token row of each sequence
  std::vector<int32_t> seq_of_;     // [T] sequence index of each token
  std::vector<uint8_t> roles_;      // [T] llama.cpp batch roles (matmul summation orders)
  std::vector<float> x_, xb_, q_, k_, v_, att_, gate_, up_, hidden_rows_;
  const float* hidden_ = nullptr;
  // Causal attention's scratch cache: one layer, block_tables_ [n_seq][blocks] consecutive.
  KvCacheLayout scratch_layout_{};
  std::vector<uint16_t> scratch_cache_;
  std::vector<int32_t> block_ids_;       // every sequence's table, back to back
  std::vector<int64_t> table_begin_;     // [n_seq] where sequence s's table starts
  std::vector<AttentionQuery> queries_;  // [T]
  MoeScratch moe_;
  Activations act_;
};

}  // namespace hablar::cpu
