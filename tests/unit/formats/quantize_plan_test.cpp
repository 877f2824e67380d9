// plan_quantization on a 32-layer model's tensor list (no data needed): llama.cpp's order
// (outside-block tensors first, then by layer, by name within a layer), the Q4_K_M and
// Q4_K_S layer rules at a depth the byte-level goldens (8 layers) do not reach, and the
// type names llama-quantize accepts. The bytes are checked against llama.cpp in
// tests/python/test_quantize_golden.py.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "formats/quantize.h"

namespace hablar::formats {
namespace {

using gguf::TensorInfo;
using gguf::Value;

gguf::GgufFile llama_like(int n_layers, int64_t hidden, int heads, int kv_heads) {
  std::vector<std::pair<std::string, Value>> meta = {
      {"general.architecture", Value::string("llama")},
      {"llama.block_count", Value::u32((uint32_t)n_layers)},
      {"llama.attention.head_count", Value::u32((uint32_t)heads)},
      {"llama.attention.head_count_kv", Value::u32((uint32_t)kv_heads)}};
  std::vector<TensorInfo> t;
  auto add = [&](std::string name, std::vector<int64_t> dims) {
    TensorInfo i;
    i.name = std::move(name);
    i.dims = std::move(dims);
    i.type = DType::F16;
    t.push_back(std::move(i));
  };
  add("token_embd.weight", {hidden, 1000});
  for (int l = 0; l < n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", {hidden});
    add(b + "attn_q.weight", {hidden, hidden});
    add(b + "attn_v.weight", {hidden, hidden / heads * kv_heads});
    add(b + "ffn_down.weight", {4 * hidden, hidden});
  }
  add("output_norm.weight", {hidden});
  add("output.weight", {hidden, 1000});
  return gguf::GgufFile::assemble("llama-like", std::move(meta), std::move(t), nullptr);
}

DType type_of(const std::vector<QuantizedTensorPlan>& plan, const std::string& name) {
  for (const auto& p : plan)
    if (p.source->name == name) return p.type;
  throw std::runtime_error("no tensor " + name);
}

TEST(QuantizePlan, LlamaCppTensorOrder) {
  const auto f = llama_like(12, 256, 4, 4);
  const auto plan = plan_quantization(f, Ftype::kQ8_0);
  ASSERT_EQ(plan.size(), f.tensors().size());
  EXPECT_EQ(plan[0].source->name, "output.weight");
  EXPECT_EQ(plan[1].source->name, "output_norm.weight");
  EXPECT_EQ(plan[2].source->name, "token_embd.weight");
  EXPECT_EQ(plan[3].source->name, "blk.0.attn_norm.weight");
  // blk.2 before blk.10: by layer number, not by text.
  size_t i2 = 0, i10 = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (plan[i].source->name == "blk.2.attn_q.weight") i2 = i;
    if (plan[i].source->name == "blk.10.attn_q.weight") i10 = i;
  }
  EXPECT_LT(i2, i10);
  // Q8_0 leaves the output in Q8_0 (every other quantized type gives it Q6_K).
  EXPECT_EQ(type_of(plan, "output.weight"), DType::Q8_0);
  EXPECT_EQ(type_of(plan_quantization(f, Ftype::kQ4_0), "output.weight"), DType::Q6_K);
}

TEST(QuantizePlan, MediumMixAt32Layers) {
  const auto f = llama_like(32, 4096, 32, 8);
  const auto plan = plan_quantization(f, Ftype::kQ4_K_M);
  for (int l = 0; l < 32; ++l) {
    const bool more = l < 4 || l >= 28 || (l - 4) % 3 == 2;
    const std::string b = "blk." + std::to_string(l) + ".";
    EXPECT_EQ(type_of(plan, b + "attn_v.weight"), more ? DType::Q6_K : DType::Q4_K) << l;
    EXPECT_EQ(type_of(plan, b + "ffn_down.weight"), more ? DType::Q6_K : DType::Q4_K) << l;
    EXPECT_EQ(type_of(plan, b + "attn_q.weight"), DType::Q4_K);
    EXPECT_EQ(type_of(plan, b + "attn_norm.weight"), DType::F16);  // 1-D: kept as it is
  }
  EXPECT_EQ(type_of(plan, "output.weight"), DType::Q6_K);
  EXPECT_EQ(type_of(plan, "token_embd.weight"), DType::Q4_K);  // untied: the base type
}

TEST(QuantizePlan, SmallMixAndGroupedQueryRules) {
  const auto f = llama_like(32, 4096, 32, 8);
  const auto s = plan_quantization(f, Ftype::kQ4_K_S);
  for (int l = 0; l < 32; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    EXPECT_EQ(type_of(s, b + "attn_v.weight"), l < 4 ? DType::Q5_K : DType::Q4_K) << l;
    EXPECT_EQ(type_of(s, b + "ffn_down.weight"), l < 4 ? DType::Q5_K : DType::Q4_K) << l;
  }
  // Q2_K: attn_v gets Q4_K with 4+ query heads per KV head, ffn_down Q3_K.
  const auto q2 = plan_quantization(f, Ftype::kQ2_K);
  EXPECT_EQ(type_of(q2, "blk.5.attn_v.weight"), DType::Q4_K);
  EXPECT_EQ(type_of(q2, "blk.5.ffn_down.weight"), DType::Q3_K);
  const auto mha = llama_like(4, 512, 8, 8);  // the plan points into it: keep it alive
  const auto q2_mha = plan_quantization(mha, Ftype::kQ2_K);
  EXPECT_EQ(type_of(q2_mha, "blk.1.attn_v.weight"), DType::Q3_K);
}

TEST(QuantizePlan, NamesAndAliases) {
  EXPECT_EQ(ftype_from_name("q4_k_m"), Ftype::kQ4_K_M);
  EXPECT_EQ(ftype_from_name("Q4_K"), Ftype::kQ4_K_M);
  EXPECT_EQ(ftype_from_name("Q3_K"), Ftype::kQ3_K_M);
  EXPECT_EQ(ftype_from_name("bf16"), Ftype::kBF16);
  EXPECT_FALSE(ftype_from_name("Q2_K_S"));  // needs an importance matrix
  EXPECT_FALSE(ftype_from_name("IQ2_XXS"));
  EXPECT_EQ(ftype_name(Ftype::kQ5_K_M), "Q5_K_M");
  EXPECT_EQ(ftype_default_type(Ftype::kIQ4_XS), DType::IQ4_XS);
}

}  // namespace
}  // namespace hablar::formats
