// Timings of a stream while it runs (live_timings.h).
#include "server/live_timings.h"

#include "server/serving_model.h"

namespace hablar::server {
namespace {

double ms_between(std::chrono::steady_clock::time_point a,
                  std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

LiveTimings::LiveTimings(uint64_t request_id, int32_t n_prompt)
    : id_(request_id), start_(Clock::now()) {
  so_far_.n_prompt = n_prompt;
}

void LiveTimings::on_token(const ServingModel& m) {
  if (so_far_.n_generated == 0) {
    first_token_ = Clock::now();
    so_far_.prompt_ms = ms_between(start_, first_token_);
    if (const auto slot = slot_of(m, id_)) so_far_.n_cached_prompt = slot->n_cached_prompt;
  }
  so_far_.n_generated += 1;
}

nlohmann::json LiveTimings::now() const {
  engine::StreamItem t = so_far_;
  t.decode_ms = started() ? ms_between(first_token_, Clock::now()) : 0;
  return timings_json(t);
}

nlohmann::json LiveTimings::of_progress(const nlohmann::json& progress) {
  engine::StreamItem t;
  t.n_cached_prompt = progress.value("cache", 0);
  t.n_prompt = std::max(progress.value("processed", 0), t.n_cached_prompt);
  t.prompt_ms = t.n_prompt > t.n_cached_prompt ? progress.value("time_ms", 0.0) : 0.0;
  return timings_json(t);
}

}  // namespace hablar::server
