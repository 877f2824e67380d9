// Attention of an embedding step (embed_kernels.h): flash attention over each sequence's own
// rows, bidirectional (encoders) or causal (decoder embedders), on tensor cores.
//
// A block of 4 warps takes one query tile (64 rows of one sequence, embed_plan.h) of one
// head; warp w owns query rows 16w..16w+15. Per key tile of 64 rows (K and V staged in
// shared memory as F16):
//   S = Q · Kᵀ            WMMA 16x16x16, f32 accumulation, into shared memory
//   online softmax         two lanes per query row: scale, soft-cap, mask, running max m
//                          and sum l (registers), P = exp(S - m) as F16, O rescaled
//   O += P · V             WMMA, O kept in shared memory in f32
// then out = O / l as F16. Shared memory (HD = 128): Q, K, V 3 x 64 x 136 halves, S 64 x 68
// floats, P 64 x 72 halves, O 64 x 132 floats: 110 KiB (2 blocks per H200 SM; 70 KiB at 64).
#include <cuda_fp16.h>
#include <mma.h>

#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/embed_kernels.h"

namespace hablar::cuda::embed {
namespace {

using namespace nvcuda;

constexpr int kBQ = kEmbedQueryTile;  // query rows per block
constexpr int kBK = 64;               // key rows per step
constexpr int kWarps = kBQ / 16;
constexpr int kSP = kBK + 4;  // S row stride (floats)
constexpr int kPP = kBK + 8;  // P row stride (halves)

template <int HD>
struct Smem {
  static constexpr int kHP = HD + 8;  // Q/K/V row stride (halves)
  static constexpr int kOP = HD + 4;  // O row stride (floats)
  static constexpr size_t q = 0;
  static constexpr size_t k = q + (size_t)kBQ * kHP * 2;
  static constexpr size_t v = k + (size_t)kBK * kHP * 2;
  static constexpr size_t s = v + (size_t)kBK * kHP * 2;
  static constexpr size_t p = s + (size_t)kBQ * kSP * 4;
  static constexpr size_t o = p + (size_t)kBQ * kPP * 2;
  static constexpr size_t bytes = o + (size_t)kBQ * kOP * 4;
};

// rows [kRows x HD] of F16 from global rows (stride `stride` halves) into shared memory
// (stride kHP), plus bias[HD] when given; rows at or past `valid` are zero.
template <int HD, int kRows>
__device__ void stage_rows(__half* dst, const __half* src, int64_t stride, int valid,
                           const float* __restrict__ bias) {
  constexpr int kChunks = HD / 8;  // 16-byte pieces per row
  for (int u = threadIdx.x; u < kRows * kChunks; u += blockDim.x) {
    const int r = u / kChunks, c = u % kChunks;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (r < valid) {
      val = *reinterpret_cast<const uint4*>(src + r * stride + c * 8);
      if (bias) {
        __half2* h = reinterpret_cast<__half2*>(&val);
        for (int e = 0; e < 4; ++e) {
          const float2 f = __half22float2(h[e]);
          h[e] = __floats2half2_rn(f.x + bias[c * 8 + 2 * e], f.y + bias[c * 8 + 2 * e + 1]);
        }
      }
    }
    *reinterpret_cast<uint4*>(dst + r * Smem<HD>::kHP + c * 8) = val;
  }
}

// S[16 x 64] = Q · Kᵀ for warp `warp`'s 16 query rows, into shared memory.
template <int HD>
__device__ void scores(const __half* qs, const __half* ks, float* ss, int warp) {
  using L = Smem<HD>;
  for (int j = 0; j < kBK / 16; ++j) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < HD / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
      wmma::load_matrix_sync(fa, qs + warp * 16 * L::kHP + kk * 16, L::kHP);
      wmma::load_matrix_sync(fb, ks + j * 16 * L::kHP + kk * 16, L::kHP);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(ss + warp * 16 * kSP + j * 16, acc, kSP, wmma::mem_row_major);
  }
}

// O[16 x HD] += P[16 x 64] · V[64 x HD] for warp `warp`'s rows (O in shared memory, f32).
template <int HD>
__device__ void accumulate(const __half* ps, const __half* vs, float* os, int warp) {
  using L = Smem<HD>;
  for (int dj = 0; dj < HD / 16; ++dj) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    float* o_tile = os + warp * 16 * L::kOP + dj * 16;
    wmma::load_matrix_sync(acc, o_tile, L::kOP, wmma::mem_row_major);
    for (int kk = 0; kk < kBK / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
      wmma::load_matrix_sync(fa, ps + warp * 16 * kPP + kk * 16, kPP);
      wmma::load_matrix_sync(fb, vs + kk * 16 * L::kHP + dj * 16, L::kHP);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(o_tile, acc, L::kOP, wmma::mem_row_major);
  }
}

// What a lane needs of its query row: its position, whether it is in the sequence, the
// first key it may see.
struct QueryRow {
  int row, half_id, qi, first;
  bool live;
};

// The online softmax of one key tile for this lane's half (32 columns) of its row: scores
// scaled, soft-capped and masked; the running max m and sum l updated (the lane pair
// agrees through shuffles); P = exp(S - m) written as F16; the row of O rescaled.
template <int HD>
__device__ void softmax_step(const AttentionArgs& a, const EmbedTile& tile, const QueryRow& r,
                             int k0, const float* ss, __half* ps, float* os, float& m, float& l) {
  float sv[kBK / 2];
  float tile_max = -INFINITY;
  for (int c = 0; c < kBK / 2; ++c) {
    const int col = r.half_id * (kBK / 2) + c, kj = k0 + col;
    float s = ss[r.row * kSP + col] * a.scale;
    if (a.softcap > 0.0f) s = a.softcap * tanhf(s / a.softcap);
    const bool ok = r.live && kj < tile.len && (!a.causal || (kj <= r.qi && kj >= r.first));
    sv[c] = ok ? s : -INFINITY;
    tile_max = fmaxf(tile_max, sv[c]);
  }
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
  const float m_new = fmaxf(m, tile_max);
  const float alpha = m_new == -INFINITY ? 1.0f : __expf(m - m_new);
  float sum = 0.0f;
  for (int c = 0; c < kBK / 2; ++c) {
    const float p = sv[c] == -INFINITY ? 0.0f : __expf(sv[c] - m_new);
    sum += p;
    ps[r.row * kPP + r.half_id * (kBK / 2) + c] = __float2half_rn(p);
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  l = l * alpha + sum;
  m = m_new;
  for (int d = r.half_id * (HD / 2); d < (r.half_id + 1) * (HD / 2); ++d)
    os[r.row * Smem<HD>::kOP + d] *= alpha;
}

template <int HD>
__global__ void __launch_bounds__(kWarps * 32) embed_attention_kernel(AttentionArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  using L = Smem<HD>;
  __half* qs = reinterpret_cast<__half*>(smem + L::q);
  __half* ks = reinterpret_cast<__half*>(smem + L::k);
  __half* vs = reinterpret_cast<__half*>(smem + L::v);
  float* ss = reinterpret_cast<float*>(smem + L::s);
  __half* ps = reinterpret_cast<__half*>(smem + L::p);
  float* os = reinterpret_cast<float*>(smem + L::o);

  const EmbedTile tile = a.tiles[blockIdx.x];
  const int h = blockIdx.y, kvh = h / (a.n_heads / a.n_kv_heads);
  const int64_t q_stride = (int64_t)a.n_heads * HD, kv_stride = (int64_t)a.n_kv_heads * HD;
  const __half* q = reinterpret_cast<const __half*>(a.q) + (int64_t)tile.base * q_stride + h * HD;
  const __half* k =
      reinterpret_cast<const __half*>(a.k) + (int64_t)tile.base * kv_stride + kvh * HD;
  const __half* v =
      reinterpret_cast<const __half*>(a.v) + (int64_t)tile.base * kv_stride + kvh * HD;
  const int n_q = min(kBQ, tile.len - tile.q0);
  stage_rows<HD, kBQ>(qs, q + tile.q0 * q_stride, q_stride, n_q, a.bq ? a.bq + h * HD : nullptr);
  for (int u = threadIdx.x; u < kBQ * L::kOP; u += blockDim.x) os[u] = 0.0f;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  QueryRow r;
  r.row = warp * 16 + lane / 2, r.half_id = lane % 2, r.qi = tile.q0 + r.row;
  r.live = r.qi < tile.len;
  r.first = a.causal && a.window > 0 && r.qi >= a.window ? r.qi - a.window + 1 : 0;
  int k_begin = 0, k_end = tile.len;  // the keys some query of the tile sees
  if (a.causal) {
    k_end = tile.q0 + n_q;
    if (a.window > 0 && tile.q0 >= a.window) k_begin = (tile.q0 - a.window + 1) / kBK * kBK;
  }
  float m = -INFINITY, l = 0.0f;
  for (int k0 = k_begin; k0 < k_end; k0 += kBK) {
    __syncthreads();  // the previous tile's products are done with ks / vs
    const int n_k = min(kBK, tile.len - k0);
    stage_rows<HD, kBK>(ks, k + k0 * kv_stride, kv_stride, n_k, a.bk ? a.bk + kvh * HD : nullptr);
    stage_rows<HD, kBK>(vs, v + k0 * kv_stride, kv_stride, n_k, a.bv ? a.bv + kvh * HD : nullptr);
    __syncthreads();
    scores<HD>(qs, ks, ss, warp);
    __syncwarp();
    softmax_step<HD>(a, tile, r, k0, ss, ps, os, m, l);
    __syncwarp();
    accumulate<HD>(ps, vs, os, warp);
    __syncwarp();
  }
  if (!r.live) return;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  __half* dst = reinterpret_cast<__half*>(a.out) + ((int64_t)tile.base + r.qi) * q_stride + h * HD;
  for (int d = r.half_id * (HD / 2); d < (r.half_id + 1) * (HD / 2); d += 2)
    *reinterpret_cast<__half2*>(dst + d) =
        __floats2half2_rn(os[r.row * L::kOP + d] * inv, os[r.row * L::kOP + d + 1] * inv);
}

template <int HD>
void launch(const AttentionArgs& a, cudaStream_t stream) {
  static const bool configured = [] {
    HABLAR_CUDA_CHECK(cudaFuncSetAttribute(embed_attention_kernel<HD>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)Smem<HD>::bytes));
    return true;
  }();
  (void)configured;
  const dim3 grid((unsigned)a.n_tiles, (unsigned)a.n_heads);
  embed_attention_kernel<HD><<<grid, kWarps * 32, Smem<HD>::bytes, stream>>>(a);
  HABLAR_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool attention_supports_head_dim(int head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 128;
}

void attention(const AttentionArgs& a, cudaStream_t stream) {
  if (a.n_tiles <= 0) return;
  if (a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0)
    throw_error(ErrorKind::kInvalidArgument,
                "embedding attention: heads not a multiple of KV heads");
  switch (a.head_dim) {
    case 32:
      return launch<32>(a, stream);
    case 64:
      return launch<64>(a, stream);
    case 128:
      return launch<128>(a, stream);
    default:
      throw_error(ErrorKind::kInvalidArgument, "embedding attention: head size " +
                                                   std::to_string(a.head_dim) +
                                                   " (32, 64 and 128 are supported)");
  }
}

}  // namespace hablar::cuda::embed
