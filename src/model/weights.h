// Weights: typed views into the mapped GGUF file, one field per tensor, shapes in comments
// as [rows x cols] (rows = output features). Matrices stay in their stored type; 1-D tensors
// (norm weights, biases) are small and are kept as float copies.
#pragma once

#include <vector>

#include "core/tensor_view.h"
#include "formats/gguf.h"
#include "model/model.h"

namespace hablar::model {

struct LayerWeights {
  std::vector<float> attn_norm;   // [n_embd]
  WeightView wq;                  // [q_dim x n_embd]
  WeightView wk;                  // [kv_dim x n_embd]
  WeightView wv;                  // [kv_dim x n_embd]
  std::vector<float> bq, bk, bv;  // [q_dim], [kv_dim], [kv_dim] (qwen2 only)
  std::vector<float> q_norm;      // [head_dim] (qwen3 only)
  std::vector<float> k_norm;      // [head_dim] (qwen3 only)
  WeightView wo;                  // [n_embd x q_dim]
  std::vector<float> ffn_norm;    // [n_embd]
  WeightView w_gate;              // [n_ff x n_embd]
  WeightView w_up;                // [n_ff x n_embd]
  WeightView w_down;              // [n_embd x n_ff]
};

struct Weights {
  WeightView token_embd;  // [n_vocab x n_embd]
  std::vector<LayerWeights> layers;
  std::vector<float> output_norm;  // [n_embd]
  WeightView output;               // [n_vocab x n_embd]; == token_embd when tied
};

// Builds the views, checking every tensor's presence, shape and type against the config.
// Errors name the tensor, its shape/type and the expected one.
Weights load_weights(const gguf::GgufFile& file, const ModelConfig& config);

}  // namespace hablar::model
