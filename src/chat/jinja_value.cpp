// Python semantics of Jinja values: str(), repr(), ==, truthiness and json.dumps.
#include "chat/jinja_value.h"

#include "chat/jinja_error.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace hablar::chat::jinja {

namespace {

const Value* find_encoded(const std::vector<std::pair<std::string, Value>>& entries,
                          std::string_view key) {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void set_encoded(std::vector<std::pair<std::string, Value>>& entries, std::string key,
                 Value value) {
  for (auto& [k, v] : entries)
    if (k == key) {
      v = std::move(value);
      return;
    }
  entries.emplace_back(std::move(key), std::move(value));
}

}  // namespace

std::string dict_key(std::string_view key) {
  if (key.empty() || key[0] != '\0') return std::string(key);
  return std::string("\0s", 2) + std::string(key);
}

std::string dict_key(const Value& key) {
  const std::string tag(1, '\0');
  switch (key.kind()) {
    case Kind::kString:
      return dict_key(std::string_view(key.as_string()));
    case Kind::kBool:
      return tag + "i" + (key.as_bool() ? "1" : "0");
    case Kind::kInt:
      return tag + "i" + std::to_string(key.as_int());
    case Kind::kFloat: {
      const double f = key.as_double();
      if (std::isfinite(f) && f == std::floor(f) && std::fabs(f) < 9.2e18)
        return tag + "i" + std::to_string((std::int64_t)f);
      return tag + "f" + float_repr(f);
    }
    case Kind::kNone:
      return tag + "n";
    default:
      throw JinjaError("unhashable type: '" + python_type_name(key) + "'");
  }
}

Value dict_key_value(const std::string& encoded) {
  if (encoded.empty() || encoded[0] != '\0') return Value(encoded);
  const std::string text = encoded.substr(2);
  switch (encoded.size() > 1 ? encoded[1] : 's') {
    case 'i':
      return Value((std::int64_t)std::stoll(text));
    case 'f':
      return Value(std::stod(text));
    case 'n':
      return Value::none();
    default:
      return Value(text);
  }
}

std::string dict_key_json_text(const std::string& encoded) {
  if (encoded.empty() || encoded[0] != '\0') return encoded;
  const Value key = dict_key_value(encoded);
  return key.is_none() ? "null" : to_str(key);
}

const Value* Dict::find(std::string_view key) const {
  if (!key.empty() && key[0] == '\0') return find_encoded(entries, dict_key(key));
  return find_encoded(entries, key);
}

Value* Dict::find(std::string_view key) {
  return const_cast<Value*>(std::as_const(*this).find(key));
}

void Dict::set(std::string key, Value value) {
  set_encoded(entries, dict_key(std::string_view(key)), std::move(value));
}

const Value* Dict::find_key(const Value& key) const {
  return find_encoded(entries, dict_key(key));
}

void Dict::set_key(const Value& key, Value value) {
  set_encoded(entries, dict_key(key), std::move(value));
}

const Value* CallArgs::get(std::size_t index, std::string_view name) const {
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  if (index < positional.size()) return &positional[index];
  return nullptr;
}

bool Value::same_object(const Value& other) const {
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kBool:
    case Kind::kInt:
      return int_ == other.int_;
    case Kind::kFloat:
      return float_ == other.float_;
    case Kind::kString:
      return str_ == other.str_;
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kGenerator:
      return list_ == other.list_;
    case Kind::kDict:
    case Kind::kNamespace:
      return dict_ == other.dict_;
    case Kind::kCallable:
      return callable_ == other.callable_;
  }
  return false;
}

std::string python_type_name(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return v.is_safe() ? "Markup" : "str";
    case Kind::kList:
      return "list";
    case Kind::kTuple:
      return "tuple";
    case Kind::kGenerator:
      return "generator";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kCallable:
      return v.as_callable().type_name;
  }
  return "object";
}

std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  return python_type_name(v) + " object";
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
    case Kind::kInt:
      return v.as_int() != 0;
    case Kind::kFloat:
      return v.as_double() != 0.0;
    case Kind::kString:
      return !v.as_string().empty();
    case Kind::kList:
    case Kind::kTuple:
      return !v.items().empty();
    case Kind::kDict:
      return !v.as_dict().entries.empty();
    case Kind::kGenerator:
    case Kind::kNamespace:
    case Kind::kCallable:
      return true;
  }
  return false;
}

std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  std::size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int exponent = std::stoi(sci.substr(e_pos + 1));
  int decpt = exponent + 1;  // digits d1d2... with the decimal point after decpt of them
  int n = static_cast<int>(digits.size());
  std::string out;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out = "0." + std::string(-decpt, '0') + digits;
    } else if (decpt >= n) {
      out = digits + std::string(decpt - n, '0') + ".0";
    } else {
      out = digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
  } else {
    out = digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    int e = decpt - 1;
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    out += ebuf;
  }
  return sign + out;
}

std::vector<std::uint32_t> utf8_decode(std::string_view s) {
  std::vector<std::uint32_t> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(s.size());
  while (left > 0) {
    utf8proc_int32_t cp = 0;
    utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
    if (n <= 0) {  // invalid byte: keep it as U+FFFD, advance one byte
      cp = 0xFFFD;
      n = 1;
    }
    out.push_back(static_cast<std::uint32_t>(cp));
    p += n;
    left -= n;
  }
  return out;
}

void utf8_append(std::string& out, std::uint32_t cp) {
  utf8proc_uint8_t buf[4];
  utf8proc_ssize_t n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<std::size_t>(n));
}

std::size_t utf8_length(std::string_view s) {
  std::size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool is_python_space(std::uint32_t cp) {
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F)) return true;
  if (cp < 0x80) return false;
  if (cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A)) return true;
  return cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

namespace {

bool is_printable(std::uint32_t cp) {
  if (cp == ' ') return true;
  if (cp < 0x20 || cp == 0x7F) return false;
  if (cp < 0x7F) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
      return false;
    default:
      return true;
  }
}

std::string string_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (std::uint32_t cp : utf8_decode(s)) {
    if (cp == static_cast<std::uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (!is_printable(cp)) {
      char buf[16];
      if (cp < 0x100)
        std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      else if (cp < 0x10000)
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      else
        std::snprintf(buf, sizeof buf, "\\U%08x", cp);
      out += buf;
    } else {
      utf8_append(out, cp);
    }
  }
  out += quote;
  return out;
}

std::string sequence_repr(const Value& v) {
  bool tuple = v.kind() == Kind::kTuple;
  std::string out = tuple ? "(" : "[";
  const auto& items = v.items();
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += to_repr(items[i]);
  }
  if (tuple && items.size() == 1) out += ",";
  out += tuple ? ")" : "]";
  return out;
}

std::string dict_repr(const Dict& d) {
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : d.entries) {
    if (!first) out += ", ";
    first = false;
    out += to_repr(dict_key_value(k)) + ": " + to_repr(v);
  }
  return out + "}";
}

}  // namespace

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return v.as_string();
    default:
      return to_repr(v);
  }
}

std::string to_repr(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return v.as_bool() ? "True" : "False";
    case Kind::kInt:
      return std::to_string(v.as_int());
    case Kind::kFloat:
      return float_repr(v.as_double());
    case Kind::kString:
      return string_repr(v.as_string());
    case Kind::kList:
    case Kind::kTuple:
      return sequence_repr(v);
    case Kind::kGenerator:
      return "<generator object>";
    case Kind::kDict:
      return dict_repr(v.as_dict());
    case Kind::kNamespace:
      return "<Namespace " + dict_repr(v.as_dict()) + ">";
    case Kind::kCallable:
      return "<" + v.as_callable().type_name + " " + v.as_callable().name + ">";
  }
  return "";
}

bool values_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.as_string() == b.as_string();
    case Kind::kList:
    case Kind::kTuple: {
      const auto& x = a.items();
      const auto& y = b.items();
      if (x.size() != y.size()) return false;
      for (std::size_t i = 0; i < x.size(); ++i)
        if (!values_equal(x[i], y[i])) return false;
      return true;
    }
    case Kind::kDict: {
      const auto& x = a.as_dict().entries;
      if (x.size() != b.as_dict().entries.size()) return false;
      for (const auto& [k, v] : x) {
        const Value* other = b.as_dict().find(k);
        if (!other || !values_equal(v, *other)) return false;
      }
      return true;
    }
    default:
      return a.same_object(b);
  }
}

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (std::uint32_t cp : utf8_decode(s)) {
    switch (cp) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default: {
        char buf[16];
        if (cp < 0x20 || (ensure_ascii && cp > 0x7E)) {
          if (cp >= 0x10000) {
            std::uint32_t v = cp - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10),
                          0xDC00 + (v & 0x3FF));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", cp);
          }
          out += buf;
        } else {
          utf8_append(out, cp);
        }
      }
    }
  }
  out += '"';
}

void json_newline(std::string& out, const JsonDumpOptions& o, int depth) {
  if (o.indent < 0) return;
  out += '\n';
  out.append(static_cast<std::size_t>(o.indent * depth), ' ');
}

void json_dump_into(std::string& out, const Value& v, const JsonDumpOptions& o, int depth) {
  if (depth > 500) throw JinjaError("RecursionError: maximum recursion depth exceeded in tojson");
  switch (v.kind()) {
    case Kind::kNone:
      out += "null";
      return;
    case Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Kind::kFloat: {
      double f = v.as_double();
      if (std::isnan(f))
        out += "NaN";
      else if (std::isinf(f))
        out += f < 0 ? "-Infinity" : "Infinity";
      else
        out += float_repr(f);
      return;
    }
    case Kind::kString:
      json_string(out, v.as_string(), o.ensure_ascii);
      return;
    case Kind::kList:
    case Kind::kTuple: {
      const auto& items = v.items();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_separator;
        json_newline(out, o, depth + 1);
        json_dump_into(out, items[i], o, depth + 1);
      }
      json_newline(out, o, depth);
      out += ']';
      return;
    }
    case Kind::kDict: {
      const auto& entries = v.as_dict().entries;
      if (entries.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> order;
      for (const auto& e : entries) order.push_back(&e);
      if (o.sort_keys)
        std::stable_sort(order.begin(), order.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (std::size_t i = 0; i < order.size(); ++i) {
        if (i) out += o.item_separator;
        json_newline(out, o, depth + 1);
        json_string(out, dict_key_json_text(order[i]->first), o.ensure_ascii);
        out += o.key_separator;
        json_dump_into(out, order[i]->second, o, depth + 1);
      }
      json_newline(out, o, depth);
      out += '}';
      return;
    }
    default:
      throw JinjaError("Object of type " + python_type_name(v) + " is not JSON serializable");
  }
}

// Converts recursively, one level per call; data deeper than this is refused rather than
// risking the stack (requests are limited to kMaxJsonDepth long before this).
constexpr int kMaxValueDepth = 256;

template <typename Json>
Value value_from_json(const Json& j, int depth = 0) {
  if (depth > kMaxValueDepth)
    throw JinjaError("JSON value nested more than " + std::to_string(kMaxValueDepth) +
                     " levels deep");
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(static_cast<std::int64_t>(j.template get<std::int64_t>()));
    case nlohmann::json::value_t::number_unsigned: {
      auto u = j.template get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<std::int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(value_from_json(e, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      d.entries.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it)
        d.entries.emplace_back(it.key(), value_from_json(it.value(), depth + 1));
      return Value::dict(std::move(d));
    }
    default:
      return Value::none();  // binary / discarded: not produced by JSON text
  }
}

}  // namespace

std::string json_dumps(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  json_dump_into(out, v, options, 0);
  return out;
}

Value from_json(const nlohmann::json& j) {
  return value_from_json(j);
}
Value from_json(const nlohmann::ordered_json& j) {
  return value_from_json(j);
}

}  // namespace hablar::chat::jinja
