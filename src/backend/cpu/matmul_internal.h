// Internals of matmul shared by the dispatcher, the per-ISA kernel files and the tests.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/ops.h"
#include "core/quant_blocks.h"
#include "core/tensor_view.h"
#include "core/thread_pool.h"

namespace hablar::cpu {

// Throws hablar::Error naming the problem for shapes or types matmul cannot take.
void check_matmul_args(const WeightView& w, const float* x, int64_t n_tokens, const float* y);

// Rows [row_begin, row_end) of y (y[t * w.rows + r]) for every token t < n_tokens. Token t's
// activation row is at act + t * act_stride bytes: quantized (act_quant.h) for the integer
// formats, the float x row otherwise.
using GemmFn = void (*)(const WeightView& w, int64_t row_begin, int64_t row_end, const uint8_t* act,
                        size_t act_stride, int64_t n_tokens, float* y);

// The summation orders of llama.cpp's K-format kernels that a token's role (ops.h) selects.
//  kOneToken: vec_dot (Q5_K, Q6_K: 8 float lanes) or the repacked gemv (Q4_K: the mins term in
//             its own float sum, one step per super-block); every other type's only order.
//  kGroupOf4: Q4_K's repacked 4-token gemm: as kOneToken, one float step per 64 values.
//  kTiled:    Q5_K and Q6_K's tiled kernel: per super-block r = d * float(isum) - dmin *
//             float(msum) (one rounding for the second product and the difference), then
//             acc = fma(r, d_x, acc).
enum class KOrder : uint8_t { kOneToken, kGroupOf4, kTiled };
// The order a weight type's dot products take for a token of this role.
KOrder k_order_for(DType type, uint8_t role);

enum class Isa { kScalar, kAvx2, kAvx512 };
const char* isa_name(Isa isa);

struct IsaKernels {
  void (*quantize_act32)(const float* x, int64_t n, void* row);
  void (*quantize_q8k)(const float* x, int64_t n, BlockQ8_K* blocks);
  GemmFn (*gemm_for)(DType type);  // nullptr for a type without a kernel
  // The kernel of (type, order) for an order other than kOneToken; nullptr where the type
  // has no such order.
  GemmFn (*gemm_ordered_for)(DType type, KOrder order);
};

// The kernels of an instruction set, or nullptr when this CPU (or build) lacks it. kScalar is
// always available.
const IsaKernels* isa_kernels(Isa isa);
// The fastest instruction set this CPU runs (the one matmul uses).
Isa best_isa();

// matmul on a chosen instruction set (tests compare each against matmul_reference).
void matmul_with_isa(Isa isa, const WeightView& w, const float* x, int64_t n_tokens, float* y,
                     ThreadPool& pool, TokenRoles roles = {});

// Per-ISA tables, defined in kernels_avx2.cpp / kernels_avx512.cpp.
const IsaKernels& avx2_kernels();
const IsaKernels& avx512_kernels();
const IsaKernels& scalar_kernels();

}  // namespace hablar::cpu
