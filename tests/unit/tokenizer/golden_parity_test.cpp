// Parity with llama.cpp on the committed slice of the tokenizer corpus, on invalid UTF-8
// and on texts with special tokens: tests/golden/tokenizer/<vocab>.txt holds llama.cpp's
// ids (written by tools/tokenizer_golden.py).
#include <gtest/gtest.h>

#include <cstdio>

#include "tokenizer_test_util.h"

namespace hablar::tokenizer::test {
namespace {

std::vector<std::string> corpus_documents() {
  const std::string all =
      read_file(hablar::test::source_dir() + "/tests/data/tokenizer-corpus/corpus.txt");
  const std::string sep = "\n__hablar_corpus_doc__\n";
  std::vector<std::string> docs;
  size_t pos = 0;
  for (size_t hit; (hit = all.find(sep, pos)) != std::string::npos; pos = hit + sep.size())
    docs.push_back(all.substr(pos, hit - pos));
  docs.push_back(all.substr(pos));
  return docs;
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

class GoldenParity : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenParity, MatchesLlamaCpp) {
  const std::string golden_path =
      hablar::test::source_dir() + "/tests/golden/tokenizer/" + GetParam() + ".txt";
  std::istringstream golden(read_file(golden_path));
  std::string header;
  ASSERT_TRUE(std::getline(golden, header)) << "missing golden file " << golden_path;
  if (GetParam() == "default-model") {
    ASSERT_FALSE(vocab_path(GetParam()).empty())
        << "default model missing: run scripts/fetch-model.sh";
  }
  const Tokenizer& tok = load(GetParam());
  static const std::vector<std::string> docs = corpus_documents();
  size_t records = 0, same = 0, bytes = 0;
  std::string what, ids_line;
  while (std::getline(golden, what) && std::getline(golden, ids_line)) {
    std::istringstream w(what);
    std::string kind, arg, mode;
    w >> kind >> arg >> mode;
    if (mode.empty()) std::swap(arg, mode);  // `hex  special`: an empty text
    std::string text;
    if (kind == "doc") {
      const size_t index = std::stoul(arg);
      ASSERT_LT(index, docs.size()) << "golden refers to a document the corpus lacks";
      text = docs[index];
    } else {
      text = from_hex(arg);
    }
    std::vector<int32_t> want;
    std::istringstream ls(ids_line);
    for (int32_t id; ls >> id;) want.push_back(id);
    const bool special = mode == "special";
    const auto got = tok.encode(text, special, special);
    ++records;
    bytes += text.size();
    same += got == want;
    EXPECT_EQ(got, want) << GetParam() << ": " << what;
  }
  EXPECT_GT(records, 20u);
  std::printf("[ golden   ] %-16s %zu/%zu records identical to llama.cpp (%zu bytes)\n",
              GetParam().c_str(), same, records, bytes);
}

std::vector<std::string> golden_names() {
  auto names = vocab_names();
  names.push_back("default-model");
  return names;
}

INSTANTIATE_TEST_SUITE_P(All, GoldenParity, ::testing::ValuesIn(golden_names()), VocabParamName());

}  // namespace
}  // namespace hablar::tokenizer::test
