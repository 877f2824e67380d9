// The test vectors shipped with each real vocabulary (llama.cpp's tokenizer tests): every
// text must encode to exactly the expected ids, and decode back to itself where the
// tokenizer is lossless.
#include <gtest/gtest.h>

#include <cstdio>

#include "tokenizer_test_util.h"

namespace hablar::tokenizer::test {
namespace {

class VocabVectors : public ::testing::TestWithParam<std::string> {};

TEST_P(VocabVectors, EncodeMatchesExpectedIds) {
  const Tokenizer& tok = load(GetParam());
  const Vectors v = read_vectors(GetParam());
  ASSERT_EQ(v.texts.size(), v.ids.size()) << "malformed .inp/.out pair for " << GetParam();
  ASSERT_GT(v.texts.size(), 10u);
  size_t passed = 0;
  for (size_t i = 0; i < v.texts.size(); ++i) {
    const auto got = tok.encode(v.texts[i], false, false);
    EXPECT_EQ(got, v.ids[i]) << GetParam() << " text #" << i << ": '" << v.texts[i] << "'";
    passed += got == v.ids[i];
  }
  std::printf("[ vectors  ] %-16s %zu/%zu texts exact\n", GetParam().c_str(), passed,
              v.texts.size());
}

TEST_P(VocabVectors, DecodeRoundTrips) {
  if (GetParam() == "bert-bge") {
    // WordPiece lowercases and drops accents and white space: check only that decoding
    // gives the lowercased words back.
    const Tokenizer& tok = load(GetParam());
    const auto ids = tok.encode("Hello World", false, false);
    EXPECT_EQ(tok.decode(ids), " hello world");
    return;
  }
  const Tokenizer& tok = load(GetParam());
  const Vectors v = read_vectors(GetParam());
  for (size_t i = 0; i < v.texts.size(); ++i) {
    const auto ids = tok.encode(v.texts[i], false, false);
    EXPECT_EQ(tok.decode(ids), v.texts[i]) << GetParam() << " text #" << i;
  }
}

INSTANTIATE_TEST_SUITE_P(All, VocabVectors, ::testing::ValuesIn(vocab_names()), VocabParamName());

}  // namespace
}  // namespace hablar::tokenizer::test
