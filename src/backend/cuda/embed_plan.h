// The host-side bookkeeping of a CUDA embedding step (cuda::EmbedOps): how whole sequences
// pack into token rows, how attention's query tiles cover them, and where each sequence's
// pooled floats land in the step's output. Plain C++ (no device code), so the host twin
// test (tests/unit/cuda/embed_plan_host_test.cpp) checks it without a GPU; the pooling
// kernel indexes with the same helpers (HABLAR_HD: host and device).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/error.h"
#include "core/pooling.h"

#if defined(__CUDACC__)
#define HABLAR_EMBED_HD __host__ __device__
#else
#define HABLAR_EMBED_HD
#endif

namespace hablar::cuda {

// Query rows per attention tile (a tile never crosses a sequence's end).
inline constexpr int32_t kEmbedQueryTile = 64;

// One attention tile: queries [q0, q0 + kEmbedQueryTile) ∩ [0, len) of the sequence whose
// first token row is `base`.
struct EmbedTile {
  int32_t base = 0;
  int32_t len = 0;
  int32_t q0 = 0;
};

struct EmbedPlan {
  std::vector<int32_t> tokens;     // [T] token ids, sequence after sequence
  std::vector<int32_t> positions;  // [T] position inside its sequence (0..len-1)
  std::vector<int32_t> seq_begin;  // [S + 1] first token row of each sequence
  std::vector<EmbedTile> tiles;    // attention's query tiles, in row order
  int32_t max_len = 0;             // the longest sequence
  int64_t n_tokens() const { return (int64_t)tokens.size(); }
  int64_t n_seqs() const { return (int64_t)seq_begin.size() - 1; }
};

// Where pooled floats go: sequence s's are out[out_begin[s] .. out_begin[s + 1]) (n_embd
// for mean / cls / last, len x n_embd for none, rank_width for rank). A rank sequence's
// first row is pooled into row rank_slot[s] of the classifier's input instead; its output
// floats are filled from the classifier's output row rank_slot[s].
struct PoolPlan {
  std::vector<int8_t> pooling;     // [S] Pooling values
  std::vector<int64_t> out_begin;  // [S + 1]
  std::vector<int32_t> rank_slot;  // [S] -1 for other poolings
  int32_t n_rank = 0;
  int64_t total() const { return out_begin.back(); }
};

// The hidden row a one-row pooling reads (cls and rank: the first; last: the last).
HABLAR_EMBED_HD inline int32_t pooled_row(int8_t pooling, int32_t begin, int32_t end) {
  return pooling == (int8_t)Pooling::kLast ? end - 1 : begin;
}

inline EmbedPlan plan_embed_step(std::span<const std::span<const int32_t>> sequences) {
  EmbedPlan p;
  p.seq_begin.assign(1, 0);
  for (const std::span<const int32_t> seq : sequences) {
    HABLAR_CHECK(!seq.empty(), "embedding step: an empty sequence");
    const int32_t base = (int32_t)p.tokens.size(), len = (int32_t)seq.size();
    p.tokens.insert(p.tokens.end(), seq.begin(), seq.end());
    for (int32_t i = 0; i < len; ++i) p.positions.push_back(i);
    for (int32_t q0 = 0; q0 < len; q0 += kEmbedQueryTile) p.tiles.push_back({base, len, q0});
    p.seq_begin.push_back(base + len);
    p.max_len = len > p.max_len ? len : p.max_len;
  }
  return p;
}

// rank_width: the classifier head's output rows (cls_out's, else cls's, else n_embd).
inline PoolPlan plan_pooling(std::span<const int32_t> seq_begin, std::span<const Pooling> pooling,
                             int64_t n_embd, int64_t rank_width) {
  const size_t n_seq = seq_begin.size() - 1;
  HABLAR_CHECK(pooling.size() == n_seq, "pool: one pooling per sequence");
  PoolPlan p;
  p.out_begin.assign(1, 0);
  for (size_t s = 0; s < n_seq; ++s) {
    const int64_t len = seq_begin[s + 1] - seq_begin[s];
    int64_t width = n_embd;
    if (pooling[s] == Pooling::kNone) width = len * n_embd;
    if (pooling[s] == Pooling::kRank) width = rank_width;
    p.pooling.push_back((int8_t)pooling[s]);
    p.rank_slot.push_back(pooling[s] == Pooling::kRank ? p.n_rank++ : -1);
    p.out_begin.push_back(p.out_begin.back() + width);
  }
  return p;
}

}  // namespace hablar::cuda
