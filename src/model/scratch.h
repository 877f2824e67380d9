// Activations of one forward call, [n_tokens x width] row-major, reused (grown) between calls.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/ops.h"

namespace hablar::model {

struct Scratch {
  std::vector<float> x;                      // [T x n_embd] residual stream
  std::vector<float> xb;                     // [T x n_embd] normed input / projection output
  std::vector<float> q;                      // [T x q_dim]
  std::vector<float> k;                      // [T x kv_dim]
  std::vector<float> v;                      // [T x kv_dim]
  std::vector<float> att;                    // [T x q_dim] attention output
  std::vector<float> gate;                   // [T x n_ff]
  std::vector<float> up;                     // [T x n_ff]
  std::vector<float> out_rows;               // [R x n_embd] final-normed rows that need logits
  std::vector<float> rope_cos;               // [T x n_dims/2] RoPE angles of each position
  std::vector<float> rope_sin;               // [T x n_dims/2]
  std::vector<int32_t> tokens;               // [T]
  std::vector<int32_t> positions;            // [T]
  std::vector<const int32_t*> block_tables;  // [T] the block table of each token's sequence
  std::vector<int32_t> logit_rows;           // token indices whose logits are wanted
  std::vector<cpu::SumOrder> sum_orders;     // [T] attention's summation order per token
  std::vector<uint8_t> roles;                // [T] each token's place in llama.cpp's batch
  std::vector<uint8_t> logit_roles;          // the same for the logit rows' output matmul
  std::vector<cpu::AttentionQuery> queries;  // [T]
};

}  // namespace hablar::model
