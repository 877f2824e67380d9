// Helpers of the engine tests over the fake executor (fake_executor.h): requests, their
// reference outputs, reading a stream to its end, waiting for the metrics.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "fake_executor.h"

namespace hablar::engine::test_util {

using std::chrono::milliseconds;
inline constexpr int32_t kVocab = 97;

inline std::vector<int32_t> reference_generation(std::vector<int32_t> prompt, int32_t n) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i) {
    int32_t t = test::reference_next(prompt, kVocab);
    out.push_back(t);
    prompt.push_back(t);
  }
  return out;
}

struct Result {
  std::vector<int32_t> tokens;
  StreamItem final;
  int32_t first_token_cached = -1;  // the first token item's n_cached_prompt
};

// Reads a handle to its final item; `items` may hold items already taken from it.
inline Result collect(RequestHandle& h, std::vector<StreamItem> items = {}) {
  Result r;
  for (bool first = true;; first = false) {
    if (!first || items.empty())
      if (!h.wait(items, milliseconds(10000))) ADD_FAILURE() << "engine stalled";
    for (auto& it : items) {
      if (it.kind == StreamItem::Kind::kFinal) {
        r.final = it;
        return r;
      }
      if (r.tokens.empty()) r.first_token_cached = it.n_cached_prompt;
      r.tokens.push_back(it.token);
    }
    if (items.empty()) return r;
    items.clear();
  }
}

// Polls the metrics until `pred` holds (they are published after each step).
template <typename Pred>
inline bool eventually(const Engine& e, Pred pred) {
  for (int i = 0; i < 200; ++i) {
    if (pred(e.metrics().snapshot())) return true;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return false;
}

inline GenerateRequest request(std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerateRequest g;
  g.prompt = std::move(prompt);
  g.max_tokens = max_tokens;
  return g;
}

inline std::vector<int32_t> random_prompt(std::mt19937& rng, int32_t n) {
  std::vector<int32_t> p((size_t)n);
  for (auto& t : p) t = (int32_t)(rng() % kVocab);
  return p;
}

// Submits n requests of random prompts, request i's of length(i) tokens, for max_tokens
// each; their prompts are appended to `prompts`.
template <typename Length>
std::vector<std::shared_ptr<RequestHandle>> submit_random(
    Engine& engine, std::mt19937& rng, int n, Length length, int32_t max_tokens,
    std::vector<std::vector<int32_t>>& prompts) {
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int i = 0; i < n; ++i) {
    prompts.push_back(random_prompt(rng, length(i)));
    handles.push_back(engine.submit(request(prompts.back(), max_tokens)));
  }
  return handles;
}

// The KV blocks are the executor's; n_blocks and block_size say which executor the test
// builds beside it.
inline EngineConfig config(int32_t /*n_blocks*/, int32_t /*block_size*/, int32_t max_running) {
  EngineConfig c;
  c.n_ctx = 4096;
  c.scheduler = {.max_running = max_running, .max_step_tokens = 64, .max_prefill_chunk = 32};
  return c;
}

}  // namespace hablar::engine::test_util
