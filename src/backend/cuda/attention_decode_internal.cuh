// What the decode attention's two files share (attention_decode.cu: scatter, the CUDA-core
// kernel, reduce and the entry point; attention_decode_mma.cu: the tensor-core kernel): the
// split ranges and the tensor-core kernel's launch.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/decode_attention_params.h"

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

// The tensor-core attention kernel (decode_uses_mma(p): head_dim 64 or 128, no soft-cap) on
// grid (n_kv_heads, n_slots, splits.grid), writing one partial per (slot, head, split).
void launch_decode_attention_mma(const DecodeAttentionParams& p, const DecodeSplits& splits,
                                 float* workspace, cudaStream_t stream);

}  // namespace hablar::cuda
