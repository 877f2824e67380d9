// `hablar quantize`: a whole model rewritten with llama-quantize's named file types
// (Q4_0 ... Q8_0, Q2_K, Q3_K_S/M/L, Q4_K_S/M, Q5_K_S/M, Q6_K, IQ4_NL, IQ4_XS, F16, BF16, F32),
// byte-identical to llama.cpp's quantizer run without an importance matrix:
//  - the tensors in llama.cpp's loader order (by layer, then by name; tensors outside the
//    blocks first);
//  - each tensor's type from llama.cpp's mix rules (quantize_types.cpp): the output
//    projection (or a tied token_embd) gets Q6_K, attn_v / ffn_down get more bits in some
//    layers, norms and other 1-D tensors keep their type, rows that do not fill a block
//    fall back to a smaller block or F16;
//  - the bytes from core/quant.h's reference quantizers (llama.cpp's, byte for byte);
//  - the metadata copied in file order, general.quantization_version (2) and
//    general.file_type (the llama_ftype number) re-added at the end, split keys dropped.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "formats/gguf.h"

namespace hablar::formats {

// llama.cpp's llama_ftype values for the file types we can write (general.file_type).
enum class Ftype : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ8_0 = 7,
  kQ5_0 = 8,
  kQ5_1 = 9,
  kQ2_K = 10,
  kQ3_K_S = 11,
  kQ3_K_M = 12,
  kQ3_K_L = 13,
  kQ4_K_S = 14,
  kQ4_K_M = 15,
  kQ5_K_S = 16,
  kQ5_K_M = 17,
  kQ6_K = 18,
  kIQ4_NL = 25,
  kIQ4_XS = 30,
  kBF16 = 32,
};

// llama-quantize's name ("Q4_K_M", "q4_k_m", the aliases "Q4_K" = Q4_K_M, ...); nullopt
// when unknown or not one we write.
std::optional<Ftype> ftype_from_name(std::string_view name);
std::string ftype_name(Ftype ftype);  // "Q4_K_M"
std::string ftype_names();            // every accepted name, comma-separated
DType ftype_default_type(Ftype ftype);

// Model facts the mix rules read (from the file's <arch>.* keys and tensor names).
struct QuantizeModelFacts {
  std::string arch;
  int n_layers = 0;         // <arch>.block_count
  int n_gqa = 0;            // heads / kv heads of layer 0 (0 when unknown)
  int n_expert = 0;         // <arch>.expert_count
  bool is_70b = false;      // llama.cpp's LLM_TYPE_70B (80 layers of llama, qwen2, olmo, deci)
  bool tied_output = true;  // no output.weight: token_embd is the classifier
  int n_attention_wv = 0;   // attn_v-like tensors (attn_v, attn_qkv, attn_kv_b)
};
QuantizeModelFacts quantize_model_facts(const gguf::GgufFile& f);

// One output tensor: the source, its type in the output.
struct QuantizedTensorPlan {
  const gguf::TensorInfo* source;
  DType type;
  std::vector<int64_t> dims;  // as written: trailing 1s dropped (ggml_n_dims)
};
// The output tensors in llama.cpp's order with their types. Throws Error(kInvalidArgument)
// for a model the rules cannot place (an expert tensor outside blk.N, ...).
std::vector<QuantizedTensorPlan> plan_quantization(const gguf::GgufFile& f, Ftype ftype);

struct QuantizeProgress {
  int index = 0;  // 1-based
  int count = 0;
  const QuantizedTensorPlan* tensor = nullptr;
};

struct QuantizeOptions {
  int n_threads = 0;              // 0: one per hardware thread
  bool allow_requantize = false;  // quantized inputs are refused unless set (as llama.cpp)
  std::function<void(const QuantizeProgress&)> progress;  // before each tensor's data
};

// The quantized model, ready to write (the writer pulls each tensor's rows on demand, so
// memory stays at one chunk of rows). `f` must outlive the writer.
gguf::GgufWriter quantize_model(const gguf::GgufFile& f, Ftype ftype, const QuantizeOptions& o);

}  // namespace hablar::formats
