// GGUF writer (version 3). Header, metadata and tensor infos are emitted first; tensor
// data follows, each tensor padded to the alignment, produced by its DataFn on demand.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <variant>

#include "core/error.h"
#include "formats/gguf.h"

namespace hablar::gguf {

namespace {

uint64_t align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

// Appends little-endian encodings to a byte vector or a stream (same interface).
struct VectorSink {
  std::vector<uint8_t>& out;
  void write(const void* p, size_t n) {
    if (n == 0) return;
    const size_t old = out.size();
    out.resize(old + n);
    std::memcpy(out.data() + old, p, n);
  }
  uint64_t position() const { return out.size(); }
};
struct StreamSink {
  std::ofstream& out;
  uint64_t pos = 0;
  void write(const void* p, size_t n) {
    out.write(static_cast<const char*>(p), (std::streamsize)n);
    pos += n;
  }
  uint64_t position() const { return pos; }
};

template <typename Sink, typename T>
void put(Sink& s, T v) {
  s.write(&v, sizeof v);
}
template <typename Sink>
void put_string(Sink& s, const std::string& str) {
  put<Sink, uint64_t>(s, str.size());
  s.write(str.data(), str.size());
}

template <typename Sink>
void put_value(Sink& s, const Value& v, bool with_type);

template <typename Sink>
void put_payload(Sink& s, const Value& v) {
  switch (v.type) {
    case ValueType::U8:
      put<Sink, uint8_t>(s, (uint8_t)std::get<uint64_t>(v.data));
      break;
    case ValueType::I8:
      put<Sink, int8_t>(s, (int8_t)std::get<int64_t>(v.data));
      break;
    case ValueType::U16:
      put<Sink, uint16_t>(s, (uint16_t)std::get<uint64_t>(v.data));
      break;
    case ValueType::I16:
      put<Sink, int16_t>(s, (int16_t)std::get<int64_t>(v.data));
      break;
    case ValueType::U32:
      put<Sink, uint32_t>(s, (uint32_t)std::get<uint64_t>(v.data));
      break;
    case ValueType::I32:
      put<Sink, int32_t>(s, (int32_t)std::get<int64_t>(v.data));
      break;
    case ValueType::U64:
      put<Sink, uint64_t>(s, std::get<uint64_t>(v.data));
      break;
    case ValueType::I64:
      put<Sink, int64_t>(s, std::get<int64_t>(v.data));
      break;
    case ValueType::F32:
      put<Sink, float>(s, (float)std::get<double>(v.data));
      break;
    case ValueType::F64:
      put<Sink, double>(s, std::get<double>(v.data));
      break;
    case ValueType::BOOL:
      put<Sink, uint8_t>(s, std::get<bool>(v.data) ? 1 : 0);
      break;
    case ValueType::STRING:
      put_string(s, std::get<std::string>(v.data));
      break;
    case ValueType::ARRAY: {
      const Array& a = std::get<Array>(v.data);
      put<Sink, uint32_t>(s, (uint32_t)a.elem_type);
      put<Sink, uint64_t>(s, a.size());
      if (Array::is_packed_type(a.elem_type)) {
        if (a.packed.size() % value_type_size(a.elem_type) != 0)
          throw_error(ErrorKind::kInvalidArgument, "GGUF packed array has a partial element");
        s.write(a.packed.data(), a.packed.size());
        break;
      }
      for (const Value& item : a.items) {
        if (item.type != a.elem_type)
          throw_error(ErrorKind::kInvalidArgument, "GGUF array item type differs from its array's");
        put_payload(s, item);
      }
      break;
    }
  }
}

}  // namespace

void GgufWriter::set(std::string key, Value value) {
  for (auto& [k, v] : kv_)
    if (k == key) {
      v = std::move(value);
      return;
    }
  kv_.emplace_back(std::move(key), std::move(value));
}

void GgufWriter::set_alignment(uint32_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    throw_error(ErrorKind::kInvalidArgument, "GGUF alignment must be a power of two");
  alignment_ = alignment;
  set("general.alignment", Value::u32(alignment));
}

void GgufWriter::add_tensor(std::string name, DType type, std::vector<int64_t> dims, DataFn fill) {
  if (dims.empty() || dims.size() > 4)
    throw_error(ErrorKind::kInvalidArgument, "tensor " + name + ": 1 to 4 dimensions required");
  for (int64_t d : dims)
    if (d <= 0)
      throw_error(ErrorKind::kInvalidArgument, "tensor " + name + ": dimensions must be positive");
  int64_t rows = 1;
  for (size_t i = 1; i < dims.size(); ++i) rows *= dims[i];
  const uint64_t nbytes = dtype_row_bytes(type, dims[0]) * (uint64_t)rows;
  tensors_.push_back({std::move(name), type, std::move(dims), nbytes, std::move(fill), {}});
}

void GgufWriter::add_tensor_rows(std::string name, DType type, std::vector<int64_t> dims,
                                 RowsFn fill) {
  add_tensor(std::move(name), type, std::move(dims), {});
  tensors_.back().fill_rows = std::move(fill);
}

void GgufWriter::add_tensor_bytes(std::string name, DType type, std::vector<int64_t> dims,
                                  std::vector<uint8_t> bytes) {
  auto shared = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  add_tensor(
      std::move(name), type, std::move(dims), [shared, n = shared->size()](std::span<uint8_t> out) {
        if (out.size() != n)
          throw_error(ErrorKind::kInvalidArgument, "tensor byte count does not match its shape");
        std::memcpy(out.data(), shared->data(), n);
      });
}

template <typename Sink>
void GgufWriter::emit(Sink& sink) const {
  put<Sink, uint32_t>(sink, 0x46554747);
  put<Sink, uint32_t>(sink, 3);
  put<Sink, uint64_t>(sink, tensors_.size());
  put<Sink, uint64_t>(sink, kv_.size());
  for (const auto& [key, value] : kv_) {
    put_string(sink, key);
    put<Sink, uint32_t>(sink, (uint32_t)value.type);
    try {
      put_payload(sink, value);
    } catch (const std::bad_variant_access&) {
      throw_error(ErrorKind::kInvalidArgument, "GGUF key " + key +
                                                   ": value payload does not match its type " +
                                                   std::string(value_type_name(value.type)));
    }
  }
  uint64_t offset = 0;
  for (const PendingTensor& t : tensors_) {
    put_string(sink, t.name);
    put<Sink, uint32_t>(sink, (uint32_t)t.dims.size());
    for (int64_t d : t.dims) put<Sink, uint64_t>(sink, (uint64_t)d);
    put<Sink, uint32_t>(sink, (uint32_t)t.type);
    put<Sink, uint64_t>(sink, offset);
    offset = align_up(offset + t.nbytes, alignment_);
  }
  const std::vector<uint8_t> zeros(alignment_, 0);
  sink.write(zeros.data(), align_up(sink.position(), alignment_) - sink.position());
  std::vector<uint8_t> buffer;
  for (const PendingTensor& t : tensors_) {
    emit_data(sink, t, buffer);
    sink.write(zeros.data(), align_up(t.nbytes, alignment_) - t.nbytes);
  }
}

template <typename Sink>
void GgufWriter::emit_data(Sink& sink, const PendingTensor& t, std::vector<uint8_t>& buffer) const {
  if (!t.fill_rows) {
    buffer.resize(t.nbytes);
    std::memset(buffer.data(), 0, buffer.size());
    t.fill(std::span<uint8_t>(buffer));
    sink.write(buffer.data(), buffer.size());
    return;
  }
  const uint64_t row_bytes = dtype_row_bytes(t.type, t.dims[0]);
  const int64_t rows = (int64_t)(t.nbytes / row_bytes);
  const int64_t chunk_rows = std::max<int64_t>(1, (int64_t)(row_chunk_bytes_ / row_bytes));
  for (int64_t first = 0; first < rows; first += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - first);
    buffer.resize((size_t)n * row_bytes);  // every byte is written by fill_rows
    t.fill_rows(first, n, std::span<uint8_t>(buffer));
    sink.write(buffer.data(), buffer.size());
  }
}

std::vector<uint8_t> GgufWriter::to_bytes() const {
  std::vector<uint8_t> out;
  VectorSink sink{out};
  emit(sink);
  return out;
}

void GgufWriter::write(const std::string& path) const {
  const std::string tmp = path + ".partial";
  std::error_code ec;
  try {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw_error(ErrorKind::kIo, tmp + ": cannot create: " + std::strerror(errno));
    StreamSink sink{out};
    emit(sink);
    out.flush();
    if (!out) throw_error(ErrorKind::kIo, tmp + ": write failed: " + std::strerror(errno));
  } catch (...) {
    std::filesystem::remove(tmp, ec);  // no half-written file is left behind
    throw;
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw_error(ErrorKind::kIo, path + ": cannot rename from " + tmp + ": " + ec.message());
}

}  // namespace hablar::gguf
