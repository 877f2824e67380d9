// One request's state inside the engine: its tokens (prompt, then generated), how many of
// them already have K/V in the paged cache, and the block table that maps its positions to
// physical cache blocks. No device knowledge: the scheduler and block manager move these
// around; the runner reads them to build a step's batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hablar::engine {

enum class SequenceStatus : uint8_t { kWaiting, kRunning, kFinished };

// Why a sequence stopped producing tokens (OpenAI's finish_reason, plus our own cases).
enum class FinishReason : uint8_t {
  kNone,       // still generating
  kStop,       // end-of-generation token or a stop string
  kLength,     // max_tokens reached or the context is full
  kCancelled,  // the client cancelled or went away
  kError,      // the engine failed while serving it
};

const char* finish_reason_name(FinishReason reason);

struct Sequence {
  uint64_t id = 0;
  // Arrival order: smaller = older. Preemption takes the newest; admission is oldest first.
  uint64_t arrival = 0;
  // Lower runs first (vLLM's `priority`); ties go by arrival.
  int32_t priority = 0;
  SequenceStatus status = SequenceStatus::kWaiting;

  std::vector<int32_t> tokens;  // prompt followed by the generated tokens
  int32_t n_prompt = 0;
  int32_t n_computed = 0;  // tokens [0, n_computed) have K/V in the cache
  int32_t max_tokens = 0;  // generated-token limit (already bounded by the context)

  std::vector<int32_t> block_table;    // physical block of each block-sized span of positions
                                       // (BlockManager::kReleased: given back, behind the
                                       // sliding window)
  int32_t n_released_blocks = 0;       // leading table entries that are kReleased
  std::vector<uint64_t> block_hashes;  // chained prefix hash of each full block, registered
                                       // in the prefix cache (size <= block_table.size())
  int32_t n_cached_prompt = 0;         // prompt tokens served from the prefix cache
  int32_t n_discarded = 0;             // tokens context shifts took out of `tokens`
  bool prompt_logits = false;          // logits wanted at every prompt position: the
                                       // prompt is never taken from the prefix cache
  bool reuse_prefix = true;            // false: nor is it (the request asked so)
  int32_t n_preemptions = 0;
  // Tokens drafted for this step's verification (speculation.h): planned as one chunk of
  // 1 + draft.size() tokens after the pending one; empty when not speculating.
  std::vector<int32_t> draft;

  FinishReason finish_reason = FinishReason::kNone;

  // Context shifts take tokens out (prompt ones too): they still count as generated ones did.
  int32_t n_generated() const { return (int32_t)tokens.size() + n_discarded - n_prompt; }
  // Tokens still to be run through the model before the next token can be sampled.
  int32_t n_pending() const { return (int32_t)tokens.size() - n_computed; }
  bool is_decoding() const { return n_pending() == 1 && n_generated() > 0; }
};

}  // namespace hablar::engine
