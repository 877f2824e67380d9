// Synthetic models: llama.cpp tensor names and metadata, deterministic seeded weights with
// the intended scales, real vocabularies copied whole.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "core/quant.h"
#include "formats/gguf.h"
#include "formats/synthetic_model.h"
#include "support/test_support.h"

namespace hablar::synth {
namespace {

using gguf::GgufFile;

SyntheticModelOptions tiny_options(Arch arch, std::string type = "f32", uint64_t seed = 1) {
  SyntheticModelOptions o;
  o.arch = arch;
  o.shape = *shape_from_name("tiny");
  o.type = std::move(type);
  o.seed = seed;
  o.n_threads = 2;
  return o;
}

std::vector<float> tensor_values(const gguf::TensorInfo& t) {
  std::vector<float> out((size_t)t.n_elements());
  const size_t row_bytes = dtype_row_bytes(t.type, t.dims[0]);
  for (int64_t r = 0; r < t.rows(); ++r)
    dequantize_row(t.type, t.data + r * row_bytes, out.data() + r * t.dims[0], t.dims[0]);
  return out;
}

struct Stats {
  double mean = 0, stddev = 0, max_abs = 0;
};
Stats stats_of(const std::vector<float>& v) {
  Stats s;
  for (float x : v) s.mean += x;
  s.mean /= (double)v.size();
  for (float x : v) {
    s.stddev += (x - s.mean) * (x - s.mean);
    s.max_abs = std::max(s.max_abs, (double)std::fabs(x));
  }
  s.stddev = std::sqrt(s.stddev / (double)v.size());
  return s;
}

TEST(SyntheticModel, KnownShapesMatchThePublicConfigs) {
  const ModelShape smol = *shape_from_name("smollm2-135m");
  EXPECT_EQ(smol.hidden, 576);
  EXPECT_EQ(smol.n_layers, 30);
  EXPECT_EQ(smol.n_heads, 9);
  EXPECT_EQ(smol.n_kv_heads, 3);
  EXPECT_EQ(smol.vocab, 49152);
  EXPECT_TRUE(smol.tied_embeddings);
  const ModelShape q15 = *shape_from_name("qwen2.5-1.5b");
  EXPECT_EQ(q15.hidden, 1536);
  EXPECT_EQ(q15.n_layers, 28);
  EXPECT_EQ(q15.ffn, 8960);
  EXPECT_EQ(q15.head_dim * q15.n_heads, q15.hidden);
  const ModelShape l8 = *shape_from_name("llama3-8b");
  EXPECT_EQ(l8.n_kv_heads, 8);
  EXPECT_EQ(l8.vocab, 128256);
  EXPECT_FALSE(l8.tied_embeddings);
  for (const ModelShape& s : known_shapes()) EXPECT_EQ(s.n_heads % s.n_kv_heads, 0) << s.name;
  EXPECT_FALSE(shape_from_name("gpt-5"));
}

TEST(SyntheticModel, TensorNamesPerArchitecture) {
  const ModelShape tiny = *shape_from_name("tiny");
  const QuantMix f16{DType::F16, false};
  const auto names = [&](Arch a) {
    std::set<std::string> out;
    for (const PlannedTensor& t : plan_tensors(a, tiny, 512, f16)) out.insert(t.name);
    return out;
  };
  const std::set<std::string> llama = names(Arch::kLlama);
  // Per layer: 2 norms, q, k, v, o, gate, up, down; plus embedding, output norm, output.
  EXPECT_EQ(llama.size(), 9u * 2 + 3);
  for (const char* n : {"token_embd.weight", "blk.0.attn_norm.weight", "blk.1.attn_q.weight",
                        "blk.1.attn_k.weight", "blk.1.attn_v.weight", "blk.1.attn_output.weight",
                        "blk.1.ffn_norm.weight", "blk.1.ffn_gate.weight", "blk.1.ffn_up.weight",
                        "blk.1.ffn_down.weight", "output_norm.weight", "output.weight"})
    EXPECT_TRUE(llama.count(n)) << n;
  const std::set<std::string> qwen2 = names(Arch::kQwen2);
  EXPECT_TRUE(qwen2.count("blk.0.attn_q.bias") && qwen2.count("blk.0.attn_k.bias") &&
              qwen2.count("blk.0.attn_v.bias"));
  EXPECT_FALSE(qwen2.count("blk.0.attn_q_norm.weight"));
  const std::set<std::string> qwen3 = names(Arch::kQwen3);
  EXPECT_TRUE(qwen3.count("blk.1.attn_q_norm.weight") && qwen3.count("blk.1.attn_k_norm.weight"));
  EXPECT_FALSE(qwen3.count("blk.0.attn_q.bias"));

  ModelShape tied = tiny;
  tied.tied_embeddings = true;
  for (const PlannedTensor& t : plan_tensors(Arch::kLlama, tied, 512, f16))
    EXPECT_NE(t.name, "output.weight");
}

TEST(SyntheticModel, ShapesAndTypesOfQwen3Tensors) {
  const ModelShape s = *shape_from_name("qwen3-0.6b");
  const auto plan = plan_tensors(Arch::kQwen3, s, 1000, QuantMix{DType::Q8_0, false});
  std::map<std::string, std::vector<int64_t>> dims;
  for (const PlannedTensor& t : plan) {
    dims[t.name] = t.dims;
    EXPECT_EQ(t.type, t.dims.size() == 1 ? DType::F32 : DType::Q8_0) << t.name;
  }
  EXPECT_EQ(dims["blk.0.attn_q.weight"], (std::vector<int64_t>{1024, 2048}));
  EXPECT_EQ(dims["blk.0.attn_k.weight"], (std::vector<int64_t>{1024, 1024}));
  EXPECT_EQ(dims["blk.0.attn_output.weight"], (std::vector<int64_t>{2048, 1024}));
  EXPECT_EQ(dims["blk.0.attn_k_norm.weight"], (std::vector<int64_t>{128}));
  EXPECT_EQ(dims["blk.27.ffn_down.weight"], (std::vector<int64_t>{3072, 1024}));
  EXPECT_EQ(dims["token_embd.weight"], (std::vector<int64_t>{1024, 1000}));
  EXPECT_EQ(dims.count("output.weight"), 0u);  // tied
}

TEST(SyntheticModel, MetadataAsLlamaCppExpectsIt) {
  const auto bytes = build_synthetic_model(tiny_options(Arch::kQwen2)).to_bytes();
  const GgufFile f = GgufFile::parse(bytes, "tiny.gguf");
  EXPECT_EQ(f.get_string("general.architecture"), "qwen2");
  EXPECT_EQ(f.get_uint("general.file_type"), 0u);
  EXPECT_EQ(f.get_uint("qwen2.block_count"), 2u);
  EXPECT_EQ(f.get_uint("qwen2.embedding_length"), 256u);
  EXPECT_EQ(f.get_uint("qwen2.feed_forward_length"), 512u);
  EXPECT_EQ(f.get_uint("qwen2.attention.head_count"), 4u);
  EXPECT_EQ(f.get_uint("qwen2.attention.head_count_kv"), 2u);
  EXPECT_EQ(f.get_uint("qwen2.context_length"), 2048u);
  EXPECT_FLOAT_EQ((float)f.get_float("qwen2.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_FLOAT_EQ((float)f.get_float("qwen2.rope.freq_base"), 10000.0f);
  // Synthetic vocabulary: control tokens, 256 byte tokens, fillers.
  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 512u);
  EXPECT_EQ(tokens[1], "<s>");
  EXPECT_EQ(tokens[3 + 0x41], "<0x41>");
  EXPECT_EQ(tokens[400], "<t400>");
  EXPECT_EQ(f.get_f32_array("tokenizer.ggml.scores").size(), 512u);
  EXPECT_EQ(f.get_i32_array("tokenizer.ggml.token_type")[3], 6);  // byte token
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f.tensor("token_embd.weight").dims, (std::vector<int64_t>{256, 512}));
  EXPECT_EQ(f.tensor("output.weight").dims, (std::vector<int64_t>{256, 512}));
  EXPECT_EQ(f.tensor("blk.1.attn_k.bias").dims, (std::vector<int64_t>{128}));
}

TEST(SyntheticModel, SameSeedSameBytesOtherSeedOtherWeights) {
  const auto a = build_synthetic_model(tiny_options(Arch::kLlama, "f16", 7)).to_bytes();
  auto threads4 = tiny_options(Arch::kLlama, "f16", 7);
  threads4.n_threads = 3;  // row split differs; the weights must not
  const auto b = build_synthetic_model(threads4).to_bytes();
  const auto c = build_synthetic_model(tiny_options(Arch::kLlama, "f16", 8)).to_bytes();
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), c.size());
  EXPECT_NE(a, c);
}

TEST(SyntheticModel, WeightScalesKeepActivationsBounded) {
  const auto bytes = build_synthetic_model(tiny_options(Arch::kQwen2)).to_bytes();
  const GgufFile f = GgufFile::parse(bytes, "tiny.gguf");
  const Stats down = stats_of(tensor_values(f.tensor("blk.0.ffn_down.weight")));  // 512 cols
  EXPECT_NEAR(down.mean, 0.0, 0.002);
  EXPECT_NEAR(down.stddev, 1.0 / std::sqrt(512.0), 0.002);
  EXPECT_LE(down.max_abs, std::sqrt(3.0 / 512.0) + 1e-6);
  const Stats q = stats_of(tensor_values(f.tensor("blk.1.attn_q.weight")));  // 256 cols
  EXPECT_NEAR(q.stddev, 1.0 / 16.0, 0.002);
  const Stats norm = stats_of(tensor_values(f.tensor("blk.0.ffn_norm.weight")));
  EXPECT_NEAR(norm.mean, 1.0, 0.02);
  EXPECT_LE(norm.max_abs, 1.1 + 1e-6);
  const Stats bias = stats_of(tensor_values(f.tensor("blk.0.attn_v.bias")));
  EXPECT_LE(bias.max_abs, 0.02 + 1e-6);
  EXPECT_GT(bias.stddev, 0.005);
}

TEST(SyntheticModel, QuantizedTypeDecodesNearTheSameWeights) {
  const auto f32 = build_synthetic_model(tiny_options(Arch::kLlama, "f32", 3)).to_bytes();
  const auto q8 = build_synthetic_model(tiny_options(Arch::kLlama, "q8_0", 3)).to_bytes();
  const GgufFile a = GgufFile::parse(f32, "f32.gguf");
  const GgufFile b = GgufFile::parse(q8, "q8.gguf");
  EXPECT_EQ(b.get_uint("general.file_type"), 7u);
  const auto& tb = b.tensor("blk.0.ffn_up.weight");
  EXPECT_EQ(tb.type, DType::Q8_0);
  EXPECT_EQ(b.tensor("blk.0.ffn_norm.weight").type, DType::F32);
  const std::vector<float> x = tensor_values(a.tensor("blk.0.ffn_up.weight"));
  const std::vector<float> y = tensor_values(tb);
  double max_err = 0;
  for (size_t i = 0; i < x.size(); ++i) max_err = std::max(max_err, (double)std::fabs(x[i] - y[i]));
  // Q8_0 rounds to 1/127 of each block's largest magnitude (<= sqrt(3/256)).
  EXPECT_LT(max_err, std::sqrt(3.0 / 256.0) / 127.0);
  EXPECT_GT(max_err, 0.0);
}

TEST(SyntheticModel, RealVocabularyIsCopiedAndSizesTheEmbedding) {
  const std::string vocab = hablar::test::testdata_dir() + "/vocab/ggml-vocab-qwen2.gguf";
  ASSERT_TRUE(std::filesystem::exists(vocab)) << vocab;
  const std::string dir = hablar::test::make_temp_dir("synth-vocab");
  SyntheticModelOptions o = tiny_options(Arch::kQwen2, "q8_0");
  o.vocab_path = vocab;
  const SyntheticModelSummary sum = write_synthetic_model(o, dir + "/m.gguf");
  const GgufFile v = GgufFile::open(vocab);
  const GgufFile f = GgufFile::open(dir + "/m.gguf");
  const size_t n_vocab = v.get_string_array("tokenizer.ggml.tokens").size();
  EXPECT_EQ(sum.vocab_size, (int64_t)n_vocab);
  EXPECT_EQ(f.tensor("token_embd.weight").dims, (std::vector<int64_t>{256, (int64_t)n_vocab}));
  EXPECT_EQ(f.get_uint("qwen2.vocab_size"), n_vocab);
  size_t copied = 0;
  for (const auto& [key, value] : v.metadata()) {
    if (key.rfind("tokenizer.", 0) != 0) continue;
    ++copied;
    ASSERT_TRUE(f.has(key)) << key;
    EXPECT_EQ(f.find(key)->type, value.type) << key;
  }
  EXPECT_GE(copied, 5u);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.merges"),
            v.get_string_array("tokenizer.ggml.merges"));
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), v.get_string("tokenizer.ggml.pre"));
  EXPECT_FALSE(f.has("tokenizer.ggml.scores"));  // nothing synthetic mixed in
  std::filesystem::remove_all(dir);
}

TEST(SyntheticModel, ExactKQuantRowsDecodeNearTheF32Weights) {
  // Same seed, same value streams: exact Q4_K rows are the F32 rows, quantized.
  auto exact = tiny_options(Arch::kLlama, "q4_k", 11);
  exact.exact_quantization = true;
  const auto f32 = build_synthetic_model(tiny_options(Arch::kLlama, "f32", 11)).to_bytes();
  const auto q4k = build_synthetic_model(exact).to_bytes();
  const GgufFile a = GgufFile::parse(f32, "f32.gguf");
  const GgufFile b = GgufFile::parse(q4k, "q4k.gguf");
  EXPECT_EQ(b.tensor("blk.0.ffn_gate.weight").type, DType::Q4_K);
  const std::vector<float> x = tensor_values(a.tensor("blk.0.ffn_gate.weight"));
  const std::vector<float> y = tensor_values(b.tensor("blk.0.ffn_gate.weight"));
  double max_err = 0;
  for (size_t i = 0; i < x.size(); ++i) max_err = std::max(max_err, (double)std::fabs(x[i] - y[i]));
  // 4-bit codes over a sub-block's range (<= 2 * sqrt(3/256)): error below a 15th of it.
  EXPECT_LT(max_err, 2.0 * std::sqrt(3.0 / 256.0) / 15.0);
}

TEST(SyntheticModel, LargeSlowTypeTensorsComeFromASeededBlockPool) {
  auto pooled = tiny_options(Arch::kLlama, "q4_k", 11);
  pooled.pool_blocks = 64;
  pooled.pool_min_tensor_blocks = 100;  // ffn matrices (512 blocks) pooled, norms not
  const auto bytes = build_synthetic_model(pooled).to_bytes();
  auto other_threads = pooled;
  other_threads.n_threads = 1;
  EXPECT_EQ(bytes, build_synthetic_model(other_threads).to_bytes());
  const GgufFile f = GgufFile::parse(bytes, "pooled.gguf");
  const gguf::TensorInfo& t = f.tensor("blk.1.ffn_up.weight");
  ASSERT_EQ(t.type, DType::Q4_K);
  // At most pool_blocks distinct 144-byte blocks, and rows that differ from each other.
  std::set<std::string> blocks;
  for (uint64_t at = 0; at < t.nbytes; at += 144)
    blocks.insert(std::string((const char*)t.data + at, 144));
  EXPECT_LE(blocks.size(), 64u);
  EXPECT_GT(blocks.size(), 40u);
  const size_t row_bytes = dtype_row_bytes(t.type, t.dims[0]);
  EXPECT_NE(std::memcmp(t.data, t.data + row_bytes, row_bytes), 0);
  // Same distribution as exact rows: std 1/sqrt(256) within the quantization error.
  const Stats st = stats_of(tensor_values(t));
  EXPECT_NEAR(st.stddev, 1.0 / 16.0, 0.004);
  EXPECT_NEAR(st.mean, 0.0, 0.004);
}

TEST(SyntheticModel, ClearErrors) {
  EXPECT_THROW(build_synthetic_model(tiny_options(Arch::kLlama, "q9_9")), Error);
  SyntheticModelOptions small_vocab = tiny_options(Arch::kLlama);
  small_vocab.shape.vocab = 100;
  EXPECT_THROW(build_synthetic_model(small_vocab), Error);
  SyntheticModelOptions bad_heads = tiny_options(Arch::kLlama);
  bad_heads.shape.n_kv_heads = 3;
  EXPECT_THROW(build_synthetic_model(bad_heads), Error);
  SyntheticModelOptions not_vocab = tiny_options(Arch::kLlama);
  not_vocab.vocab_path = "/nonexistent/vocab.gguf";
  EXPECT_THROW(build_synthetic_model(not_vocab), Error);
}

}  // namespace
}  // namespace hablar::synth
