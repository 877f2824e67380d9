// Non-owning views of weight matrices as the backends consume them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace hablar {

// A row-major weight matrix of `rows` output features by `cols` input features, stored in
// `type` (a GGUF tensor with dims [cols, rows]). Row r starts at data + r * row_bytes.
struct WeightView {
  DType type = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
  const void* data = nullptr;

  const uint8_t* row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + (size_t)r * row_bytes;
  }
  bool empty() const { return data == nullptr; }
};

}  // namespace hablar
