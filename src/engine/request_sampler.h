// The engine's per-request sampler over SamplingParams (sampler.h): samples on the host from
// a logits row, or hands its parameters to an executor that samples on its device.
#pragma once

#include <memory>

#include "engine/engine.h"
#include "engine/sampler.h"

namespace hablar::engine {

// The most history tokens a device-sampled request's penalties may look at; a longer
// penalty window samples on the host.
inline constexpr int32_t kMaxDeviceHistory = 1024;

class ParamsSampler : public NextTokenSampler {
 public:
  // Throws Error(kInvalidArgument) for bad parameters (Sampler's checks).
  ParamsSampler(SamplingParams params, int32_t n_vocab) : sampler_(std::move(params), n_vocab) {}

  // Feeds the sampler the tokens it has not seen (the prompt first, then each generated
  // token) so that its penalties see the history, then samples.
  int32_t sample(std::span<float> logits, std::span<const int32_t> history) override;
  // Device sampling follows the same chain (filters, then temperature) when nothing
  // host-only is asked for (logit bias, typical-p, a penalty window over kMaxDeviceHistory).
  bool device_params(std::span<const int32_t> history, DeviceSampling& out) const override;

 private:
  Sampler sampler_;
  size_t accepted_ = 0;
};

}  // namespace hablar::engine
