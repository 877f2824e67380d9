// The host twin of the CUDA decode-step attention: the same step (scatter this step's K/V,
// then attend over prior + 1 positions, split-K with a reduce, advance the lengths) built on
// the same online-softmax functions (online_softmax.h), walking positions in the kernel's
// split / tile / warp order (the tensor-core kernel's for head_dim 64 and 128, else the CUDA-core
// kernel's). It builds with g++ alone, so CI, which has no GPU, runs the
// decode-wiring oracle against the very algorithm the GPU runs. All pointers are host
// pointers here. (A one-split call that the GPU finishes in its attention kernel,
// decode_finishes_in_attention, runs the reduce's arithmetic there: this reduce stands for it.)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cuda/decode_attention_params.h"
#include "backend/cuda/online_softmax.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/kv_rows.h"

namespace hablar::cuda {

namespace host_twin {

// Dimension d of the head row at unit offset `row`, as the kernels read it (Q8_0: code * d
// rounded to f16, kv_q8_load8).
inline float load_kv(const DecodeAttentionParams& p, size_t row, int d) {
  const uint16_t* at = static_cast<const uint16_t*>(p.kv_cache) + row;
  switch (p.layout.dtype) {
    case KvDType::F16:
      return fp16_to_f32(at[d]);
    case KvDType::BF16:
      return bf16_to_f32(at[d]);
    default:
      return kv_q8_0_value_as_f16(reinterpret_cast<const BlockQ8_0*>(at)[d / kQK], d % kQK);
  }
}

// Scatter: this step's K and V of every live slot into the cache at position seq_lens[s].
inline void scatter(const DecodeAttentionParams& p) {
  const int d_head = p.layout.head_dim;
  for (int s = 0; s < p.n_slots; ++s) {
    if (!p.active[s]) continue;
    const int32_t pos = p.seq_lens[s];
    if (pos >= p.max_blocks_per_seq * p.layout.block_size) continue;
    const int32_t* table = p.block_tables + (size_t)s * p.max_blocks_per_seq;
    for (int kvh = 0; kvh < p.layout.n_kv_heads; ++kvh) {
      const size_t src = ((size_t)s * p.layout.n_kv_heads + kvh) * d_head;
      for (int kv = 0; kv < 2; ++kv) {
        const float* from = kv == 0 ? p.k_new : p.v_new;
        kv_store_row(static_cast<uint16_t*>(p.kv_cache) +
                         p.layout.position_offset(table, p.layer, kv, kvh, pos),
                     from + src, d_head, p.layout.dtype);
      }
    }
  }
}

// The softmax state of one tile of scores as the kernel's warp forms it: lane l pushes
// scores l, l + 32, ... (online, with rescale), then lanes merge in a butterfly (offsets 16,
// 8, 4, 2, 1, each lane merging its partner into itself); lane 0's state is the result.
inline SoftmaxState tile_state(const float* scores, int n) {
  SoftmaxState lanes[32], next[32];
  float unused = 0.0f;
  for (int l = 0; l < 32; ++l) {
    lanes[l] = softmax_empty();
    for (int i = l; i < n; i += 32) softmax_push(lanes[l], scores[i], &unused);
  }
  for (int off = 16; off > 0; off /= 2) {
    for (int l = 0; l < 32; ++l) {
      next[l] = lanes[l];
      softmax_merge(next[l], lanes[l ^ off]);
    }
    for (int l = 0; l < 32; ++l) lanes[l] = next[l];
  }
  return lanes[0];
}

// Scores of positions [t0, t0 + n) for one query head.
inline void tile_scores(const DecodeAttentionParams& p, const int32_t* table, const float* q,
                        int kvh, int t0, int n, float* scores) {
  const int d_head = p.layout.head_dim;
  for (int i = 0; i < n; ++i) {
    const size_t k_at = p.layout.position_offset(table, p.layer, 0, kvh, t0 + i);
    float score = 0.0f;
    for (int d = 0; d < d_head; ++d) score += q[d] * p.scale * load_kv(p, k_at, d);
    scores[i] = decode_softcap(p, score);
  }
}

// acc = acc * factor + sum_i weight_i * v(t0 + i).
inline void rescale_and_add_values(const DecodeAttentionParams& p, const int32_t* table, int kvh,
                                   int t0, int n, const float* weights, float factor, float* acc) {
  const int d_head = p.layout.head_dim;
  for (int d = 0; d < d_head; ++d) acc[d] *= factor;
  for (int i = 0; i < n; ++i) {
    const size_t v_at = p.layout.position_offset(table, p.layer, 1, kvh, t0 + i);
    for (int d = 0; d < d_head; ++d) acc[d] += weights[i] * load_kv(p, v_at, d);
  }
}

// Partial attention of one query head over positions [begin, end), walked as the CUDA-core
// kernel does: tiles of kDecodeTile positions, each a softmax state (tile_state) merged into
// the running state, its weights scaled by the merge's factor before P·V.
inline SoftmaxState attend_split_tiles(const DecodeAttentionParams& p, const int32_t* table,
                                       const float* q, int kvh, int begin, int end, float* acc) {
  SoftmaxState total = softmax_empty();
  std::vector<float> scores(kDecodeTile), weights(kDecodeTile);
  for (int d = 0; d < p.layout.head_dim; ++d) acc[d] = 0.0f;
  for (int t0 = begin; t0 < end; t0 += kDecodeTile) {
    const int n = end - t0 < kDecodeTile ? end - t0 : kDecodeTile;
    tile_scores(p, table, q, kvh, t0, n, scores.data());
    const SoftmaxState tile = tile_state(scores.data(), n);
    const SoftmaxMerge merge = softmax_merge(total, tile);
    for (int i = 0; i < n; ++i) weights[i] = softmax_exp(scores[i] - tile.max) * merge.factor_b;
    rescale_and_add_values(p, table, kvh, t0, n, weights.data(), merge.factor_a, acc);
  }
  return total;
}

// The softmax state of one 16-position sub-tile as the tensor-core kernel's four lanes of a
// head form it: lane t pushes the scores of positions 2t, 2t + 1, 2t + 8, 2t + 9 (those
// inside the split), then the lanes merge in a butterfly (offsets 1, 2); lane 0's state.
inline SoftmaxState quad_state(const float* scores, int n) {
  SoftmaxState lanes[4], next[4];
  float unused = 0.0f;
  for (int t = 0; t < 4; ++t) {
    lanes[t] = softmax_empty();
    for (int i : {2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9})
      if (i < n) softmax_push(lanes[t], scores[i], &unused);
  }
  for (int off = 1; off < 4; off *= 2) {
    for (int t = 0; t < 4; ++t) {
      next[t] = lanes[t];
      softmax_merge(next[t], lanes[t ^ off]);
    }
    for (int t = 0; t < 4; ++t) lanes[t] = next[t];
  }
  return lanes[0];
}

// Partial attention over [begin, end) as the tensor-core kernel walks it: warp w takes the
// sub-tiles of kDecodeMmaSubTile positions w, w + kDecodeWarps, ... with its own running
// state; the block then merges warps 0, 1, 2, 3 in order, starting from warp 0's state.
inline SoftmaxState attend_split_warps(const DecodeAttentionParams& p, const int32_t* table,
                                       const float* q, int kvh, int begin, int end, float* acc) {
  constexpr int kSub = kDecodeMmaSubTile;
  const int d_head = p.layout.head_dim;
  std::vector<float> scores(kSub), weights(kSub), warp_acc(d_head);
  SoftmaxState total = softmax_empty();
  for (int w = 0; w < kDecodeWarps; ++w) {
    SoftmaxState state = softmax_empty();
    for (int d = 0; d < d_head; ++d) warp_acc[d] = 0.0f;
    for (int t0 = begin + kSub * w; t0 < end; t0 += kSub * kDecodeWarps) {
      const int n = end - t0 < kSub ? end - t0 : kSub;
      tile_scores(p, table, q, kvh, t0, n, scores.data());
      const SoftmaxState tile = quad_state(scores.data(), n);
      const SoftmaxMerge merge = softmax_merge(state, tile);
      for (int i = 0; i < n; ++i) weights[i] = softmax_exp(scores[i] - tile.max) * merge.factor_b;
      rescale_and_add_values(p, table, kvh, t0, n, weights.data(), merge.factor_a, warp_acc.data());
    }
    if (w == 0) {
      total = state;
      for (int d = 0; d < d_head; ++d) acc[d] = warp_acc[d];
    } else {
      const SoftmaxMerge merge = softmax_merge(total, state);
      for (int d = 0; d < d_head; ++d)
        acc[d] = acc[d] * merge.factor_a + warp_acc[d] * merge.factor_b;
    }
  }
  return total;
}

inline SoftmaxState attend_split(const DecodeAttentionParams& p, const int32_t* table,
                                 const float* q, int kvh, int begin, int end, float* acc) {
  return decode_uses_mma(p) ? attend_split_warps(p, table, q, kvh, begin, end, acc)
                            : attend_split_tiles(p, table, q, kvh, begin, end, acc);
}

}  // namespace host_twin

// The whole decode step on the host; same contract as decode_attention() in attention.h.
inline void decode_attention_host(const DecodeAttentionParams& p) {
  HABLAR_CHECK(p.n_heads % p.layout.n_kv_heads == 0, "n_heads must be a multiple of n_kv_heads");
  HABLAR_CHECK(cuda_kv_layout_problem(p.layout).empty(), "a cache the CUDA attention cannot read");
  if (!p.kv_stored) host_twin::scatter(p);
  const int d_head = p.layout.head_dim;
  const int group = p.n_heads / p.layout.n_kv_heads;
  const DecodeSplits splits = decode_splits(p);
  const int parts = decode_reduce_parts(p);
  const int capacity = p.max_blocks_per_seq * p.layout.block_size;
  std::vector<float> acc_split(d_head), acc_run(d_head), acc(d_head);
  for (int s = 0; s < p.n_slots; ++s) {
    if (!p.active[s]) continue;
    const int32_t* table = p.block_tables + (size_t)s * p.max_blocks_per_seq;
    const int context = p.seq_lens[s] + 1 < capacity ? p.seq_lens[s] + 1 : capacity;
    const int first = decode_first_position(p, p.seq_lens[s]);
    const int split_len = decode_slot_split_len(splits, context);  // the slot's own
    const int n_valid = std::min(splits.grid, (context + split_len - 1) / split_len);
    for (int h = 0; h < p.n_heads; ++h) {
      const float* q = p.q + ((size_t)s * p.n_heads + h) * d_head;
      // The reduce's order: each run of splits merged in order, then the runs in order.
      SoftmaxState total = softmax_empty();
      for (int d = 0; d < d_head; ++d) acc[d] = 0.0f;
      const int runs = decode_reduce_runs(parts, n_valid - first / split_len);
      for (int r = 0; r < runs; ++r) {
        const DecodeReduceRange run = decode_reduce_run_range(first / split_len, n_valid, runs, r);
        SoftmaxState run_state = softmax_empty();
        for (int d = 0; d < d_head; ++d) acc_run[d] = 0.0f;
        for (int split = run.begin; split < run.end; ++split) {
          const int begin = split * split_len;
          const int end = begin + split_len < context ? begin + split_len : context;
          const SoftmaxState state = host_twin::attend_split(
              p, table, q, h / group, std::max(begin, first), end, acc_split.data());
          const SoftmaxMerge merge = softmax_merge(run_state, state);
          for (int d = 0; d < d_head; ++d)
            acc_run[d] = acc_run[d] * merge.factor_a + acc_split[d] * merge.factor_b;
        }
        const SoftmaxMerge merge = softmax_merge(total, run_state);
        for (int d = 0; d < d_head; ++d)
          acc[d] = acc[d] * merge.factor_a + acc_run[d] * merge.factor_b;
      }
      const float inv = softmax_inverse_sum(total);
      float* out = p.out + ((size_t)s * p.n_heads + h) * d_head;
      for (int d = 0; d < d_head; ++d) out[d] = acc[d] * inv;
    }
  }
  for (int s = 0; s < p.n_slots; ++s)
    if (p.active[s]) p.seq_lens[s] += 1;
}

}  // namespace hablar::cuda
