// APR v2 model files (the native format of aprender): a validating reader that describes
// the file in GGUF's vocabulary (as formats/hf_model.h does for Hugging Face directories)
// and a writer for tests and conversion. Layout, from ../shared/formats/apr-v2.md:
//
//   header, 64 bytes: "APR\0" (or "APR2"), u8 major = 2, u8 minor, u16 flags, u32 tensor
//     count, u64 metadata offset, u32 metadata size, u64 index offset, u64 data offset,
//     u32 CRC-32 of bytes 0..39 and 44..63, 20 reserved bytes
//   metadata: one JSON object, zero-padded to 64
//   index: per tensor u16 name length, name, u8 dtype, u8 n_dims (<= 8), u64 dims[n_dims]
//     ([rows, cols] for matrices), u64 offset (from the data offset), u64 size; sorted by name
//   data: each tensor 64-byte aligned
//   footer: u32 CRC-32 of every byte before it
//
// dtypes: 0 F32, 1 F16, 30 BF16, 12 Q4_K, 14 Q6_K (GGML blocks, used in place); 128 (or 8)
// APR-Q4 (32-value blocks over the flattened tensor: f16 scale, 16 bytes of codes with the
// even-indexed value in the low nibble; (code - 8) x scale), repacked to Q4_0 at load; 129
// (or 9) APR-Q8 (one f32 scale, int8 values), expanded to F32 at load. Other dtype bytes
// (on which the original readers disagree) are refused, as are encrypted, signed, sharded,
// compressed and column-major files.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/gguf.h"

namespace hablar::apr {

uint32_t crc32(std::span<const uint8_t> bytes, uint32_t crc = 0);

// Maps and validates; throws Error(kFormat / kUnsupported / kIo) naming the file and fault.
gguf::GgufFile open(const std::string& path);
// The same over caller-owned bytes (fuzzing, tests; the bytes must outlive the result).
gguf::GgufFile parse(std::span<const uint8_t> bytes, const std::string& name);

// A tensor to write: dtype byte as above, shape outermost first ([rows, cols]).
struct WriteTensor {
  std::string name;
  uint8_t dtype = 0;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;
};
// The file's bytes (tensors sorted by name, as readers require).
std::vector<uint8_t> write(const nlohmann::json& metadata, std::vector<WriteTensor> tensors);

// A GGUF model as APR v2: metadata keys mapped (architecture, hidden_size, tokenizer.*,
// chat_template, ...), tensors copied through under their GGUF names (F32, F16, BF16,
// Q4_K, Q6_K; other types refused).
std::vector<uint8_t> from_gguf(const gguf::GgufFile& file);

}  // namespace hablar::apr
