// Every tokenizer.ggml.pre name llama.cpp knows, against llama.cpp's own ids: the Llama 3
// vocabulary of the shared test data relabelled with each name (or first turned into a
// raw UTF-8 vocabulary for the names whose BPE runs over UTF-8 with U+2581 for spaces)
// tokenizes the texts of tests/golden/tokenizer/pretokenizers.json (the vocabulary cut to
// its first tokens and merges, to build the ninety-odd tokenizers in seconds), written by
// tools/pretokenizer_oracle.py with llama-cpp-python. The vocabularies are built here in
// memory exactly as the tool builds its files.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_set>

#include "core/error.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace hablar::tokenizer::test {
namespace {

using Meta = std::vector<std::pair<std::string, gguf::Value>>;

// A byte-level token text as raw UTF-8 with U+2581 for spaces; false when a character is
// outside the byte alphabet or the bytes are not strict UTF-8 (as Python decodes it).
bool to_raw(const std::string& text, std::string& out) {
  std::string bytes;
  for (uint32_t cp : unicode::decode(text)) {
    const int b = byte_from_cp(cp);
    if (b < 0) return false;
    bytes.push_back(static_cast<char>(b));
  }
  if (!unicode::is_canonical_utf8(bytes)) return false;
  out.clear();
  for (uint32_t cp : unicode::decode(bytes)) {
    if (cp >= 0xD800 && cp <= 0xDFFF) return false;
    if (cp == ' ')
      out += "\xE2\x96\x81";
    else
      unicode::append_utf8(out, cp);
  }
  return true;
}

// tools/pretokenizer_oracle.py's prune: the first keep_tokens tokens and keep_merges merges.
Meta pruned(const gguf::GgufFile& base, size_t keep_tokens, size_t keep_merges) {
  auto tokens = base.get_string_array("tokenizer.ggml.tokens");
  auto types = base.get_i32_array("tokenizer.ggml.token_type");
  auto merges = base.get_string_array("tokenizer.ggml.merges");
  tokens.resize(std::min(tokens.size(), keep_tokens));
  types.resize(std::min(types.size(), keep_tokens));
  merges.resize(std::min(merges.size(), keep_merges));
  Meta meta = base.metadata();
  for (auto& [key, value] : meta) {
    if (key == "tokenizer.ggml.tokens") value = gguf::Value::string_array(tokens);
    if (key == "tokenizer.ggml.token_type") value = gguf::Value::i32_array(types);
    if (key == "tokenizer.ggml.merges") value = gguf::Value::string_array(merges);
    EXPECT_NE(key, "tokenizer.ggml.scores") << "scores are not cut here";
  }
  return meta;
}

// tools/pretokenizer_oracle.py's raw_vocab: converted texts where free (else the original
// text, else "<dupID>"), 256 byte tokens appended, merges with both sides converted.
Meta raw_vocab(const gguf::GgufFile& base) {
  std::vector<std::string> tokens = base.get_string_array("tokenizer.ggml.tokens");
  std::vector<int32_t> types = base.get_i32_array("tokenizer.ggml.token_type");
  std::unordered_set<std::string> used;
  std::string raw;
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string text = to_raw(tokens[i], raw) && !used.count(raw) ? raw : tokens[i];
    if (used.count(text)) text = "<dup" + std::to_string(i) + ">";
    used.insert(text);
    tokens[i] = std::move(text);
  }
  static const char* kHex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">");
    types.push_back(6);
  }
  std::vector<std::string> merges;
  std::string left, right;
  for (const std::string& m : base.get_string_array("tokenizer.ggml.merges")) {
    const size_t space = m.find(' ');
    if (space == std::string::npos) continue;
    if (to_raw(m.substr(0, space), left) && to_raw(m.substr(space + 1), right))
      merges.push_back(left + " " + right);
  }
  Meta meta = base.metadata();
  for (auto& [key, value] : meta) {
    if (key == "tokenizer.ggml.tokens") value = gguf::Value::string_array(tokens);
    if (key == "tokenizer.ggml.token_type") value = gguf::Value::i32_array(types);
    if (key == "tokenizer.ggml.merges") value = gguf::Value::string_array(merges);
  }
  return meta;
}

std::unique_ptr<Tokenizer> relabelled(Meta meta, const std::string& pre) {
  for (auto& [key, value] : meta) {
    if (key == "tokenizer.ggml.pre") value = gguf::Value::string(pre);
    // llama.cpp runs the "whitespace" pre-tokenizer with the "whitespace" model only.
    if (key == "tokenizer.ggml.model" && pre == "whitespace") value = gguf::Value::string(pre);
  }
  return Tokenizer::from_gguf(gguf::GgufFile::assemble(pre, std::move(meta), {}, nullptr));
}

struct Golden {
  nlohmann::json doc;
  Golden() {
    doc = nlohmann::json::parse(
        read_file(hablar::test::source_dir() + "/tests/golden/tokenizer/pretokenizers.json"));
  }
  // The ids of a name, following same_as.
  const nlohmann::json& ids(const std::string& name) const {
    const auto& entry = doc["names"][name];
    return entry.contains("same_as") ? ids(entry["same_as"].get<std::string>()) : entry["ids"];
  }
};

TEST(PreTokenizerGolden, NamesAreLlamaCppsNames) {
  const Golden g;
  std::set<std::string> golden_names, ours;
  for (const auto& [name, entry] : g.doc["names"].items()) golden_names.insert(name);
  for (const auto& name : PreTokenizer::supported_names()) ours.insert(name);
  EXPECT_EQ(ours, golden_names);
  EXPECT_GT(ours.size(), 90u);
}

TEST(PreTokenizerGolden, EveryNameMatchesLlamaCpp) {
  const Golden g;
  const auto file = gguf::GgufFile::open(vocab_path("llama-bpe"));
  ASSERT_EQ(g.doc["vocab"], "ggml-vocab-llama-bpe.gguf");
  const Meta byte_meta =
      pruned(file, g.doc["keep_tokens"].get<size_t>(), g.doc["keep_merges"].get<size_t>());
  const auto base = gguf::GgufFile::assemble("pruned", byte_meta, {}, nullptr);
  const Meta raw_meta = raw_vocab(base);
  const auto texts = g.doc["texts"].get<std::vector<std::string>>();
  ASSERT_GT(texts.size(), 50u);
  size_t names = 0, all_exact = 0;
  for (const auto& [name, entry] : g.doc["names"].items()) {
    const auto tok = relabelled(entry["raw"].get<bool>() ? raw_meta : byte_meta, name);
    const nlohmann::json& want = g.ids(name);
    ASSERT_EQ(want.size(), texts.size()) << name;
    size_t exact = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      const auto got = tok->encode(texts[i], false, false);
      const bool same = got == want[i].get<std::vector<int32_t>>();
      exact += same;
      EXPECT_TRUE(same) << name << " text #" << i << ": '" << texts[i] << "'";
    }
    std::printf("[ pre-tok  ] %-26s %zu/%zu texts exact\n", name.c_str(), exact, texts.size());
    ++names;
    all_exact += exact == texts.size();
  }
  std::printf("[ pre-tok  ] %zu/%zu names exact on every text\n", all_exact, names);
}

// Unigram ("t5"): the SentencePiece vocabulary relabelled, plain and with the space options.
TEST(UnigramGolden, MatchesLlamaCpp) {
  const Golden g;
  const auto& ugm = g.doc["ugm"];
  ASSERT_EQ(ugm["vocab"], "ggml-vocab-llama-spm.gguf");
  const auto file = gguf::GgufFile::open(vocab_path("llama-spm"));
  const auto texts = g.doc["texts"].get<std::vector<std::string>>();
  for (const std::string variant : {"plain", "spaces"}) {
    Meta meta = file.metadata();
    for (auto& [key, value] : meta)
      if (key == "tokenizer.ggml.model") value = gguf::Value::string("t5");
    if (variant == "spaces") {
      meta.emplace_back("tokenizer.ggml.add_space_prefix", gguf::Value::boolean(true));
      meta.emplace_back("tokenizer.ggml.remove_extra_whitespaces", gguf::Value::boolean(true));
    }
    const auto tok = Tokenizer::from_gguf(gguf::GgufFile::assemble("t5", meta, {}, nullptr));
    EXPECT_EQ(tok->model_name(), "t5");
    const auto& want = ugm["variants"][variant];
    ASSERT_EQ(want.size(), texts.size());
    size_t exact = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      const auto got = tok->encode(texts[i], false, false);
      const bool same = got == want[i].get<std::vector<int32_t>>();
      exact += same;
      EXPECT_TRUE(same) << variant << " text #" << i << ": '" << texts[i] << "'";
    }
    std::printf("[ unigram  ] %-8s %zu/%zu texts exact\n", variant.c_str(), exact, texts.size());
    // The file's add_bos_token (true) and add_eos_token (false) override the Unigram
    // defaults (no BOS, EOS), as in llama.cpp.
    const auto plain = tok->encode("Hello", false, false);
    const auto with_special = tok->encode("Hello", true, false);
    ASSERT_EQ(with_special.size(), plain.size() + 1);
    EXPECT_EQ(with_special.front(), tok->bos_id());
  }
}

// llama.cpp accepts a Kimi-K2 vocabulary without merges (and no other): every word is then
// its byte tokens.
TEST(PreTokenizerGolden, KimiK2NeedsNoMerges) {
  const auto file = gguf::GgufFile::open(vocab_path("gpt-2"));
  Meta meta;
  for (auto& kv : file.metadata())
    if (kv.first != "tokenizer.ggml.merges") meta.push_back(kv);
  EXPECT_THROW(relabelled(meta, "gpt-2"), Error);
  const auto tok = relabelled(meta, "kimi-k2");
  const auto ids = tok->encode("Hello 世界", false, false);
  ASSERT_EQ(ids.size(), std::string("Hello 世界").size());
  for (int32_t id : ids) EXPECT_EQ(tok->token_text(id, true, false).size(), 1u) << id;
}

TEST(PreTokenizerGolden, UnknownNameListsTheKnownOnes) {
  try {
    PreTokenizer::for_name("no-such-pre");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'no-such-pre'"), std::string::npos) << msg;
    for (const auto& name : PreTokenizer::supported_names())
      EXPECT_NE(msg.find(name), std::string::npos) << name;
  }
}

}  // namespace
}  // namespace hablar::tokenizer::test
