// Logging: a thin layer over spdlog so that the rest of the code names one logger.
// Logs go to stderr; stdout stays free for program output (generated text, JSON).
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace hablar::log {

// Level names: trace, debug, info, warn, error, off.
void set_level(std::string_view level);
void init_stderr();

template <typename... Args>
void info(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  spdlog::info(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void warn(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  spdlog::warn(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void error(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  spdlog::error(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void debug(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  spdlog::debug(fmt, std::forward<Args>(args)...);
}

}  // namespace hablar::log
