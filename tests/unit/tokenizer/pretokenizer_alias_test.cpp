// The other names llama.cpp gives a pre-tokenizer we have (llama-vocab.cpp maps them to the
// same pre-tokenizer type): a shipped vocabulary relabelled with each alias still passes its
// test vectors, flags included (the Llama 3 names ignore merges and add BOS).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer_test_util.h"

namespace hablar::tokenizer::test {
namespace {

// The vocabulary `name` with its tokenizer.ggml.pre replaced by `pre`.
std::unique_ptr<Tokenizer> relabelled(const std::string& name, const std::string& pre) {
  const auto file = gguf::GgufFile::open(vocab_path(name));
  std::vector<std::pair<std::string, gguf::Value>> meta = file.metadata();
  for (auto& [key, value] : meta)
    if (key == "tokenizer.ggml.pre") value = gguf::Value::string(pre);
  return Tokenizer::from_gguf(gguf::GgufFile::assemble(pre, std::move(meta), {}, nullptr));
}

void expect_vectors(const std::string& name, const std::string& pre) {
  const auto tok = relabelled(name, pre);
  const Vectors v = read_vectors(name);
  ASSERT_GT(v.texts.size(), 10u);
  for (size_t i = 0; i < v.texts.size(); ++i)
    EXPECT_EQ(tok->encode(v.texts[i], false, false), v.ids[i]) << pre << " text #" << i;
  EXPECT_EQ(tok->encode("Hi", true, false), load(name).encode("Hi", true, false)) << pre;
}

TEST(PreTokenizerAliases, GptTwoNames) {
  for (const char* pre : {"phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
                          "a.x-4.0", "mellum", "modern-bert"})
    expect_vectors("gpt-2", pre);
}

TEST(PreTokenizerAliases, Llama3Names) {
  for (const char* pre : {"falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"}) {
    EXPECT_TRUE(PreTokenizer::is_llama3_name(pre)) << pre;
    expect_vectors("llama-bpe", pre);
  }
  EXPECT_FALSE(PreTokenizer::is_llama3_name("qwen2"));
}

TEST(PreTokenizerAliases, Qwen2Names) {
  for (const char* pre : {"deepseek-r1-qwen", "kormo", "f2llmv2"}) expect_vectors("qwen2", pre);
}

TEST(PreTokenizerAliases, UnknownNameStillFails) {
  EXPECT_THROW(relabelled("gpt-2", "no-such-pre"), hablar::Error);
}

}  // namespace
}  // namespace hablar::tokenizer::test
