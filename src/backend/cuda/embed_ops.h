// The CUDA ops of an embedding step, the device twin of cpu::EmbedOps: whole sequences (an
// encoder's inputs, or a decoder embedder's prompts) with no KV cache, every token row of
// the step through the same products, attention over each sequence's own rows
// (bidirectional for encoders, causal for decoders; embed_attention.cu), and pooling on the
// device so only pooled floats come back. Host C++ (launchers in embed_kernels.h), so the
// executor that drives it builds with g++.
//
// It satisfies model::EncoderBackend (model/forward_encoder.h), hence model::ForwardBackend:
// the encoder forward and the decoder families' forward run over it unchanged.
//
// Activations. The Activations pointers this hands out are handles, not device memory:
// each names a row buffer [T x width] that lives on the device in f32, in F16, or both, and
// the ops convert lazily to what they read. Products with F16 weights are cuBLAS GEMMs of
// F16 rows (f32 accumulation) writing F16 rows, except into x (a decoder's f32 residual
// stream); other weight types go through PrefillMatmul (dequantized to bf16, cuBLAS; f32
// rows). Biases are folded into the next reader where one exists: q/k/v's into attention's
// loads, xb's (with the residual add() after it) into the LayerNorm that reads it, the FFN's
// with its GELU into the GEMM's epilogue (cublasLt, lt_gemm.h; a separate pass over the F16
// output where cublasLt is missing). LayerNorm writes F16 only: an encoder's rows stay F16
// between ops (each value rounded once per op, as the products' inputs are), and no pass
// converts them until pooling. Per layer of BERT: 6 GEMMs, attention and two LayerNorm
// passes.
// Measured tolerance: see tests/unit/engine/gpu_embed_test.cpp (cosine >= 0.9999 against
// the CPU executor, every pooling).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/embed_plan.h"
#include "backend/cuda/lt_gemm.h"
#include "backend/cuda/matmul.h"
#include "core/layer_spec.h"
#include "core/pooling.h"
#include "core/rope.h"
#include "core/step_batch.h"
#include "core/tensor_view.h"

namespace hablar::cuda {

// A reranker's classifier head on the device (cpu::ClassifierHead's twin): tanh(cls · x +
// cls_b) when cls is present, then cls_out · x + cls_out_b when it is. Views and vectors in
// device memory; null or data == nullptr: absent.
struct ClassifierHead {
  const WeightView* cls = nullptr;
  const float* cls_b = nullptr;
  const WeightView* cls_out = nullptr;
  const float* cls_out_b = nullptr;
};

class EmbedOps {
 public:
  // `profile`: device time per kind of op (events around each), summed over steps and
  // printed to stderr when the ops go away.
  explicit EmbedOps(cudaStream_t stream, bool profile = false);
  ~EmbedOps();
  EmbedOps(const EmbedOps&) = delete;
  EmbedOps& operator=(const EmbedOps&) = delete;

  // Head sizes the attention kernel takes (32, 64, 128).
  static bool supports_head_dim(int head_dim);

  // Starts a step over whole sequences (positions 0..n-1 each) and uploads its inputs.
  // `causal`: a token sees the tokens before it only (decoder embedders), else its whole
  // sequence. Buffers grow to the step's rows on first use (kept for later steps).
  void begin(std::span<const std::span<const int32_t>> sequences, const ActivationDims& dims,
             std::span<const RopeParams> ropes, float rms_eps, float norm_eps, bool causal);
  int64_t n_tokens() const { return plan_.n_tokens(); }
  const Activations& activations() const { return act_; }
  // Device memory the row buffers hold now.
  size_t buffer_bytes() const;

  // model::ForwardBackend.
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
  // Mixtures of experts have no embedding path on the device (throws kUnsupported).
  void moe_ffn(const ExpertsView& experts, const float* in, float* out);
  // A decoder's end: the final RMSNorm of x becomes the hidden rows (no classifier).
  void logits(const float* x, const float* norm_weight, const WeightView& output, float softcap);
  // (The hidden rows are the normed ones: a multiplier of the logits leaves them.)
  void scale_logits(float) {}
  void relu_squared(float* x, int64_t width);
  // phi2's end (model::LayerNormBackend): x, LayerNormed already, becomes the hidden rows.
  void classify(const float* x, const WeightView& output, const float* bias);
  // Copies rows to the host (synchronously; for debug dumps only).
  const float* host_rows(const float* rows, int64_t n, std::vector<float>& host);

  // Encoder ops (model/forward_encoder.h).
  void add_table_row(const WeightView& table, int64_t row, float* x);
  void add_position_rows(const WeightView& table, float* x);
  void layernorm(const float* x, const float* weight, const float* bias, float* out, int64_t width);
  void gelu(float* x, int64_t width);
  void linear(const WeightView& w, const float* bias, const float* in, float* out, bool gelu);
  void linear_qkv(const WeightView& wq, const float* bq, const WeightView& wk, const float* bk,
                  const WeightView& wv, const float* bv, const float* in, float* q, float* k,
                  float* v);
  void set_hidden(const float* x);

  // Pools the hidden rows as cpu::EmbedOps::pool does (same layout of out and row_begin),
  // on the device; waits for the step and copies the pooled floats back.
  void pool(std::span<const Pooling> pooling, const ClassifierHead& head, std::vector<float>& out,
            std::vector<int64_t>& row_begin);

 private:
  // A row buffer: f32 and F16 forms, each allocated on first use, and which are current.
  struct Rows {
    int64_t width = 0;
    bool f16_preferred = false;  // products write F16 here (their readers take F16)
    DeviceMemory m32, m16;
    bool has32 = false, has16 = false;
    // A projection's bias not yet added to the F16 form (q, k, v: attention adds it as it
    // reads them; any other reader gets it applied first, by rows_of()).
    const float* bias = nullptr;
    float* f32() const { return static_cast<float*>(m32.get()); }
    uint16_t* f16() const { return static_cast<uint16_t*>(m16.get()); }
  };
  enum Slot { kX, kXb, kQ, kK, kV, kAtt, kGate, kUp, kHidden, kScratch, kSlots };
  // The profile's kinds of op (constructor's `profile`).
  enum ProfileKind { kProducts, kAttention, kNorms, kProfileKinds };
  struct Profile;
  struct Timed;

  Rows& rows_of(const float* handle);  // with any pending F16 bias applied
  Rows& raw_rows_of(const float* handle);
  float* storage32(Rows& r);  // allocated for the step's rows, contents as they are
  uint16_t* storage16(Rows& r);
  float* ensure32(Rows& r);  // current in that form (converted from the other if need be)
  uint16_t* ensure16(Rows& r);
  float* write32(Rows& r);     // f32 form, to be overwritten: the F16 one goes stale
  uint16_t* write16(Rows& r);  // F16 form, to be overwritten: the f32 one goes stale
  void settle();               // applies a pending bias / residual
  // out = in · Wᵀ (+ bias, then GELU), into out's preferred form.
  void product(const WeightView& w, Rows& in, Rows& out, const float* bias, bool gelu);
  void gemm_f16(const WeightView& w, const uint16_t* in, int64_t m, void* out, bool out_f16);
  // out = GELU(in · Wᵀ + bias) in one cublasLt product; false when it cannot (nothing done).
  bool gemm_f16_gelu(const WeightView& w, const uint16_t* in, int64_t m, uint16_t* out,
                     const float* bias);
  // out [m x W.rows] f32 = in [m x W.cols] f32 · Wᵀ (the classifier head's products).
  void product_f32(const WeightView& w, const float* in, int64_t m, float* out);
  void upload_rope_tables(std::span<const RopeParams> ropes);
  void classify(const ClassifierHead& head, int32_t n_rank, std::vector<float>& result,
                int64_t& width);

  cudaStream_t stream_;
  CublasHandle cublas_;
  LtGemm lt_;
  // F16 copies of the biases fused into cublasLt epilogues, by the model's f32 bias pointer.
  std::unordered_map<const float*, DeviceBuffer<uint16_t>> bias16_;
  PrefillMatmul prefill_;
  ActivationDims dims_{};
  std::vector<RopeParams> ropes_;
  float rms_eps_ = 1e-5f, norm_eps_ = 1e-12f;
  bool causal_ = false;
  EmbedPlan plan_;
  std::array<Rows, kSlots> rows_;
  std::array<float, kSlots> handles_{};  // the Activations pointers point here
  Activations act_;
  Rows* hidden_ = nullptr;
  struct Pending {
    Rows* rows = nullptr;
    const float* bias = nullptr;
    Rows* residual = nullptr;
  } pending_;
  // Step inputs on the device: tokens, positions, sequence starts, tiles, a table row id.
  DeviceBuffer<int32_t> tokens_, positions_, seq_begin_, row_id_;
  DeviceBuffer<EmbedTile> tiles_;
  // RoPE angles per variant: [max positions][pairs] cos then sin.
  std::vector<DeviceBuffer<float>> rope_cos_, rope_sin_;
  int32_t rope_positions_ = 0;
  // Pooling: its plan's arrays (pooling, out_begin, rank_slot), the pooled floats, the
  // classifier's input, middle and output rows, F16 scratch of its products.
  std::array<DeviceMemory, 3> pool_inputs_;
  DeviceMemory pooled_, cls_in_, cls_mid_, cls_out_, f16_scratch_;
  std::unique_ptr<Profile> profile_;  // null unless profiling
};

}  // namespace hablar::cuda
