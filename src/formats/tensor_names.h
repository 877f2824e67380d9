// Tensor names of the Llama family (llama, mistral, qwen2, qwen3) in each format, written
// once: GGUF's (what model/weights.cpp loads by) and Hugging Face transformers' (what
// safetensors checkpoints hold). "{}" stands for the layer index.
//
// Shapes are the same bytes in both: a transformers Linear weight is [out, in] row-major,
// which GGUF describes as dims [in, out] (innermost first). One difference is not a rename:
// llama.cpp's converter permutes the rows of q and k for llama so that RoPE rotates
// adjacent pairs; transformers rotates the two halves of each head (NeoX order). A
// checkpoint read here keeps transformers' order and says so (hablar.rope.neox = true).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace hablar::formats {

struct TensorNamePair {
  std::string_view gguf;
  std::string_view hf;
};

inline constexpr TensorNamePair kLlamaFamilyTensorNames[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
    {"blk.{}.attn_norm.weight", "model.layers.{}.input_layernorm.weight"},
    {"blk.{}.attn_q.weight", "model.layers.{}.self_attn.q_proj.weight"},
    {"blk.{}.attn_k.weight", "model.layers.{}.self_attn.k_proj.weight"},
    {"blk.{}.attn_v.weight", "model.layers.{}.self_attn.v_proj.weight"},
    {"blk.{}.attn_q.bias", "model.layers.{}.self_attn.q_proj.bias"},
    {"blk.{}.attn_k.bias", "model.layers.{}.self_attn.k_proj.bias"},
    {"blk.{}.attn_v.bias", "model.layers.{}.self_attn.v_proj.bias"},
    {"blk.{}.attn_q_norm.weight", "model.layers.{}.self_attn.q_norm.weight"},
    {"blk.{}.attn_k_norm.weight", "model.layers.{}.self_attn.k_norm.weight"},
    {"blk.{}.attn_output.weight", "model.layers.{}.self_attn.o_proj.weight"},
    {"blk.{}.ffn_norm.weight", "model.layers.{}.post_attention_layernorm.weight"},
    {"blk.{}.ffn_gate.weight", "model.layers.{}.mlp.gate_proj.weight"},
    {"blk.{}.ffn_up.weight", "model.layers.{}.mlp.up_proj.weight"},
    {"blk.{}.ffn_down.weight", "model.layers.{}.mlp.down_proj.weight"},
};

// A name with "{}" filled in.
inline std::string tensor_name(std::string_view pattern, int layer) {
  const size_t at = pattern.find("{}");
  if (at == std::string_view::npos) return std::string(pattern);
  return std::string(pattern.substr(0, at)) + std::to_string(layer) +
         std::string(pattern.substr(at + 2));
}

// The GGUF name of a transformers tensor name, and its layer (-1 for none); nullopt when
// the name is not one of the table's (rotary caches and the like). gguf_name_of_hf reads the
// Llama family's table (APR files name tensors so); formats/hf_families.h has every family's.
struct MappedName {
  std::string gguf;
  int layer = -1;
};
std::optional<MappedName> gguf_name_in(std::span<const TensorNamePair> table,
                                       std::string_view hf_name);
std::optional<MappedName> gguf_name_of_hf(std::string_view hf_name);

}  // namespace hablar::formats
