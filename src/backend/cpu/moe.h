// The mixture-of-experts feed-forward on the CPU, rounding as llama.cpp's CPU backend does:
// router logits (a matmul of the whole step), a softmax per token (16-value blocks of its
// vectorized exp summed in double, the tail with expf), the n_used likeliest experts in
// descending order, their probabilities renormalized (sum in double, one float division),
// each expert's SwiGLU over the tokens routed to it (llama.cpp's mul_mat_id takes its
// one-token dot-product order for every row), and the weighted outputs added in that order.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/layer_spec.h"
#include "core/thread_pool.h"

namespace hablar::cpu {

// Step buffers reused across layers and steps.
struct MoeScratch {
  std::vector<float> logits, rows, gate, up, down, slots;
  std::vector<int32_t> chosen;
  std::vector<int64_t> offsets, order;  // grouped experts: rows per expert, slot of each row
  std::vector<float> weights;
  std::vector<uint8_t> roles;
};

// out[t] = sum_j w[t][j] * expert_{e[t][j]}(in[t]) for in, out [n_tokens x n_embd] (out may
// be in). `roles` (empty or n_tokens long) are the router matmul's (ops.h TokenRoles).
void moe_ffn(const ExpertsView& experts, const float* in, int64_t n_tokens, int64_t n_embd,
             float* out, ThreadPool& pool, MoeScratch& scratch, TokenRoles roles = {});

// llama.cpp's CPU softmax of one row of n values (y may be x).
void softmax_row(const float* x, float* y, int n);

}  // namespace hablar::cpu
