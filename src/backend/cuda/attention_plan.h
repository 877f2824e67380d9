// Which attention kernel takes each row of a step (cuda::ForwardOps::stage). Plain C++ with
// no CUDA types, so the host test runs the same plan in CI.
//
// Prompt chunks of kFlashPrefillMinTokens or more take the flash prefill kernel
// (prefill_attention: a block per 64-row query tile and head, each K/V tile read once per
// tile and shared by its 64 rows) when their tiles, together, give at least a block per
// multiprocessor, or when every one of them ends within kFlashPrefillShortContext positions.
// Measured on the H200 with the register-resident kernel (2026-12-04, evening), the flash
// kernel beat the decode kernel in every such step, with few blocks too: a 512-token prompt
// of 12 heads (96 blocks) 92,500 against 86,100 t/s, four 128-token prompts 102,700 against
// 92,900, a 2048-token prompt in 512-token chunks 73,800 against 56,300. Past that context,
// with fewer blocks than multiprocessors, each block would walk a long prefix alone while
// the decode kernel splits it over the GPU, so those steps stay on it. Every other live row
// (decodes, short chunks, and every row when the flash kernel is not taken) goes to the
// decode kernel; padding rows to neither.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace hablar::cuda {

inline constexpr int64_t kFlashPrefillMinTokens = 32;
inline constexpr int64_t kFlashPrefillQueryRows = 64;  // the flash kernel's rows per block
inline constexpr int64_t kFlashPrefillShortContext = 2048;

// One sequence's chunk among the step's rows: rows first_row .. first_row + count - 1, at
// positions start_pos ...
struct StepChunkRows {
  int32_t first_row = 0, count = 0, start_pos = 0;
};

struct AttentionPlanLimits {
  bool flash_allowed = false;  // not in graphs (decode steps) nor in deterministic mode
  int32_t n_heads = 0;
  int32_t multiprocessors = 0;
  bool force_flash = false;  // the lab's HABLAR_FLASH_PREFILL=2: whatever the blocks and context
};

struct AttentionPlan {
  std::vector<StepChunkRows> flash;  // the chunks on the flash kernel, in step order
  int32_t max_flash_chunk = 0;
  std::vector<uint8_t> decode_rows;  // [n_rows]: 1 for the rows the decode kernel attends
  int64_t n_decode_rows = 0;
};

// `chunks`: the step's live chunks in row order; rows from the last chunk's end to n_rows are
// padding.
inline AttentionPlan plan_step_attention(std::span<const StepChunkRows> chunks, int64_t n_rows,
                                         const AttentionPlanLimits& limits) {
  AttentionPlan plan;
  int64_t blocks = 0;
  bool all_short = true;
  if (limits.flash_allowed)
    for (const StepChunkRows& c : chunks)
      if (c.count >= kFlashPrefillMinTokens) {
        plan.flash.push_back(c);
        blocks += (c.count + kFlashPrefillQueryRows - 1) / kFlashPrefillQueryRows * limits.n_heads;
        all_short = all_short && (int64_t)c.start_pos + c.count <= kFlashPrefillShortContext;
      }
  if (blocks < limits.multiprocessors && !all_short && !limits.force_flash) plan.flash.clear();
  plan.decode_rows.assign((size_t)n_rows, 0);
  size_t next_flash = 0;
  for (const StepChunkRows& c : chunks) {
    const bool on_flash = next_flash < plan.flash.size() &&
                          plan.flash[next_flash].first_row == c.first_row &&
                          plan.flash[next_flash].count == c.count;  // (not an empty chunk there)
    if (on_flash) {
      ++next_flash;
      plan.max_flash_chunk = std::max(plan.max_flash_chunk, c.count);
      continue;
    }
    std::fill_n(plan.decode_rows.begin() + c.first_row, c.count, uint8_t{1});
    plan.n_decode_rows += c.count;
  }
  return plan;
}

}  // namespace hablar::cuda
