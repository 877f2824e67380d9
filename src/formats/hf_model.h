// Hugging Face model directories as a model source.
//
// A directory holds config.json, the weights as model.safetensors or as shards listed in
// model.safetensors.index.json ("weight_map": tensor name -> shard file), tokenizer.json,
// and optionally tokenizer_config.json (chat_template, bos/eos tokens, add_bos_token),
// chat_template.jinja and generation_config.json (eos_token_id, sampling defaults).
//
// open_hf_model() describes such a directory in GGUF's vocabulary, without copying a
// weight: metadata under llama.cpp's keys (<arch>.block_count, tokenizer.chat_template,
// ...) and tensor infos under GGUF names whose data point into the mapped shards. Every
// layer above (model config, weights, `hablar info`) then reads it as it reads a .gguf.
// The tokenizer travels as the GGUF spec's tokenizer.huggingface.json (the whole file)
// plus hablar.hf.* keys from tokenizer_config.json / generation_config.json, which
// tokenizer/hf_tokenizer.cpp reads.
#pragma once

#include <optional>
#include <string>

#include "core/dtype.h"
#include "formats/gguf.h"

namespace hablar::formats {

struct HfOpenOptions {
  // Matrices (2-D weights) converted to this type at load (e.g. Q8_0) instead of being
  // used in place as F32 / F16 / BF16; 1-D tensors stay as they are.
  std::optional<DType> quantize;
  int n_threads = 0;  // for quantize; 0 = one per hardware thread
};

// True when `path` is a directory with a config.json.
bool is_hf_model_dir(const std::string& path);

// Reads the directory; throws Error(kFormat / kUnsupported / kIo) naming the file and fault
// (an unsupported model_type lists the supported ones).
gguf::GgufFile open_hf_model(const std::string& dir, const HfOpenOptions& options = {});

// A .gguf file or a Hugging Face directory.
gguf::GgufFile open_model_file(const std::string& path, const HfOpenOptions& options = {});

// For a model whose tokenizer is a byte-level BPE tokenizer.json (Llama 3, Qwen2/3, GPT-2,
// SmolLM families): the tokenizer.ggml.* keys llama.cpp's converter writes for it (model
// gpt2, the pre-tokenizer's llama.cpp name, tokens, token types, merges, special ids), so
// that a GGUF written from it is read by llama.cpp. nullopt for other tokenizers (they stay
// as tokenizer.huggingface.json) and for models that already have tokenizer.ggml.model.
std::optional<std::vector<std::pair<std::string, gguf::Value>>> ggml_vocab_from_hf(
    const gguf::GgufFile& f);

// The model as llama.cpp's converter would write it (gguf_layout.cpp): the tokenizer.ggml.*
// keys above in place of tokenizer.huggingface.json, and for the llama family the q / k
// rows permuted from transformers' NeoX order to llama.cpp's (hablar.rope.neox dropped).
// Anything else, a .gguf file included, comes back unchanged. Tensors not permuted still
// point into `f`'s mapping: `f` must outlive the result.
gguf::GgufFile llama_cpp_layout(const gguf::GgufFile& f);

// config.json's text as GGUF metadata (<arch>.block_count, ...); for tests and fuzzing.
std::vector<std::pair<std::string, gguf::Value>> hf_config_metadata(std::string_view config_json,
                                                                    const std::string& name);

// The bytes of a file, at most max_bytes (Error(kFormat) beyond, kIo when unreadable).
std::string read_small_file(const std::string& path, size_t max_bytes);

}  // namespace hablar::formats
