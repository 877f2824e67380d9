// phi2 files beyond the golden ones (golden_synthetic_test.cpp): the fused attn_qkv layout of
// older conversions gives the same values as q, k, v apart; missing biases and heads that do
// not span the embedding are named at load; a decoder embedding of a phi2 model is its final
// LayerNorm's rows.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "model_test_util.h"

namespace hablar {
namespace {

std::vector<uint8_t> tiny_phi2_bytes() {
  synth::SyntheticModelOptions o;
  o.arch = synth::Arch::kPhi2;
  o.shape = *synth::shape_from_name("tiny");
  o.type = "f16";
  o.seed = 11;
  return synth::build_synthetic_model(o).to_bytes();
}

// The same model with each layer's q, k, v weights (rows in that order) and biases joined
// into attn_qkv, as Phi-2 files converted from its first checkpoints hold them.
void write_fused(const gguf::GgufFile& src, const std::string& path) {
  gguf::GgufWriter w;
  for (const auto& [key, value] : src.metadata())
    if (key != "general.alignment") w.set(key, value);
  const auto bytes = [](const gguf::TensorInfo& t) {
    return std::vector<uint8_t>(t.data, t.data + t.nbytes);
  };
  const auto n_layers = (int)src.get_uint("phi2.block_count");
  for (const gguf::TensorInfo& t : src.tensors()) {
    const bool split = t.name.find(".attn_q.") != std::string::npos ||
                       t.name.find(".attn_k.") != std::string::npos ||
                       t.name.find(".attn_v.") != std::string::npos;
    if (!split) w.add_tensor_bytes(t.name, t.type, t.dims, bytes(t));
  }
  for (int l = 0; l < n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    for (const char* part : {"weight", "bias"}) {
      std::vector<uint8_t> joined;
      std::vector<int64_t> dims;
      DType type = DType::F32;
      for (const char* m : {"attn_q.", "attn_k.", "attn_v."}) {
        const gguf::TensorInfo& t = src.tensor(p + m + part);
        const std::vector<uint8_t> b = bytes(t);
        joined.insert(joined.end(), b.begin(), b.end());
        if (dims.empty()) {
          dims = t.dims, type = t.type;
        } else {
          dims.back() += t.dims.back();
        }
      }
      w.add_tensor_bytes(p + "attn_qkv." + part, type, dims, joined);
    }
  }
  w.write(path);
}

std::vector<int32_t> some_ids() {
  return {1, 300, 301, 17, 450, 260, 261, 499, 42, 300};
}

TEST(Phi2, FusedQkvGivesTheSameLogitsAsSeparateProjections) {
  const std::string dir = test::make_temp_dir("hablar-phi2");
  const std::vector<uint8_t> bytes = tiny_phi2_bytes();
  const gguf::GgufFile src = gguf::GgufFile::parse(bytes, "phi2");
  gguf::GgufWriter plain;
  for (const auto& [key, value] : src.metadata())
    if (key != "general.alignment") plain.set(key, value);
  for (const gguf::TensorInfo& t : src.tensors())
    plain.add_tensor_bytes(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  plain.write(dir + "/plain.gguf");
  write_fused(src, dir + "/fused.gguf");

  auto a = model::Model::load(dir + "/plain.gguf");
  auto b = model::Model::load(dir + "/fused.gguf");
  const auto la = test::teacher_forced_logsoftmax(*a, some_ids());
  const auto lb = test::teacher_forced_logsoftmax(*b, some_ids());
  ASSERT_EQ(la.size(), lb.size());
  for (size_t p = 0; p < la.size(); ++p)
    EXPECT_EQ(0, std::memcmp(la[p].data(), lb[p].data(), la[p].size() * sizeof(float)))
        << "position " << p;
  // The positions differ from one another (the model is not degenerate).
  EXPECT_NE(0, std::memcmp(la[1].data(), la[2].data(), la[1].size() * sizeof(float)));
  a.reset(), b.reset();
  std::filesystem::remove_all(dir);
}

// A phi2 file rewritten without one tensor, or with one metadata value replaced.
void expect_phi2_load_error(const std::string& drop_tensor, const std::string& key,
                            const gguf::Value* value, const std::string& needle) {
  const std::string dir = test::make_temp_dir("hablar-phi2-err");
  const std::vector<uint8_t> bytes = tiny_phi2_bytes();
  const gguf::GgufFile src = gguf::GgufFile::parse(bytes, "phi2");
  gguf::GgufWriter w;
  for (const auto& [k, v] : src.metadata()) {
    if (k == "general.alignment" || (k == key && value == nullptr)) continue;
    w.set(k, k == key ? *value : v);
  }
  for (const gguf::TensorInfo& t : src.tensors())
    if (t.name != drop_tensor)
      w.add_tensor_bytes(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  w.write(dir + "/bad.gguf");
  try {
    model::Model::load(dir + "/bad.gguf");
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(Phi2, MissingBiasesAndEpsilonAreNamed) {
  expect_phi2_load_error("output.bias", "", nullptr, "output.bias is missing");
  expect_phi2_load_error("blk.1.ffn_up.bias", "", nullptr, "blk.1.ffn_up.bias is missing");
  expect_phi2_load_error("blk.0.attn_norm.bias", "", nullptr, "blk.0.attn_norm.bias is missing");
  expect_phi2_load_error("output.weight", "", nullptr, "output.weight is missing");
  expect_phi2_load_error("", "phi2.attention.layer_norm_epsilon", nullptr,
                         "phi2.attention.layer_norm_epsilon");
  const gguf::Value zero = gguf::Value::f32(0.0f);
  expect_phi2_load_error("", "phi2.attention.layer_norm_epsilon", &zero, "must be > 0");
}

TEST(Phi2, HeadsThatDoNotSpanTheEmbeddingAreRefused) {
  const gguf::Value heads = gguf::Value::u32(2);  // 2 x 64 != 256 (2 KV heads: still GQA-valid)
  expect_phi2_load_error("", "phi2.attention.head_count", &heads, "heads must span the embedding");
}

}  // namespace
}  // namespace hablar
