// Device sampling against a double-precision CPU model of the documented procedure
// (sampling.h): greedy is the exact argmax; a sampled token must be one the filters keep
// and sit where the draw u falls in the kept distribution's CDF; over many seeds the
// frequencies follow the filtered distribution; penalties change exactly the tokens they name.
#include <algorithm>
#include <cmath>
#include <map>

#include "backend/cuda/sample_rng.h"
#include "backend/cuda/sampling.h"
#include "cuda_test_util.h"

namespace hablar::test {
namespace {

using cuda::DeviceBuffer;
using cuda::SamplingParams;

// Kept-token probabilities (0 for dropped tokens) of one row, after temperature, top-k,
// top-p and min-p, in double.
std::vector<double> filtered_probs(const std::vector<float>& logits, const SamplingParams& sp) {
  const int n = (int)logits.size();
  const double mx = *std::max_element(logits.begin(), logits.end());
  // The filters compare z (tempered, or not when the temperature comes last); the kept
  // tokens are drawn with weights exp((logit - max) / temperature).
  std::vector<double> z(n), w(n);
  for (int i = 0; i < n; ++i) {
    w[i] = (logits[i] - mx) / sp.temperature;
    z[i] = sp.temperature_last ? logits[i] - mx : w[i];
  }
  std::vector<double> sorted = z;
  std::sort(sorted.rbegin(), sorted.rend());
  double keep = -INFINITY;
  if (sp.top_k > 0 && sp.top_k < n) keep = sorted[sp.top_k - 1];
  if (sp.top_p < 1.0f) {
    double total = 0, run = 0;
    for (double v : sorted)
      if (v >= keep) total += std::exp(v);
    for (double v : sorted) {
      if (v < keep) break;
      run += std::exp(v);
      if (run >= sp.top_p * total) {
        keep = std::max(keep, v);
        break;
      }
    }
  }
  if (sp.min_p > 0.0f) keep = std::max(keep, std::log((double)sp.min_p));
  std::vector<double> p(n, 0.0);
  double total = 0;
  for (int i = 0; i < n; ++i)
    if (z[i] >= keep) total += (p[i] = std::exp(w[i]));
  for (double& v : p) v /= total;
  return p;
}

std::vector<int32_t> run_sampler(std::vector<float> logits, int n_seqs, int vocab,
                                 const std::vector<SamplingParams>& params,
                                 const std::vector<int32_t>& history = {},
                                 const std::vector<int32_t>& history_len = {}, int max_history = 0,
                                 std::vector<float>* logits_after = nullptr,
                                 const std::vector<uint32_t>& masks = {}) {
  DeviceBuffer<float> dl(logits);
  DeviceBuffer<SamplingParams> dp(params);
  DeviceBuffer<int32_t> dh(history.empty() ? std::vector<int32_t>{0} : history);
  DeviceBuffer<int32_t> dhl(history_len.empty() ? std::vector<int32_t>{0} : history_len);
  DeviceBuffer<int32_t> out(std::vector<int32_t>(n_seqs, -7));
  DeviceBuffer<uint32_t> dm(masks.empty() ? std::vector<uint32_t>{0} : masks);
  cuda::sample_tokens(dl.get(), n_seqs, vocab, dp.get(), dh.get(), dhl.get(), max_history,
                      masks.empty() ? nullptr : dm.get(), cuda::token_mask_words(vocab), out.get(),
                      nullptr);
  HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
  if (logits_after) *logits_after = dl.download();
  return out.download();
}

TEST(SamplingGpu, GreedyIsArgmaxWithLowestIndexOnTies) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int vocab = 151936, seqs = 3;
  auto logits = random_floats((size_t)seqs * vocab, 21u, -10.0f, 10.0f);
  logits[0 * vocab + 777] = 50.0f;
  logits[1 * vocab + 150000] = 40.0f;
  logits[2 * vocab + 5] = 30.0f;
  logits[2 * vocab + 90000] = 30.0f;  // tie: the lower id wins
  std::vector<SamplingParams> params(seqs);
  for (auto& p : params) p.temperature = 0.0f;
  EXPECT_EQ(run_sampler(logits, seqs, vocab, params), (std::vector<int32_t>{777, 150000, 5}));
}

// Token masks (a grammar's): a masked row never yields a refused token, greedy or drawn,
// whatever the filters keep (top-k wider than what the mask allows included); greedy takes
// the argmax of the allowed tokens; unmasked rows of the same launch are untouched by it.
TEST(SamplingGpu, MaskedRowsOnlyYieldAllowedTokens) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int vocab = 151936, seqs = 96, words = cuda::token_mask_words(vocab);
  const auto logits = random_floats((size_t)seqs * vocab, 31u, -8.0f, 8.0f);
  std::vector<uint32_t> masks((size_t)seqs * words, 0u);
  std::vector<SamplingParams> params(seqs);
  for (int s = 0; s < seqs; ++s) {
    // Few allowed tokens, spread over the vocabulary: 1, 2, ... up to 40 of them.
    for (int j = 0; j <= s % 40; ++j) {
      const int t = (int)(((uint64_t)(s + 1) * 2654435761u + (uint64_t)j * 40503u) % vocab);
      masks[(size_t)s * words + t / 32] |= 1u << (t % 32);
    }
    params[s].masked = s % 6 != 5;  // every sixth row unmasked
    params[s].temperature = s % 4 == 0 ? 0.0f : 0.7f + 0.2f * (s % 3);
    params[s].top_k = s % 3 == 0 ? 0 : 50;  // wider than most masks
    params[s].top_p = s % 5 == 1 ? 0.9f : 1.0f;
    params[s].min_p = s % 7 == 3 ? 0.05f : 0.0f;
    params[s].seed = 77u + s, params[s].step = (uint64_t)s;
    params[s].temperature_last = s % 2 == 0;
  }
  const auto tokens = run_sampler(logits, seqs, vocab, params, {}, {}, 0, nullptr, masks);
  for (int s = 0; s < seqs; ++s) {
    ASSERT_GE(tokens[s], 0);
    ASSERT_LT(tokens[s], vocab);
    const uint32_t* m = masks.data() + (size_t)s * words;
    const bool allowed = (m[tokens[s] / 32] >> (tokens[s] % 32)) & 1u;
    if (params[s].masked) {
      EXPECT_TRUE(allowed) << "seq " << s << " drew refused token " << tokens[s];
    }
    std::vector<float> row(logits.begin() + (size_t)s * vocab,
                           logits.begin() + (size_t)(s + 1) * vocab);
    if (params[s].masked) {
      for (int i = 0; i < vocab; ++i)
        if (!((m[i / 32] >> (i % 32)) & 1u)) row[(size_t)i] = -INFINITY;
    }
    if (params[s].temperature <= 0.0f) {
      EXPECT_EQ(tokens[s], (int)(std::max_element(row.begin(), row.end()) - row.begin()))
          << "seq " << s;
    } else if (params[s].masked) {
      EXPECT_GT(filtered_probs(row, params[s])[(size_t)tokens[s]], 0.0) << "seq " << s;
    }
  }
}

TEST(SamplingGpu, DrawsLandInTheFilteredCdf) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int vocab = 32000, seqs = 64;
  const auto logits = random_floats((size_t)seqs * vocab, 22u, -6.0f, 6.0f);
  std::vector<SamplingParams> params(seqs);
  for (int s = 0; s < seqs; ++s) {
    params[s].temperature = 0.5f + 0.1f * (s % 8);
    params[s].top_k = (s % 3 == 0) ? 0 : 5 + 20 * (s % 5);
    params[s].top_p = (s % 4 == 1) ? 1.0f : 0.6f + 0.05f * (s % 7);
    params[s].min_p = (s % 5 == 2) ? 0.05f : 0.0f;
    params[s].seed = 1000u + s;
    params[s].step = (uint64_t)s * 3;
    params[s].temperature_last = s % 2 == 1;  // both chains
  }
  const auto tokens = run_sampler(logits, seqs, vocab, params);
  for (int s = 0; s < seqs; ++s) {
    const std::vector<float> row(logits.begin() + (size_t)s * vocab,
                                 logits.begin() + (size_t)(s + 1) * vocab);
    const auto p = filtered_probs(row, params[s]);
    ASSERT_GE(tokens[s], 0);
    ASSERT_LT(tokens[s], vocab);
    EXPECT_GT(p[tokens[s]], 0.0) << "seq " << s << " drew a filtered-out token";
    double below = 0;
    for (int i = 0; i < tokens[s]; ++i) below += p[i];
    const double u = cuda::sample_uniform(params[s].seed, params[s].step);
    EXPECT_LE(below, u + 1e-4) << "seq " << s;
    EXPECT_GE(below + p[tokens[s]], u - 1e-4) << "seq " << s;
  }
}

TEST(SamplingGpu, FrequenciesFollowTheFilteredDistribution) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int vocab = 40, seqs = 20000;
  const auto row = random_floats(vocab, 23u, -2.0f, 2.0f);
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.top_k = 25;
  sp.top_p = 0.9f;
  sp.min_p = 0.05f;
  sp.temperature_last = true;  // the engine's chain
  std::vector<float> logits;
  std::vector<SamplingParams> params(seqs, sp);
  for (int s = 0; s < seqs; ++s) {
    logits.insert(logits.end(), row.begin(), row.end());
    params[s].seed = 42;
    params[s].step = (uint64_t)s;  // one sequence's successive draws
  }
  const auto tokens = run_sampler(logits, seqs, vocab, params);
  const auto p = filtered_probs(row, sp);
  std::vector<double> freq(vocab, 0.0);
  for (int t : tokens) freq[t] += 1.0 / seqs;
  double tv = 0;
  for (int i = 0; i < vocab; ++i) {
    if (p[i] == 0.0) {
      EXPECT_EQ(freq[i], 0.0) << "token " << i << " is filtered out";
    }
    tv += std::fabs(freq[i] - p[i]) / 2;
  }
  EXPECT_LT(tv, 0.03) << "total variation between draws and the filtered distribution";
}

TEST(SamplingGpu, PenaltiesApplyOncePerDistinctToken) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int vocab = 1000, max_history = 8;
  auto logits = random_floats(vocab, 24u, -4.0f, 4.0f);
  logits[10] = 2.0f;
  logits[20] = -2.0f;
  SamplingParams sp;
  sp.temperature = 0.0f;
  sp.repetition_penalty = 1.5f;
  sp.presence_penalty = 0.25f;
  sp.frequency_penalty = 0.125f;
  const std::vector<int32_t> history = {10, 20, 10, 10, 20, 999, -5, 3};
  std::vector<float> after;
  run_sampler(logits, 1, vocab, {sp}, history, {7}, max_history, &after);  // last entry unused
  std::map<int, int> count = {{10, 3}, {20, 2}, {999, 1}};
  for (int i = 0; i < vocab; ++i) {
    float want = logits[i];
    if (count.count(i)) {
      want = want > 0 ? want / 1.5f : want * 1.5f;
      want -= 0.25f + 0.125f * count[i];
    }
    EXPECT_FLOAT_EQ(after[i], want) << "token " << i;
  }
}

TEST(SamplingGpu, SameSeedAndStepGiveTheSameToken) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int vocab = 5000, seqs = 16;
  const auto row = random_floats(vocab, 25u, -3.0f, 3.0f);
  std::vector<float> logits;
  std::vector<SamplingParams> params(seqs);
  for (int s = 0; s < seqs; ++s) {
    logits.insert(logits.end(), row.begin(), row.end());
    params[s].seed = 7 + (s % 2);  // two interleaved seeds, same step
    params[s].step = 3;
  }
  const auto tokens = run_sampler(logits, seqs, vocab, params);
  for (int s = 2; s < seqs; ++s) EXPECT_EQ(tokens[s], tokens[s % 2]);
}

}  // namespace
}  // namespace hablar::test
