// The engine over the real CPU model runner, on a small synthetic Llama model: requests run
// together (batched, some preempted, some sharing cached prefix blocks and copying them on
// write) produce exactly the greedy tokens each produces alone.
#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "engine/engine.h"
#include "engine/model_runner.h"
#include "formats/synthetic_model.h"
#include "model/model.h"
#include "support/test_support.h"

namespace hablar::engine {
namespace {

using std::chrono::milliseconds;

class ModelRunnerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    synth::SyntheticModelOptions o;
    o.arch = synth::Arch::kLlama;
    o.shape = *synth::shape_from_name("tiny");
    o.type = "f16";
    o.vocab_path = test::testdata_dir() + "/vocab/ggml-vocab-llama-spm.gguf";
    o.seed = 7;
    path_ = new std::string(test::make_temp_dir("engine-runner") + "/tiny.gguf");
    synth::write_synthetic_model(o, *path_);
    model::LoadOptions load;
    load.n_threads = 2;
    model_ = model::Model::load(*path_, load).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete path_;
  }

  // Greedy tokens of each prompt through an engine with the given cache and batch limits.
  static std::vector<std::vector<int32_t>> generate(
      const std::vector<std::vector<int32_t>>& prompts, int32_t n_blocks, int32_t max_running,
      int32_t max_tokens, bool one_at_a_time, MetricsSnapshot* metrics = nullptr) {
    ModelRunner runner(*model_, n_blocks, 16);
    EngineConfig c;
    c.n_blocks = n_blocks;
    c.block_size = 16;
    c.n_ctx = 1024;
    c.scheduler = {.max_running = max_running, .max_step_tokens = 96, .max_prefill_chunk = 40};
    Engine engine(c, runner);
    std::vector<std::vector<int32_t>> out(prompts.size());
    std::vector<std::shared_ptr<RequestHandle>> handles;
    auto drain = [&](size_t i) {
      for (bool done = false; !done;) {
        std::vector<StreamItem> items;
        EXPECT_TRUE(handles[i]->wait(items, milliseconds(60000))) << "engine stalled";
        if (items.empty()) return;
        for (const auto& it : items) {
          if (it.kind == StreamItem::Kind::kFinal)
            done = true;
          else
            out[i].push_back(it.token);
        }
      }
    };
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerateRequest g;
      g.prompt = prompts[i];
      g.max_tokens = max_tokens;
      handles.push_back(engine.submit(std::move(g)));
      if (one_at_a_time) drain(i);
    }
    if (!one_at_a_time)
      for (size_t i = 0; i < prompts.size(); ++i) drain(i);
    if (metrics) *metrics = engine.metrics().snapshot();
    return out;
  }

  static std::string* path_;
  static model::Model* model_;
};

std::string* ModelRunnerTest::path_ = nullptr;
model::Model* ModelRunnerTest::model_ = nullptr;

std::vector<std::vector<int32_t>> test_prompts() {
  std::mt19937 rng(11);
  std::vector<int32_t> shared(40);
  for (auto& t : shared) t = 100 + (int32_t)(rng() % 20000);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p = i % 2 == 0 ? shared : std::vector<int32_t>{};
    const int extra = 3 + 9 * i;
    for (int k = 0; k < extra; ++k) p.push_back(100 + (int32_t)(rng() % 20000));
    prompts.push_back(p);
  }
  prompts.push_back(prompts[0]);  // identical prompt: all cached but its last token
  return prompts;
}

TEST_F(ModelRunnerTest, BatchedEqualsAlone) {
  const auto prompts = test_prompts();
  const auto alone = generate(prompts, 64, 1, 12, /*one_at_a_time=*/true);
  MetricsSnapshot m;
  const auto together = generate(prompts, 64, 8, 12, /*one_at_a_time=*/false, &m);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(alone[i].size(), 12u);
    EXPECT_EQ(together[i], alone[i]) << "request " << i;
  }
  EXPECT_GT(m.max_batch_size, 1);
  EXPECT_GT(m.prompt_tokens_cached, 0u);  // the shared 40-token head (2 full blocks)
}

TEST_F(ModelRunnerTest, PreemptionKeepsOutputs) {
  const auto prompts = test_prompts();
  const auto alone = generate(prompts, 64, 1, 12, true);
  MetricsSnapshot m;
  // 10 blocks of 16 = 160 positions for seven sequences of up to ~90 tokens.
  const auto squeezed = generate(prompts, 10, 7, 12, false, &m);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(squeezed[i], alone[i]) << "request " << i;
  EXPECT_GT(m.preemptions_total, 0u);
}

}  // namespace
}  // namespace hablar::engine
