// A fake model for engine tests. Its "KV cache" stores each position's token id in the slot
// the block table names; the logits of a chunk's last token are computed from the tokens it
// reads back from the cache through the block table. A wrong block table, a missed
// copy-on-write, a stale prefix block or a wrong start position changes the next token, so
// comparing with reference_next() (computed from the true token list) checks the wiring.
#pragma once

#include <algorithm>
#include <atomic>

#include <chrono>
#include <cstdint>
#include <deque>
#include <limits>
#include <span>
#include <thread>
#include <vector>

#include "core/error.h"
#include "engine/executor.h"

namespace hablar::engine::test {

inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Logits for the token after `history`: a peaked distribution whose argmax depends on every
// token and its position.
inline void reference_logits(std::span<const int32_t> history, int32_t n_vocab, float* out) {
  uint64_t h = 1469598103934665603ull;
  for (size_t p = 0; p < history.size(); ++p) h = mix64(h ^ ((uint64_t)history[p] << 20 ^ p));
  for (int32_t v = 0; v < n_vocab; ++v)
    out[v] = (float)(mix64(h + (uint64_t)v) % 1000) / 1000.0f;  // in [0, 1)
  out[h % (uint64_t)n_vocab] = 4.0f;                            // clear argmax
}

inline int32_t reference_next(std::span<const int32_t> history, int32_t n_vocab) {
  std::vector<float> row((size_t)n_vocab);
  reference_logits(history, n_vocab, row.data());
  int32_t best = 0;
  for (int32_t v = 1; v < n_vocab; ++v)
    if (row[(size_t)v] > row[(size_t)best]) best = v;
  return best;
}

// The repetition penalty as the samplers apply it (llama.cpp's rule: a positive logit of a
// token in the history divided by the penalty, a negative one multiplied; once per token).
inline void apply_repetition_penalty(std::span<const int32_t> history, float penalty,
                                     std::span<float> row) {
  if (penalty == 1.0f) return;
  std::vector<bool> seen(row.size(), false);
  for (int32_t t : history) {
    HABLAR_CHECK(t >= 0 && (size_t)t < row.size(), "a penalty history holds no token id");
    if (seen[(size_t)t]) continue;
    seen[(size_t)t] = true;
    float& v = row[(size_t)t];
    v = v > 0 ? v / penalty : v * penalty;
  }
}

class FakeExecutor : public StepExecutor {
 public:
  FakeExecutor(int32_t n_vocab, int32_t n_blocks, int32_t block_size)
      : n_vocab_(n_vocab),
        n_blocks_(n_blocks),
        block_size_(block_size),
        cache_((size_t)n_blocks * block_size, -1) {}

  int32_t n_vocab() const override { return n_vocab_; }
  int32_t n_kv_blocks() const override { return n_blocks_; }
  int32_t kv_block_size() const override { return block_size_; }
  // With device_sampling, chunks that carry sampling parameters get their token chosen here
  // (greedy over the same logits, after the chunk's token mask if it has one) and no logits
  // row, as the CUDA executor does.
  bool samples_on_device() const override { return device_sampling; }
  // A device executor's times: 1 ms of host work (0.5 ms of it staging) and 2 ms of waiting
  // per step (engine tests check that the engine publishes them); the device's 1.5 ms per
  // step, or, when it feeds tokens, the simulated time of the steps collected (a step's span
  // is known once it is collected, as on a GPU).
  ExecutorTimes times() const override {
    return {1e-3 * (double)steps, 2e-3 * (double)steps,
            feeds ? 1e-3 * collected_sim_ms : 1.5e-3 * (double)steps, 0.5e-3 * (double)steps};
  }

  // Launched steps run at once (the fake cache is written in launch order, as a device's
  // stream would); their outputs wait for collect(). With `feeds`, up to two are outstanding
  // and a fed chunk's token is the previous launch's sample, as the CUDA executor takes it on
  // its device.
  bool feeds_tokens() const override { return feeds; }
  void launch(std::span<const BlockCopy> copies, std::span<const ExecChunk> chunks) override {
    HABLAR_CHECK(outstanding_.size() < (feeds ? 2u : 1u), "too many steps outstanding");
    std::vector<ExecChunk> own(chunks.begin(), chunks.end());
    std::vector<int32_t> fed(own.size());
    // A fed chunk's penalty history ends with the same placeholder: filled in here too.
    std::vector<DeviceSampling> sampling(own.size());
    std::vector<std::vector<int32_t>> history(own.size());
    for (size_t i = 0; i < own.size(); ++i) {
      if (own[i].feed < 0) continue;
      HABLAR_CHECK(feeds && (size_t)own[i].feed < last_sampled_.size() &&
                       last_sampled_[(size_t)own[i].feed] >= 0,
                   "a fed chunk names no sample of the step before");
      HABLAR_CHECK(own[i].tokens.size() == 1 && own[i].tokens[0] == kPendingToken,
                   "a fed chunk's token is not a placeholder");
      fed[i] = last_sampled_[(size_t)own[i].feed];
      own[i].tokens = std::span<const int32_t>(&fed[i], 1);
      fed_chunks += 1;
      if (own[i].sampling == nullptr || own[i].sampling->history.empty()) continue;
      HABLAR_CHECK(own[i].sampling->history.back() == kPendingToken,
                   "a fed chunk's history does not end with its placeholder");
      history[i].assign(own[i].sampling->history.begin(), own[i].sampling->history.end());
      history[i].back() = fed[i];
      sampling[i] = *own[i].sampling;
      sampling[i].history = history[i];
      own[i].sampling = &sampling[i];
      fed_histories += 1;
    }
    outstanding_.emplace_back();
    fed_tokens_ = fed;  // (a mask source of a fed chunk learns its token, executor.h)
    execute(copies, own, outstanding_.back());
    fed_tokens_.clear();
    outstanding_ms_.push_back(step_log.back().ms);
    last_sampled_ = outstanding_.back().sampled;
    most_outstanding = std::max(most_outstanding, (int64_t)outstanding_.size());
  }
  void collect(StepOutput& out) override {
    HABLAR_CHECK(!outstanding_.empty(), "collect with no step launched");
    out = std::move(outstanding_.front());
    outstanding_.pop_front();
    collected_sim_ms += outstanding_ms_.front();
    outstanding_ms_.pop_front();
  }
  void abandon() override {
    outstanding_.clear();
    outstanding_ms_.clear();
  }

  void execute(std::span<const BlockCopy> copies, std::span<const ExecChunk> chunks,
               StepOutput& out) override {
    while (paused.load()) {
      held = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    held = false;
    for (const BlockCopy& c : copies)
      for (int32_t s = 0; s < block_size_; ++s) cache_[slot(c.dst, s)] = cache_[slot(c.src, s)];
    std::vector<float>& logits = out.logits;
    logits.clear();
    out.sampled.assign(chunks.size(), -1);
    out.logprobs.clear();
    out.row_logprobs.clear();
    std::vector<float> row((size_t)n_vocab_);
    steps += 1;
    int32_t n_decode = 0, n_prompt = 0;
    for (const ExecChunk& c : chunks) {
      const bool decode = c.tokens.size() == 1 && c.prompt_len >= 0 && c.start_pos >= c.prompt_len;
      (decode ? n_decode : n_prompt) += (int32_t)c.tokens.size();
    }
    const double ms = sim_base_ms + sim_decode_ms * n_decode + sim_prompt_ms * n_prompt +
                      (n_prompt > 0 ? sim_prompt_step_ms : 0.0);
    sim_now_ms += ms;
    step_log.push_back({n_prompt, n_decode, ms});
    if (step_delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(step_delay_us));
    batch_sizes.push_back((int32_t)chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      const ExecChunk& c = chunks[i];
      const int32_t end = c.start_pos + (int32_t)c.tokens.size();
      HABLAR_CHECK((int32_t)c.block_table.size() * block_size_ >= end, "block table too short");
      for (size_t t = 0; t < c.tokens.size(); ++t) {
        HABLAR_CHECK(c.tokens[t] >= 0, "a placeholder token reached the executor unfed");
        const int32_t pos = c.start_pos + (int32_t)t;
        cache_[slot(c.block_table[(size_t)(pos / block_size_)], pos % block_size_)] = c.tokens[t];
      }
      std::vector<int32_t> seen((size_t)end);
      for (int32_t pos = 0; pos < end; ++pos)
        seen[(size_t)pos] =
            cache_[slot(c.block_table[(size_t)(pos / block_size_)], pos % block_size_)];
      // Row t's logits, or its target's log-probabilities where the chunk's rows are scored.
      auto row_out = [&](size_t t) {
        if (c.row_targets.empty() || c.row_targets[t] < 0) {
          logits.insert(logits.end(), row.begin(), row.end());
          return;
        }
        HABLAR_CHECK(device_sampling && c.all_logits, "rows scored on a host executor");
        std::vector<float> logp(row.size());
        log_softmax(row, logp);
        out.row_logprobs.push_back(
            {true, logp[(size_t)c.row_targets[t]], top_logprobs(row, c.n_row_logprobs)});
        scored_rows += 1;
      };
      if (c.all_logits) {  // a row per token: the distribution after each prefix
        for (size_t t = 0; t + 1 < c.tokens.size(); ++t) {
          reference_logits(std::span<const int32_t>(seen).first((size_t)c.start_pos + t + 1),
                           n_vocab_, row.data());
          row_out(t);
        }
      }
      reference_logits(seen, n_vocab_, row.data());
      if (c.sampling != nullptr) {
        HABLAR_CHECK(device_sampling, "sampling parameters sent to a host-sampling executor");
        HABLAR_CHECK(!c.all_logits, "device sampling asked for an all-logits chunk");
        const std::vector<float> raw = row;  // the log-probabilities' row (executor.h)
        if (c.sampling->allowed) {           // the mask, as the CUDA sampler applies it
          std::vector<uint32_t> words(((size_t)n_vocab_ + 31) / 32, 0u);
          c.sampling->allowed->fill_allowed(words, c.feed >= 0 ? fed_tokens_[i] : kPendingToken);
          for (int32_t v = 0; v < n_vocab_; ++v)
            if (!((words[(size_t)v / 32] >> (v % 32)) & 1u))
              row[(size_t)v] = -std::numeric_limits<float>::infinity();
          device_masked += 1;
        }
        apply_repetition_penalty(c.sampling->history, c.sampling->repetition_penalty, row);
        out.sampled[i] = (int32_t)(std::max_element(row.begin(), row.end()) - row.begin());
        device_sampled += 1;
        if (c.sampling->n_logprobs >= 0) {
          HABLAR_CHECK(c.sampling->n_logprobs <= kMaxDeviceTopLogprobs, "too many top log-probs");
          out.logprobs.resize(chunks.size());
          std::vector<float> logp(raw.size());
          log_softmax(raw, logp);
          out.logprobs[i] = {true, logp[(size_t)out.sampled[i]],
                             top_logprobs(raw, c.sampling->n_logprobs)};
          device_logprobs += 1;
        }
      } else if (c.all_logits) {
        row_out(c.tokens.size() - 1);
      } else if (c.wants_output) {
        logits.insert(logits.end(), row.begin(), row.end());
      }
      tokens_computed += (int64_t)c.tokens.size();
    }
  }

  bool device_sampling = false;
  bool feeds = false;            // steps launched ahead (feeds_tokens)
  int64_t fed_chunks = 0;        // chunks whose token came from the step before
  int64_t fed_histories = 0;     // of those, chunks whose penalty history ended with it
  int64_t most_outstanding = 0;  // launched steps not yet collected, at most
  int64_t device_sampled = 0;
  int64_t device_masked = 0;    // device samples that applied a token mask
  int64_t device_logprobs = 0;  // device samples that reported log-probabilities
  int64_t scored_rows = 0;      // prompt rows scored here (ExecChunk::row_targets)
  int64_t step_delay_us = 0;    // makes steps take device-like time
  // A simulated clock each step advances by base + per decode + per prompt token, for
  // deterministic tests of time budgets (EngineConfig::now_ms reads sim_now_ms).
  double sim_base_ms = 0, sim_decode_ms = 0, sim_prompt_ms = 0;
  double sim_prompt_step_ms = 0;  // what a step with prompt tokens pays once (GPU: no graph)
  // While set, execute() waits: a test queues all its requests before the second step, so
  // how steps mix them does not depend on thread timing.
  std::atomic<bool> paused{false};
  std::atomic<bool> held{false};  // a step is waiting for `paused` to clear
  double sim_now_ms = 0;
  double collected_sim_ms = 0;  // the simulated time of the steps collected
  struct StepRecord {
    int32_t prompt_tokens, decode_tokens;
    double ms;
  };
  std::vector<StepRecord> step_log;
  int64_t tokens_computed = 0;
  int64_t steps = 0;
  std::vector<int32_t> batch_sizes;

 private:
  size_t slot(int32_t block, int32_t s) const { return (size_t)block * block_size_ + (size_t)s; }
  int32_t n_vocab_;
  int32_t n_blocks_;
  int32_t block_size_;
  std::vector<int32_t> cache_;
  std::deque<StepOutput> outstanding_;
  std::deque<double> outstanding_ms_;  // their simulated times
  std::vector<int32_t> last_sampled_;  // the last launch's samples, per chunk
  std::vector<int32_t> fed_tokens_;    // during a launch: each fed chunk's token
};

}  // namespace hablar::engine::test
