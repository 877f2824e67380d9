// Anthropic's Messages API: POST /v1/messages (streamed as Anthropic's SSE events) and
// POST /v1/messages/count_tokens. A request is translated into an OpenAI chat body and goes
// through parse_chat_request (chat_request.h), so tools, tool_choice, prefills and the
// model's tool-call format work as on /v1/chat/completions; only the JSON differs.
#include <httplib.h>

#include <map>

#include "server/api_error.h"
#include "server/chat_request.h"
#include "server/http_server.h"
#include "server/request_fields.h"

namespace hablar::server {

namespace {

using engine::StreamItem;
using nlohmann::json;

// Text of `system`, or of a tool_result's content: a string or a list of text blocks.
std::string text_blocks(const OrderedJson& v, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "";
  if (!v.is_array())
    bad_request("'" + where + "' must be a string or a list of text blocks", where);
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const auto& b = v[i];
    const std::string w = element_path(where, i);
    if (!b.is_object() || b.value("type", json()) != "text")
      bad_request("'" + w + "' must be a text block ({\"type\": \"text\", ...}); " +
                      "this model reads text only",
                  where);
    if (!text.empty()) text += "\n";
    text += required_string(b, "text", w);
  }
  return text;
}

// Tool names by tool_use id, so that tool results can name their tool (some templates
// print the name with the result).
using ToolNames = std::map<std::string, std::string>;

// One assistant message: text blocks are the content, tool_use blocks its tool calls,
// thinking blocks its reasoning.
OrderedJson assistant_message(const OrderedJson& blocks, const std::string& where,
                              ToolNames& names) {
  OrderedJson msg = {{"role", "assistant"}};
  std::string text, reasoning;
  OrderedJson calls = OrderedJson::array();
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto& b = blocks[i];
    const std::string w = element_path(where, i);
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
      bad_request("'" + w + "' must be a content block with a 'type'", w);
    const std::string type = b["type"].get<std::string>();
    if (type == "text") {
      text += required_string(b, "text", w);
    } else if (type == "thinking") {
      reasoning += required_string(b, "thinking", w);
    } else if (type == "redacted_thinking") {
      continue;  // opaque to this server
    } else if (type == "tool_use") {
      const std::string id = required_string(b, "id", w), name = required_string(b, "name", w);
      if (!b.contains("input") || !b["input"].is_object())
        bad_request("'" + w + ".input' must be an object", w);
      names[id] = name;
      calls.push_back({{"id", id},
                       {"type", "function"},
                       {"function", {{"name", name}, {"arguments", b["input"]}}}});
    } else {
      bad_request("'" + w + "' has type " + text_excerpt(type) +
                      "; assistant messages hold text, thinking and tool_use blocks",
                  w);
    }
  }
  msg["content"] = text;
  if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
  if (!calls.empty()) msg["tool_calls"] = std::move(calls);
  return msg;
}

// One user message: tool_result blocks become tool messages (first, as Anthropic requires
// them first), the text blocks one user message after them.
void add_user_message(const OrderedJson& blocks, const std::string& where, const ToolNames& names,
                      OrderedJson& out) {
  std::string text;
  bool has_text = false;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto& b = blocks[i];
    const std::string w = element_path(where, i);
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
      bad_request("'" + w + "' must be a content block with a 'type'", w);
    const std::string type = b["type"].get<std::string>();
    if (type == "text") {
      text += required_string(b, "text", w);
      has_text = true;
    } else if (type == "tool_result") {
      const std::string id = required_string(b, "tool_use_id", w);
      std::string result =
          text_blocks(b.contains("content") ? b["content"] : OrderedJson(), w + ".content");
      if (b.contains("is_error") && b["is_error"] == true) result = "Error: " + result;
      OrderedJson tool = {{"role", "tool"}, {"tool_call_id", id}, {"content", result}};
      if (auto n = names.find(id); n != names.end()) tool["name"] = n->second;
      out.push_back(std::move(tool));
    } else {
      bad_request("'" + w + "' has type " + text_excerpt(type) +
                      "; this model reads text and tool_result blocks only",
                  w);
    }
  }
  if (has_text || blocks.empty()) out.push_back({{"role", "user"}, {"content", text}});
}

OrderedJson chat_messages(const OrderedJson& body) {
  OrderedJson out = OrderedJson::array();
  if (body.contains("system") && !body["system"].is_null())
    out.push_back({{"role", "system"}, {"content", text_blocks(body["system"], "system")}});
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) bad_request("'messages' is required", "messages");
  if (!it->is_array() || it->empty())
    bad_request("'messages' must be a non-empty list of messages", "messages");
  ToolNames names;
  for (size_t i = 0; i < it->size(); ++i) {
    const auto& m = (*it)[i];
    const std::string w = element_path("messages", i);
    if (!m.is_object()) bad_request("'" + w + "' must be an object", w);
    const std::string role =
        m.contains("role") && m["role"].is_string() ? m["role"].get<std::string>() : "";
    if (role != "user" && role != "assistant")
      bad_request("'" + w + ".role' must be \"user\" or \"assistant\"", w + ".role");
    if (!m.contains("content")) bad_request("'" + w + ".content' is required", w + ".content");
    const auto& content = m["content"];
    if (!content.is_string() && !content.is_array())
      bad_request("'" + w + ".content' must be a string or a list of content blocks",
                  w + ".content");
    const OrderedJson blocks =
        content.is_string() ? OrderedJson::array({{{"type", "text"}, {"text", content}}}) : content;
    if (role == "assistant")
      out.push_back(assistant_message(blocks, w + ".content", names));
    else
      add_user_message(blocks, w + ".content", names, out);
  }
  return out;
}

OrderedJson chat_tools(const OrderedJson& tools) {
  if (!tools.is_array()) bad_request("'tools' must be a list of tools", "tools");
  OrderedJson out = OrderedJson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const auto& t = tools[i];
    const std::string w = element_path("tools", i);
    if (!t.is_object()) bad_request("'" + w + "' must be an object", w);
    if (t.contains("type") && t["type"] != "custom" && !t.contains("input_schema"))
      bad_request("'" + w + "' is a server tool (" + value_excerpt(t["type"]) +
                      "); this server runs client tools only (name, input_schema)",
                  w);
    OrderedJson fn = {{"name", required_string(t, "name", w)}};
    if (t.contains("description")) fn["description"] = t["description"];
    if (!t.contains("input_schema") || !t["input_schema"].is_object())
      bad_request("'" + w + ".input_schema' is required and must be an object", w);
    fn["parameters"] = t["input_schema"];
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

OrderedJson chat_tool_choice(const OrderedJson& choice) {
  if (!choice.is_object() || !choice.contains("type") || !choice["type"].is_string())
    bad_request("'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}",
                "tool_choice");
  const std::string type = choice["type"].get<std::string>();
  if (type == "auto") return "auto";
  if (type == "any") return "required";
  if (type == "none") return "none";
  if (type == "tool")
    return {{"type", "function"},
            {"function", {{"name", required_string(choice, "name", "tool_choice")}}}};
  bad_request("'tool_choice.type' must be auto, any, tool or none (got " + text_excerpt(type) + ")",
              "tool_choice");
}

// The request as an OpenAI chat completions body. `for_generation`: max_tokens is required
// (count_tokens has none).
OrderedJson to_chat_body(const OrderedJson& body, bool for_generation) {
  OrderedJson out = {{"messages", chat_messages(body)}};
  if (body.contains("tools") && !body["tools"].is_null()) out["tools"] = chat_tools(body["tools"]);
  if (body.contains("tool_choice") && !body["tool_choice"].is_null())
    out["tool_choice"] = chat_tool_choice(body["tool_choice"]);
  // thinking {"type": "enabled", "budget_tokens": N} | {"type": "disabled"}: the template's
  // enable_thinking (Qwen3 and the like), and N the thinking budget (reasoning_budget.h).
  OrderedJson kwargs = OrderedJson::object();
  if (auto k = body.find("chat_template_kwargs"); k != body.end() && !k->is_null()) {
    if (!k->is_object())
      bad_request("'chat_template_kwargs' must be an object of template variables",
                  "chat_template_kwargs");
    kwargs = *k;
  }
  if (auto t = body.find("thinking"); t != body.end() && !t->is_null()) {
    const auto type = t->is_object() ? t->find("type") : t->end();
    if (type == t->end() || !(*type == "enabled" || *type == "disabled"))
      bad_request(R"('thinking' must be {"type": "enabled", "budget_tokens": N} or {"type": )"
                  R"("disabled"})",
                  "thinking");
    kwargs["enable_thinking"] = *type == "enabled";
    if (*type == "enabled" && t->contains("budget_tokens")) {
      const auto& b = (*t)["budget_tokens"];
      if (!b.is_number_integer() || b.get<int64_t>() < 1 || b.get<int64_t>() > INT32_MAX)
        bad_request("'thinking.budget_tokens' must be a positive integer", "thinking");
      out["thinking_budget_tokens"] = b;
    }
  }
  if (!kwargs.empty()) out["chat_template_kwargs"] = std::move(kwargs);
  if (!for_generation) return out;
  if (!body.contains("max_tokens") || body["max_tokens"].is_null())
    bad_request("'max_tokens' is required", "max_tokens");
  for (const char* k : {"max_tokens", "temperature", "top_p", "top_k", "stream", "model"})
    if (body.contains(k)) out[k] = body[k];
  if (body.contains("stop_sequences")) {
    const auto& s = body["stop_sequences"];
    if (!s.is_array()) bad_request("'stop_sequences' must be a list of strings", "stop_sequences");
    for (const auto& v : s)
      if (!v.is_string())
        bad_request("'stop_sequences' must be a list of strings", "stop_sequences");
    if (s.size() > 16) bad_request("'stop_sequences' holds more than 16 entries", "stop_sequences");
    out["stop"] = s;
  }
  return out;
}

ChatRequest parse_messages_request(const httplib::Request& req, ServingModel& m,
                                   bool for_generation) {
  request_json(req);  // content type, depth, valid JSON object
  const OrderedJson body = OrderedJson::parse(req.body);
  const std::string text = to_chat_body(body, for_generation).dump();
  return parse_chat_request(json::parse(text), text, m);
}

const char* stop_reason(const StreamItem& final, bool tool_calls) {
  if (tool_calls) return "tool_use";
  if (final.finish_reason == engine::FinishReason::kLength) return "max_tokens";
  return final.stop_word.empty() ? "end_turn" : "stop_sequence";
}

json usage_json(const StreamItem& final) {
  // Anthropic counts prompt tokens read from the cache apart from input_tokens.
  return {{"input_tokens", final.n_prompt - final.n_cached_prompt},
          {"output_tokens", final.n_generated},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", final.n_cached_prompt}};
}

json tool_use_block(const chat::ToolCall& c) {
  return {{"type", "tool_use"},
          {"id", c.id.empty() ? random_id("toolu_") : c.id},
          {"name", c.name},
          {"input", arguments_object(c.arguments)}};
}

json message_json(const std::string& id, const std::string& model, json content) {
  return {
      {"id", id},           {"type", "message"},      {"role", "assistant"},     {"model", model},
      {"content", content}, {"stop_reason", nullptr}, {"stop_sequence", nullptr}};
}

void count_tokens(HttpServer& server, const httplib::Request& req, httplib::Response& res) {
  auto m = server.model_or_throw();
  const ChatRequest r = parse_messages_request(req, *m, false);
  send_json(res, {{"input_tokens", r.spec.prompt.size()}});
}

// Anthropic's SSE: "event: <type>" before each data line.
std::string event(const json& data) {
  return "event: " + data["type"].get<std::string>() + "\ndata: " + dump_json(data) + "\n\n";
}

// The content blocks of a streamed message: text and thinking blocks stay open while their
// kind of output continues; a tool call is a block of its own.
struct BlockStream {
  int index = -1;
  std::string open;  // "", "text" or "thinking"
  bool tool_calls = false;

  void close(std::string& out) {
    if (open.empty()) return;
    out += event({{"type", "content_block_stop"}, {"index", index}});
    open.clear();
  }
  void start(const std::string& kind, json block, std::string& out) {
    close(out);
    index += 1;
    out += event({{"type", "content_block_start"}, {"index", index}, {"content_block", block}});
    open = kind;
  }
  void delta(const char* kind, const char* delta_type, const char* key, const std::string& text,
             std::string& out) {
    if (text.empty()) return;
    if (open != kind) {
      json block = {{"type", kind}, {key, ""}};
      if (std::string_view(kind) == "thinking") block["signature"] = "";  // nothing to sign here
      start(kind, std::move(block), out);
    }
    out += event({{"type", "content_block_delta"},
                  {"index", index},
                  {"delta", {{"type", delta_type}, {key, text}}}});
  }
  void add(const chat::ParsedMessage& p, std::string& out) {
    delta("thinking", "thinking_delta", "thinking", p.reasoning, out);
    delta("text", "text_delta", "text", p.content, out);
    for (const chat::ToolCall& c : p.tool_calls) {
      json block = tool_use_block(c);
      const std::string input = dump_json(block["input"]);
      block["input"] = json::object();
      start("tool_use", block, out);
      out += event({{"type", "content_block_delta"},
                    {"index", index},
                    {"delta", {{"type", "input_json_delta"}, {"partial_json", input}}}});
      close(out);
      tool_calls = true;
    }
  }
};

void stream_messages(httplib::Response& res, std::shared_ptr<ServingModel> m, const ChatRequest& r,
                     std::shared_ptr<engine::RequestHandle> handle) {
  struct State {
    explicit State(ChatOutputStream o) : output(std::move(o)) {}
    BlockStream blocks;
    ChatOutputStream output;
    bool started = false;
  };
  auto st = std::make_shared<State>(ChatOutputStream(*m, r));
  const std::string id = random_id("msg_");
  const size_t n_prompt = r.spec.prompt.size();
  StreamPump pump = [st, m, handle, id, n_prompt](bool& done) {
    std::string out;
    if (!st->started) {
      json msg = message_json(id, m->id, json::array());
      msg["usage"] = {{"input_tokens", n_prompt}, {"output_tokens", 0}};
      out += event({{"type", "message_start"}, {"message", msg}});
      out += event({{"type", "ping"}});
      st->started = true;
    }
    for (StreamItem& it : next_items(*handle)) {
      st->blocks.add(st->output.next(it), out);
      if (it.kind != StreamItem::Kind::kFinal) continue;
      done = true;
      if (failed(it)) {
        const int status = it.finish_reason == engine::FinishReason::kCancelled ? 503 : 500;
        out += event(error_body(ErrorStyle::kAnthropic, status,
                                failure_body(it)["error"]["message"].get<std::string>()));
        break;
      }
      st->blocks.close(out);
      json usage = usage_json(it);
      out += event({{"type", "message_delta"},
                    {"delta",
                     {{"stop_reason", stop_reason(it, st->blocks.tool_calls)},
                      {"stop_sequence", it.stop_word.empty() ? json() : json(it.stop_word)}}},
                    {"usage", usage}});
      out += event({{"type", "message_stop"}});
      break;
    }
    return out;
  };
  stream_response(res, "text/event-stream", pump, [handle] { handle->cancel(); });
}

void messages(HttpServer& server, const httplib::Request& req, httplib::Response& res) {
  auto m = server.model_or_throw();
  const ChatRequest r = parse_messages_request(req, *m, true);
  auto handle = start_generation(*m, r.spec);
  if (r.stream) return stream_messages(res, m, r, std::move(handle));
  const CollectedOutput out = collect_output(*handle);
  check_final(out.final);
  const chat::ParsedMessage p = final_chat_message(*m, r, out).message;
  json content = json::array();
  if (!p.reasoning.empty())
    content.push_back({{"type", "thinking"}, {"thinking", p.reasoning}, {"signature", ""}});
  if (!p.content.empty()) content.push_back({{"type", "text"}, {"text", p.content}});
  for (const chat::ToolCall& c : p.tool_calls) content.push_back(tool_use_block(c));
  json msg = message_json(random_id("msg_"), m->id, std::move(content));
  msg["stop_reason"] = stop_reason(out.final, !p.tool_calls.empty());
  if (!out.final.stop_word.empty()) msg["stop_sequence"] = out.final.stop_word;
  msg["usage"] = usage_json(out.final);
  send_json(res, msg);
  set_server_timing(res, out.final);
}

}  // namespace

void install_anthropic_routes(Router& http, HttpServer& server) {
  http.Post("/v1/messages", [&server](const httplib::Request& req, httplib::Response& res) {
    handle_json(req, res, [&] { messages(server, req, res); });
  });
  http.Post("/v1/messages/count_tokens",
            [&server](const httplib::Request& req, httplib::Response& res) {
              handle_json(req, res, [&] { count_tokens(server, req, res); });
            });
}

}  // namespace hablar::server
