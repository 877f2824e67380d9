// Speculative decoding over the CPU executor and real forwards: for every drafter (prompt
// lookup, a separate draft model, the target with layers skipped), greedy tokens and their
// log-probabilities equal plain decoding, over many prompts and batch compositions (alone,
// four at once, some requests not speculating), on a synthetic model and on the default
// model (SmolLM2-135M, skipped when it is not in the cache). A later request whose prompt is
// an earlier one's prompt + output reuses its cached blocks and still matches.
#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "core/error.h"
#include "engine/drafter_model.h"
#include "engine/drafter_ngram.h"
#include "engine/engine.h"
#include "engine/executor_factory.h"
#include "formats/synthetic_model.h"
#include "model/model.h"
#include "support/test_support.h"

namespace hablar::engine {
namespace {

using std::chrono::milliseconds;

struct Out {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  int32_t n_drafted = 0, n_accepted = 0, n_cached = 0;
};

std::unique_ptr<model::Model> synthetic(const std::string& vocab, uint64_t seed, const char* type) {
  synth::SyntheticModelOptions o;
  o.arch = synth::Arch::kLlama;
  o.shape = *synth::shape_from_name("tiny");
  o.type = type;
  o.vocab_path = test::testdata_dir() + "/vocab/" + vocab;
  o.seed = seed;
  const std::string path = test::make_temp_dir("spec-model") + "/m.gguf";
  synth::write_synthetic_model(o, path);
  return model::Model::load(path);
}

// Prompts whose continuation the model may well repeat from the prompt (a random run
// written twice and begun a third time), and plain random ones.
std::vector<std::vector<int32_t>> prompts(int32_t n_vocab, int n, uint64_t seed) {
  std::mt19937 rng((uint32_t)seed);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> run(8 + (size_t)(rng() % 24));
    for (auto& t : run) t = 10 + (int32_t)(rng() % (uint32_t)(n_vocab - 10));
    std::vector<int32_t> p = run;
    if (i % 3 != 2) {
      p.insert(p.end(), run.begin(), run.end());
      p.insert(p.end(), run.begin(), run.begin() + (std::ptrdiff_t)(run.size() / 2));
    }
    out.push_back(p);
  }
  return out;
}

// Greedy outputs of `ps` through one engine (max_running at once), speculating with
// `drafter` (null: plain); every third request opts out (speculative.n_max = 0).
std::vector<Out> generate(const model::Model& m, const std::vector<std::vector<int32_t>>& ps,
                          int32_t max_running, int32_t max_tokens, std::shared_ptr<Drafter> drafter,
                          bool one_at_a_time = false, int32_t n_ctx = 1024,
                          std::optional<ContextShift> shift = std::nullopt) {
  ExecutorOptions o;
  o.device = DeviceKind::kCpu;
  o.n_threads = 2;
  o.kv_tokens = 256 * 16;
  auto ex = make_executor(m, o);
  EngineConfig c;
  c.n_ctx = n_ctx;
  c.scheduler = {.max_running = max_running, .max_step_tokens = 96, .max_prefill_chunk = 40};
  c.drafter = std::move(drafter);
  c.draft.n_max = 6;
  c.draft_adaptive = false;  // verification exercised whatever the measured costs say
  Engine engine(c, *ex);
  std::vector<Out> out(ps.size());
  std::vector<std::shared_ptr<RequestHandle>> hs;
  auto drain = [&](size_t i) {
    for (bool done = false; !done;) {
      std::vector<StreamItem> items;
      if (!hs[i]->wait(items, milliseconds(120000))) {
        ADD_FAILURE() << "engine stalled";
        return;
      }
      for (const auto& it : items) {
        if (it.kind == StreamItem::Kind::kFinal) {
          out[i].n_drafted = it.n_drafted;
          out[i].n_accepted = it.n_draft_accepted;
          out[i].n_cached = it.n_cached_prompt;
          done = true;
        } else {
          out[i].tokens.push_back(it.token);
          out[i].logprobs.push_back(it.logprob);
        }
      }
    }
  };
  for (size_t i = 0; i < ps.size(); ++i) {
    GenerateRequest g;
    g.prompt = ps[i];
    g.max_tokens = max_tokens;
    g.n_logprobs = 1;
    g.context_shift = shift;
    if (i % 3 == 1) g.speculative = DraftParams{.n_max = 0};
    hs.push_back(engine.submit(std::move(g)));
    if (one_at_a_time) drain(i);
  }
  if (!one_at_a_time)
    for (size_t i = 0; i < ps.size(); ++i) drain(i);
  engine.shutdown(milliseconds(1000));  // the last step's state published
  EXPECT_EQ(engine.metrics().snapshot().kv_blocks_used, 0) << "KV blocks leaked";
  return out;
}

void expect_same(const std::vector<Out>& want, const std::vector<Out>& got, const char* what) {
  ASSERT_EQ(want.size(), got.size());
  int64_t drafted = 0, accepted = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(std::string(what) + ", request " + std::to_string(i));
    EXPECT_EQ(got[i].tokens, want[i].tokens);
    EXPECT_EQ(got[i].logprobs, want[i].logprobs);
    if (i % 3 == 1) {
      EXPECT_EQ(got[i].n_drafted, 0);
    }
    drafted += got[i].n_drafted;
    accepted += got[i].n_accepted;
  }
  EXPECT_GT(drafted, 0) << what << ": nothing was drafted";
  // Accepted runs (several tokens from one verification) must be exercised too; a layer-
  // skipping draft of a random model may be wrong every time.
  if (std::string(what) != "self") {
    EXPECT_GT(accepted, 0) << what << ": nothing was accepted";
  }
}

void check_every_drafter(const model::Model& target, const model::Model* other_draft,
                         int max_tokens) {
  const auto ps = prompts(target.config().n_vocab, 6, 3);
  ModelDrafterOptions mo;
  mo.n_threads = 2;
  mo.kv_tokens = 2048;
  for (int32_t running : {1, 4}) {
    const auto want = generate(target, ps, running, max_tokens, nullptr);
    expect_same(want, generate(target, ps, running, max_tokens, std::make_shared<NgramDrafter>()),
                "ngram");
    const int n = target.config().n_layers;
    expect_same(
        want,
        generate(target, ps, running, max_tokens,
                 std::make_shared<ModelDrafter>(target, kept_layers(default_self_skip(n), n), mo)),
        "self");
    if (other_draft != nullptr) {
      auto d = model::Model::load(other_draft->file().path());
      expect_same(want,
                  generate(target, ps, running, max_tokens,
                           std::make_shared<ModelDrafter>(target, std::move(d), mo)),
                  "draft");
    }
  }
}

TEST(SpeculationModel, SyntheticGreedyEqualsPlainForEveryDrafter) {
  auto target = synthetic("ggml-vocab-llama-spm.gguf", 7, "f16");
  auto draft = synthetic("ggml-vocab-llama-spm.gguf", 7, "q8_0");  // same weights, quantized
  check_every_drafter(*target, draft.get(), 24);
}

// Requests that fill a small context and shift it (tokens after the first four dropped, the
// rest computed again) while drafts are verified: the same tokens and log-probabilities as
// plain decoding under the same shifts; a shift in the middle of a verified run drops the
// tokens after it, which the recomputed sequence samples again.
TEST(SpeculationModel, ContextShiftsKeepSpeculationExact) {
  auto target = synthetic("ggml-vocab-llama-spm.gguf", 7, "f16");
  const auto ps = prompts(target->config().n_vocab, 6, 5);
  const ContextShift shift{4, 0};
  for (int32_t running : {1, 4}) {
    const auto want = generate(*target, ps, running, 120, nullptr, false, 96, shift);
    for (const auto& out : want) EXPECT_EQ(out.tokens.size(), 120u);
    expect_same(
        want,
        generate(*target, ps, running, 120, std::make_shared<NgramDrafter>(), false, 96, shift),
        "ngram");
  }
}

TEST(SpeculationModel, DefaultModelGreedyEqualsPlainForEveryDrafter) {
  const std::string path = test::default_model_path_or_empty();
  if (path.empty()) GTEST_SKIP() << "the default model is not in the cache";
  auto target = model::Model::load(path);
  check_every_drafter(*target, target.get(), 16);
}

TEST(SpeculationModel, APromptExtendingAnEarlierOutputReusesItsBlocksAndMatches) {
  auto target = synthetic("ggml-vocab-llama-spm.gguf", 9, "f16");
  auto ps = prompts(target->config().n_vocab, 1, 5);
  auto first = generate(*target, ps, 1, 40, nullptr);
  std::vector<int32_t> longer = ps[0];
  longer.insert(longer.end(), first[0].tokens.begin(), first[0].tokens.begin() + 35);
  const std::vector<std::vector<int32_t>> seq = {ps[0], ps[0], ps[0], longer};
  const auto want = generate(*target, seq, 1, 20, nullptr, true);
  const auto got = generate(*target, seq, 1, 20, std::make_shared<NgramDrafter>(), true);
  EXPECT_EQ(got[3].tokens, want[3].tokens);
  EXPECT_EQ(got[3].logprobs, want[3].logprobs);
  EXPECT_GE(got[3].n_cached, 32);
  EXPECT_EQ(got[3].n_cached, want[3].n_cached);
}

TEST(SpeculationModel, ADraftWithAnotherVocabularyIsRefusedAtLoad) {
  auto target = synthetic("ggml-vocab-llama-spm.gguf", 7, "f16");
  auto other = synthetic("ggml-vocab-gpt-2.gguf", 7, "f16");
  try {
    ModelDrafter d(*target, std::move(other), ModelDrafterOptions{.n_threads = 1});
    FAIL() << "accepted a draft model with another vocabulary";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("same vocabulary"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kept_layers("5", 2), Error);
  EXPECT_THROW(kept_layers("0-1", 2), Error);
  EXPECT_THROW(kept_layers("x", 4), Error);
  EXPECT_EQ(kept_layers("1,3-4", 6), (std::vector<int>{0, 2, 5}));
}

}  // namespace
}  // namespace hablar::engine
