// Values of the Jinja interpreter, with Python's semantics: None, bool, int, float, str, list,
// tuple, dict (insertion-ordered), callables, namespaces, and jinja2's default Undefined.
// Lists, dicts and namespaces are shared by reference, as Python objects are.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hablar::chat::jinja {

class Value;
class Interpreter;

using ValueList = std::vector<Value>;

// An insertion-ordered dict. Keys are strings (every dict from JSON, most literals) or, as
// Python allows, numbers, booleans and None ({1: 'a'}): `entries` hold each key encoded as a
// string (dict_key below), so that 1 and '1' stay two keys while 1, 1.0 and True are one.
// find / set take string keys; find_key / set_key any key. Lookup is linear: template dicts
// are small.
struct Dict {
  std::vector<std::pair<std::string, Value>> entries;  // (encoded key, value)

  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(std::string key, Value value);
  const Value* find_key(const Value& key) const;
  void set_key(const Value& key, Value value);
};

// A key's encoding in Dict::entries: a string as itself (prefixed with "\0s" when it starts
// with a NUL byte), any other key as "\0" + a type letter + its text (integers, and floats
// and booleans equal to one, as "\0i<n>"; other floats "\0f<repr>"; None "\0n"). Throws
// JinjaError for unhashable keys (lists, dicts).
std::string dict_key(const Value& key);
std::string dict_key(std::string_view string_key);
// The key an encoding stands for (integers come back as int: Python keeps the first
// inserted key's type, rarely anything but an int).
Value dict_key_value(const std::string& encoded);
// The key as json.dumps writes an object key: strings as they are, numbers as their text,
// booleans as true/false, None as null.
std::string dict_key_json_text(const std::string& encoded);

// Arguments of a call: positional and keyword, in source order.
struct CallArgs {
  ValueList positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument named `name` or at position `index`; null when absent.
  const Value* get(std::size_t index, std::string_view name) const;
};

using NativeFunction = std::function<Value(Interpreter&, const CallArgs&)>;

struct Callable {
  std::string name;
  std::string type_name;  // Python type name for error messages ("function", "Macro", ...)
  NativeFunction call;
};

enum class Kind : std::uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kTuple,
  kGenerator,  // the lazy result of map/select/...: iterable once, no len(), not JSON
  kDict,
  kNamespace,
  kCallable,
};

class Value {
 public:
  Value() = default;  // Undefined with no name
  static Value undefined(std::string message) {
    Value v;
    v.str_ = std::make_shared<const std::string>(std::move(message));
    return v;
  }
  // An Undefined whose use raises a SecurityError-like message instead of the undefined one.
  static Value none() { return Value(Kind::kNone); }
  Value(bool b) : kind_(Kind::kBool), int_(b) {}
  Value(int i) : kind_(Kind::kInt), int_(i) {}
  Value(std::int64_t i) : kind_(Kind::kInt), int_(i) {}
  Value(double f) : kind_(Kind::kFloat), float_(f) {}
  Value(std::string s, bool safe = false)
      : kind_(Kind::kString),
        safe_(safe),
        str_(std::make_shared<const std::string>(std::move(s))) {}
  Value(const char* s) : Value(std::string(s)) {}
  static Value list(ValueList items, Kind kind = Kind::kList) {
    Value v(kind);
    v.list_ = std::make_shared<ValueList>(std::move(items));
    return v;
  }
  static Value tuple(ValueList items) { return list(std::move(items), Kind::kTuple); }
  static Value dict(Dict d = {}, Kind kind = Kind::kDict) {
    Value v(kind);
    v.dict_ = std::make_shared<Dict>(std::move(d));
    return v;
  }
  static Value function(std::string name, NativeFunction fn, std::string type_name = "function") {
    Value v(Kind::kCallable);
    v.callable_ =
        std::make_shared<Callable>(Callable{std::move(name), std::move(type_name), std::move(fn)});
    return v;
  }

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_safe() const { return safe_; }
  bool is_list_like() const {
    return kind_ == Kind::kList || kind_ == Kind::kTuple || kind_ == Kind::kGenerator;
  }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return int_ != 0; }
  std::int64_t as_int() const { return int_; }  // int or bool
  double as_double() const { return is_float() ? float_ : static_cast<double>(int_); }
  const std::string& as_string() const { return *str_; }
  const ValueList& items() const { return *list_; }
  ValueList& mutable_items() const { return *list_; }
  const Dict& as_dict() const { return *dict_; }
  Dict& mutable_dict() const { return *dict_; }
  const Callable& as_callable() const { return *callable_; }
  // For Undefined: the message its use raises ("'x' is undefined").
  std::string undefined_message() const { return str_ ? *str_ : "undefined value"; }
  bool same_object(const Value& other) const;

 private:
  explicit Value(Kind kind) : kind_(kind) {}

  Kind kind_ = Kind::kUndefined;
  bool safe_ = false;  // a str marked safe (Markup): `+` escapes a plain str added to it
  union {
    std::int64_t int_ = 0;
    double float_;
  };
  std::shared_ptr<const std::string> str_;  // string payload, or Undefined's message
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Callable> callable_;
};

// Python's type(x).__name__ ("str", "NoneType", "dict", "Undefined", ...).
std::string python_type_name(const Value& v);
// jinja2's object_type_repr: "None", or "<type> object".
std::string object_type_repr(const Value& v);
bool truthy(const Value& v);
// Python's str(x) (Undefined prints as "").
std::string to_str(const Value& v);
// Python's repr(x).
std::string to_repr(const Value& v);
std::string float_repr(double f);
// Python's == (1 == 1.0 == True; lists and dicts by content).
bool values_equal(const Value& a, const Value& b);

struct JsonDumpOptions {
  int indent = -1;  // < 0: one line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// Python's json.dumps; throws a TypeError-like message for values JSON cannot hold.
std::string json_dumps(const Value& v, const JsonDumpOptions& options);

Value from_json(const nlohmann::json& j);
Value from_json(const nlohmann::ordered_json& j);

// UTF-8 helpers: Python indexes strings by code point.
std::vector<std::uint32_t> utf8_decode(std::string_view s);
void utf8_append(std::string& out, std::uint32_t cp);
std::size_t utf8_length(std::string_view s);
bool is_python_space(std::uint32_t cp);

}  // namespace hablar::chat::jinja
