// Speculative decoding in the engine: which decoding sequences draft this step and how many
// tokens, and what a verification round tells about a sequence's acceptance rate.
//
// A step's verification chunk for a sequence is [last committed token, d_0 .. d_{k-1}] with
// a logits row for every token (ExecChunk::all_logits): row i is the target's distribution
// after d_{i-1}. The engine samples row 0, 1, ... with the request's own sampler (its whole
// chain: bias, penalties, grammar mask, temperature, top-k/p, min-p) and keeps going while
// the sampled token equals the draft (drafter.h: point-mass rejection sampling), so a round
// emits the accepted prefix plus one corrected or bonus token. Rejected positions are then
// rolled back (BlockManager::truncate); their K/V is garbage past the sequence's end that the
// next step overwrites, and no prefix hash ever covers them.
//
// The cost model must know what a plain decode step costs: the first two steps with decoders
// (while it has seen no decode-only step) and then one step in kPlainEvery draft nothing;
// until the costs are known, drafts have their full length.
// Draft length: with per-token acceptance rate a, k drafted tokens yield
// E(k) = 1 + a + ... + a^k tokens per round. The step's cost with k per drafting sequence is
// priced by the engine's measured step costs (StepCostModel: the decodes, plus S*k
// verification tokens) plus the drafter's own per-position cost; the k with the most tokens
// per ms is taken, and k = 0 (no speculation) wins whenever the extra rows cost more than
// they return (a batch that is already compute-bound).
// The rate is a slow estimate (a few rejections at the start of an answer keep it low for
// tens of rounds), while acceptance comes in runs: text copied from the prompt is accepted
// whole for long stretches. So where speculation pays at all (k > 0), a sequence whose last
// round was accepted whole drafts up to twice that round's length, doubling while the runs
// last (1, 2, 4, 8, 16 in five rounds); the first rejection returns it to the model's k.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/drafter.h"
#include "engine/sequence.h"
#include "engine/step_cost.h"

namespace hablar::engine {

// One sequence's speculation record.
struct SpecStats {
  int64_t drafted = 0;   // tokens proposed and verified
  int64_t accepted = 0;  // of those, accepted
  // Exponentially weighted acceptance trials: each drafted token up to and including the
  // first rejected one is a trial; `hits` the accepted ones.
  double hits = 0, trials = 0;
  // The length of the last round when every drafted token was accepted (else 0): the next
  // round may draft twice as many (Speculation::propose).
  int32_t full_round = 0;
  // The per-token acceptance rate: `prior` weighs as two trials (before any trial it is the
  // rate, e.g. the drafter's over every sequence so far).
  double rate(double prior = 0.5) const { return (hits + 2.0 * prior) / (trials + 2.0); }
  void record(int32_t n_drafted, int32_t n_accepted);
};

// Expected tokens one verification round emits with k drafts at acceptance rate a.
double expected_tokens(double a, int32_t k);

struct SpecCandidate {
  Sequence* seq = nullptr;  // decoding: one pending token
  DraftParams params;
  const SpecStats* stats = nullptr;
};

class Speculation {
 public:
  // `adaptive` false: every candidate drafts its n_max each step (tests that must exercise
  // verification whatever the costs say).
  explicit Speculation(std::shared_ptr<Drafter> drafter, bool adaptive = true)
      : drafter_(std::move(drafter)), adaptive_(adaptive) {}
  bool enabled() const { return drafter_ != nullptr; }
  Drafter* drafter() const { return drafter_.get(); }

  // Chooses each candidate's draft length (0 for some or all when speculation does not pay
  // at this batch), asks the drafter, and sets seq->draft (drafts shorter than n_min are
  // dropped). `decoders`: every decoding sequence of the step, drafting or not.
  void propose(std::span<SpecCandidate> cands, int32_t decoders, const StepCostModel& costs);
  // A verification round's outcome, for the drafter-wide acceptance rate.
  void record(int32_t n_drafted, int32_t n_accepted) { all_.record(n_drafted, n_accepted); }

  // The common draft length for this step (before each candidate's own n_max).
  int32_t choose_length(std::span<const SpecCandidate> cands, int32_t decoders,
                        const StepCostModel& costs) const;

 private:
  std::shared_ptr<Drafter> drafter_;
  bool adaptive_ = true;
  std::vector<DraftJob> jobs_;
  SpecStats all_;          // every sequence's rounds: the prior of a new sequence's rate
  int64_t n_planned_ = 0;  // steps planned with candidates
  // Every this many steps one runs without drafts, so that the step cost model keeps
  // measuring plain decode steps (what speculation is priced against).
  static constexpr int64_t kPlainEvery = 32;
  // ... and while the model chooses no drafts, every this many steps a short draft probes.
  static constexpr int64_t kProbeEvery = 16;
};

}  // namespace hablar::engine
