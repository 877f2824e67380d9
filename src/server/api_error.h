// Errors the HTTP layer sends back, in OpenAI's shape:
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "...", "code": ...}}
#pragma once

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

#include "core/error.h"

namespace hablar::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {})
      : std::runtime_error(std::move(message)), status_(status), param_(std::move(param)) {}
  // An error with its own OpenAI "type" and extra fields in the error object (llama-server's
  // exceed_context_size_error carries n_prompt_tokens and n_ctx).
  ApiError(int status, std::string message, std::string param, std::string type,
           nlohmann::json extra)
      : std::runtime_error(std::move(message)),
        status_(status),
        param_(std::move(param)),
        type_(std::move(type)),
        extra_(std::move(extra)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& type() const { return type_; }  // "" : by status
  const nlohmann::json& extra() const { return extra_; }

 private:
  int status_;
  std::string param_;
  std::string type_;
  nlohmann::json extra_;
};

[[noreturn]] inline void bad_request(std::string message, std::string param = {}) {
  throw ApiError(400, std::move(message), std::move(param));
}

// OpenAI's error "type" for a status code.
const char* error_type_for_status(int status);
nlohmann::json error_body(int status, const std::string& message, const std::string& param = {});

// Each API family has its own error body; clients parse theirs:
//   kOpenAI    {"error": {"message", "type", "param", "code"}}  (also llama.cpp's routes)
//   kAnthropic {"type": "error", "error": {"type": "invalid_request_error", "message"}}
//   kOllama    {"error": "message"}
enum class ErrorStyle { kOpenAI, kAnthropic, kOllama };
// The family a request path belongs to (/v1/messages..., /api/..., else OpenAI's).
ErrorStyle error_style_for_path(std::string_view path);
nlohmann::json error_body(ErrorStyle style, int status, const std::string& message,
                          const std::string& param = {});
nlohmann::json error_body(ErrorStyle style, const ApiError& e);
// The HTTP status of an engine or library error.
int status_for_error_kind(ErrorKind kind);

// JSON text that never throws on invalid UTF-8 (such bytes become U+FFFD).
std::string dump_json(const nlohmann::json& j);

// A short, escaped excerpt of a client's value for an error message: at most about
// `max_chars` characters of its JSON text, cut at a character boundary and marked with
// "...". Errors quote values this way only, so a 5 MB value never makes a 5 MB error.
std::string value_excerpt(const nlohmann::json& j, size_t max_chars = 48);
// The same for raw text (a key, a role, a header value): JSON-quoted and bounded.
std::string text_excerpt(std::string_view s, size_t max_chars = 48);

}  // namespace hablar::server
