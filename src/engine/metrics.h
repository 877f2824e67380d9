// Counters and histograms the engine keeps for /metrics and /slots. Written by the step
// thread, read by HTTP threads: every read goes through snapshot().
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace hablar::engine {

// Cumulative histogram in Prometheus' shape: counts[i] = observations <= bounds[i].
struct Histogram {
  std::vector<double> bounds;
  std::vector<uint64_t> counts;  // one per bound (cumulative)
  uint64_t count = 0;
  double sum = 0;

  explicit Histogram(std::vector<double> upper_bounds = {});
  void observe(double value);
};

// One live sequence, as /slots shows it.
struct SlotInfo {
  uint64_t id = 0;
  bool running = false;  // false: waiting (queued or preempted)
  int32_t n_prompt = 0;
  int32_t n_generated = 0;
  int32_t n_computed = 0;
  int32_t n_cached_prompt = 0;
  int32_t max_tokens = 0;
};

struct MetricsSnapshot {
  uint64_t prompt_tokens_total = 0;     // prompt tokens received (incl. cached)
  uint64_t prompt_tokens_computed = 0;  // prompt tokens run through the model
  uint64_t prompt_tokens_cached = 0;    // served from the prefix cache
  uint64_t generated_tokens_total = 0;
  uint64_t requests_total = 0;
  uint64_t requests_finished = 0;
  uint64_t requests_rejected = 0;
  uint64_t preemptions_total = 0;
  uint64_t context_shifts_total = 0;  // GenerateRequest::context_shift taking effect
  uint64_t steps_total = 0;
  // Steps launched while the step before them was still on the device (engine_step.cpp).
  uint64_t steps_launched_ahead_total = 0;
  // Device samples the request's sampler refused (a grammar's token that would overrun the
  // budget), each position computed again and sampled on the host; of them, those a step
  // launched on the refused token had to be voided for.
  uint64_t device_samples_refused_total = 0;
  uint64_t steps_voided_total = 0;
  uint64_t embedding_inputs_total = 0;  // inputs embedded (engine/embedding.h)
  uint64_t embedding_steps_total = 0;
  double prompt_seconds_total = 0;  // step time spent on prompt tokens (share)
  double decode_seconds_total = 0;  // step time spent on generated tokens (share)
  // The executor's execute() time, host and waiting for the device (ExecutorTimes).
  double executor_host_seconds = 0;
  double executor_wait_seconds = 0;
  double executor_device_seconds = 0;
  double executor_stage_seconds = 0;  // of host: before the device's span (ExecutorTimes)
  // The engine's own share of the steps: from a step's start to the executor's launch
  // (drafts, scheduling, the chunks' list), and once its output is collected (the tokens
  // emitted, stop checks). With steps launched ahead (engine_step.cpp) these overlap the
  // device's work on the next step.
  double engine_schedule_seconds = 0;
  double engine_emit_seconds = 0;
  int32_t requests_running = 0;
  int32_t requests_waiting = 0;
  int32_t kv_blocks_total = 0;
  int32_t kv_blocks_used = 0;
  int32_t kv_blocks_cached = 0;
  int32_t max_batch_size = 0;
  // Speculative decoding (one drafter per engine, named by spec_type: "none" without one).
  std::string spec_type = "none";
  uint64_t draft_tokens_total = 0;    // drafted and verified
  uint64_t draft_accepted_total = 0;  // of those, accepted
  uint64_t spec_rounds_total = 0;     // verification chunks run
  std::vector<SlotInfo> slots;
  Histogram batch_size{{1, 2, 4, 8, 16, 32, 64, 128}};
  Histogram ttft_seconds{{0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
  Histogram token_latency_seconds{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
};

class EngineMetrics {
 public:
  MetricsSnapshot snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    return data_;
  }
  template <typename F>
  void update(F&& f) {
    std::lock_guard<std::mutex> lock(mu_);
    f(data_);
  }

 private:
  mutable std::mutex mu_;
  MetricsSnapshot data_;
};

}  // namespace hablar::engine
