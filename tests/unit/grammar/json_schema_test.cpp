// JSON Schema -> grammar: valid documents accepted, invalid ones refused, unsupported
// keywords refused with errors; integer ranges checked against every number in a window;
// regex front end.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "grammar/grammar.h"
#include "grammar/int_range.h"
#include "grammar/recognizer.h"
#include "grammar/regex.h"

namespace hablar::grammar {
namespace {

using json = nlohmann::ordered_json;

bool accepts(const Grammar& g, std::string_view text) {
  Recognizer rec(g);
  RecState s = rec.initial();
  return rec.advance_bytes(s, text) && Recognizer::can_end(s);
}

Grammar schema_grammar(const char* schema) {
  const std::string text = json_schema_to_gbnf(json::parse(schema));
  try {
    return parse_gbnf(text, GbnfSource::kGenerated);
  } catch (const Error& e) {
    ADD_FAILURE() << e.what() << "\n" << text;
    throw;
  }
}

TEST(JsonSchema, ObjectRequiredOptionalOrder) {
  Grammar g = schema_grammar(R"({"type": "object", "properties": {
      "a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}},
      "required": ["b"], "additionalProperties": false})");
  EXPECT_TRUE(accepts(g, R"({"b": "x"})"));
  EXPECT_TRUE(accepts(g, R"({"a": 1, "b": "x", "c": true})"));
  EXPECT_TRUE(accepts(g, R"({"a":-12,"b":"x"})"));
  EXPECT_TRUE(accepts(g, "{\n  \"b\": \"x\",\n  \"c\": false\n}"));
  EXPECT_FALSE(accepts(g, R"({"a": 1})"));            // b missing
  EXPECT_FALSE(accepts(g, R"({"b": "x", "d": 1})"));  // extra
  EXPECT_FALSE(accepts(g, R"({"b": 1})"));            // wrong type
  EXPECT_FALSE(accepts(g, R"({"b": "x",})"));         // trailing comma
  EXPECT_FALSE(accepts(g, R"({, "b": "x"})"));
}

TEST(JsonSchema, ArraysEnumsConsts) {
  Grammar g = schema_grammar(R"({"type": "array", "items": {"enum": ["red", 2, null]},
      "minItems": 1, "maxItems": 3})");
  EXPECT_TRUE(accepts(g, R"(["red"])"));
  EXPECT_TRUE(accepts(g, R"([2, null, "red"])"));
  EXPECT_FALSE(accepts(g, "[]"));
  EXPECT_FALSE(accepts(g, R"([2, 2, 2, 2])"));
  EXPECT_FALSE(accepts(g, R"(["blue"])"));
  Grammar t = schema_grammar(R"({"type": "array", "prefixItems": [{"type": "integer"},
      {"const": "x"}], "items": false, "minItems": 1})");
  EXPECT_TRUE(accepts(t, "[1]"));
  EXPECT_TRUE(accepts(t, R"([1, "x"])"));
  EXPECT_FALSE(accepts(t, R"([1, "x", 2])"));
  EXPECT_FALSE(accepts(t, "[]"));
}

TEST(JsonSchema, RefsAndRecursion) {
  Grammar g = schema_grammar(R"({"$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"]}}, "$ref": "#/$defs/node"})");
  EXPECT_TRUE(accepts(g, R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": []}]})"));
  EXPECT_FALSE(accepts(g, R"({"v": 1, "kids": [{"w": 2}]})"));
}

TEST(JsonSchema, AnyOfNullableTypeLists) {
  Grammar g = schema_grammar(R"({"anyOf": [{"type": "string"}, {"type": "null"}]})");
  EXPECT_TRUE(accepts(g, "null"));
  EXPECT_TRUE(accepts(g, R"("s")"));
  EXPECT_FALSE(accepts(g, "1"));
  Grammar t = schema_grammar(R"({"type": ["integer", "boolean"]})");
  EXPECT_TRUE(accepts(t, "true"));
  EXPECT_TRUE(accepts(t, "-3"));
  EXPECT_FALSE(accepts(t, "1.5"));
}

TEST(JsonSchema, AllOfMergesObjects) {
  Grammar g = schema_grammar(R"({"allOf": [
      {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
      {"properties": {"b": {"type": "string"}}, "required": ["b"]}]})");
  EXPECT_TRUE(accepts(g, R"({"a": 1, "b": "x"})"));
  EXPECT_FALSE(accepts(g, R"({"a": 1})"));
}

TEST(JsonSchema, StringsLengthsPatternsFormats) {
  Grammar g = schema_grammar(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_TRUE(accepts(g, R"("ab")"));
  EXPECT_TRUE(accepts(g, R"("a\"b")"));  // an escape is one character
  EXPECT_FALSE(accepts(g, R"("a")"));
  EXPECT_FALSE(accepts(g, R"("abcd")"));
  Grammar p = schema_grammar(R"({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"})");
  EXPECT_TRUE(accepts(p, R"("AB-123")"));
  EXPECT_FALSE(accepts(p, R"("AB-12")"));
  EXPECT_FALSE(accepts(p, R"("ab-123")"));
  Grammar u = schema_grammar(R"({"type": "string", "pattern": "ab"})");  // unanchored
  EXPECT_TRUE(accepts(u, R"("xxabyy")"));
  EXPECT_FALSE(accepts(u, R"("xxa")"));
  Grammar d = schema_grammar(R"({"type": "string", "format": "date"})");
  EXPECT_TRUE(accepts(d, R"("2024-04-30")"));
  EXPECT_FALSE(accepts(d, R"("2024-04-31")"));
  EXPECT_FALSE(accepts(d, R"("2024-02-30")"));
  // Year 0000 has no calendar date (validators built on a date type refuse it); 0001 does.
  EXPECT_FALSE(accepts(d, R"("0000-01-20")"));
  EXPECT_TRUE(accepts(d, R"("0001-01-20")"));
  EXPECT_TRUE(accepts(d, R"("0100-01-20")"));
  Grammar dt = schema_grammar(R"({"type": "string", "format": "date-time"})");
  EXPECT_TRUE(accepts(dt, R"("2024-01-02T03:04:05Z")"));
  EXPECT_TRUE(accepts(dt, R"("2024-01-02T23:59:59.123+05:30")"));
  EXPECT_FALSE(accepts(dt, R"("2024-01-02 03:04:05Z")"));
  Grammar id = schema_grammar(R"({"type": "string", "format": "uuid"})");
  EXPECT_TRUE(accepts(id, R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_FALSE(accepts(id, R"("123e4567e89b12d3a456426614174000")"));
  Grammar em = schema_grammar(R"({"type": "string", "format": "email"})");
  EXPECT_TRUE(accepts(em, R"("a.b@example.com")"));
  EXPECT_FALSE(accepts(em, R"("a.b.example.com")"));
}

TEST(JsonSchema, NumericBounds) {
  Grammar g = schema_grammar(R"({"type": "integer", "minimum": -15, "exclusiveMaximum": 120})");
  for (int v = -40; v <= 160; ++v)
    EXPECT_EQ(accepts(g, std::to_string(v)), v >= -15 && v < 120) << v;
  EXPECT_FALSE(accepts(g, "007"));
  Grammar n = schema_grammar(R"({"type": "number", "minimum": 0, "maximum": 1})");
  EXPECT_TRUE(accepts(n, "0.25"));
  EXPECT_TRUE(accepts(n, "1"));
  EXPECT_TRUE(accepts(n, "1.0"));
  EXPECT_FALSE(accepts(n, "1.5"));
  EXPECT_FALSE(accepts(n, "-0.5"));
  Grammar m = schema_grammar(R"({"type": "number", "minimum": -2.5, "maximum": -1})");
  EXPECT_TRUE(accepts(m, "-1.5"));
  EXPECT_TRUE(accepts(m, "-2"));
  EXPECT_TRUE(accepts(m, "-1"));
  EXPECT_FALSE(accepts(m, "-2.7"));
  EXPECT_FALSE(accepts(m, "-0.5"));
  EXPECT_FALSE(accepts(m, "0"));
  Grammar t = schema_grammar(R"({"type": "number", "minimum": -50, "maximum": 60})");
  for (const char* ok : {"5.0", "0.5", "59.99", "60", "-49.5", "-50", "7"})
    EXPECT_TRUE(accepts(t, ok)) << ok;
  for (const char* bad : {"60.5", "-50.5", "61", "-51"}) EXPECT_FALSE(accepts(t, bad)) << bad;
  Grammar p = schema_grammar(R"({"type": "number", "minimum": 0})");
  for (const char* ok : {"5.0", "0", "0.25", "1234.5"}) EXPECT_TRUE(accepts(p, ok)) << ok;
  EXPECT_FALSE(accepts(p, "-1"));
  // Fractional and exclusive bounds are exact, not rounded to whole numbers.
  Grammar o = schema_grammar(R"({"type": "number", "exclusiveMinimum": 0, "maximum": 0.75})");
  for (const char* ok : {"0.5", "0.001", "0.75", "0.7500", "0.1"})
    EXPECT_TRUE(accepts(o, ok)) << ok;
  for (const char* bad : {"0", "0.0", "0.751", "1", "-0.5"}) EXPECT_FALSE(accepts(o, bad)) << bad;
  Grammar both = schema_grammar(
      R"({"type": "number", "minimum": 0.5, "exclusiveMinimum": 0.5, "exclusiveMaximum": 2})");
  EXPECT_FALSE(accepts(both, "0.5"));  // the tighter (exclusive) of equal bounds applies
  EXPECT_TRUE(accepts(both, "0.51"));
  EXPECT_TRUE(accepts(both, "1.999"));
  EXPECT_FALSE(accepts(both, "2"));
}

TEST(JsonSchema, MapsHonourMaxProperties) {
  Grammar g = schema_grammar(
      R"({"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 2})");
  EXPECT_TRUE(accepts(g, "{}"));
  EXPECT_TRUE(accepts(g, "{\"a\": 1, \"b\": 2}"));
  EXPECT_FALSE(accepts(g, "{\"a\": 1, \"b\": 2, \"c\": 3}"));
  Grammar none = schema_grammar(
      R"({"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 0})");
  EXPECT_TRUE(accepts(none, "{}"));
  EXPECT_FALSE(accepts(none, "{\"a\": 1}"));
}

TEST(JsonSchema, WhitespaceIsBounded) {
  Grammar g = schema_grammar(R"({"type": "object", "properties": {"a": {"type": "integer"}}})");
  EXPECT_TRUE(accepts(g, "{\"a\": 1}"));
  EXPECT_TRUE(accepts(g, "{\"a\":1}"));
  EXPECT_TRUE(accepts(g, "{\n    \"a\": 1\n}"));
  EXPECT_TRUE(accepts(g, "{\n\t\"a\": 1\n}"));
  EXPECT_FALSE(accepts(g, "{\"a\" : 1}"));      // nothing before a colon
  EXPECT_FALSE(accepts(g, "{\"a\":\n1}"));      // one space at most after it
  EXPECT_FALSE(accepts(g, "{\n\n\"a\": 1}"));   // one newline a gap
  EXPECT_FALSE(accepts(g, "{\n \t\"a\": 1}"));  // spaces or tabs, not both
  EXPECT_FALSE(accepts(g, "{\n" + std::string(17, ' ') + "\"a\": 1}"));  // 16 spaces at most
}

TEST(IntRange, EveryValueInWindows) {
  const std::vector<std::pair<std::optional<int64_t>, std::optional<int64_t>>> cases = {
      {0, 0},   {0, 9},   {5, 5},     {1, 1000}, {17, 431}, {-99, -7},
      {-5, 12}, {10, 99}, {100, 199}, {{}, 42},  {-3, {}},  {250, {}}};
  for (const auto& [lo, hi] : cases) {
    Grammar g = parse_gbnf("root ::= " + int_range_gbnf(lo, hi) + "\n");
    for (int64_t v = -1200; v <= 1200; ++v) {
      const bool want = (!lo || v >= *lo) && (!hi || v <= *hi);
      EXPECT_EQ(accepts(g, std::to_string(v)), want)
          << v << " in [" << (lo ? *lo : -999999) << ", " << (hi ? *hi : 999999) << "]";
    }
    EXPECT_FALSE(accepts(g, "-0"));
    EXPECT_FALSE(accepts(g, "01"));
  }
}

TEST(JsonSchema, KeywordsBesideAnyOfHoldForEachAlternative) {
  // {"type": "object", "anyOf": [...]}: each alternative merged with the keywords beside it.
  Grammar g = schema_grammar(R"({
    "type": "object",
    "required": ["id"],
    "properties": {"id": {"type": "integer"}},
    "anyOf": [{"$ref": "#/$defs/a"}, {"properties": {"b": {"type": "string"}}, "required": ["b"]}],
    "$defs": {"a": {"properties": {"a": {"type": "number"}}, "required": ["a"]}}})");
  EXPECT_TRUE(accepts(g, R"({"id": 1, "a": 2.5})"));
  EXPECT_TRUE(accepts(g, R"({"id": 1, "b": "x"})"));
  EXPECT_FALSE(accepts(g, R"({"a": 2.5})"));  // id is required beside either
  EXPECT_FALSE(accepts(g, R"({"id": 1})"));   // neither alternative
  EXPECT_FALSE(accepts(g, R"("text")"));
  // Nested: allOf parts holding an anyOf (the shape of schemastore's tsconfig schema).
  Grammar nested = schema_grammar(R"({"allOf": [
    {"properties": {"a": {"type": "number"}}},
    {"anyOf": [{"properties": {"c": {"type": "boolean"}}, "required": ["c"]},
               {"properties": {"d": {"type": "null"}}, "required": ["d"]}]}]})");
  EXPECT_TRUE(accepts(nested, R"({"a": 1, "c": true})"));
  EXPECT_TRUE(accepts(nested, R"({"d": null})"));
  EXPECT_FALSE(accepts(nested, R"({"a": 1})"));
}

TEST(JsonSchema, AllOfEnumsIntersect) {
  Grammar g = schema_grammar(R"({"allOf": [{"type": "string", "enum": ["a", "b", "c"]},
                                           {"type": "string", "enum": ["d", "c", "b"]}]})");
  EXPECT_TRUE(accepts(g, R"("b")"));
  EXPECT_TRUE(accepts(g, R"("c")"));
  EXPECT_FALSE(accepts(g, R"("a")"));
  EXPECT_FALSE(accepts(g, R"("d")"));
  EXPECT_THROW(json_schema_to_gbnf(json::parse(R"({"allOf": [{"enum": ["a"]}, {"enum": ["b"]}]})")),
               Error);
}

TEST(JsonSchema, PrefixItemsGivenAsOneSchemaIsEveryItem) {
  Grammar g = schema_grammar(R"({"type": "array", "prefixItems": {"type": "string"}})");
  EXPECT_TRUE(accepts(g, "[]"));
  EXPECT_TRUE(accepts(g, R"(["a", "b"])"));
  EXPECT_FALSE(accepts(g, R"(["a", 1])"));
  EXPECT_THROW(json_schema_to_gbnf(json::parse(
                   R"({"prefixItems": {"type": "string"}, "items": {"type": "integer"}})")),
               Error);
}

TEST(JsonSchema, RefusesWhatItCannotEnforce) {
  for (const char* s :
       {R"({"type": "array", "uniqueItems": true})", R"({"not": {"type": "string"}})",
        R"({"type": "string", "format": "hostname"})", R"({"type": "number", "multipleOf": 0.5})",
        R"({"type": "object", "patternProperties": {"^a": {}}})", R"({"if": {}, "then": {}})",
        R"({"$ref": "https://example.com/s.json"})", R"({"$ref": "#/$defs/missing"})",
        R"({"type": "integer", "minimum": 5, "maximum": 4})",
        R"({"type": "string", "pattern": "(?=a)b"})", R"({"type": "string", "pattern": "(a)\\1"})",
        R"({"type": "colour"})"}) {
    EXPECT_THROW(json_schema_to_gbnf(json::parse(s)), Error) << s;
  }
}

// Counts (minItems, maxLength, maxProperties, ...) are non-negative integers, also written as
// whole floats. A count beyond int64 (1.4e38 parses as a float) meets the bounds' "not
// supported" refusal; a fraction, a negative value or a string is refused as such; none is
// converted out of range (the grammar fuzzer's finding).
TEST(JsonSchema, CountKeywordsAreCheckedBeforeUse) {
  Grammar g = schema_grammar(R"({"type": "array", "items": {"type": "integer"},
      "minItems": 2.0, "maxItems": 3.0})");
  EXPECT_TRUE(accepts(g, "[1, 2]"));
  EXPECT_FALSE(accepts(g, "[1]"));
  EXPECT_FALSE(accepts(g, "[1, 2, 3, 4]"));
  for (const char* s :
       {R"({"type": "array", "maxItems": 144444444444444444444444444444444444444})",
        R"({"type": "string", "maxLength": 18446744073709551615})",
        R"({"type": "array", "minItems": 1e300})", R"({"type": "array", "maxItems": 2.5})",
        R"({"type": "array", "maxItems": -1})", R"({"type": "string", "minLength": -3})",
        R"({"type": "string", "maxLength": "5"})",
        R"({"type": "object", "additionalProperties": {"type": "integer"},
            "maxProperties": 1e30})",
        R"({"type": "object", "minProperties": -2.0})"}) {
    try {
      json_schema_to_gbnf(json::parse(s));
      ADD_FAILURE() << "accepted: " << s;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << s << ": " << e.what();
    }
  }
}

TEST(Regex, GuidedRegexAndChoices) {
  Grammar g = parse_gbnf(regex_to_gbnf("(cat|dog)s?: \\d+(\\.\\d\\d)?"));
  EXPECT_TRUE(accepts(g, "cats: 12"));
  EXPECT_TRUE(accepts(g, "dog: 3.50"));
  EXPECT_FALSE(accepts(g, "dog: 3.5"));
  EXPECT_FALSE(accepts(g, "cow: 1"));
  Grammar c = parse_gbnf(choices_to_gbnf({"yes", "no", "say \"hi\""}));
  EXPECT_TRUE(accepts(c, "say \"hi\""));
  EXPECT_FALSE(accepts(c, "maybe"));
  Grammar w = parse_gbnf(regex_to_gbnf("[^a-c\\s]{2}\\w*"));
  EXPECT_TRUE(accepts(w, "xy_9"));
  EXPECT_FALSE(accepts(w, "ax"));
  EXPECT_FALSE(accepts(w, "x "));
}

}  // namespace
}  // namespace hablar::grammar
