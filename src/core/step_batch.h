// The plain data of one forward step, shared by the model's forward, the engine and every
// backend: which tokens of which sequences run now, where their K/V go in the paged cache
// (core/kv_layout.h), and the widths of the activations the forward passes between ops.
#pragma once

#include <cstdint>
#include <span>

namespace hablar {

// One sequence's share of a forward step.
struct SequenceChunk {
  std::span<const int32_t> tokens;       // tokens to process now (prefill chunk, or 1 for decode)
  int32_t start_pos = 0;                 // position of tokens[0]; cache holds [0, start_pos)
  std::span<const int32_t> block_table;  // physical blocks covering [0, start_pos + tokens.size())
  bool all_logits = false;  // logits for every token (perplexity, echo) or only the last
  // The sequence's prompt length: positions >= prompt_len hold generated tokens; -1:
  // unknown, and a one-token chunk is taken as a generated token. A fact about the
  // sequence, which a backend may use (the CPU derives llama.cpp's summation orders from it,
  // which depend on where a token stands in its prompt's batch); it never changes what is
  // computed.
  int32_t prompt_len = -1;
};

// The widths of a transformer's activations, per token: what a backend sizes its step
// buffers by.
struct ActivationDims {
  int32_t n_embd = 0;      // residual stream
  int32_t n_heads = 0;     // query heads
  int32_t n_kv_heads = 0;  // key/value heads
  int32_t head_dim = 0;
  int32_t n_ff = 0;  // feed-forward hidden width
  int32_t n_vocab = 0;
  int32_t q_dim() const { return n_heads * head_dim; }
  int32_t kv_dim() const { return n_kv_heads * head_dim; }
};

// Activation rows of one step, [n_tokens x width] each, row-major, in the backend's memory
// (host for the CPU, device for CUDA).
struct Activations {
  float* x = nullptr;     // [T x n_embd] the residual stream
  float* xb = nullptr;    // [T x n_embd] a normed input, or a projection's output
  float* q = nullptr;     // [T x q_dim]
  float* k = nullptr;     // [T x kv_dim]
  float* v = nullptr;     // [T x kv_dim]
  float* att = nullptr;   // [T x q_dim] attention output
  float* gate = nullptr;  // [T x n_ff]
  float* up = nullptr;    // [T x n_ff]
};

}  // namespace hablar
