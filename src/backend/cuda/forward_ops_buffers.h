// The step buffers of cuda::ForwardOps (forward_ops.cu, forward_ops_moe.cu): internal to the
// CUDA backend, shared by the two files that implement the op set.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/forward_ops.h"
#include "backend/cuda/matmul.h"
#include "core/kv_layout.h"

namespace hablar::cuda {

// n rounded up to a multiple of 256 (elements): every buffer carved from one allocation starts
// aligned.
inline size_t round_up(size_t n) {
  return (n + 255) / 256 * 256;
}

// Queued element-wise work of up to three buffers (the step's q, k and v), done in one
// launch: for each, x += bias (when given), then RoPE (when variant >= 0) with the angles of
// its variant. x [T][heads][head_dim]: pair i of each head of token t turns by the angle whose
// cosine and sine are cos_t[t][i], sin_t[t][i] (core/rope.h), with the CPU's fused rounding;
// the bias is added first, as add_bias_kernel would.
// An entry may also store its final rows in the KV cache (kv 0: the step's keys, 1: its
// values) at each live token's position, as the attention's scatter kernel would: the
// attention that follows then skips that kernel (ForwardOps::attention).
// An entry with a source (src) reads token t's row from src + t * src_stride instead of x and
// writes its final values to x whatever else it does: Q, K and V multiplied as one GEMM into
// rows of [q | k | v] reach their own buffers through this pass (ForwardOps::stacked_qkv).
struct RowWorkEntry {
  float* x = nullptr;
  const float* bias = nullptr;  // [heads * head_dim] or null
  int heads = 0;
  int variant = -1;  // RoPE variant, -1: none
  const float* cos_t = nullptr;
  const float* sin_t = nullptr;
  bool neox = false;
  int kv = -1;                 // the cache half it stores to, -1: none
  const float* src = nullptr;  // null: x is read (and written where the entry changes it)
  int64_t src_stride = 0;      // floats between two tokens' rows of src
};
// Where the entries with kv >= 0 store: token t at positions[t] through its block table,
// unless inactive or past the table's capacity.
struct RowWorkCacheStore {
  uint16_t* cache = nullptr;  // null: no entry stores
  KvCacheLayout layout;
  int layer = 0;
  const int32_t* positions = nullptr;
  const int32_t* block_tables = nullptr;  // [T][max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  const uint8_t* active = nullptr;
};
struct RowWorkBatch {
  RowWorkEntry e[3];
  int n = 0;
  RowWorkCacheStore store;
};
// The batch's work for a step of n_tokens rows, as a dependent launch on `stream` (row_work.cu);
// half: the RoPE pairs of a head (every variant's).
void launch_row_work(const RowWorkBatch& batch, int n_tokens, int head_dim, int half,
                     cudaStream_t stream);

// The step's inputs, laid out identically in pinned host memory and on the device, so one
// asynchronous copy moves them all. Offsets are in 4-byte words.
struct ForwardOps::Buffers {
  DeviceMemory activations;
  DeviceMemory inputs;
  DeviceMemory attention_workspace;
  DeviceMemory int8_workspace;
  DeviceMemory f16_rows;                // the f16 tensor-core products' rows (convert_rows_to_f16)
  DeviceMemory f16_scratch;             // their partial sums where K is split
  DeviceMemory bf16_rows;               // products over kept bf16 copies: their input rows in bf16
  DeviceMemory qkv_rows;                // Q, K and V as one GEMM: [T][q | k | v] f32 (stacked_qkv)
  DeviceMemory cpu_rounding_workspace;  // deterministic mode: the CPU's activation rows
  DeviceMemory gelu_table;              // deterministic mode: the CPU's GELU table
  size_t attention_workspace_bytes = 0;
  void* host_inputs = nullptr;  // pinned
  size_t input_words = 0;
  PrefillMatmul prefill;
  // Work queued by add_bias()/rope() and add(), run fused by the op that next needs it
  // (one kind at a time, so the order of the queued ops is kept).
  RowWorkBatch pending_rows;
  struct {
    float* x = nullptr;
    const float* y = nullptr;
    int64_t width = 0;
  } pending_add;
  // The activation rows the int8 workspace holds, quantized by the norm that wrote them
  // (rmsnorm: norm and quantization in one launch); the next products of those rows skip
  // their own quantization. Cleared by every other op (flush_add, product).
  const float* q8_holds = nullptr;
  // The same for the f16 rows of the f16 tensor-core products (rmsnorm: norm and conversion
  // in one launch).
  const float* f16_holds = nullptr;
  // And for the bf16 rows of the products over kept bf16 copies (rmsnorm, the gated
  // activation).
  const float* bf16_holds = nullptr;
  // Rows whose f32 buffer was never written: the gated activation over kept copies
  // (glu_over_kept_copies) leaves its output only as bf16 rows. Cleared with the holds.
  const float* bf16_only = nullptr;
  // Forgets what the workspaces hold: every op but the ones that consume held rows calls it.
  void forget_held_rows() { q8_holds = f16_holds = bf16_holds = bf16_only = nullptr; }
  // Word offsets of each input array (for max_tokens rows). roles, sampled and logit_roles
  // hold a byte per row (deterministic mode's rounding facts, core/llama_batch_roles.h).
  size_t tokens = 0, positions = 0, logit_rows = 0, active = 0, roles = 0, sampled = 0,
         logit_roles = 0, tables = 0, cos = 0, sin = 0;
  // The step's prompt chunks that take the flash prefill attention (ForwardOps::stage): the
  // first row, token count and cached length of each, and a byte per row that is 1 for the
  // live rows the decode attention takes (the other chunks' tokens).
  size_t prefill_first = 0, prefill_count = 0, prefill_cached = 0, decode_active = 0;
  ~Buffers() {
    if (host_inputs) cudaFreeHost(host_inputs);
  }
};

// The mixture-of-experts step buffers (reserve_moe): T = max_tokens, N = T * n_used entries.
struct ForwardOps::MoeBuffers {
  int n_experts = 0, n_used = 0;
  int64_t ff_expert = 0, ff_shared = 0;
  DeviceMemory floats, ints, single_roles;
  DeviceMemory q8;                  // the grouped Q4_K products' int8 rows (moe::quantize_rows)
  int32_t* host_offsets = nullptr;  // pinned [n_experts + 1]
  float* logits = nullptr;          // [T x n_experts], then the probabilities
  float* weights = nullptr;         // [N]
  float* rows = nullptr;            // [N x n_embd] the gathered inputs, by expert
  float* gate = nullptr;            // [N x ff_expert]
  float* up = nullptr;              // [N x ff_expert]
  float* down = nullptr;            // [N x n_embd] the experts' outputs, by expert
  float* shared_gate = nullptr;     // [T x ff_shared]
  float* shared_up = nullptr;       // [T x ff_shared]
  float* shared_down = nullptr;     // [T x n_embd]
  float* gate_logits = nullptr;     // [T]
  int32_t *chosen = nullptr, *order = nullptr, *position = nullptr;  // [N] each
  int32_t* offsets = nullptr;                                        // [n_experts + 1]
  int32_t* active = nullptr;  // [n_experts] the experts with rows, then -1 (moe::group)
  ~MoeBuffers() {
    if (host_offsets) cudaFreeHost(host_offsets);
  }
};

}  // namespace hablar::cuda
