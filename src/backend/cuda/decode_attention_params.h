// Parameters of the decode-step attention (one layer, one step, a padded batch of slots).
// Plain C++ with no CUDA types, so the host twin (decode_attention_host.h) and the tests
// build without nvcc.
//
// Shapes (row-major, f32 activations):
//   q      [n_slots][n_heads][head_dim]      this step's queries (RoPE already applied)
//   k_new  [n_slots][n_kv_heads][head_dim]   this step's keys   (RoPE already applied)
//   v_new  [n_slots][n_kv_heads][head_dim]   this step's values
//   out    [n_slots][n_heads][head_dim]      attention output; untouched for inactive slots
// GQA: query head h reads KV head h / (n_heads / n_kv_heads).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/cuda/lab_knobs.h"
#include "core/kv_layout.h"

namespace hablar::cuda {

struct DecodeAttentionParams {
  KvCacheLayout layout;
  int32_t layer = 0;
  void* kv_cache = nullptr;  // layout.total_elems() elements of layout.dtype

  // The batch: every array has n_slots entries; a slot with active[s] == 0 (padding or a
  // finished sequence) is neither read nor written, and its length is not advanced.
  int32_t n_slots = 0;
  const int32_t* block_tables = nullptr;  // [n_slots][max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  int32_t* seq_lens = nullptr;  // tokens in the cache before the step; +1 after it
  const uint8_t* active = nullptr;

  int32_t n_heads = 0;
  const float* q = nullptr;
  const float* k_new = nullptr;
  const float* v_new = nullptr;
  float* out = nullptr;
  // When set, the output rows are also quantized to int8 blocks of 32 as
  // quantize_activations_q8 lays them out (matmul.h: codes [n_slots][n_heads * head_dim],
  // then (d, d * sum of codes) per block), for the output projection's int8 product.
  int8_t* out_codes = nullptr;
  void* out_scales = nullptr;  // float2 [n_slots * n_heads * head_dim / 32]
  // When set, the output rows are also written as bf16 (each f32 value rounded to nearest
  // even, out's layout) for the output projection over its kept bf16 copy; out may then be
  // null.
  uint16_t* out_bf16 = nullptr;
  float scale = 0.0f;  // usually 1 / sqrt(head_dim)
  // Whether this step's k_new / v_new are already in the cache (the RoPE pass stored them):
  // no scatter kernel.
  bool kv_stored = false;
  // > 0: a sliding window; the query at position pos sees [pos - window + 1, pos] only.
  int32_t window = 0;
  // > 0: each score s (q·k * scale) becomes softcap * tanh(s / softcap) (Gemma 2).
  float softcap = 0.0f;

  // Upper bound of (seq_len + 1) over the live slots; sizes the split-K grid. 0 means the
  // block-table capacity (max_blocks_per_seq * block_size), which suits a captured graph.
  int32_t max_context = 0;

  // Positions per split when > 0 (a multiple of kDecodeTile): the same splits whatever the
  // batch, for batch-invariant results. 0: each slot sizes its own (decode_splits).
  int32_t fixed_split_len = 0;
  // Whether every position before a slot's own (seq_lens[s]) was stored before the kernel
  // before this call ran, and the lengths and block tables were uploaded before the step (a
  // step of one token per sequence): the tensor-core kernel then requests a warp's first
  // rows before it waits on the kernel before it. False when a slot's earlier positions may
  // be stored in the same step (the tokens of a prompt chunk as slots).
  bool prior_rows_settled = false;
  // Whether the call advances seq_lens by one (a decode step); false when the caller keeps
  // the lengths itself (every token of a step as a slot at its own position).
  bool advance_lengths = true;
  // Multiprocessors of the GPU (device_multiprocessors()); the split sizing fills them. The
  // host twin, which has no device, keeps an H200's count.
  int32_t multiprocessors = 132;
};

// Why the CUDA attention kernels cannot read a cache of this layout ("" when they can): its
// elements are F16, BF16 or Q8_0 rows (head_dim a multiple of 32), K and V of one type.
inline std::string cuda_kv_layout_problem(const KvCacheLayout& l) {
  if (l.v_type >= 0 && l.v_type != (int8_t)l.dtype)
    return std::string("K and V of different types (") + kv_dtype_name(l.dtype) + ", " +
           kv_dtype_name((KvDType)l.v_type) + ")";
  if (l.dtype == KvDType::Q4_0) return "a q4_0 cache (f16, bf16 and q8_0 only)";
  if (l.dtype == KvDType::Q8_0 && l.head_dim % kKvQuantBlock != 0)
    return "a q8_0 cache with head_dim " + std::to_string(l.head_dim) + " (a multiple of 32)";
  return {};
}

// A score after the soft-cap (unchanged when it is off).
HABLAR_KV_HD inline float decode_softcap(const DecodeAttentionParams& p, float score) {
  return p.softcap > 0.0f ? p.softcap * tanhf(score / p.softcap) : score;
}

// The first position the query at `pos` sees.
HABLAR_KV_HD inline int32_t decode_first_position(const DecodeAttentionParams& p, int32_t pos) {
  return p.window > 0 && pos >= p.window ? pos - p.window + 1 : 0;
}

inline int32_t decode_max_context(const DecodeAttentionParams& p) {
  const int32_t capacity = p.max_blocks_per_seq * p.layout.block_size;
  return p.max_context > 0 && p.max_context < capacity ? p.max_context : capacity;
}

// The tensor-core kernel (head_dim 64 or 128; HABLAR_DECODE_KERNEL=0 selects the CUDA-core
// kernel for the lab) walks a split in sub-tiles of kDecodeMmaSubTile positions, warp w
// taking sub-tiles w, w + kDecodeWarps, ...; the host twin follows whichever kernel runs.
inline constexpr int kDecodeMmaSubTile = 16;
// Soft-capped scores take the CUDA-core kernel (the tensor-core one has no soft-cap).
inline bool decode_uses_mma(const DecodeAttentionParams& p) {
  return (p.layout.head_dim == 64 || p.layout.head_dim == 128) && p.softcap == 0.0f &&
         lab_knob("HABLAR_DECODE_KERNEL", 1) != 0;
}

// How a call splits its slots' positions ("flash decoding"): a block of the attention grid
// (n_kv_heads, n_slots, grid) takes one split of one slot's positions for one KV head.
// Either every split has fixed_len positions (batch-invariant results: fixed_split_len), or
// each slot sizes its own splits from its own context (decode_slot_split_len), in the
// kernel, so that a graph captured for a long capacity still gives a short context short
// splits: at most per_slot splits a (slot, KV head), of 64 to 1,024 positions in steps of
// 64 (whole 16-position sub-tiles for each of the tensor-core kernel's four warps, whole
// 32-position tiles for the CUDA-core kernel).
struct DecodeSplits {
  int32_t fixed_len = 0;  // > 0: every split's length
  int32_t per_slot = 1;   // splits wanted per (slot, KV head), when fixed_len == 0
  int32_t grid = 1;       // splits in the grid: no slot has more
};

inline constexpr int32_t kDecodeMinSplit = 64;
inline constexpr int32_t kDecodeMaxSplit = 1024;

// Positions per split of a slot whose context (positions it attends over, its own included)
// is `context`: the context over per_slot splits, rounded up to a multiple of 64, within
// [64, 1024]. Never more than per_slot splits, and never decreasing as the context grows.
HABLAR_KV_HD inline int32_t decode_slot_split_len(const DecodeSplits& s, int32_t context) {
  if (s.fixed_len > 0) return s.fixed_len;
  const int32_t even = (context + s.per_slot - 1) / s.per_slot;
  const int32_t len = (even + kDecodeMinSplit - 1) / kDecodeMinSplit * kDecodeMinSplit;
  return len < kDecodeMinSplit ? kDecodeMinSplit : len > kDecodeMaxSplit ? kDecodeMaxSplit : len;
}

// The splits a slot of `context` positions takes (at most s.grid for any context up to the
// call's decode_max_context).
HABLAR_KV_HD inline int32_t decode_slot_splits(const DecodeSplits& s, int32_t context) {
  const int32_t len = decode_slot_split_len(s, context);
  return (context + len - 1) / len;
}

// The call's splits. The split count per (slot, KV head) is the block target (blocks per
// multiprocessor times multiprocessors) over the grid's slots x KV heads: one wave of the
// tensor-core kernel (two resident blocks a multiprocessor: at 1 x 32k positions and 2 KV
// heads, 126 splits of 256 took 25 us where 251 of 128, two waves, took 32 us), and 64 a
// multiprocessor for the CUDA-core kernel, whose blocks are small (docs/CUDA.md). The target
// is a lab knob (HABLAR_DECODE_BLOCKS_PER_SM); the host twin sizes its splits the same way.
// The grid bound: a slot's count is at most per_slot unless its splits are 1,024 long
// (then at most the capacity over 1,024), and at most its context over 64.
// The per-slot sizing for `target_blocks` over `rows` (slots x KV heads) and a longest
// context of `context` positions (also the workspace bound's, forward_ops.cu).
inline DecodeSplits decode_splits_for(int64_t target_blocks, int64_t rows, int32_t context) {
  DecodeSplits s;
  s.per_slot = (int32_t)std::clamp<int64_t>(target_blocks / std::max<int64_t>(1, rows), 1, 1 << 20);
  const int32_t by_floor = (context + kDecodeMinSplit - 1) / kDecodeMinSplit;
  const int32_t by_ceiling = (context + kDecodeMaxSplit - 1) / kDecodeMaxSplit;
  s.grid = std::max({1, by_ceiling, std::min(s.per_slot, by_floor)});
  return s;
}

inline DecodeSplits decode_splits(const DecodeAttentionParams& p) {
  const int32_t context = decode_max_context(p);
  if (p.fixed_split_len > 0) {
    DecodeSplits s;
    s.fixed_len = p.fixed_split_len;
    s.grid = std::max<int32_t>(1, (context + s.fixed_len - 1) / s.fixed_len);
    return s;
  }
  const int64_t target_blocks =
      (int64_t)lab_knob("HABLAR_DECODE_BLOCKS_PER_SM", decode_uses_mma(p) ? 2 : 64) *
      p.multiprocessors;
  return decode_splits_for(target_blocks, (int64_t)p.n_slots * p.layout.n_kv_heads, context);
}

// The context a captured decode graph is sized for (its max_context): the smallest of
// 1,024 x 4^k positions that holds the step's longest context, or the capacity. Sized for the
// capacity, a graph launches a capacity-long context's splits for every slot, and in a step
// of short contexts most of those blocks find no positions and exit: for 256 slots of 2 KV
// heads under a 32k-position capacity, 16,384 blocks a layer of which 512 attend. The executor
// keeps a graph per (batch bucket, context bound); a slot's splits and merges depend on its
// own context alone (decode_slot_split_len, decode_reduce_runs), so every bound gives the
// same bits.
inline int32_t decode_graph_context_bound(int32_t context, int32_t capacity) {
  int64_t bound = 1024;
  while (bound < context && bound < capacity) bound *= 4;
  return (int32_t)std::min<int64_t>(bound, capacity);
}

inline int32_t decode_num_splits(const DecodeAttentionParams& p) {
  return decode_splits(p).grid;
}

// The split reduce's parallel runs. One (slot, head) block of the reduce is `parts` groups
// of head_dim threads; group r merges a contiguous run of the splits in order
// (decode_reduce_runs of them, by the slot's split count) and group 0 then merges the runs
// in order. A single group walking n splits waits out n dependent
// merges (two exponentials each, about 40 cycles): 256 splits (a 2-KV-head model at 1 x 32k
// positions) took several microseconds alone. Runs of at least kDecodeSplitsPerReduceRun
// splits, at most kDecodeMaxReduceParts of them and 1024 threads in all; the lab's
// HABLAR_DECODE_REDUCE_PARTS caps the runs (1: one group, the sequential reduce). The groups
// are enough for any slot the grid holds (a power of two at least its splits over 16, within
// the cap), so a slot's runs, and the order of its merges, depend on its own split count
// alone (decode_reduce_runs): a captured graph, sized for the capacity, merges as a call
// sized for the step does, and batch-invariant wherever the splits are (fixed_split_len).
inline constexpr int kDecodeMaxReduceParts = 8;
inline constexpr int kDecodeReduceMaxThreads = 1024;
inline constexpr int kDecodeSplitsPerReduceRun = 16;

inline int32_t decode_reduce_parts(const DecodeAttentionParams& p) {
  const int32_t cap =
      std::min<int32_t>({(int32_t)lab_knob("HABLAR_DECODE_REDUCE_PARTS", kDecodeMaxReduceParts),
                         kDecodeMaxReduceParts, kDecodeReduceMaxThreads / p.layout.head_dim});
  const int32_t runs =
      (decode_num_splits(p) + kDecodeSplitsPerReduceRun - 1) / kDecodeSplitsPerReduceRun;
  int32_t parts = 1;
  while (parts * 2 <= cap && parts < runs) parts *= 2;
  return parts;
}

// Runs a (slot, head) of the reduce takes for its `count` splits: one per
// kDecodeSplitsPerReduceRun splits, between 1 and `parts` (a short context keeps the one
// sequential run: no shared-memory merge).
HABLAR_KV_HD inline int32_t decode_reduce_runs(int32_t parts, int32_t count) {
  const int32_t runs = (count + kDecodeSplitsPerReduceRun - 1) / kDecodeSplitsPerReduceRun;
  return runs < 1 ? 1 : runs > parts ? parts : runs;
}

// Run `run` of `runs` over the splits [first, n_valid): contiguous, in order, as even as the
// count allows (the last runs may be shorter or empty).
struct DecodeReduceRange {
  int32_t begin, end;
};
HABLAR_KV_HD inline DecodeReduceRange decode_reduce_run_range(int32_t first, int32_t n_valid,
                                                              int32_t runs, int32_t run) {
  const int32_t count = n_valid > first ? n_valid - first : 0;
  const int32_t per_run = (count + runs - 1) / runs;
  const int32_t begin = first + run * per_run;
  const int32_t end = begin + per_run < n_valid ? begin + per_run : n_valid;
  return {begin, end > begin ? end : begin};
}

// Positions per tile of the decode kernel: each tile's scores form one softmax state that
// is merged into the running state. The host twin walks the same tiles so that it merges
// in the same order as the GPU. Split lengths are multiples of it.
inline constexpr int kDecodeWarps = 4;
inline constexpr int kDecodeTile = 32;

// Workspace of one decode call: per (slot, head, split) a partial state (max, sum) and an
// unnormalized accumulator of head_dim floats.
inline size_t decode_attention_workspace_bytes(const DecodeAttentionParams& p) {
  return (size_t)p.n_slots * (size_t)p.n_heads * (size_t)decode_num_splits(p) *
         (size_t)(p.layout.head_dim + 2) * sizeof(float);
}

}  // namespace hablar::cuda
