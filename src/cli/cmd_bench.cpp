// `hablar bench`: prompt processing (pp) and text generation (tg) speed, measured the way
// llama-bench measures them: pp = one sequence's prompt of P tokens from an empty cache (in
// batches of -b), tg = N single-token decode steps from an empty cache; each test is run
// once to warm up, then -r times; tokens/s given as mean ± sample standard deviation.
// With -d N (llama-bench's depth) the sequence first holds N tokens (filled once, untimed),
// and pp/tg are timed on top of them ("pp512 @ d4096"), the cache cut back to N between runs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cli/bench_spec.h"
#include "cli/chat_prompt.h"
#include "cli/command.h"
#include "cli/device_options.h"
#include "cli/load_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/paths.h"
#include "engine/cpu_executor.h"
#include "engine/sequence_runner.h"
#include "model/model.h"

namespace hablar::cli {
namespace {

struct BenchOptions {
  std::string model;
  LoadFlags load;  // --quantize
  std::vector<int> n_prompt{512};
  std::vector<int> n_gen{128};
  std::vector<int> n_depth{0};
  int repetitions = 5;
  int n_threads = 0;
  int n_batch = 512;
  std::string output = "md";
  DeviceFlags device;
  SpecFlags spec;           // --spec-type: a generation test with and without speculation
  std::string prompt_file;  // -f: its prompt (default: random tokens of the first -p)
  bool profile = false;     // --profile: the persistent decode step's phases, timed
  bool persistent = false;  // --persistent-decode: one-token steps as one persistent launch
};

struct TestResult {
  std::string name;  // "pp512", "tg128"
  int n_prompt = 0;
  int n_gen = 0;
  int n_depth = 0;
  std::vector<double> samples_ts;
  double mean() const {
    double s = 0;
    for (double v : samples_ts) s += v;
    return s / (double)samples_ts.size();
  }
  double stddev() const {
    if (samples_ts.size() < 2) return 0.0;
    const double m = mean();
    double s = 0;
    for (double v : samples_ts) s += (v - m) * (v - m);
    return std::sqrt(s / (double)(samples_ts.size() - 1));
  }
};

using Clock = std::chrono::steady_clock;

// Random token ids (fixed seed), as llama-bench feeds random tokens.
std::vector<int32_t> random_tokens(int n, int n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t((size_t)n);
  for (int32_t& v : t) v = (int32_t)(rng() % (uint32_t)n_vocab);
  return t;
}

// Both time tokens on top of the first `depth` tokens of the sequence (already evaluated).
double time_prompt(engine::SequenceRunner& seq, int depth, const std::vector<int32_t>& tokens) {
  seq.truncate(depth);
  const auto t0 = Clock::now();
  seq.eval(tokens);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double time_generation(engine::SequenceRunner& seq, int depth, const std::vector<int32_t>& tokens) {
  seq.truncate(depth);
  const auto t0 = Clock::now();
  for (int32_t t : tokens) seq.eval(std::span(&t, 1));
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

TestResult run_test(engine::StepExecutor& ex, const BenchOptions& o, int n_prompt, int n_gen,
                    int depth) {
  TestResult r;
  r.n_prompt = n_prompt;
  r.n_gen = n_gen;
  r.n_depth = depth;
  r.name = n_prompt > 0 ? "pp" + std::to_string(n_prompt) : "tg" + std::to_string(n_gen);
  if (depth > 0) r.name += " @ d" + std::to_string(depth);
  const int n = std::max(n_prompt, n_gen);
  engine::SequenceRunner seq(ex, depth + n, o.n_batch);
  const std::vector<int32_t> tokens = random_tokens(n, ex.n_vocab(), 1234);
  if (depth > 0) seq.eval(random_tokens(depth, ex.n_vocab(), 4321));  // the context, untimed
  auto once = [&] {
    return n_prompt > 0 ? time_prompt(seq, depth, tokens) : time_generation(seq, depth, tokens);
  };
  once();  // warm-up
  for (int i = 0; i < o.repetitions; ++i) r.samples_ts.push_back((double)n / once());
  return r;
}

// This process's peak resident set (VmHWM) in bytes, or -1 where /proc is unavailable.
// Unlike getrusage's ru_maxrss, it does not inherit the parent's peak across fork + exec.
double peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;  // kB
  return -1;
}

std::string human_size(double bytes) {
  char buf[64];
  if (bytes >= (1 << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1 << 30));
  else
    std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / (1 << 20));
  return buf;
}

int run_bench(const BenchOptions& o) {
  if (o.repetitions <= 0) throw_error(ErrorKind::kInvalidArgument, "-r must be > 0");
  if (o.output != "md" && o.output != "json")
    throw_error(ErrorKind::kInvalidArgument, "-o must be md or json, got " + o.output);
  for (int v : o.n_prompt)
    if (v < 0) throw_error(ErrorKind::kInvalidArgument, "-p values must be >= 0");
  for (int v : o.n_gen)
    if (v < 0) throw_error(ErrorKind::kInvalidArgument, "-n values must be >= 0");
  for (int v : o.n_depth)
    if (v < 0) throw_error(ErrorKind::kInvalidArgument, "-d values must be >= 0");
  const std::string path = resolve_model_path(o.model);
  auto m = model::Model::load(path, o.load.options(o.n_threads));
  int max_tokens = 1;
  for (int v : o.n_prompt) max_tokens = std::max(max_tokens, v);
  for (int v : o.n_gen) max_tokens = std::max(max_tokens, v);
  max_tokens += *std::max_element(o.n_depth.begin(), o.n_depth.end());
  if (const int32_t limit = model::max_context(m->config()); limit > 0 && max_tokens > limit)
    log::warn(
        "depth + tokens {} exceed the model's context of {} (measured all the same, as "
        "llama-bench does)",
        max_tokens, limit);
  std::vector<int32_t> prompt;  // of the --spec-type test
  if (o.spec.spec_type() != engine::SpecType::kNone) {
    prompt = o.prompt_file.empty()
                 ? random_tokens(std::max(1, o.n_prompt.front()), m->config().n_vocab, 1234)
                 : m->tokenizer().encode(read_text_file(o.prompt_file, "prompt file"), true, true);
    for (int v : o.n_gen) max_tokens = std::max(max_tokens, (int)prompt.size() + v + 64);
  }
  engine::ExecutorOptions eo = o.device.options(o.n_threads, max_tokens, o.n_batch);
  eo.cuda.profile_decode = o.profile;
  eo.cuda.persistent_decode = o.persistent;
  auto executor = engine::make_executor(*m, eo);
  log::info("{}", executor->describe());
  const auto* cpu = dynamic_cast<const engine::CpuExecutor*>(executor.get());
  const int n_threads = cpu ? cpu->n_threads() : 0;
  const char* backend = cpu ? "CPU" : "CUDA";
  std::vector<TestResult> results;
  for (int d : o.n_depth) {
    for (int p : o.n_prompt)
      if (p > 0) results.push_back(run_test(*executor, o, p, 0, d));
    for (int n : o.n_gen)
      if (n > 0) results.push_back(run_test(*executor, o, 0, n, d));
  }
  if (o.spec.spec_type() != engine::SpecType::kNone) {
    for (int n : o.n_gen)
      if (n > 0)
        for (SpecBenchRow& r : bench_speculation(*m, *executor, o.spec, o.load.options(o.n_threads),
                                                 o.n_threads, prompt, n, o.repetitions)) {
          TestResult t;
          t.name = r.name;
          t.n_gen = n;
          t.samples_ts = r.samples_ts;
          if (r.drafted > 0)
            t.name += " (" + std::to_string(r.accepted) + "/" + std::to_string(r.drafted) +
                      " drafted accepted)";
          results.push_back(std::move(t));
        }
  }

  // The bound on decode speed: the same threads reading the decode weights, nothing else.
  bool any_gen = false;
  for (const TestResult& r : results) any_gen = any_gen || r.n_gen > 0;
  const double read_gbs = any_gen && cpu ? cpu->weight_read_gbs(5) : 0.0;

  const std::string name = std::filesystem::path(path).filename().string();
  const double file_bytes = (double)std::filesystem::file_size(path);
  const double weight_bytes = (double)m->weight_bytes_per_token();
  const KvCacheLayout kv_layout =
      m->kv_layout_for((max_tokens + kDefaultKvBlockSize - 1) / kDefaultKvBlockSize,
                       kDefaultKvBlockSize, eo.cache_type_k, eo.cache_type_v);
  const double kv_bytes = (double)kv_layout.total_bytes();
  const double kv_bytes_per_token =
      kv_bytes / ((double)kv_layout.n_blocks * (double)kv_layout.block_size);
  if (o.output == "json") {
    nlohmann::json arr = nlohmann::json::array();
    for (const TestResult& r : results)
      arr.push_back({{"model", name},
                     {"model_size", file_bytes},
                     {"n_threads", n_threads},
                     {"backend", backend},
                     {"n_prompt", r.n_prompt},
                     {"n_gen", r.n_gen},
                     {"n_depth", r.n_depth},
                     {"test", r.name},
                     {"avg_ts", r.mean()},
                     {"stddev_ts", r.stddev()},
                     {"samples_ts", r.samples_ts},
                     {"weight_bytes_per_token", weight_bytes},
                     {"weight_read_gbs", read_gbs},
                     {"kv_cache_bytes", kv_bytes},
                     {"kv_bytes_per_token", kv_bytes_per_token},
                     {"peak_rss_bytes", peak_rss_bytes()}});
    std::printf("%s\n", arr.dump(2).c_str());
  } else {
    std::printf("| model | size | backend | threads | test | t/s |\n");
    std::printf("| --- | ---: | --- | ---: | ---: | ---: |\n");
    for (const TestResult& r : results)
      std::printf("| %s | %s | %s | %d | %s | %.2f ± %.2f |\n", name.c_str(),
                  human_size(file_bytes).c_str(), backend, n_threads, r.name.c_str(), r.mean(),
                  r.stddev());
  }
  std::fprintf(stderr, "KV cache: %.0f bytes per token (K %s, V %s)\n", kv_bytes_per_token,
               kv_dtype_name(kv_layout.type(0)), kv_dtype_name(kv_layout.type(1)));
  for (const TestResult& r : results)
    if (r.n_gen > 0 && read_gbs > 0 && r.n_depth == 0)
      std::fprintf(stderr,
                   "%s: %.1f MB of weights per token -> %.2f GB/s of weight reads (%.0f%% of the "
                   "%.2f GB/s that %d threads read from them with no arithmetic)\n",
                   r.name.c_str(), weight_bytes / 1e6, weight_bytes * r.mean() / 1e9,
                   100.0 * weight_bytes * r.mean() / 1e9 / read_gbs, read_gbs, n_threads);
  return 0;
}

CommandRegistration reg{
    "bench",
    "Measure prompt-processing and generation speed",
    [](CLI::App& app) {
      auto o = std::make_shared<BenchOptions>();
      app.add_option("-m,--model", o->model, "model path or name (default model when omitted)");
      o->load.add_to(app);
      app.add_option("-p,--n-prompt", o->n_prompt, "prompt lengths (comma-separated; 0 skips)")
          ->delimiter(',')
          ->capture_default_str();
      app.add_option("-n,--n-gen", o->n_gen, "generation lengths (comma-separated; 0 skips)")
          ->delimiter(',')
          ->capture_default_str();
      app.add_option("-d,--n-depth", o->n_depth,
                     "context depths: tokens in the cache before each test (comma-separated)")
          ->delimiter(',')
          ->capture_default_str();
      app.add_option("-r,--repetitions", o->repetitions, "runs per test")->capture_default_str();
      app.add_option("-t,--threads", o->n_threads, "threads (0 = all cores)")
          ->capture_default_str();
      app.add_option("-b,--batch-size", o->n_batch, "prompt tokens per forward call")
          ->capture_default_str();
      app.add_option("-o,--output", o->output, "md or json")->capture_default_str();
      o->device.add_to(app);
      o->spec.add_to(app);
      app.add_option("-f,--file", o->prompt_file,
                     "prompt of the --spec-type test (default: random tokens of the first -p)");
      app.add_flag("--persistent-decode", o->persistent,
                   "CUDA (experimental): one-token steps as one persistent launch");
      app.add_flag("--profile", o->profile,
                   "CUDA: time the phases of the persistent one-token step (printed at exit)");
      return [o] { return run_bench(*o); };
    },
    {{"-ngl", "--n-gpu-layers"},
     {"-ctk", "--cache-type-k"},
     {"-ctv", "--cache-type-v"},
     {"-md", "--model-draft"}}};

}  // namespace
}  // namespace hablar::cli
