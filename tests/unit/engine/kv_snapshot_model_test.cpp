// K/V snapshots over each real executor (the CPU's; the CUDA one where a device is present)
// on a small synthetic Llama: a request's cached K/V saved to a slot file, forgotten, and
// restored into a fresh engine (a restart) is used as the request left it: a prompt that
// continues it computes only its new tokens and gives the same greedy tokens and
// log-probabilities as a cold run. Files of another model or geometry, truncated files and a
// pool too small for the file fail cleanly, leaving the block manager as it was.
#include <gtest/gtest.h>

#include <random>
#include <sstream>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/executor_factory.h"
#include "engine/kv_snapshot.h"
#include "model/fingerprint.h"
#include "model/model.h"
#include "tiny_models.h"

namespace hablar::engine {
namespace {

using std::chrono::milliseconds;

struct Generated {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<int32_t> cached;  // GenerateRequest::on_end's tokens
  int32_t n_cached_prompt = -1;
};

// Keeps the tokens a request leaves in the cache (GenerateRequest::on_end).
class Remember : public RequestEndListener {
 public:
  explicit Remember(std::vector<int32_t>& into) : into_(into) {}
  void ended(std::span<const int32_t> t) override { into_.assign(t.begin(), t.end()); }

 private:
  std::vector<int32_t>& into_;
};

class KvSnapshotTest : public test_models::OnEachExecutor {
 protected:
  static void SetUpTestSuite() {
    model_ = model::Model::load(test_models::write_tiny_llama("kv-snapshot", 7)).release();
    other_ = model::Model::load(test_models::write_tiny_llama("kv-snapshot-other", 8)).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete other_;
  }

  std::unique_ptr<StepExecutor> executor(const model::Model& m, int32_t n_blocks,
                                         KvDType k = KvDType::F16) {
    ExecutorOptions o;
    o.device = GetParam();
    o.n_threads = 2;
    o.kv_tokens = n_blocks * 16;
    o.cache_type_k = o.cache_type_v = k;
    o.cuda.max_step_tokens = 96;
    o.cuda.max_seq_len = 1024;
    o.cuda.deterministic = true;
    return make_executor(m, o);
  }
  static std::unique_ptr<Engine> engine(StepExecutor& ex) {
    EngineConfig c;
    c.n_ctx = 512;
    c.scheduler = {.max_running = 4, .max_step_tokens = 96, .max_prefill_chunk = 40};
    return std::make_unique<Engine>(c, ex);
  }
  static KvIdentity identity(const model::Model& m, const StepExecutor& ex) {
    KvIdentity id;
    std::string why;
    EXPECT_TRUE(ex.kv_snapshot_layout(&id.layout, &why)) << why;
    id.arch = m.config().arch;
    id.model_fingerprint =
        model::kv_fingerprint(m, (int64_t)id.layout.n_blocks * id.layout.block_size);
    return id;
  }

  // Greedy tokens of `prompt` with each one's log-probability.
  static Generated generate(Engine& e, const std::vector<int32_t>& prompt, int32_t max_tokens) {
    Generated r;
    GenerateRequest g;
    g.prompt = prompt;
    g.max_tokens = max_tokens;
    g.n_logprobs = 0;
    g.on_end = std::make_shared<Remember>(r.cached);
    auto h = e.submit(std::move(g));
    for (bool done = false; !done;) {
      std::vector<StreamItem> items;
      EXPECT_TRUE(h->wait(items, milliseconds(60000))) << "engine stalled";
      if (items.empty()) break;
      for (const StreamItem& it : items) {
        if (it.kind == StreamItem::Kind::kFinal) {
          r.n_cached_prompt = it.n_cached_prompt;
          done = true;
        } else {
          r.tokens.push_back(it.token);
          r.logprobs.push_back(it.logprob);
        }
      }
    }
    return r;
  }

  static std::pair<int32_t, int32_t> free_and_cached(Engine& e) {
    std::pair<int32_t, int32_t> n;
    e.run_between_steps([&](BlockManager& b, StepExecutor&) { n = {b.n_free(), b.n_cached()}; });
    return n;
  }

  static std::vector<int32_t> random_tokens(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> t((size_t)n);
    for (auto& x : t) x = 100 + (int32_t)(rng() % 20000);
    return t;
  }

  static model::Model* model_;
  static model::Model* other_;
};

model::Model* KvSnapshotTest::model_ = nullptr;
model::Model* KvSnapshotTest::other_ = nullptr;

TEST_P(KvSnapshotTest, SaveForgetRestoreGivesTheColdRunsTokens) {
  const std::vector<int32_t> prompt = random_tokens(37, 1);
  auto ex1 = executor(*model_, 64);
  auto e1 = engine(*ex1);
  const Generated first = generate(*e1, prompt, 10);
  ASSERT_EQ(first.tokens.size(), 10u);
  // Prompt and generated tokens but the last: 46 positions of K/V.
  ASSERT_EQ(first.cached.size(), 46u);
  const KvSnapshot saved = save_prefix(*e1, first.cached);
  EXPECT_EQ(saved.tokens, first.cached);
  std::ostringstream file;
  write_slot_file(file, saved, identity(*model_, *ex1));

  // Forgotten: the same prompt computes every token again, and nothing is left to save.
  EXPECT_EQ(forget_prefix(*e1, first.cached), 46);
  EXPECT_EQ(save_prefix(*e1, first.cached).tokens.size(), 0u);
  const Generated again = generate(*e1, prompt, 10);
  EXPECT_EQ(again.n_cached_prompt, 0);
  EXPECT_EQ(again.tokens, first.tokens);

  // A fresh engine (a restart) restores the file; a prompt continuing the history computes
  // only its new tokens and matches a cold run of it.
  std::vector<int32_t> longer = first.cached;
  for (int32_t t : random_tokens(5, 2)) longer.push_back(t);
  auto ex_cold = executor(*model_, 64);
  const Generated cold = generate(*engine(*ex_cold), longer, 8);
  auto ex2 = executor(*model_, 64);
  auto e2 = engine(*ex2);
  const std::string bytes = file.str();
  std::istringstream in(bytes);
  const KvSnapshot read =
      read_slot_file(in, bytes.size(), identity(*model_, *ex2), model_->config().n_vocab);
  restore_prefix(*e2, read);
  EXPECT_EQ(free_and_cached(*e2), std::make_pair(64, 2));  // 2 full blocks + a partial offer
  const Generated warm = generate(*e2, longer, 8);
  EXPECT_EQ(warm.n_cached_prompt, 46);
  EXPECT_EQ(cold.n_cached_prompt, 0);
  EXPECT_EQ(warm.tokens, cold.tokens);
  ASSERT_EQ(warm.logprobs.size(), cold.logprobs.size());
  for (size_t i = 0; i < warm.logprobs.size(); ++i)
    EXPECT_NEAR(warm.logprobs[i], cold.logprobs[i], 1e-3) << i;
  // Restoring again writes nothing new: its blocks are cached.
  restore_prefix(*e2, read);
  EXPECT_EQ(free_and_cached(*e2).first, 64);
}

TEST_P(KvSnapshotTest, ForeignTruncatedAndOversizedFilesFailCleanly) {
  const std::vector<int32_t> prompt = random_tokens(40, 3);
  auto ex1 = executor(*model_, 64);
  auto e1 = engine(*ex1);
  const Generated first = generate(*e1, prompt, 4);
  const KvSnapshot saved = save_prefix(*e1, first.cached);
  ASSERT_EQ(saved.tokens.size(), 43u);
  std::ostringstream file;
  write_slot_file(file, saved, identity(*model_, *ex1));
  const std::string bytes = file.str();
  auto read = [&](const std::string& b, const KvIdentity& here) {
    std::istringstream in(b);
    return read_slot_file(in, b.size(), here, model_->config().n_vocab);
  };
  auto kind_of = [&](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.kind();
    }
    return ErrorKind::kInternal;
  };

  auto ex2 = executor(*model_, 64);
  auto e2 = engine(*ex2);
  generate(*e2, random_tokens(20, 4), 3);  // something cached already
  const auto before = free_and_cached(*e2);
  const KvIdentity here = identity(*model_, *ex2);
  // Another model of the same shape (other weights): refused by its fingerprint.
  auto ex_other = executor(*other_, 64);
  EXPECT_EQ(kind_of([&] { read(bytes, identity(*other_, *ex_other)); }),
            ErrorKind::kInvalidArgument);
  // Another cache geometry (its element type).
  if (GetParam() == DeviceKind::kCpu) {
    auto ex_q8 = executor(*model_, 64, KvDType::Q8_0);
    EXPECT_EQ(kind_of([&] { read(bytes, identity(*model_, *ex_q8)); }),
              ErrorKind::kInvalidArgument);
  }
  // Truncated anywhere: a format error, nothing allocated.
  for (size_t n : {size_t{0}, size_t{11}, size_t{100}, bytes.size() / 2, bytes.size() - 1})
    EXPECT_EQ(kind_of([&] { restore_prefix(*e2, read(bytes.substr(0, n), here)); }),
              ErrorKind::kFormat)
        << n;
  EXPECT_EQ(free_and_cached(*e2), before);

  // A pool too small for the file: refused before allocating (the file's blocks outnumber
  // the whole cache), or, where the cache is large enough but busy, by the block manager.
  auto ex_small = executor(*model_, 2);
  auto e_small = engine(*ex_small);
  EXPECT_EQ(kind_of([&] { read(bytes, identity(*model_, *ex_small)); }),
            ErrorKind::kInvalidArgument);
  KvSnapshot big = read(bytes, here);
  EXPECT_EQ(kind_of([&] { restore_prefix(*e_small, big); }), ErrorKind::kResource);
  EXPECT_EQ(free_and_cached(*e_small), std::make_pair(2, 0));
  // The small engine still serves.
  EXPECT_EQ(generate(*e_small, random_tokens(10, 5), 3).tokens.size(), 3u);
}

INSTANTIATE_TEST_SUITE_P(Executors, KvSnapshotTest,
                         ::testing::Values(DeviceKind::kCpu, DeviceKind::kCuda),
                         test_models::executor_name);

}  // namespace
}  // namespace hablar::engine
