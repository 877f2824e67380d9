// APR v2: a synthetic GGUF model converted to APR gives the same logits (its bytes copied
// through); the CRCs catch a flipped byte; unknown dtype bytes and unsupported flags are
// refused by name; APR-Q4 / APR-Q8 data decode to their values. Every architecture round-trips.
#include <gtest/gtest.h>
#include <algorithm>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/fp16.h"
#include "core/quant.h"
#include "formats/apr.h"
#include "model_test_util.h"

namespace hablar {
namespace {

namespace fs = std::filesystem;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream(p, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), (std::streamsize)b.size());
}

class AprRoundTrip : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(AprRoundTrip, SameLogitsAsTheGguf) {
  const auto& [arch, type] = GetParam();
  const fs::path dir = fs::path(::testing::TempDir()) / ("apr-" + arch + "-" + type);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string gguf_path = test::write_synthetic(dir.string(), arch, type, "", 11);
  auto ref = model::Model::load(gguf_path);
  const fs::path apr_path = dir / "model.apr";
  write_bytes(apr_path, apr::from_gguf(ref->file()));
  auto m = model::Model::load(apr_path.string());
  EXPECT_EQ(m->config().n_layers, ref->config().n_layers);
  EXPECT_EQ(m->config().rope.neox, ref->config().rope.neox);
  EXPECT_EQ(m->tokenizer().n_vocab(), ref->tokenizer().n_vocab());
  EXPECT_EQ(m->tokenizer().encode("hello world", true, false),
            ref->tokenizer().encode("hello world", true, false));
  std::vector<int32_t> tokens;
  for (int i = 0; i < 20; ++i) tokens.push_back((i * 53 + 3) % ref->config().n_vocab);
  test::CpuSequence sa(*ref, 64), sb(*m, 64);
  const std::span<const float> first = sa.eval(tokens, true);
  const std::vector<float> la(first.begin(), first.end());
  const std::span<const float> lb = sb.eval(tokens, true);
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)));  // bit-identical
}

// Every family: the hyperparameters APR has no field for (LayerNorm epsilon, partial RoPE,
// windows, soft-caps, experts) travel as extra keys under their GGUF names; phi2's output
// biases under theirs.
INSTANTIATE_TEST_SUITE_P(
    Models, AprRoundTrip,
    ::testing::Values(
        std::pair{"llama", "f32"}, std::pair{"qwen2", "q4_k_m"}, std::pair{"qwen3", "f16"},
        std::pair{"phi2", "f16"}, std::pair{"phi3", "f16"}, std::pair{"gemma", "f16"},
        std::pair{"gemma2", "q4_k_m"}, std::pair{"gemma3", "f16"}, std::pair{"mixtral", "f16"},
        std::pair{"qwen2moe", "f16"}, std::pair{"qwen3moe", "f16"},
        // (adjacent-pair RoPE beside llama: the APR's rope_type must say so)
        std::pair{"smollm3", "f16"}, std::pair{"granite", "f16"}, std::pair{"ernie4_5", "f16"},
        std::pair{"glm4", "q4_k_m"}, std::pair{"olmo2", "f16"}, std::pair{"starcoder2", "f16"},
        std::pair{"exaone4", "f16"}, std::pair{"hunyuan-dense", "f16"}, std::pair{"arcee", "f16"},
        std::pair{"mistral3", "f16"}, std::pair{"exaone", "f16"}, std::pair{"xverse", "f16"},
        std::pair{"seed_oss", "f16"}, std::pair{"command-r", "f16"}, std::pair{"cohere2", "f16"},
        std::pair{"minicpm", "f16"}, std::pair{"olmoe", "f16"}, std::pair{"internlm2", "f16"},
        std::pair{"orion", "f16"}, std::pair{"nemotron", "f16"}, std::pair{"stablelm", "f16"},
        std::pair{"granitemoe", "f16"}),
    [](const auto& info) {
      std::string name = std::string(info.param.first) + "_" + info.param.second;
      std::replace(name.begin(), name.end(), '-', '_');  // (hunyuan-dense)
      return name;
    });

std::vector<uint8_t> small_file(uint8_t dtype, std::vector<uint8_t> bytes,
                                std::vector<uint64_t> shape) {
  return apr::write({{"architecture", "llama"},
                     {"hidden_size", 32},
                     {"num_layers", 1},
                     {"num_heads", 1},
                     {"vocab_size", 4}},
                    {{"model.norm.weight", dtype, std::move(shape), std::move(bytes)}});
}

TEST(Apr, CrcCatchesAFlippedByte) {
  std::vector<uint8_t> f = small_file(0, std::vector<uint8_t>(128, 1), {32});
  EXPECT_EQ(error_of([&] { apr::parse(f, "ok.apr"); }), "");
  std::vector<uint8_t> h = f;
  h[9] ^= 1;
  EXPECT_NE(error_of([&] { apr::parse(h, "h.apr"); }).find("header CRC-32 mismatch"),
            std::string::npos);
  std::vector<uint8_t> d = f;
  d[d.size() - 10] ^= 0x40;
  EXPECT_NE(error_of([&] { apr::parse(d, "d.apr"); }).find("footer CRC-32 mismatch"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              apr::parse(std::vector<uint8_t>(f.begin(), f.begin() + 60), "t.apr");
            }).find("too small"),
            std::string::npos);
}

TEST(Apr, RefusesAmbiguousDtypesAndUnsupportedFlags) {
  const std::string e =
      error_of([&] { apr::parse(small_file(2, std::vector<uint8_t>(18), {32}), "q.apr"); });
  EXPECT_NE(e.find("dtype byte 2"), std::string::npos) << e;
  std::vector<uint8_t> f = small_file(0, std::vector<uint8_t>(128), {32});
  f[6] |= 0x4;  // encrypted; fix both CRCs so only the flag is at fault
  std::vector<uint8_t> h(f.begin(), f.begin() + 40);
  h.insert(h.end(), f.begin() + 44, f.begin() + 64);
  const uint32_t hc = apr::crc32(h);
  std::memcpy(f.data() + 40, &hc, 4);
  const uint32_t fc = apr::crc32(std::span<const uint8_t>(f.data(), f.size() - 4));
  std::memcpy(f.data() + f.size() - 4, &fc, 4);
  EXPECT_NE(error_of([&] { apr::parse(f, "e.apr"); }).find("encrypted"), std::string::npos);
}

TEST(Apr, AprQ4AndQ8DecodeToTheirValues) {
  // APR-Q4: one block of 32, scale 0.5, value i has code i % 16 (even index in the low nibble).
  std::vector<uint8_t> q4(18);
  const uint16_t half = f32_to_fp16(0.5f);
  std::memcpy(q4.data(), &half, 2);
  for (int k = 0; k < 16; ++k) q4[2 + k] = (uint8_t)(((2 * k) % 16) | (((2 * k + 1) % 16) << 4));
  const auto f4 = apr::parse(small_file(128, q4, {32}), "q4.apr");
  const gguf::TensorInfo& t4 = f4.tensor("output_norm.weight");
  float v[32];
  dequantize_row(t4.type, t4.data, v, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(v[i], (float)(i % 16 - 8) * 0.5f) << i;
  // APR-Q8: scale 0.25, values -16..15.
  std::vector<uint8_t> q8(4 + 32);
  const float s = 0.25f;
  std::memcpy(q8.data(), &s, 4);
  for (int i = 0; i < 32; ++i) q8[4 + i] = (uint8_t)(int8_t)(i - 16);
  const auto f8 = apr::parse(small_file(129, q8, {32}), "q8.apr");
  const gguf::TensorInfo& t8 = f8.tensor("output_norm.weight");
  ASSERT_EQ(t8.type, DType::F32);
  for (int i = 0; i < 32; ++i)
    EXPECT_EQ(reinterpret_cast<const float*>(t8.data)[i], (float)(i - 16) * 0.25f);
}

}  // namespace
}  // namespace hablar
