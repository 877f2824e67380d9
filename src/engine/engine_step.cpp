// One turn of the step loop (Engine::step): plan a step, launch it, collect what the step
// before it computed.
//
// Stepping ahead. An executor that feeds a step's pending tokens from the samples of the step
// before it on its own device (StepExecutor::feeds_tokens) lets the engine launch step N + 1
// before step N's tokens reach the host: the host's work between two steps (emitting N's
// tokens, planning and staging N + 1) then overlaps the device's work instead of leaving the
// device idle. What it takes:
//  - Launching a step advances its plain chunks at once: n_computed covers them, and a chunk
//    that samples appends a placeholder (kPendingToken) to its sequence's tokens
//    (Active::n_ahead counts them). Collecting resolves each placeholder, oldest first, with
//    the sampled token and emits it (stop checks, text) as before.
//  - A chunk of N + 1 that reads a placeholder is fed (ExecChunk::feed) when it is a plain
//    decode of it whose sampler takes a pending token (NextTokenSampler::samples_ahead:
//    penalties whose history ends in the placeholder, which the executor fills in as well; a
//    grammar's mask, which the executor asks for once N's sample is on the host, while N + 1's
//    forward runs). Where one is not, N is collected before N + 1 launches, as without
//    stepping ahead, and N + 1's chunks of requests that ended meanwhile are dropped.
//  - A step stays in flight only when every chunk is plain: host-sampled rows, logits of
//    every token and draft verification are handled when their step is collected, before
//    anything else is planned.
//  - A device sample the request's sampler refuses when collected (a grammar's token that
//    would leave its sentence unfinishable within max_tokens) takes back the sequence's
//    placeholders: its last known position is computed again and sampled on the host, and a
//    step launched on the refused token meanwhile is void for that sequence (its chunk's
//    output is dropped when collected; its cache writes are overwritten by the recomputation).
//  - A request that ends while a launched step still computes its next token never emits
//    that token; its Active outlives the step (retired_) and its blocks are freed at once (the
//    device runs steps in launch order, so a later step's writes to them come after).
// No token depends on this: each is sampled from the logits it had before.
#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "engine/engine.h"

namespace hablar::engine {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

bool Engine::reads_pending(const ScheduledChunk& c) const {
  const Active& a = *active_.at(c.seq);
  return a.n_ahead > 0 && c.start_pos + c.n_tokens > (int32_t)c.seq->tokens.size() - a.n_ahead;
}

// A decode of the pending token alone, sampled on the device from parameters that read no
// history, with room for the token after it (no context shift can come between).
bool Engine::can_feed(const ScheduledChunk& c) const {
  const Active& a = *active_.at(c.seq);
  const Sequence& s = *c.seq;
  return executor_.feeds_tokens() && executor_.samples_on_device() && in_flight_ &&
         a.last_step == in_flight_->serial && a.n_ahead == 1 && c.n_tokens == 1 &&
         c.start_pos == (int32_t)s.tokens.size() - 1 && s.draft.empty() && s.max_tokens > 0 &&
         logprobs_on_device(a) && !a.sample_on_host &&
         (!a.request.sampler ||
          (a.request.sampler->samples_ahead() &&
           // A context shift's full history does not hold the placeholder (emit_token
           // appends to it): penalties reading it would miss the pending token.
           (a.full_history.empty() || !a.request.sampler->reads_history()))) &&
         (int32_t)s.tokens.size() < context_capacity();
}

void Engine::drop_stale_chunks(StepPlan& plan) {
  std::erase_if(plan.chunks, [&](const ScheduledChunk& c) {
    auto it = active_.find(c.seq);
    if (it == active_.end() || c.seq->status != SequenceStatus::kRunning ||
        c.seq->n_computed != c.start_pos)
      return true;
    // Its pending token is its last one: nothing after it is wanted.
    return it->second->n_ahead > 0 && c.seq->n_generated() >= c.seq->max_tokens;
  });
}

void Engine::step() {
  const auto t0 = Clock::now();
  const double t0_ms = now_ms();
  plan_drafts();
  StepPlan plan = scheduler_.schedule();
  bool collect_first = in_flight_ && !plan.out_of_room.empty();
  for (const ScheduledChunk& c : plan.chunks)
    collect_first = collect_first || (reads_pending(c) && !can_feed(c));
  if (collect_first) collect();
  for (Sequence* seq : plan.out_of_room)
    if (active_.count(seq) && seq->status != SequenceStatus::kFinished)
      finish(*active_.at(seq), FinishReason::kLength);
  drop_stale_chunks(plan);
  if (plan.chunks.empty()) {
    if (in_flight_) collect();
    publish_state(&plan, 0, 0, 0);
    return;
  }
  launch(std::move(plan), t0, t0_ms);
}

void Engine::launch(StepPlan plan, Clock::time_point begun, double begun_ms) {
  LaunchedStep step;
  step.serial = n_launched_ + 1;
  step.begun = begun, step.begun_ms = begun_ms;
  std::vector<ExecChunk> chunks;
  chunks.reserve(plan.chunks.size());
  sampling_.resize(plan.chunks.size());
  row_targets_.resize(plan.chunks.size());
  bool all_plain = true;
  for (const ScheduledChunk& c : plan.chunks) {
    const Sequence& s = *c.seq;
    Active& a = *active_.at(c.seq);
    // A verification chunk: the pending token and its draft, a row for each (speculation.h).
    const bool verify = !s.draft.empty() && c.n_tokens == 1 + (int32_t)s.draft.size() &&
                        c.start_pos == (int32_t)s.tokens.size() - 1;
    // Rows for every token while prompt positions whose successor's log-probability is
    // wanted are in the chunk.
    const bool all_logits = verify || (s.prompt_logits && c.start_pos < s.n_prompt - 1);
    const bool ends = c.start_pos + c.n_tokens == (int32_t)s.tokens.size();
    const int32_t feed = reads_pending(c) ? a.last_chunk : -1;
    const DeviceSampling* sampling = nullptr;
    if (!all_logits && ends && s.max_tokens > 0)
      sampling = device_sampling(a, sampling_[chunks.size()]);
    std::span<const int32_t> tokens(s.tokens.data() + c.start_pos, (size_t)c.n_tokens);
    if (verify) {
      a.verify.assign(1, s.tokens.back());
      a.verify.insert(a.verify.end(), s.draft.begin(), s.draft.end());
      tokens = a.verify;
    }
    // After a context shift the positions no longer split into prompt and generated ones.
    const int32_t prompt_len = s.n_discarded > 0 ? -1 : s.n_prompt;
    std::vector<int32_t>& targets = row_targets_[chunks.size()];
    targets.clear();  // (a prompt chunk's rows scored on the device fill it)
    const int32_t n_scored =
        all_logits && !verify ? score_rows_on_device(a, c.start_pos, c.n_tokens, targets) : 0;
    chunks.push_back({tokens, c.start_pos, std::span<const int32_t>(s.block_table), prompt_len,
                      all_logits, sampling, feed, ends || all_logits,
                      std::span<const int32_t>(targets), a.request.n_prompt_logprobs});
    const bool plain = !verify && !all_logits &&
                       (!ends || (sampling != nullptr &&
                                  (!a.request.sampler || a.request.sampler->samples_ahead())));
    all_plain = all_plain && plain;
    step.chunks.push_back({c.seq, c.start_pos, c.n_tokens, sampling != nullptr, all_logits, verify,
                           ends, plain, n_scored});
    if (!sampling) step.n_rows += all_logits ? (size_t)(c.n_tokens - n_scored) : ends ? 1 : 0;
    if (s.n_generated() > 0 && c.start_pos == (int32_t)s.tokens.size() - 1) {
      step.n_decode_tokens += 1;  // the decode; a draft's tokens are priced apart (step_cost.h)
      (verify ? step.n_verify_tokens : step.n_prompt_tokens) += c.n_tokens - 1;
    } else {
      step.n_prompt_tokens += c.n_tokens;
    }
    if (!a.scheduled) {  // leaves the queue: it runs now
      a.scheduled = true;
      a.first_scheduled = Clock::now();
      n_queued_.fetch_sub(1);
    }
  }
  step.schedule_seconds = seconds_between(begun, Clock::now());
  executor_.launch(plan.copies, chunks);
  step.launch_ms = seconds_between(begun, Clock::now()) * 1e3;
  n_launched_ = step.serial;
  // The executor holds nothing of `chunks` now: the plain chunks advance (their sequences'
  // tokens may grow).
  for (size_t i = 0; i < step.chunks.size(); ++i) {
    const LaunchedChunk& c = step.chunks[i];
    Active& a = *active_.at(c.seq);
    a.last_step = step.serial, a.last_chunk = (int32_t)i;
    if (!c.plain) continue;
    c.seq->n_computed += c.n_tokens;
    if (c.on_device) {
      c.seq->tokens.push_back(kPendingToken);
      a.n_ahead += 1;
    }
  }
  step.keep_in_flight = all_plain && executor_.feeds_tokens() && !spec_.enabled();
  step.plan = std::move(plan);
  if (in_flight_) {  // the step before this one
    n_launched_ahead_ += 1;
    collect();
  }
  in_flight_ = std::move(step);
  if (!in_flight_->keep_in_flight) collect();
}

void Engine::collect() {
  HABLAR_CHECK(in_flight_.has_value(), "collecting with no step in flight");
  const LaunchedStep step = std::move(*in_flight_);
  in_flight_.reset();
  const double device_before = executor_.times().device_seconds;
  executor_.collect(output_);
  const double device_ms = (executor_.times().device_seconds - device_before) * 1e3;
  n_collected_ = step.serial;
  const auto emit_begin = Clock::now();
  take_output(step);
  std::erase_if(retired_, [&](const auto& a) { return a->last_step <= n_collected_; });
  const double emit_seconds = seconds_between(emit_begin, Clock::now());
  // The step's time, planning to emission, is what each decoding stream waited; a step that
  // launched before the last one was collected waited from then on.
  const double end_ms = now_ms();
  const double step_ms = end_ms - std::max(step.begun_ms, last_collect_ms_);
  const auto end = Clock::now();
  const double step_seconds = seconds_between(std::max(step.begun, last_collect_), end);
  last_collect_ms_ = end_ms, last_collect_ = end;
  // What the step adds to the time between two tokens of a stream. One at a time, that is
  // the whole turn. A step that stayed in flight while the next one was planned and launched
  // costs its device span (which holds any wait for the host's launches within it): between
  // two collections the device ran it while the host launched the next, so the turn's wall
  // time would also hold the next step's launch (a decode-only step would pay for the step
  // with prompt tokens after it), and the host's launch may itself wait for the device (a
  // full launch queue).
  const double cost_ms = step.keep_in_flight && device_ms > 0 ? device_ms : step_ms;
  if (costs_.ready())
    log::debug(
        "step: {} prompt + {} decode + {} drafted tokens, {} chunks{}, in {:.1f} ms "
        "(costs {:.1f}: device {:.1f}, host {:.1f}; predicted {:.1f})",
        step.n_prompt_tokens, step.n_decode_tokens, step.n_verify_tokens, step.chunks.size(),
        step.keep_in_flight ? " launched ahead" : "", step_ms, cost_ms, device_ms,
        step.launch_ms + emit_seconds * 1e3,
        costs_.predict_ms(step.n_prompt_tokens, step.n_decode_tokens, step.n_verify_tokens));
  if (!executor_.last_step_was_cold())
    costs_.observe(step.n_prompt_tokens, step.n_decode_tokens, cost_ms, step.n_verify_tokens);
  if (costs_.n_observed() % 64 == 0)
    log::debug(
        "step cost: {:.2f} ms + {:.3f} ms per decode; per prompt token {:.3f} ms in chunks of "
        "8, {:.3f} of 64, {:.3f} of 512",
        costs_.base_ms(), costs_.per_decode_ms(), costs_.per_prompt_ms(8), costs_.per_prompt_ms(64),
        costs_.per_prompt_ms(512));
  // (computed rows, for the metrics as before)
  publish_state(&step.plan, step_seconds, step.n_prompt_tokens + step.n_verify_tokens,
                step.n_decode_tokens, step.schedule_seconds, emit_seconds);
}

void Engine::take_output(const LaunchedStep& step) {
  const size_t n_vocab = (size_t)executor_.n_vocab();
  HABLAR_CHECK(output_.logits.size() >= step.n_rows * n_vocab, "executor returned too few logits");
  HABLAR_CHECK(output_.sampled.size() == step.chunks.size(), "executor returned no sampled ids");
  float* logits = output_.logits.data();
  size_t row = 0, scored = 0;
  for (size_t i = 0; i < step.chunks.size(); ++i) {
    const LaunchedChunk& c = step.chunks[i];
    const size_t rows = c.on_device    ? 0
                        : c.all_logits ? (size_t)(c.n_tokens - c.n_scored)
                        : c.ends       ? 1
                                       : 0;
    float* first_row = logits + row * n_vocab;
    row += rows;
    const SampledLogprobs* first_scored = output_.row_logprobs.data() + scored;
    scored += (size_t)c.n_scored;
    HABLAR_CHECK(scored <= output_.row_logprobs.size(), "executor returned too few scored rows");
    auto it = active_.find(c.seq);
    if (it == active_.end()) continue;  // ended since its launch
    Active& a = *it->second;
    Sequence* seq = c.seq;
    if (a.void_step == step.serial) {  // it read a sample refused since its launch
      a.void_step = 0;
      continue;
    }
    if (c.plain) {
      blocks_.register_full_blocks(*seq, (int32_t)seq->tokens.size() - a.n_ahead);
      if (!c.on_device) continue;
      HABLAR_CHECK(output_.sampled[i] >= 0, "executor did not sample a token");
      if (!device_sample_stands(a, output_.sampled[i])) {
        take_back_refused(a);
        continue;
      }
      emit_token(a, output_.sampled[i], device_item(a, i));
      continue;
    }
    if (c.verify) {
      verify_and_emit(a, c.start_pos, c.n_tokens, first_row);
      continue;
    }
    if (c.all_logits)
      emit_prompt_logprobs(a, c.start_pos, c.n_tokens, first_row,
                           c.n_scored > 0 ? first_scored : nullptr);
    if (c.on_device && !device_sample_stands(a, output_.sampled[i])) {
      seq->n_computed += c.n_tokens - 1;  // the last position again, sampled on the host
      blocks_.register_full_blocks(*seq);
      continue;
    }
    seq->n_computed += c.n_tokens;
    blocks_.register_full_blocks(*seq);
    if (seq->n_pending() != 0) continue;
    if (seq->max_tokens == 0) {  // prompt log-probabilities only
      finish(a, FinishReason::kLength);
      continue;
    }
    HABLAR_CHECK(!c.on_device || output_.sampled[i] >= 0, "executor did not sample a token");
    sample_and_emit(a, c.on_device ? nullptr : logits + (row - 1) * n_vocab, output_.sampled[i],
                    c.on_device ? device_item(a, i) : StreamItem{});
  }
}

void Engine::collect_all() {
  if (in_flight_) collect();
}

}  // namespace hablar::engine
