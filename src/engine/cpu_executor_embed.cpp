// The CPU executor's embedding steps: the embedding forward (model/forward_encoder.h) over
// cpu::EmbedOps, on the executor's threads, then each chunk's pooling.
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/cpu_executor.h"
#include "engine/embed_inputs.h"
#include "model/forward_encoder.h"
#include "model/weights.h"

namespace hablar::engine {

bool CpuExecutor::can_embed(std::string*) const {
  return true;  // encoders and every decoder family
}

void CpuExecutor::embed(std::span<const EmbedChunk> chunks, EmbedOutput& out) {
  const model::ModelConfig& c = model_.config();
  const model::Weights& w = model_.weights();
  EmbedInputs inputs = checked_embed_inputs(c, w, chunks);
  std::vector<std::span<const int32_t>>& sequences = inputs.sequences;
  std::vector<Pooling>& pooling = inputs.pooling;
  if (no_embed_inputs(inputs, out)) return;
  embed_ops_.begin(sequences, model::activation_dims(c), ropes_, c.rms_eps, c.norm_eps, c.causal);
  model::forward_embeddings(c, w, embed_ops_);
  const cpu::ClassifierHead head{&w.cls, w.cls_b, &w.cls_out, w.cls_out_b, &w.dense_2, &w.dense_3};
  embed_ops_.pool(pooling, head, out.values, out.begin);
}

}  // namespace hablar::engine
