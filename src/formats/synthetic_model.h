// Synthetic models: GGUF files with the tensor names, shapes and metadata of real Llama-,
// Qwen- and Gemma-family models, filled with seeded random weights. They give benchmarks and tests
// production-shape models without downloads.
//
// Weights are scaled so activations stay finite through every layer: matrices are uniform
// with standard deviation 1/sqrt(row length) (a unit-variance input gives a unit-variance
// output), norm weights are 1 +- 0.1, biases +- 0.02.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/quant.h"
#include "formats/gguf.h"

namespace hablar::synth {

// The dimensions of a model, as in its public configuration.
struct ModelShape {
  std::string name;
  int64_t hidden = 0;      // embedding length
  int64_t n_layers = 0;    // transformer blocks
  int64_t n_heads = 0;     // query heads
  int64_t n_kv_heads = 0;  // key/value heads (grouped-query attention)
  int64_t head_dim = 0;    // per head; not always hidden / n_heads (Qwen3)
  int64_t ffn = 0;         // feed-forward (SwiGLU) inner length
  int64_t vocab = 0;       // synthetic vocabulary size (a real vocabulary overrides it)
  int64_t context = 0;     // training context length
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  bool tied_embeddings = false;  // output projection shares token_embd
  // Gemma only: the sliding window of its local layers, and the period of global ones
  // (every sliding_period-th layer attends globally).
  int64_t sliding_window = 512;
  int64_t sliding_period = 6;
  // Mixture-of-experts architectures only: experts, experts per token, each one's FFN width.
  int64_t n_experts = 8;
  int64_t n_experts_used = 2;
  int64_t ffn_expert = 0;  // 0: ffn
  // Rotated values per head (<arch>.rope.dimension_count); 0: every value, except phi2's
  // partial rotation (2/5 of each head, rounded to an even count).
  int64_t rope_dims = 0;
};

// tiny, smollm2-135m, qwen2.5-0.5b, qwen2.5-1.5b, qwen3-0.6b, llama3-8b, gemma2-2b,
// gemma3-270m, gemma3-1b.
const std::vector<ModelShape>& known_shapes();
std::optional<ModelShape> shape_from_name(std::string_view name);

// kMixtral writes a llama file with experts (as Mixtral GGUFs are); kQwen3Moe a qwen3moe one.
// kPhi3 writes fused attn_qkv and gate-up (ffn_up of 2 x ffn rows) tensors, as Phi-3 GGUFs do.
// kQwen2Moe adds the shared expert (ffn_*_shexp) with its gate vector.
// kPhi2 writes LayerNorms with biases, q/k/v, output, MLP (ffn_up, ffn_down) and classifier
// with biases, as llama.cpp's converter writes Phi-2.
// kBert and kNomicBert write encoders (llama.cpp's tensor names: token types, LayerNorms with
// biases; bert absolute positions and GELU, nomic-bert fused qkv, RoPE and SwiGLU).
enum class Arch {
  kLlama,
  kQwen2,
  kQwen3,
  kGemma,
  kGemma2,
  kGemma3,
  kGemmaEmbedding,  // Gemma 3's tensors plus the dense_2 / dense_3 projections, mean pooling
  kMixtral,
  kQwen3Moe,
  kPhi3,
  kQwen2Moe,
  kPhi2,
  kSmolLM3,       // llama's tensors; llama.cpp leaves every fourth layer unrotated
  kGranite,       // llama's tensors and Granite 3's four multipliers
  kGraniteMoe,    // granite's multipliers, experts as wide as the FFN
  kErnie45,       // llama's tensors under ernie4_5 (ERNIE 4.5 0.3B)
  kOlmo2,         // OLMo 3's layout: post-norms only, q/k norms over whole rows, sliding windows
  kStarCoder2,    // LayerNorms with biases, biased projections, an ungated GELU MLP
  kExaone4,       // OLMo 2's post-norm layout with per-head q/k norms
  kHunyuanDense,  // qwen3's tensors, Hunyuan's NTK alpha (its q/k norms follow RoPE)
  kGlm4,          // sandwich norms, q/k/v biases, a fused gate-up, half the head rotated
  kArcee,         // llama's tensors without ffn_gate (an ungated relu^2 MLP)
  kMistral3,      // llama's tensors, YaRN and the query temperature past a short floor
  kExaone,        // llama's tensors under exaone (EXAONE 3 / 3.5; NeoX RoPE)
  kXverse,        // llama's tensors under xverse
  kInternlm2,     // llama's tensors under internlm2
  kSeedOss,       // llama's tensors with q/k/v biases, the FFN norm named post_attention_norm
  kOlmoe,         // llama's tensors, q/k norms over whole rows, experts as wide as the FFN
  kMiniCpm,       // llama's tensors; MiniCPM's default multipliers (no keys written)
  kOrion,         // starcoder2's LayerNorms, no projection biases, a SwiGLU MLP
  kNemotron,      // starcoder2's LayerNorms, no projection biases, relu^2, half the head rotated
  kStableLm,      // Orion's tensors with q/k/v biases; a quarter of each head rotated
  kCommandR,      // one LayerNorm (weight only) a block, SwiGLU, token_embd as classifier
  kCohere2,       // command-r's tensors; three of four layers sliding (window 8 here)
  kBert,
  kNomicBert
};
inline bool is_encoder(Arch a) {
  return a == Arch::kBert || a == Arch::kNomicBert;
}
std::optional<Arch> arch_from_name(std::string_view name);
std::string_view arch_name(Arch arch);  // as GGUF general.architecture spells it

struct SyntheticModelOptions {
  Arch arch = Arch::kLlama;
  ModelShape shape;
  std::string type = "f16";  // a type with a quantizer, or a mix (q4_k_m, q5_k_m)
  std::string vocab_path;    // a GGUF whose tokenizer.* keys are copied; "" for synthetic
  uint64_t seed = 0;
  // RoPE scaling metadata ("" for none; linear, yarn): <arch>.rope.scaling.type, factor and
  // original_context_length. "longrope" (phi3): original_context_length, attn_factor and
  // seeded rope_factors_short / rope_factors_long tensors, as a Phi-3 128k file has them.
  std::string rope_scaling;
  double rope_factor = 1.0;
  int64_t rope_original_context = 0;  // 0: the shape's context
  // > 0: the attention window. llama (Mistral-style): <arch>.attention.sliding_window on every
  // layer; gemma2/gemma3: replaces the shape's window. 0: the shape's (llama: none).
  int64_t sliding_window = 0;
  int n_threads = 0;  // 0: one per hardware thread
  // The reference quantizers of K-quant and IQ4 types search scales and cost ~100 ns a
  // value, minutes for a 1.5B model. Tensors of those types with at least
  // pool_min_tensor_blocks blocks are therefore assembled from seeded random picks out of a
  // pool of pool_blocks blocks (one pool per type and value distribution, shared by every
  // layer), each generated and quantized with quantize_row. exact_quantization quantizes
  // every row instead.
  int64_t pool_blocks = 1 << 14;
  int64_t pool_min_tensor_blocks = 1024;
  bool exact_quantization = false;
  // Embedding metadata: <arch>.pooling_type ("" : mean for encoders, none written for
  // decoders; none, mean, cls, last, rank). rank_head adds a reranker's classifier head
  // (cls.weight / cls.bias, cls.output.weight / cls.output.bias, one label) to an encoder.
  std::string pooling;
  bool rank_head = false;
};

// One tensor of the planned file. dims[0] is the row length, as GGUF stores it.
struct PlannedTensor {
  enum class Init { kMatrix, kNorm, kBias };
  std::string name;
  std::vector<int64_t> dims;
  DType type;
  Init init;
  int64_t n_elements() const {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
};

// The tensors of the model in file order, with the type each gets under the mix.
std::vector<PlannedTensor> plan_tensors(Arch arch, const ModelShape& shape, int64_t vocab_size,
                                        const QuantMix& mix, bool rank_head = false);

// Writes the model to `path` (through a temporary name). Throws Error naming the fault
// (unknown type, row length a type cannot hold, unreadable vocabulary, I/O).
struct SyntheticModelSummary {
  int64_t vocab_size = 0;
  int64_t n_params = 0;
  uint64_t n_bytes = 0;  // tensor data bytes
  size_t n_tensors = 0;
};
SyntheticModelSummary write_synthetic_model(const SyntheticModelOptions& options,
                                            const std::string& path);

// The same model built in memory (tests; small shapes only).
gguf::GgufWriter build_synthetic_model(const SyntheticModelOptions& options,
                                       SyntheticModelSummary* summary = nullptr);

}  // namespace hablar::synth
