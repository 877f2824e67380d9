// The tensor-core decode attention kernel (head_dim 64 and 128; the one that runs wherever
// decode_uses_mma()). The rest of the decode step (scatter, the CUDA-core kernel, the split
// reduce, the entry point) is in attention_decode.cu.
//
// Grid (n_kv_heads, n_slots, splits.grid), 4 warps. Warp w takes the 16-position sub-tiles w,
// w + 4, w + 8, ... of its block's split and keeps its own softmax state and accumulator for
// every query head of the GQA group (up to 8); at the end the block merges its four warps in
// order and writes one partial per (slot, head, split), as the CUDA-core kernel does; in a
// call of one split per slot (decode_finishes_in_attention) it normalizes the heads itself,
// with the reduce's arithmetic, and the reduce is not launched.
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
//
// Before the wait on the kernel before (programmatic dependent launch), a warp requests its
// first sub-tile when those rows were stored by earlier steps (prior_rows_settled, and not
// the slot's own position): the queries, and the newest row, are read after it.
//
// Software pipeline (kPipelined): a warp's sub-tiles are a chain of two dependent loads (the
// block table's entry, then the K/V rows it names) and the products on them. A warp issues
// the rows of its next sub-tile and the table entries of the one after before the products
// of the current one, so one sub-tile's loads are in flight during another's arithmetic:
// the same values in the same order, so the same results bit for bit. At most two blocks of
// this kernel fit a multiprocessor by registers either way (about 200 a thread unpipelined).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/attention_decode_internal.cuh"
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/kv_elements.cuh"
#include "backend/cuda/lab_knobs.h"
#include "backend/cuda/online_softmax.h"

namespace hablar::cuda {
namespace {

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

// The K/V rows of this block's KV head.
struct KvRows {
  const uint16_t* cache;
  const int32_t* table;
  KvCacheLayout layout;
  int layer, kvh;
  // The cache block holding `pos` (the block table's entry), or -1 past `end`.
  __device__ int block_of(int pos, int end) const {
    return pos < end ? table[pos / layout.block_size] : -1;
  }
  __device__ const uint16_t* row(int kv, int block, int pos) const {
    return cache + layout.offset(layer, kv, block, kvh, pos % layout.block_size, 0);
  }
};

// Position of a lane's K row nt (0, 1) and V row r (0..3) in the sub-tile at t0.
__device__ __forceinline__ int k_row_pos(int t0, int nt, int g) {
  return t0 + 8 * nt + g;
}
__device__ __forceinline__ int v_row_pos(int t0, int r, int t) {
  return t0 + 2 * t + (r & 1) + 8 * (r >> 1);
}

// The cache blocks of a lane's rows in one sub-tile (-1: past the split's end).
struct SubTileBlocks {
  int k[2], v[4];
};
__device__ __forceinline__ SubTileBlocks sub_tile_blocks(const KvRows& kv, int t0, int end, int g,
                                                         int t) {
  SubTileBlocks b;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) b.k[nt] = kv.block_of(k_row_pos(t0, nt, g), end);
#pragma unroll
  for (int r = 0; r < 4; ++r) b.v[r] = kv.block_of(v_row_pos(t0, r, t), end);
  return b;
}

// A lane's K and V fragments of one sub-tile (zeros past the split's end).
template <int kDim>
struct SubTileRows {
  uint4 k[2][kDim / 32], v[4][kDim / 64];
};
template <KvElem kElem, int kDim>
__device__ __forceinline__ void load_sub_tile(const KvRows& kv, const SubTileBlocks& b, int t0,
                                              int g, int t, SubTileRows<kDim>& f) {
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const uint16_t* row = b.k[nt] >= 0 ? kv.row(0, b.k[nt], k_row_pos(t0, nt, g)) : nullptr;
#pragma unroll
    for (int i = 0; i < kDim / 32; ++i)
      f.k[nt][i] = row ? kv_load8<kElem>(row, 8 * t + 32 * i) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const uint16_t* row = b.v[r] >= 0 ? kv.row(1, b.v[r], v_row_pos(t0, r, t)) : nullptr;
#pragma unroll
    for (int i = 0; i < kDim / 64; ++i)
      f.v[r][i] = row ? kv_load8<kElem>(row, 8 * g + 64 * i) : make_uint4(0, 0, 0, 0);
  }
}

// One sub-tile's scores, softmax state and P·V into the warp's running state and o.
template <bool kBf16, int kDim>
__device__ __forceinline__ void attend_sub_tile(const uint32_t (&qa)[kDim / 16][4],
                                                const SubTileRows<kDim>& f, int t0, int end, int t,
                                                SoftmaxState& state, float (&o)[kDim / 8][4]) {
  // Scores: lane (g, t) ends with head g at positions 2t, 2t + 1 (n-tile 0), 8 + 2t,
  // 9 + 2t (n-tile 1), as row g (Q_hi) plus row g + 8 (Q_lo).
  float s[2][4] = {};
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int ks = 0; ks < kDim / 16; ++ks)
      mma_m16n8k16<kBf16>(s[nt], qa[ks], word_of(f.k[nt][ks / 2], 2 * (ks % 2)),
                          word_of(f.k[nt][ks / 2], 2 * (ks % 2) + 1));
  float sc[4] = {s[0][0] + s[0][2], s[0][1] + s[0][3], s[1][0] + s[1][2], s[1][1] + s[1][3]};
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (v_row_pos(t0, j, t) >= end) sc[j] = -INFINITY;

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
  for (int i = 0; i < kDim / 64; ++i)
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int j = 8 * i + e;
      const unsigned pick = (e & 1) ? 0x7632u : 0x5410u;  // high or low halves
      const uint32_t b0 = __byte_perm(word_of(f.v[0][i], e / 2), word_of(f.v[1][i], e / 2), pick);
      const uint32_t b1 = __byte_perm(word_of(f.v[2][i], e / 2), word_of(f.v[3][i], e / 2), pick);
#pragma unroll
      for (int c = 0; c < 4; ++c) o[j][c] *= merge.factor_a;
      mma_m16n8k16<kBf16>(o[j], pa, b0, b1);
    }
}

// A fragments of [Q_hi; Q_lo] (scaled), k-step s = 2i + h: dims 8t + 32i + 4h + 0..3.
template <bool kBf16, int kDim>
__device__ __forceinline__ void load_query_fragments(const DecodeAttentionParams& p, int slot,
                                                     int kvh, int group, int g, int t,
                                                     uint32_t (&qa)[kDim / 16][4]) {
  const bool live = g < group;
  const float* q = p.q + ((size_t)slot * p.n_heads + kvh * group + (live ? g : 0)) * kDim;
#pragma unroll
  for (int i = 0; i < kDim / 32; ++i) {
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

template <KvElem kElem, int kDim, int kMinBlocks, bool kPipelined>
__global__ void __launch_bounds__(kDecodeWarps * 32, kMinBlocks)
    decode_attention_mma_kernel(DecodeAttentionParams p, DecodeSplits splits, float* workspace,
                                bool finish) {
  constexpr bool kBf16 = kv_elem_bf16(kElem);  // the products' inputs (f16 for Q8_0 rows)
  constexpr int kNTiles = kDim / 8, kStride = kDecodeMmaSubTile * kDecodeWarps;
  __shared__ __align__(16) float o_s[kDecodeWarps][8][kDim];
  __shared__ SoftmaxState state_s[kDecodeWarps][8];

  // The lengths, flags and block tables come with the step (no kernel writes them).
  const int kvh = blockIdx.x, slot = blockIdx.y, split = blockIdx.z;
  const auto [begin, end] = split_range(p, slot, split, splits);
  if (begin >= end) {
    begin_dependent_kernel();
    return;
  }
  const int group = p.n_heads / p.layout.n_kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const KvRows kv{static_cast<const uint16_t*>(p.kv_cache),
                  p.block_tables + (size_t)slot * p.max_blocks_per_seq, p.layout, p.layer, kvh};

  // A warp's first sub-tile is requested before the wait when none of its rows is the
  // slot's own position (the one the kernel before may store) and earlier steps stored the
  // rest (prior_rows_settled): its loads overlap the kernel before and the launch between.
  int t0 = begin + kDecodeMmaSubTile * warp;
  SubTileRows<kDim> a;
  const bool early =
      p.prior_rows_settled && t0 < end && min(t0 + kDecodeMmaSubTile, end) <= p.seq_lens[slot];
  if (early) load_sub_tile<kElem, kDim>(kv, sub_tile_blocks(kv, t0, end, g, t), t0, g, t, a);
  begin_dependent_kernel();
  if (t0 < end && !early)
    load_sub_tile<kElem, kDim>(kv, sub_tile_blocks(kv, t0, end, g, t), t0, g, t, a);

  uint32_t qa[kDim / 16][4];
  load_query_fragments<kBf16, kDim>(p, slot, kvh, group, g, t, qa);
  SoftmaxState state = softmax_empty();  // head g's, the same in its four lanes
  float o[kNTiles][4];
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

  if constexpr (!kPipelined) {
    if (t0 < end) attend_sub_tile<kBf16, kDim>(qa, a, t0, end, t, state, o);
    for (t0 += kStride; t0 < end; t0 += kStride) {
      SubTileRows<kDim> rows;
      load_sub_tile<kElem, kDim>(kv, sub_tile_blocks(kv, t0, end, g, t), t0, g, t, rows);
      attend_sub_tile<kBf16, kDim>(qa, rows, t0, end, t, state, o);
    }
  } else if (t0 < end) {
    // Two register sets, a and b, alternate: on entering the loop, a holds the rows of t0
    // (requested) and next_blocks the table entries of t0 + kStride.
    SubTileRows<kDim> b;
    SubTileBlocks next_blocks = sub_tile_blocks(kv, t0 + kStride, end, g, t);
    while (true) {
      SubTileBlocks after = sub_tile_blocks(kv, t0 + 2 * kStride, end, g, t);
      load_sub_tile<kElem, kDim>(kv, next_blocks, t0 + kStride, g, t, b);
      attend_sub_tile<kBf16, kDim>(qa, a, t0, end, t, state, o);
      t0 += kStride;
      if (t0 >= end) break;
      next_blocks = sub_tile_blocks(kv, t0 + 2 * kStride, end, g, t);
      load_sub_tile<kElem, kDim>(kv, after, t0 + kStride, g, t, a);
      attend_sub_tile<kBf16, kDim>(qa, b, t0, end, t, state, o);
      t0 += kStride;
      if (t0 >= end) break;
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
    if (finish) {  // the reduce's one merge, from an empty state, and its normalization
      SoftmaxState reduced = softmax_empty();
      const float merged = merge_split(reduced, 0.0f, total, acc);
      const size_t at = ((size_t)slot * p.n_heads + head) * kDim + d;
      const float o = merged * softmax_inverse_sum(reduced);
      if (p.out != nullptr) p.out[at] = o;
      if (p.out_bf16 != nullptr) p.out_bf16[at] = __bfloat16_as_ushort(__float2bfloat16_rn(o));
      continue;
    }
    float* part =
        workspace + (((size_t)slot * p.n_heads + head) * splits.grid + split) * (kDim + 2);
    part[2 + d] = acc;
    if (d == 0) {
      part[0] = total.max;
      part[1] = total.sum;
    }
  }
}

template <KvElem kElem, int kDim>
void launch_for_dim(const DecodeAttentionParams& p, const DecodeSplits& splits, float* ws,
                    cudaStream_t stream) {
  const dim3 grid(p.layout.n_kv_heads, p.n_slots, splits.grid);
  // Pipelined at head_dim 128 (two blocks a multiprocessor either way) where a warp of the
  // longest slot has several sub-tiles of a split to walk; at 64 the pipeline's registers (180
  // against 128) would halve the resident blocks, so it stays unpipelined. Lab:
  // HABLAR_DECODE_MMA_BLOCKS=3 asks the compiler for three blocks per multiprocessor (fewer
  // registers, unpipelined); HABLAR_DECODE_PIPELINE=0 / 1 the loop either way.
  const int longest_split = decode_slot_split_len(splits, decode_max_context(p));
  const bool pipelined = kDim == 128 && longest_split >= 2 * kDecodeMmaSubTile * kDecodeWarps;
  const auto kernel = lab_knob("HABLAR_DECODE_MMA_BLOCKS", 2) == 3
                          ? decode_attention_mma_kernel<kElem, kDim, 3, false>
                      : lab_knob("HABLAR_DECODE_PIPELINE", pipelined ? 1 : 0) == 0
                          ? decode_attention_mma_kernel<kElem, kDim, 1, false>
                          : decode_attention_mma_kernel<kElem, kDim, 1, true>;
  DecodeAttentionParams params = p;  // HABLAR_DECODE_EARLY=0: no rows requested before the wait
  params.prior_rows_settled = p.prior_rows_settled && lab_knob("HABLAR_DECODE_EARLY", 1) != 0;
  launch_dependent(kernel, grid, dim3(kDecodeWarps * 32), 0, stream, params, splits, ws,
                   decode_finishes_in_attention(p, splits));
}

template <KvElem kElem>
void launch_for_elem(const DecodeAttentionParams& p, const DecodeSplits& splits, float* ws,
                     cudaStream_t stream) {
  if (p.layout.head_dim == 64) {
    launch_for_dim<kElem, 64>(p, splits, ws, stream);
  } else {
    launch_for_dim<kElem, 128>(p, splits, ws, stream);
  }
}

}  // namespace

void launch_decode_attention_mma(const DecodeAttentionParams& p, const DecodeSplits& splits,
                                 float* workspace, cudaStream_t stream) {
  switch (kv_elem_of(p.layout.dtype)) {
    case KvElem::kBf16:
      launch_for_elem<KvElem::kBf16>(p, splits, workspace, stream);
      break;
    case KvElem::kQ8_0:
      launch_for_elem<KvElem::kQ8_0>(p, splits, workspace, stream);
      break;
    default:
      launch_for_elem<KvElem::kF16>(p, splits, workspace, stream);
      break;
  }
}

}  // namespace hablar::cuda
