// Where a token stands in llama.cpp's batch, as the step's chunks state it. The CPU backend
// rounds as llama.cpp's CPU backend does, and some of its summation orders depend on this
// (backend/cpu/ops.h TokenRoles, SumOrder); the CUDA backend's deterministic mode reproduces
// the CPU backend and derives the same per-token facts from the same chunk, here.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/step_batch.h"

namespace hablar {

// Role bits: the batch has 8 tokens or more (Q5_K/Q6_K take llama.cpp's tiled kernel); the
// token lies in the batch's leading multiple of 4 tokens (Q4_K takes its 4-token gemm).
inline constexpr uint8_t kRoleBatchOf8 = 1;
inline constexpr uint8_t kRoleGroupOf4 = 2;
// llama.cpp's default micro-batch: a prompt longer than this is evaluated in pieces.
inline constexpr int32_t kLlamaUbatch = 512;

// The role of token `index` (0-based) of a llama.cpp batch of batch_size tokens.
inline uint8_t llama_batch_role(int64_t index, int64_t batch_size) {
  uint8_t role = 0;
  if (batch_size >= 8) role |= kRoleBatchOf8;
  if (index < batch_size - batch_size % 4) role |= kRoleGroupOf4;
  return role;
}

// Token i of a chunk: whether it is a sampled (generated) token, which llama.cpp evaluates
// as a batch of its own, and its role. A prompt token stands in its prompt's batch, known
// from where the prompt ends (prompt_len) whatever the chunking; without it, the chunk is
// taken for the batch and a one-token chunk for a sampled token.
struct TokenPlace {
  bool sampled = false;
  uint8_t role = 0;
};
inline TokenPlace token_place(const SequenceChunk& ch, size_t i) {
  const int32_t pos = ch.start_pos + (int32_t)i;
  const bool sampled = ch.prompt_len >= 0 ? pos >= ch.prompt_len : ch.tokens.size() == 1;
  if (sampled) return {true, llama_batch_role(0, 1)};
  if (ch.prompt_len < 0) return {false, llama_batch_role((int64_t)i, (int64_t)ch.tokens.size())};
  const int32_t begin = pos / kLlamaUbatch * kLlamaUbatch;
  return {false, llama_batch_role(pos - begin, std::min(kLlamaUbatch, ch.prompt_len - begin))};
}

}  // namespace hablar
