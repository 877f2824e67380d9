// Decode-step attention: scatter kernel, split-K attention kernel, reduce kernel.
//
// Attention grid: (n_kv_heads, n_slots, n_splits), 128 threads. A block reads its KV head's
// positions [split * split_len, ...) once and serves every query head of the GQA group.
// Each warp is cut into rows of head_dim / 8 lanes; a row takes one position at a time,
// each lane one 16-byte load of K and of V (8 elements). Rows keep their own online-softmax
// state per query head; the block merges rows in order, writes one partial per
// (slot, head, split), and the reduce kernel merges the splits and advances the lengths.
#include <algorithm>
#include <string>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kv_elements.cuh"
#include "backend/cuda/online_softmax.h"

namespace hablar::cuda {
namespace {

__device__ __forceinline__ int decode_context(const DecodeAttentionParams& p, int slot) {
  const int capacity = p.max_blocks_per_seq * p.layout.block_size;
  return min(p.seq_lens[slot] + 1, capacity);
}

template <bool kBf16>
__global__ void decode_scatter_kernel(DecodeAttentionParams p) {
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
    cache[p.layout.position_offset(table, p.layer, kv, kvh, pos) + d] = kv_from_float<kBf16>(value);
  }
}

template <bool kBf16, int kDim, int kGroup>
__global__ void __launch_bounds__(kDecodeWarps * 32)
    decode_attention_kernel(DecodeAttentionParams p, int split_len, int n_splits,
                            float* workspace) {
  constexpr int kLanesPerRow = kDim / 8;
  constexpr int kRowsPerWarp = 32 / kLanesPerRow;
  constexpr int kRows = kDecodeWarps * kRowsPerWarp;
  constexpr int kUnroll = 4;
  __shared__ SoftmaxState row_state[kRows][kGroup];
  __shared__ float row_acc[kRows][kGroup][kDim];

  const int kvh = blockIdx.x, slot = blockIdx.y, split = blockIdx.z;
  if (!p.active[slot]) return;
  const int context = decode_context(p, slot);
  const int begin = split * split_len;
  if (begin >= context) return;
  const int end = min(begin + split_len, context);
  const int group = p.n_heads / p.layout.n_kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = warp * kRowsPerWarp + lane / kLanesPerRow;
  const int dim0 = (lane % kLanesPerRow) * 8;

  float q[kGroup][8];
  float acc[kGroup][8];
  SoftmaxState state[kGroup];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    state[g] = softmax_empty();
    const float* qp = p.q + ((size_t)slot * p.n_heads + kvh * group + g) * kDim + dim0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      q[g][i] = g < group ? qp[i] * p.scale : 0.0f;
      acc[g][i] = 0.0f;
    }
  }

  const int32_t* table = p.block_tables + (size_t)slot * p.max_blocks_per_seq;
  const uint16_t* cache = static_cast<const uint16_t*>(p.kv_cache);
  const size_t v_shift = p.layout.pool_elems();
  // The loop bound is uniform per warp (shuffles need every lane); rows past `end` idle.
  for (int base = begin + warp * kRowsPerWarp; base < end; base += kRows * kUnroll) {
    uint4 k_raw[kUnroll], v_raw[kUnroll];
    bool valid[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int pos = base + u * kRows + (lane / kLanesPerRow);
      valid[u] = pos < end;
      if (valid[u]) {
        const size_t at = p.layout.position_offset(table, p.layer, 0, kvh, pos) + dim0;
        k_raw[u] = __ldg(reinterpret_cast<const uint4*>(cache + at));
        v_raw[u] = __ldg(reinterpret_cast<const uint4*>(cache + at + v_shift));
      } else {
        k_raw[u] = v_raw[u] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float k[8], v[8];
      kv_unpack8<kBf16>(k_raw[u], k);
      kv_unpack8<kBf16>(v_raw[u], v);
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        float score = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) score = fmaf(q[g][i], k[i], score);
#pragma unroll
        for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2)
          score += __shfl_xor_sync(0xffffffffu, score, offset);
        if (valid[u] && g < group) {
          float rescale;
          const float weight = softmax_push(state[g], score, &rescale);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(acc[g][i], rescale, weight * v[i]);
        }
      }
    }
  }

#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
#pragma unroll
    for (int i = 0; i < 8; ++i) row_acc[row][g][dim0 + i] = acc[g][i];
    if (dim0 == 0) row_state[row][g] = state[g];
  }
  __syncthreads();

  for (int idx = threadIdx.x; idx < group * kDim; idx += blockDim.x) {
    const int g = idx / kDim, d = idx % kDim;
    SoftmaxState total = softmax_empty();
    float merged = 0.0f;
    for (int r = 0; r < kRows; ++r) {
      const SoftmaxMerge m = softmax_merge(total, row_state[r][g]);
      merged = merged * m.factor_a + row_acc[r][g][d] * m.factor_b;
    }
    const int head = kvh * group + g;
    float* part = workspace + (((size_t)slot * p.n_heads + head) * n_splits + split) * (kDim + 2);
    part[2 + d] = merged;
    if (d == 0) {
      part[0] = total.max;
      part[1] = total.sum;
    }
  }
}

// One block per slot: merges the splits of every head, writes the output, then advances
// the slot's length (after every thread has read it).
__global__ void decode_reduce_kernel(DecodeAttentionParams p, int split_len, int n_splits,
                                     const float* workspace) {
  const int slot = blockIdx.x;
  if (!p.active[slot]) return;
  const int d_head = p.layout.head_dim;
  // Splits past the grid (a context beyond max_context, a caller error) are not read.
  const int n_valid = min(n_splits, (decode_context(p, slot) + split_len - 1) / split_len);
  for (int idx = threadIdx.x; idx < p.n_heads * d_head; idx += blockDim.x) {
    const int head = idx / d_head, d = idx % d_head;
    const float* parts = workspace + ((size_t)slot * p.n_heads + head) * n_splits * (d_head + 2);
    SoftmaxState total = softmax_empty();
    float merged = 0.0f;
    for (int s = 0; s < n_valid; ++s) {
      const float* part = parts + (size_t)s * (d_head + 2);
      const SoftmaxMerge m = softmax_merge(total, SoftmaxState{part[0], part[1]});
      merged = merged * m.factor_a + part[2 + d] * m.factor_b;
    }
    p.out[((size_t)slot * p.n_heads + head) * d_head + d] = merged * softmax_inverse_sum(total);
  }
  __syncthreads();
  if (threadIdx.x == 0) p.seq_lens[slot] += 1;
}

template <bool kBf16, int kDim>
void launch_attention(const DecodeAttentionParams& p, int split_len, int n_splits, float* ws,
                      cudaStream_t stream) {
  const dim3 grid(p.layout.n_kv_heads, p.n_slots, n_splits);
  const int group = p.n_heads / p.layout.n_kv_heads;
  const int threads = kDecodeWarps * 32;
  if (group <= 1) {
    decode_attention_kernel<kBf16, kDim, 1>
        <<<grid, threads, 0, stream>>>(p, split_len, n_splits, ws);
  } else if (group <= 2) {
    decode_attention_kernel<kBf16, kDim, 2>
        <<<grid, threads, 0, stream>>>(p, split_len, n_splits, ws);
  } else if (group <= 4) {
    decode_attention_kernel<kBf16, kDim, 4>
        <<<grid, threads, 0, stream>>>(p, split_len, n_splits, ws);
  } else {
    decode_attention_kernel<kBf16, kDim, 8>
        <<<grid, threads, 0, stream>>>(p, split_len, n_splits, ws);
  }
  HABLAR_CUDA_CHECK_LAUNCH();
}

template <bool kBf16>
void launch_for_dtype(const DecodeAttentionParams& p, int split_len, int n_splits, float* ws,
                      cudaStream_t stream) {
  decode_scatter_kernel<kBf16><<<p.n_slots, 256, 0, stream>>>(p);
  HABLAR_CUDA_CHECK_LAUNCH();
  switch (p.layout.head_dim) {
    case 64:
      launch_attention<kBf16, 64>(p, split_len, n_splits, ws, stream);
      break;
    case 128:
      launch_attention<kBf16, 128>(p, split_len, n_splits, ws, stream);
      break;
    default:
      launch_attention<kBf16, 256>(p, split_len, n_splits, ws, stream);
      break;
  }
}

void validate(const DecodeAttentionParams& p, size_t workspace_bytes) {
  auto fail = [](const std::string& what) {
    throw_error(ErrorKind::kInvalidArgument, "decode_attention: " + what);
  };
  const int d = p.layout.head_dim;
  if (d != 64 && d != 128 && d != 256)
    fail("head_dim " + std::to_string(d) + " is not supported (64, 128, 256)");
  if (p.layout.n_kv_heads <= 0 || p.n_heads % p.layout.n_kv_heads != 0)
    fail("n_heads " + std::to_string(p.n_heads) + " is not a multiple of n_kv_heads " +
         std::to_string(p.layout.n_kv_heads));
  if (p.n_heads / p.layout.n_kv_heads > 8)
    fail("more than 8 query heads per KV head are not supported");
  if (p.layer < 0 || p.layer >= p.layout.n_layers) fail("layer out of range");
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
  if (p.layout.dtype == KvDType::BF16) {
    launch_for_dtype<true>(p, split_len, n_splits, ws, stream);
  } else {
    launch_for_dtype<false>(p, split_len, n_splits, ws, stream);
  }
  decode_reduce_kernel<<<p.n_slots, 256, 0, stream>>>(p, split_len, n_splits, ws);
  HABLAR_CUDA_CHECK_LAUNCH();
}

}  // namespace hablar::cuda
