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
// Usage: engine_overhead [N=256] [P=512] [G=128] [base_us=1000] [us_per_decode=13]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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
    const double device_us = base_us + per_decode_us * decode + per_prompt_us * prompt;
    std::this_thread::sleep_until(start + std::chrono::microseconds((int64_t)device_us));
    ++steps;
    previous_full = full;
    last_end = Clock::now();
  }

  int32_t n_full = 0;  // decode steps of this many sequences are the ones measured
  double base_us = 1000, per_decode_us = 13, per_prompt_us = 6;
  int64_t steps = 0, n_gaps = 0;
  double gaps_us = 0;

 private:
  int32_t n_vocab_, n_blocks_, block_size_;
  Clock::time_point last_end{};
  bool previous_full = false;
};

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 256;
  const int p = argc > 2 ? std::atoi(argv[2]) : 512;
  const int g = argc > 3 ? std::atoi(argv[3]) : 128;
  const int32_t block = 16, blocks = (n * (p + g) + block - 1) / block + n;
  SimulatedDevice device(151936, blocks, block);
  device.n_full = n;
  if (argc > 4) device.base_us = std::atof(argv[4]);
  if (argc > 5) device.per_decode_us = std::atof(argv[5]);
  EngineConfig config;
  config.n_ctx = 32768;
  config.max_queue = n;
  config.scheduler.max_running = n;
  config.scheduler.max_step_tokens = 2048;
  Engine engine(config, device);
  std::vector<std::shared_ptr<RequestHandle>> handles;
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    GenerateRequest r;
    r.prompt.resize((size_t)p);
    for (int j = 0; j < p; ++j) r.prompt[(size_t)j] = 1 + (i * 7919 + j * 104729) % 150000;
    r.max_tokens = g;
    r.ignore_eos = true;
    handles.push_back(engine.submit(std::move(r)));
  }
  std::vector<std::thread> readers;
  for (auto& h : handles)
    readers.emplace_back([h] {
      std::vector<StreamItem> items;
      for (;;) {
        items.clear();
        if (!h->wait(items, std::chrono::milliseconds(1000))) continue;
        if (std::any_of(items.begin(), items.end(),
                        [](const StreamItem& it) { return it.kind == StreamItem::Kind::kFinal; }))
          return;
      }
    });
  for (auto& t : readers) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("%d requests x (%d prompt + %d generated): %lld steps in %.3f s\n", n, p, g,
              (long long)device.steps, wall);
  if (device.n_gaps > 0)
    std::printf("host time between consecutive decode steps of all %d: %.1f us (%lld gaps)\n", n,
                device.gaps_us / device.n_gaps, (long long)device.n_gaps);
  else
    std::printf("no two consecutive decode steps of all %d sequences\n", n);
  return 0;
}
