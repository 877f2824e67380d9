// A fingerprint of what a model's K/V depends on, so that K/V saved by one model is never
// restored into another (engine/kv_snapshot.h's slot files): the architecture, the shapes
// and types of every tensor, samples of every tensor's bytes (its start, middle and end:
// two fine-tunes of one base differ there), and the RoPE variant the executor runs with
// for its context (LongRoPE picks its factor set by it).
#pragma once

#include <cstdint>

#include "model/model.h"

namespace hablar::model {

// `n_ctx`: the positions the executor's cache holds (ropes_for_context's context).
uint64_t kv_fingerprint(const Model& model, int64_t n_ctx);

}  // namespace hablar::model
