// OpenAI chat request parsing shared by /v1/chat/completions, /apply-template and Ollama's
// /api/chat: message validation and normalization for chat templates.
#pragma once

#include <nlohmann/json.hpp>

#include "server/serving_model.h"

namespace hablar::server {

// Chat messages and tools keep every object's keys in the client's order (see ChatInput).
using OrderedJson = nlohmann::ordered_json;

// "where[i]": the path of an array element, for error messages.
inline std::string element_path(const std::string& where, size_t i) {
  return where + "[" + std::to_string(i) + "]";
}

// A required string field of a request object (a message, a content block); a 400 naming
// "where.key" otherwise.
std::string required_string(const OrderedJson& object, const char* key, const std::string& where);

// Checks `messages` (a non-empty list of {role, content, ...}) and returns them in the form
// templates expect: content parts joined into one string (blank lines between them),
// tool-call arguments as objects.
OrderedJson normalize_messages(const OrderedJson& messages);

// The tools a template should see given "tools" and "tool_choice" (null when none).
OrderedJson select_tools(const OrderedJson& body);

// A chat request's messages and tools, read from its body text in the client's key order
// (the body has already been checked by request_json).
struct ChatParts {
  OrderedJson messages;
  OrderedJson tools;
};
ChatParts chat_parts(const std::string& body_text);

// Whether generated text needs the output parser (tool calls or reasoning tags).
bool needs_output_parser(const ServingModel& m, const OrderedJson& tools);

}  // namespace hablar::server
