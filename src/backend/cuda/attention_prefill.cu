// Prefill attention: scatter a chunk of prompt tokens into the paged cache, then causal
// flash attention of those tokens over every cached position up to their own (GQA).
//
// Attention grid: (query tiles of 64, n_heads, n_seqs), 4 warps; warp w owns 16 query rows.
// Per KV tile of 64 positions (read from the cache's 16-position pages into shared memory):
// S = Q Kᵀ on tensor cores (WMMA 16x16x16, f16/bf16 in, f32 out), a tile softmax state per
// row merged into the running state with softmax_merge (online_softmax.h: the same rescale
// as the decode path), O = O * factor + P V on tensor cores with O kept in shared memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <string>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kv_elements.cuh"
#include "backend/cuda/online_softmax.h"

namespace hablar::cuda {
namespace {

constexpr int kTile = 64, kWarps = 4, kPad = 8;

// Sequence s's chunk: its first token row and its token count.
__device__ __forceinline__ int chunk_tokens(const PrefillAttentionParams& p, int s) {
  return p.token_count != nullptr ? p.token_count[s] : p.token_begin[s + 1] - p.token_begin[s];
}
__device__ __forceinline__ const int32_t* chunk_table(const PrefillAttentionParams& p, int s) {
  return p.block_tables +
         (size_t)(p.tables_per_token ? p.token_begin[s] : s) * p.max_blocks_per_seq;
}

// Grid (max_chunk, n_seqs): token i of sequence s's chunk.
template <bool kBf16>
__global__ void prefill_scatter_kernel(PrefillAttentionParams p) {
  const int s = blockIdx.y, i = blockIdx.x;
  if (i >= chunk_tokens(p, s)) return;
  const int token = p.token_begin[s] + i, pos = p.cached_len[s] + i;
  if (pos >= p.max_blocks_per_seq * p.layout.block_size) return;
  const int32_t* table = chunk_table(p, s);
  const int d_head = p.layout.head_dim, per_kv = p.layout.n_kv_heads * d_head;
  uint16_t* cache = static_cast<uint16_t*>(p.kv_cache);
  for (int i = threadIdx.x; i < 2 * per_kv; i += blockDim.x) {
    const int kv = i / per_kv, kvh = (i % per_kv) / d_head, d = i % d_head;
    const float value = (kv == 0 ? p.k_new : p.v_new)[(size_t)token * per_kv + kvh * d_head + d];
    cache[p.layout.position_offset(table, p.layer, kv, kvh, pos) + d] = kv_from_float<kBf16>(value);
  }
}

template <bool kBf16, int kDim>
struct PrefillSmem {
  using Elem = std::conditional_t<kBf16, __nv_bfloat16, __half>;
  static constexpr int kLd = kDim + kPad;    // Q, K, V rows (elements)
  static constexpr int kLdS = kTile + 4;     // S rows (floats)
  static constexpr int kLdP = kTile + kPad;  // P rows (elements)
  static constexpr int kLdO = kDim + 4;      // O rows (floats)
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + sizeof(Elem) * kTile * kLd;
  static constexpr size_t kV = kK + sizeof(Elem) * kTile * kLd;
  static constexpr size_t kS = kV + sizeof(Elem) * kTile * kLd;
  static constexpr size_t kP = kS + sizeof(float) * kTile * kLdS;
  static constexpr size_t kO = kP + sizeof(Elem) * kTile * kLdP;
  static constexpr size_t kBytes = kO + sizeof(float) * kTile * kLdO;
};

template <bool kBf16, int kDim>
__global__ void __launch_bounds__(kWarps * 32) prefill_attention_kernel(PrefillAttentionParams p) {
  using namespace nvcuda;
  using L = PrefillSmem<kBf16, kDim>;
  using Elem = typename L::Elem;
  extern __shared__ __align__(128) unsigned char smem[];
  Elem* qs = reinterpret_cast<Elem*>(smem + L::kQ);
  Elem* ks = reinterpret_cast<Elem*>(smem + L::kK);
  Elem* vs = reinterpret_cast<Elem*>(smem + L::kV);
  float* ss = reinterpret_cast<float*>(smem + L::kS);
  Elem* ps = reinterpret_cast<Elem*>(smem + L::kP);
  float* os = reinterpret_cast<float*>(smem + L::kO);

  const int s = blockIdx.z, head = blockIdx.y, q0 = blockIdx.x * kTile;
  const int first = p.token_begin[s], chunk = chunk_tokens(p, s);
  if (q0 >= chunk) return;
  const int cached = p.cached_len[s];
  const int kvh = head / (p.n_heads / p.layout.n_kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t* table = chunk_table(p, s);
  const uint16_t* cache = static_cast<const uint16_t*>(p.kv_cache);

  // Q tile (scaled) and O = 0.
  for (int i = threadIdx.x; i < kTile * kDim; i += blockDim.x) {
    const int r = i / kDim, d = i % kDim;
    const float v = q0 + r < chunk
                        ? p.q[((size_t)(first + q0 + r) * p.n_heads + head) * kDim + d] * p.scale
                        : 0.0f;
    if constexpr (kBf16)
      qs[r * L::kLd + d] = __float2bfloat16_rn(v);
    else
      qs[r * L::kLd + d] = __float2half_rn(v);
    os[r * L::kLdO + d] = 0.0f;
  }
  // Each lane pair owns one of the warp's 16 rows; lane & 1 picks a half of the columns.
  const int my_row = warp * 16 + lane / 2, half = lane & 1;
  const int my_query = q0 + my_row;  // index within the chunk
  const int my_pos = cached + my_query;
  SoftmaxState state = softmax_empty();
  const bool warp_live = q0 + warp * 16 < chunk;
  const int last_pos = cached + min(chunk, q0 + kTile) - 1;

  for (int t0 = 0; t0 <= last_pos; t0 += kTile) {
    __syncthreads();  // previous tile's K/V (and the Q/O fill) are done with
    for (int i = threadIdx.x; i < kTile * (kDim / 8); i += blockDim.x) {
      const int r = i / (kDim / 8), c = (i % (kDim / 8)) * 8;
      const int pos = t0 + r;
      uint4 kraw = make_uint4(0, 0, 0, 0), vraw = kraw;
      if (pos <= last_pos) {
        const size_t at = p.layout.position_offset(table, p.layer, 0, kvh, pos) + c;
        kraw = *reinterpret_cast<const uint4*>(cache + at);
        vraw = *reinterpret_cast<const uint4*>(cache + at + p.layout.pool_elems());
      }
      *reinterpret_cast<uint4*>(ks + r * L::kLd + c) = kraw;
      *reinterpret_cast<uint4*>(vs + r * L::kLd + c) = vraw;
    }
    __syncthreads();
    if (!warp_live) continue;

    // S = Q Kᵀ for the warp's 16 rows.
    float* s_w = ss + warp * 16 * L::kLdS;
    for (int f = 0; f < kTile / 16; ++f) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < kDim; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, Elem, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, Elem, wmma::col_major> b;
        wmma::load_matrix_sync(a, qs + warp * 16 * L::kLd + kk, L::kLd);
        wmma::load_matrix_sync(b, ks + f * 16 * L::kLd + kk, L::kLd);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(s_w + f * 16, acc, L::kLdS, wmma::mem_row_major);
    }
    __syncwarp();

    // Tile softmax state of my row (causal mask), merged into the running state.
    const float* s_row = s_w + (lane / 2) * L::kLdS;
    float tile_max = -INFINITY;
    for (int j = half * 32; j < half * 32 + 32; ++j)
      if (my_query < chunk && t0 + j <= my_pos) tile_max = fmaxf(tile_max, s_row[j]);
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    float tile_sum = 0.0f;
    Elem* p_row = ps + (warp * 16 + lane / 2) * L::kLdP;
    float e[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int col = half * 32 + j;
      const bool ok = my_query < chunk && t0 + col <= my_pos;
      e[j] = ok ? softmax_exp(s_row[col] - tile_max) : 0.0f;
      tile_sum += e[j];
    }
    tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, 1);
    const SoftmaxMerge merge = softmax_merge(state, SoftmaxState{tile_max, tile_sum});
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      if constexpr (kBf16)
        p_row[half * 32 + j] = __float2bfloat16_rn(e[j] * merge.factor_b);
      else
        p_row[half * 32 + j] = __float2half_rn(e[j] * merge.factor_b);
    }
    float* o_row = os + (warp * 16 + lane / 2) * L::kLdO;
    for (int d = half * (kDim / 2); d < (half + 1) * (kDim / 2); ++d) o_row[d] *= merge.factor_a;
    __syncwarp();

    // O += P V.
    for (int f = 0; f < kDim / 16; ++f) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      float* o_tile = os + warp * 16 * L::kLdO + f * 16;
      wmma::load_matrix_sync(acc, o_tile, L::kLdO, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kTile; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, Elem, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, Elem, wmma::row_major> b;
        wmma::load_matrix_sync(a, ps + warp * 16 * L::kLdP + kk, L::kLdP);
        wmma::load_matrix_sync(b, vs + kk * L::kLd + f * 16, L::kLd);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(o_tile, acc, L::kLdO, wmma::mem_row_major);
    }
    __syncwarp();
  }
  if (!warp_live || my_query >= chunk) return;
  const float inv = softmax_inverse_sum(state);
  const float* o_row = os + my_row * L::kLdO;
  float* out = p.out + ((size_t)(first + my_query) * p.n_heads + head) * kDim;
  for (int d = half * (kDim / 2); d < (half + 1) * (kDim / 2); ++d) out[d] = o_row[d] * inv;
}

template <bool kBf16, int kDim>
void launch_prefill(const PrefillAttentionParams& p, cudaStream_t stream) {
  const size_t smem = PrefillSmem<kBf16, kDim>::kBytes;
  auto kernel = prefill_attention_kernel<kBf16, kDim>;
  HABLAR_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  const dim3 grid((p.max_chunk + kTile - 1) / kTile, p.n_heads, p.n_seqs);
  kernel<<<grid, kWarps * 32, smem, stream>>>(p);
  HABLAR_CUDA_CHECK_LAUNCH();
}

template <bool kBf16>
void prefill_for_dtype(const PrefillAttentionParams& p, cudaStream_t stream) {
  if (!p.kv_stored) {
    prefill_scatter_kernel<kBf16><<<dim3(p.max_chunk, p.n_seqs), 256, 0, stream>>>(p);
    HABLAR_CUDA_CHECK_LAUNCH();
  }
  if (p.layout.head_dim == 64)
    launch_prefill<kBf16, 64>(p, stream);
  else
    launch_prefill<kBf16, 128>(p, stream);
}

}  // namespace

void prefill_attention(const PrefillAttentionParams& p, cudaStream_t stream) {
  auto fail = [](const std::string& what) {
    throw_error(ErrorKind::kInvalidArgument, "prefill_attention: " + what);
  };
  if (p.layout.head_dim != 64 && p.layout.head_dim != 128)
    fail("head_dim " + std::to_string(p.layout.head_dim) + " is not supported (64, 128)");
  if (p.layout.n_kv_heads <= 0 || p.n_heads % p.layout.n_kv_heads != 0)
    fail("n_heads is not a multiple of n_kv_heads");
  if (p.layer < 0 || p.layer >= p.layout.n_layers) fail("layer out of range");
  if (p.n_seqs <= 0 || p.total_tokens <= 0 || p.max_chunk <= 0) fail("empty batch");
  if (!p.kv_cache || !p.block_tables || !p.token_begin || !p.cached_len || !p.q || !p.k_new ||
      !p.v_new || !p.out)
    fail("a required device pointer is null");
  if (p.layout.dtype == KvDType::BF16)
    prefill_for_dtype<true>(p, stream);
  else
    prefill_for_dtype<false>(p, stream);
}

}  // namespace hablar::cuda
