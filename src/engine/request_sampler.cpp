#include "engine/request_sampler.h"

#include <algorithm>

namespace hablar::engine {

int32_t ParamsSampler::sample(std::span<float> logits, std::span<const int32_t> history) {
  // The sequence's tokens may have lost their tail since the last call (drafts a speculative
  // step rejected, replaced by what was sampled): the penalties' history follows it back to
  // the common prefix first.
  size_t common = std::min(history.size(), accepted_);
  const std::vector<int32_t>& seen = sampler_.history();
  while (common > 0 && (common > seen.size() || seen[common - 1] != history[common - 1])) --common;
  sampler_.rewind_history(common);
  sampler_.accept(history.subspan(common));
  accepted_ = history.size();
  SampleResult r = sampler_.sample(logits);
  if (post_log_) post_log_->record(history.size(), {r.token, r.post_prob, std::move(r.post_top)});
  return r.token;
}

void ParamsSampler::report_post_sampling(std::shared_ptr<PostSamplingLog> log, int n) {
  post_log_ = std::move(log);
  sampler_.keep_candidates(post_log_ ? n : 0);
}

void PostSamplingLog::record(size_t position, Entry e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!first_) first_ = position;
  if (position < *first_) return;
  entries_[position - *first_] = std::move(e);
}

std::optional<PostSamplingLog::Entry> PostSamplingLog::take(size_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(index);
  if (it == entries_.end()) return std::nullopt;
  Entry e = std::move(it->second);
  entries_.erase(it);
  return e;
}

bool ParamsSampler::device_params(std::span<const int32_t> history, DeviceSampling& out) {
  const SamplingParams& p = sampler_.params();
  if (!p.logit_bias.empty() || p.typical_p < 1.0f) return false;
  const bool greedy = p.temperature <= 0.0f;
  // Stages the device chain does not have: the host samples (greedy decoding skips them).
  if (!greedy && (p.top_n_sigma > 0.0f || (p.xtc_probability > 0.0f && p.xtc_threshold <= 0.5f)))
    return false;
  if (p.dry.on()) return false;  // DRY changes the logits even for greedy decoding
  if (!greedy && p.mirostat > 0) return false;
  const bool penalties =
      p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  size_t window = 0;
  if (penalties && p.repeat_last_n != 0)
    window =
        p.repeat_last_n < 0 ? history.size() : std::min(history.size(), (size_t)p.repeat_last_n);
  if (window > (size_t)kMaxDeviceHistory) return false;
  out.temperature = greedy ? 0.0f : p.temperature;
  out.top_k = p.top_k;
  out.top_p = p.top_p;
  out.min_p = p.min_p;
  out.temperature_last = true;
  out.repetition_penalty = p.repeat_penalty;
  out.presence_penalty = p.presence_penalty;
  out.frequency_penalty = p.frequency_penalty;
  out.seed = p.seed;
  out.history = history.subspan(history.size() - window);
  return true;
}

// Penalties read the history (a window of none reads nothing); the rest of the device chain
// does not.
bool ParamsSampler::reads_history() const {
  const SamplingParams& p = sampler_.params();
  const bool penalties =
      p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  return penalties && p.repeat_last_n != 0;
}

}  // namespace hablar::engine
