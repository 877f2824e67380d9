// The inputs of an embedding step as every executor takes them: each chunk checked (not
// empty, token ids in the vocabulary, no longer than the model's position table, rank
// pooling only with a classifier head), then its tokens and pooling side by side.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/pooling.h"
#include "engine/executor.h"
#include "model/model.h"
#include "model/weights.h"

namespace hablar::engine {

struct EmbedInputs {
  std::vector<std::span<const int32_t>> sequences;
  std::vector<Pooling> pooling;
};

// Throws Error(kInvalidArgument) naming the first bad chunk's fault.
inline EmbedInputs checked_embed_inputs(const model::ModelConfig& c, const model::Weights& w,
                                        std::span<const EmbedChunk> chunks) {
  EmbedInputs in;
  for (const EmbedChunk& ch : chunks) {
    if (ch.tokens.empty()) throw_error(ErrorKind::kInvalidArgument, "an embedding input is empty");
    for (int32_t t : ch.tokens)
      if (t < 0 || t >= c.n_vocab)
        throw_error(ErrorKind::kInvalidArgument, "token id " + std::to_string(t) +
                                                     " is outside the vocabulary [0, " +
                                                     std::to_string(c.n_vocab) + ")");
    if (w.pos_embd.data != nullptr && (int64_t)ch.tokens.size() > w.pos_embd.rows)
      throw_error(ErrorKind::kInvalidArgument, "an input of " + std::to_string(ch.tokens.size()) +
                                                   " tokens is longer than the " +
                                                   std::to_string(w.pos_embd.rows) +
                                                   " positions the model has");
    if (ch.pooling == Pooling::kRank && c.n_cls_out == 0)
      throw_error(ErrorKind::kInvalidArgument,
                  "rank pooling needs a classifier head (cls tensors), which this model lacks");
    in.sequences.push_back(ch.tokens);
    in.pooling.push_back(ch.pooling);
  }
  return in;
}

// An empty step's output (no inputs): true, with `out` set, when `in` holds none.
inline bool no_embed_inputs(const EmbedInputs& in, EmbedOutput& out) {
  if (!in.sequences.empty()) return false;
  out.values.clear();
  out.begin.assign(1, 0);
  return true;
}

}  // namespace hablar::engine
