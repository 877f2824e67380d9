// `hablar batched-bench`: aggregate speed of many sequences sharing each step, measured the
// way llama-batched-bench measures it. For every (PP, TG, B): B sequences each prefill a
// prompt of PP random tokens (steps of up to -b tokens, whole prompts packed together), then
// decode TG tokens each, all B in one step per token. S_PP = B*PP / T_PP, S_TG = B*TG / T_TG.
//
// The steps go straight to the executor (no scheduler, no HTTP), so the figures are the
// device's: decode steps sample greedily where the executor samples (the CUDA executor, in
// its decode graphs), else the host takes the argmax of the returned rows.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/device_options.h"
#include "cli/load_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/paths.h"
#include "engine/executor_factory.h"
#include "model/model.h"

namespace hablar::cli {
namespace {

struct BatchedBenchOptions {
  std::string model;
  LoadFlags load;
  std::vector<int> n_prompt{128};
  std::vector<int> n_gen{128};
  std::vector<int> n_parallel{1, 8, 32, 64, 128, 256};
  int n_threads = 0;
  int n_batch = 2048;
  std::string output = "md";
  DeviceFlags device;
};

struct BatchedResult {
  int pp = 0, tg = 0, b = 0;
  double t_pp = 0, t_tg = 0;
  double s_pp() const { return t_pp > 0 ? (double)b * pp / t_pp : 0; }
  double s_tg() const { return t_tg > 0 ? (double)b * tg / t_tg : 0; }
  double s_all() const { return (double)b * (pp + tg) / (t_pp + t_tg); }
};

using Clock = std::chrono::steady_clock;

// B sequences over one executor, sequence i owning blocks [i * per_seq, (i + 1) * per_seq).
class BatchedRun {
 public:
  BatchedRun(engine::StepExecutor& ex, int n_seq, int ctx, int n_batch)
      : ex_(ex), n_batch_(n_batch), per_seq_((ctx + ex.kv_block_size() - 1) / ex.kv_block_size()) {
    HABLAR_CHECK((int64_t)per_seq_ * n_seq <= ex.n_kv_blocks(),
                 "batched-bench: the KV cache is too small for this many sequences");
    tables_.resize((size_t)n_seq);
    for (int i = 0; i < n_seq; ++i) {
      tables_[(size_t)i].resize((size_t)per_seq_);
      std::iota(tables_[(size_t)i].begin(), tables_[(size_t)i].end(), i * per_seq_);
    }
    n_past_.assign((size_t)n_seq, 0);
    last_.assign((size_t)n_seq, 0);
    greedy_.temperature = 0.0f;
  }

  // Every sequence's prompt, packed into steps of at most n_batch tokens.
  void prefill(const std::vector<std::vector<int32_t>>& prompts) {
    std::vector<engine::ExecChunk> chunks;
    int budget = n_batch_;
    for (size_t i = 0; i < prompts.size(); ++i) {
      for (size_t done = 0; done < prompts[i].size();) {
        if (budget == 0) flush(chunks), budget = n_batch_;
        const size_t n = std::min(prompts[i].size() - done, (size_t)budget);
        chunks.push_back(chunk(i, std::span(prompts[i]).subspan(done, n)));
        n_past_[i] += (int32_t)n;
        done += n, budget -= (int)n;
      }
      last_[i] = prompts[i].back();
    }
    flush(chunks);
  }

  // One token for every sequence, in one step; the next input is the step's greedy choice.
  void decode_step() {
    std::vector<engine::ExecChunk> chunks;
    for (size_t i = 0; i < n_past_.size(); ++i) {
      chunks.push_back(chunk(i, std::span(&last_[i], 1)));
      if (ex_.samples_on_device()) chunks.back().sampling = &greedy_;
      n_past_[i] += 1;
    }
    ex_.execute({}, chunks, out_);
    const size_t V = (size_t)ex_.n_vocab();
    size_t row = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (out_.sampled.size() > i && out_.sampled[i] >= 0) {
        last_[i] = out_.sampled[i];
        continue;
      }
      const float* r = out_.logits.data() + (row++) * V;
      last_[i] = (int32_t)(std::max_element(r, r + V) - r);
    }
  }

 private:
  engine::ExecChunk chunk(size_t seq, std::span<const int32_t> tokens) const {
    engine::ExecChunk c;
    c.tokens = tokens;
    c.start_pos = n_past_[seq];
    c.block_table = tables_[seq];
    return c;
  }
  void flush(std::vector<engine::ExecChunk>& chunks) {
    if (!chunks.empty()) ex_.execute({}, chunks, out_);
    chunks.clear();
  }

  engine::StepExecutor& ex_;
  int n_batch_;
  int per_seq_;
  std::vector<std::vector<int32_t>> tables_;
  std::vector<int32_t> n_past_, last_;
  engine::DeviceSampling greedy_;
  engine::StepOutput out_;
};

std::vector<std::vector<int32_t>> random_prompts(int n_seq, int len, int n_vocab) {
  std::mt19937 rng(1234);
  std::vector<std::vector<int32_t>> p((size_t)n_seq, std::vector<int32_t>((size_t)len));
  for (auto& seq : p)
    for (int32_t& t : seq) t = (int32_t)(rng() % (uint32_t)n_vocab);
  return p;
}

BatchedResult run_one(engine::StepExecutor& ex, const BatchedBenchOptions& o, int pp, int tg,
                      int b) {
  {  // warm-up: the decode graphs of this batch are captured here, not in the timing
    BatchedRun warm(ex, b, 8 + 2, o.n_batch);
    warm.prefill(random_prompts(b, 8, ex.n_vocab()));
    warm.decode_step(), warm.decode_step();
  }
  BatchedRun run(ex, b, pp + tg, o.n_batch);
  const auto prompts = random_prompts(b, pp, ex.n_vocab());
  BatchedResult r{pp, tg, b};
  auto t0 = Clock::now();
  run.prefill(prompts);
  r.t_pp = std::chrono::duration<double>(Clock::now() - t0).count();
  t0 = Clock::now();
  for (int i = 0; i < tg; ++i) run.decode_step();
  r.t_tg = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

int max_of(const std::vector<int>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

void check_options(const BatchedBenchOptions& o) {
  if (o.output != "md" && o.output != "json")
    throw_error(ErrorKind::kInvalidArgument, "-o must be md or json, got " + o.output);
  for (int v : o.n_prompt)
    if (v <= 0) throw_error(ErrorKind::kInvalidArgument, "-npp values must be > 0");
  for (int v : o.n_gen)
    if (v <= 0) throw_error(ErrorKind::kInvalidArgument, "-ntg values must be > 0");
  for (int v : o.n_parallel)
    if (v <= 0 || v > 4096)
      throw_error(ErrorKind::kInvalidArgument, "-npl values must be in [1, 4096]");
  if (o.n_batch <= 0) throw_error(ErrorKind::kInvalidArgument, "-b must be > 0");
}

int run_batched_bench(const BatchedBenchOptions& o) {
  check_options(o);
  auto m = model::Model::load(resolve_model_path(o.model), o.load.options(o.n_threads));
  // Every sequence gets its own blocks for its whole length, with a block to spare.
  const int block = kDefaultKvBlockSize;
  const int ctx = max_of(o.n_prompt) + max_of(o.n_gen);
  const int64_t kv_tokens = (int64_t)max_of(o.n_parallel) * ((ctx + block - 1) / block) * block;
  HABLAR_CHECK(kv_tokens < INT32_MAX, "batched-bench: too many positions");
  const int step_tokens = std::max(o.n_batch, max_of(o.n_parallel));
  auto ex_options = o.device.options(o.n_threads, (int32_t)kv_tokens, step_tokens);
  ex_options.cuda.max_seq_len = ctx;
  auto executor = engine::make_executor(*m, ex_options);
  log::info("{}", executor->describe());
  std::vector<BatchedResult> results;
  for (int pp : o.n_prompt)
    for (int tg : o.n_gen)
      for (int b : o.n_parallel) results.push_back(run_one(*executor, o, pp, tg, b));
  if (o.output == "json") {
    nlohmann::json arr = nlohmann::json::array();
    for (const BatchedResult& r : results)
      arr.push_back({{"pp", r.pp},
                     {"tg", r.tg},
                     {"pl", r.b},
                     {"n_kv", r.b * (r.pp + r.tg)},
                     {"t_pp", r.t_pp},
                     {"speed_pp", r.s_pp()},
                     {"t_tg", r.t_tg},
                     {"speed_tg", r.s_tg()},
                     {"t", r.t_pp + r.t_tg},
                     {"speed", r.s_all()},
                     {"device", executor->device_name()}});
    std::printf("%s\n", arr.dump(2).c_str());
    return 0;
  }
  std::printf(
      "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |"
      "      T s |    S t/s |\n");
  std::printf(
      "|-------|--------|------|--------|----------|----------|----------|----------|"
      "----------|----------|\n");
  for (const BatchedResult& r : results)
    std::printf("| %5d | %6d | %4d | %6d | %8.3f | %8.2f | %8.3f | %8.2f | %8.3f | %8.2f |\n", r.pp,
                r.tg, r.b, r.b * (r.pp + r.tg), r.t_pp, r.s_pp(), r.t_tg, r.s_tg(), r.t_pp + r.t_tg,
                r.s_all());
  return 0;
}

CommandRegistration reg{
    "batched-bench",
    "Measure aggregate prompt and decode speed of many sequences at once",
    [](CLI::App& app) {
      auto o = std::make_shared<BatchedBenchOptions>();
      app.add_option("-m,--model", o->model, "model path or name (default model when omitted)");
      o->load.add_to(app);
      app.add_option("--n-prompt", o->n_prompt, "prompt tokens per sequence (-npp, comma list)")
          ->delimiter(',')
          ->capture_default_str();
      app.add_option("--n-gen", o->n_gen, "generated tokens per sequence (-ntg, comma list)")
          ->delimiter(',')
          ->capture_default_str();
      app.add_option("--n-parallel", o->n_parallel, "sequences at once (-npl, comma list)")
          ->delimiter(',')
          ->capture_default_str();
      app.add_option("-t,--threads", o->n_threads, "threads (0 = all cores)")
          ->capture_default_str();
      app.add_option("-b,--batch-size", o->n_batch, "prompt tokens per step")
          ->capture_default_str();
      app.add_option("-o,--output", o->output, "md or json")->capture_default_str();
      o->device.add_to(app);
      return [o] { return run_batched_bench(*o); };
    },
    {{"-ngl", "--n-gpu-layers"},
     {"-npp", "--n-prompt"},
     {"-ntg", "--n-gen"},
     {"-npl", "--n-parallel"},
     {"-ctk", "--cache-type-k"},
     {"-ctv", "--cache-type-v"}}};

}  // namespace
}  // namespace hablar::cli
