// The engine's host time between steps, with an executor that stands in for a device: it
// samples "on the device" (a token id per chunk, no logits), as the CUDA executor does, and
// takes a simulated device time per step (sleeps; by default 1 ms + 13 us per decoded token
// + 6 us per prompt token, about an H200's for a 1.5B model). N requests of P prompt tokens
// and G generated tokens each are submitted together, each read by its own thread as the
// server's streaming handlers read theirs. Prints the steps and, over consecutive decode
// steps of all N sequences, the mean time from the end of one execute() to the start of the
// next: what the engine adds to every such step on the host (emission, scheduling, the
// step's chunks), beside the device's work rather than overlapped with it.
//
// With --gap-ms the requests arrive in groups of --group (16, as bench_serving's client
// processes send them) that far apart, and --serve takes `hablar serve`'s scheduling defaults
// (steps bounded to twice their decodes' cost, waves): then it also prints the run's output
// tok/s and the requests' TTFT and TPOT percentiles, so that a scheduling policy can be
// weighed on this machine against a device model (--slowdown, --batch, --decode-step-tokens
// change the policy; `hablar serve`'s --max-decode-slowdown 0 leaves the 128-token budget
// while anyone decodes, so its untimed form is --slowdown=0 --decode-step-tokens=0).
//
// Usage: engine_overhead [N=256] [P=512] [G=128] [base_us=1000] [us_per_decode=13]
//          [--per-prompt-us=6] [--prompt-step-us=0] [--gap-ms=0] [--group=16] [--serve]
//          [--slowdown=X] [--batch=2048] [--decode-step-tokens=N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine/executor.h"

namespace {

using namespace hablar::engine;
using Clock = std::chrono::steady_clock;

class SimulatedDevice : public StepExecutor {
 public:
  SimulatedDevice(int32_t n_vocab, int32_t n_blocks, int32_t block_size)
      : n_vocab_(n_vocab), n_blocks_(n_blocks), block_size_(block_size) {}
  int32_t n_vocab() const override { return n_vocab_; }
  int32_t n_kv_blocks() const override { return n_blocks_; }
  int32_t kv_block_size() const override { return block_size_; }
  bool samples_on_device() const override { return true; }

  void execute(std::span<const BlockCopy>, std::span<const ExecChunk> chunks,
               StepOutput& out) override {
    const auto start = Clock::now();
    int32_t decode = 0, prompt = 0;
    size_t rows = 0;  // logits rows for chunks the device does not sample
    for (const ExecChunk& c : chunks) {
      decode += c.tokens.size() == 1 ? 1 : 0;
      prompt += c.tokens.size() == 1 ? 0 : (int32_t)c.tokens.size();
      if (c.sampling == nullptr) rows += c.all_logits ? c.tokens.size() : 1;
    }
    const bool full = decode == (int32_t)chunks.size() && decode >= n_full;
    if (full && previous_full) {
      gaps_us += std::chrono::duration<double, std::micro>(start - last_end).count();
      ++n_gaps;
    }
    out.logits.assign(rows * (size_t)n_vocab_, 0.0f);
    out.sampled.assign(chunks.size(), -1);
    for (size_t i = 0; i < chunks.size(); ++i)
      if (chunks[i].sampling != nullptr) out.sampled[i] = 1000 + (int32_t)(i % 5000);
    const double device_us = base_us + per_decode_us * decode + per_prompt_us * prompt +
                             (prompt > 0 ? prompt_step_us : 0);
    std::this_thread::sleep_until(start + std::chrono::microseconds((int64_t)device_us));
    ++steps;
    previous_full = full;
    last_end = Clock::now();
  }

  int32_t n_full = 0;  // decode steps of this many sequences are the ones measured
  double base_us = 1000, per_decode_us = 13, per_prompt_us = 6;
  double prompt_step_us = 0;  // what a step with prompt tokens adds (no CUDA graph for it)
  int64_t steps = 0, n_gaps = 0;
  double gaps_us = 0;

 private:
  int32_t n_vocab_, n_blocks_, block_size_;
  Clock::time_point last_end{};
  bool previous_full = false;
};

struct Options {
  int n = 256, p = 512, g = 128, group = 16, batch = 2048;
  double base_us = 1000, per_decode_us = 13, per_prompt_us = 6, gap_ms = 0, slowdown = -1;
  double prompt_step_us = 0;
  int decode_step_tokens = -1;  // -1: the policy's (serve's 128 with --serve)
  bool serve = false;
};

Options parse(int argc, char** argv) {
  Options o;
  int positional = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* key) -> const char* {
      const size_t n = std::strlen(key);
      return a.compare(0, n, key) == 0 ? a.c_str() + n : nullptr;
    };
    if (a == "--serve")
      o.serve = true;
    else if (const char* v = value("--gap-ms="))
      o.gap_ms = std::atof(v);
    else if (const char* v = value("--group="))
      o.group = std::max(1, std::atoi(v));
    else if (const char* v = value("--slowdown="))
      o.slowdown = std::atof(v);
    else if (const char* v = value("--batch="))
      o.batch = std::atoi(v);
    else if (const char* v = value("--decode-step-tokens="))
      o.decode_step_tokens = std::max(0, std::atoi(v));
    else if (const char* v = value("--per-prompt-us="))
      o.per_prompt_us = std::atof(v);
    else if (const char* v = value("--prompt-step-us="))
      o.prompt_step_us = std::atof(v);
    else if (a.compare(0, 2, "--") == 0) {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      std::exit(2);
    } else if (positional == 0)
      o.n = std::atoi(argv[i]), ++positional;
    else if (positional == 1)
      o.p = std::atoi(argv[i]), ++positional;
    else if (positional == 2)
      o.g = std::atoi(argv[i]), ++positional;
    else if (positional == 3)
      o.base_us = std::atof(argv[i]), ++positional;
    else if (positional == 4)
      o.per_decode_us = std::atof(argv[i]), ++positional;
  }
  return o;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, (size_t)(q * (double)(v.size() - 1) + 0.5))];
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const int n = o.n, p = o.p, g = o.g;
  const int32_t block = 16, blocks = (n * (p + g) + block - 1) / block + n;
  SimulatedDevice device(151936, blocks, block);
  device.n_full = n;
  device.base_us = o.base_us, device.per_decode_us = o.per_decode_us;
  device.per_prompt_us = o.per_prompt_us, device.prompt_step_us = o.prompt_step_us;
  EngineConfig config;
  config.n_ctx = 32768;
  config.max_queue = n;
  config.scheduler.max_running = n;
  config.scheduler.max_step_tokens = o.batch;
  if (o.serve) {  // cmd_serve.cpp's defaults
    config.scheduler.max_decode_slowdown = 2.0;
    config.scheduler.min_step_prompt_tokens = 32;
    config.scheduler.max_step_tokens_decoding = 128;  // until the step costs are known
    config.scheduler.wave_prefill = true;
  }
  if (o.slowdown >= 0) config.scheduler.max_decode_slowdown = o.slowdown;
  if (o.decode_step_tokens >= 0) config.scheduler.max_step_tokens_decoding = o.decode_step_tokens;
  Engine engine(config, device);
  std::vector<std::thread> readers;
  std::mutex finals_mutex;
  std::vector<StreamItem> finals;
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    if (o.gap_ms > 0 && i > 0 && i % o.group == 0)
      std::this_thread::sleep_until(
          t0 + std::chrono::microseconds((int64_t)(1000 * o.gap_ms * (i / o.group))));
    GenerateRequest r;
    r.prompt.resize((size_t)p);
    for (int j = 0; j < p; ++j) r.prompt[(size_t)j] = 1 + (i * 7919 + j * 104729) % 150000;
    r.max_tokens = g;
    r.ignore_eos = true;
    std::shared_ptr<RequestHandle> h = engine.submit(std::move(r));
    readers.emplace_back([h, &finals, &finals_mutex] {
      std::vector<StreamItem> items;
      for (;;) {
        items.clear();
        if (!h->wait(items, std::chrono::milliseconds(1000))) continue;
        for (StreamItem& it : items)
          if (it.kind == StreamItem::Kind::kFinal) {
            std::lock_guard<std::mutex> lock(finals_mutex);
            finals.push_back(std::move(it));
            return;
          }
      }
    });
  }
  for (auto& t : readers) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("%d requests x (%d prompt + %d generated): %lld steps in %.3f s, %.0f out tok/s\n", n,
              p, g, (long long)device.steps, wall, (double)n * g / wall);
  std::vector<double> ttft, tpot;
  for (const StreamItem& f : finals) {
    ttft.push_back(f.prompt_ms);
    if (f.n_generated > 1) tpot.push_back(f.decode_ms / (f.n_generated - 1));
  }
  std::printf("TTFT p50 %.1f p99 %.1f ms, TPOT p50 %.2f p99 %.2f ms\n", percentile(ttft, 0.5),
              percentile(ttft, 0.99), percentile(tpot, 0.5), percentile(tpot, 0.99));
  if (device.n_gaps > 0)
    std::printf("host time between consecutive decode steps of all %d: %.1f us (%lld gaps)\n", n,
                device.gaps_us / device.n_gaps, (long long)device.n_gaps);
  else
    std::printf("no two consecutive decode steps of all %d sequences\n", n);
  return 0;
}
