// Bad models and bad forward inputs give clear errors, never crashes.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "core/error.h"
#include "model_test_util.h"

namespace hablar {
namespace {

using Value = gguf::Value;

// A tiny llama F32 model (synthetic vocabulary) rewritten through `edit`: metadata values may
// be replaced and tensors dropped or retyped before the file is written.
struct ModelEdit {
  std::function<void(std::string& key, Value& value)> metadata;
  std::function<bool(gguf::TensorInfo& tensor)> keep_tensor;  // may change the type
};

ModelEdit edit_metadata(std::function<void(std::string&, Value&)> fn) {
  ModelEdit e;
  e.metadata = std::move(fn);
  return e;
}
ModelEdit edit_tensors(std::function<bool(gguf::TensorInfo&)> fn) {
  ModelEdit e;
  e.keep_tensor = std::move(fn);
  return e;
}

std::string write_edited(const std::string& dir, const ModelEdit& edit) {
  synth::SyntheticModelOptions o;
  o.arch = synth::Arch::kLlama;
  o.shape = *synth::shape_from_name("tiny");
  o.type = "f32";
  o.seed = 3;
  const std::vector<uint8_t> bytes = synth::build_synthetic_model(o).to_bytes();
  const gguf::GgufFile src = gguf::GgufFile::parse(bytes, "synthetic");
  gguf::GgufWriter w;
  for (auto [key, value] : src.metadata()) {
    if (key == "general.alignment") continue;
    if (edit.metadata) edit.metadata(key, value);
    w.set(key, value);
  }
  for (gguf::TensorInfo t : src.tensors()) {
    if (edit.keep_tensor && !edit.keep_tensor(t)) continue;
    w.add_tensor_bytes(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  }
  const std::string path = dir + "/edited.gguf";
  w.write(path);
  return path;
}

void expect_load_error(const ModelEdit& edit, ErrorKind kind, const std::string& needle) {
  const std::string dir = test::make_temp_dir("hablar-model-err");
  const std::string path = write_edited(dir, edit);
  try {
    model::Model::load(path);
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(ModelErrors, UnmodifiedModelLoads) {
  const std::string dir = test::make_temp_dir("hablar-model-ok");
  auto m = model::Model::load(write_edited(dir, {}));
  EXPECT_EQ(m->config().arch, "llama");
  EXPECT_EQ(m->config().n_layers, 2);
  EXPECT_FALSE(m->config().rope.neox);
  m.reset();
  std::filesystem::remove_all(dir);
}

TEST(ModelErrors, UnsupportedArchitectureListsSupportedOnes) {
  expect_load_error(
      edit_metadata([](std::string& k, Value& v) {
        if (k == "general.architecture") v = Value::string("gpt2");
      }),
      ErrorKind::kUnsupported,
      "supported: llama, ernie4_5, exaone, xverse, internlm2, seed_oss, qwen2, qwen2moe, qwen3, "
      "qwen3moe, phi2, phi3, smollm3, granite, granitemoe, olmo2, exaone4, hunyuan-dense, glm4, "
      "arcee, "
      "mistral3, minicpm, olmoe, starcoder2, orion, nemotron, stablelm, command-r, cohere2, gemma, "
      "gemma2, "
      "gemma3");
}

// A granite file must say how its logits are scaled (llama.cpp requires the key too).
TEST(ModelErrors, GraniteWithoutItsLogitScaleNamesTheKey) {
  expect_load_error(edit_metadata([](std::string& k, Value& v) {
                      if (k == "general.architecture") v = Value::string("granite");
                      if (k.rfind("llama.", 0) == 0) k = "granite." + k.substr(6);
                    }),
                    ErrorKind::kFormat, "granite.logit_scale");
}

TEST(ModelErrors, TensorShapeDisagreeingWithMetadataNamesTheTensor) {
  expect_load_error(edit_metadata([](std::string& k, Value& v) {
                      if (k == "llama.embedding_length") v = Value::u32(128);
                    }),
                    ErrorKind::kFormat,
                    "token_embd.weight has shape [256, 512], metadata implies [128, 512]");
}

TEST(ModelErrors, FeedForwardLengthDisagreeing) {
  expect_load_error(edit_metadata([](std::string& k, Value& v) {
                      if (k == "llama.feed_forward_length") v = Value::u32(384);
                    }),
                    ErrorKind::kFormat, "blk.0.ffn_gate.weight has shape");
}

TEST(ModelErrors, MoreLayersThanTensorsNamesTheMissingTensor) {
  expect_load_error(edit_metadata([](std::string& k, Value& v) {
                      if (k == "llama.block_count") v = Value::u32(3);
                    }),
                    ErrorKind::kFormat, "tensor blk.2.attn_norm.weight is missing");
}

TEST(ModelErrors, MissingTensor) {
  expect_load_error(
      edit_tensors([](gguf::TensorInfo& t) { return t.name != "blk.1.ffn_up.weight"; }),
      ErrorKind::kFormat, "tensor blk.1.ffn_up.weight is missing");
}

TEST(ModelErrors, UnsupportedTensorTypeListsSupportedTypes) {
  expect_load_error(edit_tensors([](gguf::TensorInfo& t) {
                      if (t.name == "blk.0.attn_q.weight") t.type = DType::I32;  // same size as f32
                      return true;
                    }),
                    ErrorKind::kUnsupported,
                    "blk.0.attn_q.weight has type i32, not supported (supported: ");
}

TEST(ModelErrors, HeadCountNotMultipleOfKvHeads) {
  expect_load_error(edit_metadata([](std::string& k, Value& v) {
                      if (k == "llama.attention.head_count_kv") v = Value::u32(3);
                    }),
                    ErrorKind::kFormat, "not a multiple of head_count_kv 3");
}

TEST(ModelErrors, MissingRequiredKey) {
  expect_load_error(edit_metadata([](std::string& k, Value&) {
                      if (k == "llama.block_count") k = "llama.block_count_renamed";
                    }),
                    ErrorKind::kFormat, "llama.block_count");
}

class ForwardErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::make_temp_dir("hablar-fwd-err");
    model_ = model::Model::load(write_edited(dir_, {}));
  }
  void TearDown() override {
    model_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::string dir_;
  std::unique_ptr<model::Model> model_;
};

TEST_F(ForwardErrors, PromptLongerThanContext) {
  test::CpuSequence seq(*model_, 8);
  const std::vector<int32_t> ids(9, 1);
  try {
    seq.eval(ids);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kResource);
    EXPECT_NE(std::string(e.what()).find("exceed the context size 8"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(seq.n_past(), 0);  // nothing was evaluated
}

TEST_F(ForwardErrors, TokenOutsideVocabulary) {
  test::CpuSequence seq(*model_, 8);
  const std::vector<int32_t> ids{1, model_->config().n_vocab};
  EXPECT_THROW(seq.eval(ids), Error);
}

TEST_F(ForwardErrors, BlockTableTooShortOrOutOfRange) {
  engine::CpuExecutor cache(*model_, 4);
  std::vector<float> logits;
  const std::vector<int32_t> tokens(20, 1);
  const std::vector<int32_t> one_block{0};
  model::SequenceChunk ch{tokens, 0, one_block, false};
  EXPECT_THROW(cache.forward(std::span(&ch, 1), logits), Error);
  const std::vector<int32_t> bad_blocks{0, 7};
  ch.block_table = bad_blocks;
  EXPECT_THROW(cache.forward(std::span(&ch, 1), logits), Error);
}

TEST_F(ForwardErrors, ZeroContextAndBadThreadCount) {
  EXPECT_THROW(test::CpuSequence(*model_, 0), Error);
  EXPECT_THROW(engine::CpuExecutor(*model_, 4, 16, /*n_threads=*/-1), Error);
}

}  // namespace
}  // namespace hablar
