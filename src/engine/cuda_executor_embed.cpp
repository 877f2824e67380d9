#include "engine/cuda_executor_embed.h"

#include <fmt/format.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/matmul.h"
#include "core/error.h"
#include "engine/embed_inputs.h"
#include "model/forward_encoder.h"

namespace hablar::engine {

CudaEmbedder::CudaEmbedder(const model::Model& model, model::Weights& weights, cudaStream_t stream,
                           bool batch_invariant, bool profile)
    : model_(model),
      weights_(weights),
      batch_invariant_(batch_invariant),
      profile_(profile),
      ropes_(model::ropes_for_context(
          model.config(), model.config().n_ctx_train > 0 ? model.config().n_ctx_train : 8192)),
      stream_(stream) {
  const model::ModelConfig& c = model.config();
  if (c.n_experts > 0) {
    unsupported_ = "mixture-of-experts models embed on the CPU only (--device cpu)";
  } else if (!cuda::EmbedOps::supports_head_dim(c.head_dim)) {
    unsupported_ = fmt::format(
        "CUDA embeddings support head sizes 32, 64 and 128; this model has {} (--device cpu "
        "embeds it)",
        c.head_dim);
  } else if (c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads != 0) {
    unsupported_ = "the model's query heads are not a multiple of its KV heads";
  }
  if (!unsupported_.empty()) return;
  try {
    upload_encoder_weights(weights);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kDevice) throw;
    unsupported_ = std::string("CUDA embeddings: ") + e.what();
  }
}

const float* CudaEmbedder::upload_floats(const float* host, int64_t n) {
  if (host == nullptr) return nullptr;
  cuda::DeviceMemory& d = tensors_.emplace_back((size_t)n * sizeof(float));
  cuda::copy_to_device(d.get(), host, (size_t)n * sizeof(float));
  bytes_ += d.bytes();
  return static_cast<const float*>(d.get());
}

WeightView CudaEmbedder::upload_matrix(const WeightView& w) {
  if (w.data == nullptr) return w;
  cuda::validate_weight(w, "an embedding table or classifier matrix");
  WeightView out = w;
  const size_t bytes = (size_t)w.rows * w.row_bytes;
  cuda::DeviceMemory& d = tensors_.emplace_back(bytes);
  cuda::copy_to_device(d.get(), w.data, bytes);
  bytes_ += bytes;
  out.data = d.get();
  return out;
}

// The matrices only the embedding forward reads (the executor uploaded the projections and
// every norm weight and bias already: model::weight_vector_fields).
void CudaEmbedder::upload_encoder_weights(model::Weights& d) {
  const model::Weights& h = model_.weights();
  d.token_types = upload_matrix(h.token_types);
  d.pos_embd = upload_matrix(h.pos_embd);
  d.cls = upload_matrix(h.cls);
  d.cls_out = upload_matrix(h.cls_out);
  // (Copies from pageable memory may return before their DMA ends; the step's stream does
  // not order with them.)
  HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
}

bool CudaEmbedder::can_embed(std::string* why) const {
  if (unsupported_.empty()) return true;
  if (why) *why = unsupported_;
  return false;
}

void CudaEmbedder::embed(std::span<const EmbedChunk> chunks, EmbedOutput& out) {
  if (!unsupported_.empty()) throw_error(ErrorKind::kUnsupported, unsupported_);
  const model::ModelConfig& c = model_.config();
  const model::Weights& w = weights_;
  EmbedInputs inputs = checked_embed_inputs(c, w, chunks);
  std::vector<std::span<const int32_t>>& sequences = inputs.sequences;
  std::vector<Pooling>& pooling = inputs.pooling;
  if (no_embed_inputs(inputs, out)) return;
  if (!batch_invariant_ || sequences.size() == 1) return run(sequences, pooling, out);
  out.values.clear();
  out.begin.assign(1, 0);
  EmbedOutput one;
  for (size_t i = 0; i < sequences.size(); ++i) {  // a step per input (batch invariance)
    run({&sequences[i], 1}, {&pooling[i], 1}, one);
    out.values.insert(out.values.end(), one.values.begin(), one.values.end());
    out.begin.push_back((int64_t)out.values.size());
  }
}

void CudaEmbedder::run(std::span<const std::span<const int32_t>> sequences,
                       std::span<const Pooling> pooling, EmbedOutput& out) {
  const model::ModelConfig& c = model_.config();
  const model::Weights& w = weights_;
  if (!ops_) ops_ = std::make_unique<cuda::EmbedOps>(stream_, profile_);
  ops_->begin(sequences, model::activation_dims(c), ropes_, c.rms_eps, c.norm_eps, c.causal);
  model::forward_embeddings(c, w, *ops_);
  const cuda::ClassifierHead head{&w.cls, w.cls_b, &w.cls_out, w.cls_out_b};
  ops_->pool(pooling, head, out.values, out.begin);
}

}  // namespace hablar::engine
