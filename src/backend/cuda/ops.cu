// Element-wise and row-wise ops (see ops.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cub/block/block_reduce.cuh>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/glu_activation.cuh"
#include "backend/cuda/matmul.h"
#include "backend/cuda/matmul_f16.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/q4k_chunk.cuh"
#include "backend/cuda/q4k_f16_fragments.cuh"
#include "backend/cuda/quant_device.cuh"

namespace hablar::cuda {
namespace {

constexpr int kRowThreads = 256;

// The norms' inputs x and y are the outputs of the kernels before them: no __restrict__, so
// that their loads stay coherent and after the wait (dependent_launch.cuh: load_produced).
__global__ void rms_norm_kernel(const float* x, const float* __restrict__ weight, float* out,
                                int dim, float eps) {
  begin_dependent_kernel();
  using Reduce = cub::BlockReduce<float, kRowThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ float inv_rms;
  const float* row = x + (size_t)blockIdx.x * dim;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < dim; i += kRowThreads) sum = fmaf(row[i], row[i], sum);
  sum = Reduce(temp).Sum(sum);
  if (threadIdx.x == 0) inv_rms = rsqrtf(sum / (float)dim + eps);
  __syncthreads();
  float* dst = out + (size_t)blockIdx.x * dim;
  for (int i = threadIdx.x; i < dim; i += kRowThreads) dst[i] = row[i] * inv_rms * weight[i];
}

// rms_norm_kernel over x + y, with x + y stored back into x: each thread touches the same
// indices in both passes, so the values and the sum are those of add_kernel + rms_norm_kernel.
__global__ void add_rms_norm_kernel(float* x, const float* y, const float* __restrict__ weight,
                                    float* out, int dim, float eps) {
  begin_dependent_kernel();
  using Reduce = cub::BlockReduce<float, kRowThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ float inv_rms;
  float* row = x + (size_t)blockIdx.x * dim;
  const float* add_row = y + (size_t)blockIdx.x * dim;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < dim; i += kRowThreads) {
    const float v = row[i] + add_row[i];
    row[i] = v;
    sum = fmaf(v, v, sum);
  }
  sum = Reduce(temp).Sum(sum);
  if (threadIdx.x == 0) inv_rms = rsqrtf(sum / (float)dim + eps);
  __syncthreads();
  float* dst = out + (size_t)blockIdx.x * dim;
  for (int i = threadIdx.x; i < dim; i += kRowThreads) dst[i] = row[i] * inv_rms * weight[i];
}

// The norm of rms_norm_kernel / add_rms_norm_kernel (same passes, same values; y may be
// null), its output also quantized to int8 blocks of 32 as quantize_activations_q8 does
// (a warp per block, as q4k_chunk::quantize_block32 codes it), for the products that read it.
// dim <= kRowThreads * kPer: thread t keeps values t + 256 j (j < kPer) in registers from the
// first pass, and for each j the lanes of warp w hold block w + 8 j, 32 consecutive values: the
// second pass reloads nothing (a row of one token is latency, not bytes).
// The first pass of the register forms below: thread t loads values t + 256 j (j < kPer) of
// the row (x + y stored back into x when y is given) and their weights, and the row's 1 / rms
// is returned to every thread.
template <int kPer, typename Reduce>
__device__ __forceinline__ float norm_row_in_registers(float* row, const float* add_row,
                                                       const float* __restrict__ weight, int dim,
                                                       float eps, float (&v)[kPer],
                                                       float (&w)[kPer],
                                                       typename Reduce::TempStorage& temp) {
  __shared__ float inv_rms;
  // Every load is issued before the first store (the sum x + y written back into the row):
  // a store between them would keep each load waiting for the one before it (the row may
  // alias the other inputs as far as the compiler knows), kPer round trips instead of one.
  float a[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * kRowThreads;
    if (i < dim) {
      v[j] = row[i];
      w[j] = weight[i];
      a[j] = add_row != nullptr ? add_row[i] : 0.0f;
    }
  }
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * kRowThreads;
    if (i >= dim) break;
    if (add_row != nullptr) {
      v[j] += a[j];
      row[i] = v[j];
    }
    sum = fmaf(v[j], v[j], sum);
  }
  sum = Reduce(temp).Sum(sum);
  if (threadIdx.x == 0) inv_rms = rsqrtf(sum / (float)dim + eps);
  __syncthreads();
  return inv_rms;
}

template <int kPer>
__global__ void rms_norm_q8_kernel(float* x, const float* y, const float* __restrict__ weight,
                                   float* out, int dim, float eps, int8_t* __restrict__ codes,
                                   float2* __restrict__ scales) {
  begin_dependent_kernel();
  using Reduce = cub::BlockReduce<float, kRowThreads>;
  __shared__ typename Reduce::TempStorage temp;
  float* row = x + (size_t)blockIdx.x * dim;
  const float* add_row = y != nullptr ? y + (size_t)blockIdx.x * dim : nullptr;
  float v[kPer], w[kPer];
  const float inv = norm_row_in_registers<kPer, Reduce>(row, add_row, weight, dim, eps, v, w, temp);
  float* dst = out + (size_t)blockIdx.x * dim;
  const size_t first = (size_t)blockIdx.x * dim;
  // A warp quantizes its kPer blocks up to eight at a time (registers); past the row: zeros,
  // not stored (dim is a multiple of 32, so a block is in or out for the whole warp).
  constexpr int kGroup = kPer < 8 ? kPer : 8;
#pragma unroll
  for (int j0 = 0; j0 < kPer; j0 += kGroup) {
    float o[kGroup], d[kGroup];
    int q[kGroup], sum[kGroup];
#pragma unroll
    for (int j = 0; j < kGroup; ++j)
      o[j] = threadIdx.x + (j0 + j) * kRowThreads < dim ? v[j0 + j] * inv * w[j0 + j] : 0.0f;
    q4k_chunk::quantize_blocks32_code<kGroup>(o, q, d, sum);
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      const int i = threadIdx.x + (j0 + j) * kRowThreads;
      if (i >= dim) break;
      dst[i] = o[j];
      codes[first + i] = (int8_t)q[j];
      if (threadIdx.x % 32 == 0) scales[(first + i) / 32] = make_float2(d[j], d[j] * (float)sum[j]);
    }
  }
}

// The same norm, its output also written as the f16 rows of the f16 tensor-core products
// (convert_rows_to_f16's values and scale: matmul_f16.h): a second reduction for the row's
// largest magnitude, then each value times 2^(15 - e) at its stored position.
template <int kPer>
__global__ void rms_norm_f16_kernel(float* x, const float* y, const float* __restrict__ weight,
                                    float* out, int dim, float eps, uint16_t* __restrict__ values,
                                    float* __restrict__ out_scales) {
  begin_dependent_kernel();
  using Reduce = cub::BlockReduce<float, kRowThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ float row_largest;
  float* row = x + (size_t)blockIdx.x * dim;
  const float* add_row = y != nullptr ? y + (size_t)blockIdx.x * dim : nullptr;
  float v[kPer], w[kPer];
  const float inv = norm_row_in_registers<kPer, Reduce>(row, add_row, weight, dim, eps, v, w, temp);
  float* dst = out + (size_t)blockIdx.x * dim;
  float largest = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * kRowThreads;
    if (i >= dim) break;
    v[j] = v[j] * inv * w[j];
    dst[i] = v[j];
    largest = fmaxf(largest, fabsf(v[j]));
  }
  __syncthreads();  // temp is reused
  largest = Reduce(temp).Reduce(largest, [](float a, float b) { return fmaxf(a, b); });
  if (threadIdx.x == 0) row_largest = largest;
  __syncthreads();
  const int e = q4k_f16::f16_row_exponent(row_largest);
  const float up = ldexpf(1.0f, 15 - e);
  uint16_t* row_values = values + (size_t)blockIdx.x * dim;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * kRowThreads;
    if (i >= dim) break;
    row_values[q4k_f16::stored_index(i)] = __half_as_ushort(__float2half_rn(v[j] * up));
  }
  if (threadIdx.x == 0) out_scales[blockIdx.x] = ldexpf(1.0f, e - 15);
}

// The same norm, its output also written as bf16 rows ([rows][dim], round to nearest even)
// for the products over kept bf16 copies of W (matmul.h: PrefillMatmul::multiply_kept).
template <int kPer>
__global__ void rms_norm_bf16_kernel(float* x, const float* y, const float* __restrict__ weight,
                                     float* out, int dim, float eps,
                                     __nv_bfloat16* __restrict__ values) {
  begin_dependent_kernel();
  using Reduce = cub::BlockReduce<float, kRowThreads>;
  __shared__ typename Reduce::TempStorage temp;
  float* row = x + (size_t)blockIdx.x * dim;
  const float* add_row = y != nullptr ? y + (size_t)blockIdx.x * dim : nullptr;
  float v[kPer], w[kPer];
  const float inv = norm_row_in_registers<kPer, Reduce>(row, add_row, weight, dim, eps, v, w, temp);
  float* dst = out != nullptr ? out + (size_t)blockIdx.x * dim : nullptr;  // null: bf16 only
  __nv_bfloat16* row_values = values + (size_t)blockIdx.x * dim;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * kRowThreads;
    if (i >= dim) break;
    const float o = v[j] * inv * w[j];
    if (dst != nullptr) dst[i] = o;
    row_values[i] = __float2bfloat16_rn(o);
  }
}

// The gated activation out = act(gate) * up (glu_activation.cuh: swiglu's / geglu's values),
// also written as bf16 values.
__global__ void glu_bf16_kernel(const float* gate, const float* up, GluActivation act, float* out,
                                __nv_bfloat16* __restrict__ values, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const float o = glu_value(act, gate[i], up[i]);
    out[i] = o;
    values[i] = __float2bfloat16_rn(o);
  }
}

// glu_bf16_rows: eight values per thread and 16-byte accesses where n and the pointers allow
// (kVector = 8), one value per thread otherwise.
template <int kVector>
__global__ void glu_bf16_rows_kernel(const __nv_bfloat16* gate, const __nv_bfloat16* up,
                                     GluActivation act, __nv_bfloat16* out, int64_t n) {
  const int64_t groups = n / kVector;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < groups;
       i += (int64_t)gridDim.x * blockDim.x) {
    if constexpr (kVector == 8) {
      const uint4 g = reinterpret_cast<const uint4*>(gate)[i];
      const uint4 u = reinterpret_cast<const uint4*>(up)[i];
      const auto* g2 = reinterpret_cast<const __nv_bfloat162*>(&g);
      const auto* u2 = reinterpret_cast<const __nv_bfloat162*>(&u);
      uint4 o;
      auto* o2 = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 gf = __bfloat1622float2(g2[j]), uf = __bfloat1622float2(u2[j]);
        o2[j] = __floats2bfloat162_rn(glu_value(act, gf.x, uf.x), glu_value(act, gf.y, uf.y));
      }
      reinterpret_cast<uint4*>(out)[i] = o;
    } else {
      out[i] =
          __float2bfloat16_rn(glu_value(act, __bfloat162float(gate[i]), __bfloat162float(up[i])));
    }
  }
}

// The norm (with the residual add when y is given) alone: the first of two launches for rows
// too wide for the register forms.
void norm_rows(float* x, const float* y, const float* weight, float* out, int rows, int dim,
               float eps, cudaStream_t stream) {
  if (y != nullptr) return add_rms_norm(x, y, weight, out, rows, dim, eps, stream);
  rms_norm(x, weight, out, rows, dim, eps, stream);
}

// Calls launch(std::integral_constant<int, kPer>) with the register forms' kPer (values per
// thread: 2, 4, 8, 16 or 32) for rows of dim values; false for rows wider than kRowThreads * 32.
constexpr bool values_per_thread_fit(int dim) {
  return (dim + kRowThreads - 1) / kRowThreads <= 32;
}

template <typename Launch>
bool with_values_per_thread(int dim, Launch&& launch) {
  const int per_thread = (dim + kRowThreads - 1) / kRowThreads;
  if (!values_per_thread_fit(dim)) return false;
  if (per_thread <= 2) {
    launch(std::integral_constant<int, 2>{});
  } else if (per_thread <= 4) {
    launch(std::integral_constant<int, 4>{});
  } else if (per_thread <= 8) {
    launch(std::integral_constant<int, 8>{});
  } else if (per_thread <= 16) {
    launch(std::integral_constant<int, 16>{});
  } else {
    launch(std::integral_constant<int, 32>{});
  }
  return true;
}

// The norm-and-quantize launch for rows of dim values: the register form that holds them;
// rows wider than kRowThreads * 32 (none of today's models) take the norm and then
// quantize_activations_q8, the same values in two launches.
void launch_rms_norm_q8(float* x, const float* y, const float* weight, float* out, int rows,
                        int dim, float eps, void* q8_workspace, cudaStream_t stream) {
  HABLAR_CHECK(dim % 32 == 0, "rms_norm_q8: the width must be a multiple of 32");
  const Q8Activations q = q8_layout(q8_workspace, rows, dim);
  const bool fused = with_values_per_thread(dim, [&](auto per) {
    launch_dependent(rms_norm_q8_kernel<decltype(per)::value>, dim3(rows), dim3(kRowThreads), 0,
                     stream, x, y, weight, out, dim, eps, q.codes, q.scales);
  });
  if (fused) return;
  norm_rows(x, y, weight, out, rows, dim, eps, stream);
  quantize_activations_q8(out, rows, dim, q8_workspace, q8_activation_bytes(rows, dim), stream);
}

// The norm-and-convert launch: the register form for rows up to kRowThreads * 32 values;
// wider rows take the norm and then convert_rows_to_f16, the same values in two launches.
void launch_rms_norm_f16(float* x, const float* y, const float* weight, float* out, int rows,
                         int dim, float eps, void* f16_workspace, size_t f16_bytes,
                         cudaStream_t stream) {
  HABLAR_CHECK(dim % 4 == 0 && f16_bytes >= f16_rows_bytes(rows, dim),
               "rms_norm_f16: the width must be a multiple of 4 and the rows fit the workspace");
  const F16Rows f16 = f16_rows_layout(f16_workspace, rows, dim);
  const bool fused = with_values_per_thread(dim, [&](auto per) {
    launch_dependent(rms_norm_f16_kernel<decltype(per)::value>, dim3(rows), dim3(kRowThreads), 0,
                     stream, x, y, weight, out, dim, eps, f16.values, f16.out_scales);
  });
  if (fused) return;
  norm_rows(x, y, weight, out, rows, dim, eps, stream);
  convert_rows_to_f16(out, rows, dim, f16_workspace, f16_bytes, stream);
}

// The norm-and-bf16 launch: the register form for rows up to kRowThreads * 32 values; wider
// rows take the norm and then convert_f32_to_bf16, the same values in two launches.
void launch_rms_norm_bf16(float* x, const float* y, const float* weight, float* out, int rows,
                          int dim, float eps, uint16_t* bf16_rows, cudaStream_t stream) {
  auto* values = reinterpret_cast<__nv_bfloat16*>(bf16_rows);
  const bool fused = with_values_per_thread(dim, [&](auto per) {
    launch_dependent(rms_norm_bf16_kernel<decltype(per)::value>, dim3(rows), dim3(kRowThreads), 0,
                     stream, x, y, weight, out, dim, eps, values);
  });
  if (fused) return;
  HABLAR_CHECK(out != nullptr, "rms_norm_bf16: rows this wide need their f32 output");
  norm_rows(x, y, weight, out, rows, dim, eps, stream);
  convert_f32_to_bf16(out, bf16_rows, (int64_t)rows * dim, stream);
}

__global__ void rope_kernel(float* x, const int32_t* __restrict__ positions, int heads,
                            int head_dim, int rot_dim, float theta, bool neox) {
  const int t = blockIdx.x;
  const float pos = (float)positions[t];
  const int half = rot_dim / 2;
  for (int idx = threadIdx.x; idx < heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    const float freq = powf(theta, -2.0f * (float)i / (float)rot_dim);
    float s, c;
    sincosf(pos * freq, &s, &c);
    float* head = x + ((size_t)t * heads + h) * head_dim;
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float x0 = head[a], x1 = head[b];
    head[a] = x0 * c - x1 * s;
    head[b] = x0 * s + x1 * c;
  }
}

__global__ void swiglu_kernel(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    out[i] = swiglu_value(gate[i], up[i]);
  }
}

// GELU with the tanh approximation (glu_activation.cuh).
__global__ void geglu_kernel(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = geglu_value(gate[i], up[i]);
}

__global__ void softcap_kernel(float* x, int64_t n, float cap) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    x[i] = cap * tanhf(x[i] / cap);
}

__global__ void scale_kernel(float* x, float s, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    x[i] *= s;
}

// One block per row: row t of x times its position's factor.
__global__ void scale_by_position_kernel(float* x, const int32_t* positions, int64_t width,
                                         PositionScale ps) {
  const float s = ps.factor(positions[blockIdx.x]);
  float* row = x + (int64_t)blockIdx.x * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) row[i] *= s;
}

__global__ void relu_squared_kernel(float* x, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const float r = x[i] > 0.0f ? x[i] : 0.0f;
    x[i] = __fmul_rn(r, r);
  }
}

__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = a[i] + b[i];
}

template <DType T>
__global__ void embedding_kernel(const uint8_t* __restrict__ table, size_t row_bytes, int64_t rows,
                                 int64_t cols, const int32_t* __restrict__ ids,
                                 float* __restrict__ out) {
  const int t = blockIdx.x;
  const int32_t id = ids[t];
  float* dst = out + (size_t)t * cols;
  for (int u = threadIdx.x; u < cols / 32; u += blockDim.x) {
    float v[32];
    if (id >= 0 && id < rows) {
      dequant_unit<T>(table + (size_t)id * row_bytes, u, v);
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) v[i] = 0.0f;
    }
    float4* d4 = reinterpret_cast<float4*>(dst + 32 * u);
#pragma unroll
    for (int c = 0; c < 8; ++c)
      d4[c] = make_float4(v[4 * c], v[4 * c + 1], v[4 * c + 2], v[4 * c + 3]);
  }
}

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return (unsigned)(blocks < 8192 ? (blocks > 0 ? blocks : 1) : 8192);
}

}  // namespace

void rms_norm(const float* x, const float* weight, float* out, int rows, int dim, float eps,
              cudaStream_t stream) {
  if (rows <= 0) return;
  launch_dependent(rms_norm_kernel, dim3(rows), dim3(kRowThreads), 0, stream, x, weight, out, dim,
                   eps);
}

void add_rms_norm(float* x, const float* y, const float* weight, float* out, int rows, int dim,
                  float eps, cudaStream_t stream) {
  if (rows <= 0) return;
  launch_dependent(add_rms_norm_kernel, dim3(rows), dim3(kRowThreads), 0, stream, x, y, weight, out,
                   dim, eps);
}

void rms_norm_q8(const float* x, const float* weight, float* out, int rows, int dim, float eps,
                 void* q8_workspace, cudaStream_t stream) {
  if (rows <= 0) return;
  // Without y the kernels only read x (the const_cast is never written through).
  launch_rms_norm_q8(const_cast<float*>(x), nullptr, weight, out, rows, dim, eps, q8_workspace,
                     stream);
}

void add_rms_norm_q8(float* x, const float* y, const float* weight, float* out, int rows, int dim,
                     float eps, void* q8_workspace, cudaStream_t stream) {
  if (rows <= 0) return;
  launch_rms_norm_q8(x, y, weight, out, rows, dim, eps, q8_workspace, stream);
}

void rms_norm_f16(const float* x, const float* weight, float* out, int rows, int dim, float eps,
                  void* f16_workspace, size_t f16_bytes, cudaStream_t stream) {
  if (rows <= 0) return;
  launch_rms_norm_f16(const_cast<float*>(x), nullptr, weight, out, rows, dim, eps, f16_workspace,
                      f16_bytes, stream);
}

void add_rms_norm_f16(float* x, const float* y, const float* weight, float* out, int rows, int dim,
                      float eps, void* f16_workspace, size_t f16_bytes, cudaStream_t stream) {
  if (rows <= 0) return;
  launch_rms_norm_f16(x, y, weight, out, rows, dim, eps, f16_workspace, f16_bytes, stream);
}

void rms_norm_bf16(const float* x, const float* weight, float* out, int rows, int dim, float eps,
                   uint16_t* bf16_rows, cudaStream_t stream) {
  if (rows <= 0) return;
  launch_rms_norm_bf16(const_cast<float*>(x), nullptr, weight, out, rows, dim, eps, bf16_rows,
                       stream);
}

void add_rms_norm_bf16(float* x, const float* y, const float* weight, float* out, int rows, int dim,
                       float eps, uint16_t* bf16_rows, cudaStream_t stream) {
  if (rows <= 0) return;
  launch_rms_norm_bf16(x, y, weight, out, rows, dim, eps, bf16_rows, stream);
}

bool rms_norm_bf16_only_supported(int dim) {
  return dim > 0 && values_per_thread_fit(dim);
}

void glu_to_bf16(const float* gate, const float* up, GluActivation act, float* out,
                 uint16_t* bf16_values, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  glu_bf16_kernel<<<grid_for(n), 256, 0, stream>>>(
      gate, up, act, out, reinterpret_cast<__nv_bfloat16*>(bf16_values), n);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void glu_bf16_rows(const uint16_t* gate, const uint16_t* up, GluActivation act, uint16_t* out,
                   int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const auto* g = reinterpret_cast<const __nv_bfloat16*>(gate);
  const auto* u = reinterpret_cast<const __nv_bfloat16*>(up);
  auto* o = reinterpret_cast<__nv_bfloat16*>(out);
  const bool aligned = ((reinterpret_cast<uintptr_t>(gate) | reinterpret_cast<uintptr_t>(up) |
                         reinterpret_cast<uintptr_t>(out)) %
                        16) == 0;
  if (aligned && n % 8 == 0) {
    glu_bf16_rows_kernel<8><<<grid_for(n / 8), 256, 0, stream>>>(g, u, act, o, n);
  } else {
    glu_bf16_rows_kernel<1><<<grid_for(n), 256, 0, stream>>>(g, u, act, o, n);
  }
  HABLAR_CUDA_CHECK_LAUNCH();
}

void rope(float* x, const int32_t* positions, int tokens, int heads, int head_dim, int rot_dim,
          float theta, RopeStyle style, cudaStream_t stream) {
  if (rot_dim <= 0 || rot_dim > head_dim || rot_dim % 2 != 0)
    throw_error(ErrorKind::kInvalidArgument, "rope: rot_dim " + std::to_string(rot_dim) +
                                                 " must be even and within head_dim " +
                                                 std::to_string(head_dim));
  if (tokens <= 0) return;
  rope_kernel<<<tokens, 256, 0, stream>>>(x, positions, heads, head_dim, rot_dim, theta,
                                          style == RopeStyle::kNeox);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void swiglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  swiglu_kernel<<<grid_for(n), 256, 0, stream>>>(gate, up, out, n);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void geglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  geglu_kernel<<<grid_for(n), 256, 0, stream>>>(gate, up, out, n);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void softcap(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (n <= 0) return;
  softcap_kernel<<<grid_for(n), 256, 0, stream>>>(x, n, cap);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void scale(float* x, float s, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  scale_kernel<<<grid_for(n), 256, 0, stream>>>(x, s, n);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void scale_by_position(float* x, const int32_t* positions, int64_t n_rows, int64_t width,
                       const PositionScale& ps, cudaStream_t stream) {
  if (n_rows <= 0 || width <= 0) return;
  scale_by_position_kernel<<<(unsigned)n_rows, 256, 0, stream>>>(x, positions, width, ps);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void relu_squared(float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  relu_squared_kernel<<<grid_for(n), 256, 0, stream>>>(x, n);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  add_kernel<<<grid_for(n), 256, 0, stream>>>(a, b, out, n);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void embedding_gather(const WeightView& table, const int32_t* ids, int n, float* out,
                      cudaStream_t stream) {
  validate_weight(table, "embedding_gather");
  if (n <= 0) return;
  dispatch_weight_type(table.type, [&]<DType T>() {
    embedding_kernel<T><<<n, 128, 0, stream>>>(static_cast<const uint8_t*>(table.data),
                                               table.row_bytes, table.rows, table.cols, ids, out);
  });
  HABLAR_CUDA_CHECK_LAUNCH();
}

}  // namespace hablar::cuda
