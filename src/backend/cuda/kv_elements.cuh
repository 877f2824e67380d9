// Device helpers for the KV cache elements (core/kv_layout.h): unpack 8 two-byte elements
// (one 16-byte load) to floats, convert a float to the element type, and read and write
// Q8_0 rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/dependent_launch.cuh"
#include "core/kv_layout.h"

namespace hablar::cuda {

// The cache element types the CUDA kernels take, as a template parameter. Q8_0 rows are read
// as f16 (kv_q8_load8): the attention's tensor-core products run on f16 for them.
enum class KvElem { kF16, kBf16, kQ8_0 };

inline constexpr bool kv_elem_bf16(KvElem e) {
  return e == KvElem::kBf16;
}

inline KvElem kv_elem_of(KvDType t) {
  return t == KvDType::BF16 ? KvElem::kBf16 : t == KvDType::Q8_0 ? KvElem::kQ8_0 : KvElem::kF16;
}

// ---- Q8_0 rows. A head row is head_dim / 32 blocks of 17 two-byte units: the f16 scale d,
// then 32 int8 codes (two per unit, the lower dimension in the low byte), as every backend
// stores them (core/kv_rows.h), so all read one layout.
inline constexpr int kKvQ8BlockUnits = 17;

// Dimensions [dim, dim + 8) of a Q8_0 row (dim a multiple of 8) as eight f16 values packed
// like eight F16 cache elements: each code * d computed in f32 (exact: 8 + 11 bits) and
// rounded once, so an F16 cache holding those rounded values gives the attention the same
// inputs.
__host__ __device__ __forceinline__ uint4 kv_q8_load8(const uint16_t* row, int dim) {
  const uint16_t* block = row + (dim / 32) * kKvQ8BlockUnits;
  const float d = __half2float(__ushort_as_half(block[0]));
  const uint16_t* codes = block + 1 + (dim % 32) / 2;
  uint32_t words[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint16_t pair = codes[i];
    const __half2 h =
        __floats2half2_rn((float)(int8_t)(pair & 0xff) * d, (float)(int8_t)(pair >> 8) * d);
    words[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

// A block's code of x and its scale's bits from the block's largest magnitude, as the CPU
// backend stores them (core/kv_rows.h): d = max|x| / 127 as a half, codes
// round-half-even(x * 127 / max|x|). Host and device, so that CI checks them against the CPU's
// rows without a GPU.
__host__ __device__ __forceinline__ int kv_q8_code(float x, float amax) {
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
#if defined(__CUDA_ARCH__)
  return __float2int_rn(x * id);
#else
  return (int)nearbyintf(x * id);
#endif
}
__host__ __device__ __forceinline__ uint16_t kv_q8_scale_bits(float amax) {
  return __half_as_ushort(__float2half_rn(amax / 127.0f));
}

// Writes dimension `dim` of a Q8_0 head row from the calling lane's value x: the 32 lanes of
// the warp must hold dimensions 32b .. 32b + 31 of one block b (lane l has dim % 32 == l),
// all active. The maximum by shuffles; each even lane writes its code and the next lane's.
__device__ __forceinline__ void kv_q8_store_lane(uint16_t* row, int dim, float x) {
  float amax = fabsf(x);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const int code = kv_q8_code(x, amax);
  const int next = __shfl_down_sync(0xffffffffu, code, 1);
  uint16_t* block = row + (dim / 32) * kKvQ8BlockUnits;
  if (dim % 2 == 0) block[1 + (dim % 32) / 2] = (uint16_t)((code & 0xff) | ((next & 0xff) << 8));
  if (dim % 32 == 0) block[0] = kv_q8_scale_bits(amax);
}

template <bool kBf16>
__device__ __forceinline__ void kv_unpack8(const uint4& raw, float out[8]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 pair;
    if constexpr (kBf16) {
      __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&words[i]);
      pair = __bfloat1622float2(v);
    } else {
      __half2 v = *reinterpret_cast<const __half2*>(&words[i]);
      pair = __half22float2(v);
    }
    out[2 * i] = pair.x;
    out[2 * i + 1] = pair.y;
  }
}

// Two elements packed in one word.
template <bool kBf16>
__device__ __forceinline__ float2 kv_unpack2(uint32_t word) {
  if constexpr (kBf16) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&word));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(&word));
  }
}

// One element.
template <bool kBf16>
__device__ __forceinline__ float kv_to_float(uint16_t bits) {
  if constexpr (kBf16) {
    return __bfloat162float(__ushort_as_bfloat16(bits));
  } else {
    return __half2float(__ushort_as_half(bits));
  }
}

template <bool kBf16>
__device__ __forceinline__ uint16_t kv_from_float(float x) {
  if constexpr (kBf16) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  } else {
    return __half_as_ushort(__float2half_rn(x));
  }
}

// Stores x as dimension `dim` of the head row at `row` (cache units) in the element type.
// Q8_0: the warp rule of kv_q8_store_lane holds for the caller.
template <KvElem kElem>
__device__ __forceinline__ void kv_store_dim(uint16_t* row, int dim, float x) {
  if constexpr (kElem == KvElem::kQ8_0) {
    kv_q8_store_lane(row, dim, x);
  } else {
    row[dim] = kv_from_float<kv_elem_bf16(kElem)>(x);
  }
}

// Eight elements of a row at dims [dim, dim + 8) as the attention's f16/bf16 operands: one
// 16-byte load for F16/BF16 (16-byte aligned rows), kv_q8_load8 for Q8_0.
template <KvElem kElem>
__device__ __forceinline__ uint4 kv_load8(const uint16_t* row, int dim) {
  if constexpr (kElem == KvElem::kQ8_0) {
    return kv_q8_load8(row, dim);
  } else {
    return load_produced(reinterpret_cast<const uint4*>(row + dim));  // this step's rows too
  }
}

}  // namespace hablar::cuda
