// What the decode attention's two files share (attention_decode.cu: scatter, the CUDA-core
// kernel, reduce and the entry point; attention_decode_mma.cu: the tensor-core kernel): the
// split ranges and the tensor-core kernel's launch.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/decode_attention_params.h"
#include "backend/cuda/online_softmax.h"

namespace hablar::cuda {

__device__ __forceinline__ int decode_context(const DecodeAttentionParams& p, int slot) {
  const int capacity = p.max_blocks_per_seq * p.layout.block_size;
  return min(p.seq_lens[slot] + 1, capacity);
}

// The positions [begin, end) that split `split` of slot `slot` attends to (the slot's own
// split length, decode_slot_split_len); empty (begin >= end) when the slot is done, its
// context ends before the split or its window begins after it.
struct SplitRange {
  int begin, end;
};
__device__ __forceinline__ SplitRange split_range(const DecodeAttentionParams& p, int slot,
                                                  int split, const DecodeSplits& splits) {
  if (!p.active[slot]) return {0, 0};
  const int context = decode_context(p, slot);
  const int split_len = decode_slot_split_len(splits, context);
  const int begin = split * split_len;
  return {max(begin, decode_first_position(p, p.seq_lens[slot])), min(begin + split_len, context)};
}

// One step of the split reduce: split (its state and its value of one dimension) merged into
// the running (total, merged), returning the new merged value. The reduce kernel's step, and
// the tensor-core kernel's finish of a one-split call: the same arithmetic, the same bits.
__device__ __forceinline__ float merge_split(SoftmaxState& total, float merged,
                                             const SoftmaxState& split, float value) {
  const SoftmaxMerge m = softmax_merge(total, split);
  return merged * m.factor_a + value * m.factor_b;
}

// Whether the tensor-core kernel finishes the heads itself (normalized outputs, no partials and
// no reduce): one split per slot (many slots, or short contexts on a graph's bound) and no int8
// output rows, which the reduce's warps quantize.
inline bool decode_finishes_in_attention(const DecodeAttentionParams& p,
                                         const DecodeSplits& splits) {
  return decode_uses_mma(p) && splits.grid == 1 && p.out_codes == nullptr;
}

// The tensor-core attention kernel (decode_uses_mma(p): head_dim 64 or 128, no soft-cap) on
// grid (n_kv_heads, n_slots, splits.grid), writing one partial per (slot, head, split), or
// the outputs themselves where decode_finishes_in_attention.
void launch_decode_attention_mma(const DecodeAttentionParams& p, const DecodeSplits& splits,
                                 float* workspace, cudaStream_t stream);

}  // namespace hablar::cuda
