#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/log.h"

namespace hablar::engine {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The chosen token's log-probability under log_softmax(row), and the top k.
void fill_logprobs(std::span<const float> row, int32_t chosen, int32_t k, StreamItem& item) {
  const double lse = log_sum_exp(row);
  item.logprob = (float)((double)row[(size_t)chosen] - lse);
  if (k > 0) item.top_logprobs = top_logprobs(row, k, lse);
}

}  // namespace

bool RequestHandle::wait(std::vector<StreamItem>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  ++waiting_;
  const bool ready = cv_.wait_for(lock, timeout, [&] { return !items_.empty(); });
  --waiting_;
  if (!ready) return false;
  while (!items_.empty()) {
    out.push_back(std::move(items_.front()));
    items_.pop_front();
  }
  return true;
}

bool RequestHandle::wait_ready(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  ++waiting_;
  const bool ready = cv_.wait_for(lock, timeout, [&] { return !items_.empty(); });
  --waiting_;
  return ready;
}

void RequestHandle::push(StreamItem item) {
  append(std::move(item));
  cv_.notify_all();
}

bool RequestHandle::append(StreamItem item) {
  std::lock_guard<std::mutex> lock(mu_);
  items_.push_back(std::move(item));
  return waiting_ > 0;
}

namespace {

// The scheduler's configuration with the executor's sliding window, when blocks behind it
// may be given back.
SchedulerConfig scheduler_config(const EngineConfig& config, const StepExecutor& executor) {
  SchedulerConfig c = config.scheduler;
  c.kv_window = config.release_window_blocks ? executor.kv_window() : 0;
  return c;
}

}  // namespace

int32_t max_sequence_tokens(int32_t model_ctx, int32_t pool_blocks, int32_t block_size,
                            int32_t kv_window, int32_t max_chunk) {
  HABLAR_CHECK(pool_blocks > 0 && block_size > 0 && max_chunk > 0,
               "max_sequence_tokens: a pool of blocks and a chunk size");
  const int64_t pool = (int64_t)pool_blocks * block_size;
  const int32_t bounded = (int32_t)(model_ctx > 0 ? std::min<int64_t>(model_ctx, pool) : pool);
  if (kv_window <= 0 || model_ctx <= 0) return bounded;
  const int64_t live_positions = (int64_t)kv_window - 1 + max_chunk;
  const int64_t live_blocks = (live_positions + block_size - 1) / block_size + 1;
  return live_blocks <= pool_blocks ? model_ctx : bounded;
}

Engine::Engine(const EngineConfig& config, StepExecutor& executor)
    : config_(config),
      executor_(executor),
      blocks_(executor.n_kv_blocks(), executor.kv_block_size()),
      scheduler_(scheduler_config(config, executor), blocks_),
      spec_(config.drafter, config.draft_adaptive) {
  config_.draft.validate();
  scheduler_.set_cost_model(&costs_);
  if (config_.n_ctx < 2)
    throw_error(ErrorKind::kInvalidArgument, "engine: context must hold at least 2 tokens");
  metrics_.update([&](MetricsSnapshot& m) {
    m.kv_blocks_total = executor.n_kv_blocks();
    m.spec_type = spec_type_name(spec_type());
  });
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  shutdown(std::chrono::milliseconds(0));
}

std::shared_ptr<RequestHandle> Engine::submit(GenerateRequest request) {
  const int32_t n_prompt = (int32_t)request.prompt.size();
  if (n_prompt == 0) throw_error(ErrorKind::kInvalidArgument, "the prompt has no tokens");
  const int32_t capacity = context_capacity();
  if (n_prompt >= capacity)
    throw_error(ErrorKind::kInvalidArgument,
                "the prompt has " + std::to_string(n_prompt) + " tokens but the context holds " +
                    std::to_string(capacity) +
                    " (prompt and generated tokens together); shorten the prompt");
  const int32_t vocab = executor_.n_vocab();
  for (int32_t t : request.prompt)
    if (t < 0 || t >= vocab)
      throw_error(ErrorKind::kInvalidArgument, "prompt token id " + std::to_string(t) +
                                                   " is outside the vocabulary [0, " +
                                                   std::to_string(vocab) + ")");
  if (request.max_tokens < 1 && !(request.max_tokens == 0 && request.n_prompt_logprobs >= 0))
    throw_error(ErrorKind::kInvalidArgument,
                "max_tokens must be at least 1 (0 only with prompt log-probabilities)");
  if (!accepting_.load()) throw_error(ErrorKind::kResource, "the server is shutting down");
  if (n_queued_.fetch_add(1) >= config_.max_queue) {
    n_queued_.fetch_sub(1);
    metrics_.update([](MetricsSnapshot& m) { m.requests_rejected += 1; });
    throw_error(ErrorKind::kResource, "the request queue is full (" +
                                          std::to_string(config_.max_queue) +
                                          " waiting); retry later");
  }
  auto a = std::make_unique<Active>();
  a->handle = std::make_shared<RequestHandle>();
  a->seq = std::make_unique<Sequence>();
  const uint64_t id = next_id_.fetch_add(1);
  a->handle->id_ = id;
  a->seq->id = id;
  a->seq->arrival = id;
  a->seq->priority = request.priority;
  a->seq->n_prompt = n_prompt;
  a->seq->tokens = std::move(request.prompt);
  a->seq->prompt_logits = request.n_prompt_logprobs >= 0;
  a->seq->reuse_prefix = request.reuse_cached_prefix;
  // Bounded by the context (prompt + generated never exceeds it) unless the context shifts.
  a->seq->max_tokens = request.context_shift ? request.max_tokens
                                             : std::min(request.max_tokens, capacity - n_prompt);
  if (request.speculative) request.speculative->validate();
  a->draft = request.speculative.value_or(config_.draft);
  a->request = std::move(request);
  a->submitted = Clock::now();
  auto handle = a->handle;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    incoming_.push_back(std::move(a));
  }
  metrics_.update([&](MetricsSnapshot& m) {
    m.requests_total += 1;
    m.prompt_tokens_total += (uint64_t)n_prompt;
  });
  queue_cv_.notify_all();
  return handle;
}

void Engine::shutdown(std::chrono::milliseconds grace) {
  accepting_.store(false);
  if (!thread_.joinable()) return;
  const auto deadline = Clock::now() + grace;
  while (Clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      if (incoming_.empty() && n_queued_.load() == 0 && metrics_.snapshot().requests_running == 0)
        break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  stop_.store(true);
  queue_cv_.notify_all();
  thread_.join();
}

void Engine::run_between_steps(std::function<void(BlockManager&, StepExecutor&)> task) {
  auto entry = std::make_unique<BetweenSteps>();
  entry->task = std::move(task);
  std::future<void> done = entry->done.get_future();
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (between_closed_ || stop_.load())
      throw_error(ErrorKind::kResource, "the server is shutting down");
    between_.push_back(std::move(entry));
  }
  queue_cv_.notify_all();
  done.get();  // rethrows the task's exception
}

void Engine::run_between_steps_tasks() {
  std::vector<std::unique_ptr<BetweenSteps>> tasks;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    tasks.swap(between_);
  }
  if (tasks.empty()) return;
  try {
    collect_all();  // nothing in flight: the cache holds what the block manager describes
  } catch (...) {
    for (auto& t : tasks) t->done.set_exception(std::current_exception());
    throw;
  }
  for (auto& t : tasks) {
    try {
      t->task(blocks_, executor_);
      t->done.set_value();
    } catch (...) {
      t->done.set_exception(std::current_exception());
    }
  }
  publish_state(nullptr, 0, 0, 0);  // the cache's gauges
}

void Engine::intake() {
  std::vector<std::unique_ptr<Active>> fresh;
  {
    std::unique_lock<std::mutex> lock(queue_mu_);
    if (incoming_.empty() && between_.empty() && scheduler_.empty() && embeddings_.empty() &&
        !in_flight_ && !stop_.load())
      queue_cv_.wait_for(lock, std::chrono::milliseconds(100));
    fresh.swap(incoming_);
  }
  for (auto& a : fresh) {
    Sequence* seq = a->seq.get();
    scheduler_.add(seq);
    active_.emplace(seq, std::move(a));
  }
  // Cancellations: freed before this step is planned.
  std::vector<Active*> cancelled;
  for (auto& [seq, a] : active_)
    if (a->handle->cancelled()) cancelled.push_back(a.get());
  for (Active* a : cancelled) finish(*a, FinishReason::kCancelled);
  if (!cancelled.empty()) publish_state(nullptr, 0, 0, 0);
}

void Engine::loop() {
  while (!stop_.load()) {
    try {
      intake();
      if (stop_.load()) break;
      run_between_steps_tasks();
      if (!scheduler_.empty()) {
        step();
      } else if (in_flight_) {
        collect();  // (only requests that ended since its launch were in it)
      }
      if (!embeddings_.empty()) {
        collect_all();  // embedding steps run on the same device, after it
        embeddings_.step(executor_, metrics_, embed_step_ms());
      }
    } catch (const std::exception& e) {
      log::error("engine step failed: {}", e.what());
      abandon_in_flight();
      fail_all(std::string("the engine failed: ") + e.what());
    }
    waker_.flush();  // the turn's stream items reach their readers
  }
  // Whatever is left ends cleanly: streams get a final item.
  try {
    collect_all();
  } catch (const std::exception& e) {
    log::error("engine step failed: {}", e.what());
    abandon_in_flight();
  }
  std::vector<std::unique_ptr<BetweenSteps>> unrun;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    between_closed_ = true;
    unrun.swap(between_);
    for (auto& a : incoming_) {
      Sequence* seq = a->seq.get();
      scheduler_.add(seq);
      active_.emplace(seq, std::move(a));
    }
    incoming_.clear();
  }
  std::vector<Active*> rest;
  for (auto& [seq, a] : active_) rest.push_back(a.get());
  for (Active* a : rest) finish(*a, FinishReason::kCancelled, "the server is shutting down");
  retired_.clear();
  for (auto& t : unrun)
    t->done.set_exception(
        std::make_exception_ptr(Error(ErrorKind::kResource, "the server is shutting down")));
  embeddings_.fail_all("the server is shutting down");
  n_queued_.store(0);
  publish_state(nullptr, 0, 0, 0);
  waker_.flush();
}

// An embedding step between generation steps delays every running stream's next token by its
// whole length: while streams run, it is held to the time a generation step may take.
double Engine::embed_step_ms() const {
  const SchedulerConfig& sc = scheduler_.config();
  const int32_t running = scheduler_.n_running();
  if (running == 0 || !costs_.ready() || (sc.max_step_ms <= 0 && sc.max_decode_slowdown <= 0))
    return 0;
  return scheduler_.step_target_ms(running);
}

void Engine::deliver(Active& a, StreamItem item) {
  if (a.handle->append(std::move(item))) waker_.add(a.handle);
}

void Engine::fail_all(const std::string& message) {
  std::vector<Active*> all;
  for (auto& [seq, a] : active_) all.push_back(a.get());
  for (Active* a : all) finish(*a, FinishReason::kError, message);
}

double Engine::now_ms() const {
  if (config_.now_ms) return config_.now_ms();
  return std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count();
}

int32_t Engine::score_rows_on_device(const Active& a, int32_t start_pos, int32_t n_tokens,
                                     std::vector<int32_t>& targets) const {
  const Sequence& s = *a.seq;
  if (!executor_.samples_on_device() || a.request.n_prompt_logprobs > kMaxDeviceTopLogprobs)
    return 0;
  const int32_t n_scored = std::clamp(s.n_prompt - 1 - start_pos, 0, n_tokens);
  for (int32_t j = 0; j < n_tokens; ++j)
    targets.push_back(j < n_scored ? s.tokens[(size_t)(start_pos + j + 1)] : -1);
  if (n_scored == 0) targets.clear();
  return n_scored;
}

// Sends kPrompt items for the prompt tokens whose predecessors are in this chunk: row j
// (position start_pos + j) gives the log-probability of the token at start_pos + j + 1. Items
// already sent (before a preemption made the sequence compute its prompt again) are not
// repeated. The first prompt token has no log-probability. `scored`: rows the executor
// scored (score_rows_on_device), else `rows` of logits.
void Engine::emit_prompt_logprobs(Active& a, int32_t start_pos, int32_t n_tokens, const float* rows,
                                  const SampledLogprobs* scored) {
  const Sequence& s = *a.seq;
  const size_t n_vocab = (size_t)executor_.n_vocab();
  if (a.prompt_items_sent == 0 && start_pos == 0) {
    StreamItem first;
    first.kind = StreamItem::Kind::kPrompt;
    first.token = s.tokens[0];
    first.has_logprob = false;
    deliver(a, std::move(first));
    a.prompt_items_sent = 1;
  }
  for (int32_t j = 0; j < n_tokens; ++j) {
    const int32_t target = start_pos + j + 1;
    if (target >= s.n_prompt) break;
    if (target != a.prompt_items_sent) continue;  // sent already (or not next in order)
    StreamItem item;
    item.kind = StreamItem::Kind::kPrompt;
    item.token = s.tokens[(size_t)target];
    if (scored) {
      item.logprob = scored[j].logprob;
      item.top_logprobs = scored[j].top;
    } else {
      fill_logprobs(std::span<const float>(rows + (size_t)j * n_vocab, n_vocab), item.token,
                    a.request.n_prompt_logprobs, item);
    }
    deliver(a, std::move(item));
    a.prompt_items_sent = target + 1;
  }
}

const DeviceSampling* Engine::device_sampling(Active& a, DeviceSampling& storage) {
  if (!executor_.samples_on_device() || !logprobs_on_device(a)) return nullptr;
  if (a.sample_on_host) {
    a.sample_on_host = false;
    return nullptr;
  }
  storage = DeviceSampling{};  // greedy when the request has no sampler
  if (a.request.sampler && !a.request.sampler->device_params(a.history(), storage)) return nullptr;
  storage.step = (uint64_t)a.seq->n_generated();
  storage.n_logprobs = a.request.n_logprobs;
  return &storage;
}

int32_t Engine::choose_token(Active& a, float* logits_row, std::span<const int32_t> history,
                             StreamItem& item) {
  std::span<float> row(logits_row, (size_t)executor_.n_vocab());
  // Log-probabilities are those of the model's distribution, before sampling transforms.
  std::vector<float> raw;
  if (a.request.n_logprobs >= 0) raw.assign(row.begin(), row.end());
  const int32_t token = a.request.sampler ? a.request.sampler->sample(row, history) : argmax(row);
  if (a.request.n_logprobs >= 0) fill_logprobs(raw, token, a.request.n_logprobs, item);
  return token;
}

std::span<const int32_t> Engine::known_history(const Active& a) {
  if (!a.full_history.empty()) return a.full_history;  // (never holds placeholders)
  return std::span<const int32_t>(a.seq->tokens).first(a.seq->tokens.size() - (size_t)a.n_ahead);
}

bool Engine::device_sample_stands(Active& a, int32_t token) {
  if (!a.request.sampler || token < 0 ||
      a.request.sampler->keeps_device_sample(token, known_history(a)))
    return true;
  a.sample_on_host = true;
  metrics_.update([](MetricsSnapshot& m) { m.device_samples_refused_total += 1; });
  return false;
}

void Engine::take_back_refused(Active& a) {
  Sequence& seq = *a.seq;
  seq.tokens.resize(seq.tokens.size() - (size_t)a.n_ahead);
  a.n_ahead = 0;
  seq.n_computed = (int32_t)seq.tokens.size() - 1;
  if (a.last_step <= n_collected_) return;
  a.void_step = a.last_step;
  metrics_.update([](MetricsSnapshot& m) { m.steps_voided_total += 1; });
}

StreamItem Engine::device_item(const Active& a, size_t chunk) const {
  StreamItem item;
  if (a.request.n_logprobs < 0) return item;
  HABLAR_CHECK(chunk < output_.logprobs.size() && output_.logprobs[chunk].present,
               "executor returned no log-probabilities for a sample");
  const SampledLogprobs& lp = output_.logprobs[chunk];
  item.logprob = lp.logprob;
  item.top_logprobs = lp.top;
  return item;
}

void Engine::sample_and_emit(Active& a, float* logits_row, int32_t sampled, StreamItem item) {
  const int32_t token =
      logits_row != nullptr ? choose_token(a, logits_row, a.history(), item) : sampled;
  emit_token(a, token, std::move(item));
}

bool Engine::emit_token(Active& a, int32_t token, StreamItem item) {
  Sequence& seq = *a.seq;
  const auto now = Clock::now();
  if (a.n_ahead > 0) {  // the oldest placeholder of a launched step (engine_step.cpp)
    seq.tokens[seq.tokens.size() - (size_t)a.n_ahead] = token;
    a.n_ahead -= 1;
  } else {
    seq.tokens.push_back(token);
  }
  if (!a.full_history.empty()) a.full_history.push_back(token);
  item.token = token;
  item.n_cached_prompt = seq.n_cached_prompt;

  const bool first = seq.n_generated() - a.n_ahead == 1;
  metrics_.update([&](MetricsSnapshot& m) {
    m.generated_tokens_total += 1;
    if (first)
      m.ttft_seconds.observe(seconds_between(a.submitted, now));
    else
      m.token_latency_seconds.observe(seconds_between(a.last_token, now));
  });
  if (first) a.first_token = now;
  a.last_token = now;

  const bool eog = !a.request.ignore_eos && config_.is_eog && config_.is_eog(token);
  bool stop = eog;
  if (!eog && a.request.filter) {
    OutputFilter::Result r = a.request.filter->push(token);
    item.text = std::move(r.text);
    stop = r.stop;
    a.filter_stopped = r.stop;
    a.stop_word = std::move(r.stop_word);
  }
  deliver(a, std::move(item));
  if (stop) {
    finish(a, FinishReason::kStop);
    return true;
  }
  if (seq.n_generated() - a.n_ahead >= seq.max_tokens) {
    finish(a, FinishReason::kLength);
    return true;
  }
  if ((int32_t)seq.tokens.size() - a.n_ahead >= context_capacity()) {
    HABLAR_CHECK(a.n_ahead == 0, "a context shift under a launched step");
    if (!shift_context(a)) finish(a, FinishReason::kLength);
    return true;
  }
  return false;
}

ContextShift context_shift_keeping(int64_t n_keep, std::span<const int32_t> prompt, int32_t bos_id,
                                   int32_t n_discard) {
  const auto n_prompt = (int64_t)prompt.size();
  const bool bos = bos_id >= 0 && !prompt.empty() && prompt[0] == bos_id;
  const int64_t keep = n_keep < 0 ? n_prompt : std::min(n_keep + (bos ? 1 : 0), n_prompt);
  return {(int32_t)keep, n_discard};
}

int32_t Engine::context_capacity() const {
  // Under a sliding window the blocks behind it are given back: the pool bounds no sequence.
  const int32_t pool = executor_.n_kv_blocks() * executor_.kv_block_size();
  return scheduler_.config().kv_window > 0 ? config_.n_ctx : std::min(config_.n_ctx, pool);
}

bool Engine::shift_context(Active& a) {
  if (!a.request.context_shift) return false;
  Sequence& seq = *a.seq;
  const int32_t n = (int32_t)seq.tokens.size();
  // At least one token goes and one (the last, to compute again) stays after the kept head.
  const int32_t keep = std::clamp(a.request.context_shift->n_keep, 0, n - 2);
  const int32_t rest = n - keep;
  if (keep < 0 || rest < 2) return false;
  const int32_t asked = a.request.context_shift->n_discard;
  const int32_t discard = std::clamp(asked > 0 ? asked : rest / 2, 1, rest - 1);
  if (a.full_history.empty()) a.full_history = seq.tokens;
  seq.tokens.erase(seq.tokens.begin() + keep, seq.tokens.begin() + keep + discard);
  seq.n_discarded += discard;
  // The cache's K/V of the moved positions is void: compute them again (a drafter rolls its
  // own state back to the common prefix by itself).
  scheduler_.restart(&seq);
  metrics_.update([](MetricsSnapshot& m) { m.context_shifts_total += 1; });
  return true;
}

void Engine::finish(Active& a, FinishReason reason, const std::string& error) {
  Sequence& seq = *a.seq;
  // Tokens launched steps sample for it now are never emitted.
  seq.tokens.resize(seq.tokens.size() - (size_t)a.n_ahead);
  a.n_ahead = 0;
  if (a.request.on_end) {  // (before the scheduler frees its blocks, which resets n_computed)
    const int32_t n_cached = std::max(0, std::min(seq.n_computed, (int32_t)seq.tokens.size() - 1));
    a.request.on_end->ended(std::span<const int32_t>(seq.tokens).first((size_t)n_cached));
  }
  scheduler_.remove(&seq);
  seq.finish_reason = reason;
  if (!a.scheduled) n_queued_.fetch_sub(1);  // ended while still queued
  const auto now = Clock::now();
  StreamItem item;
  item.kind = StreamItem::Kind::kFinal;
  item.finish_reason = reason;
  item.error = error;
  item.stop_word = a.stop_word;
  // A stop-string match ends the text where the match began; otherwise held-back text
  // (an incomplete character, a partial stop-string match) is final now.
  if (a.request.filter && !a.filter_stopped &&
      (reason == FinishReason::kStop || reason == FinishReason::kLength))
    item.text = a.request.filter->flush();
  item.n_prompt = seq.n_prompt;
  item.n_generated = seq.n_generated();
  item.n_cached_prompt = seq.n_cached_prompt;
  item.n_discarded = seq.n_discarded;
  const bool got_token = seq.n_generated() > 0;
  item.queue_ms = a.scheduled ? seconds_between(a.submitted, a.first_scheduled) * 1e3 : 0;
  item.prompt_ms = got_token ? seconds_between(a.submitted, a.first_token) * 1e3 : 0;
  item.decode_ms = got_token ? seconds_between(a.first_token, now) * 1e3 : 0;
  item.n_drafted = (int32_t)a.spec.drafted;
  item.n_draft_accepted = (int32_t)a.spec.accepted;
  if (spec_.enabled()) spec_.drafter()->release(seq.id);
  metrics_.update([&](MetricsSnapshot& m) {
    m.requests_finished += 1;
    m.preemptions_total += (uint64_t)seq.n_preemptions;
    m.prompt_tokens_cached += (uint64_t)seq.n_cached_prompt;
    // Its slot is free from now on, before the client has the reply: /slots and the gauges
    // must not show it busy until some later step publishes the state again.
    std::erase_if(m.slots, [&](const SlotInfo& s) { return s.id == seq.id; });
    m.requests_running = scheduler_.n_running();
    m.requests_waiting = scheduler_.n_waiting();
  });
  deliver(a, std::move(item));
  auto it = active_.find(&seq);
  // A launched step not yet collected still names it: it stays until then.
  if (a.last_step > n_collected_) retired_.push_back(std::move(it->second));
  active_.erase(it);
}

void Engine::abandon_in_flight() {
  executor_.abandon();
  in_flight_.reset();
  n_collected_ = n_launched_;
  retired_.clear();
}

void Engine::publish_state(const StepPlan* plan, double step_seconds, int32_t n_prompt_tokens,
                           int32_t n_decode_tokens, double schedule_seconds, double emit_seconds) {
  std::vector<SlotInfo> slots;
  slots.reserve(active_.size());
  for (auto& [seq, a] : active_)
    slots.push_back({seq->id, seq->status == SequenceStatus::kRunning, seq->n_prompt,
                     seq->n_generated(), seq->n_computed, seq->n_cached_prompt, seq->max_tokens});
  std::sort(slots.begin(), slots.end(),
            [](const SlotInfo& x, const SlotInfo& y) { return x.id < y.id; });
  metrics_.update([&](MetricsSnapshot& m) {
    m.requests_running = scheduler_.n_running();
    m.requests_waiting = scheduler_.n_waiting();
    m.kv_blocks_used = blocks_.n_used();
    m.kv_blocks_cached = blocks_.n_cached();
    m.slots = std::move(slots);
    if (plan && !plan->chunks.empty()) {
      const int32_t batch = (int32_t)plan->chunks.size();
      m.steps_total += 1;
      m.steps_launched_ahead_total = n_launched_ahead_;
      m.batch_size.observe(batch);
      m.max_batch_size = std::max(m.max_batch_size, batch);
      m.prompt_tokens_computed += (uint64_t)n_prompt_tokens;
      const int32_t total = n_prompt_tokens + n_decode_tokens;
      if (total > 0) {
        m.prompt_seconds_total += step_seconds * n_prompt_tokens / total;
        m.decode_seconds_total += step_seconds * n_decode_tokens / total;
      }
      const ExecutorTimes t = executor_.times();
      m.executor_host_seconds = t.host_seconds, m.executor_wait_seconds = t.wait_seconds;
      m.executor_device_seconds = t.device_seconds;
      m.executor_stage_seconds = t.stage_seconds;
      m.engine_schedule_seconds += schedule_seconds;
      m.engine_emit_seconds += emit_seconds;
    }
  });
}

}  // namespace hablar::engine
