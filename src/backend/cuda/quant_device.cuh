// Device dequantization of every weight type the CUDA kernels take, one 32-value "unit" at
// a time: a whole block of the 32-value formats, one 32-value sub-block of a K-quant
// super-block, or 32 consecutive F32 / F16 / BF16 values. Block layouts are core/quant_blocks.h;
// the scalar reference is core/quant.h (dequantize_row). Rows are assumed 2-byte aligned
// (every block size is even); K-quant and F16/BF16 rows 16-byte aligned, as cudaMalloc'd
// GGUF tensors with 256-multiple rows are.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "core/dtype.h"
#include "core/fp16.h"
#include "core/quant_blocks.h"

namespace hablar::cuda {

__host__ __device__ __forceinline__ float half_at(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t*>(p)));
#else
  return fp16_to_f32(*reinterpret_cast<const uint16_t*>(p));
#endif
}
__host__ __device__ __forceinline__ uint32_t
u16_pair(const uint8_t* p) {  // 4 bytes, 2-byte aligned
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}

// Exact float of a small non-negative integer (< 2^23). On the device it is built from the
// bits (2^23 + v, minus 2^23): two full-rate instructions instead of an I2F conversion,
// which runs at a fraction of the FMA rate and bounds the dequantizing matmuls.
__host__ __device__ __forceinline__ float small_uint_to_float(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(0x4B000000u | v) - 8388608.0f;
#else
  return (float)v;
#endif
}

template <DType T>
struct QuantTraits;

// Unpacks the 16 bytes of a 32-value 4-bit block (2-byte aligned) into nibbles:
// low nibbles are values 0..15, high nibbles 16..31.
__host__ __device__ __forceinline__ void nibbles32(const uint8_t* qs, uint32_t q[32]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t two = reinterpret_cast<const uint16_t*>(qs)[i];
    q[2 * i] = two & 0xF;
    q[2 * i + 1] = (two >> 8) & 0xF;
    q[16 + 2 * i] = (two >> 4) & 0xF;
    q[16 + 2 * i + 1] = two >> 12;
  }
}

template <>
struct QuantTraits<DType::Q4_0> {
  static constexpr int kValues = kQK, kBytes = sizeof(BlockQ4_0);
  __host__ __device__ static void unit(const uint8_t* b, int, float out[32]) {
    const float d = half_at(b);
    uint32_t q[32];
    nibbles32(b + 2, q);
#pragma unroll
    for (int i = 0; i < 32; ++i) out[i] = d * (small_uint_to_float(q[i]) - 8.0f);
  }
};

template <>
struct QuantTraits<DType::Q4_1> {
  static constexpr int kValues = kQK, kBytes = sizeof(BlockQ4_1);
  __host__ __device__ static void unit(const uint8_t* b, int, float out[32]) {
    const float d = half_at(b), m = half_at(b + 2);
    uint32_t q[32];
    nibbles32(b + 4, q);
#pragma unroll
    for (int i = 0; i < 32; ++i) out[i] = fmaf(d, small_uint_to_float(q[i]), m);
  }
};

template <>
struct QuantTraits<DType::Q5_0> {
  static constexpr int kValues = kQK, kBytes = sizeof(BlockQ5_0);
  __host__ __device__ static void unit(const uint8_t* b, int, float out[32]) {
    const float d = half_at(b);
    const uint32_t qh = u16_pair(b + 2);
    uint32_t q[32];
    nibbles32(b + 6, q);
#pragma unroll
    for (int i = 0; i < 32; ++i)
      out[i] = d * (small_uint_to_float(q[i] | (((qh >> i) & 1) << 4)) - 16.0f);
  }
};

template <>
struct QuantTraits<DType::Q5_1> {
  static constexpr int kValues = kQK, kBytes = sizeof(BlockQ5_1);
  __host__ __device__ static void unit(const uint8_t* b, int, float out[32]) {
    const float d = half_at(b), m = half_at(b + 2);
    const uint32_t qh = u16_pair(b + 4);
    uint32_t q[32];
    nibbles32(b + 8, q);
#pragma unroll
    for (int i = 0; i < 32; ++i)
      out[i] = fmaf(d, small_uint_to_float(q[i] | (((qh >> i) & 1) << 4)), m);
  }
};

template <>
struct QuantTraits<DType::Q8_0> {
  static constexpr int kValues = kQK, kBytes = sizeof(BlockQ8_0);
  __host__ __device__ static void unit(const uint8_t* b, int, float out[32]) {
    const float d = half_at(b);
    const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t two = reinterpret_cast<const uint16_t*>(qs)[i];
      // int8 q as (q + 128) in 0..255, then shifted back: exact, no I2F.
      out[2 * i] = d * (small_uint_to_float((two & 0xFFu) ^ 0x80u) - 128.0f);
      out[2 * i + 1] = d * (small_uint_to_float((two >> 8) ^ 0x80u) - 128.0f);
    }
  }
};

// 6-bit scale and min of sub-block j of a Q4_K / Q5_K super-block.
__host__ __device__ __forceinline__ void k_scale_min(const uint8_t* scales, int j, float* sc,
                                                     float* m) {
  if (j < 4) {
    *sc = (float)(scales[j] & 63);
    *m = (float)(scales[j + 4] & 63);
  } else {
    *sc = (float)((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
    *m = (float)((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

template <>
struct QuantTraits<DType::Q4_K> {
  static constexpr int kValues = kQK_K, kBytes = sizeof(BlockQ4_K);
  __host__ __device__ static void unit(const uint8_t* b, int j, float out[32]) {
    float sc, m;
    k_scale_min(b + 4, j, &sc, &m);
    const float d = half_at(b) * sc, dmin = half_at(b + 2) * m;
    const uint4* qs = reinterpret_cast<const uint4*>(b + 16 + 32 * (j / 2));
    const uint4 lo = qs[0], hi = qs[1];
    const uint32_t words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    const int shift = (j & 1) * 4;
#pragma unroll
    for (int w = 0; w < 8; ++w)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        out[4 * w + i] = fmaf(d, small_uint_to_float((words[w] >> (8 * i + shift)) & 0xF), -dmin);
  }
};

template <>
struct QuantTraits<DType::Q5_K> {
  static constexpr int kValues = kQK_K, kBytes = sizeof(BlockQ5_K);
  __host__ __device__ static void unit(const uint8_t* b, int j, float out[32]) {
    float sc, m;
    k_scale_min(b + 4, j, &sc, &m);
    const float d = half_at(b) * sc, dmin = half_at(b + 2) * m;
    const uint4* qh4 = reinterpret_cast<const uint4*>(b + 16);
    const uint4* qs4 = reinterpret_cast<const uint4*>(b + 48 + 32 * (j / 2));
    const uint4 h0 = qh4[0], h1 = qh4[1], l0 = qs4[0], l1 = qs4[1];
    const uint32_t hw[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
    const uint32_t lw[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
    const int shift = (j & 1) * 4;
#pragma unroll
    for (int w = 0; w < 8; ++w)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t q = ((lw[w] >> (8 * i + shift)) & 0xF) | (((hw[w] >> (8 * i + j)) & 1) << 4);
        out[4 * w + i] = fmaf(d, small_uint_to_float(q), -dmin);
      }
  }
};

template <>
struct QuantTraits<DType::Q6_K> {
  static constexpr int kValues = kQK_K, kBytes = sizeof(BlockQ6_K);
  __host__ __device__ static void unit(const uint8_t* b, int j, float out[32]) {
    const int half = j / 4, quarter = j % 4;
    const uint8_t* ql = b + 64 * half + 32 * (quarter & 1);
    const uint8_t* qh = b + 128 + 32 * half;
    const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192) + 8 * half + 2 * quarter;
    const float d = half_at(b + 208);
    const float d0 = d * (float)scales[0], d1 = d * (float)scales[1];
    const int lshift = quarter >= 2 ? 4 : 0, hshift = 2 * quarter;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint16_t l2 = reinterpret_cast<const uint16_t*>(ql)[i];
      const uint16_t h2 = reinterpret_cast<const uint16_t*>(qh)[i];
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const uint32_t lo = ((l2 >> (8 * k)) >> lshift) & 0xF;
        const uint32_t hi = ((h2 >> (8 * k)) >> hshift) & 3;
        out[2 * i + k] = (2 * i + k < 16 ? d0 : d1) * (small_uint_to_float(lo | (hi << 4)) - 32.0f);
      }
    }
  }
};

template <>
struct QuantTraits<DType::F16> {
  static constexpr int kValues = 32, kBytes = 64;
  __host__ __device__ static void unit(const uint8_t* b, int, float out[32]) {
    const uint4* v = reinterpret_cast<const uint4*>(b);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const uint4 raw = v[c];
      const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#if defined(__CUDA_ARCH__)
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&words[i]));
        out[8 * c + 2 * i] = f.x;
        out[8 * c + 2 * i + 1] = f.y;
#else
        out[8 * c + 2 * i] = fp16_to_f32((uint16_t)(words[i] & 0xFFFF));
        out[8 * c + 2 * i + 1] = fp16_to_f32((uint16_t)(words[i] >> 16));
#endif
      }
    }
  }
};

template <>
struct QuantTraits<DType::F32> {
  static constexpr int kValues = 32, kBytes = 128;
  __host__ __device__ static void unit(const uint8_t* b, int, float out[32]) {
    const float4* v = reinterpret_cast<const float4*>(b);
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const float4 f = v[c];
      out[4 * c] = f.x, out[4 * c + 1] = f.y, out[4 * c + 2] = f.z, out[4 * c + 3] = f.w;
    }
  }
};

template <>
struct QuantTraits<DType::BF16> {
  static constexpr int kValues = 32, kBytes = 64;
  __host__ __device__ static void unit(const uint8_t* b, int, float out[32]) {
    const uint4* v = reinterpret_cast<const uint4*>(b);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const uint4 raw = v[c];
      const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        out[8 * c + 2 * i] = bits_f32(words[i] << 16);
        out[8 * c + 2 * i + 1] = bits_f32(words[i] & 0xFFFF0000u);
      }
    }
  }
};

// ---- Groups of 8 values: the GEMV path, where 32 lanes take 32 consecutive groups so that
// both the weight bytes and the activations they meet are read coalesced. group(b, g, out)
// dequantizes values 8g .. 8g+7 of block b.

// 8 nibbles from 8 bytes (as two words): low (shift 0) or high (shift 4) halves.
__host__ __device__ __forceinline__ void nibbles8(uint32_t lo, uint32_t hi, int shift,
                                                  uint32_t q[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    q[i] = (lo >> (8 * i + shift)) & 0xF;
    q[4 + i] = (hi >> (8 * i + shift)) & 0xF;
  }
}

template <DType T>
struct QuantGroup;

template <>
struct QuantGroup<DType::Q4_0> {
  __host__ __device__ static void group(const uint8_t* b, int g, float out[8]) {
    const float d = half_at(b);
    uint32_t q[8];
    const uint8_t* qs = b + 2 + 8 * (g & 1);
    nibbles8(u16_pair(qs), u16_pair(qs + 4), (g >> 1) * 4, q);
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = d * (small_uint_to_float(q[i]) - 8.0f);
  }
};

template <>
struct QuantGroup<DType::Q4_1> {
  __host__ __device__ static void group(const uint8_t* b, int g, float out[8]) {
    const float d = half_at(b), m = half_at(b + 2);
    uint32_t q[8];
    const uint32_t* qs = reinterpret_cast<const uint32_t*>(b + 4 + 8 * (g & 1));
    nibbles8(qs[0], qs[1], (g >> 1) * 4, q);
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = fmaf(d, small_uint_to_float(q[i]), m);
  }
};

template <>
struct QuantGroup<DType::Q5_0> {
  __host__ __device__ static void group(const uint8_t* b, int g, float out[8]) {
    const float d = half_at(b);
    const uint32_t qh = u16_pair(b + 2) >> (8 * g);
    uint32_t q[8];
    const uint8_t* qs = b + 6 + 8 * (g & 1);
    nibbles8(u16_pair(qs), u16_pair(qs + 4), (g >> 1) * 4, q);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      out[i] = d * (small_uint_to_float(q[i] | (((qh >> i) & 1) << 4)) - 16.0f);
  }
};

template <>
struct QuantGroup<DType::Q5_1> {
  __host__ __device__ static void group(const uint8_t* b, int g, float out[8]) {
    const float d = half_at(b), m = half_at(b + 2);
    const uint32_t qh = *reinterpret_cast<const uint32_t*>(b + 4) >> (8 * g);
    uint32_t q[8];
    const uint32_t* qs = reinterpret_cast<const uint32_t*>(b + 8 + 8 * (g & 1));
    nibbles8(qs[0], qs[1], (g >> 1) * 4, q);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      out[i] = fmaf(d, small_uint_to_float(q[i] | (((qh >> i) & 1) << 4)), m);
  }
};

template <>
struct QuantGroup<DType::Q8_0> {
  __host__ __device__ static void group(const uint8_t* b, int g, float out[8]) {
    const float d = half_at(b);
    const uint8_t* qs = b + 2 + 8 * g;
    const uint32_t words[2] = {u16_pair(qs), u16_pair(qs + 4)};
#pragma unroll
    for (int i = 0; i < 8; ++i)
      out[i] =
          d * (small_uint_to_float(((words[i / 4] >> (8 * (i % 4))) & 0xFFu) ^ 0x80u) - 128.0f);
  }
};

template <>
struct QuantGroup<DType::Q4_K> {
  __host__ __device__ static void group(const uint8_t* b, int g, float out[8]) {
    const int j = g / 4;  // sub-block of 32
    float sc, m;
    k_scale_min(b + 4, j, &sc, &m);
    const float d = half_at(b) * sc, dmin = half_at(b + 2) * m;
    const uint2 raw = *reinterpret_cast<const uint2*>(b + 16 + 32 * (j / 2) + 8 * (g % 4));
    uint32_t q[8];
    nibbles8(raw.x, raw.y, (j & 1) * 4, q);
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = fmaf(d, small_uint_to_float(q[i]), -dmin);
  }
};

template <>
struct QuantGroup<DType::Q5_K> {
  __host__ __device__ static void group(const uint8_t* b, int g, float out[8]) {
    const int j = g / 4;
    float sc, m;
    k_scale_min(b + 4, j, &sc, &m);
    const float d = half_at(b) * sc, dmin = half_at(b + 2) * m;
    const uint2 raw = *reinterpret_cast<const uint2*>(b + 48 + 32 * (j / 2) + 8 * (g % 4));
    const uint2 high = *reinterpret_cast<const uint2*>(b + 16 + 8 * (g % 4));
    uint32_t q[8];
    nibbles8(raw.x, raw.y, (j & 1) * 4, q);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t h = ((i < 4 ? high.x : high.y) >> (8 * (i % 4) + j)) & 1;
      out[i] = fmaf(d, small_uint_to_float(q[i] | (h << 4)), -dmin);
    }
  }
};

template <>
struct QuantGroup<DType::Q6_K> {
  __host__ __device__ static void group(const uint8_t* b, int g, float out[8]) {
    const int j = g / 4, within = g % 4;
    const int half = j / 4, quarter = j % 4;
    const uint8_t* ql = b + 64 * half + 32 * (quarter & 1) + 8 * within;
    const uint8_t* qh = b + 128 + 32 * half + 8 * within;
    const int8_t scale =
        reinterpret_cast<const int8_t*>(b + 192)[8 * half + 2 * quarter + within / 2];
    const float d = half_at(b + 208) * (float)scale;
    const uint32_t lw[2] = {u16_pair(ql), u16_pair(ql + 4)};
    const uint32_t hw[2] = {u16_pair(qh), u16_pair(qh + 4)};
    const int lshift = quarter >= 2 ? 4 : 0, hshift = 2 * quarter;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t lo = (lw[i / 4] >> (8 * (i % 4) + lshift)) & 0xF;
      const uint32_t hi = (hw[i / 4] >> (8 * (i % 4) + hshift)) & 3;
      out[i] = d * (small_uint_to_float(lo | (hi << 4)) - 32.0f);
    }
  }
};

template <>
struct QuantGroup<DType::F16> {
  __host__ __device__ static void group(const uint8_t* b, int g, float out[8]) {
    const uint4 raw = reinterpret_cast<const uint4*>(b)[g];
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#if defined(__CUDA_ARCH__)
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&words[i]));
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
#else
      out[2 * i] = fp16_to_f32((uint16_t)(words[i] & 0xFFFF));
      out[2 * i + 1] = fp16_to_f32((uint16_t)(words[i] >> 16));
#endif
    }
  }
};

template <>
struct QuantGroup<DType::F32> {
  __host__ __device__ static void group(const uint8_t* b, int g, float out[8]) {
    const float4* v = reinterpret_cast<const float4*>(b) + 2 * g;
    const float4 a = v[0], c = v[1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = c.x, out[5] = c.y, out[6] = c.z, out[7] = c.w;
  }
};

template <>
struct QuantGroup<DType::BF16> {
  __host__ __device__ static void group(const uint8_t* b, int g, float out[8]) {
    const uint4 raw = reinterpret_cast<const uint4*>(b)[g];
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = bits_f32(words[i] << 16);
      out[2 * i + 1] = bits_f32(words[i] & 0xFFFF0000u);
    }
  }
};

// Dequantizes group g (values 8g .. 8g+7) of a row.
template <DType T>
__host__ __device__ __forceinline__ void dequant_group(const uint8_t* row, int g, float out[8]) {
  using Q = QuantTraits<T>;
  constexpr int kGroupsPerBlock = Q::kValues / 8;
  QuantGroup<T>::group(row + (size_t)(g / kGroupsPerBlock) * Q::kBytes, g % kGroupsPerBlock, out);
}

// Dequantizes unit u (values 32u .. 32u+31) of a row.
template <DType T>
__host__ __device__ __forceinline__ void dequant_unit(const uint8_t* row, int u, float out[32]) {
  using Q = QuantTraits<T>;
  constexpr int kUnitsPerBlock = Q::kValues / 32;
  QuantTraits<T>::unit(row + (size_t)(u / kUnitsPerBlock) * Q::kBytes, u % kUnitsPerBlock, out);
}

// Calls fn.template operator()<T>() with the compile-time type of `type`; false when the
// type has no CUDA kernel.
template <typename Fn>
bool dispatch_weight_type(DType type, Fn&& fn) {
  switch (type) {
    case DType::Q4_0:
      fn.template operator()<DType::Q4_0>();
      return true;
    case DType::Q4_1:
      fn.template operator()<DType::Q4_1>();
      return true;
    case DType::Q5_0:
      fn.template operator()<DType::Q5_0>();
      return true;
    case DType::Q5_1:
      fn.template operator()<DType::Q5_1>();
      return true;
    case DType::Q8_0:
      fn.template operator()<DType::Q8_0>();
      return true;
    case DType::Q4_K:
      fn.template operator()<DType::Q4_K>();
      return true;
    case DType::Q5_K:
      fn.template operator()<DType::Q5_K>();
      return true;
    case DType::Q6_K:
      fn.template operator()<DType::Q6_K>();
      return true;
    case DType::F16:
      fn.template operator()<DType::F16>();
      return true;
    case DType::BF16:
      fn.template operator()<DType::BF16>();
      return true;
    case DType::F32:
      fn.template operator()<DType::F32>();
      return true;
    default:
      return false;
  }
}

}  // namespace hablar::cuda
