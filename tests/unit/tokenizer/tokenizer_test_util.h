// Shared helpers of the tokenizer tests: the shipped vocabularies and their test vectors.
#pragma once

#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "support/test_support.h"
#include "tokenizer/tokenizer.h"

namespace hablar::tokenizer::test {

inline const std::vector<std::string>& vocab_names() {
  static const std::vector<std::string> kNames = {
      "bert-bge", "deepseek-coder", "deepseek-llm", "falcon", "gpt-2",    "llama-bpe", "llama-spm",
      "mpt",      "phi-3",          "qwen2",        "refact", "starcoder"};
  return kNames;
}

inline std::string vocab_path(const std::string& name) {
  if (name == "default-model") return hablar::test::default_model_path_or_empty();
  return hablar::test::testdata_dir() + "/vocab/ggml-vocab-" + name + ".gguf";
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Loads a tokenizer once per test binary (vocabularies take a moment to index).
inline const Tokenizer& load(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[name];
  if (!slot) {
    const auto file = gguf::GgufFile::open(vocab_path(name));
    slot = Tokenizer::from_gguf(file);
  }
  return *slot;
}

// The texts of a `.inp` file (separated by "\n__ggml_vocab_test__\n") and the expected ids
// of its `.out` file.
struct Vectors {
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> ids;
};

inline Vectors read_vectors(const std::string& name) {
  const std::string base = vocab_path(name);
  const std::string inp = read_file(base + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  Vectors v;
  size_t pos = 0;
  for (size_t hit; (hit = inp.find(sep, pos)) != std::string::npos; pos = hit + sep.size())
    v.texts.push_back(inp.substr(pos, hit - pos));
  v.texts.push_back(inp.substr(pos));
  // One line per text; the last line may be empty (an empty text at the end).
  const std::string out = read_file(base + ".out");
  std::vector<std::string> lines;
  pos = 0;
  for (size_t hit; (hit = out.find('\n', pos)) != std::string::npos; pos = hit + 1)
    lines.push_back(out.substr(pos, hit - pos));
  lines.push_back(out.substr(pos));
  for (size_t i = 0; i < lines.size() && v.ids.size() < v.texts.size(); ++i) {
    std::istringstream ls(lines[i]);
    std::vector<int32_t> ids;
    for (int32_t id; ls >> id;) ids.push_back(id);
    v.ids.push_back(ids);
  }
  return v;
}

inline bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<uint8_t>(s[i]);
    size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<uint8_t>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

// GoogleTest parameter names from vocabulary names ("llama-bpe" -> "llama_bpe").
struct VocabParamName {
  template <typename Info>
  std::string operator()(const Info& info) const {
    std::string n = info.param;
    for (char& c : n)
      if (c == '-') c = '_';
    return n;
  }
};

}  // namespace hablar::tokenizer::test
