// ggml_vocab_from_hf: which llama.cpp pre-tokenizer name a tokenizer.json's structure gets,
// the token table (added tokens, gaps), merges and special ids, and the tokenizers it
// declines (left as tokenizer.huggingface.json).
#include <gtest/gtest.h>

#include <string>

#include "formats/hf_model.h"

namespace hablar::formats {
namespace {

using gguf::Value;

constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string split_then_bytes(const char* regex) {
  return R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":)" +
         json_string(regex) +
         R"(},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]})";
}

// A tokenizer.json with 4 vocabulary entries, one merge, two added tokens (ids 5 and 6;
// id 4 is a gap) and the given pre-tokenizer.
gguf::GgufFile with_tokenizer(const std::string& pre, const std::string& model_extra = "") {
  const std::string tj =
      R"({"normalizer":null,"pre_tokenizer":)" + pre + R"(,"model":{"type":"BPE")" + model_extra +
      R"(,"vocab":{"a":0,"b":1,"ab":2,"Ġ":3},"merges":[["a","b"]]},"added_tokens":[)"
      R"({"id":5,"content":"<|end|>","special":true},{"id":6,"content":"<x>","special":false}]})";
  std::vector<std::pair<std::string, Value>> meta = {
      {"tokenizer.huggingface.json", Value::string(tj)},
      {"hablar.hf.eos_token", Value::string("<|end|>")},
      {"hablar.hf.bos_token_id", Value::u32(2)}};
  return gguf::GgufFile::assemble("test", std::move(meta), {}, nullptr);
}

std::string pre_of(const gguf::GgufFile& f) {
  const auto m = ggml_vocab_from_hf(f);
  if (!m) return "(none)";
  for (const auto& [k, v] : *m)
    if (k == "tokenizer.ggml.pre") return std::get<std::string>(v.data);
  return "(missing)";
}

TEST(HfGgmlVocab, NamesThePreTokenizerFromItsStructure) {
  EXPECT_EQ(
      pre_of(with_tokenizer(R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":true})")),
      "gpt-2");
  EXPECT_EQ(pre_of(with_tokenizer(split_then_bytes(kLlama3Regex))), "llama-bpe");
  EXPECT_EQ(pre_of(with_tokenizer(split_then_bytes(kQwen2Regex))), "qwen2");
  EXPECT_EQ(pre_of(with_tokenizer(
                R"({"type":"Sequence","pretokenizers":[{"type":"Digits","individual_digits":true},)"
                R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":true}]})")),
            "smollm");
}

TEST(HfGgmlVocab, DeclinesWhatItCannotName) {
  // A Split pattern of another family, a prefix space, a byte-fallback BPE, and a file
  // that already has a GGUF vocabulary.
  EXPECT_EQ(pre_of(with_tokenizer(split_then_bytes(R"(\p{L}+|\p{N}+)"))), "(none)");
  EXPECT_EQ(pre_of(with_tokenizer(R"({"type":"ByteLevel","add_prefix_space":true})")), "(none)");
  EXPECT_EQ(pre_of(with_tokenizer(R"({"type":"ByteLevel"})", R"(,"byte_fallback":true)")),
            "(none)");
  std::vector<std::pair<std::string, Value>> meta = {
      {"tokenizer.huggingface.json", Value::string("{}")},
      {"tokenizer.ggml.model", Value::string("gpt2")}};
  EXPECT_FALSE(ggml_vocab_from_hf(gguf::GgufFile::assemble("t", std::move(meta), {}, nullptr)));
}

TEST(HfGgmlVocab, TokensTypesMergesAndSpecialIds) {
  const auto m = ggml_vocab_from_hf(with_tokenizer(R"({"type":"ByteLevel"})"));
  ASSERT_TRUE(m);
  const auto f = gguf::GgufFile::assemble("out", *m, {}, nullptr);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens"),
            (std::vector<std::string>{"a", "b", "ab", "Ġ", "[PAD4]", "<|end|>", "<x>"}));
  EXPECT_EQ(f.get_i32_array("tokenizer.ggml.token_type"),
            (std::vector<int32_t>{1, 1, 1, 1, 5, 3, 4}));
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.merges"), (std::vector<std::string>{"a b"}));
  EXPECT_EQ(f.get_uint("tokenizer.ggml.eos_token_id"), 5u);
  EXPECT_EQ(f.get_uint("tokenizer.ggml.bos_token_id"), 2u);
  EXPECT_FALSE(f.has("tokenizer.ggml.unknown_token_id"));
}

}  // namespace
}  // namespace hablar::formats
