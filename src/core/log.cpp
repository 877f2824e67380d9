#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <string>

namespace hablar::log {

void init_stderr() {
  auto logger = spdlog::stderr_color_mt("hablar");
  logger->set_pattern("%^%L%$ %H:%M:%S.%e %v");
  spdlog::set_default_logger(logger);
}

void set_level(std::string_view level) {
  spdlog::set_level(spdlog::level::from_str(std::string(level)));
}

}  // namespace hablar::log
