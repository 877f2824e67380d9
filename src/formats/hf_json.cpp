// Checked JSON access for Hugging Face files (see hf_json.h).
#include "formats/hf_json.h"

#include "core/error.h"
#include "core/json_depth.h"
#include "formats/hf_model.h"

namespace hablar::formats {

using nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& where, const char* key, const char* want) {
  throw_error(ErrorKind::kFormat, where + ": \"" + key + "\" must be " + want);
}

const json* member(const json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

}  // namespace

json parse_json_text(std::string_view text, const std::string& name) {
  if (json_nesting_depth(text, kMaxJsonDepth) > kMaxJsonDepth)
    throw_error(ErrorKind::kFormat,
                name + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw_error(ErrorKind::kFormat, name + ": not valid JSON: " + e.what());
  }
}

json parse_json_file(const std::string& path, size_t max_bytes) {
  return parse_json_text(read_small_file(path, max_bytes), path);
}

std::string json_string_or(const json& j, const char* key, std::string fallback,
                           const std::string& where) {
  const json* v = member(j, key);
  if (!v) return fallback;
  if (!v->is_string()) bad(where, key, "a string");
  return v->get<std::string>();
}

double json_number_or(const json& j, const char* key, double fallback, const std::string& where) {
  const json* v = member(j, key);
  if (!v) return fallback;
  if (!v->is_number()) bad(where, key, "a number");
  return v->get<double>();
}

bool json_bool_or(const json& j, const char* key, bool fallback, const std::string& where) {
  const json* v = member(j, key);
  if (!v) return fallback;
  if (!v->is_boolean()) bad(where, key, "true or false");
  return v->get<bool>();
}

int64_t json_int_or(const json& j, const char* key, int64_t fallback, const std::string& where) {
  const json* v = member(j, key);
  if (!v) return fallback;
  if (!v->is_number_integer()) bad(where, key, "an integer");
  if (v->is_number_unsigned() && v->get<uint64_t>() > (uint64_t)INT64_MAX)
    bad(where, key, "an integer in range");
  return v->get<int64_t>();
}

int64_t json_positive_int(const json& j, const char* key, const std::string& where) {
  const json* v = member(j, key);
  if (!v) throw_error(ErrorKind::kFormat, where + ": \"" + key + "\" is missing");
  const int64_t n = json_int_or(j, key, 0, where);
  if (n < 1 || n > (1 << 30)) bad(where, key, "an integer in [1, 2^30]");
  return n;
}

const json* json_object_or_null(const json& j, const char* key, const std::string& where) {
  const json* v = member(j, key);
  if (v && !v->is_object()) bad(where, key, "an object");
  return v;
}

const json* json_array_or_null(const json& j, const char* key, const std::string& where) {
  const json* v = member(j, key);
  if (v && !v->is_array()) bad(where, key, "an array");
  return v;
}

}  // namespace hablar::formats
