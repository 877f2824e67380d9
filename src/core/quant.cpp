// Dispatch of dequantize_row / quantize_row to the per-format references (quant_simple.cpp,
// quant_kquants.cpp, quant_iq4.cpp) and the plain float formats.
#include "core/quant.h"

#include <cstring>
#include <string>

#include "core/error.h"
#include "core/fp16.h"

namespace hablar {
namespace {

using DequantizeFn = void (*)(const void* blocks, float* dst, int64_t n_blocks);
using QuantizeFn = void (*)(const float* src, void* blocks, int64_t n_blocks);

// Adapts a typed block routine to the untyped table below.
template <typename Block, void (*Fn)(const Block*, float*, int64_t)>
void dequantize_blocks(const void* blocks, float* dst, int64_t n_blocks) {
  Fn(static_cast<const Block*>(blocks), dst, n_blocks);
}
template <typename Block, void (*Fn)(const float*, Block*, int64_t)>
void quantize_blocks(const float* src, void* blocks, int64_t n_blocks) {
  Fn(src, static_cast<Block*>(blocks), n_blocks);
}

void dequantize_f32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, (size_t)n * sizeof(float));
}
void quantize_f32(const float* src, void* dst, int64_t n) {
  std::memcpy(dst, src, (size_t)n * sizeof(float));
}
// As fp16_to_f32, without branches (so the loop vectorizes): the half's exponent and
// mantissa, moved to a float's bit positions, read as a float 2^112 too small (normals and
// subnormals alike), scaled back exactly; inf / NaN keep all-ones exponents.
void dequantize_f16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t magnitude = (uint32_t)(h[i] & 0x7fffu) << 13;
    const uint32_t sign = (uint32_t)(h[i] & 0x8000u) << 16;
    float scaled;
    std::memcpy(&scaled, &magnitude, sizeof scaled);
    scaled *= 0x1p112f;
    uint32_t bits;
    std::memcpy(&bits, &scaled, sizeof bits);
    if ((h[i] & 0x7c00u) == 0x7c00u) bits = magnitude | 0x7f800000u;
    bits |= sign;
    std::memcpy(&dst[i], &bits, sizeof bits);
  }
}
void quantize_f16(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) h[i] = f32_to_fp16(src[i]);
}
void dequantize_bf16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
}
void quantize_bf16(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(src[i]);
}

struct Codec {
  DType type;
  DequantizeFn dequantize;  // on blocks (one value per block for the float formats)
  QuantizeFn quantize;      // nullptr when the format has no reference quantizer
};

#define HABLAR_BLOCK_CODEC(TYPE, BLOCK, NAME)                         \
  Codec {                                                             \
    DType::TYPE, &dequantize_blocks<BLOCK, &qref::dequantize_##NAME>, \
        &quantize_blocks<BLOCK, &qref::quantize_##NAME>               \
  }

const Codec kCodecs[] = {
    {DType::F32, &dequantize_f32, &quantize_f32},
    {DType::F16, &dequantize_f16, &quantize_f16},
    {DType::BF16, &dequantize_bf16, &quantize_bf16},
    HABLAR_BLOCK_CODEC(Q4_0, BlockQ4_0, q4_0),
    HABLAR_BLOCK_CODEC(Q4_1, BlockQ4_1, q4_1),
    HABLAR_BLOCK_CODEC(Q5_0, BlockQ5_0, q5_0),
    HABLAR_BLOCK_CODEC(Q5_1, BlockQ5_1, q5_1),
    HABLAR_BLOCK_CODEC(Q8_0, BlockQ8_0, q8_0),
    HABLAR_BLOCK_CODEC(Q8_1, BlockQ8_1, q8_1),
    HABLAR_BLOCK_CODEC(Q2_K, BlockQ2_K, q2_k),
    HABLAR_BLOCK_CODEC(Q3_K, BlockQ3_K, q3_k),
    HABLAR_BLOCK_CODEC(Q4_K, BlockQ4_K, q4_k),
    HABLAR_BLOCK_CODEC(Q5_K, BlockQ5_K, q5_k),
    HABLAR_BLOCK_CODEC(Q6_K, BlockQ6_K, q6_k),
    HABLAR_BLOCK_CODEC(Q8_K, BlockQ8_K, q8_k),
    HABLAR_BLOCK_CODEC(IQ4_NL, BlockIQ4_NL, iq4_nl),
    HABLAR_BLOCK_CODEC(IQ4_XS, BlockIQ4_XS, iq4_xs),
};

#undef HABLAR_BLOCK_CODEC

const Codec* find_codec(DType type) {
  for (const Codec& c : kCodecs)
    if (c.type == type) return &c;
  return nullptr;
}

std::string type_label(DType type) {
  const auto traits = dtype_traits_of((uint32_t)type);
  return traits ? std::string(traits->name) : "type " + std::to_string((uint32_t)type);
}

// Number of blocks in a row of n values; throws when n does not fill whole blocks.
int64_t row_blocks(DType type, int64_t n) {
  dtype_row_bytes(type, n);  // validates n against the block size
  return n / dtype_traits(type).block_elems;
}

}  // namespace

bool has_dequantizer(DType type) {
  return find_codec(type) != nullptr;
}

bool has_quantizer(DType type) {
  const Codec* c = find_codec(type);
  return c != nullptr && c->quantize != nullptr;
}

void dequantize_row(DType type, const void* src, float* dst, int64_t n) {
  const Codec* c = find_codec(type);
  if (c == nullptr)
    throw_error(ErrorKind::kUnsupported, "cannot dequantize tensor type " + type_label(type));
  c->dequantize(src, dst, row_blocks(type, n));
}

void quantize_row(DType type, const float* src, void* dst, int64_t n) {
  const Codec* c = find_codec(type);
  if (c == nullptr || c->quantize == nullptr)
    throw_error(ErrorKind::kUnsupported, "no quantizer for tensor type " + type_label(type));
  c->quantize(src, dst, row_blocks(type, n));
}

}  // namespace hablar
