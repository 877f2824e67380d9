// A summary of a GGUF model for people: architecture, hyperparameters, tokenizer, chat
// template, tensors and totals. Built from the metadata and tensor infos only; no tensor
// data is read, so summarising a mapped multi-GB file touches a few MB.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/gguf.h"

namespace hablar::gguf {

struct HyperParameters {
  std::optional<uint64_t> n_layers, hidden, n_heads, n_kv_heads, head_dim, ffn, context;
  std::optional<uint64_t> vocab_size, rope_dims, sliding_window, n_experts, n_experts_used;
  std::optional<double> rope_base, rope_scale, norm_eps;
  std::optional<std::string> rope_scaling;  // "linear", "yarn", ...
  std::optional<uint64_t> rope_original_context;
};

struct SpecialToken {
  std::string role;  // "bos", "eos", "unk", "pad", "sep", "eot", ...
  int64_t id;
  std::string text;  // the token's string, "" when the id is out of range
};

struct TokenizerSummary {
  std::string model;  // tokenizer.ggml.model: "llama", "gpt2", "bert", ...
  std::string pre;    // tokenizer.ggml.pre, "" when absent
  uint64_t n_tokens = 0;
  uint64_t n_merges = 0;
  std::vector<SpecialToken> special;
  std::optional<bool> add_bos, add_eos;
};

struct TypeTotal {
  uint64_t n_tensors = 0, n_params = 0, n_bytes = 0;
};

struct ModelInfo {
  std::string path;
  uint32_t version = 0;
  uint64_t file_size = 0, alignment = 0, data_offset = 0;
  std::string architecture, name;
  std::optional<uint64_t> file_type;
  HyperParameters hparams;
  std::optional<TokenizerSummary> tokenizer;  // none when the file has no vocabulary
  std::optional<std::string> chat_template;
  uint64_t n_params = 0, n_bytes = 0;
  std::map<std::string, TypeTotal> by_type;  // dtype name -> totals
  double bits_per_weight() const { return n_params ? 8.0 * (double)n_bytes / (double)n_params : 0; }
};

ModelInfo summarize_model(const GgufFile& file);

// general.file_type (llama_ftype numbering) as quantization tools name it ("q4_k_m") and
// back; a plain K type name ("q4_k") maps to its small mix.
std::string file_type_name(uint64_t file_type);
std::optional<uint32_t> file_type_from_name(std::string_view name);

// A metadata value in one short line: scalars as themselves, arrays as "[N x type]" with
// the first few items, strings quoted and cut at max_chars.
std::string value_preview(const Value& v, size_t max_chars = 60);

}  // namespace hablar::gguf
