// Several matmuls of one input in one parallel region: the forward's q/k/v projections and
// its gate/up pair read the same normed activations, so those are quantized once and every
// thread takes its share of each weight's rows in a single run of the pool (one wake-up and
// one join instead of three). Each output is bit-identical to cpu::matmul's (ops.h): the
// same kernels run on the same rows.
#pragma once

#include <cstdint>
#include <span>

#include "backend/cpu/ops.h"
#include "core/tensor_view.h"
#include "core/thread_pool.h"

namespace hablar::cpu {

// y[t * w->rows + r] = sum_c W[r][c] * x[t * w->cols + c] for each target.
struct MatmulTarget {
  const WeightView* w;
  float* y;
};

// Every target's matmul of x [n_tokens x cols]; all weights have the same number of columns.
// Throws hablar::Error (as matmul does) for a bad shape or type, or unequal columns.
void matmul_many(std::span<const MatmulTarget> targets, const float* x, int64_t n_tokens,
                 ThreadPool& pool, TokenRoles roles = {});

// out = act(W_gate · x) * (W_up · x), as cpu::matmul for both and cpu::glu after, each
// thread finishing the rows it computed. up_scratch holds n_tokens x rows floats.
void matmul_glu(const WeightView& gate, const WeightView& up, const float* x, int64_t n_tokens,
                float* out, float* up_scratch, ThreadPool& pool, TokenRoles roles = {},
                GluActivation act = GluActivation::kSilu);

// One product of a grouped call: y [n_tokens x w->rows] = x [n_tokens x w->cols] · Wᵀ; with
// `up`, the gated pair y = act(W·x) * (U·x) (up_scratch: n_tokens x rows floats), as
// matmul_glu. Each has its own input rows and token roles (empty: every token's own order).
struct GroupedProduct {
  const WeightView* w = nullptr;
  const WeightView* up = nullptr;
  const float* x = nullptr;
  int64_t n_tokens = 0;
  float* y = nullptr;
  float* up_scratch = nullptr;
  TokenRoles roles;
};

// Every product in one parallel region (a mixture of experts' step: each selected expert over
// the rows routed to it): inputs quantized once per product, then the threads claim row chunks
// of all products together, so a decode step with k experts waits at one join instead of k.
// Each output is bit-identical to matmul's (matmul_glu's with `up`). Throws as matmul does.
void matmul_grouped(std::span<const GroupedProduct> products, ThreadPool& pool,
                    GluActivation act = GluActivation::kSilu);

}  // namespace hablar::cpu
