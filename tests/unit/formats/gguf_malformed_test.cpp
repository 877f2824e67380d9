// One test per kind of malformed GGUF file: each is a valid file from GgufWriter with one
// field patched, and each must give a kFormat Error naming the file and the fault.
#include <gtest/gtest.h>

#include <limits>

#include "gguf_test_util.h"

namespace hablar::gguf {
namespace {

using test::Bytes;
using test::expect_format_error;
using test::patch;
using test::peek;
using test::small_writer;
using test::tensor_info_fields;
using test::value_type_field;

constexpr size_t kVersionAt = 4;
constexpr size_t kTensorCountAt = 8;
constexpr size_t kMetadataCountAt = 16;
constexpr size_t kFirstKeyLengthAt = 24;

Bytes small_file() {
  return small_writer().to_bytes();
}

TEST(GgufMalformed, BadMagic) {
  Bytes b = small_file();
  b[0] = 'X';
  expect_format_error(b, {"bad magic"});
}

TEST(GgufMalformed, EmptyFile) {
  expect_format_error({}, {"truncated"});
}

TEST(GgufMalformed, UnsupportedVersion) {
  Bytes b = small_file();
  patch<uint32_t>(b, kVersionAt, 7);
  expect_format_error(b, {"unsupported GGUF version 7"});
}

TEST(GgufMalformed, VersionOneIsRejected) {
  Bytes b = small_file();
  patch<uint32_t>(b, kVersionAt, 1);
  expect_format_error(b, {"unsupported GGUF version 1"});
}

TEST(GgufMalformed, BigEndianFileIsNamed) {
  Bytes b = small_file();
  patch<uint32_t>(b, kVersionAt, 0x03000000u);
  expect_format_error(b, {"big-endian"});
}

TEST(GgufMalformed, TruncatedHeader) {
  Bytes b = small_file();
  b.resize(12);
  expect_format_error(b, {"truncated", "tensor count"});
}

TEST(GgufMalformed, TruncatedInsideMetadata) {
  Bytes b = small_file();
  b.resize(test::find_bytes(b, "llama.rope.freq_base") + 4);
  expect_format_error(b, {"truncated"});
}

TEST(GgufMalformed, TruncatedInsideTensorInfos) {
  Bytes b = small_file();
  b.resize(tensor_info_fields(b, "w.f32", 2).type + 2);
  expect_format_error(b, {"truncated", "tensor type"});
}

TEST(GgufMalformed, TruncatedTensorData) {
  Bytes b = small_file();
  b.resize(b.size() - 1);
  expect_format_error(b, {"tensor w.f16", "outside", "truncated"});
}

TEST(GgufMalformed, AbsurdMetadataCount) {
  Bytes b = small_file();
  patch<uint64_t>(b, kMetadataCountAt, uint64_t{1} << 40);
  expect_format_error(b, {"absurd metadata count 1099511627776"});
}

TEST(GgufMalformed, AbsurdTensorCount) {
  Bytes b = small_file();
  patch<uint64_t>(b, kTensorCountAt, std::numeric_limits<uint64_t>::max());
  expect_format_error(b, {"absurd tensor count"});
}

TEST(GgufMalformed, AbsurdKeyLength) {
  Bytes b = small_file();
  patch<uint64_t>(b, kFirstKeyLengthAt, std::numeric_limits<uint64_t>::max() - 3);
  expect_format_error(b, {"metadata key", "string length", "exceeds"});
}

TEST(GgufMalformed, AbsurdStringValueLength) {
  Bytes b = small_file();
  // general.architecture's value: u32 type, then the string's u64 length.
  patch<uint64_t>(b, value_type_field(b, "general.architecture") + 4, uint64_t{1} << 50);
  expect_format_error(b, {"key general.architecture", "string length"});
}

TEST(GgufMalformed, AbsurdArrayCount) {
  Bytes b = small_file();
  // tokenizer.ggml.tokens: u32 type (array), u32 element type, u64 count.
  patch<uint64_t>(b, value_type_field(b, "tokenizer.ggml.tokens") + 8, uint64_t{1} << 61);
  expect_format_error(b, {"key tokenizer.ggml.tokens", "absurd array count"});
}

TEST(GgufMalformed, UnknownValueType) {
  Bytes b = small_file();
  patch<uint32_t>(b, value_type_field(b, "llama.block_count"), 13);
  expect_format_error(b, {"key llama.block_count", "unknown metadata value type 13"});
}

TEST(GgufMalformed, UnknownArrayElementType) {
  Bytes b = small_file();
  patch<uint32_t>(b, value_type_field(b, "tokenizer.ggml.tokens") + 4, 99);
  expect_format_error(b, {"tokenizer.ggml.tokens", "unknown metadata value type 99"});
}

TEST(GgufMalformed, BoolNeitherZeroNorOne) {
  Bytes b = small_file();
  b[value_type_field(b, "a.bool") + 4] = 2;
  expect_format_error(b, {"key a.bool", "bool value 2"});
}

TEST(GgufMalformed, ArraysNestedTooDeeply) {
  // 40 levels of one-element arrays: built by hand, since the depth is the fault.
  GgufWriter w;
  Value v = Value::i32_array({1});
  for (int i = 0; i < 40; ++i) v = Value::array(ValueType::ARRAY, {v});
  w.set("deep", v);
  expect_format_error(w.to_bytes(), {"key deep", "nested too deeply"});
}

TEST(GgufMalformed, EmptyKey) {
  GgufWriter w;
  w.set("", Value::u32(1));
  expect_format_error(w.to_bytes(), {"empty key"});
}

TEST(GgufMalformed, DuplicateKey) {
  Bytes b = small_file();
  // Rename a.f64 to a.u16 (same length): the later entry repeats an earlier key.
  std::memcpy(b.data() + test::find_bytes(b, "a.f64"), "a.u16", 5);
  expect_format_error(b, {"duplicate metadata key a.u16"});
}

TEST(GgufMalformed, TooManyMetadataValues) {
  // One u8 array of 16 Mi + 1 items: it fits the file, but would cost ~48 bytes of memory per
  // item; the budget of parsed values rejects it before anything is allocated.
  const uint64_t count = (uint64_t{1} << 24) + 1;
  GgufWriter w;
  w.set("a.big", Value::array(ValueType::U8, {Value::u8(0)}));
  Bytes b = w.to_bytes();
  patch<uint64_t>(b, value_type_field(b, "a.big") + 8, count);
  b.resize(b.size() + count);
  expect_format_error(b, {"key a.big", "more than 16777216 values"});
}

TEST(GgufMalformed, AlignmentNotPowerOfTwo) {
  GgufWriter w = small_writer();
  w.set("general.alignment", Value::u32(48));
  expect_format_error(w.to_bytes(), {"general.alignment 48", "power of two"});
}

TEST(GgufMalformed, AlignmentOfWrongType) {
  GgufWriter w = small_writer();
  w.set("general.alignment", Value::string("32"));
  expect_format_error(w.to_bytes(), {"key general.alignment is string"});
}

TEST(GgufMalformed, TensorOffsetMisaligned) {
  Bytes b = small_file();
  const auto f = tensor_info_fields(b, "w.f32", 2);
  patch<uint64_t>(b, f.offset, peek<uint64_t>(b, f.offset) + 4);
  expect_format_error(b, {"tensor w.f32", "not aligned to 32"});
}

TEST(GgufMalformed, TensorDataOutOfRange) {
  Bytes b = small_file();
  patch<uint64_t>(b, tensor_info_fields(b, "w.f32", 2).offset, uint64_t{1} << 40);
  expect_format_error(b, {"tensor w.f32", "outside"});
}

TEST(GgufMalformed, TensorDataOffsetNearWrapAround) {
  Bytes b = small_file();
  // offset + nbytes would wrap around 2^64: must still be caught.
  patch<uint64_t>(b, tensor_info_fields(b, "w.f32", 2).offset, ~uint64_t{31});
  expect_format_error(b, {"tensor w.f32", "outside"});
}

TEST(GgufMalformed, TensorsOverlap) {
  Bytes b = small_file();
  // w.f16 (64 bytes) moved onto w.f32's data (128 bytes).
  const uint64_t f32_offset = peek<uint64_t>(b, tensor_info_fields(b, "w.f32", 2).offset);
  patch<uint64_t>(b, tensor_info_fields(b, "w.f16", 2).offset, f32_offset + 32);
  expect_format_error(b, {"w.f32 and w.f16 overlap"});
}

TEST(GgufMalformed, UnknownTensorType) {
  Bytes b = small_file();
  patch<uint32_t>(b, tensor_info_fields(b, "w.f32", 2).type, 4);  // 4 and 5 were removed
  expect_format_error(b, {"tensor w.f32", "unknown tensor type 4"});
}

TEST(GgufMalformed, DuplicateTensorName) {
  Bytes b = small_file();
  const size_t at = test::find_bytes(b, "w.f16");
  std::memcpy(b.data() + at, "w.f32", 5);
  expect_format_error(b, {"duplicate tensor name w.f32"});
}

TEST(GgufMalformed, EmptyTensorName) {
  GgufWriter w;
  w.add_tensor_bytes("", DType::F32, {1}, Bytes(4, 0));
  expect_format_error(w.to_bytes(), {"empty name"});
}

TEST(GgufMalformed, ZeroDimension) {
  Bytes b = small_file();
  patch<uint64_t>(b, tensor_info_fields(b, "w.f32", 2).dims + 8, 0);
  expect_format_error(b, {"tensor w.f32", "dimension 1 = 0"});
}

TEST(GgufMalformed, TooManyDimensions) {
  Bytes b = small_file();
  patch<uint32_t>(b, tensor_info_fields(b, "w.f32", 2).n_dims, 5);
  expect_format_error(b, {"tensor w.f32", "5 dimensions"});
}

TEST(GgufMalformed, DimensionsOverflowInt64) {
  Bytes b = small_file();
  const auto f = tensor_info_fields(b, "w.f32", 2);
  patch<uint64_t>(b, f.dims, uint64_t{1} << 40);
  patch<uint64_t>(b, f.dims + 8, uint64_t{1} << 40);
  expect_format_error(b, {"tensor w.f32", "dimension 1", "too large"});
}

TEST(GgufMalformed, ByteCountOverflowsUint64) {
  Bytes b = small_file();
  // 2^61 f64 values would need 2^64 bytes: the size computation must not wrap to 0.
  const auto f = tensor_info_fields(b, "w.f32", 2);
  patch<uint64_t>(b, f.dims, uint64_t{1} << 59);
  patch<uint64_t>(b, f.dims + 8, 4);
  patch<uint32_t>(b, f.type, (uint32_t)DType::F64);
  expect_format_error(b, {"tensor w.f32", "more bytes than the whole file"});
}

TEST(GgufMalformed, RowLengthNotAMultipleOfTheBlock) {
  Bytes b = small_file();
  patch<uint64_t>(b, tensor_info_fields(b, "w.q8", 2).dims, 48);
  expect_format_error(b, {"tensor w.q8", "row length 48", "block size 32"});
}

TEST(GgufMalformed, DataSectionBeyondEndOfFile) {
  Bytes b = small_file();
  // Cut the file right after the tensor infos, before the alignment padding.
  const auto f = tensor_info_fields(b, "w.f16", 2);
  b.resize(f.offset + 8);
  expect_format_error(b, {"truncated"});
}

}  // namespace
}  // namespace hablar::gguf
