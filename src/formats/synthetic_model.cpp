// Synthetic model files: shapes of public models, llama.cpp tensor names and metadata keys,
// seeded random weights generated and quantized row by row on a thread pool (large K-quant
// and IQ4 tensors assembled from seeded pools of quantized blocks; see the header).
#include "formats/synthetic_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <thread>
#include <tuple>

#include "core/error.h"
#include "core/pooling.h"
#include "core/thread_pool.h"
#include "formats/model_info.h"

namespace hablar::synth {

namespace {

using gguf::GgufFile;
using gguf::GgufWriter;
using gguf::Value;

// The shapes of the public configurations (hidden size, layers, heads, KV heads, head
// length, FFN length, vocabulary, context, RoPE base, RMS-norm epsilon, tied embeddings).
const std::vector<ModelShape> kShapes = {
    // tiny: gemma3's window of 8 and period 2 make its short test prompts cross both kinds.
    {"tiny", 256, 2, 4, 2, 64, 512, 512, 2048, 10000.0, 1e-5, false, 8, 2, 8, 2, 128},
    // tiny-mha: as many KV heads as query heads (OLMoE's norms of k span the embedding).
    {"tiny-mha", 256, 2, 4, 4, 64, 512, 512, 2048, 10000.0, 1e-5, false, 8, 2, 8, 2, 128},
    // tiny-hd96: Phi-3's head size, whose 1/sqrt(96) query scale is no power of two.
    {"tiny-hd96", 768, 2, 8, 4, 96, 512, 512, 2048, 10000.0, 1e-5, false},
    // tiny-odd: rows of 320 (not a K-quant super-block: the quantizers' fallbacks), 8 layers
    // (the quantize mixes' first / last eighth), 5 query heads per KV head, tied output.
    {"tiny-odd", 320, 8, 5, 1, 64, 512, 512, 2048, 10000.0, 1e-5, true, 8, 2, 8, 2, 128},
    {"phi3-mini", 3072, 32, 32, 32, 96, 8192, 32064, 4096, 10000.0, 1e-5, false},
    // Phi-2 and Phi-1.5 (--arch phi2; norm_eps is the LayerNorm epsilon).
    {.name = "phi-2",
     .hidden = 2560,
     .n_layers = 32,
     .n_heads = 32,
     .n_kv_heads = 32,
     .head_dim = 80,
     .ffn = 10240,
     .vocab = 51200,
     .context = 2048,
     .rope_dims = 32},
    {.name = "phi-1.5",
     .hidden = 2048,
     .n_layers = 24,
     .n_heads = 32,
     .n_kv_heads = 32,
     .head_dim = 64,
     .ffn = 8192,
     .vocab = 51200,
     .context = 2048,
     .rope_dims = 32},
    {"smollm2-135m", 576, 30, 9, 3, 64, 1536, 49152, 8192, 100000.0, 1e-5, true},
    {"qwen2.5-0.5b", 896, 24, 14, 2, 64, 4864, 151936, 32768, 1000000.0, 1e-6, true},
    {"qwen2.5-1.5b", 1536, 28, 12, 2, 128, 8960, 151936, 32768, 1000000.0, 1e-6, true},
    {"qwen3-0.6b", 1024, 28, 16, 8, 128, 3072, 151936, 40960, 1000000.0, 1e-6, true},
    {"llama3-8b", 4096, 32, 32, 8, 128, 14336, 128256, 8192, 500000.0, 1e-5, false},
    {"gemma-2b", 2048, 18, 8, 1, 256, 16384, 256000, 8192, 10000.0, 1e-6, true},
    {"gemma2-2b", 2304, 26, 8, 4, 256, 9216, 256000, 8192, 10000.0, 1e-6, true, 4096, 2},
    {"gemma3-270m", 640, 18, 4, 1, 256, 2048, 262144, 32768, 1000000.0, 1e-6, true, 512, 6},
    {"gemma3-1b", 1152, 26, 4, 1, 256, 6912, 262144, 32768, 1000000.0, 1e-6, true, 512, 6},
    // Mixture of experts: Mixtral 8x7B and Qwen3-30B-A3B; moe-small, a made-up 0.7B model (32
    // experts, 4 per token) for CPU benchmarks.
    {"moe-small", 1024, 12, 16, 4, 64, 2816, 32000, 4096, 1000000.0, 1e-6, false, 0, 0, 32, 4, 512},
    {"mixtral-8x7b", 4096, 32, 32, 8, 128, 14336, 32000, 32768, 1000000.0, 1e-5, false, 0, 0, 8, 2,
     14336},
    {"qwen3-30b-a3b", 2048, 48, 32, 4, 128, 6144, 151936, 40960, 1000000.0, 1e-6, false, 0, 0, 128,
     8, 768},
    // Encoders (--arch bert / nomic-bert; norm_eps is the LayerNorm epsilon): bert-tiny for
    // tests, all-MiniLM-L6, BERT-base (bge-base), nomic-embed-text-v1.5.
    {"bert-tiny", 128, 2, 4, 4, 32, 512, 512, 512, 10000.0, 1e-12, true},
    {"minilm", 384, 6, 12, 12, 32, 1536, 30522, 512, 10000.0, 1e-12, true},
    {"bert-base", 768, 12, 12, 12, 64, 3072, 30522, 512, 10000.0, 1e-12, true},
    {"nomic-bert", 768, 12, 12, 12, 64, 3072, 30522, 2048, 1000.0, 1e-12, true},
};

// SplitMix64: a fast, well-mixed generator; one stream per (seed, tensor, row) so the
// weights do not depend on how rows are spread over threads.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

uint64_t row_stream_seed(uint64_t seed, uint64_t tensor_index, uint64_t row) {
  SplitMix64 mix{seed ^ (tensor_index << 40) ^ row};
  mix.next();
  return mix.next() ^ seed;
}

// Fills dst[0..n) with values uniform in [center - half_width, center + half_width).
void fill_uniform(SplitMix64& rng, float* dst, int64_t n, float center, float half_width) {
  constexpr float kInv24 = 1.0f / 16777216.0f;  // 2^-24
  int64_t i = 0;
  for (; i + 1 < n; i += 2) {
    const uint64_t bits = rng.next();
    dst[i] = center + half_width * (2.0f * (float)(bits >> 40) * kInv24 - 1.0f);
    dst[i + 1] = center + half_width * (2.0f * (float)((bits >> 8) & 0xffffff) * kInv24 - 1.0f);
  }
  if (i < n) dst[i] = center + half_width * (2.0f * (float)(rng.next() >> 40) * kInv24 - 1.0f);
}

// Copies every tokenizer.* key of a vocabulary GGUF; returns its token count.
int64_t copy_vocabulary(const std::string& path, GgufWriter& w) {
  const GgufFile vocab = GgufFile::open(path);
  if (!vocab.has("tokenizer.ggml.tokens"))
    throw_error(ErrorKind::kFormat,
                path + ": key tokenizer.ggml.tokens missing (not a vocabulary)");
  for (const auto& [key, value] : vocab.metadata())
    if (key.rfind("tokenizer.", 0) == 0) w.set(key, value);
  return (int64_t)vocab.get_array("tokenizer.ggml.tokens").size();
}

// A SentencePiece-style vocabulary that llama.cpp loads and that can spell any text:
// <unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF>, then "<tN>" filler tokens.
void write_synthetic_vocabulary(int64_t size, GgufWriter& w) {
  constexpr int64_t kFixed = 3 + 256;
  if (size < kFixed)
    throw_error(ErrorKind::kInvalidArgument, "synthetic vocabulary needs at least " +
                                                 std::to_string(kFixed) + " tokens, got " +
                                                 std::to_string(size));
  enum TokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kByte = 6 };
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {kUnknown, kControl, kControl};
  char hex[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    tokens.emplace_back(hex);
    types.push_back(kByte);
  }
  for (int64_t id = kFixed; id < size; ++id) {
    tokens.push_back("<t" + std::to_string(id) + ">");
    types.push_back(kNormal);
  }
  std::vector<float> scores(tokens.size(), 0.0f);
  for (int64_t id = kFixed; id < size; ++id) scores[id] = -(float)(id - kFixed);
  w.set("tokenizer.ggml.model", Value::string("llama"));
  w.set("tokenizer.ggml.tokens", Value::string_array(tokens));
  w.set("tokenizer.ggml.scores", Value::f32_array(scores));
  w.set("tokenizer.ggml.token_type", Value::i32_array(types));
  w.set("tokenizer.ggml.unknown_token_id", Value::u32(0));
  w.set("tokenizer.ggml.bos_token_id", Value::u32(1));
  w.set("tokenizer.ggml.eos_token_id", Value::u32(2));
  w.set("tokenizer.ggml.add_bos_token", Value::boolean(true));
  w.set("tokenizer.ggml.add_eos_token", Value::boolean(false));
}

void write_hyperparameters(Arch arch, const ModelShape& s, int64_t vocab_size,
                           std::string_view type_name, GgufWriter& w) {
  const std::string a(arch_name(arch));
  const auto u32 = [](int64_t v) { return Value::u32((uint32_t)v); };
  w.set("general.architecture", Value::string(a));
  w.set("general.name", Value::string("synthetic " + s.name + " (" + a + ")"));
  if (const auto ft = gguf::file_type_from_name(type_name))
    w.set("general.file_type", Value::u32(*ft));
  w.set("general.quantization_version", Value::u32(2));
  w.set(a + ".vocab_size", u32(vocab_size));
  w.set(a + ".context_length", u32(s.context));
  w.set(a + ".embedding_length", u32(s.hidden));
  w.set(a + ".block_count", u32(s.n_layers));
  w.set(a + ".feed_forward_length", u32(s.ffn));
  w.set(a + ".attention.head_count", u32(s.n_heads));
  w.set(a + ".attention.head_count_kv", u32(s.n_kv_heads));
  w.set(a + ".attention.key_length", u32(s.head_dim));
  w.set(a + ".attention.value_length", u32(s.head_dim));
  const bool layer_norm = arch == Arch::kPhi2 || arch == Arch::kStarCoder2 ||
                          arch == Arch::kCommandR || arch == Arch::kCohere2 ||
                          arch == Arch::kOrion || arch == Arch::kNemotron ||
                          arch == Arch::kStableLm;
  w.set(a + (layer_norm ? ".attention.layer_norm_epsilon" : ".attention.layer_norm_rms_epsilon"),
        Value::f32((float)s.norm_eps));
  w.set(a + ".rope.freq_base", Value::f32((float)s.rope_theta));
  int64_t rope_dims = s.rope_dims > 0 ? s.rope_dims : s.head_dim;
  if (s.rope_dims == 0 && arch == Arch::kPhi2)
    rope_dims = 2 * std::llround(0.2 * (double)s.head_dim);
  if (s.rope_dims == 0 && (arch == Arch::kGlm4 || arch == Arch::kNemotron))
    rope_dims = s.head_dim / 2;  // (Nemotron-Mini's partial rotary factor)
  if (s.rope_dims == 0 && arch == Arch::kStableLm) rope_dims = s.head_dim / 4;  // (StableLM 2's)
  w.set(a + ".rope.dimension_count", u32(rope_dims));
  if (arch == Arch::kGemmaEmbedding) {  // dense_2 [n_embd -> 4 n_embd], dense_3 back
    w.set(a + ".dense_2_feat_in", u32(s.hidden));
    w.set(a + ".dense_2_feat_out", u32(4 * s.hidden));
    w.set(a + ".dense_3_feat_in", u32(4 * s.hidden));
    w.set(a + ".dense_3_feat_out", u32(s.hidden));
  }
  if (arch == Arch::kGemma2 || arch == Arch::kGemma3 || arch == Arch::kGemmaEmbedding ||
      arch == Arch::kOlmo2) {
    w.set(a + ".attention.sliding_window", u32(s.sliding_window));
    w.set(a + ".attention.sliding_window_pattern", u32(s.sliding_period));
  }
  const bool ffn_wide_experts =
      arch == Arch::kMixtral || arch == Arch::kOlmoe || arch == Arch::kGraniteMoe;
  if (arch == Arch::kQwen3Moe || arch == Arch::kQwen2Moe || ffn_wide_experts) {
    w.set(a + ".expert_count", u32(s.n_experts));
    w.set(a + ".expert_used_count", u32(s.n_experts_used));
    if (!ffn_wide_experts)  // (the others' experts are as wide as the FFN)
      w.set(a + ".expert_feed_forward_length", u32(s.ffn_expert > 0 ? s.ffn_expert : s.ffn));
    if (arch == Arch::kQwen2Moe) w.set(a + ".expert_shared_feed_forward_length", u32(s.ffn));
  }
  if (is_encoder(arch)) {
    w.set(a + ".attention.layer_norm_epsilon", Value::f32((float)s.norm_eps));
    w.set(a + ".attention.causal", Value::boolean(false));
  }
  if (arch == Arch::kHunyuanDense)  // the published models' NTK alpha
    w.set(a + ".rope.scaling.alpha", Value::f32(1000.0f));
  if (arch == Arch::kGranite || arch == Arch::kGraniteMoe) {  // (attention's: 1 / head_dim)
    w.set(a + ".embedding_scale", Value::f32(12.0f));
    w.set(a + ".residual_scale", Value::f32(0.22f));
    w.set(a + ".logit_scale", Value::f32(8.0f));
    w.set(a + ".attention.scale", Value::f32(1.0f / (float)s.head_dim));
  }
  if (arch == Arch::kMistral3) {
    // Ministral 3's YaRN and temperature (beta 0.1), its original context shrunk to 16 so that
    // short prompts cross the temperature's floors
    w.set(a + ".rope.scaling.type", Value::string("yarn"));
    w.set(a + ".rope.scaling.factor", Value::f32(4.0f));
    w.set(a + ".rope.scaling.original_context_length", u32(16));
    w.set(a + ".rope.scaling.yarn_beta_fast", Value::f32(32.0f));
    w.set(a + ".rope.scaling.yarn_beta_slow", Value::f32(1.0f));
    w.set(a + ".rope.scaling.yarn_log_multiplier", Value::f32(1.0f));
    w.set(a + ".attention.temperature_scale", Value::f32(0.1f));
  }
  if (arch == Arch::kCommandR || arch == Arch::kCohere2)  // the published models' logit scale
    w.set(a + ".logit_scale", Value::f32(0.0625f));
  if (arch == Arch::kCohere2) {  // Command R7B's pattern, its window shrunk to 8
    w.set(a + ".attention.sliding_window", u32(8));
    w.set(a + ".attention.sliding_window_pattern", u32(4));
  }
  if (arch == Arch::kGemma2) {  // the published models' soft-caps
    w.set(a + ".attn_logit_softcapping", Value::f32(50.0f));
    w.set(a + ".final_logit_softcapping", Value::f32(30.0f));
  }
}

void check_shape(const ModelShape& s) {
  if (s.hidden <= 0 || s.n_layers <= 0 || s.n_heads <= 0 || s.n_kv_heads <= 0 || s.head_dim <= 0 ||
      s.ffn <= 0 || s.context <= 0)
    throw_error(ErrorKind::kInvalidArgument,
                "shape " + s.name + ": every dimension must be positive");
  if (s.n_heads % s.n_kv_heads != 0)
    throw_error(ErrorKind::kInvalidArgument, "shape " + s.name + ": " + std::to_string(s.n_heads) +
                                                 " heads are not a multiple of " +
                                                 std::to_string(s.n_kv_heads) + " KV heads");
}

// Value distribution of one tensor: uniform in [center - half_width, center + half_width).
struct Distribution {
  float center = 0.0f;
  float half_width = 0.0f;
};
Distribution distribution_of(const PlannedTensor& t) {
  switch (t.init) {
    case PlannedTensor::Init::kNorm:
      return {1.0f, 0.1f};
    case PlannedTensor::Init::kBias:
      return {0.0f, 0.02f};
    case PlannedTensor::Init::kMatrix:
      break;
  }
  return {0.0f, std::sqrt(3.0f / (float)t.dims[0])};  // std 1/sqrt(row length)
}

// Types whose reference quantizer searches scales (K-quants, IQ4): 20-200 times slower than
// generating the values.
bool has_slow_quantizer(DType type) {
  switch (type) {
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::Q8_K:
    case DType::IQ4_NL:
    case DType::IQ4_XS:
      return true;
    default:
      return false;
  }
}

// A seeded pool of quantized blocks, all from one distribution; rows of large tensors in
// slow types are assembled from randomly chosen pool blocks.
struct BlockPool {
  size_t block_bytes = 0;
  int64_t n_blocks = 0;
  std::vector<uint8_t> bytes;
};

BlockPool make_block_pool(DType type, Distribution dist, int64_t n_blocks, uint64_t seed,
                          ThreadPool& threads) {
  const DTypeTraits& traits = dtype_traits(type);
  BlockPool pool{traits.block_bytes, n_blocks, {}};
  pool.bytes.resize((size_t)n_blocks * traits.block_bytes);
  threads.run([&](int thread, int n_threads) {
    const IndexRange range = split_range(n_blocks, thread, n_threads);
    std::vector<float> values(traits.block_elems);
    for (int64_t b = range.begin; b < range.end; ++b) {
      SplitMix64 rng{row_stream_seed(seed, ~uint64_t{0}, (uint64_t)b)};
      fill_uniform(rng, values.data(), traits.block_elems, dist.center, dist.half_width);
      quantize_row(type, values.data(), pool.bytes.data() + b * pool.block_bytes,
                   traits.block_elems);
    }
  });
  return pool;
}

// Shared by the fill callbacks of one model: the thread pool and the block pools, made on
// first use and keyed by type and distribution.
struct FillContext {
  std::shared_ptr<ThreadPool> threads;
  uint64_t seed = 0;
  int64_t pool_blocks = 0;  // 0: every row generated and quantized exactly
  int64_t pool_min_tensor_blocks = 0;
  std::map<std::tuple<uint32_t, float, float>, std::shared_ptr<const BlockPool>> pools;

  const BlockPool& pool_for(DType type, Distribution dist) {
    auto& slot = pools[{(uint32_t)type, dist.center, dist.half_width}];
    if (!slot)
      slot = std::make_shared<const BlockPool>(make_block_pool(
          type, dist, pool_blocks, seed ^ (0x51ed27ull * (pools.size() + 1)), *threads));
    return *slot;
  }
};

// The fill callback of one tensor: rows spread over the thread pool. Each row is generated
// into a per-thread float buffer and quantized straight into the output, or, for a large
// tensor in a slow type, assembled from seeded random picks of pool blocks.
GgufWriter::RowsFn make_fill(const PlannedTensor& t, uint64_t tensor_index,
                             std::shared_ptr<FillContext> ctx) {
  const int64_t cols = t.dims[0];
  const Distribution dist = distribution_of(t);
  const DType type = t.type;
  const int64_t n_blocks = (int64_t)(t.n_elements() / dtype_traits(type).block_elems);
  const bool use_pool =
      ctx->pool_blocks > 0 && has_slow_quantizer(type) && n_blocks >= ctx->pool_min_tensor_blocks;
  return [=](int64_t first_row, int64_t n_rows, std::span<uint8_t> out) {
    const size_t row_bytes = dtype_row_bytes(type, cols);
    const BlockPool* pool = use_pool ? &ctx->pool_for(type, dist) : nullptr;
    ctx->threads->run([&](int thread, int n_threads) {
      const IndexRange range = split_range(n_rows, thread, n_threads);
      std::vector<float> buffer(pool ? 0 : (size_t)cols);
      for (int64_t r = range.begin; r < range.end; ++r) {
        SplitMix64 rng{row_stream_seed(ctx->seed, tensor_index, (uint64_t)(first_row + r))};
        uint8_t* dst = out.data() + (size_t)r * row_bytes;
        if (!pool) {
          fill_uniform(rng, buffer.data(), cols, dist.center, dist.half_width);
          quantize_row(type, buffer.data(), dst, cols);
          continue;
        }
        for (size_t at = 0; at < row_bytes; at += pool->block_bytes) {
          const uint64_t pick = rng.next() % (uint64_t)pool->n_blocks;
          std::memcpy(dst + at, pool->bytes.data() + pick * pool->block_bytes, pool->block_bytes);
        }
      }
    });
  };
}

}  // namespace

const std::vector<ModelShape>& known_shapes() {
  return kShapes;
}

std::optional<ModelShape> shape_from_name(std::string_view name) {
  for (const ModelShape& s : kShapes)
    if (s.name == name) return s;
  return std::nullopt;
}

std::optional<Arch> arch_from_name(std::string_view name) {
  if (name == "llama") return Arch::kLlama;
  if (name == "qwen2") return Arch::kQwen2;
  if (name == "qwen3") return Arch::kQwen3;
  if (name == "gemma") return Arch::kGemma;
  if (name == "gemma2") return Arch::kGemma2;
  if (name == "gemma3") return Arch::kGemma3;
  if (name == "gemma-embedding") return Arch::kGemmaEmbedding;
  if (name == "mixtral") return Arch::kMixtral;
  if (name == "qwen3moe") return Arch::kQwen3Moe;
  if (name == "phi3") return Arch::kPhi3;
  if (name == "qwen2moe") return Arch::kQwen2Moe;
  if (name == "phi2") return Arch::kPhi2;
  if (name == "smollm3") return Arch::kSmolLM3;
  if (name == "granite") return Arch::kGranite;
  if (name == "granitemoe") return Arch::kGraniteMoe;
  if (name == "ernie4_5") return Arch::kErnie45;
  if (name == "olmo2") return Arch::kOlmo2;
  if (name == "starcoder2") return Arch::kStarCoder2;
  if (name == "exaone4") return Arch::kExaone4;
  if (name == "hunyuan-dense") return Arch::kHunyuanDense;
  if (name == "glm4") return Arch::kGlm4;
  if (name == "arcee") return Arch::kArcee;
  if (name == "mistral3") return Arch::kMistral3;
  if (name == "exaone") return Arch::kExaone;
  if (name == "xverse") return Arch::kXverse;
  if (name == "internlm2") return Arch::kInternlm2;
  if (name == "seed_oss") return Arch::kSeedOss;
  if (name == "command-r") return Arch::kCommandR;
  if (name == "orion") return Arch::kOrion;
  if (name == "nemotron") return Arch::kNemotron;
  if (name == "stablelm") return Arch::kStableLm;
  if (name == "minicpm") return Arch::kMiniCpm;
  if (name == "olmoe") return Arch::kOlmoe;
  if (name == "cohere2") return Arch::kCohere2;
  if (name == "bert") return Arch::kBert;
  if (name == "nomic-bert") return Arch::kNomicBert;
  return std::nullopt;
}

std::string_view arch_name(Arch arch) {
  switch (arch) {
    case Arch::kLlama:
      return "llama";
    case Arch::kQwen2:
      return "qwen2";
    case Arch::kQwen3:
      return "qwen3";
    case Arch::kGemma:
      return "gemma";
    case Arch::kGemma2:
      return "gemma2";
    case Arch::kGemma3:
      return "gemma3";
    case Arch::kGemmaEmbedding:
      return "gemma-embedding";
    case Arch::kMixtral:
      return "llama";
    case Arch::kQwen3Moe:
      return "qwen3moe";
    case Arch::kPhi3:
      return "phi3";
    case Arch::kQwen2Moe:
      return "qwen2moe";
    case Arch::kPhi2:
      return "phi2";
    case Arch::kSmolLM3:
      return "smollm3";
    case Arch::kGranite:
      return "granite";
    case Arch::kGraniteMoe:
      return "granitemoe";
    case Arch::kErnie45:
      return "ernie4_5";
    case Arch::kOlmo2:
      return "olmo2";
    case Arch::kStarCoder2:
      return "starcoder2";
    case Arch::kExaone4:
      return "exaone4";
    case Arch::kHunyuanDense:
      return "hunyuan-dense";
    case Arch::kGlm4:
      return "glm4";
    case Arch::kArcee:
      return "arcee";
    case Arch::kMistral3:
      return "mistral3";
    case Arch::kExaone:
      return "exaone";
    case Arch::kXverse:
      return "xverse";
    case Arch::kInternlm2:
      return "internlm2";
    case Arch::kSeedOss:
      return "seed_oss";
    case Arch::kMiniCpm:
      return "minicpm";
    case Arch::kOlmoe:
      return "olmoe";
    case Arch::kOrion:
      return "orion";
    case Arch::kNemotron:
      return "nemotron";
    case Arch::kStableLm:
      return "stablelm";
    case Arch::kCommandR:
      return "command-r";
    case Arch::kCohere2:
      return "cohere2";
    case Arch::kBert:
      return "bert";
    case Arch::kNomicBert:
      return "nomic-bert";
  }
  return "unknown";
}

namespace {

// LongRoPE as llama.cpp's converter writes a Phi-3 128k model: the original context and the
// attention factor sqrt(1 + ln(context / original) / ln(original)); no scaling type or factor.
void write_longrope_metadata(const SyntheticModelOptions& o, GgufWriter& w) {
  const int64_t original = o.rope_original_context;
  if (o.arch != Arch::kPhi3 || original <= 1 || original > o.shape.context)
    throw_error(ErrorKind::kInvalidArgument,
                "longrope RoPE scaling: phi3 only, with an original context in (1, " +
                    std::to_string(o.shape.context) + "] (the shape's context)");
  const std::string a(arch_name(o.arch));
  const double scale = (double)o.shape.context / (double)original;
  const double attn =
      scale > 1.0 ? std::sqrt(1.0 + std::log(scale) / std::log((double)original)) : 1.0;
  w.set(a + ".rope.scaling.original_context_length", Value::u32((uint32_t)original));
  w.set(a + ".rope.scaling.attn_factor", Value::f32((float)attn));
}

// rope_factors_short / rope_factors_long [head_dim / 2], F32, seeded: short factors in
// [1, 1.1), long ones growing with the pair towards the context's extension (as Phi-3's do).
void add_longrope_factors(const SyntheticModelOptions& o, GgufWriter& w) {
  const int64_t pairs = o.shape.head_dim / 2;
  const double scale = (double)o.shape.context / (double)o.rope_original_context;
  for (const bool is_long : {false, true}) {
    SplitMix64 rng{o.seed ^ (is_long ? 0x4c4f4e47ull : 0x53484f52ull)};
    std::vector<float> v((size_t)pairs);
    for (int64_t i = 0; i < pairs; ++i) {
      const double u = (double)(rng.next() >> 11) * 0x1.0p-53;
      const double ramp = ((double)i + 0.5) / (double)pairs;
      v[(size_t)i] =
          (float)(is_long ? 1.0 + (scale - 1.0) * ramp * ramp * (0.75 + 0.5 * u) : 1.0 + 0.1 * u);
    }
    w.add_tensor(is_long ? "rope_factors_long.weight" : "rope_factors_short.weight", DType::F32,
                 {pairs},
                 [v](std::span<uint8_t> out) { std::memcpy(out.data(), v.data(), out.size()); });
  }
}

}  // namespace

GgufWriter build_synthetic_model(const SyntheticModelOptions& o, SyntheticModelSummary* summary) {
  check_shape(o.shape);
  const std::optional<QuantMix> mix = quant_mix_from_name(o.type);
  if (!mix)
    throw_error(ErrorKind::kInvalidArgument,
                "unknown or unquantizable type '" + o.type +
                    "' (use q4_k_m, q5_k_m or a type with a quantizer: " + supported_dtype_names() +
                    ")");
  GgufWriter w;
  // The vocabulary decides the embedding size, so it is read first; the hyperparameters are
  // set first in the file all the same (set() keeps a replaced key's position).
  write_hyperparameters(o.arch, o.shape, o.shape.vocab, o.type, w);
  if (o.sliding_window > 0) {
    const bool gemma =
        o.arch == Arch::kGemma2 || o.arch == Arch::kGemma3 || o.arch == Arch::kGemmaEmbedding;
    if (!gemma && o.arch != Arch::kLlama)
      throw_error(ErrorKind::kInvalidArgument, "a sliding window is for llama, gemma2 or gemma3");
    w.set(std::string(arch_name(o.arch)) + ".attention.sliding_window",
          Value::u32((uint32_t)o.sliding_window));
  }
  if (o.rope_scaling == "longrope") {
    write_longrope_metadata(o, w);
  } else if (!o.rope_scaling.empty()) {
    const std::string a(arch_name(o.arch));
    w.set(a + ".rope.scaling.type", Value::string(o.rope_scaling));
    w.set(a + ".rope.scaling.factor", Value::f32((float)o.rope_factor));
    w.set(a + ".rope.scaling.original_context_length",
          Value::u32(
              (uint32_t)(o.rope_original_context > 0 ? o.rope_original_context : o.shape.context)));
  }
  int64_t vocab_size = o.shape.vocab;
  if (!o.vocab_path.empty())
    vocab_size = copy_vocabulary(o.vocab_path, w);
  else
    write_synthetic_vocabulary(vocab_size, w);
  const std::string a(arch_name(o.arch));
  w.set(a + ".vocab_size", Value::u32((uint32_t)vocab_size));
  if (is_encoder(o.arch)) w.set("tokenizer.ggml.token_type_count", Value::u32(2));
  std::string pooling = o.pooling;
  if (pooling.empty() && (is_encoder(o.arch) || o.arch == Arch::kGemmaEmbedding))
    pooling = o.rank_head ? "rank" : "mean";
  if (!pooling.empty()) {
    const std::optional<Pooling> p = pooling_from_name(pooling);
    if (!p)
      throw_error(ErrorKind::kInvalidArgument,
                  "unknown pooling '" + pooling + "' (none, mean, cls, last, rank)");
    if (*p == Pooling::kRank && !o.rank_head)
      throw_error(ErrorKind::kInvalidArgument, "rank pooling needs the classifier head");
    w.set(a + ".pooling_type", Value::u32((uint32_t)*p));
  }
  if (o.rank_head && !is_encoder(o.arch))
    throw_error(ErrorKind::kInvalidArgument,
                "a classifier head is for encoders (bert, nomic-bert)");

  const int n_threads =
      o.n_threads > 0 ? o.n_threads : (int)std::max(1u, std::thread::hardware_concurrency());
  auto ctx = std::make_shared<FillContext>();
  ctx->threads = std::make_shared<ThreadPool>(n_threads);
  ctx->seed = o.seed;
  ctx->pool_blocks = o.exact_quantization ? 0 : o.pool_blocks;
  ctx->pool_min_tensor_blocks = o.pool_min_tensor_blocks;
  SyntheticModelSummary sum;
  sum.vocab_size = vocab_size;
  const std::vector<PlannedTensor> plan =
      plan_tensors(o.arch, o.shape, vocab_size, *mix, o.rank_head);
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlannedTensor& t = plan[i];
    if (!has_quantizer(t.type))
      throw_error(ErrorKind::kUnsupported, "tensor " + t.name + ": no quantizer for type " +
                                               std::string(dtype_name(t.type)));
    int64_t n = 1;
    for (int64_t d : t.dims) n *= d;
    sum.n_params += n;
    sum.n_bytes += dtype_row_bytes(t.type, t.dims[0]) * (uint64_t)(n / t.dims[0]);
    w.add_tensor_rows(t.name, t.type, t.dims, make_fill(t, i, ctx));
  }
  if (o.rope_scaling == "longrope") {
    add_longrope_factors(o, w);
    sum.n_params += o.shape.head_dim;  // two sets of head_dim / 2
    sum.n_bytes += 4 * (uint64_t)o.shape.head_dim;
  }
  sum.n_tensors = plan.size() + (o.rope_scaling == "longrope" ? 2 : 0);
  if (summary) *summary = sum;
  return w;
}

SyntheticModelSummary write_synthetic_model(const SyntheticModelOptions& options,
                                            const std::string& path) {
  SyntheticModelSummary summary;
  build_synthetic_model(options, &summary).write(path);
  return summary;
}

}  // namespace hablar::synth
