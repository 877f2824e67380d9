// Batch invariance: 8 sequences of different lengths run together — staggered so that some
// prefill (in chunks) while others decode, over non-contiguous blocks of one shared cache —
// give bit-identical logits and the same greedy tokens as each run alone.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "model_test_util.h"

namespace hablar {
namespace {

constexpr int kSeqs = 8;
constexpr int kGenerate = 12;
constexpr int kPrefillChunk = 16;

struct Trace {
  std::vector<int32_t> tokens;             // greedy tokens
  std::vector<std::vector<float>> logits;  // the logits row each token was chosen from
};

Trace run_alone(model::Model& m, const std::vector<int32_t>& prompt) {
  test::CpuSequence seq(m, (int)prompt.size() + kGenerate);
  Trace t;
  std::span<const float> logits = seq.eval(prompt);
  for (int i = 0; i < kGenerate; ++i) {
    t.logits.emplace_back(logits.begin(), logits.end());
    t.tokens.push_back(engine::argmax(logits));
    logits = seq.eval(std::span(&t.tokens.back(), 1));
  }
  return t;
}

std::vector<Trace> run_batched(model::Model& m, const std::vector<std::vector<int32_t>>& prompts) {
  const int n_vocab = m.config().n_vocab;
  const int blocks_per_seq = (40 + kGenerate + kDefaultKvBlockSize - 1) / kDefaultKvBlockSize;
  engine::CpuExecutor cache(m, kSeqs * blocks_per_seq);
  std::vector<std::vector<int32_t>> tables(kSeqs);
  for (int s = 0; s < kSeqs; ++s)  // interleaved: sequence s owns blocks s, s + 8, ...
    for (int b = 0; b < blocks_per_seq; ++b) tables[(size_t)s].push_back(b * kSeqs + s);

  std::vector<Trace> traces(kSeqs);
  std::vector<int> n_past(kSeqs, 0);
  std::vector<int32_t> next(kSeqs, -1);
  std::vector<float> logits;
  for (int step = 0;; ++step) {
    std::vector<model::SequenceChunk> chunks;
    std::vector<int> owner;
    for (int s = 0; s < kSeqs; ++s) {
      if (step < s || (int)traces[(size_t)s].tokens.size() == kGenerate)
        continue;  // not yet / done
      const auto& prompt = prompts[(size_t)s];
      model::SequenceChunk ch;
      if (n_past[(size_t)s] < (int)prompt.size()) {
        const int n = std::min(kPrefillChunk, (int)prompt.size() - n_past[(size_t)s]);
        ch.tokens = std::span(prompt).subspan((size_t)n_past[(size_t)s], (size_t)n);
      } else {
        ch.tokens = std::span(&next[(size_t)s], 1);
      }
      ch.start_pos = n_past[(size_t)s];
      ch.block_table = tables[(size_t)s];
      chunks.push_back(ch);
      owner.push_back(s);
    }
    if (chunks.empty()) break;
    cache.forward(chunks, logits);
    for (size_t c = 0; c < chunks.size(); ++c) {
      const int s = owner[c];
      n_past[(size_t)s] += (int)chunks[c].tokens.size();
      if (n_past[(size_t)s] < (int)prompts[(size_t)s].size()) continue;  // prefill continues
      const std::span<const float> row(logits.data() + c * (size_t)n_vocab, (size_t)n_vocab);
      Trace& t = traces[(size_t)s];
      t.logits.emplace_back(row.begin(), row.end());
      t.tokens.push_back(engine::argmax(row));
      next[(size_t)s] = t.tokens.back();
    }
  }
  return traces;
}

// Per family: qwen2 (Llama family), gemma2 and gemma3 (sliding windows of 8 in every other
// layer, which the longer prompts and their decoding cross; Gemma 2's soft-caps) and qwen3moe
// (tokens of every sequence grouped by expert).
class BatchInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchInvariance, EightStaggeredSequencesMatchEachAlone) {
  const std::string dir = test::make_temp_dir("hablar-batch");
  const std::string path =
      test::write_synthetic(dir, GetParam(), "q4_k", "ggml-vocab-llama-spm.gguf", 11);
  auto m = model::Model::load(path);
  const int lengths[kSeqs] = {5, 17, 1, 33, 9, 24, 2, 40};
  std::mt19937 rng(42);
  std::vector<std::vector<int32_t>> prompts;
  for (int len : lengths) {
    std::vector<int32_t> p((size_t)len);
    for (int32_t& t : p) t = (int32_t)(rng() % (uint32_t)m->config().n_vocab);
    prompts.push_back(p);
  }
  const std::vector<Trace> batched = run_batched(*m, prompts);
  for (int s = 0; s < kSeqs; ++s) {
    const Trace alone = run_alone(*m, prompts[(size_t)s]);
    EXPECT_EQ(batched[(size_t)s].tokens, alone.tokens) << "sequence " << s;
    ASSERT_EQ(batched[(size_t)s].logits.size(), alone.logits.size());
    for (size_t i = 0; i < alone.logits.size(); ++i)
      EXPECT_EQ(0, std::memcmp(batched[(size_t)s].logits[i].data(), alone.logits[i].data(),
                               alone.logits[i].size() * sizeof(float)))
          << "sequence " << s << " step " << i << ": logits differ bitwise";
  }
  m.reset();
  std::filesystem::remove_all(dir);
}

// The logits of each chunk's last token (every token's with all_logits), by position, after
// feeding `tokens` in chunks of the given sizes, with positions >= prompt_len marked as
// sampled.
std::vector<std::pair<int, std::vector<float>>> chunk_end_logits(
    model::Model& m, const std::vector<int32_t>& tokens, const std::vector<int>& chunk_sizes,
    int32_t prompt_len, bool all_logits = false) {
  const size_t n_vocab = (size_t)m.config().n_vocab;
  const int n_blocks = ((int)tokens.size() + kDefaultKvBlockSize - 1) / kDefaultKvBlockSize;
  engine::CpuExecutor cache(m, n_blocks);
  std::vector<int32_t> table((size_t)n_blocks);
  for (int b = 0; b < n_blocks; ++b) table[(size_t)b] = b;
  std::vector<std::pair<int, std::vector<float>>> out;
  std::vector<float> logits;
  int pos = 0;
  for (int n : chunk_sizes) {
    model::SequenceChunk ch;
    ch.tokens = std::span(tokens).subspan((size_t)pos, (size_t)n);
    ch.start_pos = pos;
    ch.block_table = table;
    ch.prompt_len = prompt_len;
    ch.all_logits = all_logits;
    cache.forward(std::span(&ch, 1), logits);
    for (int i = all_logits ? 0 : n - 1; i < n; ++i) {
      const auto row = logits.begin() + (ptrdiff_t)((size_t)(all_logits ? i : 0) * n_vocab);
      out.emplace_back(pos + i, std::vector<float>(row, row + (ptrdiff_t)n_vocab));
    }
    pos += n;
  }
  EXPECT_EQ(pos, (int)tokens.size());
  return out;
}

// A sequence recomputed after preemption (prompt and sampled tokens in one chunk), or a
// prompt split so that one token is left, gives the same logits as the original run, at the
// prompt's last token and after each sampled one: the attention's order and the K formats'
// matmul orders follow the token's role (prompt or sampled, and its place in the prompt), not
// the chunking.
void expect_chunkings_keep_the_original_values(model::Model& m) {
  std::mt19937 rng(7);
  std::vector<int32_t> prompt(21);
  for (int32_t& t : prompt) t = (int32_t)(rng() % (uint32_t)m.config().n_vocab);
  const Trace original = run_alone(m, prompt);  // prompt in one chunk, then decode steps
  const int n_prompt = (int)prompt.size();
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), original.tokens.begin(), original.tokens.begin() + 5);

  const std::vector<std::vector<int>> chunkings = {
      {n_prompt + 5},                    // recomputed in one chunk
      {n_prompt - 1, 1, 1, 1, 1, 1, 1},  // prompt split leaving one token, then decodes
      {7, 7, 7, 5},                      // chunks across the prompt/sampled boundary
      {3, 2, 16, 5},                     // chunks shorter than the K formats' batches
  };
  for (const auto& sizes : chunkings) {
    for (const auto& [pos, got] : chunk_end_logits(m, all, sizes, n_prompt)) {
      if (pos < n_prompt - 1) continue;  // no logits of the original run there
      const std::vector<float>& want = original.logits[(size_t)(pos - (n_prompt - 1))];
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)))
          << "chunking with " << sizes.size() << " chunks differs at position " << pos;
    }
  }
  // Every position's logits (perplexity, echo): each chunking as the prompt in one chunk then
  // one token per step.
  const auto want_all = chunk_end_logits(m, all, {n_prompt, 1, 1, 1, 1, 1}, n_prompt, true);
  for (const auto& sizes : chunkings) {
    const auto got_all = chunk_end_logits(m, all, sizes, n_prompt, true);
    ASSERT_EQ(got_all.size(), want_all.size());
    for (size_t p = 0; p < got_all.size(); ++p)
      EXPECT_EQ(got_all[p], want_all[p])
          << "all logits: chunking with " << sizes.size() << " chunks differs at position " << p;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, BatchInvariance,
                         ::testing::Values("qwen2", "gemma2", "gemma3", "qwen3moe"));

TEST(BatchInvarianceDefaultModel, RecomputationAndSplitsKeepTheOriginalValues) {
  // The default model: its 64-wide heads are where the two attention orders round differently.
  const std::string path = test::default_model_path_or_empty();
  ASSERT_FALSE(path.empty()) << "default model missing: run scripts/fetch-model.sh";
  auto m = model::Model::load(path);
  expect_chunkings_keep_the_original_values(*m);
}

// The same for the K formats, whose matmul order depends on the token's place in llama.cpp's
// batch (a 21-token prompt: Q4_K's 4-token groups and one token left, Q5_K and Q6_K's batch
// of 8 or more; one-token orders for the sampled tokens).
class KFormatChunkings : public ::testing::TestWithParam<std::string> {};

TEST_P(KFormatChunkings, RecomputationAndSplitsKeepTheOriginalValues) {
  const std::string dir = test::make_temp_dir("hablar-korder");
  const std::string path =
      test::write_synthetic(dir, "qwen2", GetParam(), "ggml-vocab-llama-spm.gguf", 13);
  auto m = model::Model::load(path);
  expect_chunkings_keep_the_original_values(*m);
  m.reset();
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(KFormats, KFormatChunkings, ::testing::Values("q4_k", "q5_k", "q6_k"));

}  // namespace
}  // namespace hablar
