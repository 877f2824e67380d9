// The CPU executor's embedding steps: the embedding forward (model/forward_encoder.h) over
// cpu::EmbedOps, on the executor's threads, then each chunk's pooling.
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/cpu_executor.h"
#include "model/forward_encoder.h"
#include "model/weights.h"

namespace hablar::engine {

bool CpuExecutor::can_embed(std::string*) const {
  return true;  // encoders and every decoder family
}

void CpuExecutor::embed(std::span<const EmbedChunk> chunks, EmbedOutput& out) {
  const model::ModelConfig& c = model_.config();
  const model::Weights& w = model_.weights();
  std::vector<std::span<const int32_t>> sequences;
  std::vector<Pooling> pooling;
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
    sequences.push_back(ch.tokens);
    pooling.push_back(ch.pooling);
  }
  if (sequences.empty()) {
    out.values.clear();
    out.begin.assign(1, 0);
    return;
  }
  embed_ops_.begin(sequences, model::activation_dims(c), ropes_, c.rms_eps, c.norm_eps, c.causal);
  model::forward_embeddings(c, w, embed_ops_);
  const cpu::ClassifierHead head{&w.cls, w.cls_b, &w.cls_out, w.cls_out_b};
  embed_ops_.pool(pooling, head, out.values, out.begin);
}

}  // namespace hablar::engine
