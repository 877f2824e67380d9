// The engine: a bounded request queue, the step loop on its own thread, and handles that
// stream each request's tokens back.
//
//   Engine::step() = schedule -> execute -> postprocess (sample, detokenize, stop, emit)
//
// HTTP threads call submit() and then read their handle; only the step thread touches
// sequences, the scheduler and the block manager. Cancelling a handle (the client went away)
// is noticed at the next step, which frees the sequence's blocks.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/block_manager.h"
#include "engine/drafter.h"
#include "engine/embedding.h"
#include "engine/executor.h"
#include "engine/handle_waker.h"
#include "engine/metrics.h"
#include "engine/sampler.h"  // TokenLogprob
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/speculation.h"

namespace hablar::engine {

// Chooses the next token from a row of logits (which it may modify in place). `history` is
// the sequence's tokens so far (prompt + generated), for penalties.
class NextTokenSampler {
 public:
  virtual ~NextTokenSampler() = default;
  virtual int32_t sample(std::span<float> logits, std::span<const int32_t> history) = 0;
  // The same choice as plain parameters an executor can apply on its device, when this
  // sampler can be expressed so (history: the tokens so far; out.history is set to the part
  // the penalties see; out.allowed to a mask the device applies first). False: the engine
  // samples on the host. Called once per step that samples, before the step runs.
  virtual bool device_params(std::span<const int32_t> history, DeviceSampling& out) {
    return false;
  }
  // Whether a token the executor sampled with device_params() stands (history: the tokens
  // before it). False: the engine computes that position again and samples it on the host
  // (a grammar's token that would leave its sentence unfinishable within max_tokens).
  virtual bool keeps_device_sample(int32_t token, std::span<const int32_t> history) { return true; }
  // Whether device_params() may be asked before the token just sampled is known: its
  // history then ends with kPendingToken, which the executor fills in on its device, and a
  // mask source it gives learns that token from fill_allowed() (executor.h). Then the engine
  // may launch the request's next step before the last one's token reaches the host. Where
  // keeps_device_sample() then refuses that token, the step launched on it is void and the
  // position is computed again (engine_step.cpp).
  virtual bool samples_ahead() const { return false; }
  // Whether device_params() gives the executor a history (penalties).
  virtual bool reads_history() const { return true; }
};

// Turns generated tokens into text on the step thread: detokenization and stop strings.
class OutputFilter {
 public:
  struct Result {
    std::string text;       // text that became final with this token
    bool stop = false;      // a stop condition matched: finish with reason "stop"
    std::string stop_word;  // the stop string that matched, when one did
  };
  virtual ~OutputFilter() = default;
  virtual Result push(int32_t token) = 0;
  virtual std::string flush() = 0;  // held-back text at the end (not after a stop match)
};

// Context shift (llama-server's --context-shift, Ollama's num_keep): when prompt and generated
// tokens fill the context, the first n_keep tokens stay, the next n_discard go, and the rest
// is computed again at its new positions (exact, and its full blocks enter the prefix cache
// as any other); generation goes on up to max_tokens.
struct ContextShift {
  int32_t n_keep = 0;     // leading tokens always kept (clamped to leave room to discard)
  int32_t n_discard = 0;  // tokens dropped after them per shift; 0: half of the rest
};
// The shift for llama.cpp's n_keep / --keep, which counts prompt tokens without the BOS the
// prompt starts with (bos_id; -1 when none); -1 keeps the whole prompt.
ContextShift context_shift_keeping(int64_t n_keep, std::span<const int32_t> prompt, int32_t bos_id,
                                   int32_t n_discard);

// Told on the step thread as a request ends (any reason), before its final item is delivered,
// the tokens whose K/V it leaves in the cache: its positions [0, n) where n is what it
// computed, at most all but the last sampled token (which has no K/V yet). The server's slots
// remember them (server/slot_table.h). Must be quick and must not call into the engine.
class RequestEndListener {
 public:
  virtual ~RequestEndListener() = default;
  virtual void ended(std::span<const int32_t> cached_tokens) = 0;
};

struct GenerateRequest {
  std::vector<int32_t> prompt;
  // Generated-token limit: further bounded by the context, unless context_shift is set.
  int32_t max_tokens = 16;
  bool ignore_eos = false;  // keep going past end-of-generation tokens
  int32_t n_logprobs = -1;  // -1 none; 0 the chosen token's; k > 0 also the top k
  // Log-probabilities of the prompt's own tokens (each given the tokens before it), sent as
  // kPrompt items before the first generated token: -1 none; 0 each token's; k > 0 also the
  // top k. Every prompt position is computed (no prefix-cache reuse). With it, max_tokens
  // may be 0: the request ends (kLength) once the prompt is processed.
  int32_t n_prompt_logprobs = -1;
  // Whether the prompt may come from the prefix cache (llama-server's cache_prompt; false:
  // every prompt position is computed, as for a first request).
  bool reuse_cached_prefix = true;
  // Scheduling rank: lower runs first (vLLM's `priority`); equal ones by arrival.
  int32_t priority = 0;
  // Speculative decoding for this request (llama-server's speculative.n_max / n_min /
  // p_min); unset: the engine's defaults. Ignored when the engine has no drafter.
  std::optional<DraftParams> speculative;
  std::optional<ContextShift> context_shift;  // unset: a full context ends it (kLength)
  std::unique_ptr<NextTokenSampler> sampler;  // null: greedy (argmax)
  std::unique_ptr<OutputFilter> filter;       // null: no text
  // Told as the request ends (RequestEndListener); null: nobody listens.
  std::shared_ptr<RequestEndListener> on_end;
};

struct StreamItem {
  // kPrompt: a prompt token and its log-probability (GenerateRequest::n_prompt_logprobs);
  // kToken: a generated token; kFinal: the end.
  enum class Kind : uint8_t { kToken, kFinal, kPrompt } kind = Kind::kToken;
  // kToken, kPrompt
  int32_t token = -1;
  std::string text;  // also the final flush's text for kFinal
  float logprob = 0;
  bool has_logprob = true;  // false for the first prompt token (nothing before it)
  std::vector<TokenLogprob> top_logprobs;
  // kFinal
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;
  std::string stop_word;  // the stop string that ended it (kStop by a stop string)
  int32_t n_prompt = 0;
  int32_t n_generated = 0;
  int32_t n_cached_prompt = 0;   // also on kToken items: what the prompt took from the cache
  int32_t n_discarded = 0;       // tokens a context shift dropped (GenerateRequest::context_shift)
  double queue_ms = 0;           // submit -> first scheduled
  double prompt_ms = 0;          // submit -> first token
  double decode_ms = 0;          // first token -> finish
  int32_t n_drafted = 0;         // speculative tokens drafted and verified (timings.draft_n)
  int32_t n_draft_accepted = 0;  // ... and accepted (timings.draft_n_accepted)
  // Time spent turning tokens into text (the request's OutputFilter); filled in by whoever
  // times its filter (the server does), 0 otherwise.
  double detokenize_ms = 0;
};

class RequestHandle {
 public:
  // Appends whatever arrived to `out`, waiting up to `timeout` when nothing has. Returns
  // false when nothing arrived within the timeout.
  bool wait(std::vector<StreamItem>& out, std::chrono::milliseconds timeout);
  // Waits up to `timeout` until an item is there, without taking it. Returns whether one is.
  bool wait_ready(std::chrono::milliseconds timeout);
  // Asks the engine to stop this request; it frees its blocks at the next step and sends a
  // final item with reason kCancelled.
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }
  uint64_t id() const { return id_; }

 private:
  friend class Engine;
  friend class HandleWaker;
  void push(StreamItem item);  // append and wake
  // Appends without waking the reader; true when a reader is blocked in wait() or
  // wait_ready() and must be woken (wake(), from the HandleWaker).
  bool append(StreamItem item);
  void wake() { cv_.notify_all(); }

  uint64_t id_ = 0;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamItem> items_;
  int32_t waiting_ = 0;  // readers blocked on cv_ (under mu_)
};

struct EngineConfig {
  SchedulerConfig scheduler;         // the KV blocks are the executor's (StepExecutor::n_kv_blocks)
  int32_t n_ctx = 2048;              // the most tokens (prompt + generated) of one sequence
  int32_t max_queue = 256;           // submitted but not yet running; beyond this submit() refuses
  int32_t embed_step_tokens = 8192;  // token budget of one embedding step
  // Give back KV blocks behind a sliding window when the executor allows it
  // (StepExecutor::kv_window > 0: every layer slides); false keeps every block.
  bool release_window_blocks = true;
  std::function<bool(int32_t)> is_eog;  // end-of-generation tokens; null: none
  // The clock steps are timed with, in ms, for the step cost model (null: steady_clock).
  // Tests inject a simulated clock that a fake executor advances.
  std::function<double()> now_ms;
  // Speculative decoding (speculation.h): the drafter (null: none) and the default draft
  // lengths of requests that do not set their own.
  std::shared_ptr<Drafter> drafter;
  DraftParams draft;
  bool draft_adaptive = true;  // false: always n_max (tests)
};

// The most tokens one sequence may hold (prompt and generated together) on a KV pool of
// pool_blocks blocks of block_size positions: the model's context (model_ctx; 0: unknown)
// bounded by the pool, unless blocks wholly behind a sliding window are given back
// (kv_window > 0: the engine's scheduler config) and the pool holds what one sequence keeps
// live at once: the window's last kv_window - 1 positions and a step's chunk of up to
// max_chunk new ones, over at most one partial block at each end. Then the model's context
// alone bounds it (the pool, when the model states none).
int32_t max_sequence_tokens(int32_t model_ctx, int32_t pool_blocks, int32_t block_size,
                            int32_t kv_window, int32_t max_chunk);

class Engine {
 public:
  Engine(const EngineConfig& config, StepExecutor& executor);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Throws Error kInvalidArgument (empty prompt, prompt too long for the
  // context: the message gives both numbers) or kResource (queue full, shutting down).
  std::shared_ptr<RequestHandle> submit(GenerateRequest request);
  // Queues an embedding request (engine/embedding.h), run by the same step loop. Throws
  // Error kUnsupported (the executor cannot embed this model), kInvalidArgument (an empty
  // input, one longer than the context, a token outside the vocabulary) or kResource.
  std::shared_ptr<EmbedHandle> submit_embedding(EmbedRequest request);

  // Runs `task` on the step thread between two steps, with no step in flight (the cache
  // holds exactly the K/V the block manager describes), and returns once it ran, rethrowing
  // what it threw. K/V snapshots (engine/kv_snapshot.h) use it. Throws Error(kResource) when
  // the engine stops before running it. The task must not wait for anything the step thread
  // does (requests' items).
  void run_between_steps(std::function<void(BlockManager&, StepExecutor&)> task);

  // Stops taking requests, lets in-flight ones finish for up to `grace`, cancels the rest,
  // and joins the step thread. Idempotent.
  void shutdown(std::chrono::milliseconds grace);

  const EngineConfig& config() const { return config_; }
  const EngineMetrics& metrics() const { return metrics_; }
  // What this executor's steps cost, as measured so far (read it from the step thread, or
  // after shutdown).
  const StepCostModel& step_costs() const { return costs_; }
  int32_t n_vocab() const { return executor_.n_vocab(); }
  bool accepting() const { return accepting_.load(); }
  // The drafter's kind (SpecType::kNone without one).
  SpecType spec_type() const { return config_.drafter ? config_.drafter->type() : SpecType::kNone; }

 private:
  struct Active {
    std::unique_ptr<Sequence> seq;
    GenerateRequest request;
    std::shared_ptr<RequestHandle> handle;
    std::chrono::steady_clock::time_point submitted;
    std::chrono::steady_clock::time_point first_scheduled;
    std::chrono::steady_clock::time_point first_token;
    std::chrono::steady_clock::time_point last_token;
    bool scheduled = false;
    bool filter_stopped = false;    // the output filter matched a stop string
    std::string stop_word;          // ... and which one
    int32_t prompt_items_sent = 0;  // kPrompt items pushed (prompt positions 0 .. n - 1)
    DraftParams draft;              // this request's draft lengths
    SpecStats spec;                 // its drafted / accepted tokens
    std::vector<int32_t> verify;    // this step's verification chunk: last token + draft
    bool sample_on_host = false;    // the sampler refused the device's last sample
    // A launched step whose chunk of this sequence read a refused sample: its output for it
    // is dropped when collected (0: none).
    uint64_t void_step = 0;
    // Placeholders at the end of seq->tokens for tokens sampled by launched steps that the
    // engine has not collected yet (engine_step.cpp), and the last step a chunk of it was
    // launched in (a finished request outlives that step).
    int32_t n_ahead = 0;
    uint64_t last_step = 0;
    int32_t last_chunk = -1;  // its chunk's index in that step
    // The prompt and every generated token, kept once a context shift took tokens out of
    // seq->tokens: the samplers' history (penalties, grammars, budgets) never shrinks.
    std::vector<int32_t> full_history;
    std::span<const int32_t> history() const {
      return full_history.empty() ? std::span<const int32_t>(seq->tokens) : full_history;
    }
  };

  // A launched step, until its output is collected: its plan and what each chunk does with
  // the output (engine_step.cpp).
  struct LaunchedChunk {
    Sequence* seq;
    int32_t start_pos, n_tokens;
    bool on_device, all_logits, verify;
    bool ends;             // it reaches the sequence's last token: its output is wanted
    bool plain;            // advanced when launched (n_computed, a placeholder for its sample)
    int32_t n_scored = 0;  // its first rows scored on the device (ExecChunk::row_targets)
  };
  struct LaunchedStep {
    uint64_t serial = 0;
    StepPlan plan;
    std::vector<LaunchedChunk> chunks;
    int32_t n_prompt_tokens = 0, n_decode_tokens = 0, n_verify_tokens = 0;
    size_t n_rows = 0;            // logits rows the executor returns
    bool keep_in_flight = false;  // every chunk plain: the next step may launch first
    double begun_ms = 0;          // now_ms() when the turn that planned it began
    std::chrono::steady_clock::time_point begun;
    double schedule_seconds = 0;
    double launch_ms = 0;  // the host's part: planning and launching it
  };

  // A run_between_steps task, until the step thread ran it.
  struct BetweenSteps {
    std::function<void(BlockManager&, StepExecutor&)> task;
    std::promise<void> done;
  };

  void loop();
  void intake();
  // The run_between_steps tasks queued so far, after collecting any step in flight.
  void run_between_steps_tasks();
  // One turn: plans a step, launches it, and collects the step launched before it (or this
  // one, where it cannot stay in flight).
  void step();
  // Whether a planned chunk reads a placeholder, and whether the executor can take that
  // token from the step in flight instead.
  bool reads_pending(const ScheduledChunk& c) const;
  bool can_feed(const ScheduledChunk& c) const;
  // Drops the chunks of sequences that finished, restarted or were preempted since planning,
  // and those whose pending token is their last.
  void drop_stale_chunks(StepPlan& plan);
  void launch(StepPlan plan, std::chrono::steady_clock::time_point begun, double begun_ms);
  void collect();  // the step in flight: its tokens emitted, its metrics published
  void take_output(const LaunchedStep& step);
  void collect_all();        // nothing in flight afterwards
  void abandon_in_flight();  // after a failure: the executor's launched steps forgotten
  // Emits the next token: `sampled` when the executor chose it (`item` holding its
  // log-probabilities, device_item), else sampled from the row.
  void sample_and_emit(Active& a, float* logits_row, int32_t sampled, StreamItem item);
  // The stream item of a token the executor sampled for chunk `chunk` of the step collected:
  // the log-probabilities it computed, when the request asked for them.
  StreamItem device_item(const Active& a, size_t chunk) const;
  // The token the request's sampler picks from a logits row (and its log-probabilities).
  // `history`: the tokens before it (prompt, generated, accepted draft tokens).
  int32_t choose_token(Active& a, float* logits_row, std::span<const int32_t> history,
                       StreamItem& item);
  // Appends the token and sends it; true when that ended the request (`a` is gone then) or
  // shifted its context (its tokens are to be computed again: no more of this step's).
  bool emit_token(Active& a, int32_t token, StreamItem item);
  // Drops tokens after the kept head of a full context and requeues the rest to be computed
  // again; false when the request asked for no shift or nothing can be dropped.
  bool shift_context(Active& a);
  // The most tokens a sequence holds: the context, or the KV pool when that is smaller.
  int32_t context_capacity() const;
  // Speculation (engine_speculation.cpp): drafts for the decoding sequences before the step
  // is planned; the verification of a drafted chunk's rows after it ran.
  void plan_drafts();
  void verify_and_emit(Active& a, int32_t start_pos, int32_t n_tokens, float* rows);
  // Device sampling parameters for a chunk that ends a sequence's pending work, or null.
  // (Null once after the sampler refused a device sample: that position is sampled on the host.)
  const DeviceSampling* device_sampling(Active& a, DeviceSampling& storage);
  // Whether the request's log-probabilities (if any) can come from the executor's sampling.
  bool logprobs_on_device(const Active& a) const {
    return a.request.n_logprobs <= kMaxDeviceTopLogprobs;
  }
  // Whether the device's sample for the chunk stands; if not, the chunk's last position is
  // left to compute again (the sequence's pending token) and sampled on the host next step.
  bool device_sample_stands(Active& a, int32_t token);
  // After a refused sample of a chunk advanced at launch: the placeholders go, the last known
  // position is computed again, and a later launched chunk of the sequence is void.
  void take_back_refused(Active& a);
  // The tokens the engine has seen (prompt and generated, no placeholders).
  static std::span<const int32_t> known_history(const Active& a);
  // Prompt tokens' log-probabilities from logits rows, or from rows scored on the device.
  void emit_prompt_logprobs(Active& a, int32_t start_pos, int32_t n_tokens, const float* rows,
                            const SampledLogprobs* scored = nullptr);
  // The targets of a prompt chunk's rows scored on the device (into `targets`): row j's is
  // the prompt token after it, -1 past the prompt; the number of scored rows (0: none, the
  // executor samples on the host or the request asks for more than the device reports).
  int32_t score_rows_on_device(const Active& a, int32_t start_pos, int32_t n_tokens,
                               std::vector<int32_t>& targets) const;
  void finish(Active& a, FinishReason reason, const std::string& error = {});
  void publish_state(const StepPlan* plan, double step_seconds, int32_t n_prompt_tokens,
                     int32_t n_decode_tokens, double schedule_seconds = 0, double emit_seconds = 0);
  void fail_all(const std::string& message);
  // Appends an item to the request's stream; its reader is woken at the end of the loop's
  // turn, off this thread (waker_).
  void deliver(Active& a, StreamItem item);
  // The time an embedding step may take now (0: no bound; embedding.h, EmbeddingQueue::step).
  double embed_step_ms() const;
  double now_ms() const;

  EngineConfig config_;
  StepExecutor& executor_;
  BlockManager blocks_;
  StepCostModel costs_;
  Scheduler scheduler_;
  EngineMetrics metrics_;
  Speculation spec_;

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::vector<std::unique_ptr<Active>> incoming_;  // submitted, not yet seen by the loop
  std::atomic<int32_t> n_queued_{0};  // submitted, never scheduled yet (not preempted ones)
  std::vector<std::unique_ptr<BetweenSteps>> between_;  // queued tasks (under queue_mu_)
  bool between_closed_ = false;  // the loop ended: no task runs any more (under queue_mu_)
  std::atomic<bool> accepting_{true};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> next_id_{1};

  EmbeddingQueue embeddings_{config_.embed_step_tokens, config_.max_queue};
  std::unordered_map<Sequence*, std::unique_ptr<Active>> active_;  // step thread only
  StepOutput output_;
  std::optional<LaunchedStep> in_flight_;         // launched, not yet collected
  std::vector<std::unique_ptr<Active>> retired_;  // finished while a launched step held them
  uint64_t n_launched_ = 0, n_collected_ = 0;     // step serials
  uint64_t n_launched_ahead_ = 0;  // steps launched while the one before was in flight
  double last_collect_ms_ = 0;     // now_ms() when the last collect ended
  std::chrono::steady_clock::time_point last_collect_;
  std::vector<DeviceSampling> sampling_;           // per chunk, this step
  std::vector<std::vector<int32_t>> row_targets_;  // per chunk, this step (score_rows_on_device)
  HandleWaker waker_;
  std::thread thread_;
};

}  // namespace hablar::engine
