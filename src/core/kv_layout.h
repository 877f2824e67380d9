// The paged KV cache layout shared by the engine, the CPU backend and the CUDA backend.
//
// The cache is a pool of fixed-size blocks of `block_size` token positions. A sequence owns
// a list of physical block ids (its block table); its token at position p lives in block
// table[p / block_size], slot p % block_size. Memory is one array per layer and per K/V:
//
//   pool[layer][kv][block][kv_head][slot][dim]     kv: 0 = K, 1 = V
//
// so one head's keys of one block are a contiguous [block_size][head_dim] tile, which the
// attention kernels read in order. Elements are F16 or BF16 (KvDType).
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define HABLAR_KV_HD __host__ __device__
#else
#define HABLAR_KV_HD
#endif

namespace hablar {

enum class KvDType : uint8_t { F16 = 0, BF16 = 1 };

inline constexpr int kDefaultKvBlockSize = 16;

struct KvCacheLayout {
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = kDefaultKvBlockSize;
  int32_t n_blocks = 0;
  KvDType dtype = KvDType::F16;

  // Elements of one [kv_head][slot][dim] block.
  HABLAR_KV_HD size_t block_elems() const {
    return (size_t)n_kv_heads * (size_t)block_size * (size_t)head_dim;
  }
  // Elements of one layer's K (or V) pool.
  HABLAR_KV_HD size_t pool_elems() const { return block_elems() * (size_t)n_blocks; }
  // Elements of the whole cache (every layer, K and V).
  HABLAR_KV_HD size_t total_elems() const { return pool_elems() * 2 * (size_t)n_layers; }
  HABLAR_KV_HD size_t total_bytes() const { return total_elems() * 2; }  // 2-byte elements

  // Element offset of (layer, kv, block, kv_head, slot, dim) from the cache's base.
  HABLAR_KV_HD size_t offset(int layer, int kv, int block, int kv_head, int slot,
                             int dim) const {
    return (((((size_t)layer * 2 + (size_t)kv) * (size_t)n_blocks + (size_t)block) *
                 (size_t)n_kv_heads +
             (size_t)kv_head) *
                (size_t)block_size +
            (size_t)slot) *
               (size_t)head_dim +
           (size_t)dim;
  }
  // Offset of a token position of a sequence, given its block table.
  HABLAR_KV_HD size_t position_offset(const int32_t* block_table, int layer, int kv,
                                      int kv_head, int pos) const {
    return offset(layer, kv, block_table[pos / block_size], kv_head, pos % block_size, 0);
  }
};

// Per-step view of the sequences a batched attention call serves. Arrays have
// `n_slots` entries (a bucket size >= the live count); entries with active == 0 are padding
// or finished sequences and must be neither read nor written.
struct KvBatchView {
  int32_t n_slots = 0;
  const int32_t* block_tables = nullptr;  // [n_slots][max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  const int32_t* seq_lens = nullptr;      // tokens already in the cache before this step
  const uint8_t* active = nullptr;        // 1 = live this step
};

}  // namespace hablar
