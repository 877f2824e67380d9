// The embedding side of ModelConfig: what llama.cpp reads for encoders and embedders.
#include <cmath>
#include <string>

#include "core/error.h"
#include "model/model.h"

namespace hablar::model {

void read_embedding_config(const gguf::GgufFile& f, ModelConfig& c) {
  const std::string& a = c.arch;
  if (f.has(a + ".pooling_type")) {
    const int64_t v = (int64_t)f.get_uint(a + ".pooling_type");
    c.pooling = pooling_from_gguf(v);
    if (!c.pooling)
      throw_error(ErrorKind::kFormat, f.path() + ": " + a + ".pooling_type " + std::to_string(v) +
                                          " is not one of 0..4 (none, mean, cls, last, rank)");
  }
  c.encoder = is_encoder_family(c.arch_kind);
  c.embedding_only = c.encoder || c.arch_kind == Arch::kGemmaEmbedding;
  c.causal = f.get_bool_or(a + ".attention.causal", !c.embedding_only);
  if (!c.encoder) return;
  if (c.n_kv_heads != c.n_heads)
    throw_error(ErrorKind::kFormat,
                f.path() + ": an encoder's head_count_kv must equal head_count");
  c.norm_eps = (float)f.get_float_or(a + ".attention.layer_norm_epsilon", 1e-12);
  if (!(c.norm_eps > 0.0f) || !std::isfinite(c.norm_eps))
    throw_error(ErrorKind::kFormat, f.path() + ": attention.layer_norm_epsilon must be > 0");
  c.n_token_types = (int)f.get_uint_or("tokenizer.ggml.token_type_count", 0);
  if (c.n_token_types <= 0 || c.n_token_types > 64)
    throw_error(ErrorKind::kFormat,
                f.path() + ": an encoder needs tokenizer.ggml.token_type_count in 1..64");
  if (c.arch_kind == Arch::kNomicBert) c.ffn_activation = GluActivation::kSilu;
  // The classifier head (rerankers): one output per label, one when no labels are named.
  if (f.find_tensor("cls.output.weight") != nullptr || f.find_tensor("cls.weight") != nullptr) {
    c.n_cls_out = 1;
    if (const gguf::Value* v = f.find(a + ".classifier.output_labels");
        v != nullptr && v->type == gguf::ValueType::ARRAY)
      c.n_cls_out = (int)f.get_array(a + ".classifier.output_labels").size();
    if (c.n_cls_out <= 0 || c.n_cls_out > 4096)
      throw_error(ErrorKind::kFormat, f.path() + ": classifier.output_labels is out of range");
  }
}

}  // namespace hablar::model
