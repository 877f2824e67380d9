// The CUDA backend's side of the model seam: the ops model/forward.h calls, over device
// activation rows [T x width] and a device paged KV cache. Host C++ (no device code here),
// so the executor that drives it builds with g++.
//
// Every token of the step is one slot of decode_attention() (attention.h): its K/V are
// stored at its own position through its sequence's block table (by the RoPE pass), then
// each query attends over positions [0, pos], so prefill chunks and decode tokens of any mix
// of sequences take one path; outside graphs and deterministic mode, prompt chunks of 32 or
// more tokens take prefill_attention() instead when attention_plan.h's rule says so (each
// K/V tile read once per query tile, not once per token). Products: Q4_K weights up to 256 rows on
// int8 activations (dp4a, integer tensor cores); other types M <= 8 rows on the f32 CUDA-core
// kernel, more rows on tensor cores (matmul_fused up to 256, then dequantize + cuBLAS).
//
// Deterministic mode (`--deterministic`): the CPU backend's values, bit for bit
// (cpu_rounding_ops.h): products on activations quantized as the CPU quantizes them and
// summed in its orders, its RMSNorm, SwiGLU, embedding lookup and attention. A token's values
// depend neither on the rest of the step nor on how its prompt was chunked (batched = single),
// and greedy outputs are the CPU's. Soft-caps use the device's tanhf (within an ulp of the
// CPU's).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/cuda/attention_plan.h"
#include "backend/cuda/decode_attention_params.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/persistent_step.h"
#include "core/kv_layout.h"
#include "core/layer_spec.h"
#include "core/rope.h"
#include "core/rope_angle_cache.h"
#include "core/step_batch.h"
#include "core/tensor_view.h"

namespace hablar::cuda {

struct ForwardLimits {
  int32_t max_tokens = 512;        // token rows of one step
  int32_t max_blocks_per_seq = 0;  // block-table entries of one sequence (its context / block)
  bool deterministic = false;
};

class ForwardOps {
 public:
  // `ropes`: the model's RoPE variants (ModelConfig::ropes), all of one n_dims.
  ForwardOps(const ActivationDims& dims, const KvCacheLayout& layout, void* kv_cache,
             std::span<const RopeParams> ropes, float rms_eps, const ForwardLimits& limits,
             cudaStream_t stream);
  ~ForwardOps();
  // Device memory the step buffers take (activations, inputs, attention workspace).
  size_t workspace_bytes() const;
  // The KV cache the steps write and read (allocated after the step buffers, from what is
  // left); the layout's shape must be the one given at construction.
  void bind_cache(void* kv_cache, const KvCacheLayout& layout);
  // The products' activation workspace for the largest of these matrices: outside
  // deterministic mode Q4_K products of up to 256 rows run on int8 activations (matmul.h:
  // dp4a and integer tensor cores); in it, every quantized product takes the CPU's rows.
  void reserve_product_workspace(std::span<const WeightView* const> matrices);
  // bf16 copies of these matrices, made now and kept for the products of prompt chunks
  // beyond the batched range (matmul.h: PrefillMatmul::keep_bf16); counted in
  // workspace_bytes(). Each (Wq, Wk, Wv) of `qkv` is kept as one stack, so that their
  // products are one GEMM (stacked_qkv).
  void keep_bf16_weights(std::span<const WeightView* const> matrices,
                         std::span<const std::array<const WeightView*, 3>> qkv = {});
  size_t kept_bf16_bytes() const;

  // Starts a step: flattens the chunks into T token rows and uploads the step's inputs
  // (tokens, positions, RoPE angles, block tables, logit rows) in one asynchronous copy.
  // Logit rows are produced in `logit_order`: indices into the list of logit rows in chunk
  // order (one per token of an all_logits chunk, else one per chunk).
  void begin(std::span<const SequenceChunk> chunks, std::span<const int32_t> logit_order);
  // begin() in two halves, for CUDA graphs: stage() fills the pinned inputs (padded with
  // inactive tokens up to pad_to rows, and then sized for any context, when pad_to > 0);
  // upload() copies them to the device. A graph captured after stage() replays for any
  // later step staged with the same pad_to, once its inputs are uploaded.
  void stage(std::span<const SequenceChunk> chunks, std::span<const int32_t> logit_order,
             int64_t pad_to);
  void upload();
  int64_t n_tokens() const { return n_tokens_; }
  const Activations& activations() const { return act_; }

  void embed(const WeightView& table, float* x);
  void rmsnorm(const float* x, const float* weight, float* out, int64_t width);
  // rmsnorm whose rows only the next op's products of `readers` read (model::norm_for_products):
  // where all of them multiply kept bf16 copies, only the bf16 rows are written (not out's f32
  // values: out is then marked bf16_only, and an f32 product of it is refused).
  void rmsnorm_for_products(const float* x, const float* weight, float* out, int64_t width,
                            std::span<const WeightView* const> readers);
  void matmul(const WeightView& w, const float* in, float* out);
  void matmul_qkv(const WeightView& wq, const WeightView& wk, const WeightView& wv, const float* in,
                  float* q, float* k, float* v);
  // x += s · (in · Wᵀ) (s == 0: unscaled); tmp [T x W.rows] is scratch (model::residual_product).
  // Over W's kept bf16 copy one GEMM accumulates into x, so the next norm neither reads the
  // product's rows nor writes x back; otherwise matmul into tmp, then the queued add.
  void matmul_add(const WeightView& w, const float* in, float* tmp, float* x, float s);
  void matmul_glu(const WeightView& gate, const WeightView& up, const float* in, float* out,
                  float* up_scratch, GluActivation act);
  void add_bias(float* x, const float* bias, int64_t width);
  void scale(float* x, float s, int64_t width);
  void scale_by_position(float* x, int64_t width, const PositionScale& ps);
  void head_rmsnorm(float* x, const float* weight, int n_heads);
  void rope(float* x, int n_heads, int variant);
  void attention(int layer, const AttentionSpec& spec, const float* q, const float* k,
                 const float* v, float* out);
  // attention whose rows only the next op's products of `readers` read
  // (model::attention_for_products): where all of them multiply kept bf16 copies, the kernels
  // write only the bf16 rows those read (out marked bf16_only).
  void attention_for_products(int layer, const AttentionSpec& spec, const float* q, const float* k,
                              const float* v, float* out,
                              std::span<const WeightView* const> readers);
  void add(float* x, const float* y, int64_t width);
  // Step buffers of a mixture-of-experts model (before its first moe_ffn): n_experts experts
  // of width n_ff_expert, n_used per token, a shared expert of width n_ff_shared (0: none).
  void reserve_moe(int n_experts, int n_used, int64_t n_ff_expert, int64_t n_ff_shared);
  // The router's product and routing on the device, the step's (token, slot) entries grouped
  // by expert, each chosen expert's SwiGLU over its gathered rows, then the weighted sum in
  // slot order and Qwen2-MoE's gated shared expert (moe.h). out may be in. The experts'
  // products are sized on the device (moe::grouped_product: no host round trip, so such
  // steps can be CUDA graphs) when moe_sized_on_device(); otherwise the per-expert row
  // counts come to the host (one synchronization per MoE layer) and each chosen expert runs
  // through the products above (deterministic mode: the CPU's one-token order, F16 experts
  // in the CPU's expert order).
  void moe_ffn(const ExpertsView& experts, const float* in, float* out);
  // Outside deterministic mode, with each matrix's experts at one stride (one 3-D tensor),
  // for steps of up to moe_device_max_tokens() tokens.
  bool moe_sized_on_device(const ExpertsView& experts) const;
  int64_t moe_device_max_tokens() const;
  void logits(const float* x, const float* norm_weight, const WeightView& output, float softcap);
  // The step's logits *= s (Granite).
  void scale_logits(float s);
  // x = max(x, 0)^2 (Arcee's ungated MLP).
  void relu_squared(float* x, int64_t width);
  // phi2's ops (model::LayerNormBackend; forward_ops_layernorm.cu): LayerNorm with a bias per
  // row, GELU-tanh in place, and logits() without the norm plus a bias per vocabulary entry.
  // Deterministic mode computes them as the CPU does (cpu_rounding_ops).
  void layernorm(const float* x, const float* weight, const float* bias, float* out, int64_t width);
  void gelu(float* x, int64_t width);
  void classify(const float* x, const WeightView& output, const float* bias);
  // One-time work done so far (scratch growths of the prefill products).
  int64_t one_time_events() const;
  // Device logits [n_logit_rows x n_vocab] in logit_order.
  float* device_logits() const { return logits_; }
  // The staged step's token ids on the device ([n_tokens()], uploaded by upload()).
  int32_t* device_tokens() const;
  int32_t n_logit_rows() const { return n_logit_rows_; }
  // The attention's context bound for the staged step: its longest context, or for a graph
  // step (stage with pad_to) the bound its graph is sized for (decode_graph_context_bound).
  int32_t context_bound() const { return max_context_; }
  // The staged step's first token (its position, block table and RoPE angles, as device
  // pointers the uploads refill) and the model's shapes: what the persistent decode step of
  // one token reads (persistent_step.h).
  PersistentStepContext persistent_context() const;
  // Copies device rows to the host (synchronously; for debug dumps only).
  // Runs any queued work first.
  const float* host_rows(const float* rows, int64_t n, std::vector<float>& host);

 private:
  // `roles`: the tokens' roles (device) for deterministic mode; the step's by default.
  void product(const WeightView& w, const float* in, int64_t m, float* out,
               const uint8_t* roles = nullptr);
  void reserve_f16_products(std::span<const WeightView* const> matrices);
  bool takes_f16_path(const WeightView& w, int64_t m) const;
  bool takes_int8_path(const WeightView& w, int64_t m) const;
  // Whether steps of m rows multiply the kept bf16 copies of W (keep_bf16_weights), and
  // whether this W has one.
  bool kept_bf16_at(int64_t m) const;
  bool takes_kept_bf16_path(const WeightView& w, int64_t m) const;
  // Whether every one of `ws` takes its kept copy at this step's size (the readers of a
  // writer that may then leave its rows as bf16 alone).
  bool all_take_kept_copies(std::span<const WeightView* const> ws) const;
  bool glu_in_bf16(const WeightView& gate, const WeightView& up) const;
  void glu_over_kept_copies(const WeightView& gate, const WeightView& up, const float* in,
                            float* out, float* up_scratch, GluActivation act);
  // Runs w's product over its kept bf16 copy (cuBLAS), converting `in` to bf16 rows first
  // unless *converted says this step's products of `in` already did.
  void kept_bf16_product(const WeightView& w, const float* in, int64_t m, float* out,
                         bool* converted);
  // Two products of one shape over kept copies in one launch (PrefillMatmul::multiply_kept_pair).
  void kept_bf16_pair(const WeightView& wa, const WeightView& wb, const float* in, int64_t m,
                      float* out_a, float* out_b, bool* converted);
  // Runs w's product on f16 tensor cores, converting `in` to f16 rows first unless
  // *converted says this step's products of `in` already did.
  void f16_product(const WeightView& w, const float* in, int64_t m, float* out, bool* converted);
  bool writer_quantizes(int64_t m, int64_t width) const;
  bool writer_converts(int64_t m, int64_t width) const;
  bool writer_writes_bf16(int64_t m, int64_t width) const;
  bool writers_f16_at(int64_t m) const;
  Q8Activations int8_rows(const float* in, int64_t m, int64_t k, bool* quantized);
  bool stacked_qkv(const float* in, int64_t m, std::span<const WeightView* const> ws,
                   std::span<float* const> outs, bool* converted);
  void products_of_one_input(const float* in, int64_t m, std::span<const WeightView* const> ws,
                             std::span<float* const> outs);
  // Element-wise work is queued (biases and RoPE of q/k/v, a residual add) and fused into
  // one launch or into the next norm; every other op runs what is queued first.
  void flush_row_work();
  // Lets the queued RoPE/bias pass also store the step's keys k and values v (whole rows of
  // n_kv_heads heads) in layer's cache, adding a copy-only entry for a buffer with no queued
  // work; false (nothing changed) when the queued work cannot take them.
  bool store_kv_in_row_work(int layer, const float* k, const float* v);
  // Whether this layer's attention runs the step's prompt chunks on the flash prefill kernel
  // (head_dim 64 or 128, no window, no soft-cap), and that run (with the decode attention
  // for the step's other rows).
  bool takes_prefill_attention(const AttentionSpec& spec) const;
  // The decode attention's parameters over the step's rows, with the row flags at word offset
  // `active_at` of the inputs.
  DecodeAttentionParams decode_params(int layer, const AttentionSpec& spec, const float* q,
                                      const float* k, const float* v, float* out,
                                      size_t active_at) const;
  // Splits the staged step's rows between the flash prefill and the decode attention.
  void plan_attention(std::span<const StepChunkRows> chunk_rows, int64_t pad_to);
  // attention's body; bf16_only: the output as the kept-copy products' bf16 rows alone.
  void attention_rows(int layer, const AttentionSpec& spec, const float* q, const float* k,
                      const float* v, float* out, bool bf16_only);
  // out or out_bf16 may be null (not both).
  void attention_with_prefill_chunks(int layer, const AttentionSpec& spec, const float* q,
                                     const float* k, const float* v, float* out, uint16_t* out_bf16,
                                     bool kv_stored);
  void flush_add();
  void flush();
  // rmsnorm's body; f32_out false: the bf16 rows alone (rmsnorm_for_products).
  void norm_rows(const float* x, const float* weight, float* out, int64_t width, bool f32_out);
  // The step's logit rows of x [T x n_embd] gathered into out_rows_ (logit_order).
  void gather_logit_rows(const float* x);
  // One expert's product of m gathered rows (deterministic: the CPU's order for experts).
  void expert_product(const WeightView& w, const float* in, int64_t m, float* out);
  void expert_products_sized_on_host(const ExpertsView& experts, int64_t n_entries);
  // strides: the gate, up and down experts' (all at one stride each).
  void expert_products_sized_on_device(const ExpertsView& experts, const float* in,
                                       std::array<size_t, 3> strides);
  struct Buffers;
  struct MoeBuffers;

  ActivationDims dims_;
  KvCacheLayout layout_;
  void* kv_cache_;
  std::vector<RopeParams> ropes_;
  std::vector<RopeAngleCache> angle_caches_;  // one per variant: each position's angles once
  int32_t rope_pairs_ = 0;                    // n_dims / 2 of every variant
  float eps_;
  ForwardLimits limits_;
  cudaStream_t stream_;
  std::unique_ptr<Buffers> buf_;
  std::unique_ptr<MoeBuffers> moe_;
  Activations act_;
  float* out_rows_ = nullptr;  // [R x n_embd] the rows that need logits, final-normed
  float* logits_ = nullptr;
  int64_t n_tokens_ = 0;
  // The step size from which the norms write f16 rows (reserve_f16_products).
  int64_t writers_f16_from_ = INT64_MAX;
  int32_t n_logit_rows_ = 0;
  int32_t max_context_ = 0;  // the longest context (position + 1) of the step
  // Every chunk of the step is one token (a decode step): a sequence's earlier positions
  // were all stored by earlier steps (DecodeAttentionParams::prior_rows_settled).
  bool one_token_rows_ = false;
  size_t table_width_ = 1;  // block-table entries of each row written and uploaded (stage())
  // Prompt chunks of the step on the flash prefill attention (stage()), their longest, and
  // the rows left to the decode attention.
  int32_t n_prefill_chunks_ = 0, prefill_max_chunk_ = 0;
  int64_t n_decode_rows_ = 0;
};

}  // namespace hablar::cuda
