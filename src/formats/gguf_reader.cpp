// GGUF reader: every count and length is checked against the bytes that remain before
// anything is allocated, so a hostile header cannot make us reserve gigabytes.
#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "formats/gguf.h"

namespace hablar::gguf {

namespace {
constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
constexpr int kMaxDims = 4;
constexpr int kMaxArrayDepth = 16;
// Each parsed metadata value takes ~48 bytes in memory, so a file of one-byte array items
// would cost 48 times its size. Real models hold about a million values (tokens, scores,
// types, merges); 16 Mi is far beyond any and bounds the parse at under 1 GB.
constexpr uint64_t kMaxMetadataValues = uint64_t{1} << 24;
constexpr uint64_t kMaxAlignment = 1u << 20;

// Bytes an encoded value takes at least: its packed size, a string's u64 length, or an
// array's u32 type + u64 count.
size_t min_encoded_size(ValueType t) {
  if (t == ValueType::STRING) return 8;
  if (t == ValueType::ARRAY) return 12;
  return value_type_size(t);
}
}  // namespace

// Sequential reader over the file bytes; every read is bounds-checked.
class Parser {
 public:
  Parser(GgufFile& file) : f_(file), bytes_(file.bytes_) {}

  void run() {
    read_header();
    for (uint64_t i = 0; i < kv_count_; ++i) read_kv(i);
    read_alignment();
    for (uint64_t i = 0; i < tensor_count_; ++i) read_tensor_info(i);
    const uint64_t pos = pos_;
    f_.data_offset_ = (pos + f_.alignment_ - 1) / f_.alignment_ * f_.alignment_;
    if (f_.tensors_.size() > 0 && f_.data_offset_ > bytes_.size())
      fail("truncated: tensor data section starts at " + std::to_string(f_.data_offset_) +
           " but the file has " + std::to_string(bytes_.size()) + " bytes");
    place_tensors();
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw_error(ErrorKind::kFormat, f_.name_ + ": " + what);
  }
  size_t remaining() const { return bytes_.size() - pos_; }
  void need(uint64_t n, const char* what) const {
    if (n > remaining())
      fail(std::string("truncated: ") + what + " needs " + std::to_string(n) + " bytes at offset " +
           std::to_string(pos_) + ", " + std::to_string(remaining()) + " remain");
  }
  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  // The next n bytes, which must be there.
  const uint8_t* take(uint64_t n, const char* what) {
    need(n, what);
    const uint8_t* p = bytes_.data() + pos_;
    pos_ += n;
    return p;
  }
  std::string read_string(const char* what) {
    const uint64_t len = read<uint64_t>(what);
    if (len > remaining())
      fail(std::string(what) + ": string length " + std::to_string(len) + " exceeds the " +
           std::to_string(remaining()) + " bytes left in the file");
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), (size_t)len);
    pos_ += len;
    return s;
  }

  void read_header() {
    if (bytes_.size() < 4) fail("truncated: file too small for a GGUF header");
    const uint32_t magic = read<uint32_t>("magic");
    if (magic != kMagic) fail("bad magic: not a GGUF file");
    f_.version_ = read<uint32_t>("version");
    if (f_.version_ != 0 && (f_.version_ & 0xffffu) == 0 && __builtin_bswap32(f_.version_) <= 3)
      fail("big-endian GGUF (version " + std::to_string(__builtin_bswap32(f_.version_)) +
           ") is not supported");
    if (f_.version_ == 1) fail("unsupported GGUF version 1 (only versions 2 and 3 are read)");
    if (f_.version_ != 2 && f_.version_ != 3)
      fail("unsupported GGUF version " + std::to_string(f_.version_) + " (expected 2 or 3)");
    tensor_count_ = read<uint64_t>("tensor count");
    kv_count_ = read<uint64_t>("metadata count");
    // Each metadata entry takes at least 8 (key length) + 4 (type) + 1 bytes, each tensor
    // info at least 8 + 4 + 8 + 4 + 8 bytes.
    if (kv_count_ > remaining() / 13)
      fail("absurd metadata count " + std::to_string(kv_count_) + ": the " +
           std::to_string(remaining()) +
           " bytes after the header hold fewer entries (truncated "
           "or corrupt file)");
    if (tensor_count_ > remaining() / 32)
      fail("absurd tensor count " + std::to_string(tensor_count_) + ": the " +
           std::to_string(remaining()) +
           " bytes after the header hold fewer tensor infos "
           "(truncated or corrupt file)");
  }

  ValueType read_type(const std::string& where) {
    const uint32_t raw = read<uint32_t>("value type");
    if (raw > (uint32_t)ValueType::F64)
      fail(where + ": unknown metadata value type " + std::to_string(raw));
    return (ValueType)raw;
  }

  Value read_value(ValueType t, const std::string& key, int depth) {
    switch (t) {
      case ValueType::U8:
        return {t, uint64_t{read<uint8_t>("u8")}};
      case ValueType::I8:
        return {t, int64_t{read<int8_t>("i8")}};
      case ValueType::U16:
        return {t, uint64_t{read<uint16_t>("u16")}};
      case ValueType::I16:
        return {t, int64_t{read<int16_t>("i16")}};
      case ValueType::U32:
        return {t, uint64_t{read<uint32_t>("u32")}};
      case ValueType::I32:
        return {t, int64_t{read<int32_t>("i32")}};
      case ValueType::U64:
        return {t, read<uint64_t>("u64")};
      case ValueType::I64:
        return {t, read<int64_t>("i64")};
      case ValueType::F32:
        return {t, double{read<float>("f32")}};
      case ValueType::F64:
        return {t, read<double>("f64")};
      case ValueType::BOOL: {
        const uint8_t b = read<uint8_t>("bool");
        if (b > 1) fail("key " + key + ": bool value " + std::to_string(b) + " is not 0 or 1");
        return {t, b == 1};
      }
      case ValueType::STRING:
        return {t, read_string(("key " + key).c_str())};
      case ValueType::ARRAY:
        return read_array(key, depth + 1);
    }
    fail("key " + key + ": unknown value type");
  }

  Value read_array(const std::string& key, int depth) {
    if (depth > kMaxArrayDepth) fail("key " + key + ": arrays nested too deeply");
    const ValueType elem = read_type("key " + key + " array");
    const uint64_t count = read<uint64_t>("array count");
    if (count > remaining() / min_encoded_size(elem))
      fail("key " + key + ": absurd array count " + std::to_string(count) + " for the " +
           std::to_string(remaining()) + " bytes left (truncated or corrupt file)");
    Array arr{elem, {}, {}};
    metadata_values_ += count;
    if (metadata_values_ > kMaxMetadataValues)
      fail("key " + key + ": metadata holds more than " + std::to_string(kMaxMetadataValues) +
           " values in all (array of " + std::to_string(count) + ")");
    if (Array::is_packed_type(elem)) {
      // Numbers are copied as stored; bools are checked like single values.
      const size_t n_bytes = (size_t)count * value_type_size(elem);
      const uint8_t* src = take(n_bytes, "array items");
      arr.packed.assign(src, src + n_bytes);
      if (elem == ValueType::BOOL)
        for (uint8_t b : arr.packed)
          if (b > 1) fail("key " + key + ": bool value " + std::to_string(b) + " is not 0 or 1");
    } else {
      arr.items.reserve((size_t)count);
      for (uint64_t i = 0; i < count; ++i) arr.items.push_back(read_value(elem, key, depth));
    }
    return {ValueType::ARRAY, std::move(arr)};
  }

  void read_kv(uint64_t index) {
    std::string key = read_string("metadata key");
    if (key.empty()) fail("metadata entry " + std::to_string(index) + " has an empty key");
    if (f_.kv_index_.count(key)) fail("duplicate metadata key " + key);
    const ValueType t = read_type("key " + key);
    Value v = read_value(t, key, 0);
    f_.kv_index_.emplace(key, f_.kv_.size());
    f_.kv_.emplace_back(std::move(key), std::move(v));
  }

  void read_alignment() {
    const Value* v = f_.find("general.alignment");
    if (!v) return;
    const uint64_t a = f_.get_uint("general.alignment");
    if (a == 0 || (a & (a - 1)) != 0 || a > kMaxAlignment)
      fail("general.alignment " + std::to_string(a) + " is not a power of two up to 1 MiB");
    f_.alignment_ = a;
  }

  void read_tensor_info(uint64_t index) {
    TensorInfo t;
    t.name = read_string("tensor name");
    if (t.name.empty()) fail("tensor info " + std::to_string(index) + " has an empty name");
    const std::string where = "tensor " + t.name;
    if (f_.tensor_index_.count(t.name)) fail("duplicate tensor name " + t.name);
    const uint32_t n_dims = read<uint32_t>("tensor dims");
    if (n_dims == 0 || n_dims > kMaxDims)
      fail(where + ": " + std::to_string(n_dims) + " dimensions (expected 1 to 4)");
    int64_t count = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = read<uint64_t>("tensor dim");
      if (dim == 0 || dim > (uint64_t)std::numeric_limits<int64_t>::max() / (uint64_t)count)
        fail(where + ": dimension " + std::to_string(d) + " = " + std::to_string(dim) +
             " is zero or too large");
      count *= (int64_t)dim;
      t.dims.push_back((int64_t)dim);
    }
    const uint32_t raw_type = read<uint32_t>("tensor type");
    const auto traits = dtype_traits_of(raw_type);
    if (!traits) fail(where + ": unknown tensor type " + std::to_string(raw_type));
    t.type = (DType)raw_type;
    if (t.dims[0] % traits->block_elems != 0)
      fail(where + ": row length " + std::to_string(t.dims[0]) + " is not a multiple of " +
           std::string(traits->name) + "'s block size " + std::to_string(traits->block_elems));
    const uint64_t blocks = (uint64_t)count / traits->block_elems;
    if (blocks > bytes_.size() / traits->block_bytes)
      fail(where + ": " + std::to_string(count) + " " + std::string(traits->name) +
           " values need more bytes than the whole file has (" + std::to_string(bytes_.size()) +
           ")");
    t.nbytes = blocks * traits->block_bytes;
    t.offset = read<uint64_t>("tensor offset");
    f_.tensor_index_.emplace(t.name, f_.tensors_.size());
    f_.tensors_.push_back(std::move(t));
  }

  void place_tensors() {
    std::vector<const TensorInfo*> by_offset;
    const uint64_t data_size = bytes_.size() - std::min<uint64_t>(f_.data_offset_, bytes_.size());
    for (TensorInfo& t : f_.tensors_) {
      if (t.offset % f_.alignment_ != 0)
        fail("tensor " + t.name + ": offset " + std::to_string(t.offset) + " is not aligned to " +
             std::to_string(f_.alignment_));
      if (t.offset > data_size || t.nbytes > data_size - t.offset)
        fail("tensor " + t.name + ": data [" + std::to_string(t.offset) + ", +" +
             std::to_string(t.nbytes) + ") lies outside the " + std::to_string(data_size) +
             "-byte data section (file truncated?)");
      t.data = bytes_.data() + f_.data_offset_ + t.offset;
      by_offset.push_back(&t);
    }
    std::sort(by_offset.begin(), by_offset.end(),
              [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const TensorInfo& prev = *by_offset[i - 1];
      if (prev.offset + prev.nbytes > by_offset[i]->offset)
        fail("tensors " + prev.name + " and " + by_offset[i]->name + " overlap");
    }
  }

  GgufFile& f_;
  std::span<const uint8_t> bytes_;
  uint64_t pos_ = 0;
  uint64_t tensor_count_ = 0;
  uint64_t kv_count_ = 0;
  uint64_t metadata_values_ = 0;  // array items parsed so far
};

GgufFile GgufFile::open_one(const std::string& path) {
  auto map = std::make_shared<MappedFile>(path);
  GgufFile f = parse(map->bytes(), path);
  f.map_ = std::move(map);
  return f;
}

GgufFile GgufFile::parse(std::span<const uint8_t> bytes, std::string name) {
  GgufFile f;
  f.name_ = std::move(name);
  f.bytes_ = bytes;
  Parser(f).run();
  return f;
}

GgufFile GgufFile::assemble(std::string name, std::vector<std::pair<std::string, Value>> metadata,
                            std::vector<TensorInfo> tensors, std::shared_ptr<const void> keep) {
  GgufFile f;
  f.name_ = std::move(name);
  f.version_ = 3;
  f.kv_ = std::move(metadata);
  for (size_t i = 0; i < f.kv_.size(); ++i) f.kv_index_[f.kv_[i].first] = i;
  f.tensors_ = std::move(tensors);
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.tensor_index_[f.tensors_[i].name] = i;
  f.keep_ = std::move(keep);
  return f;
}

}  // namespace hablar::gguf
