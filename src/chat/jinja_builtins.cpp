// The filters, tests and global functions of the Jinja interpreter, with jinja2's semantics
// (and Hugging Face's tojson: json.dumps(x, ensure_ascii=False, indent, separators, sort_keys)).
#include "chat/jinja_interpreter.h"
#include "chat/jinja_text.h"

#include <algorithm>
#include <cmath>
#include <ctime>

namespace hablar::chat::jinja {
namespace {

const Value* arg(const CallArgs& args, std::size_t i, const char* name) {
  return args.get(i, name);
}

bool arg_bool(const CallArgs& args, std::size_t i, const char* name, bool dflt) {
  const Value* v = arg(args, i, name);
  return v ? truthy(*v) : dflt;
}

std::int64_t arg_int(const CallArgs& args, std::size_t i, const char* name, std::int64_t dflt) {
  const Value* v = arg(args, i, name);
  if (!v) return dflt;
  if (!v->is_int() && !v->is_bool())
    throw JinjaError("'" + python_type_name(*v) + "' object cannot be interpreted as an integer");
  return v->as_int();
}

std::string require_str(const Value& v, const char* what) {
  if (v.is_undefined()) throw JinjaError(v.undefined_message());
  if (!v.is_string())
    throw JinjaError(std::string(what) + ": expected a string, got " + python_type_name(v));
  return v.as_string();
}

std::int64_t length_of(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return 0;
    case Kind::kString:
      return static_cast<std::int64_t>(utf8_length(v.as_string()));
    case Kind::kList:
    case Kind::kTuple:
      return static_cast<std::int64_t>(v.items().size());
    case Kind::kDict:
      return static_cast<std::int64_t>(v.as_dict().entries.size());
    default:
      throw JinjaError("object of type '" + python_type_name(v) + "' has no len()");
  }
}

// Resolves "a.b.0" on an item as jinja2's make_attrgetter does (item lookup per part).
Value attribute_path(Interpreter& in, const Value& item, const Value& path) {
  if (path.is_int()) return in.get_item(item, path);
  Value current = item;
  for (const std::string& part : text::split(to_str(path), std::string("."), -1, false)) {
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    current = in.get_item(
        current, numeric ? Value(static_cast<std::int64_t>(std::stoll(part))) : Value(part));
  }
  return current;
}

// Sort key for sort/unique/min/max/dictsort: strings lower-cased unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(text::lower(v.as_string()));
  return v;
}

Value filter_default(Interpreter&, const Value& v, const CallArgs& a) {
  const Value* dflt = arg(a, 0, "default_value");
  bool boolean = arg_bool(a, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !truthy(v))) return dflt ? *dflt : Value("");
  return v;
}

Value filter_tojson(Interpreter&, const Value& v, const CallArgs& a) {
  JsonDumpOptions o;
  o.ensure_ascii = arg_bool(a, 0, "ensure_ascii", false);
  const Value* indent = arg(a, 1, "indent");
  if (indent && !indent->is_none()) {
    o.indent = static_cast<int>(indent->as_int());
    o.item_separator = ",";
  }
  const Value* separators = arg(a, 2, "separators");
  if (separators && !separators->is_none()) {
    if (!separators->is_list_like() || separators->items().size() != 2)
      throw JinjaError("separators must be a pair of strings");
    o.item_separator = require_str(separators->items()[0], "separators");
    o.key_separator = require_str(separators->items()[1], "separators");
  }
  o.sort_keys = arg_bool(a, 3, "sort_keys", false);
  return Value(json_dumps(v, o));
}

Value filter_join(Interpreter& in, const Value& v, const CallArgs& a) {
  const Value* sep = arg(a, 0, "d");
  const Value* attribute = arg(a, 1, "attribute");
  std::string separator = sep ? to_str(*sep) : "";
  std::string out;
  bool first = true;
  for (const Value& item : in.iterate(v)) {
    if (!first) out += separator;
    first = false;
    out += to_str(attribute && !attribute->is_none() ? attribute_path(in, item, *attribute) : item);
    in.check_sequence_length(out.size());
  }
  return Value(std::move(out));
}

// jinja2's items filter is a generator: no len(), not JSON, iterable once.
Value filter_items(Interpreter&, const Value& v, const CallArgs&) {
  if (v.is_undefined()) return Value::list({}, Kind::kGenerator);
  if (!v.is_dict()) throw JinjaError("Can only get item pairs from a mapping.");
  ValueList out;
  for (const auto& [k, val] : v.as_dict().entries)
    out.push_back(Value::tuple({dict_key_value(k), val}));
  return Value::list(std::move(out), Kind::kGenerator);
}

Value filter_map(Interpreter& in, const Value& v, const CallArgs& a) {
  ValueList out;
  if (!truthy(v)) return Value::list({}, Kind::kGenerator);  // jinja2: `if value:` first
  const Value* attribute = a.get(SIZE_MAX, "attribute");
  if (attribute) {
    const Value* dflt = a.get(SIZE_MAX, "default");
    for (const Value& item : in.iterate(v)) {
      Value r = attribute_path(in, item, *attribute);
      out.push_back(r.is_undefined() && dflt ? *dflt : r);
    }
  } else {
    if (a.positional.empty()) throw JinjaError("map requires a filter argument");
    std::string filter = require_str(a.positional[0], "map");
    CallArgs rest;
    rest.positional.assign(a.positional.begin() + 1, a.positional.end());
    rest.keyword = a.keyword;
    for (const Value& item : in.iterate(v)) out.push_back(in.apply_filter(filter, item, rest));
  }
  return Value::list(std::move(out), Kind::kGenerator);
}

Value select_impl(Interpreter& in, const Value& v, const CallArgs& a, bool by_attribute,
                  bool keep) {
  std::size_t next = 0;
  Value attribute;
  if (by_attribute) {
    if (a.positional.empty()) throw JinjaError("selectattr requires an attribute name");
    attribute = a.positional[next++];
  }
  std::string test;
  CallArgs test_args;
  if (next < a.positional.size()) {
    test = require_str(a.positional[next++], "select");
    test_args.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(next),
                                a.positional.end());
    test_args.keyword = a.keyword;
  }
  ValueList out;
  if (!truthy(v)) return Value::list({}, Kind::kGenerator);  // jinja2: `if value:` first
  for (const Value& item : in.iterate(v)) {
    Value subject = by_attribute ? attribute_path(in, item, attribute) : item;
    bool pass = test.empty() ? truthy(subject) : in.apply_test(test, subject, test_args);
    if (pass == keep) out.push_back(item);
  }
  return Value::list(std::move(out), Kind::kGenerator);
}

Value filter_sort(Interpreter& in, const Value& v, const CallArgs& a) {
  bool reverse = arg_bool(a, 0, "reverse", false);
  bool case_sensitive = arg_bool(a, 1, "case_sensitive", false);
  const Value* attribute = arg(a, 2, "attribute");
  ValueList items = in.iterate(v);
  auto key = [&](const Value& x) {
    return sort_key(attribute && !attribute->is_none() ? attribute_path(in, x, *attribute) : x,
                    case_sensitive);
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? less_than(key(y), key(x)) : less_than(key(x), key(y));
  });
  return Value::list(std::move(items));
}

Value filter_dictsort(Interpreter&, const Value& v, const CallArgs& a) {
  if (!v.is_dict()) throw JinjaError("You can only sort by either \"key\" or \"value\"");
  bool case_sensitive = arg_bool(a, 0, "case_sensitive", false);
  const Value* by = arg(a, 1, "by");
  bool by_value = by && to_str(*by) == "value";
  bool reverse = arg_bool(a, 2, "reverse", false);
  ValueList items;
  for (const auto& [k, val] : v.as_dict().entries)
    items.push_back(Value::tuple({dict_key_value(k), val}));
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    Value kx = sort_key(x.items()[by_value ? 1 : 0], case_sensitive);
    Value ky = sort_key(y.items()[by_value ? 1 : 0], case_sensitive);
    return reverse ? less_than(ky, kx) : less_than(kx, ky);
  });
  return Value::list(std::move(items));
}

Value filter_unique(Interpreter& in, const Value& v, const CallArgs& a) {
  bool case_sensitive = arg_bool(a, 0, "case_sensitive", false);
  const Value* attribute = arg(a, 1, "attribute");
  ValueList out, seen;
  for (const Value& item : in.iterate(v)) {
    Value key =
        sort_key(attribute && !attribute->is_none() ? attribute_path(in, item, *attribute) : item,
                 case_sensitive);
    bool dup =
        std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return values_equal(s, key); });
    if (dup) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::list(std::move(out), Kind::kGenerator);
}

// jinja2's groupby(attribute, default, case_sensitive): the items sorted by the attribute,
// then one (grouper, list) pair per run of equal keys; the grouper is the first item's own
// value (not lower-cased). The pairs are tuples whose .grouper and .list name their items
// (Interpreter::get_attribute), as jinja2's named tuples do.
Value filter_groupby(Interpreter& in, const Value& v, const CallArgs& a) {
  const Value* attribute = arg(a, 0, "attribute");
  if (!attribute) throw JinjaError("groupby() missing required argument 'attribute'");
  const Value* dflt = arg(a, 1, "default");
  const bool case_sensitive = arg_bool(a, 2, "case_sensitive", false);
  const auto key_of = [&](const Value& item) {
    Value k = attribute_path(in, item, *attribute);
    return k.is_undefined() && dflt ? *dflt : k;
  };
  ValueList items = in.iterate(v);
  std::vector<std::pair<Value, Value>> keyed;  // (sort key, item)
  for (const Value& item : items) keyed.emplace_back(sort_key(key_of(item), case_sensitive), item);
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const auto& x, const auto& y) { return less_than(x.first, y.first); });
  ValueList groups;
  for (size_t i = 0; i < keyed.size();) {
    size_t j = i;
    ValueList members;
    for (; j < keyed.size() && values_equal(keyed[j].first, keyed[i].first); ++j)
      members.push_back(keyed[j].second);
    groups.push_back(Value::tuple({key_of(keyed[i].second), Value::list(std::move(members))}));
    i = j;
  }
  return Value::list(std::move(groups));
}

Value min_max(Interpreter& in, const Value& v, const CallArgs& a, bool want_max) {
  bool case_sensitive = arg_bool(a, 0, "case_sensitive", false);
  const Value* attribute = arg(a, 1, "attribute");
  ValueList items = in.iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& x) {
    return sort_key(attribute && !attribute->is_none() ? attribute_path(in, x, *attribute) : x,
                    case_sensitive);
  };
  const Value* best = &items[0];
  for (const Value& item : items) {
    if (want_max ? less_than(key(*best), key(item)) : less_than(key(item), key(*best)))
      best = &item;
  }
  return *best;
}

Value filter_sum(Interpreter& in, const Value& v, const CallArgs& a) {
  const Value* attribute = arg(a, 0, "attribute");
  const Value* start = arg(a, 1, "start");
  Value total = start ? *start : Value(0);
  for (const Value& item : in.iterate(v))
    total =
        binary_op("+", total,
                  attribute && !attribute->is_none() ? attribute_path(in, item, *attribute) : item);
  return total;
}

Value filter_indent(Interpreter&, const Value& v, const CallArgs& a) {
  const Value* width = arg(a, 0, "width");
  std::string indention =
      !width ? "    "
      : width->is_string()
          ? width->as_string()
          : std::string(static_cast<std::size_t>(std::max<std::int64_t>(0, width->as_int())), ' ');
  bool first = arg_bool(a, 1, "first", false);
  bool blank = arg_bool(a, 2, "blank", false);
  if (v.is_undefined()) throw JinjaError(v.undefined_message());
  if (!v.is_string())
    throw JinjaError("unsupported operand type(s) for +=: '" + python_type_name(v) + "' and 'str'");
  std::string s = v.as_string() + "\n";
  auto lines = text::splitlines(s);
  std::string rv;
  if (blank) {
    for (std::size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + indention : "") + lines[i];
  } else if (!lines.empty()) {
    rv = lines[0];
    for (std::size_t i = 1; i < lines.size(); ++i)
      rv += "\n" + (lines[i].empty() ? "" : indention) + lines[i];
  }
  if (first) rv = indention + rv;
  return Value(std::move(rv));
}

Value filter_int(Interpreter&, const Value& v, const CallArgs& a) {
  const Value* dflt = arg(a, 0, "default");
  Value fallback = dflt ? *dflt : Value(0);
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float())
    return std::isfinite(v.as_double()) ? Value(static_cast<std::int64_t>(v.as_double()))
                                        : fallback;
  if (v.is_string()) {
    std::string s = text::strip(v.as_string(), std::nullopt, text::StripSide::kBoth);
    try {
      std::size_t used = 0;
      std::int64_t i = std::stoll(s, &used, static_cast<int>(arg_int(a, 1, "base", 10)));
      if (used == s.size()) return Value(i);
      double d = std::stod(s, &used);
      if (used == s.size() && std::isfinite(d)) return Value(static_cast<std::int64_t>(d));
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

Value filter_float(Interpreter&, const Value& v, const CallArgs& a) {
  const Value* dflt = arg(a, 0, "default");
  Value fallback = dflt ? *dflt : Value(0.0);
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string()) {
    std::string s = text::strip(v.as_string(), std::nullopt, text::StripSide::kBoth);
    try {
      std::size_t used = 0;
      double d = std::stod(s, &used);
      if (used == s.size()) return Value(d);
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

Value filter_round(Interpreter&, const Value& v, const CallArgs& a) {
  std::int64_t precision = arg_int(a, 0, "precision", 0);
  const Value* method = arg(a, 1, "method");
  std::string how = method ? to_str(*method) : "common";
  if (!v.is_number())
    throw JinjaError("type " + python_type_name(v) + " doesn't define __round__ method");
  if (how == "common" && !v.is_float()) {  // round(int, n) stays an int in Python
    if (precision >= 0) return Value(v.as_int());
    double unit = std::pow(10.0, static_cast<double>(-precision));
    return Value(
        static_cast<std::int64_t>(std::nearbyint(static_cast<double>(v.as_int()) / unit) * unit));
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.as_double() * scale;
  double r;
  if (how == "ceil")
    r = std::ceil(x);
  else if (how == "floor")
    r = std::floor(x);
  else if (how == "common")
    r = std::nearbyint(x);  // Python's round(): half to even
  else
    throw JinjaError("method must be common, ceil or floor");
  return Value(r / scale);
}

Value filter_batch(Interpreter& in, const Value& v, const CallArgs& a) {
  std::int64_t size = arg_int(a, 0, "linecount", 1);
  if (size <= 0) throw JinjaError("batch size must be positive");
  const Value* fill = arg(a, 1, "fill_with");
  ValueList out, current;
  for (const Value& item : in.iterate(v)) {
    current.push_back(item);
    if (static_cast<std::int64_t>(current.size()) == size) {
      out.push_back(Value::list(std::move(current)));
      current.clear();
    }
  }
  if (!current.empty()) {
    if (fill && !fill->is_none())
      while (static_cast<std::int64_t>(current.size()) < size) current.push_back(*fill);
    out.push_back(Value::list(std::move(current)));
  }
  return Value::list(std::move(out), Kind::kGenerator);
}

Value filter_replace(Interpreter& in, const Value& v, const CallArgs& a) {
  const Value* old = arg(a, 0, "old");
  const Value* repl = arg(a, 1, "new");
  if (!old || !repl) throw JinjaError("replace needs old and new strings");
  std::string out =
      text::replace(to_str(v), to_str(*old), to_str(*repl), arg_int(a, 2, "count", -1));
  in.check_sequence_length(out.size());
  return Value(std::move(out), v.is_safe());
}

Value filter_first_last(Interpreter& in, const Value& v, bool first) {
  if (v.is_string() || v.is_list_like() || v.is_dict() || v.is_undefined()) {
    ValueList items = in.iterate(v);
    if (items.empty())
      return Value::undefined(first ? "No first item, sequence was empty."
                                    : "No last item, sequence was empty.");
    return first ? items.front() : items.back();
  }
  throw JinjaError("'" + python_type_name(v) + "' object is not iterable");
}

Value filter_reverse(Interpreter& in, const Value& v, const CallArgs&) {
  if (v.is_string()) {
    auto cps = utf8_decode(v.as_string());
    std::string out;
    for (auto it = cps.rbegin(); it != cps.rend(); ++it) utf8_append(out, *it);
    return Value(std::move(out));
  }
  ValueList items = in.iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items), Kind::kGenerator);
}

Value filter_center(Interpreter&, const Value& v, const CallArgs& a) {
  std::string s = to_str(v);
  std::int64_t width = arg_int(a, 0, "width", 80);
  std::int64_t len = static_cast<std::int64_t>(utf8_length(s));
  if (width <= len) return Value(s);
  std::int64_t total = width - len;
  std::int64_t left = total / 2 + (total & width & 1);
  return Value(std::string(static_cast<std::size_t>(left), ' ') + s +
               std::string(static_cast<std::size_t>(total - left), ' '));
}

// jinja2's truncate(length=255, killwords=False, end='...', leeway=5), in characters: a text
// up to length + leeway stays whole; a longer one is cut to length - len(end) characters
// (at the last space unless killwords) and gets `end`.
Value filter_truncate(Interpreter&, const Value& v, const CallArgs& a) {
  const std::vector<std::uint32_t> chars = utf8_decode(to_str(v));
  const std::int64_t length = arg_int(a, 0, "length", 255);
  const bool killwords = arg_bool(a, 1, "killwords", false);
  const Value* end_arg = a.get(2, "end");
  const std::string end = end_arg ? to_str(*end_arg) : "...";
  const std::int64_t leeway = arg_int(a, 3, "leeway", 5);
  const std::int64_t n_end = static_cast<std::int64_t>(utf8_decode(end).size());
  if (length < n_end) throw JinjaError("expected length >= " + std::to_string(n_end));
  auto text = [&](std::size_t n) {
    std::string out;
    for (std::size_t i = 0; i < n; ++i) utf8_append(out, chars[i]);
    return out;
  };
  if (static_cast<std::int64_t>(chars.size()) <= length + leeway) return Value(text(chars.size()));
  std::size_t keep = static_cast<std::size_t>(length - n_end);
  if (!killwords) {
    std::size_t space = keep;
    while (space > 0 && chars[space - 1] != ' ') --space;
    if (space > 0) keep = space - 1;  // rsplit(' ', 1)[0]: up to the last space, without it
  }
  return Value(text(keep) + end);
}

std::unordered_map<std::string, FilterFn> make_filters() {
  std::unordered_map<std::string, FilterFn> f;
  f["default"] = f["d"] = filter_default;
  f["tojson"] = filter_tojson;
  f["join"] = filter_join;
  f["items"] = filter_items;
  f["map"] = filter_map;
  f["select"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
    return select_impl(in, v, a, false, true);
  };
  f["reject"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
    return select_impl(in, v, a, false, false);
  };
  f["selectattr"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
    return select_impl(in, v, a, true, true);
  };
  f["rejectattr"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
    return select_impl(in, v, a, true, false);
  };
  f["sort"] = filter_sort;
  f["dictsort"] = filter_dictsort;
  f["unique"] = filter_unique;
  f["groupby"] = filter_groupby;
  f["min"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
    return min_max(in, v, a, false);
  };
  f["max"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
    return min_max(in, v, a, true);
  };
  f["sum"] = filter_sum;
  f["indent"] = filter_indent;
  f["int"] = filter_int;
  f["float"] = filter_float;
  f["round"] = filter_round;
  f["batch"] = filter_batch;
  f["replace"] = filter_replace;
  f["reverse"] = filter_reverse;
  f["center"] = filter_center;
  f["truncate"] = filter_truncate;
  f["first"] = [](Interpreter& in, const Value& v, const CallArgs&) {
    return filter_first_last(in, v, true);
  };
  f["last"] = [](Interpreter& in, const Value& v, const CallArgs&) {
    return filter_first_last(in, v, false);
  };
  f["length"] = f["count"] = [](Interpreter&, const Value& v, const CallArgs&) {
    return Value(length_of(v));
  };
  f["list"] = [](Interpreter& in, const Value& v, const CallArgs&) {
    return Value::list(in.iterate(v));
  };
  f["string"] = [](Interpreter&, const Value& v, const CallArgs&) {
    return v.is_string() ? v : Value(to_str(v));
  };
  f["trim"] = [](Interpreter&, const Value& v, const CallArgs& a) {
    const Value* chars = arg(a, 0, "chars");
    std::optional<std::string> set;
    if (chars && !chars->is_none()) set = to_str(*chars);
    return Value(text::strip(to_str(v), set, text::StripSide::kBoth));
  };
  f["upper"] = [](Interpreter&, const Value& v, const CallArgs&) {
    return Value(text::upper(to_str(v)));
  };
  f["lower"] = [](Interpreter&, const Value& v, const CallArgs&) {
    return Value(text::lower(to_str(v)));
  };
  f["capitalize"] = [](Interpreter&, const Value& v, const CallArgs&) {
    return Value(text::capitalize(to_str(v)));
  };
  f["title"] = [](Interpreter&, const Value& v, const CallArgs&) {
    return Value(text::jinja_title(to_str(v)));
  };
  f["wordcount"] = [](Interpreter&, const Value& v, const CallArgs&) {
    return Value(static_cast<std::int64_t>(text::word_count(to_str(v))));
  };
  f["safe"] = [](Interpreter&, const Value& v, const CallArgs&) { return Value(to_str(v), true); };
  f["escape"] = f["e"] = f["forceescape"] = [](Interpreter&, const Value& v, const CallArgs&) {
    return v.is_safe() ? v : Value(html_escape(to_str(v)), true);
  };
  f["abs"] = [](Interpreter&, const Value& v, const CallArgs&) {
    if (!v.is_number())
      throw JinjaError("bad operand type for abs(): '" + python_type_name(v) + "'");
    return v.is_float() ? Value(std::fabs(v.as_double()))
                        : Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  };
  f["attr"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
    const Value* name = arg(a, 0, "name");
    if (!name) throw JinjaError("attr needs a name");
    return in.get_attribute(v, to_str(*name));
  };
  return f;
}

bool test_sequence(const Value& v) {
  return v.is_string() || v.kind() == Kind::kList || v.kind() == Kind::kTuple || v.is_dict() ||
         v.is_undefined();
}

std::unordered_map<std::string, TestFn> make_tests() {
  std::unordered_map<std::string, TestFn> t;
  auto simple = [&](const char* name, bool (*fn)(const Value&)) {
    t[name] = [fn](Interpreter&, const Value& v, const CallArgs&) { return fn(v); };
  };
  simple("defined", [](const Value& v) { return !v.is_undefined(); });
  simple("undefined", [](const Value& v) { return v.is_undefined(); });
  simple("none", [](const Value& v) { return v.is_none(); });
  simple("boolean", [](const Value& v) { return v.is_bool(); });
  simple("true", [](const Value& v) { return v.is_bool() && v.as_bool(); });
  simple("false", [](const Value& v) { return v.is_bool() && !v.as_bool(); });
  simple("integer", [](const Value& v) { return v.is_int(); });
  simple("float", [](const Value& v) { return v.is_float(); });
  simple("number", [](const Value& v) { return v.is_number(); });
  simple("string", [](const Value& v) { return v.is_string(); });
  simple("mapping", [](const Value& v) { return v.is_dict(); });
  simple("iterable",
         [](const Value& v) { return test_sequence(v) || v.kind() == Kind::kGenerator; });
  simple("sequence", test_sequence);
  simple("callable", [](const Value& v) { return v.is_callable(); });
  simple("escaped", [](const Value& v) { return v.is_safe(); });
  // str(value).islower() / .isupper(): some cased letter, and none of the other case.
  simple("lower", [](const Value& v) {
    std::string s = to_str(v);
    return text::lower(s) == s && text::upper(s) != s;
  });
  simple("upper", [](const Value& v) {
    std::string s = to_str(v);
    return text::upper(s) == s && text::lower(s) != s;
  });
  auto int_of = [](const Value& v) {
    if (v.is_undefined()) throw JinjaError(v.undefined_message());
    if (!v.is_int() && !v.is_bool())
      throw JinjaError("unsupported operand type(s) for %: '" + python_type_name(v) +
                       "' and 'int'");
    return v.as_int();
  };
  // value % 2 == 1 / == 0, with Python's float modulo for floats.
  auto remainder = [](const Value& v) {
    if (v.is_undefined()) throw JinjaError(v.undefined_message());
    return binary_op("%", v, Value(2));
  };
  t["odd"] = [remainder](Interpreter&, const Value& v, const CallArgs&) {
    return values_equal(remainder(v), Value(1));
  };
  t["even"] = [remainder](Interpreter&, const Value& v, const CallArgs&) {
    return values_equal(remainder(v), Value(0));
  };
  t["divisibleby"] = [int_of](Interpreter&, const Value& v, const CallArgs& a) {
    std::int64_t n = arg_int(a, 0, "num", 1);
    if (n == 0) throw JinjaError("integer division or modulo by zero");
    return int_of(v) % n == 0;
  };
  auto other = [](const CallArgs& a) {
    const Value* o = arg(a, 0, "other");
    if (!o) throw JinjaError("test needs an argument");
    return *o;
  };
  t["eq"] = t["equalto"] = t["=="] = [other](Interpreter&, const Value& v, const CallArgs& a) {
    return values_equal(v, other(a));
  };
  t["ne"] = t["!="] = [other](Interpreter&, const Value& v, const CallArgs& a) {
    return !values_equal(v, other(a));
  };
  t["lt"] = t["lessthan"] = t["<"] = [other](Interpreter&, const Value& v, const CallArgs& a) {
    return less_than(v, other(a));
  };
  t["gt"] = t["greaterthan"] = t[">"] = [other](Interpreter&, const Value& v, const CallArgs& a) {
    return less_than(other(a), v);
  };
  t["le"] = t["<="] = [other](Interpreter&, const Value& v, const CallArgs& a) {
    return !less_than(other(a), v);
  };
  t["ge"] = t[">="] = [other](Interpreter&, const Value& v, const CallArgs& a) {
    return !less_than(v, other(a));
  };
  t["sameas"] = [other](Interpreter&, const Value& v, const CallArgs& a) {
    return v.same_object(other(a));
  };
  t["in"] = [other](Interpreter& in, const Value& v, const CallArgs& a) {
    return contains(in, other(a), v);  // the `in` operator: substrings of a string too
  };
  t["filter"] = [](Interpreter&, const Value& v, const CallArgs&) {
    return v.is_string() && builtin_filters().count(v.as_string()) > 0;
  };
  t["test"] = [](Interpreter&, const Value& v, const CallArgs&) {
    return v.is_string() && builtin_tests().count(v.as_string()) > 0;
  };
  return t;
}

Value global_range(Interpreter& in, const CallArgs& a) {
  std::int64_t start = 0, stop = 0, step = 1;
  auto num = [](const Value& v) {
    if (!v.is_int() && !v.is_bool())
      throw JinjaError("'" + python_type_name(v) + "' object cannot be interpreted as an integer");
    return v.as_int();
  };
  if (a.positional.size() == 1) {
    stop = num(a.positional[0]);
  } else if (a.positional.size() >= 2) {
    start = num(a.positional[0]);
    stop = num(a.positional[1]);
    if (a.positional.size() >= 3) step = num(a.positional[2]);
  } else {
    throw JinjaError("range expected at least 1 argument, got 0");
  }
  if (step == 0) throw JinjaError("range() arg 3 must not be zero");
  long double span = (static_cast<long double>(stop) - start) / step;
  std::size_t n = span > 0 ? static_cast<std::size_t>(std::ceil(span)) : 0;
  in.check_sequence_length(n);
  ValueList items;
  items.reserve(n);
  for (std::size_t i = 0; i < n; ++i)
    items.emplace_back(start + static_cast<std::int64_t>(i) * step);
  return Value::list(std::move(items));
}

Value global_namespace(Interpreter&, const CallArgs& a) {
  Dict d;
  for (const Value& p : a.positional) {
    if (!p.is_dict()) throw JinjaError("namespace() positional argument must be a mapping");
    for (const auto& [k, v] : p.as_dict().entries) d.set_key(dict_key_value(k), v);
  }
  for (const auto& [k, v] : a.keyword) d.set(k, v);
  return Value::dict(std::move(d), Kind::kNamespace);
}

Value global_strftime_now(Interpreter& in, const CallArgs& a) {
  const Value* fmt = a.get(0, "format");
  if (!fmt || !fmt->is_string()) throw JinjaError("strftime_now() needs a format string");
  std::time_t now = in.now();
  std::tm local{};
  localtime_r(&now, &local);
  char buf[512];
  std::size_t n = std::strftime(buf, sizeof buf, fmt->as_string().c_str(), &local);
  return Value(std::string(buf, n));
}

Dict make_globals() {
  Dict g;
  g.set("range", Value::function("range", global_range, "type"));
  g.set("namespace", Value::function("namespace", global_namespace, "type"));
  g.set("dict",
        Value::function(
            "dict",
            [](Interpreter& in, const CallArgs& a) {
              Dict d;
              for (const Value& p : a.positional) {
                if (p.is_dict()) {
                  for (const auto& [k, v] : p.as_dict().entries) d.set_key(dict_key_value(k), v);
                  continue;
                }
                // dict(pairs): an iterable of (key, value) pairs, as Python's
                for (const Value& pair : in.iterate(p)) {
                  if (!pair.is_list_like() || pair.items().size() != 2)
                    throw JinjaError("dictionary update sequence element has length other than 2");
                  const Value& k = pair.items()[0];
                  d.set_key(k, pair.items()[1]);
                }
              }
              for (const auto& [k, v] : a.keyword) d.set(k, v);
              return Value::dict(std::move(d));
            },
            "type"));
  g.set("joiner", Value::function(
                      "joiner",
                      [](Interpreter&, const CallArgs& a) {
                        const Value* sep = a.get(0, "sep");
                        std::string separator = sep ? to_str(*sep) : ", ";
                        auto used = std::make_shared<bool>(false);
                        return Value::function("joiner",
                                               [separator, used](Interpreter&, const CallArgs&) {
                                                 if (!*used) {
                                                   *used = true;
                                                   return Value("");
                                                 }
                                                 return Value(separator);
                                               });
                      },
                      "type"));
  g.set("raise_exception",
        Value::function("raise_exception", [](Interpreter&, const CallArgs& a) -> Value {
          const Value* msg = a.get(0, "message");
          throw JinjaError(msg ? to_str(*msg) : "");
        }));
  g.set("strftime_now", Value::function("strftime_now", global_strftime_now));
  return g;
}

}  // namespace

const std::unordered_map<std::string, FilterFn>& builtin_filters() {
  static const auto filters = make_filters();
  return filters;
}

const std::unordered_map<std::string, TestFn>& builtin_tests() {
  static const auto tests = make_tests();
  return tests;
}

const Dict& builtin_globals() {
  static const Dict globals = make_globals();
  return globals;
}

}  // namespace hablar::chat::jinja
