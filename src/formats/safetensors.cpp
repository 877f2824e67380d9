// safetensors reader: header JSON parsed with nlohmann::json after a nesting-depth check,
// every offset and size checked before a pointer into the data is formed.
#include "formats/safetensors.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_depth.h"

namespace hablar::safetensors {
namespace {

using nlohmann::json;

struct DTypeEntry {
  const char* name;
  uint32_t bytes;  // per element
  std::optional<DType> type;
};

// Every dtype safetensors defines; those hablar can hold as a tensor type carry it.
constexpr DTypeEntry kDTypes[] = {
    {"F64", 8, DType::F64},    {"F32", 4, DType::F32},       {"F16", 2, DType::F16},
    {"BF16", 2, DType::BF16},  {"I64", 8, DType::I64},       {"I32", 4, DType::I32},
    {"I16", 2, DType::I16},    {"I8", 1, DType::I8},         {"U64", 8, std::nullopt},
    {"U32", 4, std::nullopt},  {"U16", 2, std::nullopt},     {"U8", 1, std::nullopt},
    {"BOOL", 1, std::nullopt}, {"F8_E4M3", 1, std::nullopt}, {"F8_E5M2", 1, std::nullopt},
};

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw_error(ErrorKind::kFormat, file + ": safetensors: " + what);
}

const DTypeEntry* find_dtype(const std::string& name) {
  for (const DTypeEntry& e : kDTypes)
    if (name == e.name) return &e;
  return nullptr;
}

// A non-negative integer of the header; anything else is a format error.
uint64_t header_uint(const json& v, const std::string& file, const std::string& what) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
    fail(file, what + " must be a non-negative integer");
  return v.get<uint64_t>();
}

// One tensor entry {"dtype", "shape", "data_offsets"} -> Tensor (data relative to `base`).
Tensor read_entry(const std::string& file, const std::string& name, const json& e,
                  std::span<const uint8_t> buffer) {
  const std::string where = "tensor '" + name + "'";
  if (!e.is_object()) fail(file, where + " is not an object");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!e.contains(key)) fail(file, where + " has no \"" + key + "\"");
  if (!e["dtype"].is_string()) fail(file, where + ": dtype must be a string");
  Tensor t;
  t.name = name;
  t.dtype_name = e["dtype"].get<std::string>();
  const DTypeEntry* dt = find_dtype(t.dtype_name);
  if (dt == nullptr) fail(file, where + ": unknown dtype '" + t.dtype_name + "'");
  t.dtype = dt->type;
  const json& shape = e["shape"];
  if (!shape.is_array() || shape.size() > 8)
    fail(file, where + ": shape must be an array of at most 8 dims");
  uint64_t elems = 1;
  for (const json& d : shape) {
    const uint64_t n = header_uint(d, file, where + ": a shape dim");
    if (n > (1ull << 40) || (n != 0 && elems > (1ull << 50) / n))
      fail(file, where + ": shape is too large");
    elems *= n;
    t.shape.push_back((int64_t)n);
  }
  const json& off = e["data_offsets"];
  if (!off.is_array() || off.size() != 2) fail(file, where + ": data_offsets must be [begin, end]");
  const uint64_t begin = header_uint(off[0], file, where + ": data_offsets[0]");
  const uint64_t end = header_uint(off[1], file, where + ": data_offsets[1]");
  if (begin > end || end > buffer.size())
    fail(file, where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                   "] lie outside the " + std::to_string(buffer.size()) + "-byte data buffer");
  if (end - begin != elems * dt->bytes)
    fail(file, where + ": " + std::to_string(end - begin) + " bytes for " + std::to_string(elems) +
                   " " + t.dtype_name + " values (expected " + std::to_string(elems * dt->bytes) +
                   ")");
  t.data = buffer.data() + begin;
  t.nbytes = end - begin;
  return t;
}

}  // namespace

int64_t Tensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const Tensor* File::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

File File::open(const std::string& path) {
  auto map = std::make_shared<MappedFile>(path);
  File f = parse(map->bytes(), path);
  f.map_ = std::move(map);
  return f;
}

File File::parse(std::span<const uint8_t> bytes, std::string name) {
  File f;
  f.name_ = std::move(name);
  if (bytes.size() < 8)
    fail(f.name_, "file of " + std::to_string(bytes.size()) + " bytes has no header");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[(size_t)i];
  if (n > kMaxHeaderBytes)
    fail(f.name_, "header size " + std::to_string(n) + " exceeds the 100 MiB limit");
  if (n > bytes.size() - 8)
    fail(f.name_, "header size " + std::to_string(n) + " exceeds the " +
                      std::to_string(bytes.size() - 8) +
                      " bytes after the size field (truncated?)");
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), (size_t)n);
  if (json_nesting_depth(text, kMaxJsonDepth) > 3)
    fail(f.name_, "header JSON is nested too deeply");
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    fail(f.name_, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail(f.name_, "header is not a JSON object");
  const std::span<const uint8_t> buffer = bytes.subspan(8 + (size_t)n);
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) fail(f.name_, "__metadata__ is not an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) fail(f.name_, "__metadata__ value of '" + mk + "' is not a string");
        f.metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    f.index_[key] = f.tensors_.size();
    f.tensors_.push_back(read_entry(f.name_, key, value, buffer));
  }
  // No two tensors may share bytes (a crafted header could alias one tensor's data).
  std::vector<const Tensor*> order;
  for (const Tensor& t : f.tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const Tensor* a, const Tensor* b) { return a->data < b->data; });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i - 1]->data + order[i - 1]->nbytes > order[i]->data)
      fail(f.name_, "tensors '" + order[i - 1]->name + "' and '" + order[i]->name + "' overlap");
  return f;
}

}  // namespace hablar::safetensors
