// Model loading and the checks on a forward step's input.
#include "model/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "formats/hf_model.h"
#include "model/weights.h"

namespace hablar::model {

Model::Model(gguf::GgufFile file) : file_(std::move(file)) {
  config_ = config_from_gguf(file_);
  weights_ = std::make_unique<Weights>(load_weights(file_, config_));
  tokenizer_ = tokenizer::Tokenizer::from_gguf(file_);
  if (tokenizer_->n_vocab() > config_.n_vocab)
    throw_error(ErrorKind::kFormat, file_.path() + ": vocabulary has " +
                                        std::to_string(tokenizer_->n_vocab()) +
                                        " tokens but token_embd.weight only " +
                                        std::to_string(config_.n_vocab) + " rows");
}

Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::string& path, const formats::HfOpenOptions& options) {
  if (options.quantize && !formats::is_hf_model_dir(path))
    throw_error(ErrorKind::kInvalidArgument,
                "--quantize converts Hugging Face directories; " + path + " is not one");
  gguf::GgufFile file = formats::open_model_file(path, options);  // a .gguf or a HF directory
  std::unique_ptr<Model> m(new Model(std::move(file)));
  const ModelConfig& c = m->config();
  log::info("loaded {}: {}, {} layers, n_embd {}, heads {}/{} x {}, ffn {}, vocab {}", path, c.arch,
            c.n_layers, c.n_embd, c.n_heads, c.n_kv_heads, c.head_dim, c.n_ff, c.n_vocab);
  return m;
}

int32_t max_context(const ModelConfig& c) {
  if (c.n_ctx_train <= 0) return 0;
  if (c.rope.scaling == RopeParams::Scaling::kNone || c.rope.factor <= 1.0f) return c.n_ctx_train;
  const double scaled = (double)c.rope.original_context * (double)c.rope.factor;
  return (int32_t)std::min<double>(std::max<double>(c.n_ctx_train, scaled), INT32_MAX);
}

int32_t kv_window(const ModelConfig& c) {
  int32_t widest = 0;
  for (const LayerSpec& l : c.layers) {
    if (l.attention.window <= 0) return 0;
    widest = std::max(widest, l.attention.window);
  }
  return widest;
}

std::vector<RopeParams> ropes_for_context(const ModelConfig& c, int64_t n_ctx) {
  std::vector<RopeParams> ropes = c.ropes;
  if (c.rope_factors_long.empty()) return ropes;
  const int32_t limit = max_context(c);
  const int64_t per_seq = limit > 0 ? std::min<int64_t>(n_ctx, limit) : n_ctx;
  const bool use_long = per_seq > c.rope.original_context;
  for (RopeParams& r : ropes)
    r.freq_factors = use_long ? c.rope_factors_long : c.rope_factors_short;
  return ropes;
}

void check_context(const ModelConfig& c, int64_t n_ctx, const std::string& flag) {
  const int32_t limit = max_context(c);
  if (limit <= 0 || n_ctx <= limit) return;
  const bool scaled = c.rope.scaling != RopeParams::Scaling::kNone && c.rope.factor > 1.0f;
  throw_error(ErrorKind::kInvalidArgument,
              flag + " " + std::to_string(n_ctx) + " exceeds the model's context of " +
                  std::to_string(limit) + " tokens" +
                  (scaled ? " (its trained context " + std::to_string(c.n_ctx_train) +
                                " extended by the RoPE scaling in the file, factor " +
                                fmt::format("{:g}", c.rope.factor) + ")"
                          : " (<arch>.context_length; the file defines no RoPE scaling that "
                            "would extend it)"));
}

int32_t context_for(const ModelConfig& c, int32_t requested, int32_t fallback,
                    const std::string& flag) {
  if (requested > 0) {
    check_context(c, requested, flag);
    return requested;
  }
  const int32_t limit = max_context(c);
  return limit > 0 ? std::min(fallback, limit) : fallback;
}

KvCacheLayout Model::kv_layout_for(int n_blocks, int block_size, KvDType dtype,
                                   std::optional<KvDType> v_dtype) const {
  if (n_blocks <= 0 || block_size <= 0)
    throw_error(ErrorKind::kInvalidArgument, "KV cache needs n_blocks > 0 and block_size > 0");
  KvCacheLayout l;
  l.n_layers = config_.n_layers;
  l.n_kv_heads = config_.n_kv_heads;
  l.head_dim = config_.head_dim;
  l.block_size = block_size;
  l.n_blocks = n_blocks;
  l.dtype = dtype;
  if (v_dtype && *v_dtype != dtype) l.v_type = (int8_t)*v_dtype;
  for (int kv = 0; kv < 2; ++kv)
    if (kv_dtype_quantized(l.type(kv)) && config_.head_dim % kKvQuantBlock != 0)
      throw_error(ErrorKind::kUnsupported,
                  std::string("a ") + kv_dtype_name(l.type(kv)) +
                      " KV cache needs head_dim a multiple of " + std::to_string(kKvQuantBlock) +
                      "; this model's is " + std::to_string(config_.head_dim));
  return l;
}

size_t Model::kv_bytes_per_token(KvDType dtype, std::optional<KvDType> v_dtype) const {
  KvCacheLayout l;
  l.n_layers = config_.n_layers, l.n_kv_heads = config_.n_kv_heads;
  l.head_dim = config_.head_dim, l.dtype = dtype;
  if (v_dtype && *v_dtype != dtype) l.v_type = (int8_t)*v_dtype;
  return l.bytes_per_token();
}

size_t Model::weight_bytes_per_token() const {
  size_t total = (size_t)weights_->token_embd.row_bytes;  // plus the token's embedding row
  for (const WeightView* w : weights_->matrices()) total += (size_t)w->rows * w->row_bytes;
  // A token reads only its n_experts_used experts of each layer.
  if (config_.n_experts > 0)
    for (const LayerWeights& l : weights_->layers)
      for (size_t e = 0; e < l.exp_gate.size(); ++e) {
        const size_t bytes = (size_t)l.exp_gate[e].rows * l.exp_gate[e].row_bytes +
                             (size_t)l.exp_up[e].rows * l.exp_up[e].row_bytes +
                             (size_t)l.exp_down[e].rows * l.exp_down[e].row_bytes;
        total -= bytes - bytes * (size_t)config_.n_experts_used / (size_t)config_.n_experts;
      }
  return total;
}

void check_step(const ModelConfig& config, std::span<const SequenceChunk> chunks,
                const KvCacheLayout& kl) {
  if (config.embedding_only)
    throw_error(ErrorKind::kUnsupported,
                std::string("this model is ") +
                    (config.encoder ? "an encoder (" : "an embedding model (") + config.arch +
                    "): it gives embeddings (`hablar embed`, the embedding routes of `hablar "
                    "serve`), not generated text");
  if (kl.n_layers != config.n_layers || kl.n_kv_heads != config.n_kv_heads ||
      kl.head_dim != config.head_dim)
    throw_error(ErrorKind::kInvalidArgument, "KV cache layout does not match the model");
  for (size_t i = 0; i < chunks.size(); ++i) {
    const SequenceChunk& ch = chunks[i];
    const std::string which = "chunk " + std::to_string(i);
    if (ch.tokens.empty()) throw_error(ErrorKind::kInvalidArgument, which + " has no tokens");
    if (ch.start_pos < 0)
      throw_error(ErrorKind::kInvalidArgument, which + " has a negative start position");
    const int64_t end = (int64_t)ch.start_pos + (int64_t)ch.tokens.size();
    const int64_t blocks_needed = (end + kl.block_size - 1) / kl.block_size;
    if ((int64_t)ch.block_table.size() < blocks_needed)
      throw_error(ErrorKind::kInvalidArgument,
                  which + ": block table has " + std::to_string(ch.block_table.size()) +
                      " blocks, positions up to " + std::to_string(end) + " need " +
                      std::to_string(blocks_needed));
    // Under a sliding window on every layer, blocks wholly before the first token's window
    // may have been given back (a negative id): no layer reads them.
    const int32_t window = kv_window(config);
    const int64_t first_read = window > 0 ? std::max<int64_t>(0, ch.start_pos - window + 1) : 0;
    for (int64_t b = first_read / kl.block_size; b < blocks_needed; ++b)
      if (ch.block_table[(size_t)b] < 0 || ch.block_table[(size_t)b] >= kl.n_blocks)
        throw_error(ErrorKind::kInvalidArgument,
                    which + ": block id " + std::to_string(ch.block_table[(size_t)b]) +
                        " outside the cache's " + std::to_string(kl.n_blocks) + " blocks");
    for (int32_t t : ch.tokens)
      if (t < 0 || t >= config.n_vocab)
        throw_error(ErrorKind::kInvalidArgument, which + ": token id " + std::to_string(t) +
                                                     " outside the vocabulary of " +
                                                     std::to_string(config.n_vocab));
  }
}

}  // namespace hablar::model
