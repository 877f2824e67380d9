// Decode-step attention: scatter kernel (unless the RoPE pass stored this step's K/V already:
// kv_stored), split-K attention kernel, reduce kernel.
//
// Attention grid: (n_kv_heads, n_slots, splits.grid), 128 threads. A block reads its KV head's
// positions [split * len, (split + 1) * len) once, len being its slot's own split length
// (decode_slot_split_len: from the slot's context, so a graph captured for a long capacity
// still gives a short context short splits), and serves every query head of the GQA group; it
// writes one partial per (slot, head, split); the reduce kernel merges the splits (one block
// per slot and head, a long context's splits in parallel runs) and a last one-block kernel
// advances the lengths.
//
// Two attention kernels (decode_uses_mma() picks one; the host twin follows the same one):
// - decode_attention_mma_kernel (head_dim 64 and 128, the one that runs): scores and P·V on
//   tensor cores, each warp its own 16-position sub-tiles and softmax state, K and V loaded
//   straight into registers; in attention_decode_mma.cu, described there.
// - decode_attention_kernel (head_dim 96 and 256, and the lab's HABLAR_DECODE_KERNEL=0): CUDA
//   cores, tiles of kDecodeTile positions copied asynchronously into shared memory; per tile
//   the scores, a tile softmax state merged into each head's running state
//   (online_softmax.h), and P·V. One shared-memory stage per block (about 20 KB) lets ten
//   blocks share a multiprocessor (HABLAR_DECODE_STAGES=2 selects double buffering).
#include <cuda_bf16.h>
#include <cuda_pipeline.h>

#include <algorithm>
#include <string>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_decode_internal.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/kv_elements.cuh"
#include "backend/cuda/online_softmax.h"
#include "backend/cuda/q4k_chunk.cuh"

namespace hablar::cuda {
namespace {

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

// Grid (n_kv_heads, n_slots, splits.grid), 128 threads. Per tile of kDecodeTile positions (copied
// asynchronously into one of kStages shared-memory stages): scores of every GQA head into
// shared memory; warp w turns the scores of heads w, w+4 into a tile softmax state, merges it into
// its running state (softmax_merge) and accumulates P·V for its heads, each lane owning head_dim /
// 32 dimensions.
template <KvElem kElem, int kDim, int kGroup, int kStages>
__global__ void __launch_bounds__(kDecodeWarps * 32)
    decode_attention_kernel(DecodeAttentionParams p, DecodeSplits splits, float* workspace) {
  begin_dependent_kernel();
  constexpr bool kBf16 = kv_elem_bf16(kElem);  // the staged tiles' element type
  using L = DecodeSmem<kDim, kGroup, kStages>;
  constexpr int kLd = L::kLd, kDpl = kDim / 32, kHeadsPerWarp = (kGroup + 3) / 4;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* kv_s = reinterpret_cast<uint16_t*>(smem + L::kKv);
  float* q_s = reinterpret_cast<float*>(smem + L::kQ);
  float* s_s = reinterpret_cast<float*>(smem + L::kS);

  const int kvh = blockIdx.x, slot = blockIdx.y, split = blockIdx.z;
  const auto [begin, end] = split_range(p, slot, split, splits);
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
    float* part =
        workspace + (((size_t)slot * p.n_heads + head) * splits.grid + split) * (kDim + 2);
#pragma unroll
    for (int i = 0; i < kDpl; ++i) part[2 + lane * kDpl + i] = acc[hi][i];
    if (lane == 0) {
      part[0] = state[hi].max;
      part[1] = state[hi].sum;
    }
  }
}

// One block per (slot, head) of `parts` groups of head_dim threads (decode_reduce_parts),
// a thread per dimension in each: group r merges its contiguous run of the head's splits in
// order (decode_reduce_run_range), then group 0 merges the runs in order and writes the
// normalized output (and, when asked, its int8 blocks: a warp per block of 32 dimensions).
// Groups past the slot's runs (decode_reduce_runs) idle. One group walking hundreds of splits alone
// waits out a chain of dependent merges (a long single sequence of a model with few KV heads: 256
// splits at 1 x 32k positions). kBatch: splits of a run whose loads are issued together (the order
// of the merges, and so the result, does not depend on it). The host twin merges in the same order.
template <int kBatch, int kMaxThreads>
__global__ void __launch_bounds__(kMaxThreads)
    decode_reduce_kernel(DecodeAttentionParams p, DecodeSplits splits, int parts,
                         const float* workspace) {
  begin_dependent_kernel();
  __shared__ float run_value[kDecodeReduceMaxThreads];
  __shared__ SoftmaxState run_state[kDecodeMaxReduceParts];
  const int d_head = p.layout.head_dim;
  const int slot = blockIdx.x, head = blockIdx.y, d = threadIdx.x % d_head;
  const int part = threadIdx.x / d_head;
  const size_t at = ((size_t)slot * p.n_heads + head) * d_head + d;
  if (!p.active[slot]) {  // out untouched; int8 rows of zeros (the workspace holds anything)
    if (p.out_codes != nullptr && part == 0) {
      p.out_codes[at] = 0;
      if (d % 32 == 0) static_cast<float2*>(p.out_scales)[at / 32] = make_float2(0.0f, 0.0f);
    }
    return;
  }
  // Splits past the grid (a context beyond max_context, a caller error) are not read.
  const int context = decode_context(p, slot);
  const int split_len = decode_slot_split_len(splits, context);
  const int n_valid = min(splits.grid, (context + split_len - 1) / split_len);
  // Splits wholly before a sliding window's first position wrote nothing either.
  const int first_split = decode_first_position(p, p.seq_lens[slot]) / split_len;
  const int runs = decode_reduce_runs(parts, n_valid - first_split);
  if (runs == 1 && part != 0) return;  // one run: group 0 alone, no merge of runs
  const DecodeReduceRange run = decode_reduce_run_range(first_split, n_valid, runs, part);
  const float* parts_at =
      workspace + ((size_t)slot * p.n_heads + head) * splits.grid * (d_head + 2);
  SoftmaxState total = softmax_empty();
  float merged = 0.0f;
  for (int s0 = run.begin; s0 < run.end; s0 += kBatch) {
    float state_max[kBatch], state_sum[kBatch], value[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (s0 + j >= run.end) break;
      const float* split = parts_at + (size_t)(s0 + j) * (d_head + 2);
      state_max[j] = split[0], state_sum[j] = split[1], value[j] = split[2 + d];
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (s0 + j >= run.end) break;
      merged = merge_split(total, merged, SoftmaxState{state_max[j], state_sum[j]}, value[j]);
    }
  }
  if (runs > 1) {  // every group reaches the barrier (groups past `runs` hold empty runs)
    run_value[threadIdx.x] = merged;
    if (d == 0) run_state[part] = total;
    __syncthreads();
    if (part != 0) return;
    for (int r = 1; r < runs; ++r) {
      const SoftmaxMerge m = softmax_merge(total, run_state[r]);
      merged = merged * m.factor_a + run_value[r * d_head + d] * m.factor_b;
    }
  }
  const float o = merged * softmax_inverse_sum(total);
  if (p.out != nullptr) p.out[at] = o;
  if (p.out_bf16 != nullptr) p.out_bf16[at] = __bfloat16_as_ushort(__float2bfloat16_rn(o));
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
void launch_attention_stages(const DecodeAttentionParams& p, const DecodeSplits& splits, float* ws,
                             cudaStream_t stream) {
  const size_t smem = DecodeSmem<kDim, kGroup, kStages>::kBytes;
  auto kernel = decode_attention_kernel<kElem, kDim, kGroup, kStages>;
  HABLAR_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  const dim3 grid(p.layout.n_kv_heads, p.n_slots, splits.grid);
  launch_dependent(kernel, grid, dim3(kDecodeWarps * 32), smem, stream, p, splits, ws);
}

template <KvElem kElem, int kDim, int kGroup>
void launch_attention_group(const DecodeAttentionParams& p, const DecodeSplits& splits, float* ws,
                            cudaStream_t stream) {
  if (lab_knob("HABLAR_DECODE_STAGES", 1) == 1) {
    launch_attention_stages<kElem, kDim, kGroup, 1>(p, splits, ws, stream);
  } else {
    launch_attention_stages<kElem, kDim, kGroup, 2>(p, splits, ws, stream);
  }
}

template <KvElem kElem, int kDim>
void launch_attention(const DecodeAttentionParams& p, const DecodeSplits& splits, float* ws,
                      cudaStream_t stream) {
  if (decode_uses_mma(p)) {  // head_dim 64 or 128
    launch_decode_attention_mma(p, splits, ws, stream);
    return;
  }
  const int group = p.n_heads / p.layout.n_kv_heads;
  if (group <= 1) {
    launch_attention_group<kElem, kDim, 1>(p, splits, ws, stream);
  } else if (group <= 2) {
    launch_attention_group<kElem, kDim, 2>(p, splits, ws, stream);
  } else if (group <= 4) {
    launch_attention_group<kElem, kDim, 4>(p, splits, ws, stream);
  } else {
    launch_attention_group<kElem, kDim, 8>(p, splits, ws, stream);
  }
}

template <KvElem kElem>
void launch_for_dtype(const DecodeAttentionParams& p, const DecodeSplits& splits, float* ws,
                      cudaStream_t stream) {
  if (!p.kv_stored)
    launch_dependent(decode_scatter_kernel<kElem>, dim3(p.n_slots), dim3(256), 0, stream, p);
  switch (p.layout.head_dim) {
    case 64:
      launch_attention<kElem, 64>(p, splits, ws, stream);
      break;
    case 96:
      launch_attention<kElem, 96>(p, splits, ws, stream);
      break;
    case 128:
      launch_attention<kElem, 128>(p, splits, ws, stream);
      break;
    default:
      launch_attention<kElem, 256>(p, splits, ws, stream);
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
      (!p.out && !p.out_bf16))
    fail("a required device pointer is null");
  if (workspace_bytes < decode_attention_workspace_bytes(p))
    fail("workspace of " + std::to_string(workspace_bytes) + " bytes is below the " +
         std::to_string(decode_attention_workspace_bytes(p)) + " needed");
}

}  // namespace

void decode_attention(const DecodeAttentionParams& p, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream) {
  validate(p, workspace_bytes);
  const DecodeSplits splits = decode_splits(p);
  float* ws = static_cast<float*>(workspace);
  switch (kv_elem_of(p.layout.dtype)) {
    case KvElem::kBf16:
      launch_for_dtype<KvElem::kBf16>(p, splits, ws, stream);
      break;
    case KvElem::kQ8_0:
      launch_for_dtype<KvElem::kQ8_0>(p, splits, ws, stream);
      break;
    default:
      launch_for_dtype<KvElem::kF16>(p, splits, ws, stream);
      break;
  }
  if (decode_finishes_in_attention(p, splits)) {
    if (p.advance_lengths) {
      decode_advance_kernel<<<1, 256, 0, stream>>>(p);
      HABLAR_CUDA_CHECK_LAUNCH();
    }
    return;
  }
  // One run (a short context, or a batch of many sequences): 32 splits per round trip in
  // blocks of head_dim threads. Several runs: up to 1,024 threads, whose registers allow 16
  // (HABLAR_DECODE_REDUCE_BATCH=8: 8 either way, to compare).
  const int parts = decode_reduce_parts(p);
  const bool batch8 = lab_knob("HABLAR_DECODE_REDUCE_BATCH", 0) == 8;
  const auto reduce = parts > 1
                          ? (batch8 ? decode_reduce_kernel<8, kDecodeReduceMaxThreads>
                                    : decode_reduce_kernel<16, kDecodeReduceMaxThreads>)
                          : (batch8 ? decode_reduce_kernel<8, 256> : decode_reduce_kernel<32, 256>);
  launch_dependent(reduce, dim3(p.n_slots, p.n_heads), dim3(p.layout.head_dim * parts), 0, stream,
                   p, splits, parts, static_cast<const float*>(ws));
  if (!p.advance_lengths) return;
  decode_advance_kernel<<<1, 256, 0, stream>>>(p);
  HABLAR_CUDA_CHECK_LAUNCH();
}

}  // namespace hablar::cuda
