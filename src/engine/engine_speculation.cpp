// The engine's side of speculative decoding (speculation.h): drafting before a step is
// planned, and verifying a drafted chunk's rows after it ran.
#include <algorithm>

#include "core/error.h"
#include "engine/engine.h"

namespace hablar::engine {

void Engine::plan_drafts() {
  for (Sequence* s : scheduler_.running()) s->draft.clear();
  if (!spec_.enabled()) return;
  std::vector<SpecCandidate> cands;
  int32_t decoders = 0;
  for (Sequence* s : scheduler_.running()) {
    if (s->n_pending() != 1 || s->n_generated() == 0) continue;
    decoders += 1;
    Active& a = *active_.at(s);
    DraftParams p = a.draft;
    // The round's last token is the target's own: drafts never pass max_tokens (which the
    // context already bounds).
    p.n_max = std::min(p.n_max, s->max_tokens - s->n_generated() - 1);
    if (p.n_max <= 0 || a.handle->cancelled()) continue;
    cands.push_back({s, p, &a.spec});
  }
  if (!cands.empty()) spec_.propose(cands, decoders, costs_);
}

// Row i of `rows` is the target's distribution after the pending token and draft[0, i). Each
// row is sampled with the request's sampler over the history so far (the accepted draft
// tokens included), and the round goes on while the sample equals the draft: the emitted
// tokens are those plain decoding would have sampled, one row each.
void Engine::verify_and_emit(Active& a, int32_t start_pos, int32_t n_tokens, float* rows) {
  Sequence& seq = *a.seq;
  const std::vector<int32_t> draft = std::move(seq.draft);
  seq.draft.clear();
  const int32_t k = (int32_t)draft.size();
  HABLAR_CHECK(n_tokens == k + 1 && start_pos == (int32_t)seq.tokens.size() - 1,
               "verification chunk does not match its draft");
  const size_t n_vocab = (size_t)executor_.n_vocab();
  std::vector<int32_t> history(a.history().begin(), a.history().end());
  std::vector<std::pair<int32_t, StreamItem>> out;
  int32_t accepted = 0;
  for (int32_t i = 0; i <= k; ++i) {
    StreamItem item;
    const int32_t token = choose_token(a, rows + (size_t)i * n_vocab, history, item);
    out.emplace_back(token, std::move(item));
    if (i == k || token != draft[(size_t)i]) break;
    accepted += 1;
    history.push_back(token);
  }
  a.spec.record(k, accepted);
  spec_.record(k, accepted);
  metrics_.update([&](MetricsSnapshot& m) {
    m.draft_tokens_total += (uint64_t)k;
    m.draft_accepted_total += (uint64_t)accepted;
    m.spec_rounds_total += 1;
  });
  // K/V is right for the pending token and the accepted draft tokens; the rest is rolled
  // back before anything can hash it.
  blocks_.truncate(seq, start_pos + 1 + accepted);
  for (auto& [token, item] : out)
    if (emit_token(a, token, std::move(item))) return;  // finished: `a` is gone
  blocks_.register_full_blocks(seq);
}

}  // namespace hablar::engine
