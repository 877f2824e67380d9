// A test sampler shaped like a grammar's: greedy under a token mask that depends on the token
// before (so a step launched ahead must be given that token before its mask is computed), and
// refusing some device samples after the fact (as a grammar refuses a token that would leave
// its sentence unfinishable), which the host then never picks. The engine tests run it with
// steps launched ahead and one step at a time, on the fake executor and on the CUDA one.
#pragma once

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/executor.h"

namespace hablar::engine::test_sampling {

class PendingMaskSampler : public NextTokenSampler, public TokenMaskSource {
 public:
  struct Counts {  // (masks of several requests may be filled at once: atomics)
    std::atomic<int> host_samples = 0;      // positions sampled on the host (after a refusal)
    std::atomic<int> refused = 0;           // device samples refused
    std::atomic<int> masks_of_pending = 0;  // masks computed from a token the executor gave
  };
  PendingMaskSampler(std::shared_ptr<Counts> counts, bool ahead)
      : counts_(std::move(counts)), ahead_(ahead) {}

  static bool allowed(int32_t token, int32_t last) { return (token + last) % 3 != 0; }
  static bool refused(int32_t token) { return token % 7 == 0; }

  int32_t sample(std::span<float> logits, std::span<const int32_t> history) override {
    counts_->host_samples += 1;
    HABLAR_CHECK(!history.empty() && history.back() >= 0, "a host sample without its history");
    for (size_t t = 0; t < logits.size(); ++t)
      if (!allowed((int32_t)t, history.back()) || refused((int32_t)t))
        logits[t] = -std::numeric_limits<float>::infinity();
    return (int32_t)(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  bool device_params(std::span<const int32_t> history, DeviceSampling& out) override {
    last_ = history.back();  // kPendingToken when the step is launched ahead
    out.allowed = this;      // (greedy: DeviceSampling's defaults)
    return true;
  }
  void fill_allowed(std::span<uint32_t> words, int32_t pending) override {
    int32_t last = last_;
    if (last == kPendingToken) {
      HABLAR_CHECK(pending != kPendingToken, "a pending history's mask without its token");
      last = pending;
      counts_->masks_of_pending += 1;
    }
    for (int32_t t = 0; t < (int32_t)words.size() * 32; ++t)
      if (allowed(t, last)) words[(size_t)t / 32] |= 1u << (t % 32);
  }
  bool keeps_device_sample(int32_t token, std::span<const int32_t>) override {
    counts_->refused += refused(token) ? 1 : 0;
    return !refused(token);
  }
  bool samples_ahead() const override { return ahead_; }
  bool reads_history() const override { return false; }

 private:
  std::shared_ptr<Counts> counts_;  // outlives the request (the engine drops its sampler)
  bool ahead_;
  int32_t last_ = kPendingToken;
};

// Whether `out` (generated after `prompt`) keeps the sampler's rules at every token.
inline bool keeps_pending_mask_rules(const std::vector<int32_t>& prompt,
                                     const std::vector<int32_t>& out) {
  int32_t last = prompt.back();
  for (int32_t t : out) {
    if (!PendingMaskSampler::allowed(t, last) || PendingMaskSampler::refused(t)) return false;
    last = t;
  }
  return true;
}

}  // namespace hablar::engine::test_sampling
