// Embedding requests in the engine: inputs (whole token sequences) queue here and the step
// loop runs them in embedding steps on the executor (StepExecutor::embed) between its
// generation steps. Inputs of one request and of many requests share a step, up to a token
// budget; an input is never split (encoders see it whole; no KV cache is kept).
//
//   HTTP thread: Engine::submit_embedding() -> EmbedHandle::wait() -> result()
//   step thread: EmbeddingQueue::step(): drop cancelled requests, take the oldest inputs up to
//                the budget, execute, hand each finished request its vectors
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/pooling.h"
#include "engine/executor.h"
#include "engine/metrics.h"

namespace hablar::engine {

struct EmbedRequest {
  std::vector<std::vector<int32_t>> inputs;  // token ids, each a whole input
  Pooling pooling = Pooling::kMean;
};

struct EmbedResult {
  // Per input, as the executor pooled it (EmbedOutput): not normalized.
  std::vector<std::vector<float>> vectors;
  int64_t n_tokens = 0;  // every input's tokens together
  std::string error;     // set when the request failed (the executor threw, shutdown)
  bool cancelled = false;
  double queue_ms = 0;  // submit -> first step that ran one of its inputs
  double total_ms = 0;  // submit -> done
};

// Normalizes v in place as llama.cpp's embd_normalize says: -1 none, 0 max absolute value
// scaled to 32760 (int16 range), 1 taxicab, 2 Euclidean (L2; OpenAI's and Ollama's), p > 2
// the p-norm. A zero vector stays zero.
void normalize_embedding(std::span<float> v, int norm);
// Matryoshka truncation (`dimensions`): keeps the first `dims` values (0 or more than there
// are: all); the caller normalizes after.
void truncate_embedding(std::vector<float>& v, int64_t dims);

class EmbedHandle {
 public:
  // Waits up to `timeout` for the request to finish; true when it has (result() is then
  // final and stays so).
  bool wait(std::chrono::milliseconds timeout);
  const EmbedResult& result() const { return result_; }
  // The step loop drops it before its next embedding step (result().cancelled).
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  friend class EmbeddingQueue;
  void finish();

  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  EmbedResult result_;
};

class EmbeddingQueue {
 public:
  // step_tokens: the token budget of one embedding step (one input may exceed it alone);
  // max_queue: requests waiting at most (beyond: submit throws kResource).
  EmbeddingQueue(int32_t step_tokens, int32_t max_queue)
      : step_tokens_(step_tokens), max_queue_(max_queue) {}

  // Queues a checked request (Engine::submit_embedding checks it).
  std::shared_ptr<EmbedHandle> push(EmbedRequest request);
  bool empty() const;
  // One embedding step on `executor` (step thread only). max_ms > 0: the step is a stall for
  // every decoding stream, so it takes only the inputs that its measured cost per token says
  // fit in max_ms (the first input always goes: each step progresses); 0: step_tokens.
  void step(StepExecutor& executor, EngineMetrics& metrics, double max_ms = 0);
  // The step-cost model of embedding steps: the cost of a token, an exponentially weighted
  // mean (decay 0.8 per step) of each step's ms per token; 0 before any step. observe() is
  // what step() feeds it; token_budget() the tokens a step of at most max_ms may take.
  void observe(int64_t tokens, double ms);
  double ms_per_token() const { return ms_per_token_; }
  int64_t token_budget(double max_ms) const;
  // Ends every waiting request with `message` (shutdown, engine failure).
  void fail_all(const std::string& message);

 private:
  struct Pending {
    EmbedRequest request;
    std::shared_ptr<EmbedHandle> handle;
    size_t next_input = 0;  // inputs before this one have been given to a step
    size_t done_inputs = 0;
    std::chrono::steady_clock::time_point submitted;
    bool started = false;
  };

  int32_t step_tokens_;
  int32_t max_queue_;
  double ms_per_token_ = 0;  // step thread only
  mutable std::mutex mu_;
  std::deque<std::shared_ptr<Pending>> waiting_;
  EmbedOutput output_;
};

}  // namespace hablar::engine
