// Tensor element types as GGUF numbers them, and their storage traits. A quantized type
// stores `block_elems` values in `block_bytes` bytes; a row of n values (n a multiple of
// block_elems) takes n / block_elems * block_bytes bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hablar {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
};

struct DTypeTraits {
  std::string_view name;  // as GGUF tools print it: "q4_K", "f16", ...
  uint32_t block_elems;   // values per block (1 for plain types)
  uint32_t block_bytes;   // bytes per block
  bool quantized;
  bool supported;  // hablar can run models stored in it (Q8_1 is an activation format only)
};

// Traits of a type number; nullopt for a number GGUF does not define.
std::optional<DTypeTraits> dtype_traits_of(uint32_t raw);
const DTypeTraits& dtype_traits(DType t);  // for a valid DType

inline std::string_view dtype_name(DType t) { return dtype_traits(t).name; }
// Parses "q4_k", "Q4_K", "f16", "bf16", ... (case-insensitive).
std::optional<DType> dtype_from_name(std::string_view name);
// Names of every type hablar supports, for error messages.
std::string supported_dtype_names();
std::vector<DType> supported_dtypes();

// Bytes of a row of n values; throws if n is not a multiple of the block size.
size_t dtype_row_bytes(DType t, int64_t n);

}  // namespace hablar
