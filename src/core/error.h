// Error type used across hablar: every failure that reaches a user is an hablar::Error
// carrying a message that names the thing at fault (file, key, tensor, parameter).
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace hablar {

// The broad class of a failure; the server maps these to HTTP status codes.
enum class ErrorKind {
  kInvalidArgument,  // bad user input or parameter (HTTP 400)
  kNotFound,         // a named thing does not exist (HTTP 404)
  kFormat,           // a malformed or unsupported file
  kUnsupported,      // valid but not implemented (architecture, tensor type, ...)
  kResource,         // out of memory, queue full, context exhausted
  kIo,               // operating-system I/O failure
  kDevice,           // CUDA / accelerator failure
  kInternal,         // a bug: an invariant did not hold
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message)
      : std::runtime_error(std::move(message)), kind_(kind) {}
  explicit Error(std::string message) : Error(ErrorKind::kInternal, std::move(message)) {}

  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

[[noreturn]] inline void throw_error(ErrorKind kind, std::string message) {
  throw Error(kind, std::move(message));
}

}  // namespace hablar

// HABLAR_CHECK(cond, msg): internal invariant; throws ErrorKind::kInternal with the location.
#define HABLAR_CHECK(cond, msg)                                                             \
  do {                                                                                      \
    if (!(cond))                                                                            \
      ::hablar::throw_error(::hablar::ErrorKind::kInternal,                                 \
                            std::string(__FILE__ ":") + std::to_string(__LINE__) + ": " + \
                                #cond + ": " + (msg));                                      \
  } while (0)
