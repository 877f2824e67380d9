// safetensors files: a validating reader over a memory map.
//
// File layout: u64 little-endian N, then N bytes of UTF-8 JSON (the header), then the data
// buffer. The header maps each tensor name to {"dtype": "F32"|"F16"|"BF16"|..., "shape":
// [d0, d1, ...] (outermost first, row-major), "data_offsets": [begin, end]} with offsets
// relative to the data buffer; an optional "__metadata__" maps strings to strings.
// The reader checks every bound (header size against the file, each tensor's byte range
// inside the buffer, its size against dtype x shape, no two tensors overlapping) and
// refuses anything else with an Error(kFormat) naming the file and the fault.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mmap_file.h"

namespace hablar::safetensors {

struct Tensor {
  std::string name;
  std::string dtype_name;      // as stored: "F32", "BF16", "I64", ...
  std::optional<DType> dtype;  // F32 / F16 / BF16 (and F64/I8/I16/I32/I64); none otherwise
  std::vector<int64_t> shape;  // outermost first, as safetensors stores it
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  int64_t n_elements() const;
};

class File {
 public:
  // Maps and validates; throws Error(kFormat / kIo) naming the file and the fault.
  static File open(const std::string& path);
  // Parses bytes owned by the caller (fuzzing, tests); `name` appears in errors.
  static File parse(std::span<const uint8_t> bytes, std::string name);

  const std::string& path() const { return name_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const Tensor* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The mapping the tensors point into (null for caller-owned bytes).
  std::shared_ptr<const MappedFile> mapping() const { return map_; }

 private:
  std::string name_;
  std::shared_ptr<const MappedFile> map_;
  std::vector<Tensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

// The largest header accepted (the reference implementation's limit is 100 MB).
inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

}  // namespace hablar::safetensors
