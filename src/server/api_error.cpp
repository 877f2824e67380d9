#include "server/api_error.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "core/json_depth.h"
#include "server/request_fields.h"

namespace hablar::server {

const char* error_type_for_status(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 501:
      return "not_supported_error";
    case 503:
      return "unavailable_error";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

nlohmann::json error_body(int status, const std::string& message, const std::string& param) {
  nlohmann::json e = {{"message", message},
                      {"type", error_type_for_status(status)},
                      {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
                      {"code", status}};
  return {{"error", e}};
}

namespace {

// Anthropic names the 4xx errors as error_type_for_status does; its 5xx are "overloaded_error"
// (unavailable) and "api_error".
const char* anthropic_error_type(int status) {
  if (status == 503 || status == 529) return "overloaded_error";
  if (status >= 500) return "api_error";
  return error_type_for_status(status);
}

}  // namespace

ErrorStyle error_style_for_path(std::string_view path) {
  if (path.starts_with("/v1/messages")) return ErrorStyle::kAnthropic;
  if (path.starts_with("/api/")) return ErrorStyle::kOllama;
  return ErrorStyle::kOpenAI;
}

nlohmann::json error_body(ErrorStyle style, int status, const std::string& message,
                          const std::string& param) {
  switch (style) {
    case ErrorStyle::kAnthropic:
      return {{"type", "error"},
              {"error", {{"type", anthropic_error_type(status)}, {"message", message}}}};
    case ErrorStyle::kOllama:
      return {{"error", message}};
    default:
      return error_body(status, message, param);
  }
}

nlohmann::json error_body(ErrorStyle style, const ApiError& e) {
  nlohmann::json body = error_body(style, e.status(), e.what(), e.param());
  if (style != ErrorStyle::kOpenAI) return body;
  if (!e.type().empty()) body["error"]["type"] = e.type();
  if (e.extra().is_object()) body["error"].update(e.extra());
  return body;
}

int status_for_error_kind(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return 400;
    case ErrorKind::kNotFound:
      return 404;
    case ErrorKind::kUnsupported:
      return 400;
    case ErrorKind::kResource:
      return 503;
    default:
      return 500;
  }
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string text_excerpt(std::string_view s, size_t max_chars) {
  // Cut before a UTF-8 continuation byte never splits a character; dump_json replaces
  // invalid bytes, so the excerpt is always valid JSON text.
  size_t n = std::min(s.size(), max_chars);
  while (n > 0 && n < s.size() && ((unsigned char)s[n] & 0xC0) == 0x80) --n;
  std::string out = dump_json(nlohmann::json(std::string(s.substr(0, n))));
  if (n < s.size()) out += "...";
  return out;
}

std::string value_excerpt(const nlohmann::json& j, size_t max_chars) {
  if (j.is_string()) return text_excerpt(j.get_ref<const std::string&>(), max_chars);
  if (j.is_array()) return "a list of " + std::to_string(j.size()) + " items";
  if (j.is_object()) return "an object of " + std::to_string(j.size()) + " keys";
  std::string out = dump_json(j);  // a scalar: short already
  if (out.size() > max_chars) out = out.substr(0, max_chars) + "...";
  return out;
}

void check_json_depth(std::string_view text) {
  if (json_nesting_depth(text, kMaxJsonDepth) > kMaxJsonDepth)
    bad_request("the request body is nested more than " + std::to_string(kMaxJsonDepth) +
                " levels deep (the limit for JSON requests)");
}

nlohmann::json parse_body_json(const std::string& body) {
  check_json_depth(body);
  try {
    return nlohmann::json::parse(body);
  } catch (const nlohmann::json::exception& e) {
    // parse_error, and out_of_range for numbers past double's range (1e99999): bad input.
    // The parser's message quotes the last token read; keep only a short piece of it.
    bad_request(std::string("the request body is not valid JSON: ") + text_excerpt(e.what(), 160));
  }
}

nlohmann::json parse_body_object(const std::string& body) {
  nlohmann::json j = parse_body_json(body);
  if (!j.is_object()) bad_request("the request body must be a JSON object");
  return j;
}

namespace {
const nlohmann::json* field(const nlohmann::json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}
std::string range_text(double lo, double hi) {
  auto fmt = [](double v) {
    std::string s = nlohmann::json(v).dump();
    if (s.size() > 2 && s.substr(s.size() - 2) == ".0") s.resize(s.size() - 2);
    return s;
  };
  return fmt(lo) + " and " + fmt(hi);
}
}  // namespace

std::optional<double> opt_number(const nlohmann::json& body, const char* key, double lo,
                                 double hi) {
  const nlohmann::json* f = field(body, key);
  if (!f) return std::nullopt;
  if (!f->is_number() || f->get<double>() < lo || f->get<double>() > hi)
    bad_request(std::string("'") + key + "' must be a number between " + range_text(lo, hi) +
                    " (got " + value_excerpt(*f) + ")",
                key);
  return f->get<double>();
}

std::optional<int64_t> opt_integer(const nlohmann::json& body, const char* key, int64_t lo,
                                   int64_t hi) {
  const nlohmann::json* f = field(body, key);
  if (!f) return std::nullopt;
  // No cast before the range check: converting a double past int64's range is undefined
  // (4e86 as max_tokens; found by fuzz/chat_request_fuzz).
  const bool integral =
      f->is_number_integer() || (f->is_number_float() && std::isfinite(f->get<double>()) &&
                                 std::trunc(f->get<double>()) == f->get<double>());
  if (!integral)
    bad_request(std::string("'") + key + "' must be an integer (got " + value_excerpt(*f) + ")",
                key);
  const double v = f->get<double>();
  if (v < (double)lo || v > (double)hi || v >= 9223372036854775808.0)
    bad_request(std::string("'") + key + "' must be between " + std::to_string(lo) + " and " +
                    std::to_string(hi) + " (got " + value_excerpt(*f) + ")",
                key);
  return f->is_number_integer() ? f->get<int64_t>() : (int64_t)v;
}

std::optional<bool> opt_bool(const nlohmann::json& body, const char* key) {
  const nlohmann::json* f = field(body, key);
  if (!f) return std::nullopt;
  if (!f->is_boolean())
    bad_request(std::string("'") + key + "' must be true or false (got " + value_excerpt(*f) + ")",
                key);
  return f->get<bool>();
}

std::optional<std::string> opt_string(const nlohmann::json& body, const char* key) {
  const nlohmann::json* f = field(body, key);
  if (!f) return std::nullopt;
  if (!f->is_string())
    bad_request(std::string("'") + key + "' must be a string (got " + value_excerpt(*f) + ")", key);
  return f->get<std::string>();
}

std::vector<std::string> opt_string_list(const nlohmann::json& body, const char* key,
                                         size_t max_items) {
  const nlohmann::json* f = field(body, key);
  if (!f) return {};
  std::vector<std::string> out;
  if (f->is_string()) {
    out.push_back(f->get<std::string>());
  } else if (f->is_array()) {
    for (const auto& v : *f) {
      if (!v.is_string())
        bad_request(std::string("'") + key + "' must be a string or a list of strings", key);
      out.push_back(v.get<std::string>());
    }
  } else {
    bad_request(std::string("'") + key + "' must be a string or a list of strings", key);
  }
  if (out.size() > max_items)
    bad_request(std::string("'") + key + "' has " + std::to_string(out.size()) +
                    " entries; at most " + std::to_string(max_items) + " are allowed",
                key);
  return out;
}

// A Go duration ("5m", "1h30m", "2.5s", "300ms", "-1m", "0") in nanoseconds, as Ollama reads
// keep_alive strings; nullopt when malformed.
namespace {

std::optional<int64_t> go_duration_ns(std::string_view s) {
  static const std::pair<std::string_view, double> kUnits[] = {
      {"ns", 1},   {"us", 1e3}, {"\xC2\xB5s", 1e3}, {"\xCE\xBCs", 1e3},
      {"ms", 1e6}, {"s", 1e9},  {"m", 60e9},        {"h", 3600e9}};
  const bool negative = !s.empty() && s[0] == '-';
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  if (s == "0") return 0;
  if (s.empty()) return std::nullopt;
  double total = 0;
  while (!s.empty()) {
    size_t n = 0;
    while (n < s.size() && (std::isdigit((unsigned char)s[n]) || s[n] == '.')) ++n;
    if (n == 0 || n > 30) return std::nullopt;
    char* end = nullptr;
    const std::string number(s.substr(0, n));
    const double v = std::strtod(number.c_str(), &end);
    if (end != number.c_str() + number.size()) return std::nullopt;
    s.remove_prefix(n);
    const std::pair<std::string_view, double>* unit = nullptr;
    for (const auto& u : kUnits)  // the longest unit that matches ("ms" before "m")
      if (s.starts_with(u.first) && (!unit || u.first.size() > unit->first.size())) unit = &u;
    if (!unit) return std::nullopt;
    total += v * unit->second;
    s.remove_prefix(unit->first.size());
  }
  if (total > 9.2e18) total = 9.2e18;
  return (int64_t)(negative ? -total : total);
}

}  // namespace

// keep_alive: a number of seconds or a duration string; negative keeps the model loaded for
// good. nullopt when absent.
std::optional<int64_t> opt_keep_alive_ns(const nlohmann::json& body) {
  const auto it = body.find("keep_alive");
  if (it == body.end() || it->is_null()) return std::nullopt;
  std::optional<int64_t> ns;
  if (it->is_number()) {
    const double seconds = it->get<double>();
    if (std::isfinite(seconds)) ns = (int64_t)std::clamp(seconds * 1e9, -1.0, 9.2e18);
  } else if (it->is_string()) {
    ns = go_duration_ns(it->get<std::string>());
  }
  if (!ns)
    bad_request("'keep_alive' must be a number of seconds or a duration such as \"5m\" (got " +
                    text_excerpt(it->dump(), 40) + ")",
                "keep_alive");
  return *ns < 0 ? -1 : *ns;
}

}  // namespace hablar::server
