// Attention of an embedding step (embed_kernels.h): flash attention over each sequence's own
// rows, bidirectional (encoders) or causal (decoder embedders), on tensor cores with every
// intermediate in registers.
//
// A block of 4 warps takes one query tile (64 rows of one sequence, embed_plan.h) of one
// head; warp w owns query rows 16w..16w+15 and holds them as mma A fragments (Q's bias added).
// K and V are staged in shared memory as stored (cp.async, up to 256 keys per barrier); K's
// bias adds q · b_k to all of a row's scores (added to each, so soft-capping stays exact) and
// V's adds b_v to the output (the weights sum to one). Per key tile of 64 rows:
//   S = Q · Kᵀ        mma.sync m16n8k16 (F16 in, f32 accumulation), S in registers
//   online softmax    each lane holds 16 scores of two rows (g, g + 8); scale, soft-cap,
//                     mask, running max m and sum l (f32), the row's four lanes agreeing
//                     through shuffles; P = exp(S - m) rounded to F16, O rescaled
//   O += P · V        mma.sync, P's accumulator fragments reused as A fragments, V's B
//                     fragments through ldmatrix.trans, O in registers
// then out = O / l (+ b_v) as F16. Shared memory: K and V 256 x (HD + 8) halves each at
// HD <= 64 (72 KiB at 64), 128 rows each at HD = 128.
// The fragment layouts: attention_mma.cuh.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/embed_kernels.h"

namespace hablar::cuda::embed {
namespace {

constexpr int kBQ = kEmbedQueryTile;  // query rows per block
constexpr int kBK = 64;               // key rows per step
constexpr int kWarps = kBQ / 16;

// Key tiles staged at once (all of a sequence up to 256 keys at HD <= 64): every copy of
// them is in flight together, then one barrier.
template <int HD>
struct Smem {
  static constexpr int kStage = HD <= 64 ? 4 : 2;
  static constexpr int kKeys = kStage * kBK;
  static constexpr int kKP = HD + 8;  // K and V row stride (halves): conflict-free fragments
  static constexpr size_t bytes = (size_t)2 * kKeys * kKP * 2;  // K, then V
};

// Two neighbouring F16 values (plus their biases, added in f32 and rounded once), as a reg.
__device__ __forceinline__ uint32_t load_pair(const __half* p, const float* bias) {
  uint32_t raw = *reinterpret_cast<const uint32_t*>(p);
  if (!bias) return raw;
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&raw));
  return pack_pair<false>(f.x + bias[0], f.y + bias[1]);
}

// Issues the copies of K and V rows [n_rows x HD] (stride `stride` halves) into shared memory
// (stride kKP), rows at or past `valid` zero; wait_kv waits for them and for the block.
template <int HD>
__device__ void issue_kv(__half* ks, __half* vs, const __half* k, const __half* v, int64_t stride,
                         int n_rows, int valid) {
  constexpr int kChunks = HD / 8;  // 16-byte pieces per row
  for (int u = threadIdx.x; u < n_rows * kChunks; u += blockDim.x) {
    const int r = u / kChunks, c = u % kChunks;
    const bool ok = r < valid;
    const int64_t at = (ok ? r : 0) * stride + c * 8;
    copy16_async_or_zero(ks + r * Smem<HD>::kKP + c * 8, k + at, ok);
    copy16_async_or_zero(vs + r * Smem<HD>::kKP + c * 8, v + at, ok);
  }
}
__device__ __forceinline__ void wait_kv() {
  wait_async_all();
  __syncthreads();
}

// The B fragment pair of V rows [16kk, 16kk + 16) x columns [8dj, 8dj + 8) from row-major V
// in shared memory: ldmatrix's transposing load hands lane (g, t) keys 2t, 2t + 1 (+ 8) of
// column g.
__device__ __forceinline__ void load_v_fragment(const __half* tile_rows, int stride, int lane,
                                                uint32_t& b0, uint32_t& b1) {
  const __half* p = tile_rows + (lane % 16) * stride;
  const unsigned addr = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(b0), "=r"(b1)
               : "r"(addr));
}

// What a lane knows of its two query rows (g and g + 8 of its warp's 16).
struct LaneRows {
  int qi[2], first[2];
  bool live[2];
  float key_bias[2];  // q · b_k of the row: what K's bias adds to each of its scores
};

// The online softmax of one key tile over the lane's scores s (C fragments, columns
// k0 + 8j + 2t + {0, 1}): K's bias term added, scaled, soft-capped and masked; m and l updated per
// row (the four lanes of a row agree through shuffles); s becomes P = exp(S - m); alpha[i] the
// factor row i's O is rescaled by.
__device__ __forceinline__ void softmax_tile(const AttentionArgs& a, const EmbedTile& tile,
                                             const LaneRows& r, int k0, int t,
                                             float (&s)[kBK / 8][4], float (&m)[2], float (&l)[2],
                                             float (&alpha)[2]) {
  const float* row_bias = r.key_bias;
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < kBK / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e / 2, kj = k0 + 8 * j + 2 * t + (e & 1);
      float x = (s[j][e] + row_bias[i]) * a.scale;
      if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
      const bool ok =
          r.live[i] && kj < tile.len && (!a.causal || (kj <= r.qi[i] && kj >= r.first[i]));
      s[j][e] = ok ? x : -INFINITY;
      tile_max[i] = fmaxf(tile_max[i], s[j][e]);
    }
  }
  float sum[2] = {0.0f, 0.0f}, m_new[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 1));
    tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 2));
    m_new[i] = fmaxf(m[i], tile_max[i]);
    alpha[i] = m_new[i] == -INFINITY ? 1.0f : __expf(m[i] - m_new[i]);
  }
#pragma unroll
  for (int j = 0; j < kBK / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e / 2;
      const float p = s[j][e] == -INFINITY ? 0.0f : __expf(s[j][e] - m_new[i]);
      sum[i] += p;
      s[j][e] = p;
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], 1);
    sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], 2);
    l[i] = l[i] * alpha[i] + sum[i];
    m[i] = m_new[i];
  }
}

// r.key_bias[i] = q_i · b_k over the row's Q fragments (f32; the row's four lanes each hold a
// quarter of its columns), 0 without a K bias.
template <int HD>
__device__ __forceinline__ void key_bias_terms(const uint32_t (&qa)[HD / 16][4], const float* bk,
                                               int t, LaneRows& r) {
  r.key_bias[0] = r.key_bias[1] = 0.0f;
  if (!bk) return;
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 16 * kk + 2 * t + 8 * (e / 2);
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&qa[kk][e]));
      r.key_bias[e % 2] += f.x * bk[col] + f.y * bk[col + 1];
    }
  }
  for (int i = 0; i < 2; ++i) {
    r.key_bias[i] += __shfl_xor_sync(0xffffffffu, r.key_bias[i], 1);
    r.key_bias[i] += __shfl_xor_sync(0xffffffffu, r.key_bias[i], 2);
  }
}

template <int HD>
__global__ void __launch_bounds__(kWarps * 32)
    embed_attention_kernel(AttentionArgs a, int stage_keys) {
  extern __shared__ __align__(128) unsigned char smem[];
  using L = Smem<HD>;
  __half* ks = reinterpret_cast<__half*>(smem);
  __half* vs = ks + stage_keys * L::kKP;

  const EmbedTile tile = a.tiles[blockIdx.x];
  const int h = blockIdx.y, kvh = h / (a.n_heads / a.n_kv_heads);
  const int64_t q_stride = (int64_t)a.n_heads * HD, kv_stride = (int64_t)a.n_kv_heads * HD;
  const __half* q = reinterpret_cast<const __half*>(a.q) + (int64_t)tile.base * q_stride + h * HD;
  const __half* k =
      reinterpret_cast<const __half*>(a.k) + (int64_t)tile.base * kv_stride + kvh * HD;
  const __half* v =
      reinterpret_cast<const __half*>(a.v) + (int64_t)tile.base * kv_stride + kvh * HD;
  const float* bq = a.bq ? a.bq + h * HD : nullptr;
  const float* bk = a.bk ? a.bk + kvh * HD : nullptr;
  const float* bv = a.bv ? a.bv + kvh * HD : nullptr;
  const int n_q = min(kBQ, tile.len - tile.q0);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  LaneRows r;
  for (int i = 0; i < 2; ++i) {
    r.qi[i] = tile.q0 + warp * 16 + g + 8 * i;
    r.live[i] = r.qi[i] < tile.len;
    r.first[i] = a.causal && a.window > 0 && r.qi[i] >= a.window ? r.qi[i] - a.window + 1 : 0;
  }
  const bool warp_live = tile.q0 + warp * 16 < tile.len;
  int k_begin = 0, k_end = tile.len;  // the keys some query of the tile sees
  if (a.causal) {
    k_end = tile.q0 + n_q;
    if (a.window > 0 && tile.q0 >= a.window) k_begin = (tile.q0 - a.window + 1) / kBK * kBK;
  }
  // Stage s0's keys: [s0, s0 + stage_keys) ∩ [s0, k_end), whole tiles.
  const auto issue_stage = [&](int s0) {
    const int n_rows = min(stage_keys, k_end - s0);
    issue_kv<HD>(ks, vs, k + s0 * kv_stride, v + s0 * kv_stride, kv_stride,
                 (n_rows + kBK - 1) / kBK * kBK, tile.len - s0);
  };
  if (k_begin < k_end) issue_stage(k_begin);  // in flight while Q loads
  // The warp's Q rows as A fragments (rows past the sequence are zero).
  uint32_t qa[HD / 16][4];
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e % 2, col = 16 * kk + 2 * t + 8 * (e / 2);
      qa[kk][e] = r.live[i] ? load_pair(q + r.qi[i] * q_stride + col, bq ? bq + col : nullptr) : 0u;
    }
  }
  float o[HD / 8][4];
#pragma unroll
  for (int dj = 0; dj < HD / 8; ++dj) o[dj][0] = o[dj][1] = o[dj][2] = o[dj][3] = 0.0f;

  key_bias_terms<HD>(qa, bk, t, r);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int s0 = k_begin; s0 < k_end; s0 += stage_keys) {
    if (s0 != k_begin) {
      __syncthreads();  // every warp is done with the previous stage's ks / vs
      issue_stage(s0);
    }
    wait_kv();
    const int n_rows = min(stage_keys, k_end - s0);
    if (!warp_live) continue;
    for (int k0 = s0; k0 < s0 + n_rows; k0 += kBK) {
      const __half* kt = ks + (k0 - s0) * L::kKP;
      const __half* vt = vs + (k0 - s0) * L::kKP;
      float sc[kBK / 8][4];
#pragma unroll
      for (int j = 0; j < kBK / 8; ++j) {
        sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
        const __half* krow = kt + (8 * j + g) * L::kKP + 2 * t;
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk)
          mma_m16n8k16<false>(sc[j], qa[kk], *reinterpret_cast<const uint32_t*>(krow + 16 * kk),
                              *reinterpret_cast<const uint32_t*>(krow + 16 * kk + 8));
      }
      float alpha[2];
      softmax_tile(a, tile, r, k0, t, sc, m, l, alpha);
#pragma unroll
      for (int dj = 0; dj < HD / 8; ++dj)
        o[dj][0] *= alpha[0], o[dj][1] *= alpha[0], o[dj][2] *= alpha[1], o[dj][3] *= alpha[1];
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        uint32_t pa[4];
        p_fragment<false>(sc, kk, pa);
#pragma unroll
        for (int dj = 0; dj < HD / 8; ++dj) {
          uint32_t b0, b1;
          load_v_fragment(vt + 16 * kk * L::kKP + 8 * dj, L::kKP, lane, b0, b1);
          mma_m16n8k16<false>(o[dj], pa, b0, b1);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!r.live[i]) continue;
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
    const bool add_bv = bv && l[i] > 0.0f;  // the weights sum to one: V's bias comes out whole
    __half* dst =
        reinterpret_cast<__half*>(a.out) + ((int64_t)tile.base + r.qi[i]) * q_stride + h * HD;
#pragma unroll
    for (int dj = 0; dj < HD / 8; ++dj) {
      const int col = 8 * dj + 2 * t;
      *reinterpret_cast<__half2*>(dst + col) =
          __floats2half2_rn(o[dj][2 * i] * inv + (add_bv ? bv[col] : 0.0f),
                            o[dj][2 * i + 1] * inv + (add_bv ? bv[col + 1] : 0.0f));
    }
  }
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
  // Keys staged per barrier: the longest sequence's, in whole tiles, up to the most that fit
  // (a smaller stage leaves room for more blocks per SM).
  const int longest = a.max_len > 0 ? a.max_len : Smem<HD>::kKeys;
  const int stage_keys = std::min(Smem<HD>::kKeys, (longest + kBK - 1) / kBK * kBK);
  const size_t bytes = (size_t)2 * stage_keys * Smem<HD>::kKP * 2;
  const dim3 grid((unsigned)a.n_tiles, (unsigned)a.n_heads);
  embed_attention_kernel<HD><<<grid, kWarps * 32, bytes, stream>>>(a, stage_keys);
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
