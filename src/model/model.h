// A loaded transformer model of the Llama family (llama, qwen2, qwen3) and its CPU forward pass.
//
// Three kinds of state are kept apart:
//   ModelConfig — the blueprint (hyperparameters read from GGUF metadata);
//   Weights     — typed views into the mapped file, every shape and type checked at load;
//   KvCache     — the paged F16 key/value memory (src/core/kv_layout.h), owned by the caller,
//                 plus per-call activations held by the Model as scratch.
// One forward() serves a batch of sequences at different positions: some prefilling a chunk
// of their prompt, some decoding one token. A sequence's logits do not depend on the other
// sequences of the batch (batch invariance), which continuous batching relies on.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/kv_layout.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"

namespace hablar {
class ThreadPool;
}

namespace hablar::model {

// The architectures one forward serves; each differs from llama only by flags.
enum class Arch { kLlama, kQwen2, kQwen3 };
std::string_view arch_name(Arch arch);
std::string supported_arch_names();  // "llama, qwen2, qwen3" for error messages

struct ModelConfig {
  std::string arch;  // general.architecture: "llama", "qwen2" or "qwen3"
  Arch arch_kind = Arch::kLlama;
  int n_layers = 0;          // <arch>.block_count
  int n_embd = 0;            // hidden size
  int n_heads = 0;           // query heads
  int n_kv_heads = 0;        // key/value heads (GQA when < n_heads)
  int head_dim = 0;          // <arch>.attention.key_length, default n_embd / n_heads
  int n_ff = 0;              // FFN hidden size
  int n_vocab = 0;           // rows of token_embd
  int n_ctx_train = 0;       // <arch>.context_length
  float rms_eps = 1e-5f;     // <arch>.attention.layer_norm_rms_epsilon
  cpu::RopeParams rope{};    // llama: normal pairs; qwen2/qwen3: NeoX; scaling from metadata
  bool tied_output = false;  // no output.weight: the classifier reuses token_embd
  bool qkv_bias = false;     // qwen2: q/k/v projections have biases
  bool qk_norm = false;      // qwen3: per-head RMSNorm on q and k before RoPE

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
};

// Reads the configuration of a GGUF model; throws Error naming the key or the unsupported
// architecture (listing the supported ones).
ModelConfig config_from_gguf(const gguf::GgufFile& file);

struct LoadOptions {
  int n_threads = 0;  // 0 = all cores
};

// Owns the F16 paged cache memory: [layer][K|V][block][kv_head][slot][dim] (kv_layout.h).
class KvCache {
 public:
  explicit KvCache(const KvCacheLayout& layout);
  const KvCacheLayout& layout() const { return layout_; }
  uint16_t* data() { return data_.data(); }
  const uint16_t* data() const { return data_.data(); }

 private:
  KvCacheLayout layout_;
  std::vector<uint16_t> data_;
};

// One sequence's share of a forward step.
struct SequenceChunk {
  std::span<const int32_t> tokens;       // tokens to process now (prefill chunk, or 1 for decode)
  int32_t start_pos = 0;                 // position of tokens[0]; cache holds [0, start_pos)
  std::span<const int32_t> block_table;  // physical blocks covering [0, start_pos + tokens.size())
  bool all_logits = false;  // logits for every token (perplexity, echo) or only the last
  // Positions >= generated_from hold sampled tokens (attention in llama.cpp's one-token
  // order); -1: unknown, and a one-token chunk is taken as a decode step.
  int32_t generated_from = -1;
};

struct Weights;  // weights.h
struct Scratch;  // activations of one forward call, reused between calls

class Model {
 public:
  // Maps the file; checks every tensor's shape and type against the metadata. An unsupported
  // architecture or tensor type gives an Error listing what is supported.
  static std::unique_ptr<Model> load(const std::string& path, const LoadOptions& opts = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
  const gguf::GgufFile& file() const { return file_; }
  const Weights& weights() const { return *weights_; }
  int n_threads() const;

  KvCacheLayout kv_layout_for(int n_blocks, int block_size = kDefaultKvBlockSize) const;

  // One step for several sequences at once (some prefilling, some decoding). Writes logits
  // rows of n_vocab floats into `logits` (resized), in chunk order: every token of a chunk if
  // all_logits, else only its last. Batch invariant: a sequence's logits do not depend on the
  // other chunks. Not thread-safe: one forward at a time per Model.
  void forward(std::span<const SequenceChunk> chunks, KvCache& cache, std::vector<float>& logits);

  // Bytes of weights read by one decode step (every matrix once), for speed-of-light figures.
  size_t weight_bytes_per_token() const;
  // The rate (GB/s) at which the model's threads read those bytes with no arithmetic, in one
  // parallel pass over every matrix, best of `passes`: the memory bound on decode speed.
  double weight_read_gbs(int passes) const;

 private:
  Model(gguf::GgufFile file, const LoadOptions& opts);
  void check_chunks(std::span<const SequenceChunk> chunks, const KvCache& cache) const;

  gguf::GgufFile file_;
  ModelConfig config_;
  std::unique_ptr<Weights> weights_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Scratch> scratch_;
};

}  // namespace hablar::model
