// What differs between the model families of Hugging Face checkpoints, in one place: which
// GGUF architecture a config.json's model_type becomes, the <arch>.* keys llama.cpp's
// converter writes from its fields, each family's tensor names, and the few values that the
// converter changes rather than renames (Gemma's norm weights, stacked experts, LongRoPE's
// factor lists). hf_model.cpp and hf_model_tensors.cpp apply them.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/gguf.h"
#include "formats/tensor_names.h"

namespace hablar::formats {

using HfMetadata = std::vector<std::pair<std::string, gguf::Value>>;

// The language model's part of a config.json: the config itself, or for a model with vision
// (model_type gemma3: Gemma 3 4B and up; mistral3: Mistral Small 3.1 and up) its text_config
// over the defaults of its text model's configuration (transformers writes only the fields
// that differ from them), as a gemma3_text or mistral config.
nlohmann::json hf_text_config(const nlohmann::json& cfg, const std::string& path);
// A checkpoint tensor's name with a multimodal model's language-model prefix taken off
// ("language_model.model.x" and "model.language_model.x" -> "model.x",
// "language_model.lm_head.weight" -> "lm_head.weight"), and a base model's own names
// ("layers.N.x", "embed_tokens.weight", "norm.weight") under "model."; others as they are.
std::string hf_text_tensor_name(std::string_view name);

// The GGUF architecture of a config.json (model_type llama and mistral: llama; qwen2, qwen3,
// qwen2_moe, qwen3_moe, phi3, phi (Phi-1.5 / Phi-2: phi2), smollm3, gemma, gemma2,
// gemma3_text (gemma-embedding when it attends both ways), mixtral: llama with experts).
// Throws Error(kUnsupported) listing the supported types.
std::string hf_arch_of(const nlohmann::json& cfg, const std::string& path);

// The config's <arch>.* keys (sizes, norm epsilon, RoPE, experts, windows, soft-caps).
HfMetadata hf_family_metadata(const nlohmann::json& cfg, const std::string& arch,
                              const std::string& path);

// The family's tensor names ("{}": the layer), experts apart (below).
const std::vector<TensorNamePair>& hf_tensor_names(const std::string& arch);
// A name of that table in GGUF's vocabulary, with its layer.
std::optional<MappedName> gguf_name_of_hf(const std::string& arch, std::string_view hf_name);

// One expert's matrix of a mixture-of-experts checkpoint (Mixtral's block_sparse_moe.experts.E.w1
// / w2 / w3, Qwen-MoE's mlp.experts.E.gate_proj / up_proj / down_proj): the GGUF name of the
// stacked 3-D tensor it belongs to (blk.L.ffn_gate_exps.weight, ...) and its place in it.
struct ExpertName {
  std::string gguf;
  int layer = -1;
  int expert = -1;
};
std::optional<ExpertName> expert_of_hf(const std::string& arch, std::string_view hf_name);

// A sentence-transformers directory's modules (modules.json): the Pooling module's mode
// (1_Pooling/config.json) as <arch>.pooling_type, and its Dense modules (2_Dense, 3_Dense,
// each model.safetensors with linear.weight) as gemma-embedding's dense_2 / dense_3. Adds
// the keys to `m` and the Dense files' paths with the GGUF name each weight takes.
struct DenseModule {
  std::string file;  // .../2_Dense/model.safetensors
  std::string gguf;  // dense_2.weight
};
std::vector<DenseModule> hf_sentence_transformers(const std::string& dir, const std::string& arch,
                                                  HfMetadata& m);

// Gemma's RMSNorm weights are stored as w and applied as 1 + w; llama.cpp's converter writes
// 1 + w. True for the GGUF names that take the + 1.
bool norm_gets_one_added(const std::string& arch, const std::string& gguf_name);

}  // namespace hablar::formats
