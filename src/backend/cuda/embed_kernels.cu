// Element-wise, row-wise and pooling kernels of the embedding ops (embed_kernels.h).
// Memory-bound: grid-stride loops over 16-byte groups of F16 values; LayerNorm a warp per row.
#include <cuda_fp16.h>

#include <cub/block/block_reduce.cuh>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/embed_kernels.h"

namespace hablar::cuda::embed {
namespace {

constexpr int kThreads = 256;
constexpr int kRowThreads = 256;

// Enough blocks to fill the device a few times over; the loops stride over the rest.
int grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  const int64_t cap = (int64_t)device_multiprocessors() * 16;
  return (int)(blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
}

// tanh(u) = 1 - 2 / (e^2u + 1) with the fast exponential (a few ulp; the result is rounded
// to F16 in the F16 paths anyway). Saturates cleanly: e^2u = inf gives 1, 0 gives -1.
__device__ __forceinline__ float fast_tanh(float u) {
  return 1.0f - __fdividef(2.0f, __expf(2.0f * u) + 1.0f);
}

// llama.cpp's GELU (tanh form): 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))).
__device__ __forceinline__ float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  return 0.5f * x * (1.0f + fast_tanh(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x)));
}

__device__ __forceinline__ float silu(float x) {
  return __fdividef(x, 1.0f + __expf(-x));
}

// Eight F16 values (one 16-byte access) as four pairs.
struct __align__(16) Half8 {
  __half2 h[4];
};

__global__ void f32_to_f16_kernel(const float* __restrict__ in, __half* out, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = __float2half_rn(in[i]);
}

__global__ void f16_to_f32_kernel(const __half* __restrict__ in, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = __half2float(in[i]);
}

// Eight f32 parameters at p[0..8): two 16-byte loads when p is 16-byte aligned (kVec), else
// eight 4-byte ones.
template <bool kVec>
__device__ __forceinline__ void load8_params(const float* __restrict__ p, float* v) {
  if constexpr (kVec) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p));
    const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    for (int e = 0; e < 8; ++e) v[e] = __ldg(p + e);
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Rows [rows x 8 * groups_per_row] in blocks of kBiasRows rows: thread x takes column groups
// x, x + blockDim.x, ... of 8 values (one 16-byte access each), their bias loaded once and
// the block's rows loaded together before the math (independent loads in flight).
constexpr int kBiasRows = 8;
template <bool kVec>
__global__ void bias_act_f16_kernel(Half8* y, const float* __restrict__ bias, int rows,
                                    int groups_per_row, bool gelu) {
  const int r0 = blockIdx.x * kBiasRows, n = min(kBiasRows, rows - r0);
  for (int cg = threadIdx.x; cg < groups_per_row; cg += blockDim.x) {
    float bb[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (bias) load8_params<kVec>(bias + 8 * cg, bb);
    Half8 v[kBiasRows];
#pragma unroll
    for (int r = 0; r < kBiasRows; ++r)
      if (r < n) v[r] = y[(int64_t)(r0 + r) * groups_per_row + cg];
#pragma unroll
    for (int r = 0; r < kBiasRows; ++r) {
      if (r >= n) break;
      for (int e = 0; e < 4; ++e) {
        float2 f = __half22float2(v[r].h[e]);
        f.x += bb[2 * e], f.y += bb[2 * e + 1];
        if (gelu) f.x = gelu_tanh(f.x), f.y = gelu_tanh(f.y);
        v[r].h[e] = __floats2half2_rn(f.x, f.y);
      }
      y[(int64_t)(r0 + r) * groups_per_row + cg] = v[r];
    }
  }
}

__global__ void bias_act_f32_kernel(float* y, const float* __restrict__ bias, int64_t n,
                                    int64_t width, int act) {  // act: 0 none, 1 GELU, 2 tanh
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float v = y[i];
    if (bias) v += bias[i % width];
    if (act == 1) v = gelu_tanh(v);
    if (act == 2) v = tanhf(v);  // (the reranker head: a few rows, exact tanh)
    y[i] = v;
  }
}

__global__ void glu_f16_kernel(const Half8* __restrict__ gate, const Half8* __restrict__ up,
                               Half8* out, int64_t groups, bool gelu) {
  for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < groups;
       j += (int64_t)gridDim.x * blockDim.x) {
    const Half8 g8 = gate[j], u8 = up[j];
    Half8 o;
    for (int e = 0; e < 4; ++e) {
      const float2 g = __half22float2(g8.h[e]), u = __half22float2(u8.h[e]);
      const float a = gelu ? gelu_tanh(g.x) : silu(g.x), b = gelu ? gelu_tanh(g.y) : silu(g.y);
      o.h[e] = __floats2half2_rn(a * u.x, b * u.y);
    }
    out[j] = o;
  }
}

__device__ __forceinline__ float load(RowsIn r, size_t i) {
  return r.f16 ? __half2float(static_cast<const __half*>(r.data)[i])
               : static_cast<const float*>(r.data)[i];
}

// Eight consecutive values of rows in either form (i a multiple of 8: 16- or 32-byte loads).
__device__ __forceinline__ void load8(RowsIn r, size_t i, float* v) {
  if (r.f16) {
    const Half8 h = *reinterpret_cast<const Half8*>(static_cast<const __half*>(r.data) + i);
    for (int e = 0; e < 4; ++e) {
      const float2 f = __half22float2(h.h[e]);
      v[2 * e] = f.x, v[2 * e + 1] = f.y;
    }
    return;
  }
  const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(r.data) + i);
  const float4 a = p[0], b = p[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One warp per row (width a multiple of 8, at most kChunks * 256): lane l holds chunks
// l, l + 32, ... of 8 values in registers, so the inputs are read once and the sums are
// warp shuffles (no block barriers). Every lane writes only the chunks it read, so an
// output may alias an input. kF16: every row input present is F16 (an encoder's steps);
// then all of a lane's 16-byte loads are issued before any value is used, so a warp keeps
// 2 x kChunks loads in flight instead of two (the kernel is latency-bound otherwise).
template <int kChunks, bool kVec, bool kF16>
__global__ void layernorm_warp_kernel(RowsIn x, const float* __restrict__ bias, RowsIn residual,
                                      const float* __restrict__ w, const float* __restrict__ b,
                                      float* out32, __half* out16, int rows, int width, float eps) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int n_chunks = width / 8;
  const size_t off = (size_t)row * width;
  float v[kChunks][8];
  float sum = 0.0f;
  if constexpr (kF16) {
    Half8 hx[kChunks], hr[kChunks];
    const auto* xs = static_cast<const Half8*>(x.data) + off / 8;
    const auto* rs = static_cast<const Half8*>(residual.data) + off / 8;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = lane + 32 * i;
      if (c >= n_chunks) continue;
      hx[i] = xs[c];
      if (residual.data) hr[i] = rs[c];
    }
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = lane + 32 * i;
      if (c >= n_chunks) continue;
      float bb[8];
      if (bias) load8_params<kVec>(bias + c * 8, bb);
      for (int e = 0; e < 4; ++e) {  // x + bias + residual, in the f32 path's order
        const float2 f = __half22float2(hx[i].h[e]);
        const float2 r = residual.data ? __half22float2(hr[i].h[e]) : make_float2(0.0f, 0.0f);
        v[i][2 * e] = bias ? f.x + bb[2 * e] : f.x;
        v[i][2 * e + 1] = bias ? f.y + bb[2 * e + 1] : f.y;
        if (residual.data) v[i][2 * e] += r.x, v[i][2 * e + 1] += r.y;
      }
      for (int e = 0; e < 8; ++e) sum += v[i][e];
    }
  } else {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = lane + 32 * i;
      if (c >= n_chunks) continue;
      load8(x, off + (size_t)c * 8, v[i]);
      float r[8], bb[8];
      if (residual.data) load8(residual, off + (size_t)c * 8, r);
      if (bias) load8_params<kVec>(bias + c * 8, bb);
      for (int e = 0; e < 8; ++e) {
        if (bias) v[i][e] += bb[e];
        if (residual.data) v[i][e] += r[e];
        sum += v[i][e];
      }
    }
  }
  const float mean = warp_sum(sum) / (float)width;
  float var = 0.0f;
#pragma unroll
  for (int i = 0; i < kChunks; ++i)
    if (lane + 32 * i < n_chunks)
      for (int e = 0; e < 8; ++e) var = fmaf(v[i][e] - mean, v[i][e] - mean, var);
  const float scale = rsqrtf(warp_sum(var) / (float)width + eps);
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = lane + 32 * i;
    if (c >= n_chunks) continue;
    float y[8], ww[8], bb[8] = {};
    load8_params<kVec>(w + c * 8, ww);
    if (b) load8_params<kVec>(b + c * 8, bb);  // (null: a LayerNorm without a bias)
    for (int e = 0; e < 8; ++e) y[e] = (v[i][e] - mean) * scale * ww[e] + (b ? bb[e] : 0.0f);
    const size_t at = off + (size_t)c * 8;
    if (out16) {
      Half8 h;
      for (int e = 0; e < 4; ++e) h.h[e] = __floats2half2_rn(y[2 * e], y[2 * e + 1]);
      *reinterpret_cast<Half8*>(out16 + at) = h;
    }
    if (out32) {
      float4* o = reinterpret_cast<float4*>(out32 + at);
      o[0] = make_float4(y[0], y[1], y[2], y[3]);
      o[1] = make_float4(y[4], y[5], y[6], y[7]);
    }
  }
}

// One block per row (rows too wide for the warp kernel); v is computed again from the inputs in
// each of the three passes (the row stays in L1/L2), each thread at the same columns throughout, so
// an output may alias an input. Mean, then the variance of the deviations (two passes, f32).
__global__ void layernorm_kernel(RowsIn x, const float* __restrict__ bias, RowsIn residual,
                                 const float* __restrict__ w, const float* __restrict__ b,
                                 float* out32, __half* out16, int width, float eps) {
  using Reduce = cub::BlockReduce<float, kRowThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ float shared_mean, shared_scale;
  const size_t off = (size_t)blockIdx.x * width;
  const auto value = [&](int i) {
    float v = load(x, off + i);
    if (bias) v += bias[i];
    if (residual.data) v += load(residual, off + i);
    return v;
  };
  float sum = 0.0f;
  for (int i = threadIdx.x; i < width; i += kRowThreads) sum += value(i);
  sum = Reduce(temp).Sum(sum);
  if (threadIdx.x == 0) shared_mean = sum / (float)width;
  __syncthreads();
  const float mean = shared_mean;
  float var = 0.0f;
  for (int i = threadIdx.x; i < width; i += kRowThreads) {
    const float d = value(i) - mean;
    var = fmaf(d, d, var);
  }
  var = Reduce(temp).Sum(var);
  if (threadIdx.x == 0) shared_scale = rsqrtf(var / (float)width + eps);
  __syncthreads();
  const float scale = shared_scale;
  for (int i = threadIdx.x; i < width; i += kRowThreads) {
    const float y = (value(i) - mean) * scale * w[i] + (b ? b[i] : 0.0f);
    if (out32) out32[off + i] = y;
    if (out16) out16[off + i] = __float2half_rn(y);
  }
}

__global__ void rope_table_kernel(float* x, const int32_t* __restrict__ positions,
                                  const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                  int heads, int head_dim, int pairs, bool neox) {
  const int t = blockIdx.x;
  const int pos = positions[t];
  float* row = x + (size_t)t * heads * head_dim;
  for (int u = threadIdx.x; u < heads * pairs; u += blockDim.x) {
    const int h = u / pairs, i = u % pairs;
    float* hv = row + h * head_dim;
    const int a = neox ? i : 2 * i, b = neox ? i + pairs : 2 * i + 1;
    const float c = cos_t[(size_t)pos * pairs + i], s = sin_t[(size_t)pos * pairs + i];
    const float x0 = hv[a], x1 = hv[b];
    hv[a] = x0 * c - x1 * s;
    hv[b] = x0 * s + x1 * c;
  }
}

// Grid (sequences, column blocks): each thread pools one column of one sequence.
__global__ void pool_kernel(PoolArgs a) {
  const int s = blockIdx.x;
  const int64_t col = blockIdx.y * (int64_t)blockDim.x + threadIdx.x;
  if (col >= a.width) return;
  const int32_t begin = a.seq_begin[s], end = a.seq_begin[s + 1];
  const int8_t p = a.pooling[s];
  float* dst = a.out + a.out_begin[s];
  if (p == (int8_t)Pooling::kNone) {
    for (int32_t t = begin; t < end; ++t)
      dst[(t - begin) * a.width + col] = a.hidden[(size_t)t * a.width + col];
    return;
  }
  if (p == (int8_t)Pooling::kMean) {
    const float inv = 1.0f / (float)(end - begin);
    float sum = 0.0f;
    for (int32_t t = begin; t < end; ++t) sum += a.hidden[(size_t)t * a.width + col] * inv;
    dst[col] = sum;
    return;
  }
  const float v = a.hidden[(size_t)pooled_row(p, begin, end) * a.width + col];
  if (p == (int8_t)Pooling::kRank) {
    a.rank_rows[(size_t)a.rank_slot[s] * a.width + col] = v;
  } else {
    dst[col] = v;
  }
}

}  // namespace

void f32_to_f16(const float* in, uint16_t* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  f32_to_f16_kernel<<<grid_for(n), kThreads, 0, stream>>>(in, reinterpret_cast<__half*>(out), n);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void f16_to_f32(const uint16_t* in, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  f16_to_f32_kernel<<<grid_for(n), kThreads, 0, stream>>>(reinterpret_cast<const __half*>(in), out,
                                                          n);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void bias_act_f16(uint16_t* y, const float* bias, int64_t rows, int64_t width, bool gelu,
                  cudaStream_t stream) {
  HABLAR_CHECK(width % 8 == 0, "bias_act_f16: rows of a multiple of 8 values");
  HABLAR_CHECK(rows < INT32_MAX && width / 8 < INT32_MAX, "bias_act_f16: too many rows");
  if (rows <= 0 || width <= 0 || (!bias && !gelu)) return;
  const int groups = (int)(width / 8), grid = (int)((rows + kBiasRows - 1) / kBiasRows);
  const int threads = groups >= 128 ? 128 : (groups + 31) / 32 * 32;
  auto* rows8 = reinterpret_cast<Half8*>(y);
  if (!bias || aligned16(bias)) {
    bias_act_f16_kernel<true><<<grid, threads, 0, stream>>>(rows8, bias, (int)rows, groups, gelu);
  } else {
    bias_act_f16_kernel<false><<<grid, threads, 0, stream>>>(rows8, bias, (int)rows, groups, gelu);
  }
  HABLAR_CUDA_CHECK_LAUNCH();
}

void bias_act_f32(float* y, const float* bias, int64_t rows, int64_t width, bool gelu,
                  cudaStream_t stream) {
  const int64_t n = rows * width;
  if (n <= 0 || (!bias && !gelu)) return;
  bias_act_f32_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, bias, n, width, gelu ? 1 : 0);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void bias_tanh_f32(float* y, const float* bias, int64_t rows, int64_t width, cudaStream_t stream) {
  const int64_t n = rows * width;
  if (n <= 0) return;
  bias_act_f32_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, bias, n, width, 2);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void glu_f16(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t n, bool gelu,
             cudaStream_t stream) {
  HABLAR_CHECK(n % 8 == 0, "glu_f16: a multiple of 8 values");
  if (n <= 0) return;
  glu_f16_kernel<<<grid_for(n / 8), kThreads, 0, stream>>>(
      reinterpret_cast<const Half8*>(gate), reinterpret_cast<const Half8*>(up),
      reinterpret_cast<Half8*>(out), n / 8, gelu);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void layernorm(RowsIn x, const float* bias, RowsIn residual, const float* w, const float* b,
               float* out32, uint16_t* out16, int rows, int width, float eps, cudaStream_t stream) {
  if (rows <= 0) return;
  auto* o16 = reinterpret_cast<__half*>(out16);
  if (width % 8 == 0 && width <= 2048) {
    constexpr int kRowsPerBlock = 8;  // one warp each
    const int grid = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    const bool vec = (!bias || aligned16(bias)) && aligned16(w) && (!b || aligned16(b));
    const bool f16 = x.f16 && (!residual.data || residual.f16);
    const auto launch = [&]<int kChunks>() {
      const auto kernel = vec ? (f16 ? layernorm_warp_kernel<kChunks, true, true>
                                     : layernorm_warp_kernel<kChunks, true, false>)
                              : (f16 ? layernorm_warp_kernel<kChunks, false, true>
                                     : layernorm_warp_kernel<kChunks, false, false>);
      kernel<<<grid, kRowsPerBlock * 32, 0, stream>>>(x, bias, residual, w, b, out32, o16, rows,
                                                      width, eps);
    };
    if (width <= 256) {
      launch.template operator()<1>();
    } else if (width <= 512) {
      launch.template operator()<2>();
    } else if (width <= 1024) {
      launch.template operator()<4>();
    } else {
      launch.template operator()<8>();
    }
  } else {
    layernorm_kernel<<<rows, kRowThreads, 0, stream>>>(x, bias, residual, w, b, out32, o16, width,
                                                       eps);
  }
  HABLAR_CUDA_CHECK_LAUNCH();
}

void rope_table(float* x, const int32_t* positions, const float* cos_t, const float* sin_t,
                int tokens, int heads, int head_dim, int pairs, bool neox, cudaStream_t stream) {
  if (tokens <= 0 || pairs <= 0) return;
  rope_table_kernel<<<tokens, 128, 0, stream>>>(x, positions, cos_t, sin_t, heads, head_dim, pairs,
                                                neox);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void pool(const PoolArgs& a, cudaStream_t stream) {
  if (a.n_seqs <= 0) return;
  const dim3 grid((unsigned)a.n_seqs, (unsigned)((a.width + kThreads - 1) / kThreads));
  pool_kernel<<<grid, kThreads, 0, stream>>>(a);
  HABLAR_CUDA_CHECK_LAUNCH();
}

}  // namespace hablar::cuda::embed
