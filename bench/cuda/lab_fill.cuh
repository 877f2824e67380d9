// Device fill shared by the CUDA lab tools: n values in [-0.05, 0.05) from a hash of their
// index and a seed (T: any type constructible from float, e.g. half or __nv_bfloat16).
#pragma once

#include <cstddef>

template <typename T>
__global__ void lab_fill(T* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13;
    p[i] = T(((h & 0xFFFF) / 65536.0f - 0.5f) * 0.1f);
  }
}
