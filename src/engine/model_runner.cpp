#include "engine/model_runner.h"

#include <cstring>

namespace hablar::engine {

ModelRunner::ModelRunner(model::Model& model, int32_t n_blocks, int32_t block_size)
    : model_(model), cache_(model.kv_layout_for(n_blocks, block_size)) {}

void ModelRunner::copy_block(const BlockCopy& copy) {
  const KvCacheLayout& l = cache_.layout();
  const size_t elems = l.block_elems();
  for (int layer = 0; layer < l.n_layers; ++layer)
    for (int kv = 0; kv < 2; ++kv)
      std::memcpy(cache_.data() + l.offset(layer, kv, copy.dst, 0, 0, 0),
                  cache_.data() + l.offset(layer, kv, copy.src, 0, 0, 0), elems * 2);
}

void ModelRunner::execute(std::span<const BlockCopy> copies, std::span<const ExecChunk> chunks,
                          std::vector<float>& logits) {
  for (const BlockCopy& c : copies) copy_block(c);
  chunks_.clear();
  for (const ExecChunk& c : chunks) {
    model::SequenceChunk m;
    m.tokens = c.tokens;
    m.start_pos = c.start_pos;
    m.block_table = c.block_table;
    m.all_logits = c.all_logits;
    m.generated_from = c.generated_from;
    chunks_.push_back(m);
  }
  model_.forward(chunks_, cache_, logits);
}

}  // namespace hablar::engine
