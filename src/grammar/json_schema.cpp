// JSON Schema -> GBNF.
//
// Every schema node becomes a GBNF expression; objects, arrays, references and anything
// reused become named rules. What is enforced:
//   type (one or a list), enum, const, anyOf / oneOf (as alternatives: oneOf's exclusivity
//   is not checked; keywords beside them hold for each alternative), allOf of object schemas
//   (merged; enums intersected), $ref into the document (#, #/$defs/..,
//   #/definitions/..; recursion allowed), properties / required / additionalProperties
//   (declared properties come out in declared order, required ones always, optional ones
//   when the model wants them; extra properties only for a map, i.e. additionalProperties
//   given as a schema with no declared properties), items / prefixItems / minItems /
//   maxItems, string minLength / maxLength / pattern / format (date, time, date-time, uuid,
//   email, ipv4; an email is offered in a bounded common shape, local@label(.label){0,2}.tld,
//   so that a small model cannot run away inside one), integer minimum / maximum / exclusiveMinimum
//   / exclusiveMaximum, number bounds of every kind exactly in decimal (number_range.cpp:
//   exclusiveMinimum 0 allows 0.5, not 0; bounded numbers are written without an exponent),
//   nullable (OpenAPI).
// Anything else that constrains values (not, if/then/else, patternProperties, uniqueItems,
// contains, multipleOf, dependent*, minProperties beyond the required ones, unknown
// formats, unknown keywords) is refused with an error naming it: never silently ignored.
// Output is generated in the order properties are declared. Whitespace is bounded so that a
// sequence cannot run away in it: none before a colon and at most one space after it; at the
// other gaps nothing, one space, or a newline and an indent of up to 16 spaces or 4 tabs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>

#include "core/error.h"
#include "grammar/grammar.h"
#include "grammar/int_range.h"
#include "grammar/number_range.h"
#include "grammar/regex.h"

namespace hablar::grammar {

namespace {

using json = nlohmann::ordered_json;

[[noreturn]] void refuse(const std::string& where, const std::string& what) {
  throw_error(ErrorKind::kInvalidArgument,
              "json schema" + (where.empty() ? std::string() : " at " + where) + ": " + what);
}

// A count keyword (minItems, maxLength, maxProperties, ...): a non-negative integer, which
// JSON Schema also lets be written as a float with no fraction (5.0); -1 when absent. Beyond
// int64 it reads as INT64_MAX (every such bound is refused or unlimited further on); anything
// else is refused, never converted (a float beyond int64 must not reach a cast).
int64_t count_keyword(const json& s, const char* key, const std::string& where) {
  if (!s.contains(key)) return -1;
  const json& v = s[key];
  if (v.is_number_unsigned())
    return v.get<uint64_t>() > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d >= 0 && d == std::floor(d))
      return d >= 9.2e18 ? INT64_MAX : (int64_t)d;
  }
  refuse(where, std::string("'") + key + "' must be a non-negative integer");
}

const std::set<std::string>& annotation_keys() {
  static const std::set<std::string> k = {
      "title",         "description",     "default",          "examples",  "$schema", "$id",
      "$comment",      "deprecated",      "readOnly",         "writeOnly", "$defs",   "definitions",
      "discriminator", "contentEncoding", "contentMediaType", "strict",    "$anchor"};
  return k;
}

// Keywords this converter reads (anything else is refused).
const std::set<std::string>& handled_keys() {
  static const std::set<std::string> k = {"type",
                                          "enum",
                                          "const",
                                          "anyOf",
                                          "oneOf",
                                          "allOf",
                                          "$ref",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "items",
                                          "prefixItems",
                                          "minItems",
                                          "maxItems",
                                          "minLength",
                                          "maxLength",
                                          "pattern",
                                          "format",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "nullable",
                                          "uniqueItems",
                                          "minProperties",
                                          "maxProperties",
                                          "unevaluatedProperties",
                                          "multipleOf"};
  return k;
}

const char* kPrimitives = R"(ws ::= | " " | "\n" ( " "{0,16} | "\t"{0,4} )
colon ::= ":" " "?
char ::= [^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
string ::= "\"" char* "\""
integer ::= "-"? ("0" | [1-9] [0-9]{0,15})
number ::= "-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?
boolean ::= "true" | "false"
null ::= "null"
value ::= object | array | string | number | boolean | null
object ::= "{" ws ( string colon value ws ( "," ws string colon value ws )* )? "}"
array ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
date-fmt ::= ([1-9] [0-9]{3} | "0" [1-9] [0-9]{2} | "00" [1-9] [0-9] | "000" [1-9]) "-" ( ("01" | "03" | "05" | "07" | "08" | "10" | "12") "-" ("0" [1-9] | [12] [0-9] | "3" [01]) | ("04" | "06" | "09" | "11") "-" ("0" [1-9] | [12] [0-9] | "30") | "02" "-" ("0" [1-9] | "1" [0-9] | "2" [0-8]) )
time-fmt ::= ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])
octet ::= "25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9]
)";

class Converter {
 public:
  Converter(const json& root, std::string prefix) : root_(root), prefix_(std::move(prefix)) {}

  // `name ::= ...` and the helper rules (without the primitives).
  std::string rules(const std::string& name) {
    const std::string e = visit(root_, "root", "#");
    std::string out = name + " ::= " + e + "\n";
    for (const auto& [rule, body] : rules_) out += rule + " ::= " + body + "\n";
    return out;
  }

 private:
  std::string new_rule(const std::string& hint, const std::string& body) {
    const std::string name = unique_name(hint);
    rules_[name] = body;
    return name;
  }
  std::string unique_name(const std::string& hint) {
    std::string base;
    for (char c : hint) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
      base += ok ? c : '-';
    }
    if (base.empty() || base.size() > 40) base = "r";
    if (base.rfind(prefix_ + "-", 0) != 0) base = prefix_ + "-" + base;
    std::string name = base;
    for (int i = 2; rules_.count(name) || reserved_.count(name); ++i)
      name = base + "-" + std::to_string(i);
    reserved_.insert(name);
    return name;
  }

  const json& resolve(const std::string& ref, const std::string& where) {
    if (ref.empty() || ref[0] != '#') refuse(where, "only local $ref (#...) is supported: " + ref);
    const json* node = &root_;
    if (ref.size() > 1) {
      try {
        node = &root_.at(json::json_pointer(ref.substr(1)));
      } catch (const std::exception&) {
        refuse(where, "$ref '" + ref + "' does not resolve");
      }
    }
    return *node;
  }

  std::string visit(const json& s, const std::string& hint, const std::string& where);
  std::string visit_typed(const json& s, const std::string& type, const std::string& hint,
                          const std::string& where);
  std::string object(const json& s, const std::string& hint, const std::string& where);
  std::string array(const json& s, const std::string& hint, const std::string& where);
  std::string string_of(const json& s, const std::string& where);
  std::string integer_of(const json& s, const std::string& where);
  std::string number_of(const json& s, const std::string& where);
  json merge_all_of(const json& s, const std::string& where);

  const json& root_;
  std::string prefix_;  // of every helper rule's name
  std::map<std::string, std::string> rules_;
  std::set<std::string> reserved_;
  std::map<std::string, std::string> ref_rules_;
};

std::string literal_json(const json& v) {
  return gbnf_literal(v.dump());
}

void check_keys(const json& s, const std::string& where) {
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    if (annotation_keys().count(k) || handled_keys().count(k)) continue;
    if (k.rfind("x-", 0) == 0) continue;
    refuse(where, "the keyword '" + k + "' cannot be enforced");
  }
}

std::string Converter::visit(const json& s, const std::string& hint, const std::string& where) {
  if (s.is_boolean()) {
    if (!s.get<bool>()) refuse(where, "the schema 'false' allows no value");
    return "value";
  }
  if (!s.is_object()) refuse(where, "a schema must be an object or a boolean");
  check_keys(s, where);
  if (s.contains("nullable") && s["nullable"] == true) {
    json inner = s;
    inner.erase("nullable");
    return "( " + visit(inner, hint, where) + " | null )";
  }
  if (s.contains("$ref")) {
    if (s.size() > 1) {
      for (auto it = s.begin(); it != s.end(); ++it)
        if (it.key() != "$ref" && !annotation_keys().count(it.key()))
          refuse(where, "keywords beside $ref ('" + it.key() + "') are not supported");
    }
    const std::string ref = s["$ref"].get<std::string>();
    auto found = ref_rules_.find(ref);
    if (found != ref_rules_.end()) return found->second;
    const std::string name = unique_name("ref-" + ref.substr(ref.rfind('/') + 1));
    ref_rules_[ref] = name;
    rules_[name] = visit(resolve(ref, where), name, ref);
    return name;
  }
  if (s.contains("const")) return literal_json(s["const"]);
  if (s.contains("enum")) {
    if (!s["enum"].is_array() || s["enum"].empty()) refuse(where, "'enum' must be a list");
    std::string e = "(";
    for (size_t i = 0; i < s["enum"].size(); ++i)
      e += (i ? " | " : " ") + literal_json(s["enum"][i]);
    return e + " )";
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (!s.contains(key)) continue;
    const json& alts = s[key];
    if (!alts.is_array() || alts.empty())
      refuse(where, std::string("'") + key + "' must be a list");
    // Keywords beside the alternatives hold for each of them: {"type": "object", "anyOf":
    // [A, B]} is A and B, each merged with {"type": "object"} (as allOf merges).
    json beside = json::object();
    for (auto it = s.begin(); it != s.end(); ++it)
      if (it.key() != key && !annotation_keys().count(it.key())) beside[it.key()] = *it;
    std::string e = "(";
    for (size_t i = 0; i < alts.size(); ++i) {
      const json alt = beside.empty() ? alts[i] : json{{"allOf", json::array({beside, alts[i]})}};
      e += (i ? " | " : " ") +
           visit(alt, hint + "-" + std::to_string(i), where + "/" + key + "/" + std::to_string(i));
    }
    return e + " )";
  }
  if (s.contains("allOf")) return visit(merge_all_of(s, where), hint, where);
  if (s.contains("type")) {
    const json& t = s["type"];
    if (t.is_string()) return visit_typed(s, t.get<std::string>(), hint, where);
    if (!t.is_array() || t.empty()) refuse(where, "'type' must be a name or a list of names");
    std::string e = "(";
    for (size_t i = 0; i < t.size(); ++i) {
      if (!t[i].is_string()) refuse(where, "'type' must be a name or a list of names");
      e += (i ? " | " : " ") + visit_typed(s, t[i].get<std::string>(), hint, where);
    }
    return e + " )";
  }
  if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required"))
    return visit_typed(s, "object", hint, where);
  if (s.contains("items") || s.contains("prefixItems")) return visit_typed(s, "array", hint, where);
  if (s.contains("pattern") || s.contains("format") || s.contains("minLength") ||
      s.contains("maxLength"))
    return visit_typed(s, "string", hint, where);
  if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
      s.contains("exclusiveMaximum"))
    return visit_typed(s, "number", hint, where);
  return "value";
}

std::string Converter::visit_typed(const json& s, const std::string& type, const std::string& hint,
                                   const std::string& where) {
  if (type == "object") return object(s, hint, where);
  if (type == "array") return array(s, hint, where);
  if (type == "string") return string_of(s, where);
  if (type == "integer") return integer_of(s, where);
  if (type == "number") return number_of(s, where);
  if (type == "boolean") return "boolean";
  if (type == "null") return "null";
  refuse(where, "unknown type '" + type + "'");
}

json Converter::merge_all_of(const json& s, const std::string& where) {
  json merged = json::object();
  for (auto it = s.begin(); it != s.end(); ++it)
    if (it.key() != "allOf") merged[it.key()] = it.value();
  const json& parts = s["allOf"];
  if (!parts.is_array() || parts.empty()) refuse(where, "'allOf' must be a list");
  for (const json& raw : parts) {
    const json* p = &raw;
    while (p->is_object() && p->contains("$ref")) p = &resolve((*p)["$ref"], where);
    if (!p->is_object()) refuse(where, "allOf parts must be schemas");
    for (auto it = p->begin(); it != p->end(); ++it) {
      const std::string& k = it.key();
      if (annotation_keys().count(k)) continue;
      if (k == "properties") {
        for (auto q = it->begin(); q != it->end(); ++q) {
          if (merged["properties"].contains(q.key()) && merged["properties"][q.key()] != *q)
            refuse(where, "allOf gives property '" + q.key() + "' two different schemas");
          merged["properties"][q.key()] = *q;
        }
      } else if (k == "required") {
        for (const json& r : *it) merged["required"].push_back(r);
      } else if (k == "enum" && merged.contains("enum") && merged["enum"].is_array() &&
                 it->is_array()) {
        json common = json::array();  // the values every part allows, in the first's order
        for (const json& v : merged["enum"])
          if (std::find(it->begin(), it->end(), v) != it->end()) common.push_back(v);
        if (common.empty()) refuse(where, "allOf parts' enums have no value in common");
        merged["enum"] = std::move(common);
      } else if (!merged.contains(k)) {
        merged[k] = *it;
      } else if (merged[k] != *it) {
        refuse(where, "allOf parts disagree on '" + k + "': only object schemas merge");
      }
    }
  }
  if (merged.contains("allOf")) merged.erase("allOf");
  // A part closed with additionalProperties false sees only its own properties: every merged
  // property must be among them, or no document could satisfy it.
  std::vector<const json*> closed;
  if (s.contains("additionalProperties") && s["additionalProperties"] == false)
    closed.push_back(&s);
  for (const json& raw : parts) {
    const json* p = &raw;
    while (p->is_object() && p->contains("$ref")) p = &resolve((*p)["$ref"], where);
    if (p->contains("additionalProperties") && (*p)["additionalProperties"] == false)
      closed.push_back(p);
  }
  const json all_props = merged.value("properties", json::object());
  for (const json* c : closed) {
    const json own = c->value("properties", json::object());
    for (auto it = all_props.begin(); it != all_props.end(); ++it) {
      if (!own.contains(it.key()))
        refuse(where, "allOf: property '" + it.key() +
                          "' is excluded by a part's additionalProperties false");
    }
  }
  merged.erase("additionalProperties");
  return merged;
}

std::string Converter::object(const json& s, const std::string& hint, const std::string& where) {
  const json props = s.value("properties", json::object());
  if (!props.is_object()) refuse(where, "'properties' must be an object");
  std::set<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) refuse(where, "'required' must be a list");
    for (const json& r : s["required"]) required.insert(r.get<std::string>());
  }
  json extra = s.contains("additionalProperties") ? s["additionalProperties"] : json(true);
  // Declared properties in order, then required names declared nowhere (any value, or the
  // additionalProperties schema).
  std::vector<std::pair<std::string, json>> list;
  for (auto it = props.begin(); it != props.end(); ++it) list.push_back({it.key(), *it});
  for (const std::string& r : required)
    if (!props.contains(r)) {
      if (extra.is_boolean() && !extra.get<bool>())
        refuse(where, "'" + r + "' is required but additionalProperties is false");
      list.push_back({r, extra.is_object() ? extra : json(true)});
    }
  const size_t n_required = required.size();
  const int64_t max_properties = count_keyword(s, "maxProperties", where);
  if (count_keyword(s, "minProperties", where) > (int64_t)n_required)
    refuse(where, "'minProperties' above the number of required properties cannot be enforced");
  if (max_properties >= 0 && max_properties < (int64_t)list.size())
    refuse(where, "'maxProperties' below the number of declared properties cannot be enforced");
  if (s.contains("unevaluatedProperties") && s["unevaluatedProperties"] != false)
    refuse(where, "'unevaluatedProperties' other than false cannot be enforced");

  if (list.empty() && extra.is_object()) {  // a map: any keys, values of one schema
    const std::string v = visit(extra, hint + "-value", where + "/additionalProperties");
    const std::string kv = new_rule(hint + "-kv", "string colon " + v + " ws");
    // maxProperties bounds the entries (a repeated key only lowers the count: still valid).
    std::string more = "*";
    if (max_properties >= 0) {
      const int64_t max = max_properties;
      if (max > 1000) refuse(where, "'maxProperties' above 1000 is not supported");
      if (max <= 0) return new_rule(hint, "\"{\" ws \"}\"");
      more = "{0," + std::to_string(max - 1) + "}";
    }
    return new_rule(hint, "\"{\" ws ( " + kv + " ( \",\" ws " + kv + " )" + more + " )? \"}\"");
  }
  if (list.empty()) return new_rule(hint, "\"{\" ws \"}\"");
  std::vector<std::string> kv(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string v =
        visit(list[i].second, hint + "-" + list[i].first, where + "/properties/" + list[i].first);
    kv[i] = gbnf_literal(json(list[i].first).dump()) + " colon " + v + " ws";
  }
  // rest_i: properties i.. after at least one was written (each with its comma);
  // first_i: properties i.. before any was written.
  const size_t n = list.size();
  std::vector<std::string> rest(n + 1), first(n + 1);
  for (size_t i = n; i-- > 0;) {
    const bool req = required.count(list[i].first) > 0;
    const std::string tail = rest[i + 1].empty() ? "" : " " + rest[i + 1];
    const std::string item = "\",\" ws " + kv[i];
    const std::string body = req ? item + tail : "( " + item + " )?" + tail;
    rest[i] = new_rule(hint + "-rest", body);
    std::string fbody = kv[i] + tail;
    if (!req) fbody += first[i + 1].empty() ? " | \"\"" : " | " + first[i + 1];
    first[i] = new_rule(hint + "-first", fbody);
  }
  return new_rule(hint, "\"{\" ws " + first[0] + " \"}\"");
}

std::string Converter::array(const json& s, const std::string& hint, const std::string& where) {
  if (s.contains("uniqueItems") && s["uniqueItems"] == true)
    refuse(where, "'uniqueItems' cannot be enforced");
  std::vector<json> prefix;
  json items = s.contains("items") ? s["items"] : json(true);
  if (s.contains("prefixItems")) {
    const json& pre = s["prefixItems"];
    // A single schema where a list belongs (written so by some generators, read so by
    // llama.cpp): the schema of every item, when `items` says nothing else.
    const bool items_free = items == json(true) || items == json::object();
    if (pre.is_object() && items_free) {
      items = pre;
    } else {
      if (!pre.is_array()) refuse(where, "'prefixItems' must be a list");
      for (const json& p : pre) prefix.push_back(p);
    }
  }
  if (items.is_array()) {  // draft-07 tuple form
    for (const json& p : items) prefix.push_back(p);
    items = s.contains("additionalItems") ? s["additionalItems"] : json(true);
  }
  const bool more = !(items.is_boolean() && !items.get<bool>());
  const int64_t min = std::max<int64_t>(count_keyword(s, "minItems", where), 0);
  int64_t max = count_keyword(s, "maxItems", where);
  if (!more)
    max = max < 0 ? (int64_t)prefix.size() : std::min<int64_t>(max, (int64_t)prefix.size());
  if (max >= 0 && min > max) refuse(where, "minItems above the items that may be written");
  if (min > 1000 || max > 1000) refuse(where, "minItems / maxItems above 1000 are not supported");
  std::vector<std::string> pre;
  for (size_t i = 0; i < prefix.size(); ++i)
    pre.push_back(visit(prefix[i], hint + "-" + std::to_string(i),
                        where + "/prefixItems/" + std::to_string(i)));
  const std::string item = more ? visit(items, hint + "-item", where + "/items") : "";
  // Items from position i on, i > 0 (each with its comma), given that min/max count all.
  std::string tail;  // positions >= prefix.size()
  const int64_t p = (int64_t)prefix.size();
  auto count = [](int64_t lo, int64_t hi) {
    if (hi < 0) return "{" + std::to_string(lo) + ",}";
    return "{" + std::to_string(lo) + "," + std::to_string(hi) + "}";
  };
  if (more && (max < 0 || max > p)) {
    const int64_t lo = std::max<int64_t>(0, min - std::max<int64_t>(p, 1));
    const int64_t hi = max < 0 ? -1 : max - std::max<int64_t>(p, 1);
    tail = "( \",\" ws " + item + " ws )" + count(lo, hi);
  }
  if (p == 0) {
    if (!more || max == 0) return new_rule(hint, "\"[\" ws \"]\"");
    std::string body = item + " ws " + tail;
    if (min == 0) body = "( " + body + " )?";
    return new_rule(hint, "\"[\" ws " + body + " \"]\"");
  }
  // Prefix positions, nested right to left: position i is required when i < min.
  std::string after = tail;
  for (int64_t i = p - 1; i >= 0; --i) {
    const std::string head = (i == 0 ? "" : "\",\" ws ") + pre[(size_t)i] + " ws";
    std::string body = after.empty() ? head : head + " " + after;
    if (max >= 0 && i >= max) body = "";
    if (!body.empty() && i >= min) body = "( " + body + " )?";
    after = body.empty() ? "" : new_rule(hint + "-at" + std::to_string(i), body);
  }
  return new_rule(hint, "\"[\" ws " + (after.empty() ? std::string() : after + " ") + "\"]\"");
}

std::string Converter::string_of(const json& s, const std::string& where) {
  const int64_t min = std::max<int64_t>(count_keyword(s, "minLength", where), 0);
  const int64_t max = count_keyword(s, "maxLength", where);
  if (max >= 0 && min > max) refuse(where, "minLength above maxLength");
  if (min > 10000 || max > 10000) refuse(where, "string lengths above 10000 are not supported");
  const bool has_len = s.contains("minLength") || s.contains("maxLength");
  if (s.contains("format") && (s.contains("pattern") || has_len))
    refuse(where, "'format' together with 'pattern' or lengths is not supported");
  if (s.contains("pattern") && has_len)
    refuse(where, "'pattern' together with minLength / maxLength is not supported");
  if (s.contains("pattern")) {
    try {
      return "\"\\\"\" " + regex_to_gbnf_expr(s["pattern"].get<std::string>(), true) + " \"\\\"\"";
    } catch (const Error& e) {
      refuse(where, e.what());
    }
  }
  if (s.contains("format")) {
    const std::string f = s["format"].get<std::string>();
    static const std::map<std::string, std::string> formats = {
        {"date", R"(date-fmt)"},
        {"time", R"(time-fmt)"},
        {"date-time", R"(date-fmt "T" time-fmt)"},
        {"uuid",
         R"([0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12})"},
        {"email",
         R"([a-zA-Z0-9_+-] [a-zA-Z0-9._+-]{0,23} "@" [a-zA-Z0-9] [a-zA-Z0-9-]{0,15} ("." [a-zA-Z0-9] [a-zA-Z0-9-]{0,15}){0,2} "." [a-zA-Z]{2,6})"},
        {"ipv4", R"(octet "." octet "." octet "." octet)"},
    };
    auto it = formats.find(f);
    if (it == formats.end()) refuse(where, "the string format '" + f + "' cannot be enforced");
    return "\"\\\"\" " + it->second + " \"\\\"\"";
  }
  if (!has_len) return "string";
  return "\"\\\"\" char" +
         (max < 0 ? "{" + std::to_string(min) + ",}"
                  : "{" + std::to_string(min) + "," + std::to_string(max) + "}") +
         " \"\\\"\"";
}

// Whole-number bounds of a schema: lo <= v <= hi for integers (absent: unbounded).
struct WholeBounds {
  std::optional<int64_t> lo, hi;
};

WholeBounds whole_bounds(const json& s, const std::string& where, bool integer) {
  WholeBounds b;
  auto num = [&](const char* k) -> std::optional<double> {
    if (!s.contains(k)) return std::nullopt;
    if (s[k].is_boolean())
      refuse(where, std::string("draft-4 boolean '") + k + "' is not supported");
    if (!s[k].is_number()) refuse(where, std::string("'") + k + "' must be a number");
    const double v = s[k].get<double>();
    if (std::fabs(v) > 1e15) refuse(where, std::string("'") + k + "' is too large to enforce");
    return v;
  };
  auto tighten_lo = [&](int64_t v) { b.lo = b.lo ? std::max(*b.lo, v) : v; };
  auto tighten_hi = [&](int64_t v) { b.hi = b.hi ? std::min(*b.hi, v) : v; };
  if (auto v = num("minimum")) tighten_lo((int64_t)std::ceil(*v));
  if (auto v = num("maximum")) tighten_hi((int64_t)std::floor(*v));
  if (auto v = num("exclusiveMinimum")) tighten_lo((int64_t)std::floor(*v) + 1);
  if (auto v = num("exclusiveMaximum")) tighten_hi((int64_t)std::ceil(*v) - 1);
  if (b.lo && b.hi && *b.lo > *b.hi)
    refuse(where, integer ? "no integer lies within the bounds"
                          : "the bounds leave no whole-number range to enforce");
  return b;
}

std::string Converter::integer_of(const json& s, const std::string& where) {
  if (s.contains("multipleOf") && s["multipleOf"] != 1)
    refuse(where, "'multipleOf' cannot be enforced");
  const WholeBounds b = whole_bounds(s, where, true);
  if (!b.lo && !b.hi) return "integer";
  return "( " + int_range_gbnf(b.lo, b.hi) + " )";
}

// Bounds of a number schema: exact decimal ranges (number_range.cpp), written without an
// exponent; the tighter of minimum / exclusiveMinimum (and of the maxima) applies.
std::string Converter::number_of(const json& s, const std::string& where) {
  if (s.contains("multipleOf")) refuse(where, "'multipleOf' cannot be enforced");
  auto bound = [&](const char* incl, const char* excl, bool lower) -> std::optional<NumBound> {
    std::optional<NumBound> out;
    for (const char* k : {incl, excl}) {
      if (!s.contains(k)) continue;
      if (s[k].is_boolean())
        refuse(where, std::string("draft-4 boolean '") + k + "' is not supported");
      if (!s[k].is_number()) refuse(where, std::string("'") + k + "' must be a number");
      NumBound b;
      try {
        b.value = parse_decimal(s[k].dump());
      } catch (const Error& e) {
        refuse(where, std::string("'") + k + "': " + e.what());
      }
      b.exclusive = k == excl;
      if (!out) {
        out = b;
        continue;
      }
      const int c = decimal_compare(b.value, out->value);
      if (c == 0) out->exclusive = out->exclusive || b.exclusive;
      if ((lower && c > 0) || (!lower && c < 0)) out = b;
    }
    return out;
  };
  const auto lo = bound("minimum", "exclusiveMinimum", true);
  const auto hi = bound("maximum", "exclusiveMaximum", false);
  if (!lo && !hi) return "number";
  try {
    return number_range_gbnf(lo, hi);
  } catch (const Error& e) {
    refuse(where, e.what());
  }
}

}  // namespace

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema) {
  return Converter(schema, "s").rules("root") + kPrimitives;
}

std::string json_schema_rules(const nlohmann::ordered_json& schema, const std::string& name) {
  return Converter(schema, name).rules(name);
}

std::string json_primitives_gbnf() {
  return kPrimitives;
}

std::string any_json_object_gbnf() {
  return std::string("root ::= object\n") + kPrimitives;
}

}  // namespace hablar::grammar
