// The engine's embedding path against a fake executor: inputs of concurrent requests share
// steps, each request gets its own vectors back in order, the step token budget, the
// context limit, cancellation, an executor that cannot embed, and the normalizations.
#include "engine/embedding.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "core/error.h"
#include "engine/engine.h"
#include "fake_executor.h"

namespace hablar::engine {
namespace {

// Embeds an input as {sum of its ids, its length, its pooling}; records each step's chunks.
class FakeEmbedder : public test::FakeExecutor {
 public:
  FakeEmbedder() : FakeExecutor(1000, 64, 16) {}
  bool can_embed(std::string* why) const override {
    if (!embeds && why) *why = "this fake cannot embed";
    return embeds;
  }
  void embed(std::span<const EmbedChunk> chunks, EmbedOutput& out) override {
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    out.values.clear();
    out.begin.assign(1, 0);
    int64_t tokens = 0;
    for (const EmbedChunk& c : chunks) {
      float sum = 0;
      for (int32_t t : c.tokens) sum += (float)t;
      out.values.insert(out.values.end(), {sum, (float)c.tokens.size(), (float)c.pooling});
      out.begin.push_back((int64_t)out.values.size());
      tokens += (int64_t)c.tokens.size();
    }
    std::lock_guard<std::mutex> lock(mu);
    step_chunks.push_back((int)chunks.size());
    step_tokens.push_back(tokens);
  }
  bool embeds = true;
  int delay_ms = 0;
  std::mutex mu;
  std::vector<int> step_chunks;
  std::vector<int64_t> step_tokens;
};

EngineConfig config(int32_t step_tokens = 8192) {
  EngineConfig c;
  c.n_ctx = 64;
  c.embed_step_tokens = step_tokens;
  return c;
}

EmbedRequest request(int first, int n_inputs, int len) {
  EmbedRequest r;
  for (int i = 0; i < n_inputs; ++i)
    r.inputs.push_back(std::vector<int32_t>((size_t)len, first + i));
  r.pooling = Pooling::kCls;
  return r;
}

const EmbedResult& wait(EmbedHandle& h) {
  EXPECT_TRUE(h.wait(std::chrono::seconds(10)));
  return h.result();
}

TEST(EngineEmbedding, ConcurrentRequestsShareStepsAndGetTheirOwnVectors) {
  FakeEmbedder ex;
  ex.delay_ms = 30;  // the first step runs while the others queue
  Engine engine(config(), ex);
  std::vector<std::shared_ptr<EmbedHandle>> handles;
  for (int r = 0; r < 8; ++r) handles.push_back(engine.submit_embedding(request(10 * r, 4, 3)));
  for (int r = 0; r < 8; ++r) {
    const EmbedResult& res = wait(*handles[(size_t)r]);
    ASSERT_TRUE(res.error.empty()) << res.error;
    ASSERT_EQ(res.vectors.size(), 4u);
    EXPECT_EQ(res.n_tokens, 12);
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(res.vectors[(size_t)i], (std::vector<float>{3.0f * (10 * r + i), 3, 2}));
  }
  std::lock_guard<std::mutex> lock(ex.mu);
  EXPECT_LT(ex.step_chunks.size(), 8u);  // fewer steps than requests
  EXPECT_GT(*std::max_element(ex.step_chunks.begin(), ex.step_chunks.end()), 4);  // shared
  const MetricsSnapshot m = engine.metrics().snapshot();
  EXPECT_EQ(m.embedding_inputs_total, 32u);
  EXPECT_EQ(m.requests_total, 8u);
}

TEST(EngineEmbedding, StepsKeepToTheTokenBudgetWithWholeInputs) {
  FakeEmbedder ex;
  Engine engine(config(10), ex);
  EmbedRequest r = request(1, 5, 4);
  r.inputs.push_back(std::vector<int32_t>(30, 7));  // longer than the budget: a step alone
  const EmbedResult& res = wait(*engine.submit_embedding(std::move(r)));
  ASSERT_TRUE(res.error.empty());
  EXPECT_EQ(res.vectors[5], (std::vector<float>{210, 30, 2}));
  std::lock_guard<std::mutex> lock(ex.mu);
  for (size_t s = 0; s < ex.step_tokens.size(); ++s)
    EXPECT_TRUE(ex.step_tokens[s] <= 10 || ex.step_chunks[s] == 1) << s;
  EXPECT_GE(ex.step_tokens.size(), 4u);
}

// The step-cost model of embedding steps: a measured cost per token sets how many tokens a
// step bounded in time takes; whole inputs, and the first input always.
TEST(EmbeddingQueueCost, StepsBoundedInTimeTakeWhatTheirCostAllows) {
  EmbeddingQueue q(1000, 16);
  EXPECT_EQ(q.token_budget(50.0), 1000);  // nothing measured yet: the token budget
  q.observe(1000, 100.0);                 // 0.1 ms per token
  EXPECT_DOUBLE_EQ(q.ms_per_token(), 0.1);
  EXPECT_EQ(q.token_budget(0.0), 1000);  // no time bound
  EXPECT_EQ(q.token_budget(50.0), 500);
  EXPECT_EQ(q.token_budget(1e6), 1000);
  EXPECT_EQ(q.token_budget(0.01), 1);
  q.observe(100, 20.0);  // 0.2 ms per token: the mean moves a fifth of the way
  EXPECT_NEAR(q.ms_per_token(), 0.12, 1e-12);

  FakeEmbedder ex;
  EngineMetrics metrics;
  auto h = q.push(request(1, 10, 40));  // 10 inputs of 40 tokens
  for (int i = 0; i < 40; ++i) q.observe(1000, 100.0);
  ASSERT_NEAR(q.ms_per_token(), 0.1, 1e-3);
  q.step(ex, metrics, 10.0);   // ~100 tokens: two whole inputs
  q.step(ex, metrics, 0.001);  // below one input: the first still goes
  q.step(ex, metrics, 0.0);    // no bound: the rest
  std::lock_guard<std::mutex> lock(ex.mu);
  EXPECT_EQ(ex.step_chunks, (std::vector<int>{2, 1, 7}));
  EXPECT_TRUE(h->wait(std::chrono::seconds(1)));
}

TEST(EngineEmbedding, RefusesWhatCannotRun) {
  FakeEmbedder ex;
  Engine engine(config(), ex);
  try {
    engine.submit_embedding(request(1, 1, 65));
    FAIL() << "an input longer than the context was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("too large for the context of 64"), std::string::npos)
        << e.what();
  }
  EmbedRequest bad = request(1, 1, 2);
  bad.inputs[0][0] = 5000;
  EXPECT_THROW(engine.submit_embedding(std::move(bad)), Error);
  EXPECT_THROW(engine.submit_embedding(EmbedRequest{}), Error);
  EmbedRequest empty_input;
  empty_input.inputs.push_back({});
  EXPECT_THROW(engine.submit_embedding(std::move(empty_input)), Error);
  ex.embeds = false;
  try {
    engine.submit_embedding(request(1, 1, 2));
    FAIL() << "an executor that cannot embed was given work";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("cannot embed"), std::string::npos);
  }
}

TEST(EngineEmbedding, CancelledRequestsEndWithoutRunning) {
  FakeEmbedder ex;
  ex.delay_ms = 100;
  Engine engine(config(4), ex);
  auto first = engine.submit_embedding(request(1, 1, 4));
  auto second = engine.submit_embedding(request(2, 3, 4));
  second->cancel();
  EXPECT_TRUE(wait(*second).cancelled);
  EXPECT_TRUE(wait(*first).error.empty());
}

TEST(EngineEmbedding, ShutdownFailsWaitingRequests) {
  FakeEmbedder ex;
  ex.delay_ms = 50;
  auto engine = std::make_unique<Engine>(config(4), ex);
  std::vector<std::shared_ptr<EmbedHandle>> hs;
  for (int i = 0; i < 6; ++i) hs.push_back(engine->submit_embedding(request(i, 1, 4)));
  engine->shutdown(std::chrono::milliseconds(0));
  int failed = 0;
  for (auto& h : hs) {
    const EmbedResult& r = wait(*h);
    failed += r.error.find("shutting down") != std::string::npos;
  }
  EXPECT_GT(failed, 0);
}

TEST(EmbeddingNormalize, AsLlamaCppNamesThem) {
  std::vector<float> v = {3, -4};
  normalize_embedding(v, 2);
  EXPECT_FLOAT_EQ(v[0], 0.6f);
  EXPECT_FLOAT_EQ(v[1], -0.8f);
  v = {3, -4};
  normalize_embedding(v, 1);
  EXPECT_FLOAT_EQ(v[0], 3.0f / 7);
  v = {3, -4};
  normalize_embedding(v, 0);
  EXPECT_FLOAT_EQ(v[1], -32760.0f);
  v = {3, -4};
  normalize_embedding(v, -1);
  EXPECT_EQ(v, (std::vector<float>{3, -4}));
  v = {0, 0};
  normalize_embedding(v, 2);
  EXPECT_EQ(v, (std::vector<float>{0, 0}));
  v = {1, 2, 3, 4};
  truncate_embedding(v, 2);
  EXPECT_EQ(v, (std::vector<float>{1, 2}));
  truncate_embedding(v, 0);
  EXPECT_EQ(v.size(), 2u);
}

}  // namespace
}  // namespace hablar::engine
