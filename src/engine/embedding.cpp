#include "engine/embedding.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/log.h"
#include "engine/engine.h"

namespace hablar::engine {

using Clock = std::chrono::steady_clock;

void normalize_embedding(std::span<float> v, int norm) {
  if (norm < 0) return;
  double sum = 0;
  if (norm == 0) {
    for (float x : v) sum = std::max(sum, (double)std::fabs(x));
    sum /= 32760.0;  // int16 range
  } else if (norm == 2) {
    for (float x : v) sum += (double)x * x;
    sum = std::sqrt(sum);
  } else {
    for (float x : v) sum += std::pow(std::fabs((double)x), (double)norm);
    sum = std::pow(sum, 1.0 / norm);
  }
  const double inv = sum > 0.0 ? 1.0 / sum : 0.0;
  for (float& x : v) x = (float)(x * inv);
}

void truncate_embedding(std::vector<float>& v, int64_t dims) {
  if (dims > 0 && dims < (int64_t)v.size()) v.resize((size_t)dims);
}

bool EmbedHandle::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return done_; });
}

void EmbedHandle::finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
}

std::shared_ptr<EmbedHandle> EmbeddingQueue::push(EmbedRequest request) {
  auto p = std::make_shared<Pending>();
  p->handle = std::make_shared<EmbedHandle>();
  p->handle->result_.vectors.resize(request.inputs.size());
  for (const auto& in : request.inputs) p->handle->result_.n_tokens += (int64_t)in.size();
  p->request = std::move(request);
  p->submitted = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  if ((int32_t)waiting_.size() >= max_queue_)
    throw_error(ErrorKind::kResource, "the embedding queue is full (" + std::to_string(max_queue_) +
                                          " requests waiting); retry later");
  waiting_.push_back(p);
  return p->handle;
}

bool EmbeddingQueue::empty() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_.empty();
}

void EmbeddingQueue::fail_all(const std::string& message) {
  std::deque<std::shared_ptr<Pending>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    all.swap(waiting_);
  }
  for (auto& p : all) {
    p->handle->result_.error = message;
    p->handle->finish();
  }
}

void EmbeddingQueue::observe(int64_t tokens, double ms) {
  if (tokens <= 0 || !(ms >= 0)) return;
  const double per_token = ms / (double)tokens;
  ms_per_token_ = ms_per_token_ == 0 ? per_token : 0.8 * ms_per_token_ + 0.2 * per_token;
}

int64_t EmbeddingQueue::token_budget(double max_ms) const {
  if (max_ms <= 0 || ms_per_token_ <= 0) return step_tokens_;
  return std::clamp<int64_t>((int64_t)(max_ms / ms_per_token_), 1, step_tokens_);
}

void EmbeddingQueue::step(StepExecutor& executor, EngineMetrics& metrics, double max_ms) {
  const int64_t budget = token_budget(max_ms);
  // The step's inputs: the oldest requests' next inputs, whole, up to the token budget (the
  // first always goes, however long). Cancelled requests end here.
  std::vector<std::shared_ptr<Pending>> taken;  // one entry per chunk
  std::vector<size_t> input_index;
  std::vector<EmbedChunk> chunks;
  std::vector<std::shared_ptr<Pending>> cancelled;
  int64_t tokens = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      Pending& p = **it;
      if (p.handle->cancelled()) {
        cancelled.push_back(*it);
        it = waiting_.erase(it);
        continue;
      }
      while (p.next_input < p.request.inputs.size()) {
        const auto& in = p.request.inputs[p.next_input];
        if (!chunks.empty() && tokens + (int64_t)in.size() > budget) break;
        chunks.push_back({in, p.request.pooling});
        taken.push_back(*it);
        input_index.push_back(p.next_input++);
        tokens += (int64_t)in.size();
      }
      if (p.next_input < p.request.inputs.size()) break;  // the budget is spent
      ++it;
    }
  }
  for (auto& p : cancelled) {
    p->handle->result_.cancelled = true;
    p->handle->finish();
  }
  if (chunks.empty()) return;
  const auto t0 = Clock::now();
  for (auto& p : taken)
    if (!p->started) {
      p->started = true;
      p->handle->result_.queue_ms =
          std::chrono::duration<double, std::milli>(t0 - p->submitted).count();
    }
  std::string error;
  try {
    executor.embed(chunks, output_);
  } catch (const std::exception& e) {
    error = e.what();
    log::error("embedding step failed: {}", error);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (error.empty()) observe(tokens, seconds * 1e3);
  std::vector<std::shared_ptr<Pending>> finished;
  for (size_t c = 0; c < chunks.size(); ++c) {
    Pending& p = *taken[c];
    EmbedResult& r = p.handle->result_;
    if (!error.empty()) {
      r.error = error;
    } else {
      r.vectors[input_index[c]].assign(output_.values.begin() + output_.begin[c],
                                       output_.values.begin() + output_.begin[c + 1]);
    }
    if (++p.done_inputs == p.request.inputs.size() || !error.empty())
      if (std::find(finished.begin(), finished.end(), taken[c]) == finished.end())
        finished.push_back(taken[c]);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& p : finished) std::erase(waiting_, p);
  }
  // The counters first: a client that has its vectors sees them counted.
  metrics.update([&](MetricsSnapshot& m) {
    m.embedding_inputs_total += chunks.size();
    m.embedding_steps_total += 1;
    m.steps_total += 1;
    m.prompt_tokens_computed += (uint64_t)tokens;
    m.prompt_seconds_total += seconds;
    m.requests_finished += finished.size();
  });
  const auto now = Clock::now();
  for (auto& p : finished) {
    p->handle->result_.total_ms =
        std::chrono::duration<double, std::milli>(now - p->submitted).count();
    p->handle->finish();
  }
}

// Engine's side: the checks generation requests get (context, vocabulary, queue), then the
// queue; the step loop (engine.cpp) runs it.
std::shared_ptr<EmbedHandle> Engine::submit_embedding(EmbedRequest request) {
  std::string why;
  if (!executor_.can_embed(&why)) throw_error(ErrorKind::kUnsupported, why);
  if (request.inputs.empty()) throw_error(ErrorKind::kInvalidArgument, "no inputs to embed");
  const int32_t vocab = executor_.n_vocab();
  int64_t n_tokens = 0;
  for (size_t i = 0; i < request.inputs.size(); ++i) {
    const auto& in = request.inputs[i];
    if (in.empty())
      throw_error(ErrorKind::kInvalidArgument, "input " + std::to_string(i) + " has no tokens");
    if ((int32_t)in.size() > config_.n_ctx)
      throw_error(ErrorKind::kInvalidArgument,
                  "input " + std::to_string(i) + " has " + std::to_string(in.size()) +
                      " tokens, too large for the context of " + std::to_string(config_.n_ctx) +
                      " tokens; shorten it (or truncate)");
    for (int32_t t : in)
      if (t < 0 || t >= vocab)
        throw_error(ErrorKind::kInvalidArgument, "token id " + std::to_string(t) +
                                                     " is outside the vocabulary [0, " +
                                                     std::to_string(vocab) + ")");
    n_tokens += (int64_t)in.size();
  }
  if (!accepting_.load()) throw_error(ErrorKind::kResource, "the server is shutting down");
  std::shared_ptr<EmbedHandle> handle;
  try {
    handle = embeddings_.push(std::move(request));
  } catch (const Error&) {
    metrics_.update([](MetricsSnapshot& m) { m.requests_rejected += 1; });
    throw;
  }
  metrics_.update([&](MetricsSnapshot& m) {
    m.requests_total += 1;
    m.prompt_tokens_total += (uint64_t)n_tokens;
  });
  {
    std::lock_guard<std::mutex> lock(queue_mu_);  // the loop waits on queue_cv_ under it
  }
  queue_cv_.notify_all();
  return handle;
}

}  // namespace hablar::engine
