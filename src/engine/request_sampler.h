// The engine's per-request sampler over SamplingParams (sampler.h): samples on the host from
// a logits row, or hands its parameters to an executor that samples on its device.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "engine/engine.h"
#include "engine/sampler.h"

namespace hablar::engine {

// The most history tokens a device-sampled request's penalties may look at; a longer
// penalty window samples on the host.
inline constexpr int32_t kMaxDeviceHistory = 1024;

// A request's post-chain distributions (Sampler::keep_candidates), one per generated token,
// for the server to report beside each token (llama-server's post_sampling_probs). Entries
// are indexed from the request's first sample: index i is the i-th generated token. A sample
// taken again at a position (a recomputed step) replaces the earlier one.
class PostSamplingLog {
 public:
  struct Entry {
    int32_t token = -1;
    float prob = 0.0f;  // of `token`
    std::vector<TokenProb> top;
  };
  void record(size_t position, Entry e);
  // The i-th generated token's entry, removed from the log; nullopt when none was recorded.
  std::optional<Entry> take(size_t index);

 private:
  std::mutex mu_;
  std::optional<size_t> first_;  // the history length at the first sample
  std::map<size_t, Entry> entries_;
};

class ParamsSampler : public NextTokenSampler {
 public:
  // Throws Error(kInvalidArgument) for bad parameters (Sampler's checks).
  ParamsSampler(SamplingParams params, int32_t n_vocab) : sampler_(std::move(params), n_vocab) {}

  // Feeds the sampler the tokens it has not seen (the prompt first, then each generated
  // token) so that its penalties see the history, then samples.
  int32_t sample(std::span<float> logits, std::span<const int32_t> history) override;
  // Device sampling follows the same chain (filters, then temperature) when nothing
  // host-only is asked for (logit bias, typical-p, a penalty window over kMaxDeviceHistory).
  bool device_params(std::span<const int32_t> history, DeviceSampling& out) override;
  bool samples_ahead() const override { return true; }
  bool reads_history() const override;
  // Records each sample's post-chain distribution (n candidates at most) into `log`.
  void report_post_sampling(std::shared_ptr<PostSamplingLog> log, int n);

 private:
  Sampler sampler_;
  size_t accepted_ = 0;
  std::shared_ptr<PostSamplingLog> post_log_;
};

}  // namespace hablar::engine
