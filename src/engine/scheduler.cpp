#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace hablar::engine {

Scheduler::Scheduler(const SchedulerConfig& config, BlockManager& blocks)
    : config_(config), blocks_(blocks) {
  if (config_.max_running < 1 || config_.max_step_tokens < config_.max_running ||
      config_.max_prefill_chunk < 1 || config_.max_step_tokens_decoding < 0)
    throw_error(ErrorKind::kInvalidArgument,
                "scheduler: need max_running >= 1, max_step_tokens >= max_running, "
                "max_prefill_chunk >= 1 and max_step_tokens_decoding >= 0");
}

void Scheduler::add(Sequence* seq) {
  seq->status = SequenceStatus::kWaiting;
  // Keep the queue in arrival order (a preempted sequence goes back to its place).
  auto pos = std::upper_bound(
      waiting_.begin(), waiting_.end(), seq,
      [](const Sequence* a, const Sequence* b) { return a->arrival < b->arrival; });
  waiting_.insert(pos, seq);
}

void Scheduler::remove(Sequence* seq) {
  auto r = std::find(running_.begin(), running_.end(), seq);
  if (r != running_.end()) running_.erase(r);
  auto w = std::find(waiting_.begin(), waiting_.end(), seq);
  if (w != waiting_.end()) waiting_.erase(w);
  blocks_.free(*seq);
  seq->status = SequenceStatus::kFinished;
}

void Scheduler::insert_running(Sequence* seq) {
  seq->status = SequenceStatus::kRunning;
  auto pos = std::upper_bound(
      running_.begin(), running_.end(), seq,
      [](const Sequence* a, const Sequence* b) { return a->arrival < b->arrival; });
  running_.insert(pos, seq);
}

void Scheduler::preempt(Sequence* seq, StepPlan& plan) {
  auto r = std::find(running_.begin(), running_.end(), seq);
  HABLAR_CHECK(r != running_.end(), "preempting a sequence that is not running");
  running_.erase(r);
  blocks_.free(*seq);
  seq->n_preemptions += 1;
  add(seq);
  plan.preempted.push_back(seq);
}

// Plans running_[index]; returns false when that sequence itself was preempted (or ran out
// of room), i.e. it left running_.
bool Scheduler::schedule_running(size_t index, int32_t& budget, int32_t decoders_left,
                                 StepPlan& plan) {
  Sequence* seq = running_[index];
  const int32_t pending = seq->n_pending();
  int32_t n = 1;
  if (pending > 1) {
    const int32_t reserve = decoders_left;  // younger decoders keep one token each
    n = std::min({pending, config_.max_prefill_chunk, budget - reserve});
    if (n <= 0) return true;  // no budget this step; keeps its place
  } else if (budget <= 0) {
    return true;
  }
  while (!blocks_.allocate_slots(*seq, n, plan.copies)) {
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
  budget -= n;
  return true;
}

void Scheduler::admit_waiting(int32_t& budget, StepPlan& plan) {
  while (!waiting_.empty() && budget > 0 && (int32_t)running_.size() < config_.max_running) {
    Sequence* seq = waiting_.front();
    // Sequences preempted in this very step wait for the next one.
    if (std::find(plan.preempted.begin(), plan.preempted.end(), seq) != plan.preempted.end()) break;
    if (seq->block_table.empty() && !seq->prompt_logits)
      seq->n_cached_prompt =
          std::max(seq->n_cached_prompt, std::min(blocks_.match_prefix(*seq), seq->n_prompt));
    const int32_t n = std::min({seq->n_pending(), config_.max_prefill_chunk, budget});
    if (!blocks_.allocate_slots(*seq, n, plan.copies)) {
      blocks_.free(*seq);  // give back the prefix blocks it took; they stay cached
      if (running_.empty() && plan.chunks.empty()) {
        // Alone in an empty cache and still no room: it can never run.
        waiting_.pop_front();
        plan.out_of_room.push_back(seq);
        continue;
      }
      break;  // first come first served: wait for room
    }
    waiting_.pop_front();
    insert_running(seq);
    plan.chunks.push_back({seq, seq->n_computed, n});
    budget -= n;
  }
}

int32_t Scheduler::step_budget() const {
  if (config_.max_step_tokens_decoding == 0) return config_.max_step_tokens;
  int32_t decoders = 0;
  for (const Sequence* s : running_) decoders += s->n_pending() == 1 ? 1 : 0;
  if (decoders == 0) return config_.max_step_tokens;
  return std::min(config_.max_step_tokens, std::max(config_.max_step_tokens_decoding, decoders));
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int32_t budget = step_budget();
  // Walk oldest first; preemption removes from the back (newest), which is never a
  // sequence already planned in this loop.
  for (size_t i = 0; i < running_.size();) {
    int32_t decoders_behind = 0;
    for (size_t j = i + 1; j < running_.size(); ++j)
      decoders_behind += running_[j]->n_pending() == 1 ? 1 : 0;
    const size_t before = running_.size();
    if (schedule_running(i, budget, decoders_behind, plan)) {
      ++i;
    } else {
      HABLAR_CHECK(running_.size() < before, "scheduler made no progress");
    }
  }
  admit_waiting(budget, plan);
  return plan;
}

}  // namespace hablar::engine
