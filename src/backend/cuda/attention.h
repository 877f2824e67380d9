// Attention over the paged KV cache (core/kv_layout.h): F16 or BF16 elements, or Q8_0 rows
// (read as f16, kv_elements.cuh); K and V of one type (cuda_kv_layout_problem).
//
// decode_attention(): THE decode-step entry point the engine calls once per layer and step:
// scatter this step's K/V of every live slot at its position, attend every query head over
// prior + 1 positions (GQA, online softmax, split-K with a reduce), advance the lengths.
//
// prefill_attention(): scatter a chunk of prompt tokens per sequence, then causal flash
// attention of those tokens over everything cached before them plus themselves (GQA,
// tensor cores through WMMA).
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/decode_attention_params.h"

namespace hablar::cuda {

// Runs the decode step on `stream`. `workspace` holds at least
// decode_attention_workspace_bytes(p) bytes of device memory. Head dims 64, 128 and 256
// and up to 8 query heads per KV head are supported; other shapes throw kInvalidArgument.
void decode_attention(const DecodeAttentionParams& p, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream);

// A chunk of prompt tokens for each of n_seqs sequences (token-major):
//   q     [total][n_heads][head_dim]      f32, RoPE applied
//   k_new [total][n_kv_heads][head_dim]   f32, RoPE applied
//   v_new [total][n_kv_heads][head_dim]   f32
//   out   [total][n_heads][head_dim]      f32
// Sequence s owns tokens token_begin[s] .. token_begin[s+1]-1 (packed), or, with
// token_count, token_begin[s] .. token_begin[s] + token_count[s] - 1 (chunks anywhere among
// other rows of a step, which it neither reads nor writes); their positions start at
// cached_len[s] (tokens already in its cache, a prefix or earlier chunks). Every position
// up to cached_len[s] + chunk must fit its block table.
struct PrefillAttentionParams {
  KvCacheLayout layout;
  int32_t layer = 0;
  void* kv_cache = nullptr;
  int32_t n_seqs = 0;
  // [n_seqs][max_blocks_per_seq], or with tables_per_token a row per token of the step
  // (sequence s's: the row of its first token, token_begin[s]).
  const int32_t* block_tables = nullptr;
  int32_t max_blocks_per_seq = 0;
  bool tables_per_token = false;
  const int32_t* token_begin = nullptr;  // [n_seqs + 1] (with token_count: [n_seqs]), device
  const int32_t* token_count = nullptr;  // [n_seqs], device, or null (packed chunks)
  const int32_t* cached_len = nullptr;   // [n_seqs], device
  // The chunks' K/V are in the cache already (the forward's RoPE pass stored them): no
  // scatter kernel.
  bool kv_stored = false;
  int32_t total_tokens = 0;
  int32_t max_chunk = 0;  // largest token_begin[s+1] - token_begin[s] (host-side bound)
  int32_t n_heads = 0;
  const float* q = nullptr;
  const float* k_new = nullptr;
  const float* v_new = nullptr;
  float* out = nullptr;  // may be null when out_bf16 is set
  // When set, the output rows are also written as bf16 ([total_tokens][n_heads * head_dim],
  // each f32 value rounded to nearest even) for the output projection over its kept copy.
  uint16_t* out_bf16 = nullptr;
  float scale = 0.0f;
};

// Head dims 64 and 128; up to any GQA ratio. Throws kInvalidArgument on other shapes.
void prefill_attention(const PrefillAttentionParams& p, cudaStream_t stream);

}  // namespace hablar::cuda
