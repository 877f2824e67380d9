// The engine over each real executor (the CPU's; the CUDA one where a device is present, in
// deterministic mode, else the cases skip saying why), on a small synthetic Llama model:
// requests run together (batched, some preempted, some sharing cached prefix blocks and
// copying them on write) produce exactly the greedy tokens each produces alone; prompt
// log-probabilities are the model's own, once per prompt token, however the prompt was
// chunked or preempted.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <random>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/executor_factory.h"
#include "engine/request_sampler.h"
#include "engine/sequence_runner.h"
#include "formats/synthetic_model.h"
#include "model/model.h"
#include "pending_mask_sampler.h"
#include "support/test_support.h"
#include "tiny_models.h"

namespace hablar::engine {
namespace {

using std::chrono::milliseconds;

// An executor of n_blocks blocks of 16 positions on the device under test.
std::unique_ptr<StepExecutor> make_test_executor(const model::Model& m, DeviceKind device,
                                                 int32_t n_blocks, bool launch_ahead = true) {
  ExecutorOptions o;
  o.device = device;
  o.n_threads = 2;
  o.kv_tokens = n_blocks * 16;
  o.cuda.max_step_tokens = 96;
  o.cuda.max_seq_len = 1024;
  o.cuda.deterministic = true;
  o.cuda.launch_ahead = launch_ahead;  // the engine's steps launched ahead (engine_step.cpp)
  return make_executor(m, o);
}

class ModelRunnerTest : public test_models::OnEachExecutor {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string(test_models::write_tiny_llama("engine-runner", 7));
    model_ = model::Model::load(*path_).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete path_;
  }

  // Greedy tokens of each prompt through an engine with the given cache and batch limits.
  std::vector<std::vector<int32_t>> generate(const std::vector<std::vector<int32_t>>& prompts,
                                             int32_t n_blocks, int32_t max_running,
                                             int32_t max_tokens, bool one_at_a_time,
                                             MetricsSnapshot* metrics = nullptr,
                                             bool serve_policy = false,
                                             const SamplingParams* sampling = nullptr,
                                             bool launch_ahead = true) {
    auto runner = make_test_executor(*model_, GetParam(), n_blocks, launch_ahead);
    EngineConfig c;
    c.n_ctx = 1024;
    c.scheduler = {.max_running = max_running, .max_step_tokens = 96, .max_prefill_chunk = 40};
    if (serve_policy) {  // `serve`'s scheduling: waves, steps bounded to 2x their decodes
      c.scheduler.wave_prefill = true;
      c.scheduler.max_decode_slowdown = 2;
      c.scheduler.min_step_prompt_tokens = 8;
    }
    Engine engine(c, *runner);
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
      if (sampling)
        g.sampler = std::make_unique<ParamsSampler>(*sampling, model_->config().n_vocab);
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

TEST_P(ModelRunnerTest, BatchedEqualsAlone) {
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

// Penalties read the tokens so far, the last of them not yet on the host when a step is
// launched ahead: the executor fills it into the history on its device. The outputs are
// those of one step at a time (the CPU's executor never launches ahead: the same run twice).
TEST_P(ModelRunnerTest, PenaltiesLaunchedAheadEqualOneStepAtATime) {
  const auto prompts = test_prompts();
  SamplingParams p;
  p.temperature = 0.0f;
  p.repeat_penalty = 1.5f;
  p.repeat_last_n = 32;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  const auto ahead = generate(prompts, 64, 8, 16, false, nullptr, false, &p, true);
  const auto single = generate(prompts, 64, 8, 16, false, nullptr, false, &p, false);
  const auto plain = generate(prompts, 64, 8, 16, false);
  int changed = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(ahead[i], single[i]) << "request " << i;
    changed += ahead[i] != plain[i] ? 1 : 0;
  }
  EXPECT_GT(changed, 0);  // the penalties changed some output
}

// Runs prompts together (at most 8 at once, prompts in chunks of 40 tokens) through an engine
// over n_blocks blocks, each request set up by `setup`; each request's items but the final
// one, whose items go to `finals` when given.
std::vector<std::vector<StreamItem>> run_together(
    const model::Model& model, DeviceKind device, const std::vector<std::vector<int32_t>>& prompts,
    int32_t n_blocks, const std::function<void(GenerateRequest&)>& setup,
    std::vector<StreamItem>* finals = nullptr, bool launch_ahead = true) {
  auto runner = make_test_executor(model, device, n_blocks, launch_ahead);
  EngineConfig c;
  c.n_ctx = 1024;
  c.scheduler = {.max_running = 8, .max_step_tokens = 96, .max_prefill_chunk = 40};
  Engine engine(c, *runner);
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (const auto& p : prompts) {
    GenerateRequest g;
    g.prompt = p;
    setup(g);
    handles.push_back(engine.submit(std::move(g)));
  }
  std::vector<std::vector<StreamItem>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (bool done = false; !done;) {
      std::vector<StreamItem> items;
      EXPECT_TRUE(handles[i]->wait(items, milliseconds(60000))) << "engine stalled";
      if (items.empty()) break;
      for (auto& it : items) {
        if (it.kind == StreamItem::Kind::kFinal) {
          done = true;
          if (finals) finals->push_back(it);
        } else {
          out[i].push_back(it);
        }
      }
    }
  }
  return out;
}

// Token log-probabilities: up to kMaxDeviceTopLogprobs the CUDA executor computes them with
// its samples (launched ahead), beyond that the engine computes them from a logits row on
// the host; both from the same rows, so the same tokens, figures and order.
TEST_P(ModelRunnerTest, TokenLogprobsOfTheDeviceEqualTheHosts) {
  const auto prompts = test_prompts();
  auto tokens_with = [&](int32_t n_logprobs) {
    return run_together(*model_, GetParam(), prompts, 64, [&](GenerateRequest& g) {
      g.max_tokens = 10;
      g.n_logprobs = n_logprobs;
    });
  };
  const auto device = tokens_with(5);
  const auto host = tokens_with(kMaxDeviceTopLogprobs + 1);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(device[i].size(), 10u) << "request " << i;
    ASSERT_EQ(host[i].size(), 10u) << "request " << i;
    for (size_t t = 0; t < device[i].size(); ++t) {
      const StreamItem &d = device[i][t], &h = host[i][t];
      EXPECT_EQ(d.token, h.token) << "request " << i << " token " << t;
      EXPECT_NEAR(d.logprob, h.logprob, 1e-5) << "request " << i << " token " << t;
      ASSERT_EQ(d.top_logprobs.size(), 5u);
      ASSERT_EQ(h.top_logprobs.size(), (size_t)kMaxDeviceTopLogprobs + 1);
      for (size_t k = 0; k < 5; ++k) {
        EXPECT_EQ(d.top_logprobs[k].token, h.top_logprobs[k].token) << "request " << i;
        EXPECT_NEAR(d.top_logprobs[k].logprob, h.top_logprobs[k].logprob, 1e-5);
      }
      EXPECT_EQ(d.top_logprobs[0].token, d.token);  // greedy
    }
  }
}

// Masks that depend on the token before (a grammar's) with steps launched ahead: the CUDA
// executor gives the mask source the last step's sample from its pinned copy once that step
// ends, while the next forward runs; samples the sampler refuses void the step launched on
// them. The outputs are those of one step at a time, and keep the sampler's rules.
TEST_P(ModelRunnerTest, MasksOfPendingTokensLaunchedAheadEqualOneStepAtATime) {
  const auto prompts = test_prompts();
  auto counts = std::make_shared<test_sampling::PendingMaskSampler::Counts>();
  auto tokens_of = [&](bool launch_ahead) {
    const auto items = run_together(
        *model_, GetParam(), prompts, 64,
        [&](GenerateRequest& g) {
          g.max_tokens = 16;
          g.sampler = std::make_unique<test_sampling::PendingMaskSampler>(counts, true);
        },
        nullptr, launch_ahead);
    std::vector<std::vector<int32_t>> out;
    for (const auto& seq : items) {
      out.emplace_back();
      for (const StreamItem& it : seq) out.back().push_back(it.token);
    }
    return out;
  };
  const auto ahead = tokens_of(true);
  const int ahead_masks = counts->masks_of_pending, ahead_refused = counts->refused;
  const auto single = tokens_of(false);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(ahead[i].size(), 16u) << "request " << i;
    EXPECT_EQ(ahead[i], single[i]) << "request " << i;
    EXPECT_TRUE(test_sampling::keeps_pending_mask_rules(prompts[i], ahead[i])) << "request " << i;
  }
  if (GetParam() == DeviceKind::kCuda) {  // (the CPU's executor samples on the host)
    EXPECT_GT(ahead_masks, 0);
    EXPECT_GT(ahead_refused, 0);
    EXPECT_EQ(counts->masks_of_pending, ahead_masks);  // none one step at a time
  }
}

// serve's policy: the prompts submitted together finish in one step (their last tokens held
// back), later ones prefill beside decodes in time-bounded chunks; outputs are unchanged.
TEST_P(ModelRunnerTest, BatchedEqualsAloneUnderServesPolicy) {
  const auto prompts = test_prompts();
  const auto alone = generate(prompts, 64, 1, 12, /*one_at_a_time=*/true);
  MetricsSnapshot m;
  const auto together = generate(prompts, 64, 8, 12, /*one_at_a_time=*/false, &m, true);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(together[i], alone[i]) << "request " << i;
  EXPECT_GT(m.max_batch_size, 1);
}

TEST_P(ModelRunnerTest, PreemptionKeepsOutputs) {
  const auto prompts = test_prompts();
  const auto alone = generate(prompts, 64, 1, 12, true);
  MetricsSnapshot m;
  // 10 blocks of 16 = 160 positions for seven sequences of up to ~90 tokens.
  const auto squeezed = generate(prompts, 10, 7, 12, false, &m);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(squeezed[i], alone[i]) << "request " << i;
  EXPECT_GT(m.preemptions_total, 0u);
}

TEST_P(ModelRunnerTest, PromptLogprobsAreTheModelsOwnOncePerToken) {
  const auto prompts = test_prompts();  // shared heads: the prefix cache must not serve them
  // Reference: every position's logits from one sequence alone.
  // (On the CUDA executor the engine's prompt rows are scored on the device.)
  std::vector<std::vector<float>> want(prompts.size());
  std::vector<std::vector<std::vector<TokenLogprob>>> want_top(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto executor = make_test_executor(*model_, GetParam(), 64);
    SequenceRunner alone(*executor, 1024, 96);
    const auto rows = alone.eval(prompts[i], /*all_logits=*/true);
    const size_t n_vocab = rows.size() / prompts[i].size();
    std::vector<float> logp(n_vocab);
    for (size_t t = 1; t < prompts[i].size(); ++t) {
      log_softmax(rows.subspan((t - 1) * n_vocab, n_vocab), logp);
      want[i].push_back(logp[(size_t)prompts[i][t]]);
      want_top[i].push_back(top_logprobs(rows.subspan((t - 1) * n_vocab, n_vocab), 2));
    }
  }
  // Batched with 40-token prefill chunks (64 blocks), then squeezed so that sequences are
  // preempted and compute their prompts again (10 blocks).
  for (int32_t n_blocks : {64, 10}) {
    std::vector<StreamItem> finals;
    const auto got = run_together(
        *model_, GetParam(), prompts, n_blocks,
        [](GenerateRequest& g) { g.max_tokens = 0, g.n_prompt_logprobs = 2; }, &finals);
    ASSERT_EQ(finals.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(got[i].size(), prompts[i].size()) << "blocks " << n_blocks << " request " << i;
      EXPECT_FALSE(got[i][0].has_logprob);
      for (size_t t = 0; t < got[i].size(); ++t) {
        EXPECT_EQ(got[i][t].kind, StreamItem::Kind::kPrompt);
        EXPECT_EQ(got[i][t].token, prompts[i][t]);
        if (t == 0) continue;
        EXPECT_NEAR(got[i][t].logprob, want[i][t - 1], 1e-4) << "request " << i << " pos " << t;
        ASSERT_EQ(got[i][t].top_logprobs.size(), 2u);
        for (size_t k = 0; k < 2; ++k) {
          EXPECT_EQ(got[i][t].top_logprobs[k].token, want_top[i][t - 1][k].token);
          EXPECT_NEAR(got[i][t].top_logprobs[k].logprob, want_top[i][t - 1][k].logprob, 1e-4);
        }
      }
      EXPECT_EQ(finals[i].finish_reason, FinishReason::kLength);
      EXPECT_EQ(finals[i].n_generated, 0);
      EXPECT_EQ(finals[i].n_cached_prompt, 0);
    }
  }
}

TEST_P(ModelRunnerTest, MaxTokensZeroNeedsPromptLogprobs) {
  auto runner = make_test_executor(*model_, GetParam(), 16);
  EngineConfig c;
  Engine engine(c, *runner);
  GenerateRequest g;
  g.prompt = {100, 200, 300};
  g.max_tokens = 0;
  EXPECT_THROW(engine.submit(std::move(g)), hablar::Error);
}

// Runs prompts[i] for i in `which` together through one engine (greedy, max_tokens[i] each,
// EOS ignored); each sequence's generated tokens.
std::vector<std::vector<int32_t>> generate_together(
    const model::Model& m, DeviceKind device, const std::vector<std::vector<int32_t>>& prompts,
    const std::vector<int32_t>& max_tokens, const std::vector<size_t>& which) {
  auto ex = make_test_executor(m, device, 64);
  EngineConfig c;
  c.n_ctx = 1024;
  c.scheduler = {.max_running = 8, .max_step_tokens = 96, .max_prefill_chunk = 40};
  Engine engine(c, *ex);
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (size_t i : which) {
    GenerateRequest g;
    g.prompt = prompts[i];
    g.max_tokens = max_tokens[i];
    g.ignore_eos = true;
    handles.push_back(engine.submit(std::move(g)));
  }
  std::vector<std::vector<int32_t>> out(which.size());
  for (size_t k = 0; k < which.size(); ++k)
    for (bool done = false; !done;) {
      std::vector<StreamItem> items;
      EXPECT_TRUE(handles[k]->wait(items, milliseconds(60000))) << "engine stalled";
      if (items.empty()) break;
      for (const auto& it : items)
        if (it.kind == StreamItem::Kind::kFinal)
          done = true;
        else
          out[k].push_back(it.token);
    }
  return out;
}

// Prompts of 17, 11 and 5 tokens in [1, 500]; the first two generate 12 tokens, the third 3.
void three_unequal_prompts(std::vector<std::vector<int32_t>>& prompts,
                           std::vector<int32_t>& max_tokens) {
  std::mt19937 rng(5);
  for (int n : {17, 11, 5}) {
    prompts.emplace_back();
    for (int i = 0; i < n; ++i) prompts.back().push_back(1 + (int32_t)(rng() % 500));
  }
  max_tokens = {12, 12, 3};
}

// Each sequence's tokens, run with the others, equal its run alone.
void expect_batched_equals_alone(const model::Model& m, DeviceKind device) {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int32_t> max_tokens;
  three_unequal_prompts(prompts, max_tokens);
  const auto together = generate_together(m, device, prompts, max_tokens, {0, 1, 2});
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto alone = generate_together(m, device, prompts, max_tokens, {i});
    EXPECT_EQ((int32_t)alone[0].size(), max_tokens[i]);
    EXPECT_EQ(together[i], alone[0]) << "sequence " << i;
  }
}

// The decode wiring scenario driven through the engine: a model of 12 query heads over 2 KV
// heads of 128 values; sequences with prompts of 17, 11 and 5 tokens decode together (on the
// GPU: three live slots of a graph bucket of 4, one padding); the third finishes after 3
// tokens and the others go on without it (two live slots of a bucket of 2). Each sequence's
// tokens equal its own run alone.
TEST_P(ModelRunnerTest, ThreeSequencesOfUnequalLengthsAndOneFinishingEarly) {
  synth::SyntheticModelOptions o;
  o.arch = synth::Arch::kLlama;
  o.shape = {"wiring", 256, 2, 12, 2, 128, 512, 512, 2048, 10000.0, 1e-5, false};
  o.type = "f16";
  o.seed = 17;
  const std::string path = test::make_temp_dir("engine-wiring") + "/wiring.gguf";
  synth::write_synthetic_model(o, path);
  auto m = model::Model::load(path);
  expect_batched_equals_alone(*m, GetParam());
}

// The families the CPU alone runs (phi2's LayerNorm block, SmolLM3's layers without RoPE):
// batched equals alone through the engine on 8 layers.
TEST(CpuFamilies, BatchedEqualsAlone) {
  for (const synth::Arch arch : {synth::Arch::kPhi2, synth::Arch::kSmolLM3}) {
    synth::SyntheticModelOptions o;
    o.arch = arch;
    o.shape = *synth::shape_from_name("tiny-odd");
    o.shape.n_kv_heads = o.shape.n_heads;  // (phi2: no GQA in the published models)
    o.type = "q8_0";
    o.seed = 19;
    const std::string dir = test::make_temp_dir("engine-families");
    synth::write_synthetic_model(o, dir + "/m.gguf");
    auto m = model::Model::load(dir + "/m.gguf");
    SCOPED_TRACE(m->config().arch);
    expect_batched_equals_alone(*m, DeviceKind::kCpu);
    m.reset();
    std::filesystem::remove_all(dir);
  }
}

INSTANTIATE_TEST_SUITE_P(Executors, ModelRunnerTest,
                         ::testing::Values(DeviceKind::kCpu, DeviceKind::kCuda),
                         test_models::executor_name);

#if defined(HABLAR_HAVE_CUDA)
// The CUDA backend refuses, at load and by name, mixtures of experts its routing kernels
// cannot hold (more than 3072 experts); a tiny one of 8 experts it takes (no device needed).
TEST(CudaShapes, MixturesOfExpertsBeyondTheRoutingKernelsAreRefusedByName) {
  synth::SyntheticModelOptions o;
  o.arch = synth::Arch::kQwen3Moe;
  o.shape = *synth::shape_from_name("tiny");
  o.type = "q8_0";
  o.seed = 3;
  const std::string dir = test::make_temp_dir("cuda-shapes");
  synth::write_synthetic_model(o, dir + "/small.gguf");
  std::string reason;
  EXPECT_TRUE(cuda_can_run(*model::Model::load(dir + "/small.gguf"), &reason)) << reason;
  // One narrow layer (11 MB of Q4_0 experts).
  o.type = "q4_0";
  o.shape.n_layers = 1, o.shape.hidden = 64, o.shape.n_heads = o.shape.n_kv_heads = 1;
  o.shape.n_experts = 3100, o.shape.ffn_expert = 32;
  synth::write_synthetic_model(o, dir + "/many.gguf");
  EXPECT_FALSE(cuda_can_run(*model::Model::load(dir + "/many.gguf"), &reason));
  EXPECT_NE(reason.find("up to 3072 experts; this model has 3100"), std::string::npos) << reason;
  std::filesystem::remove_all(dir);
}

// gemma-embedding runs on the CPU only for now: the CUDA backend says so by name (--device
// auto then runs it on the CPU); phi2 (LayerNorm block) and smollm3 (layers without RoPE)
// have CUDA ops, and Phi-2's head size of 80 is refused as a head size.
TEST(CudaShapes, FamiliesWithoutCudaOpsAreRefusedByName) {
  const std::string dir = test::make_temp_dir("cuda-families");
  const auto check = [&](synth::Arch arch, const char* shape, const char* needle) {
    synth::SyntheticModelOptions o;
    o.arch = arch;
    o.shape = *synth::shape_from_name(shape);
    o.type = "f16";
    if (arch == synth::Arch::kPhi2 && needle != nullptr)  // Phi-2's 2560 / 32 heads
      o.shape.hidden = 320, o.shape.n_heads = 4, o.shape.n_kv_heads = 4, o.shape.head_dim = 80;
    synth::write_synthetic_model(o, dir + "/m.gguf");
    std::string reason;
    const bool runs = cuda_can_run(*model::Model::load(dir + "/m.gguf"), &reason);
    if (needle == nullptr) {
      EXPECT_TRUE(runs) << shape << ": " << reason;
    } else {
      EXPECT_FALSE(runs) << shape;
      EXPECT_NE(reason.find(needle), std::string::npos) << reason;
    }
  };
  check(synth::Arch::kGemmaEmbedding, "tiny", "gemma-embedding");
  check(synth::Arch::kPhi2, "tiny", nullptr);
  check(synth::Arch::kSmolLM3, "tiny-odd", nullptr);
  check(synth::Arch::kPhi2, "tiny", "head sizes 64, 96, 128 and 256; this model has 80");
  std::filesystem::remove_all(dir);
}

// The KV cache types the CUDA attention takes, decided without a device: f16 and bf16, K and
// V of one type; q8_0 outside deterministic mode; q4_0 never
// (--device auto then runs on the CPU, --device cuda says why).
TEST(CudaShapes, CacheTypesTheAttentionCannotReadAreRefusedByName) {
  const auto takes = [](KvDType k, KvDType v, bool deterministic, std::string* why) {
    CudaExecutorOptions o;
    o.cache_type_k = k, o.cache_type_v = v, o.deterministic = deterministic;
    return cuda_takes_cache(o, why);
  };
  std::string why;
  EXPECT_TRUE(takes(KvDType::F16, KvDType::F16, true, &why)) << why;
  EXPECT_TRUE(takes(KvDType::BF16, KvDType::BF16, false, &why)) << why;
  EXPECT_FALSE(takes(KvDType::F16, KvDType::Q8_0, false, &why));
  EXPECT_NE(why.find("K and V must be of one type"), std::string::npos) << why;
  EXPECT_FALSE(takes(KvDType::Q4_0, KvDType::Q4_0, false, &why));
  EXPECT_NE(why.find("q4_0 runs on the CPU"), std::string::npos) << why;
  EXPECT_TRUE(takes(KvDType::Q8_0, KvDType::Q8_0, false, &why)) << why;
  EXPECT_FALSE(takes(KvDType::Q8_0, KvDType::Q8_0, true, &why));
  EXPECT_NE(why.find("deterministic mode takes f16 or bf16"), std::string::npos) << why;
}
#endif

}  // namespace
}  // namespace hablar::engine
