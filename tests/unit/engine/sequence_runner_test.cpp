// SequenceRunner's next-token scores (what `hablar perplexity` sums): an executor that samples
// on its device scores the rows there (the fake one as the CUDA one does), others return the
// logits rows, scored on the host; both give each position's -log p of the next token.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/sequence_runner.h"
#include "fake_executor.h"

namespace hablar::engine {
namespace {

constexpr int32_t kVocab = 97;

TEST(SequenceRunner, NextTokenScoresOnTheDeviceEqualTheHosts) {
  std::mt19937 rng(5);
  std::vector<int32_t> tokens(50);
  for (int32_t& t : tokens) t = (int32_t)(rng() % kVocab);
  test::FakeExecutor host(kVocab, 16, 8), device(kVocab, 16, 8);
  device.device_sampling = true;
  SequenceRunner on_host(host, 128, 16), on_device(device, 128, 16);  // four steps
  const int first = 10;
  const std::vector<double> want = on_host.next_token_nll(tokens, first);
  const std::vector<double> got = on_device.next_token_nll(tokens, first);
  ASSERT_EQ(want.size(), tokens.size() - 1 - first);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    std::vector<float> row(kVocab), logp(kVocab);
    const size_t j = first + k;
    test::reference_logits(std::span<const int32_t>(tokens).first(j + 1), kVocab, row.data());
    log_softmax(row, logp);
    EXPECT_NEAR(want[k], -(double)logp[(size_t)tokens[j + 1]], 1e-5) << "position " << j;
    EXPECT_NEAR(got[k], want[k], 1e-5) << "position " << j;
  }
  EXPECT_EQ(device.scored_rows, (int64_t)tokens.size() - 1);  // every row with a target
  EXPECT_EQ(host.scored_rows, 0);
  EXPECT_EQ(on_device.n_past(), (int)tokens.size());
}

}  // namespace
}  // namespace hablar::engine
