// Drafters for speculative decoding: each proposes the next few tokens of a sequence cheaply;
// the engine then verifies them with the target model in one chunk (speculation.h).
//
//   ngram  prompt lookup: the last n tokens matched earlier in prompt + output, the tokens
//          that followed there proposed (no model; drafter_ngram.cpp)
//   draft  a smaller model with the same vocabulary, greedy, on its own KV cache
//   self   the target's own weights with some layers skipped (a view, no copy), greedy,
//          on its own KV cache (both: drafter_model.cpp)
//
// Every drafter drafts greedily: its proposal is a point mass q = delta(x). Verification
// then samples the target's token from its full sampling chain and accepts the draft when
// the two agree: rejection sampling for a point-mass q (accept x with probability p(x); on a
// rejection the emitted token is distributed as p with x removed, renormalized), so the
// output distribution is exactly the target sampler's (and with the same seed, the same
// tokens as without speculation).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/sequence.h"

namespace hablar::engine {

enum class SpecType : uint8_t { kNone, kNgram, kDraft, kSelf };
// "none", "ngram" (also llama.cpp's "ngram-simple"), "draft" ("draft-simple"), "self";
// throws Error(kInvalidArgument) naming the accepted values for another name.
SpecType spec_type_from_name(const std::string& name);
const char* spec_type_name(SpecType type);

// How much to draft for one sequence (llama-server's --draft-max, --draft-min,
// --draft-p-min; per request speculative.n_max, .n_min, .p_min).
struct DraftParams {
  int32_t n_max = 16;     // the most tokens drafted per step (0: no speculation)
  int32_t n_min = 0;      // a shorter draft is dropped (not worth a verification)
  float p_min = 0.0f;     // a model drafter stops when its top token's probability is below
  void validate() const;  // Error(kInvalidArgument) naming the bad field
};

// One sequence to draft for in this step.
struct DraftJob {
  const Sequence* seq = nullptr;  // its committed tokens: prompt + generated
  int32_t n_max = 0;              // draft at most this many tokens
  float p_min = 0.0f;
  std::vector<int32_t> draft;  // out: the proposal (may be empty)
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual SpecType type() const = 0;
  // Fills each job's draft; one call per engine step for every sequence that drafts in it
  // (a model drafter batches them into one forward per drafted position).
  virtual void draft(std::span<DraftJob> jobs) = 0;
  // The sequence finished or was preempted: forget its state (a model drafter's KV).
  virtual void release(uint64_t seq_id) { (void)seq_id; }
  // Measured cost of drafting one more token position for a batch, in ms (0: free), for the
  // adaptive draft length.
  virtual double ms_per_position() const { return 0; }
};

}  // namespace hablar::engine
