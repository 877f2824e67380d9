// llama-server's timings_per_token: every chunk of a stream that asks for it carries the
// generation's timings so far, in the shape of the final "timings" (timings_json).
//
// They are measured on the streaming route's own clock: the prompt from the stream's start
// to the first token it reads, the prediction from that token on; prompt_n and cache_n come
// from the request's slot when its first token arrives. The final chunk still carries the
// engine's exact figures.
#pragma once

#include <chrono>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "engine/engine.h"

namespace hablar::server {

struct ServingModel;

class LiveTimings {
 public:
  LiveTimings(uint64_t request_id, int32_t n_prompt);
  // A generated token of this request reached the stream.
  void on_token(const ServingModel& m);
  bool started() const { return so_far_.n_generated > 0; }
  // The timings so far.
  nlohmann::json now() const;
  // The timings a prompt_progress report ({total, cache, processed, time_ms}) stands for:
  // the prompt computed so far, nothing generated yet.
  static nlohmann::json of_progress(const nlohmann::json& progress);

 private:
  using Clock = std::chrono::steady_clock;
  uint64_t id_;
  Clock::time_point start_;
  Clock::time_point first_token_;
  engine::StreamItem so_far_;  // counts, and prompt_ms once the first token came
};

}  // namespace hablar::server
