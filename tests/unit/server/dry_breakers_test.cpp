// DRY's sequence breakers resolved against a real vocabulary (GPT-2's): tokens holding a
// breaker are breakers alone; tokens ending with a breaker's start need its rest after them.
#include "server/dry_breakers.h"

#include <gtest/gtest.h>

#include "formats/gguf.h"
#include "support/test_support.h"

namespace hablar::server {
namespace {

const tokenizer::Tokenizer& gpt2() {
  static const auto tok = [] {
    auto file = gguf::GgufFile::open(test::testdata_dir() + "/vocab/ggml-vocab-gpt-2.gguf");
    return tokenizer::Tokenizer::from_gguf(file);
  }();
  return *tok;
}

TEST(DryBreakers, TokensHoldingABreakerBreakAlone) {
  const auto& tok = gpt2();
  const auto b = resolve_dry_breakers(tok, default_dry_breakers());
  int alone = 0;
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    const std::string text = tok.token_text(id, true, false);
    const bool holds = text.find('\n') != std::string::npos ||
                       text.find(':') != std::string::npos || text.find('"') != std::string::npos ||
                       text.find('*') != std::string::npos;
    ASSERT_EQ(b->breaks_alone(id), holds) << id << " '" << text << "'";
    alone += holds;
  }
  EXPECT_GT(alone, 100);
  // The same list is resolved once and shared.
  EXPECT_EQ(resolve_dry_breakers(tok, default_dry_breakers()).get(), b.get());
}

TEST(DryBreakers, AMultiTokenBreakerNeedsItsRestAfterTheHead) {
  const auto& tok = gpt2();
  const auto b = resolve_dry_breakers(tok, {"### Answer"});
  // "###" holds no whole breaker but begins it: its tail is the rest, tokenized.
  const std::vector<int32_t> hashes = tok.encode("###", false, false);
  ASSERT_EQ(hashes.size(), 1u);
  auto [first, last] = b->heads.equal_range(hashes[0]);
  bool found = false;
  for (auto it = first; it != last; ++it)
    found = found || it->second == tok.encode(" Answer", false, false);
  EXPECT_TRUE(found);
  EXPECT_FALSE(b->breaks_alone(hashes[0]));
}

}  // namespace
}  // namespace hablar::server
