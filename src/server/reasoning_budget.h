// A thinking budget (llama-server's reasoning budget; Anthropic's thinking.budget_tokens):
// once a reply has spent `budget` tokens inside its reasoning block, the block's closing tag
// is forced, token by token, and the reply goes on as content.
//
// It wraps the request's own sampler. Inside the block (from the start when the prompt
// opened it, else from the model's own opening tag) it counts generated tokens; the tags are
// recognized by their token ids at the end of the history. While the closing tag is forced
// the inner sampler is not asked (its penalty history still sees the forced tokens, as
// ParamsSampler catches up on the history at its next call). Host sampling only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"

namespace hablar::server {

class ReasoningBudgetSampler : public engine::NextTokenSampler {
 public:
  // open/close: the tags' token ids (not empty); `started`: the prompt ends inside the block.
  ReasoningBudgetSampler(std::unique_ptr<engine::NextTokenSampler> inner, int32_t budget,
                         std::vector<int32_t> open, std::vector<int32_t> close, bool started);
  int32_t sample(std::span<float> logits, std::span<const int32_t> history) override;

  // The state after the tokens seen so far, for tests.
  bool inside() const { return inside_; }
  int32_t spent() const { return spent_; }

 private:
  void observe(std::span<const int32_t> history);
  static bool ends_with(std::span<const int32_t> h, const std::vector<int32_t>& tag);

  std::unique_ptr<engine::NextTokenSampler> inner_;
  int32_t budget_;
  std::vector<int32_t> open_, close_;
  bool inside_;
  bool done_ = false;  // the block was closed: the budget is over
  int32_t spent_ = 0;  // tokens generated inside the block
  size_t seen_ = 0;    // history tokens observed (0: no call yet; the prompt is skipped)
  size_t forced_ = 0;  // closing-tag tokens forced so far
};

struct ReasoningTags {
  std::string open, close;
};
// The tags of the reasoning block a rendered prompt opens, else <think> / </think>.
ReasoningTags reasoning_tags(std::string_view prompt);

// The budget sampler over `inner`, or `inner` unchanged when budget < 0 (no budget).
std::unique_ptr<engine::NextTokenSampler> with_reasoning_budget(
    std::unique_ptr<engine::NextTokenSampler> inner, int32_t budget, bool started,
    const std::vector<int32_t>& open, const std::vector<int32_t>& close);

}  // namespace hablar::server
