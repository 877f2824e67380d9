// Which attention kernel takes each row of a step (cuda::ForwardOps::stage). Plain C++ with
// no CUDA types, so the host test runs the same plan in CI.
//
// Prompt chunks of kFlashPrefillMinTokens or more take the flash prefill kernel
// (prefill_attention: a block per 64-row query tile and head, each K/V tile read once per
// tile) when, together, their tiles give at least a block per multiprocessor; with fewer
// blocks they walk their K/V tiles one after another on a few multiprocessors, and the
// decode kernel, whose splits fill the GPU, was faster on the H200 (a 512-token prompt of 12
// heads: 96 blocks, 76,300 t/s on the decode kernel, 66,600 on the flash one, 61,200 on a
// 32-row-tile form of it with twice the blocks; 32 heads: 256 blocks, 24,000 and 28,100;
// four 128-token prompts of 12 heads: 96 blocks, 39,500 and 35,900 t/s; eight: 192 blocks,
// 60,800 and 61,800). Every other live row (decodes, short chunks, and every row when the
// flash kernel is not taken) goes to the decode kernel; padding rows to neither.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace hablar::cuda {

inline constexpr int64_t kFlashPrefillMinTokens = 32;
inline constexpr int64_t kFlashPrefillQueryRows = 64;  // the flash kernel's rows per block

// One sequence's chunk among the step's rows: rows first_row .. first_row + count - 1, at
// positions start_pos ...
struct StepChunkRows {
  int32_t first_row = 0, count = 0, start_pos = 0;
};

struct AttentionPlanLimits {
  bool flash_allowed = false;  // not in graphs (decode steps) nor in deterministic mode
  int32_t n_heads = 0;
  int32_t multiprocessors = 0;
  bool force_flash = false;  // the lab's HABLAR_FLASH_PREFILL=2: whatever the block count
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
  if (limits.flash_allowed)
    for (const StepChunkRows& c : chunks)
      if (c.count >= kFlashPrefillMinTokens) {
        plan.flash.push_back(c);
        blocks += (c.count + kFlashPrefillQueryRows - 1) / kFlashPrefillQueryRows * limits.n_heads;
      }
  if (blocks < limits.multiprocessors && !limits.force_flash) plan.flash.clear();
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
