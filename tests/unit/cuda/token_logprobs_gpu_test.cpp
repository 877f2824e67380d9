// Log-probabilities of device-sampled rows (token_logprobs.h) against a double-precision
// reference over the raw rows: the log-sum-exp, the top n in order (the lowest id among
// equal values), and the sampled token's log-probability from its raw logit even where the
// sampler's penalties or mask changed the row before it drew.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cuda/token_logprobs.h"
#include "cuda_test_util.h"

namespace hablar::test {
namespace {

using cuda::DeviceBuffer;
using cuda::RowLogprobs;
using cuda::SamplingParams;

double reference_lse(const float* row, int vocab) {
  const float mx = *std::max_element(row, row + vocab);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp((double)(row[i] - mx));
  return (double)mx + std::log(sum);
}

std::vector<int32_t> reference_top(const float* row, int vocab, int n) {
  std::vector<int32_t> ids((size_t)vocab);
  std::iota(ids.begin(), ids.end(), 0);
  n = std::min(n, vocab);
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
    return row[a] > row[b] || (row[a] == row[b] && a < b);
  });
  ids.resize((size_t)n);
  return ids;
}

struct Rows {
  int vocab = 0;
  std::vector<float> logits;
  std::vector<SamplingParams> params;
  std::vector<int32_t> history, history_len;  // [rows][max_history]
  int max_history = 0;
  std::vector<uint32_t> masks;  // empty: none
};

// The executor's order: log-probabilities, the draw, the sampled token's log-probability.
std::vector<RowLogprobs> run(const Rows& in, std::vector<int32_t>* tokens) {
  const int n = (int)in.params.size();
  DeviceBuffer<float> logits(in.logits);
  DeviceBuffer<SamplingParams> params(in.params);
  DeviceBuffer<int32_t> history(in.history.empty() ? std::vector<int32_t>{0} : in.history);
  DeviceBuffer<int32_t> history_len(in.history_len.empty() ? std::vector<int32_t>(n, 0)
                                                           : in.history_len);
  DeviceBuffer<float> history_raw(std::max<size_t>(1, in.history.size()));
  DeviceBuffer<uint32_t> masks(in.masks.empty() ? std::vector<uint32_t>{0} : in.masks);
  DeviceBuffer<int32_t> ids(std::vector<int32_t>(n, -7));
  DeviceBuffer<RowLogprobs> out((size_t)n);
  const int32_t* h = in.max_history > 0 ? history.get() : nullptr;
  cuda::token_logprobs_before_sampling(logits.get(), n, in.vocab, params.get(), h,
                                       history_len.get(), in.max_history, history_raw.get(),
                                       out.get(), nullptr);
  cuda::sample_tokens(logits.get(), n, in.vocab, params.get(), h, history_len.get(), in.max_history,
                      in.masks.empty() ? nullptr : masks.get(), cuda::token_mask_words(in.vocab),
                      ids.get(), nullptr);
  cuda::token_logprobs_after_sampling(logits.get(), n, in.vocab, params.get(), h, history_len.get(),
                                      in.max_history, history_raw.get(), ids.get(), out.get(),
                                      nullptr);
  HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
  *tokens = ids.download();
  return out.download();
}

void expect_row(const Rows& in, int r, const RowLogprobs& got, int32_t token) {
  const float* row = in.logits.data() + (size_t)r * in.vocab;
  const int asked = in.params[(size_t)r].n_logprobs;
  if (asked < 0) {
    EXPECT_EQ(got.n_top, -1) << "row " << r;
    return;
  }
  const double lse = reference_lse(row, in.vocab);
  EXPECT_NEAR(got.lse, lse, 1e-6 * std::max(1.0, std::fabs(lse))) << "row " << r;
  ASSERT_GE(token, 0) << "row " << r;
  EXPECT_NEAR(got.chosen, (double)row[token] - lse, 2e-5) << "row " << r << " token " << token;
  const std::vector<int32_t> top =
      reference_top(row, in.vocab, std::min(asked, cuda::kMaxTopLogprobs));
  ASSERT_EQ(got.n_top, (int32_t)top.size()) << "row " << r;
  for (size_t k = 0; k < top.size(); ++k) {
    EXPECT_EQ(got.top_ids[k], top[k]) << "row " << r << " rank " << k;
    EXPECT_NEAR(got.top_logprobs[k], (double)row[top[k]] - lse, 2e-5) << "row " << r;
  }
}

TEST(TokenLogprobsGpu, TopAndSampledTokenEqualTheRawRowsLogSoftmax) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  Rows in;
  in.vocab = 151936;
  const int asked[] = {-1, 0, 1, 5, 20, 25, 3, -1, 20};
  const int n = (int)std::size(asked);
  in.logits = random_floats((size_t)n * in.vocab, 41u, -12.0f, 12.0f);
  // Row 6: a block of equal values at the top (ties go to the lowest ids); row 8: the whole
  // top 20 tied but two.
  for (int i = 0; i < 9; ++i) in.logits[(size_t)6 * in.vocab + 100000 - 7 * i] = 30.0f;
  for (int i = 0; i < 40; ++i) in.logits[(size_t)8 * in.vocab + 3 * i + 11] = i < 2 ? 40.f : 31.f;
  in.params.resize((size_t)n);
  for (int r = 0; r < n; ++r) {
    in.params[(size_t)r].n_logprobs = asked[r];
    in.params[(size_t)r].temperature = r % 2 ? 0.0f : 0.9f;  // greedy and drawn rows
    in.params[(size_t)r].seed = 5 + (uint64_t)r;
  }
  std::vector<int32_t> tokens;
  const std::vector<RowLogprobs> got = run(in, &tokens);
  for (int r = 0; r < n; ++r) expect_row(in, r, got[(size_t)r], tokens[(size_t)r]);
}

// The penalties change the history's logits and the mask the refused ones before the draw;
// the log-probabilities are still those of the raw row, the sampled token's included when it
// is a penalized one.
TEST(TokenLogprobsGpu, PenalizedAndMaskedRowsReportTheRawRow) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  Rows in;
  in.vocab = 32000;
  const int n = 3;
  in.max_history = 4;
  in.logits = random_floats((size_t)n * in.vocab, 43u, -6.0f, 6.0f);
  float* r0 = in.logits.data();
  r0[100] = 10.0f, r0[200] = 9.0f, r0[300] = 8.5f;  // 100 penalized below 200 (and 200 a bit)
  float* r1 = r0 + in.vocab;
  r1[7] = 11.0f, r1[8] = 10.5f;  // the mask refuses 7: 8 is drawn
  float* r2 = r1 + in.vocab;
  r2[50] = 9.0f, r2[51] = 8.0f;  // 50 in the history, still first after a mild penalty
  in.history = {100, 200, 100, 9, 1, 2, 3, 4, 50, 50, 60, 0};
  in.history_len = {4, 0, 3};
  in.params.resize((size_t)n);
  for (SamplingParams& p : in.params) p.temperature = 0.0f, p.n_logprobs = 4;
  in.params[0].repetition_penalty = 1.5f;   // 10 -> 6.67, 9 -> 6
  in.params[0].presence_penalty = 0.4f;     // 200: 6 - 0.4 - ... below 300's 8.5
  in.params[2].repetition_penalty = 1.05f;  // 50: 9 -> 8.57, above 51's 8
  in.params[1].masked = true;
  const int words = cuda::token_mask_words(in.vocab);
  in.masks.assign((size_t)n * words, ~0u);
  in.masks[(size_t)words + 7 / 32] &= ~(1u << (7 % 32));
  std::vector<int32_t> tokens;
  const std::vector<RowLogprobs> got = run(in, &tokens);
  EXPECT_EQ(tokens, (std::vector<int32_t>{300, 8, 50}));
  for (int r = 0; r < n; ++r) expect_row(in, r, got[(size_t)r], tokens[(size_t)r]);
}

// A vocabulary smaller than the top asked for reports every token.
TEST(TokenLogprobsGpu, SmallVocabulariesReportEveryToken) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  Rows in;
  in.vocab = 7;
  in.logits = {0.5f, -1.0f, 2.0f, 2.0f, 0.0f, -3.0f, 1.0f};
  in.params.resize(1);
  in.params[0].temperature = 0.0f, in.params[0].n_logprobs = 20;
  std::vector<int32_t> tokens;
  const std::vector<RowLogprobs> got = run(in, &tokens);
  EXPECT_EQ(tokens[0], 2);
  expect_row(in, 0, got[0], tokens[0]);
}

}  // namespace
}  // namespace hablar::test
