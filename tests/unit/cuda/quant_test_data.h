// Random weight matrices in every CUDA-supported type, built byte by byte: random payload
// bytes with the scale fields overwritten by sane halves, so no quantizer is involved and
// every bit pattern of the payload is exercised. The reference values come from
// core/quant.h (dequantize_row).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/fp16.h"
#include "core/quant.h"
#include "core/quant_blocks.h"

namespace hablar::test {

inline void put_half(uint8_t* at, float v) {
  const uint16_t h = f32_to_fp16(v);
  std::memcpy(at, &h, 2);
}

// rows x cols matrix of `type`, row-major, dtype_row_bytes(type, cols) bytes per row.
inline std::vector<uint8_t> random_weight_bytes(DType type, int64_t rows, int64_t cols,
                                                uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f), value(-1.0f, 1.0f);
  const size_t row_bytes = dtype_row_bytes(type, cols);
  std::vector<uint8_t> data(row_bytes * rows);
  for (auto& b : data) b = (uint8_t)byte(rng);
  const auto traits = dtype_traits(type);
  const size_t blocks = data.size() / traits.block_bytes;
  for (size_t i = 0; i < blocks; ++i) {
    uint8_t* b = data.data() + i * traits.block_bytes;
    switch (type) {
      case DType::Q4_0:
      case DType::Q5_0:
      case DType::Q8_0:
        put_half(b, scale(rng));
        break;
      case DType::Q4_1:
      case DType::Q5_1:
        put_half(b, scale(rng));
        put_half(b + 2, scale(rng));
        break;
      case DType::Q4_K:
      case DType::Q5_K:
        put_half(b, std::fabs(scale(rng)) * 0.1f);
        put_half(b + 2, std::fabs(scale(rng)) * 0.1f);
        break;
      case DType::Q6_K:
        put_half(b + 208, scale(rng) * 0.05f);
        break;
      case DType::F16:
        put_half(b, value(rng));
        break;
      case DType::BF16: {
        const uint16_t h = f32_to_bf16(value(rng));
        std::memcpy(b, &h, 2);
        break;
      }
      default:
        break;
    }
  }
  return data;
}

inline std::vector<float> dequantize_matrix(DType type, const std::vector<uint8_t>& bytes,
                                            int64_t rows, int64_t cols) {
  std::vector<float> out(rows * cols);
  const size_t row_bytes = dtype_row_bytes(type, cols);
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row(type, bytes.data() + r * row_bytes, out.data() + r * cols, cols);
  return out;
}

inline const std::vector<DType>& cuda_weight_types() {
  static const std::vector<DType> types = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                                           DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K,
                                           DType::F16,  DType::BF16};
  return types;
}

}  // namespace hablar::test
