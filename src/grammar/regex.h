// Front ends that produce GBNF text: regular expressions, choice lists and JSON Schema.
// Each throws Error(kInvalidArgument) naming what it cannot enforce.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace hablar::grammar {

// A GBNF expression (no rule name) for text matching the regex. json_string: the text is
// the inside of a JSON string, the regex applies to its decoded value, and an unanchored
// regex may match anywhere in it (JSON Schema "pattern" semantics); otherwise the whole
// text must match (guided_regex semantics).
std::string regex_to_gbnf_expr(std::string_view regex, bool json_string);
// A whole grammar: root ::= the regex.
std::string regex_to_gbnf(std::string_view regex);
// root ::= one of the texts, exactly.
std::string choices_to_gbnf(const std::vector<std::string>& choices);

// JSON Schema -> GBNF (see json_schema.cpp for the keywords and their limits). The output
// is JSON text (whitespace allowed between tokens, bounded) that validates against the
// schema.
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);
// The same as rules for use inside a larger grammar: `name ::= ...` and helper rules whose
// names start with `name-`, using the shared rules of json_primitives_gbnf() (ws, string,
// number, value, ...), which the larger grammar includes once.
std::string json_schema_rules(const nlohmann::ordered_json& schema, const std::string& name);
std::string json_primitives_gbnf();
// Any JSON object (response_format json_object, Ollama format "json").
std::string any_json_object_gbnf();

}  // namespace hablar::grammar
