// Model summaries (what `hablar info` prints) from GGUF metadata and tensor infos.
#include <gtest/gtest.h>

#include "core/paths.h"
#include "formats/gguf.h"
#include "formats/model_info.h"
#include "formats/synthetic_model.h"
#include "support/test_support.h"

namespace hablar::gguf {
namespace {

// The acceptance figures of the default model (SmolLM2-135M-Instruct, Q4_1).
TEST(ModelInfo, DefaultModelHyperparametersAndTokenizer) {
  const std::string path = hablar::test::default_model_path_or_empty();
  ASSERT_FALSE(path.empty()) << "default model missing; fetch it with " << kFetchModelCommand;
  const GgufFile f = GgufFile::open(path);
  const ModelInfo m = summarize_model(f);
  EXPECT_EQ(m.architecture, "llama");
  EXPECT_EQ(m.hparams.n_layers, 30u);
  EXPECT_EQ(m.hparams.hidden, 576u);
  EXPECT_EQ(m.hparams.n_heads, 9u);
  EXPECT_EQ(m.hparams.n_kv_heads, 3u);
  EXPECT_EQ(m.hparams.head_dim, 64u);
  EXPECT_EQ(m.hparams.ffn, 1536u);
  EXPECT_EQ(m.hparams.vocab_size, 49152u);
  EXPECT_EQ(m.hparams.rope_base, 100000.0);
  EXPECT_EQ(m.hparams.norm_eps, 1e-5);  // shown as the f32's shortest decimal
  ASSERT_TRUE(m.tokenizer.has_value());
  EXPECT_EQ(m.tokenizer->model, "gpt2");
  EXPECT_EQ(m.tokenizer->n_tokens, 49152u);
  EXPECT_GT(m.tokenizer->n_merges, 0u);
  ASSERT_FALSE(m.tokenizer->special.empty());
  EXPECT_EQ(m.tokenizer->special[0].role, "bos");
  EXPECT_EQ(m.tokenizer->special[0].text, "<|im_start|>");
  ASSERT_TRUE(m.chat_template.has_value());
  EXPECT_NE(m.chat_template->find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(file_type_name(*m.file_type), "q4_1");
  // Totals add up the tensor table; the real types are kept per tensor.
  uint64_t params = 0, bytes = 0;
  for (const TensorInfo& t : f.tensors()) {
    params += (uint64_t)t.n_elements();
    bytes += t.nbytes;
  }
  EXPECT_EQ(m.n_params, params);
  EXPECT_EQ(m.n_bytes, bytes);
  EXPECT_EQ(f.tensor("token_embd.weight").type, DType::Q8_0);
  EXPECT_EQ(f.tensor("blk.0.attn_q.weight").type, DType::Q4_1);
  EXPECT_EQ(m.by_type.at("q4_1").n_tensors, 210u);
  EXPECT_NEAR(m.bits_per_weight(), 8.0 * (double)bytes / (double)params, 1e-9);
}

TEST(ModelInfo, SyntheticModelReportsItsShape) {
  synth::SyntheticModelOptions o;
  o.arch = synth::Arch::kQwen3;
  o.shape = *synth::shape_from_name("tiny");
  o.type = "q8_0";
  o.n_threads = 1;
  const auto bytes = synth::build_synthetic_model(o).to_bytes();
  const GgufFile f = GgufFile::parse(bytes, "tiny.gguf");
  const ModelInfo m = summarize_model(f);
  EXPECT_EQ(m.architecture, "qwen3");
  EXPECT_EQ(m.hparams.n_layers, 2u);
  EXPECT_EQ(m.hparams.hidden, 256u);
  EXPECT_EQ(m.hparams.n_kv_heads, 2u);
  EXPECT_EQ(m.hparams.vocab_size, 512u);
  EXPECT_EQ(m.file_type, 7u);
  EXPECT_EQ(file_type_name(7), "q8_0");
  EXPECT_FALSE(m.chat_template.has_value());
  EXPECT_EQ(m.tokenizer->model, "llama");
  EXPECT_EQ(m.by_type.at("q8_0").n_tensors, 2u * 7 + 2);  // 7 matrices a layer, embd, output
}

TEST(ModelInfo, FileTypeNamesRoundTrip) {
  for (const char* name : {"f32", "f16", "q4_0", "q8_0", "q4_k_m", "q5_k_m", "q6_k", "bf16"})
    EXPECT_EQ(file_type_name(*file_type_from_name(name)), name);
  EXPECT_EQ(file_type_from_name("Q4_K"), 14u);  // plain K type: the small mix
  EXPECT_FALSE(file_type_from_name("q9_0"));
  EXPECT_EQ(file_type_name(999), "unknown");
}

TEST(ModelInfo, ValuePreviewIsShortAndTyped) {
  EXPECT_EQ(value_preview(Value::u32(5)), "5");
  EXPECT_EQ(value_preview(Value::boolean(true)), "true");
  EXPECT_EQ(value_preview(Value::string("a\"b\nc")), "\"a\\\"b\\nc\"");
  EXPECT_EQ(value_preview(Value::i32_array({1, 2})), "[2 x i32] 1, 2");
  const std::string long_array =
      value_preview(Value::string_array(std::vector<std::string>(1000, "tok")));
  EXPECT_EQ(long_array.rfind("[1000 x string] \"tok\"", 0), 0u);
  EXPECT_LT(long_array.size(), 120u);
}

}  // namespace
}  // namespace hablar::gguf
