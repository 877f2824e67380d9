// Hugging Face directories: a synthetic GGUF model of each architecture written out as a
// transformers checkpoint (config.json, safetensors, tokenizer.json) loads to the same
// configuration and gives the same logits; malformed files give clear errors.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/error.h"
#include "core/fp16.h"
#include "formats/hf_model.h"
#include "formats/safetensors.h"
#include "formats/tensor_names.h"
#include "model/weights.h"
#include "model_test_util.h"

namespace hablar {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct StTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// u64 little-endian length, then the text.
std::vector<uint8_t> size_prefixed(const std::string& h) {
  std::vector<uint8_t> out;
  out.reserve(8 + h.size());
  for (int i = 0; i < 8; ++i) out.push_back((uint8_t)((uint64_t)h.size() >> (8 * i)));
  for (char c : h) out.push_back((uint8_t)c);
  return out;
}

std::vector<uint8_t> safetensors_bytes(const std::map<std::string, StTensor>& tensors) {
  json header = json::object();
  std::vector<uint8_t> data;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", t.dtype},
                    {"shape", t.shape},
                    {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data.insert(data.end(), t.bytes.begin(), t.bytes.end());
  }
  std::string h = header.dump();
  h.resize((h.size() + 7) / 8 * 8, ' ');
  std::vector<uint8_t> out = size_prefixed(h);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void write_file(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
}
void write_file(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream(p, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), (std::streamsize)b.size());
}

// A WordLevel tokenizer.json of n tokens "t0".."t{n-1}" (the weights do not care).
std::string tiny_tokenizer_json(int n) {
  json vocab = json::object();
  for (int i = 0; i < n; ++i) vocab[std::string("t").append(std::to_string(i))] = i;
  return json{{"version", "1.0"},
              {"added_tokens", json::array({{{"id", 1}, {"content", "t1"}, {"special", true}}})},
              {"pre_tokenizer", {{"type", "WhitespaceSplit"}}},
              {"model", {{"type", "WordLevel"}, {"vocab", vocab}, {"unk_token", "t0"}}}}
      .dump();
}

// transformers' row order of q / k for llama: llama.cpp's converter interleaves the two
// halves of each head; undo it (GGUF row h*hd + 2i + j is HF row h*hd + j*hd/2 + i).
std::vector<uint8_t> unpermute_rows(const gguf::TensorInfo& t, int head_dim) {
  const size_t row = (size_t)t.dims[0] * 4;
  std::vector<uint8_t> out(t.nbytes);
  for (int64_t r = 0; r < t.rows(); ++r) {
    const int64_t h = r / head_dim, within = r % head_dim, i = within / 2, j = within % 2;
    const int64_t hf = h * head_dim + j * (head_dim / 2) + i;
    std::memcpy(out.data() + hf * row, t.data + r * row, row);
  }
  return out;
}

// The GGUF model as a transformers checkpoint in `dir` (sharded in two when asked).
void write_hf_twin(const gguf::GgufFile& g, const model::ModelConfig& c, const fs::path& dir,
                   bool sharded) {
  fs::create_directories(dir);
  std::map<std::string, std::string> gguf_to_hf;
  for (const auto& p : formats::kLlamaFamilyTensorNames)
    for (int l = 0; l < c.n_layers; ++l)
      gguf_to_hf[formats::tensor_name(p.gguf, l)] = formats::tensor_name(p.hf, l);
  std::map<std::string, StTensor> a, b;
  int k = 0;
  for (const gguf::TensorInfo& t : g.tensors()) {
    ASSERT_EQ(t.type, DType::F32) << t.name;
    StTensor st{"F32", {t.dims.rbegin(), t.dims.rend()}, {t.data, t.data + t.nbytes}};
    const bool permute = c.arch == "llama" &&
                         (t.name.ends_with("attn_q.weight") || t.name.ends_with("attn_k.weight"));
    if (permute) st.bytes = unpermute_rows(t, c.head_dim);
    ASSERT_TRUE(gguf_to_hf.count(t.name)) << t.name;
    ((sharded && k++ % 2) ? b : a)[gguf_to_hf[t.name]] = std::move(st);
  }
  json cfg = {{"model_type", c.arch},
              {"hidden_size", c.n_embd},
              {"intermediate_size", c.n_ff},
              {"num_attention_heads", c.n_heads},
              {"num_key_value_heads", c.n_kv_heads},
              {"num_hidden_layers", c.n_layers},
              {"max_position_embeddings", c.n_ctx_train},
              {"rms_norm_eps", c.rms_eps},
              {"rope_theta", c.rope.freq_base},
              {"head_dim", c.head_dim},
              {"tie_word_embeddings", c.tied_output},
              {"vocab_size", c.n_vocab}};
  write_file(dir / "config.json", cfg.dump());
  write_file(dir / "tokenizer.json", tiny_tokenizer_json(c.n_vocab));
  if (!sharded) {
    write_file(dir / "model.safetensors", safetensors_bytes(a));
    return;
  }
  json map = json::object();
  for (const auto& [n, _] : a) map[n] = "model-00001-of-00002.safetensors";
  for (const auto& [n, _] : b) map[n] = "model-00002-of-00002.safetensors";
  write_file(dir / "model-00001-of-00002.safetensors", safetensors_bytes(a));
  write_file(dir / "model-00002-of-00002.safetensors", safetensors_bytes(b));
  write_file(dir / "model.safetensors.index.json",
             json{{"metadata", json::object()}, {"weight_map", map}}.dump());
}

class HfTwin : public ::testing::TestWithParam<std::string> {};

TEST_P(HfTwin, SameConfigAndLogitsAsTheGguf) {
  const std::string arch = GetParam();
  const fs::path dir = fs::path(::testing::TempDir()) / ("hf-twin-" + arch);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string gguf_path = test::write_synthetic(dir.string(), arch, "f32", "", 7);
  auto ref = model::Model::load(gguf_path);
  write_hf_twin(ref->file(), ref->config(), dir / "hf", /*sharded=*/arch == "qwen3");
  auto hf = model::Model::load((dir / "hf").string());
  const model::ModelConfig &a = ref->config(), &b = hf->config();
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_embd, b.n_embd);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.n_ff, b.n_ff);
  EXPECT_EQ(a.n_vocab, b.n_vocab);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.tied_output, b.tied_output);
  EXPECT_TRUE(b.rope.neox);
  // The weights are the mapped shard bytes, not copies.
  EXPECT_EQ(hf->weights().layers[0].w_gate.type, DType::F32);

  std::vector<int32_t> tokens;
  for (int i = 0; i < 24; ++i) tokens.push_back((i * 37 + 5) % a.n_vocab);
  test::CpuSequence sa(*ref, 64), sb(*hf, 64);
  const std::span<const float> first = sa.eval(tokens, true);
  const std::vector<float> la(first.begin(), first.end());
  const std::span<const float> lb = sb.eval(tokens, true);
  ASSERT_EQ(la.size(), lb.size());
  float worst = 0;
  for (size_t i = 0; i < la.size(); ++i) worst = std::max(worst, std::fabs(la[i] - lb[i]));
  // qwen2/qwen3: the same bytes through the same kernels. llama: transformers' q/k order
  // rotates the same pairs, summed in another order.
  if (arch == "llama")
    EXPECT_LT(worst, 1e-3f);
  else
    EXPECT_EQ(worst, 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Arches, HfTwin, ::testing::Values("llama", "qwen2", "qwen3"));

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<uint8_t> with_header(const std::string& h, size_t data_bytes = 0) {
  std::vector<uint8_t> out = size_prefixed(h);
  out.resize(out.size() + data_bytes);
  return out;
}

TEST(Safetensors, MalformedFilesGiveClearErrors) {
  auto parse = [](const std::vector<uint8_t>& b) {
    return error_of([&] { safetensors::File::parse(b, "x.safetensors"); });
  };
  EXPECT_NE(parse({1, 2, 3}).find("has no header"), std::string::npos);
  std::vector<uint8_t> huge(16, 0xff);
  EXPECT_NE(parse(huge).find("exceeds the 100 MiB limit"), std::string::npos);
  EXPECT_NE(parse(with_header("{\"a\":")).find("not valid JSON"), std::string::npos);
  EXPECT_NE(parse(with_header("[1]")).find("not a JSON object"), std::string::npos);
  EXPECT_NE(parse(with_header(R"({"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,2]}})", 2))
                .find("unknown dtype 'Q4'"),
            std::string::npos);
  EXPECT_NE(parse(with_header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4))
                .find("outside"),
            std::string::npos);
  EXPECT_NE(parse(with_header(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8))
                .find("expected 12"),
            std::string::npos);
  EXPECT_NE(parse(with_header(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8))
                .find("non-negative"),
            std::string::npos);
  EXPECT_NE(parse(with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                              8))
                .find("overlap"),
            std::string::npos);
  EXPECT_NE(parse(with_header(std::string(200, '[') + std::string(200, ']'))).find("nested"),
            std::string::npos);
  const auto ok = safetensors::File::parse(
      with_header(
          R"({"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}})",
          8),
      "ok");
  ASSERT_EQ(ok.tensors().size(), 1u);
  EXPECT_EQ(ok.tensors()[0].dtype, DType::BF16);
  EXPECT_EQ(ok.metadata().at("format"), "pt");
}

TEST(HfDirectory, BadDirectoriesGiveClearErrors) {
  const fs::path dir = fs::path(::testing::TempDir()) / "hf-bad";
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_file(dir / "config.json", R"({"model_type": "gpt_neox", "num_hidden_layers": 2})");
  EXPECT_NE(error_of([&] {
              formats::open_hf_model(dir.string());
            }).find("unsupported model_type 'gpt_neox'"),
            std::string::npos);
  write_file(dir / "config.json",
             R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 8,
      "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 64})");
  EXPECT_NE(error_of([&] { formats::open_hf_model(dir.string()); }).find("no model.safetensors"),
            std::string::npos);
  write_file(dir / "model.safetensors.index.json", R"({"weight_map": {"a": "../../etc/passwd"}})");
  EXPECT_NE(error_of([&] { formats::open_hf_model(dir.string()); }).find("not a plain file name"),
            std::string::npos);
  fs::remove(dir / "model.safetensors.index.json");
  std::vector<float> w(16, 1.0f);
  StTensor t{"I64", {2}, std::vector<uint8_t>(16)};
  write_file(dir / "model.safetensors", safetensors_bytes({{"model.norm.weight", t}}));
  write_file(dir / "tokenizer.json", tiny_tokenizer_json(4));
  EXPECT_NE(error_of([&] { formats::open_hf_model(dir.string()); }).find("dtype I64"),
            std::string::npos);
  write_file(dir / "model.safetensors",
             safetensors_bytes({{"model.layers.7.input_layernorm.weight",
                                 {"F32", {8}, std::vector<uint8_t>(32)}}}));
  EXPECT_NE(error_of([&] { formats::open_hf_model(dir.string()); }).find("past the 2 layers"),
            std::string::npos);
  write_file(dir / "model.safetensors",
             safetensors_bytes({{"model.norm.weight", {"F32", {8}, std::vector<uint8_t>(32)}}}));
  EXPECT_NE(error_of([&] { model::Model::load(dir.string()); }).find("token_embd.weight"),
            std::string::npos);
  write_file(dir / "config.json", "{\"model_type\": ");
  EXPECT_NE(
      error_of([&] { formats::open_hf_model(dir.string()); }).find("config.json: not valid JSON"),
      std::string::npos);
}

}  // namespace
}  // namespace hablar
