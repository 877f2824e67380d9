// Python string formatting on Jinja values: the `%` operator (printf style) and str.format,
// covering the conversions templates use (s r d i f e g x o c %, widths, precision, alignment).
#include "chat/jinja_format.h"

#include "chat/jinja_error.h"

#include <cmath>
#include <cstdio>

namespace hablar::chat::jinja {
namespace {

struct Spec {
  char fill = ' ';
  char align = '\0';  // '<' '>' '^' or '\0' (type default)
  char sign = '-';
  bool zero = false;
  bool alternate = false;
  int width = -1;
  int precision = -1;
  char type = '\0';
};

std::string pad(std::string body, const Spec& spec, bool numeric) {
  std::size_t len = utf8_length(body);
  if (spec.width < 0 || len >= static_cast<std::size_t>(spec.width)) return body;
  std::size_t n = static_cast<std::size_t>(spec.width) - len;
  char align = spec.align ? spec.align : (numeric ? '>' : '<');
  if (spec.zero && !spec.align && numeric) {
    std::size_t sign =
        (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) ? 1 : 0;
    return body.substr(0, sign) + std::string(n, '0') + body.substr(sign);
  }
  if (align == '<') return body + std::string(n, spec.fill);
  if (align == '^') return std::string(n / 2, spec.fill) + body + std::string(n - n / 2, spec.fill);
  return std::string(n, spec.fill) + body;
}

double number_of(const Value& v, char type) {
  if (!v.is_number())
    throw JinjaError(std::string("%") + type + " format: a real number is required, not " +
                     python_type_name(v));
  return v.as_double();
}

std::string format_one(const Value& v, const Spec& spec) {
  char type = spec.type;
  std::string sign_prefix;
  auto signed_text = [&](double x, std::string digits) {
    if (x < 0 || (x == 0 && std::signbit(x) && type != 'd')) return "-" + digits;
    if (spec.sign == '+') return "+" + digits;
    if (spec.sign == ' ') return " " + digits;
    return digits;
  };
  switch (type) {
    case '\0':
      if (v.is_float() && spec.precision >= 0) break;
      [[fallthrough]];
    case 's': {
      std::string s = to_str(v);
      if (spec.precision >= 0) {
        auto cps = utf8_decode(s);
        if (cps.size() > static_cast<std::size_t>(spec.precision)) {
          std::string cut;
          for (int i = 0; i < spec.precision; ++i)
            utf8_append(cut, cps[static_cast<std::size_t>(i)]);
          s = cut;
        }
      }
      return pad(s, spec, v.is_number() && type == '\0');
    }
    case 'r':
      return pad(to_repr(v), spec, false);
    case 'd':
    case 'i': {
      if (!v.is_number())
        throw JinjaError("%d format: a real number is required, not " + python_type_name(v));
      std::int64_t i = v.is_float() ? static_cast<std::int64_t>(v.as_double()) : v.as_int();
      return pad(signed_text(static_cast<double>(i), std::to_string(i < 0 ? -i : i)), spec, true);
    }
    case 'x':
    case 'X':
    case 'o': {
      if (!v.is_int() && !v.is_bool())
        throw JinjaError(std::string("%") + type + " format: an integer is required");
      std::int64_t i = v.as_int();
      char buf[32];
      std::snprintf(buf, sizeof buf,
                    type == 'o'   ? "%llo"
                    : type == 'x' ? "%llx"
                                  : "%llX",
                    static_cast<unsigned long long>(i < 0 ? -i : i));
      return pad(signed_text(static_cast<double>(i), buf), spec, true);
    }
    case 'c': {
      std::string s;
      if (v.is_int())
        utf8_append(s, static_cast<std::uint32_t>(v.as_int()));
      else
        s = to_str(v);
      return pad(s, spec, false);
    }
    default:
      break;
  }
  double x = number_of(v, type ? type : 'g');
  char conv = type ? type : 'g';
  if (conv != 'f' && conv != 'F' && conv != 'e' && conv != 'E' && conv != 'g' && conv != 'G' &&
      conv != '%')
    throw JinjaError(std::string("unsupported format character '") + conv + "'");
  if (conv == '%') x *= 100;
  int precision = spec.precision >= 0 ? spec.precision : 6;
  char fmt[16];
  std::snprintf(fmt, sizeof fmt, "%%%s.%d%c", spec.alternate ? "#" : "", precision,
                conv == '%' ? 'f' : conv);
  char buf[512];
  std::snprintf(buf, sizeof buf, fmt, std::fabs(x));
  std::string body = buf;
  if (conv == '%') body += '%';
  return pad(signed_text(x, body), spec, true);
}

}  // namespace

std::string percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> items;
  const Value* mapping = nullptr;
  if (args.kind() == Kind::kTuple) {
    items = args.items();
  } else {
    // A mapping serves %(name)s; a lone %s shows the mapping itself.
    if (args.is_dict() || args.is_undefined()) mapping = &args;
    items.push_back(args);
  }
  std::size_t next = 0;
  std::string out;
  for (std::size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) throw JinjaError("incomplete format");
    Value named;
    bool has_name = false;
    if (fmt[i] == '(') {
      std::size_t close = fmt.find(')', i);
      if (close == std::string::npos || !mapping) throw JinjaError("format requires a mapping");
      if (mapping->is_undefined()) throw JinjaError(mapping->undefined_message());
      const Value* v = mapping->as_dict().find(fmt.substr(i + 1, close - i - 1));
      if (!v) throw JinjaError("'" + fmt.substr(i + 1, close - i - 1) + "'");
      named = *v;
      has_name = true;
      i = close + 1;
    }
    Spec spec;
    for (; i < fmt.size() && std::string_view("-+ 0#").find(fmt[i]) != std::string_view::npos;
         ++i) {
      if (fmt[i] == '-')
        spec.align = '<';
      else if (fmt[i] == '0')
        spec.zero = true;
      else if (fmt[i] == '#')
        spec.alternate = true;
      else
        spec.sign = fmt[i];
    }
    for (; i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i])); ++i)
      spec.width = (spec.width < 0 ? 0 : spec.width * 10) + (fmt[i] - '0');
    if (i < fmt.size() && fmt[i] == '.') {
      spec.precision = 0;
      for (++i; i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i])); ++i)
        spec.precision = spec.precision * 10 + (fmt[i] - '0');
    }
    if (i >= fmt.size()) throw JinjaError("incomplete format");
    spec.type = fmt[i];
    if (spec.type == '%') {
      out += '%';
      continue;
    }
    if (spec.type == 'u') spec.type = 'd';
    // printf-style fields right-align every conversion unless '-' asks otherwise; '0' pads
    // numbers (not strings) with zeros after their sign.
    const bool text = spec.type == 's' || spec.type == 'r' || spec.type == 'a' || spec.type == 'c';
    if (spec.align == '\0' && (!spec.zero || text)) spec.align = '>';
    if (!has_name) {
      if (next >= items.size()) throw JinjaError("not enough arguments for format string");
      named = items[next++];
    }
    if (spec.type == 'f' || spec.type == 'F' || spec.type == 'e' || spec.type == 'E' ||
        spec.type == 'g' || spec.type == 'G' || spec.type == 'd' || spec.type == 'i' ||
        spec.type == 'x' || spec.type == 'X' || spec.type == 'o' || spec.type == 's' ||
        spec.type == 'r' || spec.type == 'c' || spec.type == 'a')
      out += format_one(named, spec);
    else
      throw JinjaError(std::string("unsupported format character '") + spec.type + "'");
  }
  if (!mapping && next < items.size())
    throw JinjaError("not all arguments converted during string formatting");
  return out;
}

namespace {

Spec parse_format_spec(const std::string& s) {
  Spec spec;
  std::size_t i = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (s.size() >= 2 && is_align(s[1])) {
    spec.fill = s[0];
    spec.align = s[1] == '=' ? '>' : s[1];
    i = 2;
  } else if (!s.empty() && is_align(s[0])) {
    spec.align = s[0] == '=' ? '>' : s[0];
    i = 1;
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) spec.sign = s[i++];
  if (i < s.size() && s[i] == '#') spec.alternate = true, ++i;
  if (i < s.size() && s[i] == '0') spec.zero = true, ++i;
  for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i)
    spec.width = (spec.width < 0 ? 0 : spec.width * 10) + (s[i] - '0');
  if (i < s.size() && s[i] == ',') ++i;  // thousands separators are not reproduced
  if (i < s.size() && s[i] == '.') {
    spec.precision = 0;
    for (++i; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i)
      spec.precision = spec.precision * 10 + (s[i] - '0');
  }
  if (i < s.size()) spec.type = s[i++];
  if (i != s.size()) throw JinjaError("Invalid format specifier '" + s + "'");
  return spec;
}

}  // namespace

std::string brace_format(const std::string& fmt, const CallArgs& args) {
  std::string out;
  std::size_t auto_index = 0;
  char numbering = '\0';  // 'a' automatic {} or 'm' manual {0}: Python refuses mixing them
  for (std::size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}')
        ++i;
      else
        throw JinjaError("Single '}' encountered in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    std::size_t close = fmt.find('}', i);
    if (close == std::string::npos) throw JinjaError("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    i = close;
    std::string spec_text;
    char conversion = '\0';
    if (std::size_t colon = field.find(':'); colon != std::string::npos) {
      spec_text = field.substr(colon + 1);
      field.resize(colon);
    }
    if (std::size_t bang = field.find('!'); bang != std::string::npos) {
      conversion = bang + 1 < field.size() ? field[bang + 1] : 's';
      field.resize(bang);
    }
    const Value* v = nullptr;
    bool automatic = field.empty();
    bool manual = !field.empty() && std::all_of(field.begin(), field.end(), ::isdigit);
    if ((automatic && numbering == 'm') || (manual && numbering == 'a'))
      throw JinjaError(
          automatic ? "cannot switch from manual field specification to automatic field numbering"
                    : "cannot switch from automatic field numbering to manual field specification");
    if (automatic) numbering = 'a';
    if (manual) numbering = 'm';
    if (field.empty()) {
      if (auto_index >= args.positional.size())
        throw JinjaError("Replacement index " + std::to_string(auto_index) +
                         " out of range for positional args tuple");
      v = &args.positional[auto_index++];
    } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
      std::size_t k = std::stoul(field);
      if (k >= args.positional.size())
        throw JinjaError("Replacement index " + field + " out of range for positional args tuple");
      v = &args.positional[k];
    } else {
      for (const auto& [name, value] : args.keyword)
        if (name == field) v = &value;
      if (!v) throw JinjaError("'" + field + "'");
    }
    Value shown = conversion == 'r'   ? Value(to_repr(*v))
                  : conversion == 's' ? Value(to_str(*v))
                                      : *v;
    out += format_one(shown, parse_format_spec(spec_text));
  }
  return out;
}

}  // namespace hablar::chat::jinja
