// The CUDA executor against the CPU executor (the reference, itself equal to llama.cpp), in
// both GPU modes:
//  - default mode: the GPU multiplies f32 activations (int8 for Q4_K), where the CPU rounds
//    as llama.cpp's CPU backend does (activations quantized to 8 bits for quantized weights,
//    to F16 for F16 weights). Random-weight models have near-ties that such differences flip:
//    measured on the H200, 87-97% top-1 and 0.02-0.09 (bounded below at 85% and 0.15); the
//    real models: top-1 at >= 98% (97% for Gemma 3), perplexity within 0.2% (0.5%), greedy
//    agreement printed. Against a float32 reference (tools/gpu_vs_reference.py) the default
//    GPU is the closer one (H200, 2026-12-01: greedy 64 tokens equal to the reference's on
//    15/20 prompts against the CPU's 6/20), so the two parted on 14/20 prompts;
//  - deterministic mode (cpu_rounding_ops.h): the CPU's own roundings, so synthetic models
//    in every weight type agree at top-1 on >= 99% of positions with |d| <= 0.01, and the
//    real models' greedy 64-token outputs equal the CPU's on >= 18 of 20 prompts, perplexity
//    within 0.2%;
//  - batched = single: with --deterministic, every sequence's greedy 64 tokens are the same
//    whether it runs alone or among 1, 2, 3, 8, 16, 64 or 128 (the default mode's differences
//    are printed, not gated);
//  - mixtures of experts (synthetic Mixtral, Qwen2-MoE, Qwen3-MoE in F16, Q8_0, Q4_K_M): the
//    bounds above, and in deterministic mode every logits row identical to the CPU's and
//    batched = single.
//  - the experimental persistent one-token step (backend/cuda/persistent_step.h) against the
//    launch-per-op step it replaces, over 48 greedy steps: top-1 on 85%, |d| <= 0.15;
//  - repeatability: in the default mode, a prompt and 32 greedy steps give the same logits,
//    bit for bit, in three runs.
// Every case skips, saying why, without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cuda/lab_knobs.h"
#include "engine/engine.h"
#include "engine/executor_factory.h"
#include "engine/perplexity.h"
#include "engine/sampler.h"
#include "engine/sequence_runner.h"
#include "formats/synthetic_model.h"
#include "model/model.h"
#include "support/test_support.h"

namespace hablar::engine {
namespace {

nlohmann::json golden(const std::string& name) {
  std::ifstream in(test::source_dir() + "/tests/golden/model/" + name + ".json");
  if (!in) throw std::runtime_error("missing golden file " + name);
  return nlohmann::json::parse(in);
}

std::unique_ptr<StepExecutor> executor(const model::Model& m, DeviceKind device, int32_t n_ctx,
                                       bool deterministic = false, int32_t step_tokens = 512,
                                       bool persistent_decode = false,
                                       KvDType kv_type = KvDType::F16) {
  ExecutorOptions o;
  o.cache_type_k = o.cache_type_v = kv_type;
  o.cuda.persistent_decode = persistent_decode;
  o.device = device;
  o.kv_tokens = n_ctx;
  o.cuda.max_step_tokens = step_tokens;
  o.cuda.max_seq_len = n_ctx;
  o.cuda.deterministic = deterministic;
  return make_executor(m, o);
}

class GpuParity : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason;
    if (!cuda_available(&reason)) GTEST_SKIP() << "no CUDA device: " << reason;
    // HABLAR_TEST_LAB_KNOBS=1 lets the lab knobs steer the kernels under test (for example
    // HABLAR_FLASH_PREFILL=2: every prompt chunk of 32+ tokens on the flash kernel, which
    // these small models' few heads would otherwise never fill the GPU enough to take).
    if (const char* v = std::getenv("HABLAR_TEST_LAB_KNOBS"); v != nullptr && *v == '1')
      cuda::enable_lab_knobs();
  }
};

// log_softmax rows of every position of each prompt, evaluated as one prompt.
std::vector<std::vector<float>> teacher_forced(StepExecutor& ex, const std::vector<int32_t>& ids) {
  SequenceRunner seq(ex, (int)ids.size(), 512);
  const std::span<const float> logits = seq.eval(ids, true);
  const size_t V = (size_t)ex.n_vocab();
  std::vector<std::vector<float>> rows(ids.size(), std::vector<float>(V));
  for (size_t p = 0; p < ids.size(); ++p) log_softmax(logits.subspan(p * V, V), rows[p]);
  return rows;
}

struct Agreement {
  int positions = 0, top1_equal = 0;
  int identical = 0;   // positions whose every logit is the CPU's, bit for bit
  double max_abs = 0;  // over each position's CPU top-8 tokens
};

Agreement compare(const model::Model& m, const nlohmann::json& prompts, bool deterministic,
                  KvDType kv_type = KvDType::F16) {
  auto cpu = executor(m, DeviceKind::kCpu, 1024, false, 512, false, kv_type);
  auto gpu = executor(m, DeviceKind::kCuda, 1024, deterministic, 512, false, kv_type);
  Agreement a;
  for (const auto& pr : prompts) {
    const auto ids = pr["ids"].get<std::vector<int32_t>>();
    const auto want = teacher_forced(*cpu, ids);
    const auto got = teacher_forced(*gpu, ids);
    for (size_t p = 0; p < ids.size(); ++p) {
      ++a.positions;
      if (argmax(want[p]) == argmax(got[p])) ++a.top1_equal;
      if (want[p] == got[p]) ++a.identical;
      for (const TokenLogprob& t : top_logprobs(want[p], 8))
        a.max_abs = std::max(a.max_abs,
                             (double)std::abs(want[p][(size_t)t.token] - got[p][(size_t)t.token]));
    }
  }
  return a;
}

// Writes the synthetic model a golden file describes (tests/golden/model/synthetic-*.json).
std::unique_ptr<model::Model> golden_model(const nlohmann::json& g, const std::string& path) {
  const auto& spec = g["model"];
  synth::SyntheticModelOptions o;
  o.arch = *synth::arch_from_name(spec["arch"].get<std::string>());
  o.shape = *synth::shape_from_name(spec["shape"].get<std::string>());
  o.type = spec["type"].get<std::string>();
  const std::string vocab = spec["vocab"].get<std::string>();
  o.vocab_path = vocab.empty() ? "" : test::testdata_dir() + "/vocab/" + vocab;
  o.seed = spec["seed"].get<uint64_t>();
  synth::write_synthetic_model(o, path);
  return model::Model::load(path);
}

// The persistent one-token step (backend/cuda/persistent_step.h) against the launch-per-op
// graph of the same step: the same prompt, then 48 one-token steps fed the launch-per-op
// step's greedy token. Their norms and products are the same bit for bit; the attention sums
// in its own order (f32 on CUDA cores against the tensor-core kernel's f16 operands), so
// rows differ by rounding: gated at the default mode's bounds against the CPU (top-1 on 85%,
// |d log-softmax| <= 0.15 over the top 8) and printed. The persistent executor must say it
// took that path (describe()), or the comparison would be of a step with itself.
TEST_F(GpuParity, PersistentDecodeStepAgreesWithTheLaunchPerOpStep) {
  const std::string dir = test::make_temp_dir("gpu-persistent");
  for (const char* name : {"llama-q4_k", "qwen2-q4_k", "qwen2-yarn-q4_k_m"}) {
    const nlohmann::json g = golden(std::string("synthetic-") + name);
    auto m = golden_model(g, dir + "/" + name + ".gguf");
    auto fused = executor(*m, DeviceKind::kCuda, 1024, false, 512, true);
    auto per_op = executor(*m, DeviceKind::kCuda, 1024, false, 512, false);
    EXPECT_NE(fused->describe().find("persistent launch"), std::string::npos) << fused->describe();
    EXPECT_EQ(per_op->describe().find("persistent launch"), std::string::npos);
    const auto ids = g["prompts"][0]["ids"].get<std::vector<int32_t>>();
    SequenceRunner a(*fused, 1024, 512), b(*per_op, 1024, 512);
    a.eval(ids), b.eval(ids);
    const size_t V = (size_t)fused->n_vocab();
    std::vector<float> want(V), got(V);
    int32_t token = ids.back();
    int steps = 0, top1 = 0;
    double max_abs = 0;
    for (; steps < 48; ++steps) {
      const std::span<const float> la = a.eval({&token, 1}), lb = b.eval({&token, 1});
      log_softmax(lb, want), log_softmax(la, got);
      top1 += argmax(want) == argmax(got);
      for (const TokenLogprob& t : top_logprobs(want, 8))
        max_abs = std::max(max_abs, (double)std::abs(want[(size_t)t.token] - got[(size_t)t.token]));
      token = argmax(want);
    }
    std::printf(
        "persistent vs launch-per-op step, %s: top-1 equal %d/%d, max |d log-softmax| %.5f\n", name,
        top1, steps, max_abs);
    EXPECT_GE(top1, (int)std::ceil(0.85 * steps)) << name;
    EXPECT_LE(max_abs, 0.15) << name;
  }
  std::filesystem::remove_all(dir);
}

// Greedy decoding repeats bit for bit in the default mode: a prompt and 32 greedy one-token
// steps, in three executors, give the same logits rows. Two layers of the Llama-3-8B shape in
// Q4_K (4096 wide, 14336 inner): the down product takes the looping Q4_K kernel, whose
// activation loads, once placed by ptxas above the wait on the kernel before, made the 8B
// shape's greedy outputs differ from run to run (dependent_launch.cuh).
TEST_F(GpuParity, GreedyDecodeRepeatsBitForBit) {
  const std::string dir = test::make_temp_dir("gpu-repeat");
  synth::SyntheticModelOptions o;
  o.arch = synth::Arch::kLlama;
  o.shape = *synth::shape_from_name("llama3-8b");
  o.shape.n_layers = 2;
  o.shape.vocab = 4096;
  o.type = "q4_k";
  o.seed = 7;
  const std::string path = dir + "/llama3-8b-two-layers.gguf";
  synth::write_synthetic_model(o, path);
  auto m = model::Model::load(path);
  const std::vector<int32_t> prompt = {1, 15, 300, 42, 7, 1999, 23, 5, 811, 64};
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 3; ++run) {
    auto ex = executor(*m, DeviceKind::kCuda, 1024, false, 512, false);
    SequenceRunner seq(*ex, 1024, 512);
    std::span<const float> logits = seq.eval(prompt);
    std::vector<float> rows;
    for (int step = 0; step < 32; ++step) {
      rows.insert(rows.end(), logits.begin(), logits.end());
      const int32_t token = argmax(logits);
      logits = seq.eval({&token, 1});
    }
    runs.push_back(std::move(rows));
  }
  for (int run = 1; run < 3; ++run) {
    ASSERT_EQ(runs[run].size(), runs[0].size());
    EXPECT_EQ(std::memcmp(runs[run].data(), runs[0].data(), runs[0].size() * sizeof(float)), 0)
        << "run " << run << " differs from run 0";
  }
  std::filesystem::remove_all(dir);
}

// KV caches of other types: the GPU over bf16 and q8_0 rows against the CPU over the same
// type, teacher-forced, at the default mode's bounds (top-1 on 85% of positions, |d
// log-softmax| <= 0.15 over the CPU's top 8). Gemma 2's soft-capped scores take the CUDA-core
// decode kernel, the others the tensor-core one; prompt chunks take the flash kernel or the
// decode kernel by their size.
TEST_F(GpuParity, KvCacheTypesAgreeWithTheCpuOverTheSameType) {
  const std::string dir = test::make_temp_dir("gpu-kv-types");
  for (KvDType type : {KvDType::BF16, KvDType::Q8_0})
    for (const char* name : {"llama-q4_k", "qwen2-yarn-q4_k_m", "gemma2-q8_0"}) {
      const nlohmann::json g = golden(std::string("synthetic-") + name);
      auto m = golden_model(g, dir + "/" + name + ".gguf");
      const Agreement a = compare(*m, g["prompts"], false, type);
      std::printf("GPU vs CPU, %s KV, %s: top-1 equal %d/%d, max |d log-softmax| %.5f\n",
                  kv_dtype_name(type), name, a.top1_equal, a.positions, a.max_abs);
      EXPECT_GE(a.top1_equal, (int)std::ceil(0.85 * a.positions)) << name;
      EXPECT_LE(a.max_abs, 0.15) << kv_dtype_name(type) << " " << name;
    }
  std::filesystem::remove_all(dir);
}

bool is_moe(const std::string& arch) {
  return arch == "mixtral" || arch == "qwen2moe" || arch == "qwen3moe" || arch == "olmoe" ||
         arch == "granitemoe";
}

// The weight types each family's goldens cover: every type for llama, qwen2 and qwen3, the
// float, 8-bit and usual K-quant mix for the others.
std::vector<const char*> golden_types(const std::string& arch) {
  if (arch == "llama" || arch == "qwen2" || arch == "qwen3")
    return {"f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q5_k", "q6_k"};
  return {"f16", "q8_0", "q4_k_m"};
}

void synthetic_family_against_the_cpu(const std::string& arch, bool deterministic) {
  const std::string dir = test::make_temp_dir("gpu-parity");
  for (const char* type : golden_types(arch)) {
    const nlohmann::json g = golden("synthetic-" + arch + "-" + type);
    const std::string path = dir + "/" + arch + "-" + type + ".gguf";
    auto m = golden_model(g, path);
    const Agreement a = compare(*m, g["prompts"], deterministic);
    std::printf(
        "GPU (%s) vs CPU %s %s: top-1 equal %d/%d, identical rows %d, max |d log-softmax| "
        "%.5f\n",
        deterministic ? "deterministic" : "default", arch.c_str(), type, a.top1_equal, a.positions,
        a.identical, a.max_abs);
    // The deterministic mode computes the CPU's values: top-1 at 99% at least (soft-capped
    // scores go through the device's tanhf, the one difference left).
    EXPECT_GE(a.top1_equal, (int)std::ceil((deterministic ? 0.99 : 0.85) * a.positions))
        << arch << " " << type;
    // The default mode's |delta| bound holds for dense layers. In a mixture of experts a
    // router near-tie that the default mode's rounding tips the other way picks another
    // expert for that token, and the row moves by far more (0.28-1.24 on the H200,
    // 2026-12-02): there only top-1 is gated, and the deterministic mode below is exact.
    if (deterministic || !is_moe(arch)) {
      EXPECT_LE(a.max_abs, deterministic ? 0.01 : 0.15) << arch << " " << type;
    }
    // Mixtures of experts have no soft-cap: every row is the CPU's (routing, the expert
    // products in the CPU's one-token order, the weighted sum: backend/cuda/moe_routing.cuh).
    if (deterministic && is_moe(arch)) {
      EXPECT_EQ(a.identical, a.positions) << arch << " " << type;
    }
    std::filesystem::remove(path);
  }
  std::filesystem::remove_all(dir);
}

// Each family's synthetic goldens (a test per family, so one can be run or left out alone).
class SyntheticGpuParity : public ::testing::WithParamInterface<std::string>, public GpuParity {};

TEST_P(SyntheticGpuParity, DefaultModeAgreesWithTheCpu) {
  synthetic_family_against_the_cpu(GetParam(), false);
}

TEST_P(SyntheticGpuParity, DeterministicModeIsTheCpus) {
  synthetic_family_against_the_cpu(GetParam(), true);
}

INSTANTIATE_TEST_SUITE_P(Families, SyntheticGpuParity,
                         ::testing::Values("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3",
                                           "phi2", "smollm3", "granite", "ernie4_5", "olmo2",
                                           "starcoder2", "exaone4", "hunyuan-dense", "glm4",
                                           "arcee", "mistral3", "exaone", "xverse", "seed_oss",
                                           "command-r", "cohere2", "minicpm", "olmoe", "internlm2",
                                           "orion", "nemotron", "stablelm", "granitemoe", "mixtral",
                                           "qwen2moe", "qwen3moe"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// The real models of tests/unit/model/golden_real_models_test.cpp.
// Measured on the H200 (2026-12-01): SmolLM2 top-1 231/234, perplexity -0.06%; Gemma 3 270M
// top-1 238/244, perplexity +0.10% (its 262k-entry vocabulary has more near-ties for the
// CPU's 8-bit activations to flip).
struct RealModel {
  const char* golden;
  const char* file;
  double top1_fraction;  // teacher-forced top-1 equal to the CPU's at least at this share
  double ppl_rel_tol;    // GPU against CPU
};

class RealModelGpu : public ::testing::WithParamInterface<RealModel>, public GpuParity {
 protected:
  void SetUp() override {
    GpuParity::SetUp();
    if (IsSkipped()) return;
    path_ = test::cached_model_path_or_empty(GetParam().file);
    ASSERT_FALSE(path_.empty()) << GetParam().file << " missing: run scripts/fetch-model.sh";
    model_ = model::Model::load(path_);
    golden_ = golden(GetParam().golden);
  }
  std::string path_;
  std::unique_ptr<model::Model> model_;
  nlohmann::json golden_;
};

std::vector<int32_t> greedy(StepExecutor& ex, const std::vector<int32_t>& ids, int n) {
  SequenceRunner seq(ex, (int)ids.size() + n, 512);
  std::span<const float> logits = seq.eval(ids);
  std::vector<int32_t> out;
  for (int t = 0; t < n; ++t) {
    out.push_back(argmax(logits));
    if (t + 1 < n) logits = seq.eval(std::span(&out.back(), 1));
  }
  return out;
}

// With HABLAR_PARITY_DUMP=PREFIX, the greedy outputs of both backends and, per position of
// each prompt, the log-softmax both give the CPU's 16 likeliest tokens are written to
// PREFIX-<model>.json,
// for tools/gpu_vs_reference.py to compare both with a float32 reference implementation.
void dump_for_reference(StepExecutor& cpu, StepExecutor& gpu, const nlohmann::json& prompts,
                        const std::vector<std::vector<int32_t>>& cpu_greedy,
                        const std::vector<std::vector<int32_t>>& gpu_greedy, const char* file) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto ids = prompts[i]["ids"].get<std::vector<int32_t>>();
    const auto want = teacher_forced(cpu, ids);
    const auto got = teacher_forced(gpu, ids);
    nlohmann::json positions = nlohmann::json::array();
    for (size_t p = 0; p < ids.size(); ++p) {
      nlohmann::json tokens = nlohmann::json::array(), c = tokens, g = tokens;
      for (const TokenLogprob& t : top_logprobs(want[p], 16)) {
        tokens.push_back(t.token);
        c.push_back(want[p][(size_t)t.token]);
        g.push_back(got[p][(size_t)t.token]);
      }
      positions.push_back({{"tokens", tokens}, {"cpu", c}, {"gpu", g}});
    }
    out.push_back({{"ids", ids},
                   {"cpu_greedy", cpu_greedy[i]},
                   {"gpu_greedy", gpu_greedy[i]},
                   {"positions", positions}});
  }
  std::ofstream(file) << out.dump();
}

// Default mode: greedy agreement printed, top-1 and perplexity bounded. Deterministic mode:
// greedy 64-token outputs equal to the CPU's on at least 18 of the 20 prompts, top-1 at 99%.
void real_model_against_the_cpu(const model::Model& model, const nlohmann::json& golden,
                                const RealModel& param, bool deterministic) {
  const char* name = param.golden;
  const char* mode = deterministic ? "deterministic" : "default";
  auto cpu = executor(model, DeviceKind::kCpu, 1024);
  auto gpu = executor(model, DeviceKind::kCuda, 1024, deterministic);
  int identical = 0, n = 0;
  std::vector<std::vector<int32_t>> cpu_greedy, gpu_greedy;
  for (const auto& pr : golden["prompts"]) {
    const auto ids = pr["ids"].get<std::vector<int32_t>>();
    cpu_greedy.push_back(greedy(*cpu, ids, 64));
    gpu_greedy.push_back(greedy(*gpu, ids, 64));
    identical += cpu_greedy.back() == gpu_greedy.back();
    ++n;
  }
  if (const char* prefix = std::getenv("HABLAR_PARITY_DUMP"); prefix && !deterministic)
    dump_for_reference(*cpu, *gpu, golden["prompts"], cpu_greedy, gpu_greedy,
                       (std::string(prefix) + "-" + name + ".json").c_str());
  std::printf("%s (%s) greedy 64 tokens: GPU = CPU on %d/%d prompts\n", name, mode, identical, n);
  if (deterministic) {
    EXPECT_GE(identical, 18) << "of " << n;
  }
  const Agreement a = compare(model, golden["prompts"], deterministic);
  std::printf(
      "%s (%s) teacher-forced: top-1 equal %d/%d, identical rows %d, max |d "
      "log-softmax| %.5f\n",
      name, mode, a.top1_equal, a.positions, a.identical, a.max_abs);
  EXPECT_GE(a.top1_equal,
            (int)std::ceil((deterministic ? 0.99 : param.top1_fraction) * a.positions));
  const auto& p = golden["perplexity"];
  const auto ids = p["ids"].get<std::vector<int32_t>>();
  const int n_ctx = p["n_ctx"].get<int>();
  auto cpu_ppl = executor(model, DeviceKind::kCpu, n_ctx);
  auto gpu_ppl = executor(model, DeviceKind::kCuda, n_ctx, deterministic);
  const auto args = [&](StepExecutor& ex) {
    return perplexity_of_tokens(ex, ids, n_ctx, 512, p["n_chunks"].get<int>(),
                                p["bos"].get<int32_t>());
  };
  const double want = args(*cpu_ppl).ppl, got = args(*gpu_ppl).ppl;
  std::printf("%s (%s) perplexity: GPU %.4f, CPU %.4f (%+.3f%%)\n", name, mode, got, want,
              100.0 * (got / want - 1.0));
  EXPECT_NEAR(got, want, (deterministic ? 0.002 : param.ppl_rel_tol) * want);
}

TEST_P(RealModelGpu, GreedyOutputsAndPerplexityMatchTheCpu) {
  real_model_against_the_cpu(*model_, golden_, GetParam(), false);
}

TEST_P(RealModelGpu, DeterministicModeGivesTheCpusGreedyOutputs) {
  real_model_against_the_cpu(*model_, golden_, GetParam(), true);
}

// Each prompt's greedy tokens through an engine over `ex`, all submitted at once.
std::vector<std::vector<int32_t>> through_engine(StepExecutor& ex,
                                                 const std::vector<std::vector<int32_t>>& prompts,
                                                 int max_running, int n_tokens) {
  EngineConfig c;
  c.n_ctx = 1024;
  c.max_queue = 1024;
  c.scheduler = {.max_running = max_running, .max_step_tokens = 512, .max_prefill_chunk = 512};
  Engine engine(c, ex);
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (const auto& p : prompts) {
    GenerateRequest g;
    g.prompt = p;
    g.max_tokens = n_tokens;
    g.ignore_eos = true;
    handles.push_back(engine.submit(std::move(g)));
  }
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i)
    for (bool done = false; !done;) {
      std::vector<StreamItem> items;
      handles[i]->wait(items, std::chrono::milliseconds(1000));
      for (const auto& it : items)
        if (it.kind == StreamItem::Kind::kFinal)
          done = true;
        else if (it.kind == StreamItem::Kind::kToken)
          out[i].push_back(it.token);
    }
  return out;
}

void batched_equals_single(const model::Model& m, const nlohmann::json& golden_prompts,
                           bool deterministic) {
  auto ex = executor(m, DeviceKind::kCuda, 0, deterministic, 512);
  std::vector<std::vector<int32_t>> pool;
  for (const auto& pr : golden_prompts) pool.push_back(pr["ids"].get<std::vector<int32_t>>());
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : pool) alone.push_back(through_engine(*ex, {p}, 1, 64)[0]);
  for (int n : {1, 2, 3, 8, 16, 64, 128}) {
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < n; ++i) prompts.push_back(pool[(size_t)i % pool.size()]);
    const auto got = through_engine(*ex, prompts, n, 64);
    int equal = 0;
    for (int i = 0; i < n; ++i) equal += got[(size_t)i] == alone[(size_t)i % pool.size()];
    std::printf("%s: %d concurrent, %d/%d outputs equal to their solo run\n",
                deterministic ? "deterministic" : "default", n, equal, n);
    if (deterministic) {
      EXPECT_EQ(equal, n) << n << " concurrent";
    }
  }
}

TEST_P(RealModelGpu, BatchedEqualsSingleInDeterministicMode) {
  batched_equals_single(*model_, golden_["prompts"], true);
}

TEST_P(RealModelGpu, BatchedAgainstSingleInDefaultModeIsReported) {
  batched_equals_single(*model_, golden_["prompts"], false);
}

// The synthetic mixtures of experts (Mixtral, Qwen2-MoE with its shared expert, Qwen3-MoE)
// in each weight type: every sequence's greedy 64 tokens alone and among 1 ... 128 others,
// identical with --deterministic; the default mode's differences printed.
void moe_models_batched_against_single(bool deterministic) {
  const std::string dir = test::make_temp_dir("gpu-moe-batched");
  for (const char* arch : {"mixtral", "qwen2moe", "qwen3moe"})
    for (const char* type : {"f16", "q8_0", "q4_k_m"}) {
      const nlohmann::json g = golden(std::string("synthetic-") + arch + "-" + type);
      const std::string path = dir + "/" + arch + "-" + type + ".gguf";
      auto m = golden_model(g, path);
      std::printf("%s %s:\n", arch, type);
      batched_equals_single(*m, g["prompts"], deterministic);
      std::filesystem::remove(path);
    }
  std::filesystem::remove_all(dir);
}

TEST_F(GpuParity, MoeModelsBatchedEqualsSingleInDeterministicMode) {
  moe_models_batched_against_single(true);
}

TEST_F(GpuParity, MoeModelsBatchedAgainstSingleInDefaultModeIsReported) {
  moe_models_batched_against_single(false);
}

INSTANTIATE_TEST_SUITE_P(
    Models, RealModelGpu,
    ::testing::Values(RealModel{"smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", 0.98, 0.002},
                      RealModel{"gemma3-270m", "gemma-3-270m-q4_k_m.gguf", 0.97, 0.005}),
    [](const auto& info) {
      return std::string(info.param.golden) == "smollm2" ? "SmolLM2" : "Gemma3_270m";
    });

}  // namespace
}  // namespace hablar::engine
