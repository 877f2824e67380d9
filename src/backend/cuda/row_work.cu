// The queued bias / RoPE / K-V store pass of cuda::ForwardOps (RowWorkBatch,
// forward_ops_buffers.h): one launch for the step's q, k and v rows.
//
// Two forms with the same arithmetic per element (so the same bits): a vectorized one for the
// usual shapes (head_dim a multiple of 8, every RoPE turning the whole head, 16-byte aligned
// rows), where a thread takes eight elements of a head with four 16-byte loads issued at once,
// and the general one, a thread per element or RoPE pair, for everything else (partial
// rotations, odd widths).
#include <algorithm>
#include <cstdint>

#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/forward_ops_buffers.h"
#include "backend/cuda/kv_elements.cuh"
#include "backend/cuda/lab_knobs.h"

namespace hablar::cuda {
namespace {

// Stores value x of dimension d of head h of token t's row in the cache (entry kv >= 0); F16
// or BF16 elements (store_kv_in_row_work leaves quantized rows to the attention's scatter).
struct CacheSlot {
  uint16_t* cache = nullptr;  // null: nothing to store for this token
  const int32_t* table = nullptr;
  int pos = 0;
};
__device__ __forceinline__ void store_kv(const RowWorkCacheStore& s, const CacheSlot& at, int kv,
                                         int h, int d, float x) {
  const size_t offset = s.layout.position_offset(at.table, s.layer, kv, h, at.pos) + d;
  at.cache[offset] =
      s.layout.type(kv) == KvDType::BF16 ? kv_from_float<true>(x) : kv_from_float<false>(x);
}

// Where token t's entries store (nothing when it is inactive or past its table's capacity).
__device__ CacheSlot cache_slot(const RowWorkCacheStore& store, int t) {
  CacheSlot at;
  if (store.cache != nullptr && store.active[t]) {
    at.pos = store.positions[t];
    if (at.pos < store.max_blocks_per_seq * store.layout.block_size) {
      at.cache = store.cache;
      at.table = store.block_tables + (size_t)t * store.max_blocks_per_seq;
    }
  }
  return at;
}

// Entry w's work for token t, over the indices first, first + stride, ... of each of its
// loops (the blocks of one token split them: one block of 128 threads per head's worth of
// pairs, not one block for every head of q, k and v); `at` where its final values go in the
// cache when the entry stores (w.kv >= 0).
__device__ void row_work_entry(const RowWorkEntry& w, const RowWorkCacheStore& store,
                               const CacheSlot& at, int t, int head_dim, int half, int first,
                               int stride) {
  float* row = w.x + (size_t)t * w.heads * head_dim;
  const float* in = w.src ? w.src + (size_t)t * w.src_stride : row;
  const bool stores = w.kv >= 0 && at.cache != nullptr;
  const bool writes = w.bias || w.src;  // (a RoPE writes its pairs whatever the entry)
  if (w.variant < 0) {
    for (int i = first; i < w.heads * head_dim; i += stride) {
      const float x = w.bias ? in[i] + w.bias[i] : in[i];
      if (writes) row[i] = x;
      if (stores) store_kv(store, at, w.kv, i / head_dim, i % head_dim, x);
    }
    return;
  }
  for (int idx = first; idx < w.heads * half; idx += stride) {
    const int h = idx / half, i = idx % half;
    const float c = w.cos_t[(size_t)t * half + i], s = w.sin_t[(size_t)t * half + i];
    float* head = row + (size_t)h * head_dim;
    const float* head_in = in + (size_t)h * head_dim;
    const int a = w.neox ? i : 2 * i, b = w.neox ? i + half : 2 * i + 1;
    float x0 = head_in[a], x1 = head_in[b];
    if (w.bias) x0 += w.bias[h * head_dim + a], x1 += w.bias[h * head_dim + b];
    const float y0 = fmaf(x0, c, -(x1 * s)), y1 = fmaf(x0, s, x1 * c);
    head[a] = y0;
    head[b] = y1;
    if (stores) store_kv(store, at, w.kv, h, a, y0), store_kv(store, at, w.kv, h, b, y1);
  }
  const int rest = head_dim - 2 * half;  // dimensions RoPE leaves alone
  if ((writes || stores) && rest > 0)
    for (int idx = first; idx < w.heads * rest; idx += stride) {
      const int h = idx / rest, d = 2 * half + idx % rest, at_row = h * head_dim + d;
      const float x = w.bias ? in[at_row] + w.bias[at_row] : in[at_row];
      if (writes) row[at_row] = x;
      if (stores) store_kv(store, at, w.kv, h, d, x);
    }
}

// Grid (tokens, blocks per token).
__global__ void row_work_kernel(RowWorkBatch batch, int head_dim, int half) {
  begin_dependent_kernel();
  const int t = blockIdx.x;
  const int first = blockIdx.y * blockDim.x + threadIdx.x, stride = gridDim.y * blockDim.x;
  const RowWorkCacheStore& store = batch.store;
  const CacheSlot at = cache_slot(store, t);
  for (int e = 0; e < batch.n; ++e)
    row_work_entry(batch.e[e], store, at, t, head_dim, half, first, stride);
}

// The blocks per token of row_work_kernel (128 threads each): enough for the widest loop of
// the batch's entries, at most 32.
int row_work_blocks(const RowWorkBatch& batch, int head_dim, int half) {
  int widest = 1;
  for (int e = 0; e < batch.n; ++e) {
    const RowWorkEntry& w = batch.e[e];
    widest = std::max(widest, w.variant < 0 ? w.heads * head_dim : w.heads * half);
    if (w.variant >= 0 && (w.bias != nullptr || w.kv >= 0 || w.src != nullptr))
      widest = std::max(widest, w.heads * (head_dim - 2 * half));
  }
  return std::min((widest + 127) / 128, 32);
}

// The vectorized form: a thread's unit is eight elements of one head of one entry, at head
// dimensions lo..lo+3 and hi..hi+3: for a NeoX RoPE pairs 4j..4j+3 (lo = 4j, hi = half + 4j:
// the pairs' first and second elements), for adjacent pairs and for entries without RoPE
// dimensions 8j..8j+7. Every entry has head_dim / 8 units a head.
struct Unit8 {
  int lo, hi;
};
__device__ __forceinline__ Unit8 unit8_dims(const RowWorkEntry& w, int half, int j) {
  if (w.variant >= 0 && w.neox) return {4 * j, half + 4 * j};
  return {8 * j, 8 * j + 4};
}

__device__ __forceinline__ void store_kv4(const RowWorkCacheStore& s, const CacheSlot& at, int kv,
                                          int h, int d, const float* x) {
  uint16_t* row = at.cache + s.layout.position_offset(at.table, s.layer, kv, h, at.pos) + d;
  const bool bf16 = s.layout.type(kv) == KvDType::BF16;
  uint16_t u[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) u[i] = bf16 ? kv_from_float<true>(x[i]) : kv_from_float<false>(x[i]);
  *reinterpret_cast<uint2*>(row) =
      make_uint2(u[0] | ((uint32_t)u[1] << 16), u[2] | ((uint32_t)u[3] << 16));
}

// Unit j of head h of entry w for token t: x + bias, the rotation (y0 = x0 c - x1 s,
// y1 = x0 s + x1 c with the general form's fused rounding), the row written back when it
// changed, the final values stored in the cache when the entry stores.
__device__ void row_work_unit8(const RowWorkEntry& w, const RowWorkCacheStore& store,
                               const CacheSlot& at, int t, int head_dim, int half, int h, int j) {
  const Unit8 u = unit8_dims(w, half, j);
  float* head = w.x + ((size_t)t * w.heads + h) * head_dim;
  const float* in = w.src ? w.src + (size_t)t * w.src_stride + (size_t)h * head_dim : head;
  float v[8];
  const float4 a = load_produced(reinterpret_cast<const float4*>(in + u.lo));
  const float4 b = load_produced(reinterpret_cast<const float4*>(in + u.hi));
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  if (w.bias) {
    const float4 ba = __ldg(reinterpret_cast<const float4*>(w.bias + h * head_dim + u.lo));
    const float4 bb = __ldg(reinterpret_cast<const float4*>(w.bias + h * head_dim + u.hi));
    v[0] += ba.x, v[1] += ba.y, v[2] += ba.z, v[3] += ba.w;
    v[4] += bb.x, v[5] += bb.y, v[6] += bb.z, v[7] += bb.w;
  }
  if (w.variant >= 0) {
    const float4 c4 = *reinterpret_cast<const float4*>(w.cos_t + (size_t)t * half + 4 * j);
    const float4 s4 = *reinterpret_cast<const float4*>(w.sin_t + (size_t)t * half + 4 * j);
    const float c[4] = {c4.x, c4.y, c4.z, c4.w}, s[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      // The pair's two elements within v: (k, 4 + k) for NeoX, (2k, 2k + 1) adjacent.
      const int ia = w.neox ? k : 2 * k, ib = w.neox ? 4 + k : 2 * k + 1;
      const float x0 = v[ia], x1 = v[ib];
      v[ia] = fmaf(x0, c[k], -(x1 * s[k]));
      v[ib] = fmaf(x0, s[k], x1 * c[k]);
    }
  }
  if (w.bias || w.variant >= 0 || w.src) {
    *reinterpret_cast<float4*>(head + u.lo) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(head + u.hi) = make_float4(v[4], v[5], v[6], v[7]);
  }
  if (w.kv >= 0 && at.cache != nullptr) {
    store_kv4(store, at, w.kv, h, u.lo, v);
    store_kv4(store, at, w.kv, h, u.hi, v + 4);
  }
}

// Grid (tokens, blocks per token), 128 threads: the token's units of every entry in turn
// (entry 0's heads, then entry 1's, ...), a unit a thread.
__global__ void row_work_vector_kernel(RowWorkBatch batch, int head_dim, int half) {
  begin_dependent_kernel();
  const int t = blockIdx.x;
  const CacheSlot at = cache_slot(batch.store, t);
  const int per_head = head_dim / 8;
  for (int unit = blockIdx.y * blockDim.x + threadIdx.x;; unit += gridDim.y * blockDim.x) {
    int e = 0, rest = unit;
    while (e < batch.n && rest >= batch.e[e].heads * per_head)
      rest -= batch.e[e++].heads * per_head;
    if (e == batch.n) return;
    row_work_unit8(batch.e[e], batch.store, at, t, head_dim, half, rest / per_head,
                   rest % per_head);
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Whether the batch takes the vectorized form: head_dim a multiple of 8, RoPE entries turning
// whole heads in pairs of a multiple of 4, every row, bias and angle table 16-byte aligned.
bool row_work_vectorizes(const RowWorkBatch& batch, int head_dim, int half) {
  if (head_dim % 8 != 0) return false;
  if (batch.store.cache != nullptr && !aligned16(batch.store.cache)) return false;
  for (int e = 0; e < batch.n; ++e) {
    const RowWorkEntry& w = batch.e[e];
    if (!aligned16(w.x) || (w.bias != nullptr && !aligned16(w.bias))) return false;
    if (w.src != nullptr && (!aligned16(w.src) || w.src_stride % 4 != 0)) return false;
    if (w.variant < 0) continue;
    if (2 * half != head_dim || half % 4 != 0 || !aligned16(w.cos_t) || !aligned16(w.sin_t))
      return false;
  }
  return true;
}

}  // namespace

void launch_row_work(const RowWorkBatch& batch, int n_tokens, int head_dim, int half,
                     cudaStream_t stream) {
  // The lab's HABLAR_ROW_WORK_VECTOR=0 keeps every batch on the general form (comparisons).
  if (row_work_vectorizes(batch, head_dim, half) && lab_knob("HABLAR_ROW_WORK_VECTOR", 1) != 0) {
    int units = 0;
    for (int e = 0; e < batch.n; ++e) units += batch.e[e].heads * (head_dim / 8);
    const int blocks = std::min((units + 127) / 128, 32);
    launch_dependent(row_work_vector_kernel, dim3((unsigned)n_tokens, (unsigned)blocks), dim3(128),
                     0, stream, batch, head_dim, half);
    return;
  }
  launch_dependent(row_work_kernel,
                   dim3((unsigned)n_tokens, (unsigned)row_work_blocks(batch, head_dim, half)),
                   dim3(128), 0, stream, batch, head_dim, half);
}

}  // namespace hablar::cuda
