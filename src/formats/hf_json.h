// Checked access to the JSON files of Hugging Face checkpoints (config.json,
// tokenizer.json, ...): every reader names the file and the key at fault, so a malformed
// file gives an Error(kFormat), never an exception from the JSON library or a crash.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace hablar::formats {

// Parses text after a nesting-depth check (at most 64 levels). `name` appears in errors.
nlohmann::json parse_json_text(std::string_view text, const std::string& name);
// read_small_file + parse_json_text.
nlohmann::json parse_json_file(const std::string& path, size_t max_bytes);

// The member `key` of object `j` when present and not null, converted; a present value of
// another type is an error naming `where` and the key.
std::string json_string_or(const nlohmann::json& j, const char* key, std::string fallback,
                           const std::string& where);
double json_number_or(const nlohmann::json& j, const char* key, double fallback,
                      const std::string& where);
bool json_bool_or(const nlohmann::json& j, const char* key, bool fallback,
                  const std::string& where);
int64_t json_int_or(const nlohmann::json& j, const char* key, int64_t fallback,
                    const std::string& where);
// A required integer in [1, 2^30].
int64_t json_positive_int(const nlohmann::json& j, const char* key, const std::string& where);
// The member as an object / array, or nullptr when absent or null.
const nlohmann::json* json_object_or_null(const nlohmann::json& j, const char* key,
                                          const std::string& where);
const nlohmann::json* json_array_or_null(const nlohmann::json& j, const char* key,
                                         const std::string& where);

}  // namespace hablar::formats
