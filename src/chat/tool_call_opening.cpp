// Openings of a tool call per format (see chat.h), written to match what output_parser.cpp
// reads back: an assistant turn that begins with one of them parses as a call once the model
// completes it.
#include <nlohmann/json.hpp>

#include "chat/chat.h"

namespace hablar::chat {

namespace {

std::string json_string(std::string_view s) {
  return nlohmann::json(std::string(s)).dump();
}

}  // namespace

std::string tool_call_opening(ToolFormat format, std::string_view function) {
  const bool named = !function.empty();
  const std::string name = json_string(function);
  switch (format) {
    case ToolFormat::kHermes:
      return named ? "<tool_call>\n{\"name\": " + name + ", \"arguments\": " : "<tool_call>\n";
    case ToolFormat::kLlama3:
      return named ? "{\"name\": " + name + ", \"parameters\": " : "{\"name\": \"";
    case ToolFormat::kMistral:
      return named ? "[TOOL_CALLS][{\"name\": " + name + ", \"arguments\": " : "[TOOL_CALLS]";
    case ToolFormat::kFunctionaryV3_1:
      return named ? "<function=" + std::string(function) + ">" : "<function=";
    case ToolFormat::kDeepSeek:
      // R1 and V3.1 differ after this (type and name, or name alone): a named call is not
      // spelled out.
      return "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>";
    case ToolFormat::kGenericJson:
      return named ? "{\"tool_call\": {\"name\": " + name + ", \"arguments\": "
                   : "{\"tool_call\": {\"name\": \"";
    case ToolFormat::kCommandR:
      // As the template writes an assistant's calls; the name comes inside the list.
      return "Action:\n```json\n[\n";
    case ToolFormat::kNone:
    case ToolFormat::kFunctionaryV3_2:  // the generation prompt ends with ">>>" already
      return {};
  }
  return {};
}

nlohmann::ordered_json with_generic_tool_prompt(const nlohmann::ordered_json& messages,
                                                const nlohmann::ordered_json& tools) {
  std::string text = "You can call these tools (JSON Schema for their arguments):\n";
  for (const auto& t : tools) {
    const auto& fn = t.contains("function") ? t["function"] : t;
    text += fn.dump() + "\n";
  }
  text +=
      "\nAnswer with one JSON object and nothing else. To call a tool: "
      "{\"tool_call\": {\"name\": \"<tool name>\", \"arguments\": {<arguments>}}}. "
      "To answer directly: {\"response\": \"<your answer>\"}.";
  nlohmann::ordered_json out = messages;
  if (!out.empty() && out[0].value("role", "") == "system" && out[0]["content"].is_string()) {
    out[0]["content"] = out[0]["content"].get<std::string>() + "\n\n" + text;
  } else {
    out.insert(out.begin(), nlohmann::ordered_json{{"role", "system"}, {"content", text}});
  }
  return out;
}

}  // namespace hablar::chat
