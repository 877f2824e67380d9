// Typed, validated access to the fields of a JSON request body. Every failure is an
// ApiError 400 naming the field, e.g. "'temperature' must be a number between 0 and 2".
// Unknown fields are ignored (OpenAI clients send many).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hablar::server {

// The request body as a JSON object: 400 for malformed JSON, invalid UTF-8 or a non-object.
nlohmann::json parse_body_object(const std::string& body);
// The same for a body of any JSON value (llama-server's /lora-adapters takes a list).
nlohmann::json parse_body_json(const std::string& body);
// 400 when JSON text nests deeper than kMaxJsonDepth (checked before any parse of request data).
void check_json_depth(std::string_view text);

std::optional<double> opt_number(const nlohmann::json& body, const char* key, double lo, double hi);
std::optional<int64_t> opt_integer(const nlohmann::json& body, const char* key, int64_t lo,
                                   int64_t hi);
std::optional<bool> opt_bool(const nlohmann::json& body, const char* key);
std::optional<std::string> opt_string(const nlohmann::json& body, const char* key);
// A string or a list of strings (e.g. "stop"), at most `max_items`.
std::vector<std::string> opt_string_list(const nlohmann::json& body, const char* key,
                                         size_t max_items);
// Ollama's keep_alive in nanoseconds: a number of seconds or a Go duration ("5m", "1h30m",
// "300ms"); -1 (any negative) keeps the model loaded for good.
std::optional<int64_t> opt_keep_alive_ns(const nlohmann::json& body);

}  // namespace hablar::server
