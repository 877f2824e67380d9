#include "engine/speculation.h"

#include <algorithm>
#include <cmath>

#include "core/log.h"

namespace hablar::engine {

void SpecStats::record(int32_t n_drafted, int32_t n_accepted) {
  drafted += n_drafted;
  accepted += n_accepted;
  full_round = n_drafted > 0 && n_accepted == n_drafted ? n_drafted : 0;
  // Trials: the accepted tokens, plus the rejected one when the round stopped early.
  const double n_trials = n_accepted + (n_accepted < n_drafted ? 1 : 0);
  constexpr double kDecay = 0.9;  // per round: the rate follows the text (~10 rounds)
  hits = kDecay * hits + n_accepted;
  trials = kDecay * trials + n_trials;
}

double expected_tokens(double a, int32_t k) {
  double sum = 0, term = 1;
  for (int32_t i = 0; i <= k; ++i, term *= a) sum += term;
  return sum;
}

int32_t Speculation::choose_length(std::span<const SpecCandidate> cands, int32_t decoders,
                                   const StepCostModel& costs) const {
  int32_t k_max = 0;
  for (const SpecCandidate& c : cands) k_max = std::max(k_max, c.params.n_max);
  if (k_max == 0 || cands.empty()) return 0;
  // Nothing measured yet (or no plain decode step seen): draft fully, learn from it.
  if (!costs.ready() || !(costs.decode_ms(decoders) > 0)) return k_max;
  const double prior = all_.rate();
  const double draft_ms = drafter_->ms_per_position();
  const int32_t plain = decoders - (int32_t)cands.size();
  double best_rate = 0;
  int32_t best_k = 0;
  for (int32_t k = 0; k <= k_max; ++k) {
    double tokens = plain;
    int32_t verify = 0;
    for (const SpecCandidate& c : cands) {
      const int32_t kc = std::min(k, c.params.n_max);
      tokens += expected_tokens(c.stats->rate(prior), kc);
      verify += kc;
    }
    const double ms = costs.predict_ms(0, decoders, verify) + draft_ms * k;
    if (!(ms > 0)) return 0;
    const double rate = tokens / ms;
    // A longer draft must pay for itself clearly (1%): ties keep the cheaper step.
    if (rate > best_rate * 1.01) {
      best_rate = rate;
      best_k = k;
    }
  }
  return best_k;
}

void Speculation::propose(std::span<SpecCandidate> cands, int32_t decoders,
                          const StepCostModel& costs) {
  if (!drafter_) return;
  // Plain steps: the first two with decoders while no decode-only step was measured (a
  // single stream then teaches the cost model its decode line at once), and one in
  // kPlainEvery (keeps it measured).
  n_planned_ += 1;
  if (adaptive_ &&
      ((costs.n_decode_only() < 2 && n_planned_ <= 2) || n_planned_ % kPlainEvery == 0))
    return;
  int32_t k = adaptive_ ? choose_length(cands, decoders, costs) : 0;
  if (!adaptive_)
    for (const SpecCandidate& c : cands) k = std::max(k, c.params.n_max);
  // A probe now and then when the model says no: the price of verification rows is only
  // learned from steps that have them (a short warm-up prompt may have priced them as whole
  // steps), and acceptance only from drafts.
  if (k == 0 && n_planned_ % kProbeEvery == 1)
    for (const SpecCandidate& c : cands) k = std::max(k, std::min(c.params.n_max, 4));
  log::debug(
      "speculation: k = {} for {} of {} decoders (rate {:.2f}; step {:.1f} ms + {:.2f} ms "
      "per extra row)",
      k, cands.size(), decoders, cands.empty() ? 0.0 : cands[0].stats->rate(all_.rate()),
      costs.decode_ms(decoders), costs.per_verify_ms(std::max(1, k)));
  if (k == 0) return;
  jobs_.clear();
  for (const SpecCandidate& c : cands) {
    int32_t n = std::min(k, c.params.n_max);
    if (adaptive_ && n > 0 && c.stats->full_round > 0)  // a run of acceptances: grow
      n = std::max(n, std::min(2 * c.stats->full_round, c.params.n_max));
    if (n <= 0 || n < c.params.n_min) continue;
    jobs_.push_back({c.seq, n, c.params.p_min, {}});
  }
  if (jobs_.empty()) return;
  drafter_->draft(jobs_);
  size_t j = 0;
  for (const SpecCandidate& c : cands) {
    if (j == jobs_.size() || jobs_[j].seq != c.seq) continue;
    DraftJob& job = jobs_[j++];
    if ((int32_t)job.draft.size() > job.n_max) job.draft.resize((size_t)job.n_max);
    if ((int32_t)job.draft.size() < std::max(1, c.params.n_min)) continue;
    c.seq->draft = std::move(job.draft);
  }
}

}  // namespace hablar::engine
