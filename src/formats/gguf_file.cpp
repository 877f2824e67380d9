// GgufFile accessors and Value helpers.
#include <cstring>
#include <limits>

#include "core/error.h"
#include "formats/gguf.h"

namespace hablar::gguf {

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8:
      return "u8";
    case ValueType::I8:
      return "i8";
    case ValueType::U16:
      return "u16";
    case ValueType::I16:
      return "i16";
    case ValueType::U32:
      return "u32";
    case ValueType::I32:
      return "i32";
    case ValueType::F32:
      return "f32";
    case ValueType::BOOL:
      return "bool";
    case ValueType::STRING:
      return "string";
    case ValueType::ARRAY:
      return "array";
    case ValueType::U64:
      return "u64";
    case ValueType::I64:
      return "i64";
    case ValueType::F64:
      return "f64";
  }
  return "unknown";
}

size_t value_type_size(ValueType t) {
  switch (t) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::BOOL:
      return 1;
    case ValueType::U16:
    case ValueType::I16:
      return 2;
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::F32:
      return 4;
    case ValueType::U64:
    case ValueType::I64:
    case ValueType::F64:
      return 8;
    case ValueType::STRING:
    case ValueType::ARRAY:
      return 0;
  }
  return 0;
}

namespace {

template <typename T>
T load_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
void store_le(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof v);
  std::memcpy(out.data() + at, &v, sizeof v);
}

// Appends a scalar Value's payload in its packed form.
void pack_scalar(std::vector<uint8_t>& out, const Value& v) {
  switch (v.type) {
    case ValueType::U8:
      return store_le<uint8_t>(out, (uint8_t)std::get<uint64_t>(v.data));
    case ValueType::I8:
      return store_le<int8_t>(out, (int8_t)std::get<int64_t>(v.data));
    case ValueType::U16:
      return store_le<uint16_t>(out, (uint16_t)std::get<uint64_t>(v.data));
    case ValueType::I16:
      return store_le<int16_t>(out, (int16_t)std::get<int64_t>(v.data));
    case ValueType::U32:
      return store_le<uint32_t>(out, (uint32_t)std::get<uint64_t>(v.data));
    case ValueType::I32:
      return store_le<int32_t>(out, (int32_t)std::get<int64_t>(v.data));
    case ValueType::U64:
      return store_le<uint64_t>(out, std::get<uint64_t>(v.data));
    case ValueType::I64:
      return store_le<int64_t>(out, std::get<int64_t>(v.data));
    case ValueType::F32:
      return store_le<float>(out, (float)std::get<double>(v.data));
    case ValueType::F64:
      return store_le<double>(out, std::get<double>(v.data));
    case ValueType::BOOL:
      return store_le<uint8_t>(out, std::get<bool>(v.data) ? 1 : 0);
    case ValueType::STRING:
    case ValueType::ARRAY:
      break;
  }
  throw_error(ErrorKind::kInvalidArgument, "GGUF: a string or array cannot be packed");
}

}  // namespace

size_t Array::size() const {
  return is_packed_type(elem_type) ? packed.size() / value_type_size(elem_type) : items.size();
}

Value Array::at(size_t i) const {
  if (i >= size())
    throw_error(ErrorKind::kInvalidArgument, "GGUF array index " + std::to_string(i) +
                                                 " out of range (size " + std::to_string(size()) +
                                                 ")");
  if (!is_packed_type(elem_type)) return items[i];
  const uint8_t* p = packed.data() + i * value_type_size(elem_type);
  const ValueType t = elem_type;
  switch (t) {
    case ValueType::U8:
      return {t, uint64_t{load_le<uint8_t>(p)}};
    case ValueType::I8:
      return {t, int64_t{load_le<int8_t>(p)}};
    case ValueType::U16:
      return {t, uint64_t{load_le<uint16_t>(p)}};
    case ValueType::I16:
      return {t, int64_t{load_le<int16_t>(p)}};
    case ValueType::U32:
      return {t, uint64_t{load_le<uint32_t>(p)}};
    case ValueType::I32:
      return {t, int64_t{load_le<int32_t>(p)}};
    case ValueType::U64:
      return {t, load_le<uint64_t>(p)};
    case ValueType::I64:
      return {t, load_le<int64_t>(p)};
    case ValueType::F32:
      return {t, double{load_le<float>(p)}};
    case ValueType::F64:
      return {t, load_le<double>(p)};
    case ValueType::BOOL:
      return {t, *p != 0};
    default:
      break;
  }
  return {};
}

Value Value::array(ValueType elem, std::vector<Value> items) {
  Array a{elem, {}, {}};
  if (!Array::is_packed_type(elem)) {
    a.items = std::move(items);
    return {ValueType::ARRAY, std::move(a)};
  }
  a.packed.reserve(items.size() * value_type_size(elem));
  for (const Value& v : items) {
    if (v.type != elem)
      throw_error(ErrorKind::kInvalidArgument, "GGUF array item type differs from its array's");
    pack_scalar(a.packed, v);
  }
  return {ValueType::ARRAY, std::move(a)};
}

Value Value::string_array(const std::vector<std::string>& items) {
  std::vector<Value> v;
  v.reserve(items.size());
  for (const auto& s : items) v.push_back(Value::string(s));
  return array(ValueType::STRING, std::move(v));
}
Value Value::f32_array(const std::vector<float>& items) {
  Array a{ValueType::F32, {}, std::vector<uint8_t>(items.size() * sizeof(float))};
  if (!items.empty()) std::memcpy(a.packed.data(), items.data(), a.packed.size());
  return {ValueType::ARRAY, std::move(a)};
}
Value Value::i32_array(const std::vector<int32_t>& items) {
  Array a{ValueType::I32, {}, std::vector<uint8_t>(items.size() * sizeof(int32_t))};
  if (!items.empty()) std::memcpy(a.packed.data(), items.data(), a.packed.size());
  return {ValueType::ARRAY, std::move(a)};
}

int64_t TensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return dims.empty() ? 0 : n;
}

std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

const Value* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const Value& GgufFile::require(std::string_view key) const {
  const Value* v = find(key);
  if (!v) throw_error(ErrorKind::kFormat, name_ + ": key " + std::string(key) + " missing");
  return *v;
}

void GgufFile::fail_key(std::string_view key, const Value& v, std::string_view want) const {
  throw_error(ErrorKind::kFormat, name_ + ": key " + std::string(key) + " is " +
                                      std::string(value_type_name(v.type)) + ", expected " +
                                      std::string(want));
}

uint64_t GgufFile::get_uint(std::string_view key) const {
  const Value& v = require(key);
  if (auto* u = std::get_if<uint64_t>(&v.data)) return *u;
  if (auto* i = std::get_if<int64_t>(&v.data)) {
    if (*i < 0)
      throw_error(ErrorKind::kFormat, name_ + ": key " + std::string(key) + " is negative (" +
                                          std::to_string(*i) + "), expected unsigned");
    return (uint64_t)*i;
  }
  fail_key(key, v, "an unsigned integer");
}

int64_t GgufFile::get_int(std::string_view key) const {
  const Value& v = require(key);
  if (auto* i = std::get_if<int64_t>(&v.data)) return *i;
  if (auto* u = std::get_if<uint64_t>(&v.data)) {
    if (*u > (uint64_t)std::numeric_limits<int64_t>::max())
      throw_error(ErrorKind::kFormat, name_ + ": key " + std::string(key) + " is out of range");
    return (int64_t)*u;
  }
  fail_key(key, v, "an integer");
}

double GgufFile::get_float(std::string_view key) const {
  const Value& v = require(key);
  if (auto* d = std::get_if<double>(&v.data)) return *d;
  fail_key(key, v, "f32");
}

bool GgufFile::get_bool(std::string_view key) const {
  const Value& v = require(key);
  if (auto* b = std::get_if<bool>(&v.data)) return *b;
  fail_key(key, v, "bool");
}

const std::string& GgufFile::get_string(std::string_view key) const {
  const Value& v = require(key);
  if (auto* s = std::get_if<std::string>(&v.data)) return *s;
  fail_key(key, v, "string");
}

const Array& GgufFile::get_array(std::string_view key) const {
  const Value& v = require(key);
  if (auto* a = std::get_if<Array>(&v.data)) return *a;
  fail_key(key, v, "array");
}

std::vector<std::string> GgufFile::get_string_array(std::string_view key) const {
  const Array& a = get_array(key);
  if (a.elem_type != ValueType::STRING)
    throw_error(ErrorKind::kFormat, name_ + ": key " + std::string(key) + " is array of " +
                                        std::string(value_type_name(a.elem_type)) +
                                        ", expected array of string");
  std::vector<std::string> out;
  out.reserve(a.items.size());
  for (const Value& v : a.items) out.push_back(std::get<std::string>(v.data));
  return out;
}

std::vector<float> GgufFile::get_f32_array(std::string_view key) const {
  const Array& a = get_array(key);
  std::vector<float> out;
  out.reserve(a.size());
  if (a.elem_type == ValueType::F32) {  // the common case, straight from the packed bytes
    out.resize(a.size());
    if (!out.empty()) std::memcpy(out.data(), a.packed.data(), a.packed.size());
    return out;
  }
  for (size_t k = 0; k < a.size(); ++k) {
    const Value v = a.at(k);
    if (auto* d = std::get_if<double>(&v.data))
      out.push_back((float)*d);
    else if (auto* i = std::get_if<int64_t>(&v.data))
      out.push_back((float)*i);
    else if (auto* u = std::get_if<uint64_t>(&v.data))
      out.push_back((float)*u);
    else
      throw_error(ErrorKind::kFormat, name_ + ": key " + std::string(key) + " is array of " +
                                          std::string(value_type_name(a.elem_type)) +
                                          ", expected array of numbers");
  }
  return out;
}

std::vector<int32_t> GgufFile::get_i32_array(std::string_view key) const {
  const Array& a = get_array(key);
  std::vector<int32_t> out;
  out.reserve(a.size());
  constexpr int64_t lo = std::numeric_limits<int32_t>::min();
  constexpr int64_t hi = std::numeric_limits<int32_t>::max();
  for (size_t k = 0; k < a.size(); ++k) {
    const Value v = a.at(k);
    const auto* i = std::get_if<int64_t>(&v.data);
    const auto* u = std::get_if<uint64_t>(&v.data);
    if ((i && (*i < lo || *i > hi)) || (u && *u > (uint64_t)hi))
      throw_error(ErrorKind::kFormat, name_ + ": key " + std::string(key) + " item " +
                                          std::to_string(k) + " does not fit in i32");
    if (i)
      out.push_back((int32_t)*i);
    else if (u)
      out.push_back((int32_t)*u);
    else
      throw_error(ErrorKind::kFormat, name_ + ": key " + std::string(key) + " is array of " +
                                          std::string(value_type_name(a.elem_type)) +
                                          ", expected array of integers");
  }
  return out;
}

std::optional<uint64_t> GgufFile::uint_or_none(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_uint(key);
}
uint64_t GgufFile::get_uint_or(std::string_view key, uint64_t fallback) const {
  return has(key) ? get_uint(key) : fallback;
}
double GgufFile::get_float_or(std::string_view key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}
bool GgufFile::get_bool_or(std::string_view key, bool fallback) const {
  return has(key) ? get_bool(key) : fallback;
}
std::string GgufFile::get_string_or(std::string_view key, std::string fallback) const {
  return has(key) ? get_string(key) : fallback;
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& GgufFile::tensor(std::string_view name) const {
  const TensorInfo* t = find_tensor(name);
  if (!t) throw_error(ErrorKind::kFormat, name_ + ": tensor " + std::string(name) + " missing");
  return *t;
}

}  // namespace hablar::gguf
