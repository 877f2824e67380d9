// Device helpers for the 2-byte KV cache elements: unpack 8 elements (one 16-byte load)
// to floats, and convert a float to the element type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace hablar::cuda {

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

}  // namespace hablar::cuda
