// AVX-512 kernels of the embedding step (cpu::EmbedOps): whole sequences of many tokens, so
// the products are large GEMMs and attention sees every K/V row of a sequence at once.
// Compiled with AVX-512 flags in embed_kernels_avx512.cpp; call them only where
// embed_kernels_usable() says so (EmbedOps falls back to cpu::matmul and its plain loops).
//
// float_gemm: y[t][r] = epilogue(W[r] · x[t]) for F16 and F32 weights. Each (t, r) value takes
// exactly the operations of cpu::matmul's AVX-512 float tile (x rounded to half for F16 weights
// as llama.cpp does; 16 float lanes accumulated in column order by FMA; the 512-bit horizontal
// sum), so the results are bit-identical to cpu::matmul's: only the blocking differs. Tiles
// of 5 tokens x 5 rows keep 25 accumulators in registers; a thread takes a chunk of 40 rows of a
// block of tokens (about 640 KiB of x) and walks each token tile of the block over it, so the
// chunk's weights stay in L2 and a token tile's activations (5 x up to 1024 columns) in L1; longer
// rows are cut in 1024-column blocks whose partial accumulators wait in a scratch (the lanes' order
// of operations is unchanged). Epilogue: + bias[r] (one float add, as a separate add_bias would
// do), then GELU (the half table of cpu::gelu) when asked.
//
// bidirectional_attention: per (sequence, head), softmax(scale · q·Kᵀ) V over the whole
// sequence, vectorised over 16 keys (scores) and 16 dimensions (values) with the operations
// of EmbedOps' plain loops in their order (products and adds unfused, the exps by std::exp,
// their sum in double), so it gives those loops' bits.
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor_view.h"
#include "core/thread_pool.h"

namespace hablar::cpu::embed {

// The CPU has AVX-512 (F, BW, VL, DQ) and F16C: the kernels below may run.
bool embed_kernels_usable();
// float_gemm takes this weight (F16 or F32, columns a multiple of 16).
bool float_gemm_supports(const WeightView& w);

struct GemmEpilogue {
  const float* bias = nullptr;  // [w.rows] or null
  bool gelu = false;
};
struct GemmJob {
  const WeightView* w;
  float* y;  // [n_tokens][w->rows]
  GemmEpilogue epilogue;
};
// Every job's product over the same input rows x [n_tokens][cols] (one pass of the pool; the
// jobs' weights all have `cols` columns and one type).
void float_gemm(std::span<const GemmJob> jobs, const float* x, int64_t n_tokens, ThreadPool& pool);

// x = GELU(x) + ... in place over n values, as cpu::gelu (bit for bit).
void gelu_inplace(float* x, int64_t n);

struct AttentionShape {
  int n_heads, n_kv_heads, head_dim;  // head_dim a multiple of 16
  float scale, softcap;
};
// out[t][h] for every token of every sequence (rows seq_begin[s] .. seq_begin[s + 1]); q and
// out are [T][n_heads * head_dim], k and v [T][n_kv_heads * head_dim].
void bidirectional_attention(const AttentionShape& shape, std::span<const int64_t> seq_begin,
                             const float* q, const float* k, const float* v, float* out,
                             ThreadPool& pool);

}  // namespace hablar::cpu::embed
