// Quantization mixes: which type each tensor of a model gets when the model is quantized
// under a named mix. A plain type name ("q8_0") gives every matrix that type; the K-quant
// "_m" mixes ("q4_k_m", "q5_k_m") spend more bits where quantization error hurts most:
//  - the output projection (or token_embd when the output is tied to it) gets Q6_K;
//  - attn_v and ffn_down get Q6_K in the first and last eighth of the layers and in every
//    third layer between them, the layers whose errors propagate furthest;
//  - a fused attn_qkv gets one step more (Q5_K in q4_k_m, Q6_K in q5_k_m).
// Rows whose length is not a multiple of the chosen block fall back to a 32-value format of
// similar size, then to F16.
#include <cctype>
#include <string>

#include "core/quant.h"

namespace hablar {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = (char)std::tolower((unsigned char)c);
  return out;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

// Layers that get more bits in the _M mixes: the first and last eighth, and every third
// layer between them.
bool layer_gets_more_bits(int layer, int n_layers) {
  if (n_layers <= 0 || layer < 0) return false;
  const int eighth = n_layers / 8;
  return layer < eighth || layer >= 7 * n_layers / 8 || (layer - eighth) % 3 == 2;
}

// A type with the same role whose block divides n_cols (F16 as the last resort).
DType fit_row_length(DType type, int64_t n_cols) {
  if (n_cols % dtype_traits(type).block_elems == 0) return type;
  DType fallback = DType::F16;
  switch (type) {
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::IQ4_XS:
      fallback = DType::IQ4_NL;
      break;
    case DType::Q4_K:
      fallback = DType::Q5_0;
      break;
    case DType::Q5_K:
      fallback = DType::Q5_1;
      break;
    case DType::Q6_K:
    case DType::Q8_K:
      fallback = DType::Q8_0;
      break;
    default:
      break;
  }
  return n_cols % dtype_traits(fallback).block_elems == 0 ? fallback : DType::F16;
}

bool is_vector_tensor(std::string_view name) {
  return ends_with(name, "_norm.weight") || ends_with(name, ".bias") ||
         ends_with(name, "norm.weight") || contains(name, "rope_freqs") ||
         contains(name, "ffn_gate_inp_shexp");  // a vector: the shared expert's gate
}

}  // namespace

std::optional<QuantMix> quant_mix_from_name(std::string_view name) {
  const std::string want = lower(name);
  if (want == "q4_k_m") return QuantMix{DType::Q4_K, true};
  if (want == "q5_k_m") return QuantMix{DType::Q5_K, true};
  const std::optional<DType> type = dtype_from_name(want);
  if (!type || !has_quantizer(*type) || *type == DType::Q8_1 || *type == DType::Q8_K)
    return std::nullopt;
  return QuantMix{*type, false};
}

DType quant_mix_tensor_type(const QuantMix& mix, std::string_view tensor_name, int layer,
                            int n_layers, int64_t n_cols, bool has_output_tensor) {
  if (is_vector_tensor(tensor_name)) return DType::F32;
  DType type = mix.base;
  if (mix.k_medium) {
    const bool is_output = tensor_name == "output.weight" ||
                           (!has_output_tensor && tensor_name == "token_embd.weight");
    if (is_output) {
      type = DType::Q6_K;
    } else if (contains(tensor_name, "attn_v.weight") || contains(tensor_name, "ffn_down")) {
      if (layer_gets_more_bits(layer, n_layers)) type = DType::Q6_K;
    } else if (contains(tensor_name, "attn_qkv.weight")) {
      type = mix.base == DType::Q4_K ? DType::Q5_K : DType::Q6_K;
    }
  }
  return fit_row_length(type, n_cols);
}

}  // namespace hablar
