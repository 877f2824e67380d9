// A one-token decode step as one persistent launch (the batch-1 step of the CUDA backend).
//
// At one token a step is latency, not bytes: about eleven launches a layer, each a few
// microseconds however little it reads. Here one launch of one block per multiprocessor
// (all resident) walks a list of phases with a grid-wide barrier between them, each block
// taking its share of each phase's rows:
//   kNormProducts  the residual add (x + add, kept in x_out), RMSNorm and int8 quantization
//                  of the row, done by every block into its own shared memory, then 1-3
//                  products of it (Q, K and V), the gated pair (gate, up and the activation)
//                  or the output head;
//   kAttention     bias and RoPE of this token's q and k, k and v stored at its position in
//                  the paged cache, and split attention over the sequence, one warp per
//                  (KV head, split); the last warp of a KV head merges its splits and writes
//                  the output rows as int8 blocks for the next product;
//   kProduct       a product whose input is the attention's int8 rows, or f32 rows (the
//                  gated activation) that every block quantizes first.
// Five phases a layer. The phases come from the model's own forward (persistent_step_plan.h
// records the ops model::forward calls); a forward the phases cannot express (other weight
// types, q/k norms, scales, windows, soft-caps, experts) keeps the launch-per-op step.
//
// Numerics: the norm, its int8 codes, and every Q4_K / Q6_K row are bit for bit those of
// the launch-per-op step (the same reductions in the same order, the same teams per row:
// q4k_rows_team, q6k_rows_team); the attention sums in f32 on CUDA cores in its own order,
// so its output (and what follows) differs from the tensor-core decode kernel's by rounding.
//
// Status: experimental and off by default (CudaExecutorOptions::persistent_decode; `hablar
// bench --persistent-decode --profile` times its phases). On the H200 it is still slower
// than the launch-per-op graph (1.5B shape: 2.9 ms a step against 1.3 ms): every phase pays
// a grid barrier, L2 round trips in its prologue and, above all, cold instruction fetches
// (docs/PERFORMANCE.md).
// Plain C++ (no CUDA types): the planner and its host test build without nvcc.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/kv_layout.h"
#include "core/layer_spec.h"

namespace hablar::cuda {

enum class PersistentPhaseKind : int32_t { kNormProducts = 0, kAttention = 1, kProduct = 2 };
// What a kProduct phase multiplies: the attention's int8 rows, or f32 rows it quantizes.
enum class PersistentInput : int32_t { kAttentionCodes = 0, kF32 = 1 };
enum class PersistentMatrixType : int32_t { kQ4K = 0, kQ6K = 1 };

struct PersistentMatrix {
  const void* data = nullptr;
  size_t row_bytes = 0;
  int32_t rows = 0, cols = 0;
  PersistentMatrixType type = PersistentMatrixType::kQ4K;
  int32_t team = 0;  // threads (Q4_K) or lanes (Q6_K) per row: the launch-per-op kernel's
  float* out = nullptr;
};

inline constexpr int kPersistentMaxMatrices = 3;

struct PersistentPhase {
  PersistentPhaseKind kind = PersistentPhaseKind::kNormProducts;
  // kNormProducts: n = rmsnorm(x + add) * norm_weight over `width` values; x + add is kept in
  // x_out when add is given (the residual stream alternates between two buffers).
  const float* x = nullptr;
  const float* add = nullptr;
  float* x_out = nullptr;
  const float* norm_weight = nullptr;
  int32_t width = 0;
  // kProduct: its input.
  PersistentInput input = PersistentInput::kF32;
  const float* in = nullptr;  // kF32: [width] values
  // Products (kNormProducts, kProduct): matrices[0..n_matrices), each of K = width; `glu`:
  // matrices[0] the gate, matrices[1] the up matrix, out = act(gate) * up into matrices[0].out.
  PersistentMatrix matrices[kPersistentMaxMatrices];
  int32_t n_matrices = 0;
  bool glu = false;
  GluActivation act = GluActivation::kSilu;
  // kAttention: this token's q [n_heads][head_dim], k and v [n_kv_heads][head_dim] as the
  // products wrote them, their biases (or null), the RoPE variant (-1: none), the output.
  int32_t layer = 0;
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr;
  int32_t rope_variant = -1;
  float scale = 0.0f;
  float* out = nullptr;  // [n_heads * head_dim] f32 (its int8 form goes to the workspace)
};

// What a phase list runs against: the step's inputs for its one token (device pointers set
// by cuda::ForwardOps::stage/upload) and the model's shapes.
struct PersistentStepContext {
  int32_t n_embd = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float rms_eps = 0.0f;
  KvCacheLayout layout;
  void* kv_cache = nullptr;
  const int32_t* position = nullptr;     // the token's position (its cached length)
  const int32_t* block_table = nullptr;  // its sequence's block table
  int32_t max_blocks_per_seq = 0;
  // RoPE: pairs per head, and per variant its angles for the token (cos, sin [rope_pairs])
  // and whether it rotates (i, i + pairs) (NeoX) or (2i, 2i + 1).
  int32_t rope_pairs = 0;
  int32_t n_rope_variants = 0;
  const float* rope_cos[4] = {};
  const float* rope_sin[4] = {};
  bool rope_neox[4] = {};
};

// Limits of the persistent kernel: widest product input, GQA group, head sizes, splits.
inline constexpr int32_t kPersistentMaxWidth = 16384;
inline constexpr int32_t kPersistentMaxGroup = 8;
inline constexpr int32_t kPersistentMaxSplits = 32;
inline constexpr int kPersistentMaxRopeVariants = 4;
// Shared memory of each warp's region, through which its weight rows stream.
inline constexpr size_t kPersistentWarpRegion = 12 * 1024;

}  // namespace hablar::cuda
