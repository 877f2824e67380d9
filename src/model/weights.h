// Weights: typed views, one field per tensor, shapes in comments as [rows x cols] (rows =
// output features). Matrices stay in their stored type; 1-D tensors (norm weights, biases)
// are small and are float32 arrays. The same struct describes the weights wherever they
// live: the loaded model's point into the mapped file (and `vectors`, which owns the float
// copies); a device executor keeps its own Weights whose pointers are device memory.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor_view.h"
#include "formats/gguf.h"
#include "model/model.h"

namespace hablar::model {

struct LayerWeights {
  const float* attn_norm = nullptr;       // [n_embd]
  const float* attn_norm_b = nullptr;     // [n_embd] (phi2: its LayerNorm's bias)
  WeightView wq;                          // [q_dim x n_embd]
  WeightView wk;                          // [kv_dim x n_embd]
  WeightView wv;                          // [kv_dim x n_embd]
  const float* bq = nullptr;              // [q_dim]  (qwen2, phi2)
  const float* bk = nullptr;              // [kv_dim] (qwen2, phi2)
  const float* bv = nullptr;              // [kv_dim] (qwen2, phi2)
  const float* q_norm = nullptr;          // [head_dim] (qwen3; olmo2: [q_dim])
  const float* k_norm = nullptr;          // [head_dim] (qwen3; olmo2: [kv_dim])
  WeightView wo;                          // [n_embd x q_dim]
  const float* post_attn_norm = nullptr;  // [n_embd] (gemma: norm of the attention output)
  const float* ffn_norm = nullptr;        // [n_embd]
  const float* ffn_norm_b = nullptr;      // [n_embd] (starcoder2: its LayerNorm's bias)
  WeightView w_gate;                      // [n_ff x n_embd]
  WeightView w_up;                        // [n_ff x n_embd]
  WeightView w_down;                      // [n_embd x n_ff]
  const float* post_ffn_norm = nullptr;   // [n_embd] (gemma: norm of the FFN output)
  // Mixture of experts (instead of w_gate / w_up / w_down): the router and each expert's
  // matrices, slices of the file's 3-D tensors.
  WeightView router;                 // [n_experts x n_embd]
  std::vector<WeightView> exp_gate;  // n_experts x [n_ff_expert x n_embd]
  std::vector<WeightView> exp_up;    // n_experts x [n_ff_expert x n_embd]
  std::vector<WeightView> exp_down;  // n_experts x [n_embd x n_ff_expert]
  // Qwen2-MoE's shared expert and its gate vector.
  WeightView shared_gate_inp;         // [1 x n_embd]
  WeightView shared_gate, shared_up;  // [n_ff_shared x n_embd]
  WeightView shared_down;             // [n_embd x n_ff_shared]
  // Encoders (bert, nomic-bert) and phi2: biases of the projections where the file has them;
  // encoders' LayerNorms (weight and bias) after attention and after the FFN.
  const float* bo = nullptr;      // [n_embd]
  const float* b_up = nullptr;    // [n_ff]
  const float* b_down = nullptr;  // [n_embd]
  const float* attn_out_norm = nullptr;
  const float* attn_out_norm_b = nullptr;
  const float* layer_out_norm = nullptr;
  const float* layer_out_norm_b = nullptr;
};

struct Weights {
  WeightView token_embd;  // [n_vocab x n_embd]
  std::vector<LayerWeights> layers;
  const float* output_norm = nullptr;    // [n_embd]
  WeightView output;                     // [n_vocab x n_embd]; == token_embd when tied
  const float* output_norm_b = nullptr;  // [n_embd]  (phi2: the final LayerNorm's bias)
  const float* output_b = nullptr;       // [n_vocab] (phi2: the classifier's bias)
  // Encoders: the token-type rows (row 0 is added to every token, as llama.cpp does), the
  // absolute positions (bert; nomic-bert rotates instead), the LayerNorm of the embedding,
  // and the classifier head of rerankers: tanh(cls · x + cls_b), then cls_out (either may be
  // absent).
  WeightView token_types;  // [n_token_types x n_embd]
  WeightView pos_embd;     // [n_ctx_train x n_embd]
  const float* embd_norm = nullptr;
  const float* embd_norm_b = nullptr;
  WeightView cls;  // [n_embd x n_embd]
  const float* cls_b = nullptr;
  WeightView cls_out;  // [n_cls_out x n_embd]
  const float* cls_out_b = nullptr;
  // gemma-embedding's projections of the pooled rows (sentence-transformers' dense modules,
  // when the file has them): dense_3 · (dense_2 · pooled).
  WeightView dense_2;  // [d x n_embd]
  WeightView dense_3;  // [n_embd x d]
  // Host storage of the 1-D tensors the pointers above point into (moving Weights keeps
  // them in place; copying would not, hence move-only).
  std::vector<std::vector<float>> vectors;

  Weights() = default;
  Weights(Weights&&) = default;
  Weights& operator=(Weights&&) = default;
  Weights(const Weights&) = delete;
  Weights& operator=(const Weights&) = delete;

  // The matrices a forward multiplies by (every layer's projections and the output head),
  // e.g. to check that a backend has kernels for their types or to count the bytes one
  // decode step reads.
  std::vector<const WeightView*> matrices() const;
};

// Every 1-D tensor field (norm weights and biases) with its length as the loader reads it:
// the one list a device executor copies the vectors by (a host test checks that it reaches
// every vector of every family's weights).
struct WeightVectorField {
  const float* Weights::*field;
  int64_t (*length)(const ModelConfig&, const Weights&);
};
struct LayerVectorField {
  const float* LayerWeights::*field;
  int64_t (*length)(const ModelConfig&, const LayerWeights&);
};
std::span<const WeightVectorField> weight_vector_fields();
std::span<const LayerVectorField> layer_vector_fields();

// Builds the views, checking every tensor's presence, shape and type against the config.
// Errors name the tensor, its shape/type and the expected one. Whether a backend has kernels
// for the types is the executor's check, not the model's.
Weights load_weights(const gguf::GgufFile& file, const ModelConfig& config);

}  // namespace hablar::model
