#include "engine/scheduler.h"

#include <algorithm>
#include <climits>

#include "core/error.h"

namespace hablar::engine {

namespace {

// Rank order: higher priority (lower value) first, then older first.
bool ranks_before(const Sequence* a, const Sequence* b) {
  if (a->priority != b->priority) return a->priority < b->priority;
  return a->arrival < b->arrival;
}

int32_t count_decoders(const std::vector<Sequence*>& running) {
  int32_t n = 0;
  for (const Sequence* s : running) n += s->n_pending() == 1 ? 1 : 0;
  return n;
}

// Sequences that have sampled a token and wait for the next one: the streams a step delays.
int32_t count_streams(const std::vector<Sequence*>& running) {
  int32_t n = 0;
  for (const Sequence* s : running) n += s->is_decoding() ? 1 : 0;
  return n;
}

// Drafted tokens the decoders carry this step (verified beside their pending token).
int32_t count_drafted(const std::vector<Sequence*>& running) {
  int32_t n = 0;
  for (const Sequence* s : running) n += s->n_pending() == 1 ? (int32_t)s->draft.size() : 0;
  return n;
}

}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config, BlockManager& blocks)
    : config_(config), blocks_(blocks) {
  if (config_.max_running < 1 || config_.max_step_tokens < config_.max_running ||
      config_.max_prefill_chunk < 1 || config_.max_step_tokens_decoding < 0 ||
      !(config_.max_step_ms >= 0) || !(config_.max_decode_slowdown >= 0) ||
      (config_.max_decode_slowdown > 0 && config_.max_decode_slowdown < 1) ||
      config_.min_step_prompt_tokens < 1)
    throw_error(ErrorKind::kInvalidArgument,
                "scheduler: need max_running >= 1, max_step_tokens >= max_running, "
                "max_prefill_chunk >= 1, max_step_tokens_decoding >= 0, max_step_ms >= 0, "
                "max_decode_slowdown 0 or >= 1 and min_step_prompt_tokens >= 1");
}

void Scheduler::add(Sequence* seq) {
  seq->status = SequenceStatus::kWaiting;
  // Keep the queue in rank order (a preempted sequence goes back to its place).
  waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), seq, ranks_before), seq);
}

void Scheduler::remove(Sequence* seq) {
  auto r = std::find(running_.begin(), running_.end(), seq);
  if (r != running_.end()) running_.erase(r);
  auto w = std::find(waiting_.begin(), waiting_.end(), seq);
  if (w != waiting_.end()) waiting_.erase(w);
  blocks_.free(*seq);
  seq->status = SequenceStatus::kFinished;
}

void Scheduler::restart(Sequence* seq) {
  auto r = std::find(running_.begin(), running_.end(), seq);
  if (r != running_.end()) running_.erase(r);
  blocks_.free(*seq);
  seq->draft.clear();
  if (std::find(waiting_.begin(), waiting_.end(), seq) == waiting_.end()) add(seq);
}

void Scheduler::insert_running(Sequence* seq) {
  seq->status = SequenceStatus::kRunning;
  running_.insert(std::upper_bound(running_.begin(), running_.end(), seq, ranks_before), seq);
}

void Scheduler::preempt(Sequence* seq, StepPlan& plan) {
  auto r = std::find(running_.begin(), running_.end(), seq);
  HABLAR_CHECK(r != running_.end(), "preempting a sequence that is not running");
  running_.erase(r);
  blocks_.free(*seq);
  seq->draft.clear();
  seq->n_preemptions += 1;
  add(seq);
  plan.preempted.push_back(seq);
}

// Every slot taken and a waiting request outranks (by priority alone, never by age) the
// lowest-ranked running one: that one makes room, as vLLM's priority scheduling does.
void Scheduler::preempt_for_priority(StepPlan& plan) {
  size_t next = 0;  // waiting_ index of the best request not yet given a slot
  while ((int32_t)running_.size() >= config_.max_running && next < waiting_.size()) {
    Sequence* want = waiting_[next];
    Sequence* worst = running_.back();
    if (want->priority >= worst->priority) break;
    preempt(worst, plan);  // re-enters waiting_ behind `want`
    ++next;
  }
}

// The time a step with `decoders` decodes may take (0: no time bound).
double Scheduler::step_target_ms(int32_t decoders) const {
  double target = config_.max_step_ms;
  if (config_.max_decode_slowdown > 0) {
    const double relative = config_.max_decode_slowdown * cost_->decode_ms(decoders);
    target = target > 0 ? std::min(target, relative) : relative;
  }
  return target;
}

int32_t Scheduler::step_budget(int32_t decoders) const {
  if (decoders == 0) return config_.max_step_tokens;
  const bool timed = config_.max_step_ms > 0 || config_.max_decode_slowdown > 0;
  if (timed && cost_ != nullptr && cost_->ready()) {
    const int32_t cap = config_.max_step_tokens - decoders;
    // The time left beside the decodes, but never less than the floor, nor than the chunk
    // that makes the fixed cost of a step with prompt tokens worth paying.
    const int32_t prompt =
        std::max({config_.min_step_prompt_tokens, cost_->efficient_prompt_tokens(cap),
                  cost_->prompt_tokens_within(step_target_ms(decoders), decoders, cap)});
    return std::min(config_.max_step_tokens, decoders + prompt);
  }
  if (config_.max_step_tokens_decoding == 0) return config_.max_step_tokens;
  return std::min(config_.max_step_tokens, std::max(config_.max_step_tokens_decoding, decoders));
}

// The sequences with a prompt to prefill: the running ones, and the waiting ones the free
// slots could take. In a wave (nobody decoding), a running prompt with only its last token
// left is one too (held back, or finishing with the others); otherwise that token is planned
// as a decode.
std::vector<Sequence*> Scheduler::prefill_candidates(bool wave) const {
  std::vector<Sequence*> cands;
  for (Sequence* s : running_)
    if (s->n_pending() > 1 || (wave && s->n_pending() == 1)) cands.push_back(s);
  const size_t free_slots = (size_t)std::max(0, config_.max_running - (int32_t)running_.size());
  for (size_t i = 0; i < waiting_.size() && i < free_slots; ++i) cands.push_back(waiting_[i]);
  return cands;
}

// Whether a wave holds its members' last tokens back this step: its members are alike (the
// most prompt tokens any has left at most twice the shortest member's prompt: a short chat is
// never held behind a long prompt, it goes first as without waves), more than one short step
// of prompt work is left (one token per member plus min_step_prompt_tokens), and the cache has
// room for every member's whole prompt (else holding could wait for room that never comes).
bool Scheduler::wave_holds(const std::vector<Sequence*>& cands) const {
  int64_t left = 0;
  int32_t blocks = 0, most_left = 0, shortest = INT32_MAX;
  for (const Sequence* s : cands) {
    left += s->n_pending();
    most_left = std::max(most_left, s->n_pending());
    shortest = std::min(shortest, (int32_t)s->tokens.size());
    blocks += blocks_.blocks_needed(*s, s->n_pending());
  }
  if (left - (int64_t)cands.size() <= config_.min_step_prompt_tokens) return false;
  if ((int64_t)most_left > 2 * (int64_t)shortest) return false;
  return blocks <= blocks_.n_free();
}

// Splits `budget` prompt tokens among the prefill candidates; in a wave that holds, each
// keeps its last token back. Returned in no particular order.
std::vector<Scheduler::Share> Scheduler::prefill_shares(int32_t budget, bool wave) const {
  const std::vector<Sequence*> cands = prefill_candidates(wave);
  if (cands.empty() || budget <= 0) return {};
  const int32_t hold = wave && wave_holds(cands) ? 1 : 0;
  auto room = [&](const Sequence* s) {
    return std::min(s->n_pending() - hold, config_.max_prefill_chunk);
  };
  std::vector<int32_t> n(cands.size(), 0);
  // The oldest of the best priority is guaranteed a quarter of the budget: it cannot be
  // starved by shorter prompts that keep arriving.
  size_t oldest = 0;
  for (size_t i = 1; i < cands.size(); ++i)
    if (ranks_before(cands[i], cands[oldest])) oldest = i;
  n[oldest] = std::max(0, std::min(room(cands[oldest]), std::max(1, budget / 4)));
  budget -= n[oldest];
  // The rest: priority, then fewest tokens left, then age.
  std::vector<size_t> order(cands.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Sequence* x = cands[a];
    const Sequence* y = cands[b];
    if (x->priority != y->priority) return x->priority < y->priority;
    if (x->n_pending() != y->n_pending()) return x->n_pending() < y->n_pending();
    return x->arrival < y->arrival;
  });
  for (size_t i : order) {
    if (budget <= 0) break;
    const int32_t more = std::min(room(cands[i]) - n[i], budget);
    n[i] += more;
    budget -= more;
  }
  std::vector<Share> shares;
  for (size_t i = 0; i < cands.size(); ++i)
    if (n[i] > 0) shares.push_back({cands[i], n[i]});
  return shares;
}

// Plans running_[index]; returns false when that sequence itself was preempted (or ran out
// of room), i.e. it left running_.
bool Scheduler::schedule_running(size_t index, const std::vector<Share>& shares, bool wave,
                                 StepPlan& plan) {
  Sequence* seq = running_[index];
  // A decoder's token, always planned (the budget counted it), and its drafted tokens.
  int32_t n = 1 + (int32_t)seq->draft.size();
  if (seq->n_pending() > 1 || wave) {  // in a wave, every running sequence is a prompt
    seq->draft.clear();
    n = 0;
    for (const Share& s : shares)
      if (s.seq == seq) n = s.n;
    if (n <= 0) return true;  // no share this step; keeps its place
  }
  // (One position more than the window reads: a step launched ahead may be taken back by a
  // refused sample, engine_step.cpp, and the position before it computed again.)
  if (config_.kv_window > 0) blocks_.release_before(*seq, seq->n_computed - config_.kv_window);
  while (!blocks_.allocate_slots(*seq, n, plan.copies)) {
    if (n > 1 && seq->n_pending() == 1) {  // no room to verify a draft: plain decode first
      seq->draft.clear();
      n = 1;
      continue;
    }
    Sequence* victim = running_.back();
    if (victim == seq) {
      if (running_.size() == 1) {  // nothing left to take room from
        running_.pop_back();
        plan.out_of_room.push_back(seq);
        return false;
      }
      preempt(seq, plan);
      return false;
    }
    preempt(victim, plan);
  }
  plan.chunks.push_back({seq, seq->n_computed, n});
  return true;
}

void Scheduler::admit_waiting(const std::vector<Share>& shares, StepPlan& plan) {
  size_t i = 0;
  while (i < waiting_.size() && (int32_t)running_.size() < config_.max_running) {
    Sequence* seq = waiting_[i];
    int32_t share = 0;
    for (const Share& s : shares)
      if (s.seq == seq) share = s.n;
    // Sequences preempted in this very step wait for the next one; so do those the
    // budget had no tokens for (they keep their place).
    if (share <= 0 ||
        std::find(plan.preempted.begin(), plan.preempted.end(), seq) != plan.preempted.end()) {
      ++i;
      continue;
    }
    if (seq->block_table.empty() && !seq->prompt_logits && seq->reuse_prefix)
      seq->n_cached_prompt =
          std::max(seq->n_cached_prompt, std::min(blocks_.match_prefix(*seq), seq->n_prompt));
    const int32_t n = std::min(seq->n_pending(), share);
    if (!blocks_.allocate_slots(*seq, n, plan.copies)) {
      blocks_.free(*seq);  // give back the prefix blocks it took; they stay cached
      if (running_.empty() && plan.chunks.empty()) {
        // Alone in an empty cache and still no room: it can never run.
        waiting_.erase(waiting_.begin() + (std::ptrdiff_t)i);
        plan.out_of_room.push_back(seq);
        continue;
      }
      break;  // in rank order: wait for room rather than let later ones take it
    }
    waiting_.erase(waiting_.begin() + (std::ptrdiff_t)i);
    insert_running(seq);
    plan.chunks.push_back({seq, seq->n_computed, n});
  }
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  preempt_for_priority(plan);
  // A wave while no stream decodes: the prompts whose last token is left are not decoders
  // then, and the step gets the full width.
  const bool wave = config_.wave_prefill && count_streams(running_) == 0;
  const int32_t decoders = wave ? 0 : count_decoders(running_);
  const std::vector<Share> shares =
      prefill_shares(step_budget(decoders) - decoders - count_drafted(running_), wave);
  // Walk in rank order; preemption removes from the back (lowest rank), which is never a
  // sequence already planned in this loop.
  for (size_t i = 0; i < running_.size();) {
    const size_t before = running_.size();
    if (schedule_running(i, shares, wave, plan)) {
      ++i;
    } else {
      HABLAR_CHECK(running_.size() < before, "scheduler made no progress");
    }
  }
  admit_waiting(shares, plan);
  return plan;
}

}  // namespace hablar::engine
