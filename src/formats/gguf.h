// GGUF model files: a validating reader over a memory map and a streaming writer.
//
// File layout (little-endian): magic "GGUF", u32 version (2 or 3), u64 tensor count,
// u64 metadata count; metadata entries (string key, u32 value type, value); tensor infos
// (string name, u32 n_dims, u64 dims[n_dims] innermost first, u32 type, u64 offset); padding
// to general.alignment (default 32); tensor data, each tensor at data_start + offset.
// Strings are u64 length + bytes (no terminator). Arrays are u32 element type + u64 count
// + elements, and may nest.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/mmap_file.h"

namespace hablar::gguf {

enum class ValueType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
std::string_view value_type_name(ValueType t);  // "u32", "string", "array", ...

struct Value;
// An array value. Strings and nested arrays are held as Values in `items`; numbers and
// bools are held packed, as GGUF stores them (little-endian, `value_type_size` bytes each),
// which keeps a 150k-entry vocabulary's scores at 4 bytes per entry instead of a Value each.
struct Array {
  ValueType elem_type = ValueType::U8;
  std::vector<Value> items;     // STRING and ARRAY elements
  std::vector<uint8_t> packed;  // every other element type

  static bool is_packed_type(ValueType t) {
    return t != ValueType::STRING && t != ValueType::ARRAY;
  }
  size_t size() const;
  Value at(size_t i) const;  // element i of either form (a copy)
};
size_t value_type_size(ValueType t);  // bytes of one packed element; 0 for string and array

// One metadata value. Integers keep their GGUF type in `type`; the payload is widened to
// u64 / i64 / double so that accessors can range-check conversions.
struct Value {
  ValueType type = ValueType::U8;
  std::variant<uint64_t, int64_t, double, bool, std::string, Array> data;

  static Value u8(uint8_t v) { return {ValueType::U8, uint64_t{v}}; }
  static Value u32(uint32_t v) { return {ValueType::U32, uint64_t{v}}; }
  static Value u64(uint64_t v) { return {ValueType::U64, v}; }
  static Value i32(int32_t v) { return {ValueType::I32, int64_t{v}}; }
  static Value i64(int64_t v) { return {ValueType::I64, v}; }
  static Value f32(float v) { return {ValueType::F32, double{v}}; }
  static Value f64(double v) { return {ValueType::F64, v}; }
  static Value boolean(bool v) { return {ValueType::BOOL, v}; }
  static Value string(std::string v) { return {ValueType::STRING, std::move(v)}; }
  // Items of a packed type are packed here.
  static Value array(ValueType elem, std::vector<Value> items);
  static Value string_array(const std::vector<std::string>& items);
  static Value f32_array(const std::vector<float>& items);
  static Value i32_array(const std::vector<int32_t>& items);
};

struct TensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // dims[0] is the row length (innermost), as GGUF stores them
  DType type = DType::F32;
  uint64_t offset = 0;  // from the start of the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping (reader only)

  int64_t n_elements() const;
  int64_t rows() const { return dims.empty() ? 0 : n_elements() / dims[0]; }
  std::string shape_string() const;  // "[576, 49152]"
};

class GgufFile {
 public:
  // Maps and validates the file; throws Error(kFormat/kIo) naming the file and the fault.
  // A shard of a split model (split.count > 1; gguf-split and gguf-py name shard k of n
  // "<prefix>-%05d-of-%05d.gguf", k from 1) opens every shard and returns the whole model:
  // the first shard's metadata (without the split.* keys) and all shards' tensors, each
  // pointing into its own shard's mapping. Any shard's path names the model.
  static GgufFile open(const std::string& path);
  // Exactly one file, a shard taken as it is (its own metadata and tensors).
  static GgufFile open_one(const std::string& path);
  // Parses bytes owned by the caller (fuzzing, tests); `name` appears in errors.
  static GgufFile parse(std::span<const uint8_t> bytes, std::string name);
  // A model described in GGUF's vocabulary by another format's reader (formats/hf_model.h):
  // metadata and tensor infos whose data point into mappings that `keep` holds alive. It is
  // not checked here: the reader that builds it checks its own input.
  static GgufFile assemble(std::string name, std::vector<std::pair<std::string, Value>> metadata,
                           std::vector<TensorInfo> tensors, std::shared_ptr<const void> keep);

  const std::string& path() const { return name_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  size_t file_size() const { return bytes_.size(); }

  // Metadata, in file order.
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed accessors: "key X missing" / "key X is u32, expected string" errors.
  // Integer accessors accept any integer type whose value fits.
  uint64_t get_uint(std::string_view key) const;
  int64_t get_int(std::string_view key) const;
  double get_float(std::string_view key) const;  // f32 or f64
  bool get_bool(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;
  const Array& get_array(std::string_view key) const;
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<float> get_f32_array(std::string_view key) const;
  std::vector<int32_t> get_i32_array(std::string_view key) const;

  std::optional<uint64_t> uint_or_none(std::string_view key) const;
  uint64_t get_uint_or(std::string_view key, uint64_t fallback) const;
  double get_float_or(std::string_view key, double fallback) const;
  bool get_bool_or(std::string_view key, bool fallback) const;
  std::string get_string_or(std::string_view key, std::string fallback) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  const TensorInfo& tensor(std::string_view name) const;  // throws if missing

 private:
  friend class Parser;
  static GgufFile join_shards(GgufFile given, uint64_t count);
  [[noreturn]] void fail_key(std::string_view key, const Value& v, std::string_view want) const;
  const Value& require(std::string_view key) const;

  std::string name_;
  std::shared_ptr<MappedFile> map_;   // null when parsing caller-owned bytes
  std::shared_ptr<const void> keep_;  // assemble(): what the tensors point into
  std::span<const uint8_t> bytes_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Writes GGUF version 3. Tensor data is produced on demand, one tensor at a time, so a
// multi-GB model is written with memory for one tensor only.
class GgufWriter {
 public:
  // Fills `out` (exactly dtype_row_bytes(type, dims[0]) * rows bytes) with the tensor data.
  using DataFn = std::function<void(std::span<uint8_t> out)>;

  void set(std::string key, Value value);  // replaces an existing key, keeps its position
  void set_alignment(uint32_t alignment);  // also written as general.alignment
  void add_tensor(std::string name, DType type, std::vector<int64_t> dims, DataFn fill);
  // Fills rows [first_row, first_row + n_rows) into `out` (n_rows whole rows). The writer
  // calls it on chunks of at most row_chunk_bytes (64 MiB unless set; at least one row), so
  // a tensor of any size is written with a bounded buffer.
  using RowsFn = std::function<void(int64_t first_row, int64_t n_rows, std::span<uint8_t> out)>;
  void add_tensor_rows(std::string name, DType type, std::vector<int64_t> dims, RowsFn fill);
  void set_row_chunk_bytes(uint64_t bytes) { row_chunk_bytes_ = bytes; }
  void add_tensor_bytes(std::string name, DType type, std::vector<int64_t> dims,
                        std::vector<uint8_t> bytes);

  // Writes the file (through a temporary name, renamed when complete).
  void write(const std::string& path) const;
  // The whole file in memory (tests, small files).
  std::vector<uint8_t> to_bytes() const;

 private:
  struct PendingTensor {
    std::string name;
    DType type;
    std::vector<int64_t> dims;
    uint64_t nbytes;
    DataFn fill;       // whole tensor at once, or
    RowsFn fill_rows;  // chunks of rows
  };
  template <typename Sink>
  void emit_data(Sink& sink, const PendingTensor& t, std::vector<uint8_t>& buffer) const;
  template <typename Sink>
  void emit(Sink& sink) const;

  uint32_t alignment_ = 32;
  uint64_t row_chunk_bytes_ = 64ull << 20;
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace hablar::gguf
