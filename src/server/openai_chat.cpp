#include "server/openai_chat.h"

#include "server/api_error.h"
#include "server/request_fields.h"

namespace hablar::server {

namespace {

// A message's content as one text: a list of text parts is joined with blank lines between
// them, as llama-server renders parts for templates that take text only.
std::string flatten_content(const OrderedJson& content, size_t index) {
  const std::string where = "messages[" + std::to_string(index) + "].content";
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return "";
  if (!content.is_array())
    bad_request("'" + where + "' must be a string or a list of parts", where);
  std::string text;
  for (const auto& part : content) {
    const bool first = &part == &content.front();
    if (part.is_string()) {
      text += (first ? "" : "\n\n") + part.get<std::string>();
      continue;
    }
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      bad_request("'" + where + "' parts must be objects with a 'type'", where);
    const std::string type = part["type"].get<std::string>();
    if (type != "text")
      bad_request("'" + where + "' has a part of type " + text_excerpt(type) +
                      "; this model takes text parts only",
                  where);
    if (!part.contains("text") || !part["text"].is_string())
      bad_request("'" + where + "' text parts need a string 'text'", where);
    text += (first ? "" : "\n\n") + part["text"].get<std::string>();
  }
  return text;
}

}  // namespace

OrderedJson normalize_messages(const OrderedJson& messages) {
  if (messages.is_null()) bad_request("'messages' is required", "messages");
  if (!messages.is_array()) bad_request("'messages' must be a list of messages", "messages");
  if (messages.empty()) bad_request("'messages' must contain at least one message", "messages");
  OrderedJson out = OrderedJson::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& msg = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) bad_request("'" + where + "' must be an object", where);
    if (!msg.contains("role") || !msg["role"].is_string())
      bad_request("'" + where + ".role' is required and must be a string", where + ".role");
    const std::string role = msg["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" &&
        role != "developer" && role != "function")
      bad_request("'" + where + ".role' must be system, developer, user, assistant or tool (got " +
                      text_excerpt(role) + ")",
                  where + ".role");
    OrderedJson m = msg;
    const bool has_calls =
        msg.contains("tool_calls") && msg["tool_calls"].is_array() && !msg["tool_calls"].empty();
    if (!msg.contains("content") && !(role == "assistant" && has_calls))
      bad_request("'" + where + ".content' is required", where + ".content");
    m["content"] = flatten_content(msg.contains("content") ? msg["content"] : OrderedJson(), i);
    if (has_calls) {
      for (auto& call : m["tool_calls"]) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
          bad_request("'" + where + ".tool_calls' entries need a 'function' object",
                      where + ".tool_calls");
        auto& fn = call["function"];
        if (fn.contains("arguments") && fn["arguments"].is_string()) {
          // Text the client sent: the same depth limit as the body before it is parsed.
          check_json_depth(fn["arguments"].get_ref<const std::string&>());
          auto parsed = OrderedJson::parse(fn["arguments"].get<std::string>(), nullptr, false);
          if (!parsed.is_discarded() && parsed.is_object()) fn["arguments"] = parsed;
        }
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

OrderedJson select_tools(const OrderedJson& body) {
  auto it = body.find("tools");
  if (it == body.end() || it->is_null()) return nullptr;
  if (!it->is_array()) bad_request("'tools' must be a list of tools", "tools");
  for (size_t i = 0; i < it->size(); ++i) {
    const auto& t = (*it)[i];
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object() ||
        !t["function"].contains("name") || !t["function"]["name"].is_string())
      bad_request("'tools[" + std::to_string(i) +
                      "]' must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                  "tools");
  }
  if (it->empty()) return nullptr;
  auto choice = body.find("tool_choice");
  if (choice == body.end() || choice->is_null()) return *it;
  if (choice->is_string()) {
    const std::string c = choice->get<std::string>();
    if (c == "none") return nullptr;
    if (c == "auto" || c == "required") return *it;
    bad_request("'tool_choice' must be none, auto, required or a function", "tool_choice");
  }
  if (choice->is_object() && choice->contains("function") && (*choice)["function"].is_object() &&
      (*choice)["function"].contains("name")) {
    const auto name = (*choice)["function"]["name"];
    OrderedJson picked = OrderedJson::array();
    for (const auto& t : *it)
      if (t["function"]["name"] == name) picked.push_back(t);
    if (picked.empty())
      bad_request("'tool_choice' names a function that is not in 'tools'", "tool_choice");
    return picked;
  }
  bad_request("'tool_choice' must be none, auto, required or a function", "tool_choice");
}

ChatParts chat_parts(const std::string& body_text) {
  check_json_depth(body_text);
  const OrderedJson body = OrderedJson::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object()) bad_request("the request body must be a JSON object");
  return {normalize_messages(body.contains("messages") ? body["messages"] : OrderedJson()),
          select_tools(body)};
}

bool needs_output_parser(const ServingModel& m, const OrderedJson& tools) {
  if (!tools.is_null()) return true;
  return m.chat_template && m.chat_template->source().find("<think>") != std::string::npos;
}

std::string required_string(const OrderedJson& object, const char* key, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_string())
    bad_request("'" + where + "." + key + "' is required and must be a string", where);
  return it->get<std::string>();
}

}  // namespace hablar::server
