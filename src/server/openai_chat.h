// OpenAI chat request parsing shared by /v1/chat/completions, /apply-template and Ollama's
// /api/chat: message validation and normalization for chat templates.
#pragma once

#include <nlohmann/json.hpp>

#include "server/serving_model.h"

namespace hablar::server {

// Checks `messages` (a non-empty list of {role, content, ...}) and returns them in the form
// templates expect: content parts joined into one string, tool-call arguments as objects.
nlohmann::json normalize_messages(const nlohmann::json& messages);

// The tools a template should see given "tools" and "tool_choice" (null when none).
nlohmann::json select_tools(const nlohmann::json& body);

// Whether generated text needs the output parser (tool calls or reasoning tags).
bool needs_output_parser(const ServingModel& m, const nlohmann::json& tools);

}  // namespace hablar::server
