// Python's arithmetic and ordering on Jinja values, and the methods of str, dict and list that
// templates call (bound to their receiver). Mutating methods are refused, as jinja2's
// ImmutableSandboxedEnvironment refuses them.
#include "chat/jinja_format.h"
#include "chat/jinja_interpreter.h"
#include "chat/jinja_text.h"

#include <cmath>
#include <limits>

namespace hablar::chat::jinja {

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '\'':
        out += "&#39;";
        break;
      case '"':
        out += "&#34;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

namespace {

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  throw JinjaError("unsupported operand type(s) for " + op + ": '" + python_type_name(a) +
                   "' and '" + python_type_name(b) + "'");
}

std::int64_t checked(long double exact, std::int64_t value) {
  if (exact > static_cast<long double>(std::numeric_limits<std::int64_t>::max()) ||
      exact < static_cast<long double>(std::numeric_limits<std::int64_t>::min()))
    throw JinjaError("integer overflow");
  return value;
}

Value add(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return Value(a.as_double() + b.as_double());
    return Value(
        checked(static_cast<long double>(a.as_int()) + b.as_int(), a.as_int() + b.as_int()));
  }
  if (a.is_string() && b.is_string()) {
    if (a.is_safe() || b.is_safe()) {
      std::string left = a.is_safe() ? a.as_string() : html_escape(a.as_string());
      std::string right = b.is_safe() ? b.as_string() : html_escape(b.as_string());
      return Value(left + right, true);
    }
    return Value(a.as_string() + b.as_string());
  }
  if ((a.kind() == Kind::kList && b.kind() == Kind::kList) ||
      (a.kind() == Kind::kTuple && b.kind() == Kind::kTuple)) {
    ValueList items = a.items();
    items.insert(items.end(), b.items().begin(), b.items().end());
    return Value::list(std::move(items), a.kind());
  }
  if (a.is_string() || a.kind() == Kind::kList || a.kind() == Kind::kTuple) {
    std::string t = python_type_name(a) == "Markup" ? "str" : python_type_name(a);
    throw JinjaError("can only concatenate " + t + " (not \"" + python_type_name(b) + "\") to " +
                     t);
  }
  unsupported("+", a, b);
}

Value repeat(const Value& seq, std::int64_t n) {
  if (seq.is_string()) {
    std::string out;
    for (std::int64_t i = 0; i < n; ++i) out += seq.as_string();
    return Value(std::move(out));
  }
  ValueList items;
  for (std::int64_t i = 0; i < n; ++i)
    items.insert(items.end(), seq.items().begin(), seq.items().end());
  return Value::list(std::move(items), seq.kind() == Kind::kTuple ? Kind::kTuple : Kind::kList);
}

Value multiply(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return Value(a.as_double() * b.as_double());
    return Value(
        checked(static_cast<long double>(a.as_int()) * b.as_int(), a.as_int() * b.as_int()));
  }
  bool a_seq = a.is_string() || a.kind() == Kind::kList || a.kind() == Kind::kTuple;
  bool b_seq = b.is_string() || b.kind() == Kind::kList || b.kind() == Kind::kTuple;
  if (a_seq && (b.is_int() || b.is_bool())) return repeat(a, b.as_int());
  if (b_seq && (a.is_int() || a.is_bool())) return repeat(b, a.as_int());
  if (a_seq || b_seq)
    throw JinjaError("can't multiply sequence by non-int of type '" +
                     python_type_name(a_seq ? b : a) + "'");
  unsupported("*", a, b);
}

Value power(const Value& a, const Value& b) {
  if (!a.is_number() || !b.is_number()) unsupported("** or pow()", a, b);
  if (a.is_float() || b.is_float() || b.as_int() < 0)
    return Value(std::pow(a.as_double(), b.as_double()));
  std::int64_t base = a.as_int(), exp = b.as_int(), result = 1;
  long double exact = 1;
  for (std::int64_t i = 0; i < exp; ++i) {
    exact *= base;
    result = checked(exact, result * base);
    if (result == 0 || result == 1) break;
  }
  return Value(result);
}

std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  // str % Undefined: Python treats the Undefined as a mapping (it has __getitem__).
  if (op == "%" && a.is_string()) return Value(percent_format(a.as_string(), b));
  if (a.is_undefined()) throw JinjaError(a.undefined_message());
  if (b.is_undefined()) throw JinjaError(b.undefined_message());
  if (op == "+") return add(a, b);
  if (op == "*") return multiply(a, b);
  if (op == "**") return power(a, b);
  if (!a.is_number() || !b.is_number()) unsupported(op, a, b);
  bool use_float = a.is_float() || b.is_float();
  if (op == "-") {
    if (use_float) return Value(a.as_double() - b.as_double());
    return Value(
        checked(static_cast<long double>(a.as_int()) - b.as_int(), a.as_int() - b.as_int()));
  }
  if (op == "/") {
    if (b.as_double() == 0) throw JinjaError("division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (b.as_double() == 0)
      throw JinjaError(use_float ? "float modulo" : "integer division or modulo by zero");
    if (use_float) {
      double q = std::floor(a.as_double() / b.as_double());
      return op == "//" ? Value(q) : Value(a.as_double() - q * b.as_double());
    }
    std::int64_t q = floor_div(a.as_int(), b.as_int());
    return op == "//" ? Value(q) : Value(a.as_int() - q * b.as_int());
  }
  unsupported(op, a, b);
}

bool less_than(const Value& a, const Value& b) {
  if (a.is_undefined()) throw JinjaError(a.undefined_message());
  if (b.is_undefined()) throw JinjaError(b.undefined_message());
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if ((a.kind() == Kind::kList && b.kind() == Kind::kList) ||
      (a.kind() == Kind::kTuple && b.kind() == Kind::kTuple)) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (values_equal(x[i], y[i])) continue;
      return less_than(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  throw JinjaError("'<' not supported between instances of '" + python_type_name(a) + "' and '" +
                   python_type_name(b) + "'");
}

namespace {

std::optional<std::string> optional_string(const CallArgs& args, std::size_t i, const char* name) {
  const Value* v = args.get(i, name);
  if (!v || v->is_none()) return std::nullopt;
  if (!v->is_string()) throw JinjaError(std::string(name) + " arg must be None or str");
  return v->as_string();
}

std::string required_string(const CallArgs& args, std::size_t i, const char* method) {
  const Value* v = args.get(i, "");
  if (!v)
    throw JinjaError(std::string(method) + "() takes at least " + std::to_string(i + 1) +
                     " argument");
  if (!v->is_string())
    throw JinjaError(std::string(method) + "() argument must be str, not " + python_type_name(*v));
  return v->as_string();
}

std::int64_t optional_int(const CallArgs& args, std::size_t i, const char* name,
                          std::int64_t dflt) {
  const Value* v = args.get(i, name);
  if (!v || v->is_none()) return dflt;
  if (!v->is_int() && !v->is_bool())
    throw JinjaError("'" + python_type_name(*v) + "' object cannot be interpreted as an integer");
  return v->as_int();
}

bool affix_match(const std::string& s, const Value& affix, bool prefix, const char* method) {
  auto one = [&](const Value& p) {
    if (!p.is_string())
      throw JinjaError(std::string(method) + " first arg must be str or a tuple of str, not " +
                       python_type_name(p));
    const std::string& t = p.as_string();
    if (t.size() > s.size()) return false;
    return prefix ? s.compare(0, t.size(), t) == 0
                  : s.compare(s.size() - t.size(), t.size(), t) == 0;
  };
  if (affix.kind() == Kind::kTuple) {
    for (const Value& p : affix.items())
      if (one(p)) return true;
    return false;
  }
  return one(affix);
}

ValueList strings_to_values(std::vector<std::string> parts) {
  ValueList out;
  out.reserve(parts.size());
  for (auto& p : parts) out.emplace_back(std::move(p));
  return out;
}

using Method = Value (*)(const Value& self, Interpreter& in, const CallArgs& args);

Value string_method(const std::string& name, const Value& self, Interpreter& in,
                    const CallArgs& a) {
  const std::string& s = self.as_string();
  using text::StripSide;
  if (name == "strip")
    return Value(text::strip(s, optional_string(a, 0, "chars"), StripSide::kBoth));
  if (name == "lstrip")
    return Value(text::strip(s, optional_string(a, 0, "chars"), StripSide::kLeft));
  if (name == "rstrip")
    return Value(text::strip(s, optional_string(a, 0, "chars"), StripSide::kRight));
  if (name == "split" || name == "rsplit") {
    auto parts = text::split(s, optional_string(a, 0, "sep"), optional_int(a, 1, "maxsplit", -1),
                             name == "rsplit");
    in.check_sequence_length(parts.size());
    return Value::list(strings_to_values(std::move(parts)));
  }
  if (name == "splitlines") return Value::list(strings_to_values(text::splitlines(s)));
  if (name == "startswith" || name == "endswith") {
    const Value* affix = a.get(0, "");
    if (!affix) throw JinjaError(name + "() takes at least 1 argument (0 given)");
    return Value(affix_match(s, *affix, name == "startswith", name.c_str()));
  }
  if (name == "replace") {
    std::string old = required_string(a, 0, "replace");
    std::string repl = required_string(a, 1, "replace");
    std::string out = text::replace(s, old, repl, optional_int(a, 2, "count", -1));
    in.check_sequence_length(out.size());
    return Value(std::move(out));
  }
  if (name == "format") return Value(brace_format(s, a));
  if (name == "upper") return Value(text::upper(s));
  if (name == "lower") return Value(text::lower(s));
  if (name == "title") return Value(text::title(s));
  if (name == "capitalize") return Value(text::capitalize(s));
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    std::int64_t at = text::find(s, required_string(a, 0, name.c_str()), name[0] == 'r');
    if (at < 0 && (name == "index" || name == "rindex")) throw JinjaError("substring not found");
    return Value(at);
  }
  if (name == "count")
    return Value(static_cast<std::int64_t>(text::count(s, required_string(a, 0, "count"))));
  if (name == "join") {
    const Value* items = a.get(0, "");
    if (!items) throw JinjaError("join() takes exactly one argument (0 given)");
    std::string out;
    bool first = true;
    for (const Value& v : in.iterate(*items)) {
      if (!v.is_string())
        throw JinjaError("sequence item: expected str instance, " + python_type_name(v) + " found");
      if (!first) out += s;
      first = false;
      out += v.as_string();
    }
    return Value(std::move(out));
  }
  auto all_of = [&](auto pred) {
    auto cps = utf8_decode(s);
    if (cps.empty()) return Value(false);
    for (auto cp : cps)
      if (!pred(cp)) return Value(false);
    return Value(true);
  };
  if (name == "isdigit") return all_of([](std::uint32_t c) { return c >= '0' && c <= '9'; });
  if (name == "isspace") return all_of([](std::uint32_t c) { return is_python_space(c); });
  if (name == "isalpha")
    return all_of([](std::uint32_t c) {
      return text::upper(std::string(1, static_cast<char>(c))) !=
                 text::lower(std::string(1, static_cast<char>(c))) ||
             c > 0x7F;
    });
  if (name == "isalnum")
    return all_of([](std::uint32_t c) {
      return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c > 0x7F;
    });
  if (name == "islower") return Value(text::lower(s) == s && text::upper(s) != s);
  if (name == "isupper") return Value(text::upper(s) == s && text::lower(s) != s);
  return Value();
}

Value dict_method(const std::string& name, const Value& self, Interpreter&, const CallArgs& a) {
  const Dict& d = self.as_dict();
  if (name == "items") {
    ValueList out;
    for (const auto& [k, v] : d.entries) out.push_back(Value::tuple({dict_key_value(k), v}));
    return Value::list(std::move(out));
  }
  if (name == "keys") {
    ValueList out;
    for (const auto& [k, v] : d.entries) out.push_back(dict_key_value(k));
    return Value::list(std::move(out));
  }
  if (name == "values") {
    ValueList out;
    for (const auto& [k, v] : d.entries) out.push_back(v);
    return Value::list(std::move(out));
  }
  if (name == "get") {
    const Value* key = a.get(0, "");
    if (!key) throw JinjaError("get expected at least 1 argument, got 0");
    if (!key->is_undefined() && !key->is_list_like() && !key->is_dict())
      if (const Value* v = d.find_key(*key)) return *v;
    const Value* dflt = a.get(1, "");
    return dflt ? *dflt : Value::none();
  }
  if (name == "copy") return Value::dict(d);
  return Value();
}

Value list_method(const std::string& name, const Value& self, Interpreter&, const CallArgs& a) {
  const ValueList& items = self.items();
  const Value* x = a.get(0, "");
  if (name == "index") {
    if (!x) throw JinjaError("index expected at least 1 argument, got 0");
    for (std::size_t i = 0; i < items.size(); ++i)
      if (values_equal(items[i], *x)) return Value(static_cast<std::int64_t>(i));
    throw JinjaError(to_repr(*x) + " is not in list");
  }
  if (name == "count") {
    if (!x) throw JinjaError("count() takes exactly one argument (0 given)");
    std::int64_t n = 0;
    for (const Value& v : items) n += values_equal(v, *x);
    return Value(n);
  }
  if (name == "copy") return Value::list(items);
  return Value();
}

bool is_one_of(const std::string& name, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (name == n) return true;
  return false;
}

}  // namespace

Value bound_method(const Value& obj, const std::string& name, bool* unsafe) {
  *unsafe = false;
  std::string type = python_type_name(obj);
  auto refuse = [&]() {
    *unsafe = true;
    return Value::undefined("access to attribute '" + name + "' of '" + type +
                            "' object is unsafe.");
  };
  if (obj.is_string()) {
    static const std::initializer_list<const char*> kNames = {
        "strip",    "lstrip",  "rstrip",  "split",   "rsplit", "splitlines", "startswith",
        "endswith", "replace", "upper",   "lower",   "title",  "capitalize", "find",
        "rfind",    "index",   "rindex",  "count",   "join",   "format",     "isdigit",
        "isspace",  "isalpha", "isalnum", "islower", "isupper"};
    if (!is_one_of(name, kNames)) return Value();
    return Value::function(
        name,
        [obj, name](Interpreter& in, const CallArgs& a) { return string_method(name, obj, in, a); },
        "builtin_function_or_method");
  }
  if (obj.is_dict()) {
    if (is_one_of(name, {"pop", "popitem", "clear", "update", "setdefault"})) return refuse();
    if (!is_one_of(name, {"items", "keys", "values", "get", "copy"})) return Value();
    return Value::function(
        name,
        [obj, name](Interpreter& in, const CallArgs& a) { return dict_method(name, obj, in, a); },
        "builtin_function_or_method");
  }
  if (obj.kind() == Kind::kList || obj.kind() == Kind::kTuple) {
    if (obj.kind() == Kind::kList && is_one_of(name, {"append", "extend", "insert", "pop", "remove",
                                                      "reverse", "sort", "clear"}))
      return refuse();
    if (!is_one_of(name, {"index", "count", "copy"})) return Value();
    return Value::function(
        name,
        [obj, name](Interpreter& in, const CallArgs& a) { return list_method(name, obj, in, a); },
        "builtin_function_or_method");
  }
  return Value();
}

}  // namespace hablar::chat::jinja
