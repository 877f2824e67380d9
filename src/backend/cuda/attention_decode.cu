// Decode-step attention: scatter kernel (unless the RoPE pass stored this step's K/V already:
// kv_stored), split-K attention kernel, reduce kernel.
//
// Attention grid: (n_kv_heads, n_slots, n_splits), 128 threads. A block reads its KV head's
// positions [split * split_len, ...) once and serves every query head of the GQA group; it
// writes one partial per (slot, head, split); the reduce kernel merges the splits (one block
// per slot and head) and a last one-block kernel advances the lengths.
//
// Two attention kernels (decode_uses_mma() picks one; the host twin follows the same one):
// - decode_attention_mma_kernel (head_dim 64 and 128, the one that runs): scores and P·V on
//   tensor cores, each warp its own 16-position sub-tiles and softmax state, K and V loaded
//   straight into registers; described above the kernel.
// - decode_attention_kernel (head_dim 96 and 256, and the lab's HABLAR_DECODE_KERNEL=0): CUDA
//   cores, tiles of kDecodeTile positions copied asynchronously into shared memory; per tile
//   the scores, a tile softmax state merged into each head's running state
//   (online_softmax.h), and P·V. One shared-memory stage per block (about 20 KB) lets ten
//   blocks share a multiprocessor (HABLAR_DECODE_STAGES=2 selects double buffering).
#include <cuda_pipeline.h>

#include <algorithm>
#include <string>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/kv_elements.cuh"
#include "backend/cuda/online_softmax.h"
#include "backend/cuda/q4k_chunk.cuh"

namespace hablar::cuda {
namespace {

__device__ __forceinline__ int decode_context(const DecodeAttentionParams& p, int slot) {
  const int capacity = p.max_blocks_per_seq * p.layout.block_size;
  return min(p.seq_lens[slot] + 1, capacity);
}

// The positions [begin, end) that split `split` of slot `slot` attends to; empty (begin >= end)
// when the slot is done, its context ends before the split or its window begins after it.
struct SplitRange {
  int begin, end;
};
__device__ __forceinline__ SplitRange split_range(const DecodeAttentionParams& p, int slot,
                                                  int split, int split_len) {
  if (!p.active[slot]) return {0, 0};
  const int context = decode_context(p, slot);
  const int begin = split * split_len;
  return {max(begin, decode_first_position(p, p.seq_lens[slot])), min(begin + split_len, context)};
}

// Grid (n_slots), 256 threads. With Q8_0 rows each warp takes whole blocks of 32 dimensions
// (head_dim and 256 are multiples of 32, and the early returns are the block's).
template <KvElem kElem>
__global__ void decode_scatter_kernel(DecodeAttentionParams p) {
  begin_dependent_kernel();
  const int slot = blockIdx.x;
  if (!p.active[slot]) return;
  const int pos = p.seq_lens[slot];
  if (pos >= p.max_blocks_per_seq * p.layout.block_size) return;
  const int32_t* table = p.block_tables + (size_t)slot * p.max_blocks_per_seq;
  const int d_head = p.layout.head_dim;
  const int per_kv = p.layout.n_kv_heads * d_head;
  uint16_t* cache = static_cast<uint16_t*>(p.kv_cache);
  for (int i = threadIdx.x; i < 2 * per_kv; i += blockDim.x) {
    const int kv = i / per_kv, kvh = (i % per_kv) / d_head, d = i % d_head;
    const float* src = kv == 0 ? p.k_new : p.v_new;
    const float value = src[(size_t)slot * per_kv + kvh * d_head + d];
    kv_store_dim<kElem>(cache + p.layout.position_offset(table, p.layer, kv, kvh, pos), d, value);
  }
}

template <int kDim, int kGroup, int kStages>
struct DecodeSmem {
  static constexpr int kLd = kDim + 8;  // halves per K/V row: 16 bytes of padding (banks)
  static constexpr size_t kKv = 0;      // [kStages][K, V][kDecodeTile][kLd] halves
  static constexpr size_t kQ = kKv + sizeof(uint16_t) * kStages * 2 * kDecodeTile * kLd;
  static constexpr size_t kS = kQ + sizeof(float) * kGroup * kDim;  // [kGroup][kDecodeTile]
  static constexpr size_t kBytes = kS + sizeof(float) * kGroup * kDecodeTile;
};

// Starts the asynchronous copy of one tile of K and V rows into a shared-memory stage;
// rows past `end` are zeroed (never left stale: P = 0 times garbage could be NaN). Q8_0 rows
// are read and stored as f16 at once (kv_q8_load8), not copied asynchronously.
template <KvElem kElem, int kDim>
__device__ void issue_kv_tile(const DecodeAttentionParams& p, const int32_t* table, int kvh, int t0,
                              int end, uint16_t* k_stage, uint16_t* v_stage) {
  constexpr int kLd = kDim + 8, kChunks = kDim / 8;
  const uint16_t* cache = static_cast<const uint16_t*>(p.kv_cache);
  for (int i = threadIdx.x; i < kDecodeTile * kChunks; i += blockDim.x) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    uint16_t* dk = k_stage + r * kLd + c;
    uint16_t* dv = v_stage + r * kLd + c;
    if constexpr (kElem == KvElem::kQ8_0) {
      uint4 k = make_uint4(0, 0, 0, 0), v = k;
      if (t0 + r < end) {
        k = kv_q8_load8(cache + p.layout.position_offset(table, p.layer, 0, kvh, t0 + r), c);
        v = kv_q8_load8(cache + p.layout.position_offset(table, p.layer, 1, kvh, t0 + r), c);
      }
      *reinterpret_cast<uint4*>(dk) = k;
      *reinterpret_cast<uint4*>(dv) = v;
    } else if (t0 + r < end) {
      const size_t at = p.layout.position_offset(table, p.layer, 0, kvh, t0 + r) + c;
      __pipeline_memcpy_async(dk, cache + at, 16);
      __pipeline_memcpy_async(dv, cache + at + p.layout.pool_elems(), 16);
    } else {
      *reinterpret_cast<uint4*>(dk) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(dv) = make_uint4(0, 0, 0, 0);
    }
  }
  __pipeline_commit();
}

// Scores of one tile: thread t takes position t % kDecodeTile and query heads
// t / kDecodeTile + j * (threads / kDecodeTile).
template <bool kBf16, int kDim, int kGroup>
__device__ void tile_scores(const DecodeAttentionParams& p, const uint16_t* ks, const float* q_s,
                            float* s_s, int group, int valid) {
  constexpr int kLd = kDim + 8, kStride = kDecodeWarps * 32 / kDecodeTile;
  constexpr int kPerThread = (kGroup + kStride - 1) / kStride;
  const int pos = threadIdx.x % kDecodeTile, g0 = threadIdx.x / kDecodeTile;
  float dot[kPerThread] = {};
#pragma unroll 4
  for (int c = 0; c < kDim; c += 8) {
    float k[8];
    kv_unpack8<kBf16>(*reinterpret_cast<const uint4*>(ks + pos * kLd + c), k);
#pragma unroll
    for (int gi = 0; gi < kPerThread; ++gi) {
      const int g = g0 + kStride * gi;
      if (g >= kGroup) continue;
      const float4* q4 = reinterpret_cast<const float4*>(q_s + g * kDim + c);
      const float4 a = q4[0], b = q4[1];
      dot[gi] += a.x * k[0] + a.y * k[1] + a.z * k[2] + a.w * k[3] + b.x * k[4] + b.y * k[5] +
                 b.z * k[6] + b.w * k[7];
    }
  }
#pragma unroll
  for (int gi = 0; gi < kPerThread; ++gi) {
    const int g = g0 + kStride * gi;
    if (g < kGroup)
      s_s[g * kDecodeTile + pos] =
          (pos < valid && g < group) ? decode_softcap(p, dot[gi]) : -INFINITY;
  }
}

// A lane's kDpl consecutive V values of one row, in one shared-memory load (three 2-byte
// loads for head_dim 96, whose lanes' runs of 3 elements are not word aligned).
template <bool kBf16, int kDpl>
__device__ __forceinline__ void load_v_lane(const uint16_t* vrow, float v[kDpl]) {
  if constexpr (kDpl == 3) {
#pragma unroll
    for (int i = 0; i < 3; ++i) v[i] = kv_to_float<kBf16>(vrow[i]);
  } else if constexpr (kDpl == 8) {
    kv_unpack8<kBf16>(*reinterpret_cast<const uint4*>(vrow), v);
  } else if constexpr (kDpl == 4) {
    const uint2 raw = *reinterpret_cast<const uint2*>(vrow);
    const float2 a = kv_unpack2<kBf16>(raw.x), b = kv_unpack2<kBf16>(raw.y);
    v[0] = a.x;
    v[1] = a.y;
    v[2] = b.x;
    v[3] = b.y;
  } else {
    const float2 a = kv_unpack2<kBf16>(*reinterpret_cast<const uint32_t*>(vrow));
    v[0] = a.x;
    v[1] = a.y;
  }
}

// Grid (n_kv_heads, n_slots, n_splits), 128 threads. Per tile of kDecodeTile positions (copied
// asynchronously into one of kStages shared-memory stages): scores of every GQA head into
// shared memory; warp w turns the scores of heads w, w+4 into a tile softmax state, merges it into
// its running state (softmax_merge) and accumulates P·V for its heads, each lane owning head_dim /
// 32 dimensions.
template <KvElem kElem, int kDim, int kGroup, int kStages>
__global__ void __launch_bounds__(kDecodeWarps * 32)
    decode_attention_kernel(DecodeAttentionParams p, int split_len, int n_splits,
                            float* workspace) {
  begin_dependent_kernel();
  constexpr bool kBf16 = kv_elem_bf16(kElem);  // the staged tiles' element type
  using L = DecodeSmem<kDim, kGroup, kStages>;
  constexpr int kLd = L::kLd, kDpl = kDim / 32, kHeadsPerWarp = (kGroup + 3) / 4;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* kv_s = reinterpret_cast<uint16_t*>(smem + L::kKv);
  float* q_s = reinterpret_cast<float*>(smem + L::kQ);
  float* s_s = reinterpret_cast<float*>(smem + L::kS);

  const int kvh = blockIdx.x, slot = blockIdx.y, split = blockIdx.z;
  const auto [begin, end] = split_range(p, slot, split, split_len);
  if (begin >= end) return;
  const int group = p.n_heads / p.layout.n_kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t* table = p.block_tables + (size_t)slot * p.max_blocks_per_seq;

  for (int i = threadIdx.x; i < kGroup * kDim; i += blockDim.x) {
    const int g = i / kDim;
    q_s[i] = g < group ? p.q[((size_t)slot * p.n_heads + kvh * group) * kDim + i] * p.scale : 0.f;
  }
  const int n_tiles = (end - begin + kDecodeTile - 1) / kDecodeTile;
  auto stage_k = [&](int stage) { return kv_s + (size_t)(stage * 2) * kDecodeTile * kLd; };
  issue_kv_tile<kElem, kDim>(p, table, kvh, begin, end, stage_k(0), stage_k(0) + kDecodeTile * kLd);

  SoftmaxState state[kHeadsPerWarp];
  float acc[kHeadsPerWarp][kDpl];
#pragma unroll
  for (int hi = 0; hi < kHeadsPerWarp; ++hi) {
    state[hi] = softmax_empty();
#pragma unroll
    for (int i = 0; i < kDpl; ++i) acc[hi][i] = 0.0f;
  }
  for (int tile = 0; tile < n_tiles; ++tile) {
    const int t0 = begin + tile * kDecodeTile;
    if constexpr (kStages == 1) {
      // One stage: more blocks fit on a multiprocessor, and other blocks' copies overlap
      // this block's arithmetic.
      if (tile > 0)
        issue_kv_tile<kElem, kDim>(p, table, kvh, t0, end, stage_k(0),
                                   stage_k(0) + kDecodeTile * kLd);
      __pipeline_wait_prior(0);
    } else if (tile + 1 < n_tiles) {
      uint16_t* next = stage_k((tile + 1) & 1);
      issue_kv_tile<kElem, kDim>(p, table, kvh, t0 + kDecodeTile, end, next,
                                 next + kDecodeTile * kLd);
      __pipeline_wait_prior(1);
    } else {
      __pipeline_wait_prior(0);
    }
    __syncthreads();  // this tile (and q_s) visible to every thread
    const uint16_t* ks = stage_k(kStages == 1 ? 0 : tile & 1);
    const uint16_t* vs = ks + kDecodeTile * kLd;
    tile_scores<kBf16, kDim, kGroup>(p, ks, q_s, s_s, group, end - t0);
    __syncthreads();

#pragma unroll
    for (int hi = 0; hi < kHeadsPerWarp; ++hi) {
      const int g = warp + 4 * hi;
      if (g >= group) continue;
      float* row = s_s + g * kDecodeTile;
      constexpr int kPerLane = kDecodeTile / 32;
      float sc[kPerLane];
      // The tile's softmax state, itself online: each lane pushes its scores, then the
      // lanes' states merge in a butterfly (every lane ends with the tile's state).
      SoftmaxState tile_state = softmax_empty();
      float unused;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        sc[i] = row[lane + 32 * i];
        if (sc[i] != -INFINITY) softmax_push(tile_state, sc[i], &unused);
      }
#pragma unroll
      for (int off = 16; off > 0; off /= 2) {
        const SoftmaxState other{__shfl_xor_sync(0xffffffffu, tile_state.max, off),
                                 __shfl_xor_sync(0xffffffffu, tile_state.sum, off)};
        softmax_merge(tile_state, other);
      }
      const SoftmaxMerge merge = softmax_merge(state[hi], tile_state);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i)
        row[lane + 32 * i] =
            sc[i] == -INFINITY ? 0.0f : softmax_exp(sc[i] - tile_state.max) * merge.factor_b;
#pragma unroll
      for (int i = 0; i < kDpl; ++i) acc[hi][i] *= merge.factor_a;
    }
    __syncwarp();
    // P·V, four positions at a time: one 16-byte load of each head's four weights, one load
    // of the lane's kDpl values per position; every accumulator still adds positions in order.
    for (int p4 = 0; p4 < kDecodeTile; p4 += 4) {
      float4 weights[kHeadsPerWarp];
#pragma unroll
      for (int hi = 0; hi < kHeadsPerWarp; ++hi)  // rows past the group are read, not used
        weights[hi] = *reinterpret_cast<const float4*>(
            s_s + min(warp + 4 * hi, kGroup - 1) * kDecodeTile + p4);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float v[kDpl];
        load_v_lane<kBf16, kDpl>(vs + (p4 + j) * kLd + lane * kDpl, v);
#pragma unroll
        for (int hi = 0; hi < kHeadsPerWarp; ++hi) {
          if (warp + 4 * hi >= group) continue;
          const float weight = j == 0   ? weights[hi].x
                               : j == 1 ? weights[hi].y
                               : j == 2 ? weights[hi].z
                                        : weights[hi].w;
#pragma unroll
          for (int i = 0; i < kDpl; ++i) acc[hi][i] = fmaf(weight, v[i], acc[hi][i]);
        }
      }
    }
    __syncthreads();  // the stage and the scores are rewritten next round
  }

#pragma unroll
  for (int hi = 0; hi < kHeadsPerWarp; ++hi) {
    const int g = warp + 4 * hi;
    if (g >= group) continue;
    const int head = kvh * group + g;
    float* part = workspace + (((size_t)slot * p.n_heads + head) * n_splits + split) * (kDim + 2);
#pragma unroll
    for (int i = 0; i < kDpl; ++i) part[2 + lane * kDpl + i] = acc[hi][i];
    if (lane == 0) {
      part[0] = state[hi].max;
      part[1] = state[hi].sum;
    }
  }
}

// ---- The tensor-core decode kernel (head_dim <= 128; the shipped one, decode_uses_mma()).
//
// Grid (n_kv_heads, n_slots, n_splits), 4 warps. Warp w takes the 16-position sub-tiles w,
// w + 4, w + 8, ... of its block's split and keeps its own softmax state and accumulator for
// every query head of the GQA group (up to 8); at the end the block merges its four warps in
// order and writes one partial per (slot, head, split), as the CUDA-core kernel does.
// Per sub-tile, with mma.sync m16n8k16 (f16 or bf16 inputs, f32 accumulation):
//   scores  S[16 rows][16 positions] = [Q_hi; Q_lo] · Kᵀ   (rows 0-7: the heads' queries
//           rounded to the element type, rows 8-15: what that rounding left over, so
//           S = rows g + rows g + 8 carries the queries to about 22 bits);
//   P·V     O[16 rows][head_dim] += [P_hi; P_lo] · V         (the same split of the weights).
// K and V fragments come straight from global memory in 16-byte loads (no shared memory):
// lane (g = lane / 4, t = lane % 4) loads K rows g and 8 + g at dims 8t + 32i (the dims are
// permuted consistently for Q and K, which a dot product allows), and V rows 2t, 2t + 1,
// 2t + 8, 2t + 9 at dims 8g + 64i, paired into B fragments with byte permutes; output column
// n of n-tile 8i + e is dim 64i + 8n + e.

// (x0, x1) rounded to the element type (*hi) and the rounding's remainder (*lo), packed.
template <bool kBf16>
__device__ __forceinline__ void split_pair(float x0, float x1, uint32_t* hi, uint32_t* lo) {
  if constexpr (kBf16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    const float2 back = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - back.x, x1 - back.y);
    *hi = *reinterpret_cast<const uint32_t*>(&h);
    *lo = *reinterpret_cast<const uint32_t*>(&l);
  } else {
    const __half2 h = __floats2half2_rn(x0, x1);
    const float2 back = __half22float2(h);
    const __half2 l = __floats2half2_rn(x0 - back.x, x1 - back.y);
    *hi = *reinterpret_cast<const uint32_t*>(&h);
    *lo = *reinterpret_cast<const uint32_t*>(&l);
  }
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Element pointer of (kv, position) of this block's KV head.
struct KvRows {
  const uint16_t* cache;
  const int32_t* table;
  KvCacheLayout layout;
  int layer, kvh;
  __device__ const uint16_t* row(int kv, int pos) const {
    return cache + layout.position_offset(table, layer, kv, kvh, pos);
  }
};

template <KvElem kElem, int kDim, int kMinBlocks>
__global__ void __launch_bounds__(kDecodeWarps * 32, kMinBlocks)
    decode_attention_mma_kernel(DecodeAttentionParams p, int split_len, int n_splits,
                                float* workspace) {
  begin_dependent_kernel();
  constexpr bool kBf16 = kv_elem_bf16(kElem);  // the products' inputs (f16 for Q8_0 rows)
  constexpr int kKPieces = kDim / 32, kVPieces = kDim / 64, kKSteps = kDim / 16;
  constexpr int kNTiles = kDim / 8, kSub = kDecodeMmaSubTile;
  __shared__ __align__(16) float o_s[kDecodeWarps][8][kDim];
  __shared__ SoftmaxState state_s[kDecodeWarps][8];

  const int kvh = blockIdx.x, slot = blockIdx.y, split = blockIdx.z;
  const auto [begin, end] = split_range(p, slot, split, split_len);
  if (begin >= end) return;
  const int group = p.n_heads / p.layout.n_kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const KvRows kv{static_cast<const uint16_t*>(p.kv_cache),
                  p.block_tables + (size_t)slot * p.max_blocks_per_seq, p.layout, p.layer, kvh};

  // A fragments of [Q_hi; Q_lo] (scaled), k-step s = 2i + h: dims 8t + 32i + 4h + 0..3.
  uint32_t qa[kKSteps][4];
  {
    const bool live = g < group;
    const float* q = p.q + ((size_t)slot * p.n_heads + kvh * group + (live ? g : 0)) * kDim;
#pragma unroll
    for (int i = 0; i < kKPieces; ++i) {
      float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
      if (live) {
        a = *reinterpret_cast<const float4*>(q + 8 * t + 32 * i);
        b = *reinterpret_cast<const float4*>(q + 8 * t + 32 * i + 4);
      }
      const float sc = p.scale;
      split_pair<kBf16>(a.x * sc, a.y * sc, &qa[2 * i][0], &qa[2 * i][1]);
      split_pair<kBf16>(a.z * sc, a.w * sc, &qa[2 * i][2], &qa[2 * i][3]);
      split_pair<kBf16>(b.x * sc, b.y * sc, &qa[2 * i + 1][0], &qa[2 * i + 1][1]);
      split_pair<kBf16>(b.z * sc, b.w * sc, &qa[2 * i + 1][2], &qa[2 * i + 1][3]);
    }
  }

  SoftmaxState state = softmax_empty();  // head g's, the same in its four lanes
  float o[kNTiles][4];
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

  for (int t0 = begin + kSub * warp; t0 < end; t0 += kSub * kDecodeWarps) {
    // Loads of the sub-tile: K rows t0 + g, t0 + 8 + g; V rows t0 + 2t, +1, +8, +9.
    uint4 kf[2][kKPieces], vf[4][kVPieces];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int pos = t0 + 8 * nt + g;
      const uint16_t* row = pos < end ? kv.row(0, pos) : nullptr;
#pragma unroll
      for (int i = 0; i < kKPieces; ++i)
        kf[nt][i] = row ? kv_load8<kElem>(row, 8 * t + 32 * i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int pos = t0 + 2 * t + (r & 1) + 8 * (r >> 1);
      const uint16_t* row = pos < end ? kv.row(1, pos) : nullptr;
#pragma unroll
      for (int i = 0; i < kVPieces; ++i)
        vf[r][i] = row ? kv_load8<kElem>(row, 8 * g + 64 * i) : make_uint4(0, 0, 0, 0);
    }

    // Scores: lane (g, t) ends with head g at positions 2t, 2t + 1 (n-tile 0), 8 + 2t,
    // 9 + 2t (n-tile 1), as row g (Q_hi) plus row g + 8 (Q_lo).
    float s[2][4] = {};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)
        mma_m16n8k16<kBf16>(s[nt], qa[ks], word_of(kf[nt][ks / 2], 2 * (ks % 2)),
                            word_of(kf[nt][ks / 2], 2 * (ks % 2) + 1));
    float sc[4] = {s[0][0] + s[0][2], s[0][1] + s[0][3], s[1][0] + s[1][2], s[1][1] + s[1][3]};
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (t0 + 2 * t + (j & 1) + 8 * (j >> 1) >= end) sc[j] = -INFINITY;

    // The sub-tile's softmax state per head: each lane pushes its four scores, then the
    // four lanes of the head merge in a butterfly (offsets 1, 2).
    SoftmaxState tile = softmax_empty();
    float unused;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (sc[j] != -INFINITY) softmax_push(tile, sc[j], &unused);
#pragma unroll
    for (int off = 1; off < 4; off *= 2) {
      const SoftmaxState other{__shfl_xor_sync(0xffffffffu, tile.max, off),
                               __shfl_xor_sync(0xffffffffu, tile.sum, off)};
      softmax_merge(tile, other);
    }
    const SoftmaxMerge merge = softmax_merge(state, tile);
    float w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      w[j] = sc[j] == -INFINITY ? 0.0f : softmax_exp(sc[j] - tile.max) * merge.factor_b;
    uint32_t pa[4];  // [P_hi; P_lo]: k = 2t, 2t + 1 and 2t + 8, 2t + 9
    split_pair<kBf16>(w[0], w[1], &pa[0], &pa[1]);
    split_pair<kBf16>(w[2], w[3], &pa[2], &pa[3]);

#pragma unroll
    for (int i = 0; i < kVPieces; ++i)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int j = 8 * i + e;
        const unsigned pick = (e & 1) ? 0x7632u : 0x5410u;  // high or low halves
        const uint32_t b0 = __byte_perm(word_of(vf[0][i], e / 2), word_of(vf[1][i], e / 2), pick);
        const uint32_t b1 = __byte_perm(word_of(vf[2][i], e / 2), word_of(vf[3][i], e / 2), pick);
#pragma unroll
        for (int c = 0; c < 4; ++c) o[j][c] *= merge.factor_a;
        mma_m16n8k16<kBf16>(o[j], pa, b0, b1);
      }
  }

  // Merge the four warps in order; rows g and g + 8 of the accumulator add up.
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
    const int d = 64 * (j / 8) + 16 * t + (j % 8);
    o_s[warp][g][d] = o[j][0] + o[j][2];
    o_s[warp][g][d + 8] = o[j][1] + o[j][3];
  }
  if (t == 0) state_s[warp][g] = state;
  __syncthreads();
  for (int idx = threadIdx.x; idx < group * kDim; idx += blockDim.x) {
    const int h = idx / kDim, d = idx % kDim;
    SoftmaxState total = state_s[0][h];
    float acc = o_s[0][h][d];
#pragma unroll
    for (int wi = 1; wi < kDecodeWarps; ++wi) {
      const SoftmaxMerge m = softmax_merge(total, state_s[wi][h]);
      acc = acc * m.factor_a + o_s[wi][h][d] * m.factor_b;
    }
    const int head = kvh * group + h;
    float* part = workspace + (((size_t)slot * p.n_heads + head) * n_splits + split) * (kDim + 2);
    part[2 + d] = acc;
    if (d == 0) {
      part[0] = total.max;
      part[1] = total.sum;
    }
  }
}

// One block per (slot, head), one thread per dimension: merges the head's splits in order
// and writes the normalized output (and, when asked, its int8 blocks: a warp per block of 32
// dimensions). kBatch: splits whose loads are issued together (the order of the merges, and
// so the result, does not depend on it).
template <int kBatch>
__global__ void decode_reduce_kernel(DecodeAttentionParams p, int split_len, int n_splits,
                                     const float* workspace) {
  begin_dependent_kernel();
  const int slot = blockIdx.x, head = blockIdx.y, d = threadIdx.x;
  const int d_head = p.layout.head_dim;
  const size_t at = ((size_t)slot * p.n_heads + head) * d_head + d;
  if (!p.active[slot]) {  // out untouched; int8 rows of zeros (the workspace holds anything)
    if (p.out_codes != nullptr) {
      p.out_codes[at] = 0;
      if (d % 32 == 0) static_cast<float2*>(p.out_scales)[at / 32] = make_float2(0.0f, 0.0f);
    }
    return;
  }
  // Splits past the grid (a context beyond max_context, a caller error) are not read.
  const int n_valid = min(n_splits, (decode_context(p, slot) + split_len - 1) / split_len);
  // Splits wholly before a sliding window's first position wrote nothing either.
  const int first_split = decode_first_position(p, p.seq_lens[slot]) / split_len;
  const float* parts = workspace + ((size_t)slot * p.n_heads + head) * n_splits * (d_head + 2);
  SoftmaxState total = softmax_empty();
  float merged = 0.0f;
  // Splits in order, their loads issued kBatch at a time: a long context's hundreds of
  // splits would otherwise wait out one L2 round trip each (a few blocks, one per head,
  // hold the whole reduce of a long single sequence).
  for (int s0 = first_split; s0 < n_valid; s0 += kBatch) {
    float state_max[kBatch], state_sum[kBatch], value[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (s0 + j >= n_valid) break;
      const float* part = parts + (size_t)(s0 + j) * (d_head + 2);
      state_max[j] = part[0], state_sum[j] = part[1], value[j] = part[2 + d];
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (s0 + j >= n_valid) break;
      const SoftmaxMerge m = softmax_merge(total, SoftmaxState{state_max[j], state_sum[j]});
      merged = merged * m.factor_a + value[j] * m.factor_b;
    }
  }
  const float o = merged * softmax_inverse_sum(total);
  p.out[at] = o;
  if (p.out_codes != nullptr)  // head_dim is a multiple of 32: whole warps, whole blocks
    q4k_chunk::quantize_block32(o, d % 32, p.out_codes + at,
                                static_cast<float2*>(p.out_scales) + at / 32);
}

// After every reader of the lengths: each live slot's length + 1.
__global__ void decode_advance_kernel(DecodeAttentionParams p) {
  for (int slot = threadIdx.x; slot < p.n_slots; slot += blockDim.x)
    if (p.active[slot]) p.seq_lens[slot] += 1;
}

template <KvElem kElem, int kDim, int kGroup, int kStages>
void launch_attention_stages(const DecodeAttentionParams& p, int split_len, int n_splits, float* ws,
                             cudaStream_t stream) {
  const size_t smem = DecodeSmem<kDim, kGroup, kStages>::kBytes;
  auto kernel = decode_attention_kernel<kElem, kDim, kGroup, kStages>;
  HABLAR_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  const dim3 grid(p.layout.n_kv_heads, p.n_slots, n_splits);
  launch_dependent(kernel, grid, dim3(kDecodeWarps * 32), smem, stream, p, split_len, n_splits, ws);
}

template <KvElem kElem, int kDim, int kGroup>
void launch_attention_group(const DecodeAttentionParams& p, int split_len, int n_splits, float* ws,
                            cudaStream_t stream) {
  if (lab_knob("HABLAR_DECODE_STAGES", 1) == 1) {
    launch_attention_stages<kElem, kDim, kGroup, 1>(p, split_len, n_splits, ws, stream);
  } else {
    launch_attention_stages<kElem, kDim, kGroup, 2>(p, split_len, n_splits, ws, stream);
  }
}

template <KvElem kElem, int kDim>
void launch_attention(const DecodeAttentionParams& p, int split_len, int n_splits, float* ws,
                      cudaStream_t stream) {
  if constexpr (kDim == 64 || kDim == 128) {  // its fragments take dims in runs of 64
    if (decode_uses_mma(p)) {
      const dim3 grid(p.layout.n_kv_heads, p.n_slots, n_splits);
      // HABLAR_DECODE_MMA_BLOCKS=3 asks the compiler for three blocks per multiprocessor
      // (fewer registers) instead of two, for the lab.
      const auto kernel = lab_knob("HABLAR_DECODE_MMA_BLOCKS", 2) == 3
                              ? decode_attention_mma_kernel<kElem, kDim, 3>
                              : decode_attention_mma_kernel<kElem, kDim, 1>;
      launch_dependent(kernel, grid, dim3(kDecodeWarps * 32), 0, stream, p, split_len, n_splits,
                       ws);
      return;
    }
  }
  const int group = p.n_heads / p.layout.n_kv_heads;
  if (group <= 1) {
    launch_attention_group<kElem, kDim, 1>(p, split_len, n_splits, ws, stream);
  } else if (group <= 2) {
    launch_attention_group<kElem, kDim, 2>(p, split_len, n_splits, ws, stream);
  } else if (group <= 4) {
    launch_attention_group<kElem, kDim, 4>(p, split_len, n_splits, ws, stream);
  } else {
    launch_attention_group<kElem, kDim, 8>(p, split_len, n_splits, ws, stream);
  }
}

template <KvElem kElem>
void launch_for_dtype(const DecodeAttentionParams& p, int split_len, int n_splits, float* ws,
                      cudaStream_t stream) {
  if (!p.kv_stored)
    launch_dependent(decode_scatter_kernel<kElem>, dim3(p.n_slots), dim3(256), 0, stream, p);
  switch (p.layout.head_dim) {
    case 64:
      launch_attention<kElem, 64>(p, split_len, n_splits, ws, stream);
      break;
    case 96:
      launch_attention<kElem, 96>(p, split_len, n_splits, ws, stream);
      break;
    case 128:
      launch_attention<kElem, 128>(p, split_len, n_splits, ws, stream);
      break;
    default:
      launch_attention<kElem, 256>(p, split_len, n_splits, ws, stream);
      break;
  }
}

void validate(const DecodeAttentionParams& p, size_t workspace_bytes) {
  auto fail = [](const std::string& what) {
    throw_error(ErrorKind::kInvalidArgument, "decode_attention: " + what);
  };
  const int d = p.layout.head_dim;
  if (d != 64 && d != 96 && d != 128 && d != 256)
    fail("head_dim " + std::to_string(d) + " is not supported (64, 96, 128, 256)");
  if (p.layout.n_kv_heads <= 0 || p.n_heads % p.layout.n_kv_heads != 0)
    fail("n_heads " + std::to_string(p.n_heads) + " is not a multiple of n_kv_heads " +
         std::to_string(p.layout.n_kv_heads));
  if (p.n_heads / p.layout.n_kv_heads > 8)
    fail("more than 8 query heads per KV head are not supported");
  if (p.layer < 0 || p.layer >= p.layout.n_layers) fail("layer out of range");
  if (const std::string why = cuda_kv_layout_problem(p.layout); !why.empty()) fail(why);
  if (p.n_slots <= 0 || p.max_blocks_per_seq <= 0) fail("empty batch or block table");
  if (!p.kv_cache || !p.block_tables || !p.seq_lens || !p.active || !p.q || !p.k_new || !p.v_new ||
      !p.out)
    fail("a required device pointer is null");
  if (workspace_bytes < decode_attention_workspace_bytes(p))
    fail("workspace of " + std::to_string(workspace_bytes) + " bytes is below the " +
         std::to_string(decode_attention_workspace_bytes(p)) + " needed");
}

}  // namespace

void decode_attention(const DecodeAttentionParams& p, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream) {
  validate(p, workspace_bytes);
  const int split_len = decode_split_len(p);
  const int n_splits = decode_num_splits(p);
  float* ws = static_cast<float*>(workspace);
  switch (kv_elem_of(p.layout.dtype)) {
    case KvElem::kBf16:
      launch_for_dtype<KvElem::kBf16>(p, split_len, n_splits, ws, stream);
      break;
    case KvElem::kQ8_0:
      launch_for_dtype<KvElem::kQ8_0>(p, split_len, n_splits, ws, stream);
      break;
    default:
      launch_for_dtype<KvElem::kF16>(p, split_len, n_splits, ws, stream);
      break;
  }
  // 32 splits per round trip: 1 x 32k positions of a 2-KV-head model (256 splits of 128) wait
  // 8 round trips instead of 32 (HABLAR_DECODE_REDUCE_BATCH=8, the earlier batch, to compare).
  const auto reduce = lab_knob("HABLAR_DECODE_REDUCE_BATCH", 32) == 8 ? decode_reduce_kernel<8>
                                                                     : decode_reduce_kernel<32>;
  launch_dependent(reduce, dim3(p.n_slots, p.n_heads), dim3(p.layout.head_dim), 0, stream, p,
                   split_len, n_splits, static_cast<const float*>(ws));
  if (!p.advance_lengths) return;
  decode_advance_kernel<<<1, 256, 0, stream>>>(p);
  HABLAR_CUDA_CHECK_LAUNCH();
}

}  // namespace hablar::cuda
