// The paged KV cache layout shared by the engine, the CPU backend and the CUDA backend.
//
// The cache is a pool of fixed-size blocks of `block_size` token positions. A sequence owns
// a list of physical block ids (its block table); its token at position p lives in block
// table[p / block_size], slot p % block_size. Memory is one array per layer and per K/V:
//
//   pool[layer][kv][block][kv_head][slot][dim]     kv: 0 = K, 1 = V
//
// so one head's keys of one block are a contiguous [block_size][head_dim] tile, which the
// attention kernels read in order. Elements are F16 or BF16, or one head row of head_dim
// values is a run of llama.cpp Q8_0 / Q4_0 blocks of 32 (core/quant_blocks.h: 34 / 18 bytes
// each; Q4_0 on the CPU only; Q8_0 rows as core/kv_rows.h makes them). Sizes and offsets count
// 2-byte units: a row is head_dim units for F16/BF16, head_dim / 32 * 17 (Q8_0) or * 9 (Q4_0) units
// for the quantized types.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define HABLAR_KV_HD __host__ __device__
#else
#define HABLAR_KV_HD
#endif

namespace hablar {

enum class KvDType : uint8_t { F16 = 0, BF16 = 1, Q8_0 = 2, Q4_0 = 3 };

inline constexpr int kKvQuantBlock = 32;  // values per Q8_0 / Q4_0 block along head_dim

inline constexpr bool kv_dtype_quantized(KvDType t) {
  return t == KvDType::Q8_0 || t == KvDType::Q4_0;
}
inline constexpr const char* kv_dtype_name(KvDType t) {
  return t == KvDType::F16    ? "f16"
         : t == KvDType::BF16 ? "bf16"
         : t == KvDType::Q8_0 ? "q8_0"
                              : "q4_0";
}
// 2-byte units of one head row of head_dim values (head_dim a multiple of 32 when quantized).
HABLAR_KV_HD inline constexpr int kv_row_units(KvDType t, int head_dim) {
  return t == KvDType::Q8_0   ? head_dim / kKvQuantBlock * 17
         : t == KvDType::Q4_0 ? head_dim / kKvQuantBlock * 9
                              : head_dim;
}

inline constexpr int kDefaultKvBlockSize = 16;

struct KvCacheLayout {
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = kDefaultKvBlockSize;
  int32_t n_blocks = 0;
  KvDType dtype = KvDType::F16;  // K's type, and V's unless v_type is set
  int8_t v_type = -1;            // V's type (a KvDType) when it differs from K's

  HABLAR_KV_HD KvDType type(int kv) const {
    return kv == 1 && v_type >= 0 ? (KvDType)v_type : dtype;
  }
  // Units (2 bytes) of one head row of K (kv 0) or V (kv 1).
  HABLAR_KV_HD size_t row_units(int kv = 0) const {
    return (size_t)kv_row_units(type(kv), head_dim);
  }
  // Units of one [kv_head][slot][row] block of K (or V).
  HABLAR_KV_HD size_t block_elems(int kv = 0) const {
    return (size_t)n_kv_heads * (size_t)block_size * row_units(kv);
  }
  // Units of one layer's K (or V) pool.
  HABLAR_KV_HD size_t pool_elems(int kv = 0) const { return block_elems(kv) * (size_t)n_blocks; }
  HABLAR_KV_HD size_t layer_elems() const { return pool_elems(0) + pool_elems(1); }
  // Units of the whole cache (every layer, K and V).
  HABLAR_KV_HD size_t total_elems() const { return layer_elems() * (size_t)n_layers; }
  HABLAR_KV_HD size_t total_bytes() const { return total_elems() * 2; }  // 2-byte units
  // Bytes one token position takes in every layer, K and V.
  HABLAR_KV_HD size_t bytes_per_token() const {
    return (size_t)n_layers * (size_t)n_kv_heads * (row_units(0) + row_units(1)) * 2;
  }
  // Bytes one block of positions takes in every layer, K and V.
  HABLAR_KV_HD size_t block_bytes() const { return bytes_per_token() * (size_t)block_size; }

  // Unit offset of (layer, kv, block, kv_head, slot, dim) from the cache's base (dim counts
  // units: elements for F16/BF16; 0, the row's start, for the quantized types). With K and V
  // of one type this is ((((layer * 2 + kv) * n_blocks + block) * n_kv_heads + kv_head)
  // * block_size + slot) * row + dim.
  HABLAR_KV_HD size_t offset(int layer, int kv, int block, int kv_head, int slot, int dim) const {
    return (size_t)layer * layer_elems() + (kv == 1 ? pool_elems(0) : 0) +
           (((size_t)block * (size_t)n_kv_heads + (size_t)kv_head) * (size_t)block_size +
            (size_t)slot) *
               row_units(kv) +
           (size_t)dim;
  }
  // Offset of a token position of a sequence, given its block table.
  HABLAR_KV_HD size_t position_offset(const int32_t* block_table, int layer, int kv, int kv_head,
                                      int pos) const {
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
  const int32_t* seq_lens = nullptr;  // tokens already in the cache before this step
  const uint8_t* active = nullptr;    // 1 = live this step
};

}  // namespace hablar
