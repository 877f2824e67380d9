#include "server/reasoning_budget.h"

#include <algorithm>
#include <array>

namespace hablar::server {

ReasoningBudgetSampler::ReasoningBudgetSampler(std::unique_ptr<engine::NextTokenSampler> inner,
                                               int32_t budget, std::vector<int32_t> open,
                                               std::vector<int32_t> close, bool started)
    : inner_(std::move(inner)),
      budget_(budget),
      open_(std::move(open)),
      close_(std::move(close)),
      inside_(started) {}

bool ReasoningBudgetSampler::ends_with(std::span<const int32_t> h,
                                       const std::vector<int32_t>& tag) {
  return !tag.empty() && h.size() >= tag.size() &&
         std::equal(tag.begin(), tag.end(), h.end() - (std::ptrdiff_t)tag.size());
}

// Walks the tokens generated since the last call. The first call sees only the prompt.
void ReasoningBudgetSampler::observe(std::span<const int32_t> history) {
  if (seen_ == 0) {
    seen_ = history.size();
    return;
  }
  for (size_t i = seen_; i < history.size(); ++i) {
    const auto h = history.first(i + 1);
    if (inside_) {
      if (ends_with(h, close_)) {
        inside_ = false;
        done_ = true;
      } else {
        ++spent_;
      }
    } else if (!done_ && ends_with(h, open_)) {
      inside_ = true;
      spent_ = 0;
    }
  }
  seen_ = history.size();
}

int32_t ReasoningBudgetSampler::sample(std::span<float> logits, std::span<const int32_t> history) {
  observe(history);
  if (inside_ && (spent_ >= budget_ || forced_ > 0) && forced_ < close_.size())
    return close_[forced_++];
  return inner_->sample(logits, history);
}

ReasoningTags reasoning_tags(std::string_view prompt) {
  // The blocks chat::parse_model_output knows.
  static constexpr std::array<std::pair<std::string_view, std::string_view>, 4> kTags = {{
      {"<think>", "</think>"},
      {"[THINK]", "[/THINK]"},
      {"<|START_THINKING|>", "<|END_THINKING|>"},
      {"<seed:think>", "</seed:think>"},
  }};
  while (!prompt.empty() && (prompt.back() == ' ' || prompt.back() == '\n' ||
                             prompt.back() == '\t' || prompt.back() == '\r'))
    prompt.remove_suffix(1);
  for (const auto& [open, close] : kTags)
    if (prompt.ends_with(open)) return {std::string(open), std::string(close)};
  return {"<think>", "</think>"};
}

std::unique_ptr<engine::NextTokenSampler> with_reasoning_budget(
    std::unique_ptr<engine::NextTokenSampler> inner, int32_t budget, bool started,
    const std::vector<int32_t>& open, const std::vector<int32_t>& close) {
  if (budget < 0 || close.empty()) return inner;
  return std::make_unique<ReasoningBudgetSampler>(std::move(inner), budget, open, close, started);
}

}  // namespace hablar::server
