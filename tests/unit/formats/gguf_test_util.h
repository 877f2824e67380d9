// Helpers for GGUF tests: build small valid files with GgufWriter, then locate and patch
// individual fields to produce each kind of malformed file.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"

namespace hablar::gguf::test {

using Bytes = std::vector<uint8_t>;

// Offset of the first occurrence of `needle` in `bytes`; fails the test when absent.
inline size_t find_bytes(const Bytes& bytes, std::string_view needle) {
  for (size_t i = 0; i + needle.size() <= bytes.size(); ++i)
    if (std::memcmp(bytes.data() + i, needle.data(), needle.size()) == 0) return i;
  ADD_FAILURE() << "'" << needle << "' not found in the test file";
  return 0;
}

template <typename T>
void patch(Bytes& bytes, size_t offset, T value) {
  ASSERT_LE(offset + sizeof(T), bytes.size());
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

template <typename T>
T peek(const Bytes& bytes, size_t offset) {
  T v{};
  std::memcpy(&v, bytes.data() + offset, sizeof(T));
  return v;
}

// Field offsets of one tensor info, found by its (unique) name in the file.
struct TensorInfoFields {
  size_t name_length;  // u64
  size_t n_dims;       // u32
  size_t dims;         // u64[n_dims]
  size_t type;         // u32
  size_t offset;       // u64
};
inline TensorInfoFields tensor_info_fields(const Bytes& bytes, std::string_view name,
                                           uint32_t n_dims) {
  const size_t at = find_bytes(bytes, name);
  TensorInfoFields f{};
  f.name_length = at - 8;
  f.n_dims = at + name.size();
  f.dims = f.n_dims + 4;
  f.type = f.dims + 8 * n_dims;
  f.offset = f.type + 4;
  return f;
}

// Offset of a metadata key's value type (u32), found by the key's text.
inline size_t value_type_field(const Bytes& bytes, std::string_view key) {
  return find_bytes(bytes, key) + key.size();
}

// A small file with every scalar type, strings, arrays and three tensors of different
// types (sizes chosen so the data section has no trailing padding after the last tensor).
inline GgufWriter small_writer() {
  GgufWriter w;
  w.set("general.architecture", Value::string("llama"));
  w.set("llama.block_count", Value::u32(2));
  w.set("llama.rope.freq_base", Value::f32(10000.0f));
  w.set("a.bool", Value::boolean(true));
  w.set("a.i8", Value{ValueType::I8, int64_t{-3}});
  w.set("a.u16", Value{ValueType::U16, uint64_t{65535}});
  w.set("a.f64", Value::f64(0.125));
  w.set("tokenizer.ggml.tokens", Value::string_array({"<unk>", "a", ""}));
  w.set("a.nested",
        Value::array(ValueType::ARRAY, {Value::i32_array({1, -2}), Value::string_array({"x"})}));
  Bytes f32(4 * 8 * 4);
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = (uint8_t)(i * 7);
  w.add_tensor_bytes("w.q8", DType::Q8_0, {32, 2}, Bytes(68, 1));  // padded to 96 bytes
  w.add_tensor_bytes("w.f32", DType::F32, {8, 4}, f32);
  w.add_tensor_bytes("w.f16", DType::F16, {16, 2}, Bytes(64, 0x3c));
  return w;
}

// Parses and expects an Error of kind kFormat whose message contains every fragment
// (and the file name). Returns the message for further checks.
inline std::string expect_format_error(const Bytes& bytes,
                                       std::initializer_list<std::string_view> fragments) {
  try {
    GgufFile::parse(bytes, "bad.gguf");
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kFormat) << msg;
    EXPECT_EQ(msg.rfind("bad.gguf: ", 0), 0u) << msg;
    for (std::string_view f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
    return msg;
  }
  ADD_FAILURE() << "parsing the malformed file succeeded";
  return {};
}

}  // namespace hablar::gguf::test
