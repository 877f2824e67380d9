// SIMD forms of the non-matmul ops, built with AVX2 + FMA + F16C (ops_avx2.cpp); ops.cpp and
// attention.cpp call them when the CPU has those extensions, else their scalar forms.
#pragma once

#include <cstdint>

#include "backend/cpu/ops.h"
#include "core/kv_layout.h"

namespace hablar::cpu::avx2 {

uint64_t read_through(const uint8_t* p, size_t n);
void swiglu(const float* gate, const float* up, float* out, int64_t n);
void rope_apply(float* x, int n_heads, int head_dim, const RopeParams& p, const float* cos_t,
                const float* sin_t);
// head_dim must be a multiple of 8; positions [first, pos] are attended.
void attend_head(const uint16_t* cache, const KvCacheLayout& layout, int layer,
                 const int32_t* block_table, int first, int pos, int kv_head, const float* q,
                 float scale, float softcap, SumOrder order, float* scores, float* out);

}  // namespace hablar::cpu::avx2
