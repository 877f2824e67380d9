// A loaded decoder-only transformer (the Llama family: llama, qwen2, qwen3, their MoE forms,
// phi3; the Gemma
// family: gemma2, gemma3): what the file describes, apart from any device that runs it.
//
//   ModelConfig — the blueprint (hyperparameters read from GGUF metadata);
//   Weights     — typed views into the mapped file, every shape and type checked at load;
//   Tokenizer   — the vocabulary and its encoder/decoder.
// The computation is described once in model/forward.h; executors (engine/cpu_executor.h,
// engine/cuda_executor.h) own a device's weights, KV cache and scratch and run it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/kv_layout.h"
#include "core/layer_spec.h"
#include "core/pooling.h"
#include "core/rope.h"
#include "core/step_batch.h"
#include "formats/gguf.h"
#include "formats/hf_model.h"
#include "tokenizer/tokenizer.h"

namespace hablar::model {

// The architectures hablar runs, in three decoder families with a forward each
// (model/forward.h): the Llama family (llama, qwen2, qwen3, their MoE forms and phi3 differ by
// flags and per-layer specs), the Gemma family, and phi2's parallel LayerNorm block.
enum class Arch {
  kLlama,
  kQwen2,
  kQwen2Moe,
  kQwen3,
  kQwen3Moe,
  kPhi3,
  kPhi2,          // Phi-1, 1.5 and 2: attention and a GELU MLP side by side on one LayerNorm
  kSmolLM3,       // the llama block; every fourth layer attends without RoPE
  kGranite,       // the llama block with four multipliers (embedding, attention, residual, logits)
  kGraniteMoe,    // Granite 3 MoE: Granite's block with a mixture of experts
  kOlmo2,         // OLMo 2 / 3: norms after attention and FFN only, q/k normed over whole rows
  kStarCoder2,    // LayerNorms with biases, biased projections, a GELU MLP (no gate)
  kExaone4,       // EXAONE 4: OLMo 2's post-norm block with per-head q/k norms
  kHunyuanDense,  // Hunyuan dense: the llama block, q/k normed per head after RoPE
  kGlm4,          // GLM-4 (0414): sandwich norms as Gemma 2's, SwiGLU, q/k/v biases
  kArcee,         // Arcee (AFM): the llama block with an ungated relu^2 MLP
  kMistral3,      // Mistral 3 (Ministral 3): the llama block, YaRN and a query temperature
  kSeedOss,       // Seed-OSS: the llama block with q/k/v biases, its FFN norm named post_attention
  kOlmoe,         // OLMoE: the llama block, q/k normed over whole rows, a mixture of experts
  kMiniCpm,       // MiniCPM: Granite's multipliers, with defaults where older files have none
  kOrion,         // Orion: starcoder2's LayerNorm block with a SwiGLU MLP, no biases
  kNemotron,      // Nemotron: starcoder2's LayerNorm block with a relu^2 MLP
  kStableLm,      // StableLM 2: Orion's block with q/k/v biases and a quarter of each head rotated
  kCommandR,      // Command R, Aya: one bias-free LayerNorm feeding attention and SwiGLU
  kCohere2,       // Command R7B, Command A: Command R's block, 3 of 4 layers sliding
  kGemma,         // Gemma 1: the llama block with Gemma's embedding scale and GeGLU
  kGemma2,
  kGemma3,
  kGemmaEmbedding,  // EmbeddingGemma: Gemma 3's blocks attending both ways, an embedder only
  kBert,
  kNomicBert
};
std::string_view arch_name(Arch arch);
std::string supported_arch_names();  // "llama, qwen2, qwen2moe, ..." for error messages
// The post-norm families (model/forward.h's forward_post_norm): OLMo 2 / 3 and EXAONE 4.
inline bool is_post_norm_family(Arch arch) {
  return arch == Arch::kOlmo2 || arch == Arch::kExaone4;
}
// The families whose norms are LayerNorms with a bias (model::LayerNormBackend's ops).
inline bool uses_layer_norm(Arch arch) {
  return arch == Arch::kPhi2 || arch == Arch::kStarCoder2 || arch == Arch::kCommandR ||
         arch == Arch::kCohere2 || arch == Arch::kOrion || arch == Arch::kNemotron ||
         arch == Arch::kStableLm;
}
// Command R's parallel block (forward_cohere): command-r and cohere2.
inline bool is_cohere_family(Arch arch) {
  return arch == Arch::kCommandR || arch == Arch::kCohere2;
}
inline bool is_gemma_family(Arch arch) {
  return arch == Arch::kGemma2 || arch == Arch::kGemma3 || arch == Arch::kGemmaEmbedding;
}
// The blocks with a norm before and after attention and the FFN (forward_sandwich).
inline bool has_sandwich_norms(Arch arch) {
  return is_gemma_family(arch) || arch == Arch::kGlm4;
}
// The encoder family (model/forward_encoder.h): BERT and nomic-bert.
inline bool is_encoder_family(Arch arch) {
  return arch == Arch::kBert || arch == Arch::kNomicBert;
}

struct ModelConfig {
  std::string arch;  // general.architecture: "llama", "qwen2" or "qwen3"
  Arch arch_kind = Arch::kLlama;
  int n_layers = 0;                 // <arch>.block_count
  int n_embd = 0;                   // hidden size
  int n_heads = 0;                  // query heads
  int n_kv_heads = 0;               // key/value heads (GQA when < n_heads)
  int head_dim = 0;                 // <arch>.attention.key_length, default n_embd / n_heads
  int n_ff = 0;                     // FFN hidden size
  int n_vocab = 0;                  // rows of token_embd
  int n_ctx_train = 0;              // <arch>.context_length
  float rms_eps = 1e-5f;            // <arch>.attention.layer_norm_rms_epsilon (phi2: LayerNorm's)
  RopeParams rope{};                // llama: normal pairs; qwen2/qwen3: NeoX; scaling from metadata
  bool tied_output = false;         // no output.weight: the classifier reuses token_embd
  bool qkv_bias = false;            // qwen2: q/k/v projections have biases
  bool qk_norm = false;             // qwen3, gemma3: per-head RMSNorm on q and k before RoPE
  bool qk_norm_after_rope = false;  // hunyuan-dense: that norm after RoPE
  bool qk_norm_rows = false;        // olmo2, olmoe: q and k RMS-normed over whole rows instead
  bool ffn_relu_squared = false;    // arcee: FFN = W_down · relu(W_up·n)^2 (no gate)

  // Per layer: attention scale and window, RoPE variant (index into `ropes`; ropes[0] is
  // `rope`). Llama family: every layer global with scale 1/sqrt(head_dim) and ropes = {rope}.
  std::vector<LayerSpec> layers;
  std::vector<RopeParams> ropes;
  // LongRoPE (Phi-3 128k): the file's per-pair factor sets (empty: none). `ropes` carries the
  // short ones; ropes_for_context picks by the context an executor runs with.
  std::vector<float> rope_factors_short, rope_factors_long;
  GluActivation ffn_activation = GluActivation::kSilu;
  // q multiplied by query_scale before attention, whose own scale is then 1 (Gemma, Phi-3:
  // llama.cpp scales q so, and rounds the product to half before q·k).
  // Gemma family: the embedding rows are multiplied by embed_scale (sqrt(n_embd)); norms also
  // follow the attention and FFN outputs (post_norms); logits soft-capped when final_softcap > 0
  // (Gemma 2: softcap * tanh(logit / softcap)).
  float embed_scale = 1.0f;
  float query_scale = 0.0f;  // 0: none (the attention scales)
  bool post_norms = false;
  float final_softcap = 0.0f;
  // Granite: each block's output (attention, FFN) times residual_scale before it joins the
  // residual (0: none). The logits are multiplied by logits_factor (1: none; Granite: 1 /
  // its logit_scale, Cohere: its logit_scale).
  float residual_scale = 0.0f;
  float logits_factor = 1.0f;
  // Mistral 3: q multiplied by a factor that grows with the position after RoPE
  // (<arch>.attention.temperature_scale; off when absent or 0).
  PositionScale query_temperature{};

  // Mixture of experts (Mixtral: llama with <arch>.expert_count; qwen3moe): n_experts > 0
  // replaces every layer's FFN by a router over n_experts SwiGLU experts of width n_ff_expert,
  // each token taking its n_experts_used likeliest (softmax over all, renormalized over the
  // chosen, as both families' reference configurations do).
  int n_experts = 0;
  int n_experts_used = 0;
  int n_ff_expert = 0;
  bool experts_normalized = true;  // Qwen2-MoE: the chosen experts' probabilities as they are
  int n_ff_shared = 0;             // Qwen2-MoE: the shared expert's width (0: none)

  // Embeddings. Encoders (bert, nomic-bert) attend both ways over the whole input
  // (<arch>.attention.causal false) and keep no KV cache; their norms are LayerNorms with a
  // bias (epsilon <arch>.attention.layer_norm_epsilon), after each block. `pooling` is the
  // file's <arch>.pooling_type (any architecture; nullopt when absent); n_cls_out the
  // classifier head's outputs for rank pooling (<arch>.classifier.output_labels, else 1
  // when the file has cls tensors, 0 without a head).
  bool encoder = false;
  bool causal = true;
  // Embeds only (encoders, gemma-embedding): no text generation, no KV cache.
  bool embedding_only = false;
  float norm_eps = 1e-12f;
  int n_token_types = 0;  // tokenizer.ggml.token_type_count (rows of token_types)
  std::optional<Pooling> pooling;
  int n_cls_out = 0;

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
};

// Reads the configuration of a GGUF model; throws Error naming the key or the unsupported
// architecture (listing the supported ones).
ModelConfig config_from_gguf(const gguf::GgufFile& file);
// The embedding part of the configuration (config_encoder.cpp): pooling, causality, the
// encoders' LayerNorm epsilon, token types and classifier head. Called by config_from_gguf.
void read_embedding_config(const gguf::GgufFile& file, ModelConfig& c);

// One sequence's share of a forward step (core/step_batch.h).
using hablar::SequenceChunk;

struct Weights;  // weights.h

// The longest context the model runs (0: no limit known): its trained context
// (<arch>.context_length), or, with a RoPE scaling in the file (linear, llama3, YaRN), the
// larger of that and the scaling's original context times its factor.
int32_t max_context(const ModelConfig& c);
// n_ctx checked against max_context: a larger value throws Error(kInvalidArgument) naming
// `flag`, the trained context and the scaling (none, or what it allows).
void check_context(const ModelConfig& c, int64_t n_ctx, const std::string& flag);
// The context a command runs with: `requested` when > 0 (checked), else `fallback` capped at
// max_context.
int32_t context_for(const ModelConfig& c, int32_t requested, int32_t fallback,
                    const std::string& flag);

// The window every layer's attention slides through when all of them slide (the largest, so
// a position before it is read by no layer); 0 when any layer attends globally.
int32_t kv_window(const ModelConfig& c);

// The RoPE variants to run with when each sequence may hold n_ctx positions: `ropes`, with
// LongRoPE's long factors when min(n_ctx, max_context) exceeds rope.original_context and its
// short ones otherwise (llama.cpp's choice by its per-sequence context).
std::vector<RopeParams> ropes_for_context(const ModelConfig& c, int64_t n_ctx);

class Model {
 public:
  // Maps the file; checks every tensor's shape and type against the metadata. An unsupported
  // architecture or tensor type gives an Error listing what is supported.
  // `path`: a .gguf file or a Hugging Face directory (formats/hf_model.h), which `options`
  // may convert at load.
  static std::unique_ptr<Model> load(const std::string& path,
                                     const formats::HfOpenOptions& options = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
  const gguf::GgufFile& file() const { return file_; }
  const Weights& weights() const { return *weights_; }

  // K of type `dtype`, V of v_dtype (when given, else dtype). Throws for a quantized type
  // whose 32-value blocks do not tile head_dim.
  KvCacheLayout kv_layout_for(int n_blocks, int block_size = kDefaultKvBlockSize,
                              KvDType dtype = KvDType::F16,
                              std::optional<KvDType> v_dtype = std::nullopt) const;
  // Bytes of KV cache one token position takes (every layer, K and V).
  size_t kv_bytes_per_token(KvDType dtype = KvDType::F16,
                            std::optional<KvDType> v_dtype = std::nullopt) const;

  // Bytes of weights read by one decode step (every matrix once), for speed-of-light figures.
  size_t weight_bytes_per_token() const;

 private:
  explicit Model(gguf::GgufFile file);

  gguf::GgufFile file_;
  ModelConfig config_;
  std::unique_ptr<Weights> weights_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
};

// Throws Error(kInvalidArgument) unless every chunk of a step fits the model and the cache:
// tokens present and inside the vocabulary, a start position >= 0, block tables long enough
// with ids inside the cache. Every executor checks its input with it.
void check_step(const ModelConfig& config, std::span<const SequenceChunk> chunks,
                const KvCacheLayout& layout);

}  // namespace hablar::model
