// Quant mixes: which type each tensor gets under q4_k_m / q5_k_m and plain-type mixes, with
// the fallbacks for rows that do not fill a K-quant super-block.
#include <gtest/gtest.h>

#include <string>

#include "core/quant.h"

namespace hablar {
namespace {

std::string layer_tensor(int layer, const char* what) {
  return "blk." + std::to_string(layer) + "." + what + ".weight";
}

TEST(QuantMix, ParsesNames) {
  const auto m = quant_mix_from_name("Q4_K_M");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->base, DType::Q4_K);
  EXPECT_TRUE(m->k_medium);
  const auto m5 = quant_mix_from_name("q5_k_m");
  ASSERT_TRUE(m5.has_value());
  EXPECT_EQ(m5->base, DType::Q5_K);
  const auto q8 = quant_mix_from_name("q8_0");
  ASSERT_TRUE(q8.has_value());
  EXPECT_EQ(q8->base, DType::Q8_0);
  EXPECT_FALSE(q8->k_medium);
  EXPECT_FALSE(quant_mix_from_name("q4_k_xl").has_value());
  EXPECT_FALSE(quant_mix_from_name("iq2_xxs").has_value());  // no quantizer
  EXPECT_FALSE(quant_mix_from_name("q8_k").has_value());     // activation-only format
}

// 32 layers: the first and last eighth (0-3, 28-31) and every third layer between them
// (6, 9, ..., 27) get Q6_K for attn_v and ffn_down.
TEST(QuantMix, MediumMixGivesMoreBitsWhereErrorsPropagate) {
  const QuantMix mix = *quant_mix_from_name("q4_k_m");
  const int n_layers = 32;
  for (int layer = 0; layer < n_layers; ++layer) {
    const bool more = layer < 4 || layer >= 28 || (layer - 4) % 3 == 2;
    const DType want = more ? DType::Q6_K : DType::Q4_K;
    EXPECT_EQ(quant_mix_tensor_type(mix, layer_tensor(layer, "attn_v"), layer, n_layers, 4096),
              want)
        << layer;
    EXPECT_EQ(quant_mix_tensor_type(mix, layer_tensor(layer, "ffn_down"), layer, n_layers, 11008),
              want)
        << layer;
    EXPECT_EQ(quant_mix_tensor_type(mix, layer_tensor(layer, "attn_q"), layer, n_layers, 4096),
              DType::Q4_K);
    EXPECT_EQ(quant_mix_tensor_type(mix, layer_tensor(layer, "ffn_up"), layer, n_layers, 4096),
              DType::Q4_K);
    EXPECT_EQ(quant_mix_tensor_type(mix, layer_tensor(layer, "attn_norm"), layer, n_layers, 4096),
              DType::F32);
  }
  EXPECT_EQ(quant_mix_tensor_type(mix, "output.weight", -1, n_layers, 4096), DType::Q6_K);
  EXPECT_EQ(quant_mix_tensor_type(mix, "token_embd.weight", -1, n_layers, 4096), DType::Q4_K);
  EXPECT_EQ(quant_mix_tensor_type(mix, "output_norm.weight", -1, n_layers, 4096), DType::F32);
  // Tied output: the embedding is the output projection and gets its type.
  EXPECT_EQ(quant_mix_tensor_type(mix, "token_embd.weight", -1, n_layers, 4096, false),
            DType::Q6_K);
  EXPECT_EQ(quant_mix_tensor_type(mix, layer_tensor(0, "attn_qkv"), 0, n_layers, 4096),
            DType::Q5_K);
}

TEST(QuantMix, Q5MediumMix) {
  const QuantMix mix = *quant_mix_from_name("q5_k_m");
  EXPECT_EQ(quant_mix_tensor_type(mix, layer_tensor(0, "ffn_down"), 0, 24, 4096), DType::Q6_K);
  EXPECT_EQ(quant_mix_tensor_type(mix, layer_tensor(4, "ffn_down"), 4, 24, 4096), DType::Q5_K);
  EXPECT_EQ(quant_mix_tensor_type(mix, layer_tensor(4, "attn_k"), 4, 24, 4096), DType::Q5_K);
  EXPECT_EQ(quant_mix_tensor_type(mix, "output.weight", -1, 24, 4096), DType::Q6_K);
  EXPECT_EQ(quant_mix_tensor_type(mix, layer_tensor(3, "attn_qkv"), 3, 24, 4096), DType::Q6_K);
}

// SmolLM2-135M: rows of 576 (not a multiple of 256) fall back to 32-value formats.
TEST(QuantMix, FallsBackWhenTheRowDoesNotFillSuperBlocks) {
  const QuantMix q4 = *quant_mix_from_name("q4_k_m");
  EXPECT_EQ(quant_mix_tensor_type(q4, layer_tensor(5, "attn_q"), 5, 30, 576), DType::Q5_0);
  EXPECT_EQ(quant_mix_tensor_type(q4, layer_tensor(0, "attn_v"), 0, 30, 576), DType::Q8_0);
  EXPECT_EQ(quant_mix_tensor_type(q4, "token_embd.weight", -1, 30, 576, false), DType::Q8_0);
  const QuantMix q5 = *quant_mix_from_name("q5_k_m");
  EXPECT_EQ(quant_mix_tensor_type(q5, layer_tensor(5, "attn_q"), 5, 30, 576), DType::Q5_1);
  // Not even a multiple of 32: F16.
  EXPECT_EQ(quant_mix_tensor_type(q4, layer_tensor(5, "attn_q"), 5, 30, 100), DType::F16);
  const QuantMix q8 = *quant_mix_from_name("q8_0");
  EXPECT_EQ(quant_mix_tensor_type(q8, layer_tensor(5, "attn_q"), 5, 30, 100), DType::F16);
  EXPECT_EQ(quant_mix_tensor_type(q8, layer_tensor(5, "attn_q"), 5, 30, 576), DType::Q8_0);
  // Every result suits the row it was chosen for.
  for (int64_t n_cols : {32, 64, 96, 576, 1024, 1000, 4096}) {
    const DType t = quant_mix_tensor_type(q4, layer_tensor(1, "ffn_down"), 1, 30, n_cols);
    EXPECT_EQ(n_cols % dtype_traits(t).block_elems, 0) << n_cols;
    EXPECT_TRUE(has_quantizer(t)) << n_cols;
  }
}

}  // namespace
}  // namespace hablar
