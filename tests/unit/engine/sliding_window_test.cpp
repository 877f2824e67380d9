// Giving back KV blocks behind a sliding window, on the CPU executor over a tiny Mistral-style
// model (llama with a window of 12 positions on every layer): greedy outputs many windows
// long are the same tokens with the blocks given back as with every block kept, and the
// cache held stays bounded, so a pool far smaller than the generation runs it whole.
#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "engine/cpu_executor.h"
#include "engine/engine.h"
#include "formats/synthetic_model.h"
#include "model/model.h"
#include "support/test_support.h"
#include "tiny_models.h"

namespace hablar::engine {
namespace {

using std::chrono::milliseconds;

constexpr int32_t kWindow = 12;

class SlidingWindowEngine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string(test_models::write_tiny_llama("sliding-window", 3, "q8_0", kWindow));
    model_ = model::Model::load(*path_).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete path_;
  }

  struct Run {
    std::vector<std::vector<int32_t>> tokens;
    int32_t most_blocks_used = 0;
  };
  // Greedy tokens of each prompt, all submitted together, on a cache of n_blocks blocks.
  static Run generate(const std::vector<std::vector<int32_t>>& prompts, int32_t n_blocks,
                      bool release, int32_t max_tokens, int32_t n_ctx = 1024) {
    CpuExecutor exec(*model_, n_blocks, kDefaultKvBlockSize, 2);
    EngineConfig c;
    c.n_ctx = n_ctx;
    c.release_window_blocks = release;
    c.scheduler = {.max_running = 4, .max_step_tokens = 64, .max_prefill_chunk = 24};
    Engine engine(c, exec);
    Run run;
    run.tokens.resize(prompts.size());
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (const auto& p : prompts) {
      GenerateRequest g;
      g.prompt = p;
      g.max_tokens = max_tokens;
      handles.push_back(engine.submit(std::move(g)));
    }
    for (size_t i = 0; i < handles.size(); ++i) {
      for (bool done = false; !done;) {
        std::vector<StreamItem> items;
        EXPECT_TRUE(handles[i]->wait(items, milliseconds(120000))) << "engine stalled";
        if (items.empty()) break;
        for (const StreamItem& it : items) {
          if (it.kind == StreamItem::Kind::kFinal) {
            done = true;
            EXPECT_EQ(it.finish_reason, FinishReason::kLength);
          } else {
            run.tokens[i].push_back(it.token);
          }
        }
        run.most_blocks_used =
            std::max(run.most_blocks_used, engine.metrics().snapshot().kv_blocks_used);
      }
    }
    return run;
  }

  static std::string* path_;
  static model::Model* model_;
};

std::string* SlidingWindowEngine::path_ = nullptr;
model::Model* SlidingWindowEngine::model_ = nullptr;

std::vector<std::vector<int32_t>> prompts() {
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> out;
  for (int n : {7, 30, 19}) {
    std::vector<int32_t> p((size_t)n);
    for (auto& t : p) t = 300 + (int32_t)(rng() % 200);
    out.push_back(p);
  }
  return out;
}

TEST_F(SlidingWindowEngine, ModelReportsItsWindow) {
  EXPECT_EQ(model::kv_window(model_->config()), kWindow);
  CpuExecutor exec(*model_, 4);
  EXPECT_EQ(exec.kv_window(), kWindow);
}

TEST_F(SlidingWindowEngine, ReleasingBlocksKeepsOutputsAndBoundsMemory) {
  constexpr int32_t kTokens = 160;  // > 13 windows
  const auto ps = prompts();
  // Every block kept: a pool that holds every sequence whole.
  const Run kept = generate(ps, 64, /*release=*/false, kTokens);
  // Blocks behind the window given back: a pool of 12 blocks (192 positions) for three
  // sequences of up to 190 positions each.
  const Run released = generate(ps, 12, /*release=*/true, kTokens);
  ASSERT_EQ(kept.tokens.size(), released.tokens.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(kept.tokens[i].size(), (size_t)kTokens);
    EXPECT_EQ(released.tokens[i], kept.tokens[i]) << "prompt " << i;
  }
  std::printf("blocks used at most: %d kept, %d released\n", kept.most_blocks_used,
              released.most_blocks_used);
  EXPECT_GT(kept.most_blocks_used, 20);
  EXPECT_LE(released.most_blocks_used, 12);
}

// What `serve` gives each sequence (engine::max_sequence_tokens): the pool bounds a sequence
// unless blocks behind the window are given back and the pool holds a window and a chunk.
TEST(MaxSequenceTokens, ThePoolBoundsASequenceUnlessTheWindowFreesBlocks) {
  // No window: the smaller of the model's context and the pool (8 blocks of 16).
  EXPECT_EQ(max_sequence_tokens(4096, 8, 16, 0, 24), 128);
  EXPECT_EQ(max_sequence_tokens(100, 8, 16, 0, 24), 100);
  EXPECT_EQ(max_sequence_tokens(0, 8, 16, 0, 24), 128);
  // A window of 12 and chunks of 24: 11 + 24 live positions over at most 4 blocks.
  EXPECT_EQ(max_sequence_tokens(4096, 4, 16, 12, 24), 4096);
  EXPECT_EQ(max_sequence_tokens(4096, 3, 16, 12, 24), 48);
  // Chunks of 512: 523 live positions over at most 34 blocks.
  EXPECT_EQ(max_sequence_tokens(4096, 34, 16, 12, 512), 4096);
  EXPECT_EQ(max_sequence_tokens(4096, 33, 16, 12, 512), 528);
  // A model that states no context keeps the pool's bound.
  EXPECT_EQ(max_sequence_tokens(0, 64, 16, 12, 24), 1024);
}

// serve's limit on the windowed model: a sequence four times the pool runs to its length,
// with the same tokens as on a pool that holds it whole.
TEST_F(SlidingWindowEngine, ASequenceLongerThanThePoolRunsWhole) {
  constexpr int32_t kBlocks = 6, kChunk = 24;  // a pool of 96 positions
  const int32_t n_ctx = max_sequence_tokens(model::max_context(model_->config()), kBlocks,
                                            kDefaultKvBlockSize, kWindow, kChunk);
  ASSERT_GE(n_ctx, 4 * kBlocks * kDefaultKvBlockSize);
  const std::vector<std::vector<int32_t>> one = {prompts()[1]};  // 30 tokens
  const int32_t n_tokens = 4 * kBlocks * kDefaultKvBlockSize - 30;
  const Run small = generate(one, kBlocks, /*release=*/true, n_tokens, n_ctx);
  const Run whole = generate(one, 64, /*release=*/false, n_tokens, n_ctx);
  ASSERT_EQ(small.tokens[0].size(), (size_t)n_tokens);
  EXPECT_EQ(small.tokens[0], whole.tokens[0]);
  EXPECT_LE(small.most_blocks_used, kBlocks);
}

}  // namespace
}  // namespace hablar::engine
