// The CPU backend's ops: everything a transformer forward needs, over float activations
// and weights in any supported DType. Kernels pick AVX-512 (+VNNI) or AVX2 code at start-up
// (core/cpu_features.h); each has a scalar reference that the tests compare against.
#pragma once

#include <cstdint>
#include <span>

#include "core/kv_layout.h"
#include "core/kv_rows.h"
#include "core/layer_spec.h"
#include "core/llama_batch_roles.h"
#include "core/rope.h"
#include "core/tensor_view.h"
#include "core/thread_pool.h"

namespace hablar::cpu {

// Where a token stands in llama.cpp's batch (the tokens of one llama_decode step), for the K
// formats whose summation order in llama.cpp's CPU kernels depends on it (on x86):
//  - kRoleBatchOf8: the batch has 8 tokens or more. Q5_K and Q6_K then take llama.cpp's tiled
//    kernel (one float step per super-block), else its one-token vec_dot (8 float lanes).
//  - kRoleGroupOf4: the token lies in the batch's leading multiple of 4 tokens. Q4_K weights,
//    which llama.cpp repacks 8 rows at a time, then take its 4-token gemm kernel (one float
//    step per 64 values), else its one-token gemv (one per super-block).
// A role of 0 is a batch of one token (decoding). Roles are the caller's statement about each
// token alone, so a token's result never depends on the other tokens of the call.
using hablar::kRoleBatchOf8;
using hablar::kRoleGroupOf4;
// One role per token; empty: every token takes role 0.
using TokenRoles = std::span<const uint8_t>;
using hablar::llama_batch_role;  // core/llama_batch_roles.h

// y[t * w.rows + r] = sum_c W[r][c] * x[t * w.cols + c], for t < n_tokens.
// Integer formats quantize the activations to 8-bit blocks (Q8_0, Q8_1 or Q8_K, as the weight
// type needs) and use integer dot products; F16/BF16/F32 weights use float FMA. Parallel over
// output rows. Batch invariant: the value for token t is bit-identical whatever n_tokens is and
// whatever the other tokens are (given its role, see above). Throws hablar::Error for a type
// without a kernel, a w.cols that is not a multiple of the type's block, or roles of another
// length than n_tokens.
void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool,
            TokenRoles roles = {});
// Scalar form with the same activation quantization: the test oracle.
void matmul_reference(const WeightView& w, const float* x, int64_t n_tokens, float* y,
                      TokenRoles roles = {});
// True when matmul has a kernel for this weight type.
bool matmul_supports(DType type);

// y = x / sqrt(mean(x^2) + eps) * weight, n values (y may alias x).
void rmsnorm(const float* x, const float* weight, float* y, int64_t n, float eps);

// LayerNorm with a bias (or none: null), y = (x - mean) / sqrt(var + eps) * weight + bias, n values
// (y may alias x), rounded as llama.cpp's CPU build for AVX-512 computes it: the mean in float from
// a double sum; the deviations' squares summed 16 at a time in float (reduce16, below), those sums
// in double; then the scale, the weight and the bias each applied in its own rounding.
void layernorm(const float* x, const float* weight, const float* bias, float* y, int64_t n,
               float eps);

using hablar::RopeParams;
// In place on x[n_heads][head_dim] for a token at position pos: rope_angles, then rope_apply.
void rope(float* x, int n_heads, int head_dim, int pos, const RopeParams& p);
using hablar::kMaxRopePairs;
using hablar::rope_angles;  // core/rope.h: the same angles on every backend
// Rotates the pairs of x[n_heads][head_dim] by those angles (one fused multiply-add each, as
// llama.cpp's compiled rotation); the SIMD form gives the same bits as the scalar one.
void rope_apply(float* x, int n_heads, int head_dim, const RopeParams& p, const float* cos_t,
                const float* sin_t);
void rope_apply_scalar(float* x, int n_heads, int head_dim, const RopeParams& p, const float* cos_t,
                       const float* sin_t);

// e^x as llama.cpp's vectorized expf computes it (round-to-nearest n = x/ln2, a degree-5
// polynomial in the remainder, scaled by 2^n), bit for bit; within 2 ulp of the true value.
// swiglu and attention's softmax use it (their SIMD forms give the same bits), so that their
// results round as the reference implementation's do.
float exp_approx(float x);

// Sum of 16 partial sums in the order of a 512-bit horizontal add: a[i] + a[i + 8], then
// the halves of that, then pairs: ((b0 + b2) + (b1 + b3)) with b = the four-lane sums.
inline constexpr int kReduceLanes = 16;
inline float reduce16(const float* a) {
  float b[8], c[4];
  for (int i = 0; i < 8; ++i) b[i] = a[i] + a[i + 8];
  for (int i = 0; i < 4; ++i) c[i] = b[i] + b[i + 4];
  return (c[0] + c[2]) + (c[1] + c[3]);
}
// 64 partial sums folded to 16 as four 16-lane accumulators are: (s0 + s2) + (s1 + s3).
inline void fold64(const float* s, float* t) {
  for (int l = 0; l < 16; ++l) t[l] = (s[l] + s[l + 32]) + (s[l + 16] + s[l + 48]);
}

// out = silu(gate) * up with silu(g) = g / (1 + exp_approx(-g)), n values (out may alias
// gate or up).
void swiglu(const float* gate, const float* up, float* out, int64_t n);
// Its scalar form (the SIMD one gives the same bits; tests compare them).
void swiglu_scalar(const float* gate, const float* up, float* out, int64_t n);
// out = gelu_tanh(gate) * up as llama.cpp's CPU computes it: gate rounded to half indexes a
// table of GELU values rounded to half; gate <= -10 gives 0, gate >= 10 gives gate * up.
void geglu(const float* gate, const float* up, float* out, int64_t n);
// out = gelu_tanh(x) as geglu computes it (x <= -10 gives 0, x >= 10 gives x; out may be x).
void gelu(const float* x, float* out, int64_t n);
// x = max(x, 0)^2 in place, n values (ggml_relu then ggml_sqr: one rounding).
inline void relu_squared(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float r = x[i] > 0.0f ? x[i] : 0.0f;
    x[i] = r * r;
  }
}
// The table gelu and geglu look up: 65536 floats, gelu_tanh of each half value rounded to half.
const float* gelu_table();
// swiglu or geglu (out may alias gate or up).
void glu(GluActivation act, const float* gate, const float* up, float* out, int64_t n);
// x[i] = cap * tanh(x[i] * (1 / cap)) in float, as llama.cpp's scale, tanh, scale.
void softcap(float* x, int64_t n, float cap);
// y += x, n values.
void add_inplace(float* y, const float* x, int64_t n);
// Reads n bytes (n a multiple of 64, p 8-byte aligned) and returns their 64-bit words XORed:
// a pure streaming read, which times the memory bound of decode.
uint64_t read_through(const uint8_t* p, size_t n);
uint64_t read_through_scalar(const uint8_t* p, size_t n);  // the same, without SIMD
// out[0..table.cols) = row `token` of the table, dequantized. Throws for a token out of range.
void embedding_row(const WeightView& table, int32_t token, float* out);

// Paged KV cache (core/kv_layout.h; rows of F16/BF16 elements or of Q8_0/Q4_0 blocks in a
// uint16_t array). Stores the K and V of one token at position pos, each in its type (the
// quantized ones as llama.cpp's CPU stores them): k and v are [n_kv_heads][head_dim].
void kv_store(uint16_t* cache, const KvCacheLayout& layout, int layer, const int32_t* block_table,
              int pos, const float* k, const float* v);
// One cache row back to float: kv_row_to_f32 (core/kv_rows.h).

// The two summation orders of llama.cpp's CPU attention, which ours copies: its kernel for
// several query tokens keeps 16 partial sums per dot product (index mod 16, reduce16); its
// one-token kernel keeps 64 (index mod 64, fold64 then reduce16; a head_dim tail past the
// last 64 is added in double). q·k with head_dim not a multiple of 16 always takes the second.
enum class SumOrder { kLanes16, kLanes64 };

// Attention of one query token at position pos over cache positions [0, pos] (its own K/V must
// already be stored). q [n_heads][head_dim] -> out [n_heads][head_dim]. GQA: head h reads kv head
// h / (n_heads / n_kv_heads). Scale 1/sqrt(head_dim); numerically stable softmax. Rounds as
// llama.cpp's CPU attention does (attention.cpp): q and the softmax weights are rounded to
// the cache's type, sums are kept in 16 lanes.
void attention_one(const uint16_t* cache, const KvCacheLayout& layout, int layer,
                   const int32_t* block_table, int pos, const float* q, int n_heads, float* out,
                   SumOrder order = SumOrder::kLanes16);

// The scalar form of attention_one (the SIMD one gives the same bits; tests compare them).
void attention_one_scalar(const uint16_t* cache, const KvCacheLayout& layout, int layer,
                          const int32_t* block_table, int pos, const float* q, int n_heads,
                          float* out, SumOrder order = SumOrder::kLanes16);

// Many query tokens (of one or several sequences). Each query gives the same result as
// attention_one with its arguments, whatever the batch and the thread count. Tiled (ops_x86.h):
// runs of consecutive tokens of a sequence (query tiles, up to 16, fewer when long) times the
// query heads of one kv head read that head's K/V once; threads take (sequence, kv head,
// query tile) items, and when there are few of them and the sequence is long (decoding one or
// two sequences), the keys of one tile are split over the threads in three stages (scores by
// position range, softmax by row, values by dimension range), which keep every value's
// operations and order: the same bits as the one-thread form.
struct AttentionQuery {
  const int32_t* block_table;
  int32_t pos;
  const float* q;
  float* out;
  SumOrder order = SumOrder::kLanes16;  // kLanes64 for a sequence decoding one token
  int32_t first = 0;  // the first position seen (> 0 under a sliding window): [first, pos]
};
// With a quantized K or V (Q8_0 / Q4_0) q and the softmax weights are not rounded and both
// orders are the 16-lane one; a quantized K's scores are llama.cpp's flash-attention integer
// q·k (q quantized to Q8_0, attention_int.h), a quantized V's rows are dequantized to float.
// Still the same bits for a query whatever the batch. F16/BF16 caches keep llama.cpp's
// (non-flash) roundings exactly.
// Scores are q·k * scale (attention_one's scale is 1/sqrt(head_dim)), then, when softcap > 0,
// softcap * tanh(score * (1 / softcap)) as llama.cpp's three ops compute it. Positions before
// a query's `first` count as masked ones do in llama.cpp: their softmax weights are zeros.
void attention_batch(const uint16_t* cache, const KvCacheLayout& layout, int layer,
                     std::span<const AttentionQuery> queries, int n_heads, float scale,
                     float softcap, ThreadPool& pool);
// The scalar form, one (query, head) at a time: the oracle the tiled form is tested against
// (the same bits).
void attention_batch_scalar(const uint16_t* cache, const KvCacheLayout& layout, int layer,
                            std::span<const AttentionQuery> queries, int n_heads, float scale,
                            float softcap, ThreadPool& pool);
// The same with scale 1/sqrt(head_dim).
void attention_batch(const uint16_t* cache, const KvCacheLayout& layout, int layer,
                     std::span<const AttentionQuery> queries, int n_heads, ThreadPool& pool);

}  // namespace hablar::cpu
