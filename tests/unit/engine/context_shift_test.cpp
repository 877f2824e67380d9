// Context shift (GenerateRequest::context_shift) on a small synthetic Llama model, over each
// real executor (the CUDA one in deterministic mode where a device is present): a request
// that fills its context drops the tokens after its kept head and goes on; what it generates
// after each shift is exactly what a fresh request prompted with the tokens it kept
// generates, and the counts it reports include every generated token.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>

#include "engine/engine.h"
#include "engine/executor_factory.h"
#include "model/model.h"
#include "tiny_models.h"

namespace hablar::engine {
namespace {

using std::chrono::milliseconds;

// Greedy, keeping every history it was handed (the engine's samplers' view of the request).
class RecordingSampler : public NextTokenSampler {
 public:
  explicit RecordingSampler(std::vector<std::vector<int32_t>>* seen) : seen_(seen) {}
  int32_t sample(std::span<float> logits, std::span<const int32_t> history) override {
    seen_->emplace_back(history.begin(), history.end());
    return (int32_t)(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }

 private:
  std::vector<std::vector<int32_t>>* seen_;
};

class ContextShiftTest : public test_models::OnEachExecutor {
 protected:
  static void SetUpTestSuite() {
    model_ = model::Model::load(test_models::write_tiny_llama("context-shift", 23)).release();
  }
  static void TearDownTestSuite() { delete model_; }

  struct Run {
    std::vector<int32_t> tokens;
    StreamItem final_item;
    MetricsSnapshot metrics;
  };

  // Greedy generation of one request on an engine whose context holds n_ctx tokens.
  Run generate(const std::vector<int32_t>& prompt, int32_t n_ctx, int32_t max_tokens,
               std::optional<ContextShift> shift,
               std::vector<std::vector<int32_t>>* histories = nullptr) {
    ExecutorOptions eo;
    eo.device = GetParam();
    eo.n_threads = 2;
    eo.kv_tokens = 64 * 16;
    eo.cuda.max_step_tokens = 96;
    eo.cuda.max_seq_len = 1024;
    eo.cuda.deterministic = true;
    auto executor = make_executor(*model_, eo);
    EngineConfig c;
    c.n_ctx = n_ctx;
    c.scheduler = {.max_running = 4, .max_step_tokens = 96, .max_prefill_chunk = 40};
    Engine engine(c, *executor);
    GenerateRequest g;
    g.prompt = prompt;
    g.max_tokens = max_tokens;
    g.ignore_eos = true;
    g.context_shift = shift;
    if (histories) g.sampler = std::make_unique<RecordingSampler>(histories);
    auto handle = engine.submit(std::move(g));
    Run run;
    for (bool done = false; !done;) {
      std::vector<StreamItem> items;
      EXPECT_TRUE(handle->wait(items, milliseconds(60000))) << "engine stalled";
      if (items.empty()) break;
      for (auto& it : items)
        if (it.kind == StreamItem::Kind::kFinal)
          done = true, run.final_item = it;
        else
          run.tokens.push_back(it.token);
    }
    run.metrics = engine.metrics().snapshot();
    return run;
  }

  static model::Model* model_;
};

model::Model* ContextShiftTest::model_ = nullptr;

std::vector<int32_t> random_prompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(100 + (int32_t)(rng() % 20000));
  return p;
}

TEST_P(ContextShiftTest, GoesOnAsIfPromptedWithTheKeptTokens) {
  const std::vector<int32_t> prompt = random_prompt(21, 3);
  const int32_t n_ctx = 48, n_keep = 5, max_tokens = 70;
  std::vector<std::vector<int32_t>> histories;
  const Run shifted = generate(prompt, n_ctx, max_tokens, ContextShift{n_keep, 0}, &histories);
  ASSERT_EQ((int32_t)shifted.tokens.size(), max_tokens);
  // The sampler's history is the whole request so far, shifts or not (penalties, grammars).
  ASSERT_EQ(histories.size(), shifted.tokens.size());
  for (size_t i = 0; i < histories.size(); ++i) {
    std::vector<int32_t> want = prompt;
    want.insert(want.end(), shifted.tokens.begin(), shifted.tokens.begin() + (std::ptrdiff_t)i);
    ASSERT_EQ(histories[i], want) << "token " << i;
  }
  EXPECT_EQ(shifted.final_item.finish_reason, FinishReason::kLength);
  EXPECT_EQ(shifted.final_item.n_generated, max_tokens);

  // Replay the shifts: the context fills at n_ctx tokens, keeps n_keep and drops half the
  // rest. Each stretch generated after a shift must equal a fresh request's greedy tokens
  // for the tokens then kept (the first stretch: the plain request's).
  std::vector<int32_t> context = prompt;
  std::vector<std::vector<int32_t>> kept = {prompt};
  std::vector<size_t> starts = {0};
  int32_t discarded = 0;
  for (size_t i = 0; i < shifted.tokens.size(); ++i) {
    context.push_back(shifted.tokens[i]);
    if ((int32_t)context.size() < n_ctx || i + 1 == shifted.tokens.size()) continue;
    const int32_t drop = ((int32_t)context.size() - n_keep) / 2;
    context.erase(context.begin() + n_keep, context.begin() + n_keep + drop);
    discarded += drop;
    kept.push_back(context);
    starts.push_back(i + 1);
  }
  ASSERT_GE(kept.size(), 3u) << "the test means several shifts";
  EXPECT_EQ(shifted.final_item.n_discarded, discarded);
  EXPECT_EQ(shifted.metrics.context_shifts_total, kept.size() - 1);
  starts.push_back(shifted.tokens.size());
  for (size_t k = 0; k < kept.size(); ++k) {
    const int32_t n = (int32_t)(starts[k + 1] - starts[k]);
    const Run fresh = generate(kept[k], 1024, n, std::nullopt);
    const std::vector<int32_t> stretch(shifted.tokens.begin() + (std::ptrdiff_t)starts[k],
                                       shifted.tokens.begin() + (std::ptrdiff_t)starts[k + 1]);
    EXPECT_EQ(fresh.tokens, stretch) << "after shift " << k;
  }
}

TEST_P(ContextShiftTest, WithoutItAFullContextEndsTheRequest) {
  const std::vector<int32_t> prompt = random_prompt(21, 4);
  const Run plain = generate(prompt, 48, 70, std::nullopt);
  EXPECT_EQ(plain.tokens.size(), 48u - 21u);
  EXPECT_EQ(plain.final_item.finish_reason, FinishReason::kLength);
  EXPECT_EQ(plain.final_item.n_discarded, 0);
  EXPECT_EQ(plain.metrics.context_shifts_total, 0u);
  // A discard count asked for is honoured; one beyond the rest leaves at least one token.
  const Run big = generate(prompt, 48, 40, ContextShift{2, 1000});
  EXPECT_EQ(big.tokens.size(), 40u);
  EXPECT_EQ(big.final_item.n_discarded, 48 - 2 - 1);
}

INSTANTIATE_TEST_SUITE_P(Executors, ContextShiftTest,
                         ::testing::Values(DeviceKind::kCpu, DeviceKind::kCuda),
                         test_models::executor_name);

}  // namespace
}  // namespace hablar::engine
