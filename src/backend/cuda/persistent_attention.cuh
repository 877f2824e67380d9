// The attention phase of the persistent decode step (persistent_step.h), for its one token at
// position pos of one sequence: head_dim 64 or 128, F16 cache, no window nor soft-cap.
//
// Work items are (KV head, split) pairs, one warp each: the context [0, pos] is cut into
// splits of whole 32-position tiles, as many as the grid's warps allow per KV head (at most
// kPersistentMaxSplits). A warp
//   - takes its group's queries (q + bias, then RoPE: forward_ops.cu's row work, the same
//     arithmetic) into its shared region, [group][head_dim] floats;
//   - if its split holds pos, first stores this token's key (k + bias, RoPE) and value
//     (v + bias) there in the cache, rounded to F16 as the row work would;
//   - per tile: lane j scores position t0 + j against each query of the group (f32 sums over
//     the F16 key), one online-softmax update per head (max and sum across the warp), and
//     P·V with lane l holding dimensions [l * per_lane, (l + 1) * per_lane);
//   - writes (m, l, o) of each head to the partials; the warp that finishes a KV head's last
//     split merges its splits, writes the heads' output rows and their int8 blocks of 32
//     (quantize_block32's rounding), and resets the count for the next layer.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kv_elements.cuh"
#include "backend/cuda/persistent_products.cuh"
#include "backend/cuda/persistent_step.h"

namespace hablar::cuda {

// A warp's region during attention: its K and V tiles ([16][head_dim] halves each), then
// its group's queries ([group][head_dim] floats, at most 4 KB).
inline constexpr size_t kQueryOffset = 8192;
static_assert(kQueryOffset + kPersistentMaxGroup * 128 * sizeof(float) <= kPersistentWarpRegion,
              "the queries fit the region after the tiles");

// Element i of head h's row after bias and RoPE, for the rotated pair (a, b) = i's pair.
struct RopedPair {
  float first, second;
};
__device__ __forceinline__ RopedPair rope_pair(const float* row, const float* bias, int a, int b,
                                               float c, float s) {
  float x0 = __ldcg(row + a), x1 = __ldcg(row + b);
  if (bias != nullptr) x0 += __ldg(bias + a), x1 += __ldg(bias + b);
  return {fmaf(x0, c, -(x1 * s)), fmaf(x0, s, x1 * c)};
}

// Calls put(d, value) for every dimension of one head's row after bias and RoPE (variant <
// 0: bias only), the warp's lanes sharing the dimensions.
template <typename Put>
__device__ __forceinline__ void roped_head(const PersistentStepContext& ctx, int variant,
                                           const float* row, const float* bias, Put&& put) {
  const int lane = threadIdx.x % 32, hd = ctx.head_dim;
  int plain_from = 0;
  if (variant >= 0) {
    const int half = ctx.rope_pairs;
    const bool neox = ctx.rope_neox[variant];
    for (int i = lane; i < half; i += 32) {
      const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
      const RopedPair y = rope_pair(row, bias, a, b, __ldg(ctx.rope_cos[variant] + i),
                                    __ldg(ctx.rope_sin[variant] + i));
      put(a, y.first), put(b, y.second);
    }
    plain_from = 2 * half;
  }
  for (int d = plain_from + lane; d < hd; d += 32)
    put(d, bias != nullptr ? __ldcg(row + d) + __ldg(bias + d) : __ldcg(row + d));
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// The group's queries (q + bias, then RoPE) into q_s [kGroup][kDim] floats.
template <int kDim, int kGroup>
__device__ __forceinline__ void group_queries(const PersistentPhase& ph,
                                              const PersistentStepContext& ctx, int kvh,
                                              float* q_s) {
  constexpr int kPer = kDim / 32;
  const int lane = threadIdx.x % 32, variant = ph.rope_variant;
  if (variant >= 0 && ctx.rope_neox[variant] && 2 * ctx.rope_pairs == kDim) {
    // NeoX over whole heads: lane l's pairs are (l + 32 e, l + 32 e + kDim / 2), e < kPer / 2,
    // so every load of the group's queries goes out before any is used.
    float x[kGroup][kPer];
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const size_t at = (size_t)(kvh * kGroup + g) * kDim;
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        const int d = lane + 32 * e;
        x[g][e] = __ldcg(ph.q + at + d);
        if (ph.bq != nullptr) x[g][e] += __ldg(ph.bq + at + d);
      }
    }
#pragma unroll
    for (int e = 0; e < kPer / 2; ++e) {
      const int i = lane + 32 * e;
      const float c = __ldg(ctx.rope_cos[variant] + i), sn = __ldg(ctx.rope_sin[variant] + i);
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const float x0 = x[g][e], x1 = x[g][e + kPer / 2];
        q_s[g * kDim + i] = fmaf(x0, c, -(x1 * sn));
        q_s[g * kDim + i + kDim / 2] = fmaf(x0, sn, x1 * c);
      }
    }
    return;
  }
#pragma unroll 1
  for (int g = 0; g < kGroup; ++g) {
    const int h = kvh * kGroup + g;
    roped_head(ctx, variant, ph.q + (size_t)h * kDim,
               ph.bq != nullptr ? ph.bq + (size_t)h * kDim : nullptr,
               [&](int d, float x) { q_s[g * kDim + d] = x; });
  }
}

// This token's key (k + bias, RoPE) and value (v + bias) of KV head kvh into the cache at
// position pos, rounded to F16 as the launch-per-op row work would.
template <int kDim>
__device__ __forceinline__ void store_token_kv(const PersistentPhase& ph,
                                               const PersistentStepContext& ctx, int kvh, int pos) {
  auto* cache = static_cast<uint16_t*>(ctx.kv_cache);
  const size_t k_at = ctx.layout.position_offset(ctx.block_table, ph.layer, 0, kvh, pos);
  const size_t v_at = ctx.layout.position_offset(ctx.block_table, ph.layer, 1, kvh, pos);
  roped_head(ctx, ph.rope_variant, ph.k + (size_t)kvh * kDim,
             ph.bk != nullptr ? ph.bk + (size_t)kvh * kDim : nullptr,
             [&](int d, float x) { cache[k_at + d] = kv_from_float<false>(x); });
  roped_head(ctx, -1, ph.v + (size_t)kvh * kDim,
             ph.bv != nullptr ? ph.bv + (size_t)kvh * kDim : nullptr,
             [&](int d, float x) { cache[v_at + d] = kv_from_float<false>(x); });
}

// A warp's running softmax state over one split for its group: per head the maximum m, the
// sum l and the unnormalized output o (lane l's kPer dimensions).
template <int kDim, int kGroup>
struct SplitState {
  static constexpr int kPer = kDim / 32;
  float m[kGroup], l[kGroup], o[kGroup][kPer];

  __device__ __forceinline__ void start() {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
      for (int e = 0; e < kPer; ++e) o[g][e] = 0.0f;
    }
  }

  // One tile of n positions from shared memory (k_s, v_s: [n][kDim] halves): scores (lanes j
  // and j + 16 take halves of position j's dimensions), one online-softmax update per head,
  // then P·V with rolled loops (a warp runs this once a layer: it must be short to fetch).
  __device__ __forceinline__ void add_tile(const uint16_t* k_s, const uint16_t* v_s,
                                           const float* q_s, int n, float scale) {
    const int lane = threadIdx.x % 32, j = lane % 16, part = lane / 16;
    float s[kGroup] = {};
    if (j < n) {
      const uint16_t* krow = k_s + j * kDim + part * (kDim / 2);
      const float* qh = q_s + part * (kDim / 2);
#pragma unroll 1
      for (int c = 0; c < kDim / 16; ++c) {
        float kf[8];
        kv_unpack8<false>(*reinterpret_cast<const uint4*>(krow + 8 * c), kf);
#pragma unroll
        for (int g = 0; g < kGroup; ++g) {
          const float* q = qh + g * kDim + 8 * c;
#pragma unroll
          for (int e = 0; e < 8; ++e) s[g] = fmaf(q[e], kf[e], s[g]);
        }
      }
    }
    const bool scored = j < n && part == 0;
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      s[g] += __shfl_xor_sync(0xffffffffu, s[g], 16);
      const float score = scored ? s[g] * scale : -INFINITY;
      const float m_new = fmaxf(m[g], warp_max(score));
      const float keep = expf(m[g] - m_new);  // 0 while m[g] is -inf
      const float pj = scored ? expf(score - m_new) : 0.0f;
      l[g] = l[g] * keep + warp_sum(pj);
      m[g] = m_new;
#pragma unroll
      for (int e = 0; e < kPer; ++e) o[g][e] *= keep;
      s[g] = pj;
    }
#pragma unroll 1
    for (int jj = 0; jj < n; ++jj) {
      float vf[kPer];
      const uint16_t* vrow = v_s + jj * kDim + lane * kPer;
      if constexpr (kPer == 4) {
        const uint2 raw = *reinterpret_cast<const uint2*>(vrow);
        const float2 x = kv_unpack2<false>(raw.x), y = kv_unpack2<false>(raw.y);
        vf[0] = x.x, vf[1] = x.y, vf[2] = y.x, vf[3] = y.y;
      } else {
        const float2 x = kv_unpack2<false>(*reinterpret_cast<const unsigned*>(vrow));
        vf[0] = x.x, vf[1] = x.y;
      }
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const float pj = __shfl_sync(0xffffffffu, s[g], jj);
#pragma unroll
        for (int e = 0; e < kPer; ++e) o[g][e] = fmaf(pj, vf[e], o[g][e]);
      }
    }
  }

  // (m, l, o) of each head of the group as split `split`'s partial.
  __device__ __forceinline__ void write(float* partials, int kvh, int split) const {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      float* part =
          partials + ((size_t)(kvh * kGroup + g) * kPersistentMaxSplits + split) * (kDim + 2);
      if (lane == 0) part[0] = m[g], part[1] = l[g];
#pragma unroll
      for (int e = 0; e < kPer; ++e) part[2 + lane * kPer + e] = o[g][e];
    }
  }
};

// One (KV head, split) item over positions [begin, end) at kDim = head_dim, for a group of
// kGroup query heads: tiles of up to 16 positions of one cache block, their K and V rows
// (contiguous in the cache) bulk-copied into the warp's region and summed from there.
template <int kDim, int kGroup>
__device__ void attention_item(const PersistentPhase& ph, const PersistentStepContext& ctx, int kvh,
                               int split, int begin, int end, int pos, float* partials,
                               uint8_t* region, persistent::WarpStream& ws) {
  float* q_s = reinterpret_cast<float*>(region + kQueryOffset);
  const int lane = threadIdx.x % 32;
  const KvCacheLayout& L = ctx.layout;
  const auto* cache = static_cast<const uint16_t*>(ctx.kv_cache);
  group_queries<kDim, kGroup>(ph, ctx, kvh, q_s);
  if (end == pos + 1) store_token_kv<kDim>(ph, ctx, kvh, pos);  // this split holds the token
  asm volatile("fence.proxy.async;" ::: "memory");  // the token's K/V stores, before the copies
  __syncwarp();  // the queries in shared memory, the token's key and value in the cache
  SplitState<kDim, kGroup> state;
  state.start();
  const int tile = min(16, L.block_size);
  uint16_t* k_s = reinterpret_cast<uint16_t*>(region);
  uint16_t* v_s = k_s + 16 * kDim;
#pragma unroll 1
  for (int t0 = begin; t0 < end; t0 += tile) {
    const int n = min(tile, end - t0);
    if (lane == 0) {
      const int block = __ldg(ctx.block_table + t0 / L.block_size), slot = t0 % L.block_size;
      const uint32_t bytes = (uint32_t)(n * kDim * 2);
      persistent::fence_before_bulk_copies();
      persistent::barrier_expect(&ws.bars[0], 2 * bytes);
      persistent::bulk_copy(k_s, cache + L.offset(ph.layer, 0, block, kvh, slot, 0), bytes,
                            &ws.bars[0]);
      persistent::bulk_copy(v_s, cache + L.offset(ph.layer, 1, block, kvh, slot, 0), bytes,
                            &ws.bars[0]);
    }
    persistent::wait_half(ws, 0);
    __syncwarp();
    state.add_tile(k_s, v_s, q_s, n, ph.scale);
    __syncwarp();  // the tiles are read before the next copies land there
  }
  state.write(partials, kvh, split);
}

// The splits of KV head kvh merged into each of its query heads' output row, written as f32
// and as int8 blocks of 32 (d = max |x| / 127, codes rounded to nearest, (d, d * sum)).
template <int kDim, int kGroup>
__device__ void merge_splits(const PersistentPhase& ph, int kvh, int n_splits,
                             const float* partials, int8_t* codes, float2* scales) {
  constexpr int group = kGroup;
  constexpr int kPer = kDim / 32, kLanesPerBlock = 32 / kPer;
  const int lane = threadIdx.x % 32;
  // Lane s holds split s's (m, l) of every head of the group: all loaded at once (n_splits
  // <= 32), the maximum and the weighted sum by shuffles; then each lane's dimensions of
  // the accumulators, a split's loads issued ahead of its use.
  float m_s[kGroup], l_s[kGroup];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    m_s[g] = -INFINITY, l_s[g] = 0.0f;
    if (lane >= n_splits) continue;
    const float* ps =
        partials + ((size_t)(kvh * group + g) * kPersistentMaxSplits + lane) * (kDim + 2);
    m_s[g] = __ldcg(ps), l_s[g] = __ldcg(ps + 1);
  }
#pragma unroll 1
  for (int g = 0; g < group; ++g) {
    const int h = kvh * group + g;
    const float* part = partials + (size_t)h * kPersistentMaxSplits * (kDim + 2);
    const float top = warp_max(m_s[g]);
    const float w_lane = lane < n_splits ? expf(m_s[g] - top) : 0.0f;
    const float sum = warp_sum(l_s[g] * w_lane);
    float acc[kPer] = {};
#pragma unroll 4
#pragma unroll 1
    for (int s = 0; s < n_splits; ++s) {
      const float w = __shfl_sync(0xffffffffu, w_lane, s);
      const float* ps = part + (size_t)s * (kDim + 2) + 2 + lane * kPer;
#pragma unroll
      for (int e = 0; e < kPer; ++e) acc[e] = fmaf(__ldcg(ps + e), w, acc[e]);
    }
    float amax = 0.0f, x[kPer];
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      x[e] = acc[e] / sum;
      ph.out[(size_t)h * kDim + lane * kPer + e] = x[e];
      amax = fmaxf(amax, fabsf(x[e]));
    }
    for (int off = 1; off < kLanesPerBlock; off *= 2)
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const float d = amax / 127.0f;
    int total = 0;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int q = d > 0.0f ? __float2int_rn(x[e] / d) : 0;
      codes[(size_t)h * kDim + lane * kPer + e] = (int8_t)q;
      total += q;
    }
    for (int off = 1; off < kLanesPerBlock; off *= 2)
      total += __shfl_xor_sync(0xffffffffu, total, off);
    if (lane % kLanesPerBlock == 0)
      scales[((size_t)h * kDim + lane * kPer) / 32] = make_float2(d, d * (float)total);
  }
}

template <int kDim, int kGroup>
__device__ __noinline__ void attention_phase(const PersistentPhase& ph,
                                             const PersistentStepContext& ctx, float* partials,
                                             unsigned* done, int8_t* codes, float2* scales,
                                             uint8_t* region, persistent::WarpStream& ws) {
  const int lane = threadIdx.x % 32;
  const int pos = *ctx.position, context = pos + 1;
  const int warps = gridDim.x * (blockDim.x / 32);
  const int tiles = (context + 31) / 32;
  const int max_splits = max(1, min(kPersistentMaxSplits, warps / ctx.n_kv_heads));
  const int split_len = 32 * ((tiles + max_splits - 1) / max_splits);
  const int n_splits = (context + split_len - 1) / split_len;
#pragma unroll 1
  for (int item = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
       item < ctx.n_kv_heads * n_splits; item += warps) {
    const int kvh = item / n_splits, split = item % n_splits;
    const int begin = split * split_len, end = min(begin + split_len, context);
    attention_item<kDim, kGroup>(ph, ctx, kvh, split, begin, end, pos, partials, region, ws);
    __threadfence();  // the partials before the count that announces them
    __syncwarp();
    unsigned before = 0;
    if (lane == 0) before = atomicAdd(done + kvh, 1u);
    before = __shfl_sync(0xffffffffu, before, 0);
    if (before + 1 == (unsigned)n_splits) {  // the last split of this KV head: merge
      __threadfence();
      merge_splits<kDim, kGroup>(ph, kvh, n_splits, partials, codes, scales);
      if (lane == 0) atomicExch(done + kvh, 0u);
    }
  }
}

// The instance for the model's head size and group (query heads per KV head): only that
// one's code is fetched.
template <int kDim, int kGroup = 1>
__device__ __forceinline__ void attention_for_group(const PersistentPhase& ph,
                                                    const PersistentStepContext& ctx,
                                                    float* partials, unsigned* done, int8_t* codes,
                                                    float2* scales, uint8_t* region,
                                                    persistent::WarpStream& ws, int group) {
  if constexpr (kGroup < kPersistentMaxGroup)
    if (group != kGroup)
      return attention_for_group<kDim, kGroup + 1>(ph, ctx, partials, done, codes, scales, region,
                                                   ws, group);
  attention_phase<kDim, kGroup>(ph, ctx, partials, done, codes, scales, region, ws);
}

__device__ inline void persistent_attention(const PersistentPhase& ph,
                                            const PersistentStepContext& ctx, float* partials,
                                            unsigned* done, int8_t* codes, float2* scales,
                                            uint8_t* region, persistent::WarpStream& ws) {
  const int group = ctx.n_heads / ctx.n_kv_heads;
  if (ctx.head_dim == 128)
    return attention_for_group<128>(ph, ctx, partials, done, codes, scales, region, ws, group);
  attention_for_group<64>(ph, ctx, partials, done, codes, scales, region, ws, group);
}

}  // namespace hablar::cuda
