// What the engine needs from a device: run one planned step. The CPU executor
// (cpu_executor.h) and the CUDA executor (cuda_executor.h) implement it over the model's one
// forward (model/forward.h); tests implement it with a fake model that reads the paged cache
// through the same block tables, so wiring faults show up.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/kv_layout.h"
#include "core/pooling.h"
#include "engine/block_manager.h"
#include "engine/sampler.h"

namespace hablar::engine {

// The tokens a device-sampled request may take next (a grammar's mask). The executor asks for
// them after it has launched the step's forward, so that the host computes them while the
// device runs it; they are applied on the device before the rest of the chain. The sources of
// one step's rows may be asked at once, from several threads (each once a step).
class TokenMaskSource {
 public:
  virtual ~TokenMaskSource() = default;
  // Sets bit t % 32 of words[t / 32] for each token t that may come next; `words` holds
  // n_vocab bits (rounded up to whole words) and arrives zeroed. At least one bit must be
  // set (a grammar at a dead end allows the end-of-generation tokens). `pending`: for a fed
  // chunk (ExecChunk::feed), whose sampler saw a history ending in kPendingToken, the token
  // the step before sampled there (the executor waits for it: that step ends while this
  // one's forward runs); kPendingToken otherwise.
  virtual void fill_allowed(std::span<uint32_t> words, int32_t pending) = 0;
};

// Sampling parameters an executor can apply on its own device (the CUDA executor samples
// there, so only token ids cross to the host). The chain is the engine's (sampler.h):
// penalties over `history`, then greedy when temperature <= 0, else top-k, top-p, min-p,
// temperature, a seeded draw (the device's own generator: the same seed gives other tokens
// than on the CPU).
struct DeviceSampling {
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
  uint64_t step = 0;                   // the draw's counter: tokens generated so far
  bool temperature_last = true;        // filters before temperature, as the host sampler
  std::span<const int32_t> history;    // the tokens the penalties see (empty: none)
  TokenMaskSource* allowed = nullptr;  // null: every token may come next
  // >= 0: the sampled token's log-probability and the n_logprobs most likely tokens' (at most
  // kMaxDeviceTopLogprobs) come back too (StepOutput::logprobs), under log_softmax of the
  // row before the chain changed it (masks, penalties), as the host's sampler reports them.
  int32_t n_logprobs = -1;
};

// The most top log-probabilities a device-sampled row reports (the OpenAI API's cap); a
// request asking for more samples on the host.
inline constexpr int32_t kMaxDeviceTopLogprobs = 20;

// A device-sampled row's log-probabilities (DeviceSampling::n_logprobs).
struct SampledLogprobs {
  bool present = false;           // the chunk's sampling asked for them
  float logprob = 0.0f;           // the sampled token's
  std::vector<TokenLogprob> top;  // the most likely first, the lowest id among equals
};

// A token the engine has not seen yet: a sample of a step still in flight (ExecChunk::feed).
inline constexpr int32_t kPendingToken = -1;

// One sequence's share of a step (mirrors SequenceChunk, core/step_batch.h).
struct ExecChunk {
  std::span<const int32_t> tokens;       // tokens to process now
  int32_t start_pos = 0;                 // position of tokens[0]; the cache holds [0, start_pos)
  std::span<const int32_t> block_table;  // blocks covering [0, start_pos + tokens.size())
  int32_t prompt_len = -1;               // positions >= this hold generated tokens (-1: unknown)
  bool all_logits = false;               // a logits row for every token, not just the last
  // Sample the token after the chunk's last one in the executor with these parameters
  // (only when samples_on_device()); null: return its logits row instead.
  const DeviceSampling* sampling = nullptr;
  // >= 0: the chunk's one token is the one the executor sampled for chunk `feed` of the
  // step launched before this one, which the engine has not seen yet (tokens[0] holds
  // kPendingToken); only when feeds_tokens(). Its sampling's history, when it has one, ends
  // with the same placeholder, for the executor to fill in too. -1: every token is known.
  int32_t feed = -1;
  // False: neither a logits row nor a sample of this chunk is wanted (a prompt chunk before
  // its last): StepOutput has no row for it.
  bool wants_output = true;
  // An all_logits chunk's rows scored on the device (only when samples_on_device()): row j
  // with row_targets[j] >= 0 gives the log-probability of that token and the top
  // n_row_logprobs (<= kMaxDeviceTopLogprobs) in StepOutput::row_logprobs instead of its
  // logits; rows whose target is -1 still come back as logits rows. Empty: every row as logits.
  std::span<const int32_t> row_targets;
  int32_t n_row_logprobs = 0;
};

struct StepOutput {
  // Rows of n_vocab logits in chunk order, for the chunks without device sampling: one per
  // token of an all_logits chunk (but its rows scored on the device), else one (for its last
  // token) unless it wants no output.
  std::vector<float> logits;
  // [n_chunks] the token sampled by the executor for a chunk with `sampling`, else -1.
  std::vector<int32_t> sampled;
  // [n_chunks] when some chunk's sampling asked for log-probabilities (else empty).
  std::vector<SampledLogprobs> logprobs;
  // The rows scored on the device (ExecChunk::row_targets), in chunk and row order; `logprob`
  // is the target's.
  std::vector<SampledLogprobs> row_logprobs;
};

// One input of an embedding step: a whole sequence (encoder inputs are never split; no KV
// cache is kept), pooled as asked (core/pooling.h).
struct EmbedChunk {
  std::span<const int32_t> tokens;
  Pooling pooling = Pooling::kMean;
};

struct EmbedOutput {
  // Chunk c's floats are values[begin[c] .. begin[c + 1]): n_embd for mean/cls/last, the
  // classifier's outputs for rank, n_tokens x n_embd for none. Not normalized.
  std::vector<float> values;
  std::vector<int64_t> begin;  // [n_chunks + 1]
};

// Where an executor's execute() calls spent their time so far (seconds, summed over steps):
// on the host before the device had the whole step (copies, staging, uploads, launches, the
// masks computed while it runs) and waiting for the device's results; and what the device
// itself took. Device executors fill it; the engine publishes it (/metrics), so that a
// serving run shows what a step's host work costs beside the device's.
struct ExecutorTimes {
  double host_seconds = 0;
  double wait_seconds = 0;
  // The device's own clock over each step's work, from its first command after the host's
  // staging to its last: host + wait - device is the time the device sat idle inside the
  // steps (what overlapping the host's work with the device's could win back).
  double device_seconds = 0;
  // Of host_seconds, the part before the device's span began (block copies, the step's
  // staging and uploads): host work the device waits out at every step.
  double stage_seconds = 0;
};

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  virtual int32_t n_vocab() const = 0;
  // Blocks of kv_block_size() positions the executor's KV cache holds: the engine's block
  // manager hands out exactly these.
  virtual int32_t n_kv_blocks() const = 0;
  virtual int32_t kv_block_size() const = 0;
  // Whether execute() honours ExecChunk::sampling (log-probabilities included).
  virtual bool samples_on_device() const { return false; }
  // Performs the block copies (copy-on-write) first, then the forward, then any sampling.
  virtual void execute(std::span<const BlockCopy> copies, std::span<const ExecChunk> chunks,
                       StepOutput& out) = 0;
  // A step in two halves: launch() queues it and returns once nothing of `copies` or
  // `chunks` is read any more; collect() waits for the oldest launched step and gives its
  // output. Where feeds_tokens(), a second step may be launched before the first is
  // collected (its chunks' `feed` naming the first step's samples), so that the host's work
  // between steps overlaps the device's; at most two are outstanding. The default runs the
  // whole step in launch().
  virtual void launch(std::span<const BlockCopy> copies, std::span<const ExecChunk> chunks) {
    execute(copies, chunks, launched_);
  }
  virtual void collect(StepOutput& out) { std::swap(out, launched_); }
  virtual bool feeds_tokens() const { return false; }
  // After a failure: waits for and forgets every launched step.
  virtual void abandon() {}
  // Whether the last execute() did one-time work (a CUDA graph captured, scratch memory
  // grown) that makes its time no measure of later steps: the engine's step costs skip it.
  virtual bool last_step_was_cold() const { return false; }
  // Time spent in execute() so far, host and waiting (zero where the host does all the work).
  virtual ExecutorTimes times() const { return {}; }
  // Embedding steps: whether embed() runs this model here (false: `why` says why, for the
  // client's error or the start-up report). The default: no embedding kernels.
  virtual bool can_embed(std::string* why) const {
    if (why) *why = "the " + device_name() + " executor has no embedding kernels";
    return false;
  }
  // Runs the chunks' forward (encoder, or a decoder's up to its final norm) and pools each.
  // Throws Error(kUnsupported) when !can_embed(), kInvalidArgument for bad chunks.
  virtual void embed(std::span<const EmbedChunk> chunks, EmbedOutput& out) {
    std::string why;
    can_embed(&why);
    throw_error(ErrorKind::kUnsupported, why);
  }
  // Sliding windows: > 0 when no step reads a position more than kv_window() - 1 before its
  // own (every layer of the model slides, this being the largest window) and the executor
  // never touches block-table entries wholly before that, so the engine may give those
  // blocks back (BlockManager::release_before). 0: every block is kept.
  virtual int32_t kv_window() const { return 0; }
  // K/V snapshots (engine/kv_snapshot.h). The cache's layout (n_blocks included) when its
  // blocks can be copied out and back as bytes; false with `why` otherwise (the default: an
  // executor whose cache is not a paged K/V pool of that layout).
  virtual bool kv_snapshot_layout(KvCacheLayout* layout, std::string* why) const {
    if (why) *why = "the " + device_name() + " executor cannot save or restore its KV cache";
    return false;
  }
  // Copies the K/V of `blocks` into `out`: layout.block_bytes() bytes per block, in the
  // order of `blocks`, each block's regions in kv_block_regions order (every layer, K then
  // V). Only between steps (nothing launched): the engine's run_between_steps.
  virtual void read_kv_blocks(std::span<const int32_t> blocks, std::span<uint8_t> out) {
    std::string why;
    kv_snapshot_layout(nullptr, &why);
    throw_error(ErrorKind::kUnsupported, why);
  }
  // The reverse: `in` (laid out as read_kv_blocks writes it) into `blocks`.
  virtual void write_kv_blocks(std::span<const int32_t> blocks, std::span<const uint8_t> in) {
    std::string why;
    kv_snapshot_layout(nullptr, &why);
    throw_error(ErrorKind::kUnsupported, why);
  }
  // The kind of device the steps run on ("cpu", "cuda"), as /props reports it.
  virtual std::string device_name() const { return "cpu"; }
  // A line for the start-up report: device, weights, KV cache, workspace.
  virtual std::string describe() const { return {}; }

 private:
  StepOutput launched_;  // the default launch()'s output, until collect()
};

}  // namespace hablar::engine
