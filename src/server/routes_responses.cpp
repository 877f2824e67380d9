// OpenAI's Responses API: POST /v1/responses (streamed as its typed events). Like the
// Anthropic route, a request is translated into an OpenAI chat body and runs through
// parse_chat_request (chat_request.h); the output becomes Responses' items (reasoning,
// message, function_call). Nothing is stored: previous_response_id is refused with a 400
// that says so, and GET /v1/responses/{id} is a 404.
#include <httplib.h>

#include <optional>
#include <set>

#include "server/api_error.h"
#include "server/chat_request.h"
#include "server/http_server.h"
#include "server/live_timings.h"
#include "server/request_fields.h"

namespace hablar::server {

namespace {

using engine::StreamItem;
using nlohmann::json;

// A message's content: a string, or parts of type input_text / output_text (text only).
std::string content_text(const OrderedJson& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    bad_request("'" + where + "' must be a string or a list of content parts", where);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const auto& part = content[i];
    const std::string w = element_path(where, i);
    const std::string type =
        part.is_object() && part.contains("type") && part["type"].is_string() ? part["type"] : "";
    if (type != "input_text" && type != "output_text" && type != "text")
      bad_request("'" + w + "' has type " + text_excerpt(type) +
                      "; this model reads input_text and output_text parts only",
                  w);
    text += required_string(part, "text", w);
  }
  return text;
}

// A function_call item joins the assistant message before it (one turn with several calls).
void add_function_call(const OrderedJson& item, const std::string& w, OrderedJson& out) {
  OrderedJson call = {{"id", required_string(item, "call_id", w)},
                      {"type", "function"},
                      {"function",
                       {{"name", required_string(item, "name", w)},
                        {"arguments", required_string(item, "arguments", w)}}}};
  if (out.empty() || out.back()["role"] != "assistant")
    out.push_back({{"role", "assistant"}, {"content", ""}});
  OrderedJson& msg = out.back();
  if (!msg.contains("tool_calls")) msg["tool_calls"] = OrderedJson::array();
  msg["tool_calls"].push_back(std::move(call));
}

void add_input_item(const OrderedJson& item, const std::string& w, OrderedJson& out) {
  if (!item.is_object()) bad_request("'" + w + "' must be an object", w);
  const std::string type = item.contains("type") && item["type"].is_string()
                               ? item["type"].get<std::string>()
                               : "message";
  if (type == "message") {
    const std::string role = required_string(item, "role", w);
    if (role != "user" && role != "assistant" && role != "system" && role != "developer")
      bad_request("'" + w + ".role' must be user, assistant, system or developer", w + ".role");
    if (!item.contains("content")) bad_request("'" + w + ".content' is required", w + ".content");
    out.push_back({{"role", role}, {"content", content_text(item["content"], w + ".content")}});
  } else if (type == "function_call") {
    add_function_call(item, w, out);
  } else if (type == "function_call_output") {
    if (!item.contains("output")) bad_request("'" + w + ".output' is required", w + ".output");
    out.push_back({{"role", "tool"},
                   {"tool_call_id", required_string(item, "call_id", w)},
                   {"content", content_text(item["output"], w + ".output")}});
  } else if (type == "reasoning") {
    return;  // earlier reasoning is not shown to the model again
  } else {
    bad_request("'" + w + "' has type " + text_excerpt(type) +
                    "; input items are messages, function_call and function_call_output",
                w);
  }
}

OrderedJson chat_messages(const OrderedJson& body) {
  OrderedJson out = OrderedJson::array();
  if (auto it = body.find("instructions"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) bad_request("'instructions' must be a string", "instructions");
    out.push_back({{"role", "system"}, {"content", *it}});
  }
  auto it = body.find("input");
  if (it == body.end() || it->is_null()) bad_request("'input' is required", "input");
  if (it->is_string()) {
    out.push_back({{"role", "user"}, {"content", *it}});
  } else if (it->is_array() && !it->empty()) {
    for (size_t i = 0; i < it->size(); ++i) add_input_item((*it)[i], element_path("input", i), out);
  } else {
    bad_request("'input' must be text or a non-empty list of input items", "input");
  }
  return out;
}

OrderedJson chat_tools(const OrderedJson& tools) {
  if (!tools.is_array()) bad_request("'tools' must be a list of tools", "tools");
  OrderedJson out = OrderedJson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const auto& t = tools[i];
    const std::string w = element_path("tools", i);
    if (!t.is_object() || t.value("type", json()) != "function")
      bad_request("'" + w +
                      "' must be a function tool ({\"type\": \"function\", \"name\": ...}); " +
                      "built-in tools are not served here",
                  w);
    OrderedJson fn = {{"name", required_string(t, "name", w)}};
    for (const char* k : {"description", "parameters", "strict"})
      if (t.contains(k) && !t[k].is_null()) fn[k] = t[k];
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

OrderedJson chat_tool_choice(const OrderedJson& choice) {
  if (choice.is_string()) return choice;  // none, auto, required: checked by select_tools
  if (choice.is_object() && choice.value("type", json()) == "function")
    return {{"type", "function"},
            {"function", {{"name", required_string(choice, "name", "tool_choice")}}}};
  bad_request(
      "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"name\": ...}",
      "tool_choice");
}

// text.format -> response_format: the same output grammars as chat completions.
OrderedJson response_format(const OrderedJson& text) {
  if (!text.is_object()) bad_request("'text' must be an object", "text");
  if (!text.contains("format") || text["format"].is_null()) return nullptr;
  const OrderedJson& f = text["format"];
  const std::string type =
      f.is_object() && f.contains("type") && f["type"].is_string() ? f["type"] : "";
  if (type == "text") return nullptr;
  if (type == "json_object") return {{"type", "json_object"}};
  if (type != "json_schema")
    bad_request("'text.format.type' must be text, json_object or json_schema", "text.format");
  OrderedJson schema = {{"name", f.value("name", "response")}};
  if (f.contains("schema")) schema["schema"] = f["schema"];
  if (f.contains("strict")) schema["strict"] = f["strict"];
  return {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
}

OrderedJson to_chat_body(const OrderedJson& body) {
  if (body.contains("previous_response_id") && !body["previous_response_id"].is_null())
    bad_request(
        "'previous_response_id' is not supported: this server stores no responses; send "
        "the conversation so far as 'input'",
        "previous_response_id");
  OrderedJson out = {{"messages", chat_messages(body)}};
  if (body.contains("tools") && !body["tools"].is_null()) out["tools"] = chat_tools(body["tools"]);
  if (body.contains("tool_choice") && !body["tool_choice"].is_null())
    out["tool_choice"] = chat_tool_choice(body["tool_choice"]);
  if (body.contains("text") && !body["text"].is_null())
    if (OrderedJson f = response_format(body["text"]); !f.is_null()) out["response_format"] = f;
  if (body.contains("max_output_tokens")) out["max_tokens"] = body["max_output_tokens"];
  if (auto r = body.find("reasoning"); r != body.end() && r->is_object() && r->contains("effort"))
    out["reasoning_effort"] = (*r)["effort"];
  if (body.contains("chat_template_kwargs"))
    out["chat_template_kwargs"] = body["chat_template_kwargs"];
  // Every other field as chat completions read it (sampling, seed, stop and llama-server's
  // extensions: top_k, min_p, n_keep, return_progress, timings_per_token, ...), but those
  // the Responses API defines for itself.
  static const std::set<std::string, std::less<>> kResponsesOnly = {"input",
                                                                    "instructions",
                                                                    "tools",
                                                                    "tool_choice",
                                                                    "text",
                                                                    "max_output_tokens",
                                                                    "reasoning",
                                                                    "previous_response_id",
                                                                    "top_logprobs",
                                                                    "stream_options",
                                                                    "prompt",
                                                                    "include",
                                                                    "store",
                                                                    "metadata",
                                                                    "truncation",
                                                                    "background",
                                                                    "service_tier",
                                                                    "conversation",
                                                                    "prompt_cache_key",
                                                                    "safety_identifier",
                                                                    "max_tool_calls",
                                                                    "messages"};
  for (const auto& [k, v] : body.items())
    if (!kResponsesOnly.contains(k) && !out.contains(k)) out[k] = v;
  return out;
}

// What a response object repeats of its request, and its identity.
struct ResponseMeta {
  std::string id = random_id("resp_");
  int64_t created = unix_time_now();
  json echo;  // instructions, max_output_tokens, sampling, tools, tool_choice, text
};

ResponseMeta response_meta(const json& body) {
  ResponseMeta meta;
  auto value = [&](const char* k, json fallback) {
    return body.contains(k) && !body[k].is_null() ? body[k] : fallback;
  };
  meta.echo = {{"instructions", value("instructions", nullptr)},
               {"max_output_tokens", value("max_output_tokens", nullptr)},
               {"temperature", value("temperature", nullptr)},
               {"top_p", value("top_p", nullptr)},
               {"tools", value("tools", json::array())},
               {"tool_choice", value("tool_choice", "auto")},
               {"parallel_tool_calls", value("parallel_tool_calls", true)},
               {"text", value("text", {{"format", {{"type", "text"}}}})},
               {"metadata", value("metadata", json::object())},
               {"previous_response_id", nullptr},
               {"reasoning", nullptr},
               {"store", false},
               {"truncation", "disabled"},
               {"user", value("user", nullptr)}};
  return meta;
}

json usage_json(const StreamItem& final) {
  return {{"input_tokens", final.n_prompt},
          {"input_tokens_details", {{"cached_tokens", final.n_cached_prompt}}},
          {"output_tokens", final.n_generated},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", final.n_prompt + final.n_generated}};
}

// The response object; `final` null while it is in progress.
json response_json(const ResponseMeta& meta, const std::string& model, json output,
                   const StreamItem* final) {
  json r = {{"id", meta.id},
            {"object", "response"},
            {"created_at", meta.created},
            {"model", model},
            {"output", std::move(output)},
            {"error", nullptr},
            {"incomplete_details", nullptr},
            {"status", "in_progress"},
            {"usage", nullptr}};
  r.update(meta.echo);
  if (!final) return r;
  const bool cut = final->finish_reason == engine::FinishReason::kLength;
  r["status"] = cut ? "incomplete" : "completed";
  if (cut) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  r["usage"] = usage_json(*final);
  return r;
}

json output_text_part(const std::string& text) {
  return {{"type", "output_text"},
          {"text", text},
          {"annotations", json::array()},
          {"logprobs", json::array()}};
}

// A message item; `content` null for the item as first announced in a stream (no part yet).
json message_item(const std::string& id, const std::string* content, const char* status) {
  json parts = json::array();
  if (content) parts.push_back(output_text_part(*content));
  return {{"type", "message"},
          {"id", id},
          {"status", status},
          {"role", "assistant"},
          {"content", std::move(parts)}};
}

json reasoning_item(const std::string& id, const std::string& text) {
  json content = json::array();
  if (!text.empty()) content.push_back({{"type", "reasoning_text"}, {"text", text}});
  return {{"type", "reasoning"}, {"id", id}, {"summary", json::array()}, {"content", content}};
}

json function_item(const chat::ToolCall& c, const std::string& arguments, const char* status) {
  return {{"type", "function_call"},
          {"id", random_id("fc_")},
          {"call_id", c.id.empty() ? random_id("call_") : c.id},
          {"name", c.name},
          {"arguments", arguments},
          {"status", status}};
}

// A message cut by max_output_tokens is "incomplete", as OpenAI marks it.
const char* message_status(const StreamItem& final) {
  return final.finish_reason == engine::FinishReason::kLength ? "incomplete" : "completed";
}

// Output items of a whole message.
json output_items(const chat::ParsedMessage& p, const StreamItem& final) {
  json out = json::array();
  if (!p.reasoning.empty()) out.push_back(reasoning_item(random_id("rs_"), p.reasoning));
  if (!p.content.empty() || p.tool_calls.empty())
    out.push_back(message_item(random_id("msg_"), &p.content, message_status(final)));
  for (const chat::ToolCall& c : p.tool_calls)
    out.push_back(function_item(c, c.arguments, "completed"));
  return out;
}

// The typed events of a streamed response. Items open as their kind of output starts (a
// reasoning item, a message item) and close when another kind starts or at the end; a tool
// call is an item of its own. Every event carries a sequence number; ids and output
// indexes stay the same from an item's "added" to the final response, as clients check.
class ResponseStream {
 public:
  ResponseStream(ResponseMeta meta, std::string model)
      : meta_(std::move(meta)), model_(std::move(model)) {}

  std::string start() {
    std::string out;
    event(out, "response.created",
          {{"response", response_json(meta_, model_, json::array(), nullptr)}});
    event(out, "response.in_progress",
          {{"response", response_json(meta_, model_, json::array(), nullptr)}});
    return out;
  }

  // `timings`: llama-server's timings_per_token, carried by the text deltas (null: none).
  void add(const chat::ParsedMessage& p, std::string& out, const json& timings = nullptr) {
    timings_ = timings;
    if (!p.reasoning.empty()) text_delta("reasoning", p.reasoning, out);
    if (!p.content.empty()) text_delta("message", p.content, out);
    for (const chat::ToolCall& c : p.tool_calls) add_call(c, out);
  }

  // llama-server's return_progress: a response.in_progress event with the prompt's progress.
  void progress(const json& report, bool with_timings, std::string& out) {
    json f = {{"response", response_json(meta_, model_, json::array(), nullptr)},
              {"prompt_progress", report}};
    if (with_timings) f["timings"] = LiveTimings::of_progress(report);
    event(out, "response.in_progress", f);
  }

  void finish(const StreamItem& final, std::string& out) {
    if (failed(final)) {
      json r = response_json(meta_, model_, done_, nullptr);
      r["status"] = "failed";
      r["error"] = {{"code", "server_error"}, {"message", failure_body(final)["error"]["message"]}};
      event(out, "response.failed", {{"response", r}});
      return;
    }
    message_status_ = message_status(final);
    close(out);
    if (done_.empty()) {  // no output at all: one empty message, as the non-streamed reply
      open("message", out);
      close(out);
    }
    json r = response_json(meta_, model_, done_, &final);
    const std::string status = r["status"];
    event(out, status == "completed" ? "response.completed" : "response.incomplete",
          {{"response", r}, {"timings", timings_json(final)}});
  }

 private:
  void event(std::string& out, const char* type, json fields) {
    fields["type"] = type;
    fields["sequence_number"] = seq_++;
    out += std::string("event: ") + type + "\ndata: " + dump_json(fields) + "\n\n";
  }
  json where() const { return {{"item_id", id_}, {"output_index", done_.size()}}; }

  void open(const std::string& kind, std::string& out) {
    close(out);
    kind_ = kind;
    text_.clear();
    id_ = random_id(kind == "message" ? "msg_" : "rs_");
    json item =
        kind == "message" ? message_item(id_, nullptr, "in_progress") : reasoning_item(id_, "");
    event(out, "response.output_item.added", {{"output_index", done_.size()}, {"item", item}});
    if (kind != "message") return;
    json f = where();
    f["content_index"] = 0;
    f["part"] = output_text_part("");
    event(out, "response.content_part.added", f);
  }

  void text_delta(const std::string& kind, const std::string& text, std::string& out) {
    if (kind_ != kind) open(kind, out);
    text_ += text;
    json f = where();
    f["content_index"] = 0;
    f["delta"] = text;
    if (kind == "message") f["logprobs"] = json::array();
    if (!timings_.is_null()) f["timings"] = timings_;
    event(out, kind == "message" ? "response.output_text.delta" : "response.reasoning_text.delta",
          f);
  }

  void close(std::string& out) {
    if (kind_.empty()) return;
    json f = where();
    f["content_index"] = 0;
    f["text"] = text_;
    json item;
    if (kind_ == "message") {
      f["logprobs"] = json::array();
      event(out, "response.output_text.done", f);
      f.erase("text");
      f.erase("logprobs");
      f["part"] = output_text_part(text_);
      event(out, "response.content_part.done", f);
      item = message_item(id_, &text_, message_status_);
    } else {
      event(out, "response.reasoning_text.done", f);
      item = reasoning_item(id_, text_);
    }
    event(out, "response.output_item.done", {{"output_index", done_.size()}, {"item", item}});
    done_.push_back(std::move(item));
    kind_.clear();
  }

  void add_call(const chat::ToolCall& c, std::string& out) {
    close(out);
    json item = function_item(c, "", "in_progress");
    id_ = item["id"];
    event(out, "response.output_item.added", {{"output_index", done_.size()}, {"item", item}});
    json f = where();
    f["delta"] = c.arguments;
    event(out, "response.function_call_arguments.delta", f);
    f.erase("delta");
    f["arguments"] = c.arguments;
    f["name"] = c.name;
    event(out, "response.function_call_arguments.done", f);
    item["arguments"] = c.arguments;
    item["status"] = "completed";
    event(out, "response.output_item.done", {{"output_index", done_.size()}, {"item", item}});
    done_.push_back(std::move(item));
  }

  ResponseMeta meta_;
  std::string model_;
  int64_t seq_ = 0;
  json done_ = json::array();                 // finished items, in output order
  std::string kind_;                          // the open item's kind: "", "message" or "reasoning"
  std::string id_;                            // the open (or last) item's id
  std::string text_;                          // the open item's text so far
  const char* message_status_ = "completed";  // set at the end (a cut message is incomplete)
  json timings_;                              // the deltas' timings (timings_per_token)
};

void stream_responses(httplib::Response& res, std::shared_ptr<ServingModel> m, const ChatRequest& r,
                      ResponseMeta meta, std::shared_ptr<engine::RequestHandle> handle) {
  struct State {
    State(ChatOutputStream o, ResponseStream e) : output(std::move(o)), events(std::move(e)) {}
    ChatOutputStream output;
    ResponseStream events;
    bool started = false;
    std::unique_ptr<PromptProgress> progress;  // return_progress
    std::optional<LiveTimings> live;           // timings_per_token
  };
  auto st =
      std::make_shared<State>(ChatOutputStream(*m, r), ResponseStream(std::move(meta), m->id));
  const auto n_prompt = (int32_t)r.spec.prompt.size();
  if (r.return_progress) st->progress = std::make_unique<PromptProgress>(handle->id(), n_prompt);
  if (r.timings_per_token) st->live.emplace(handle->id(), n_prompt);
  StreamPump pump = [st, m, handle](bool& done) {
    std::string out;
    if (!st->started) {
      out += st->events.start();
      st->started = true;
    }
    auto report = [&](const std::optional<json>& p) {
      if (p) st->events.progress(*p, st->live.has_value(), out);
    };
    if (st->progress) report(st->progress->poll(*m));
    auto items = next_items(*handle);
    if (st->progress && !items.empty())
      while (auto p = st->progress->finish(*m, items)) report(p);
    for (StreamItem& it : items) {
      if (st->live && it.kind == StreamItem::Kind::kToken) st->live->on_token(*m);
      st->events.add(st->output.next(it), out, st->live ? st->live->now() : json());
      if (it.kind != StreamItem::Kind::kFinal) continue;
      st->events.finish(it, out);
      done = true;
      break;
    }
    return out;
  };
  stream_response(res, "text/event-stream", pump, [handle] { handle->cancel(); });
}

// A Responses body (checked by request_json first) as the chat request it is run as.
ChatRequest chat_request_of(const httplib::Request& req, ServingModel& m) {
  const std::string text = to_chat_body(OrderedJson::parse(req.body)).dump();
  return parse_chat_request(json::parse(text), text, m);
}

void responses(HttpServer& server, const httplib::Request& req, httplib::Response& res) {
  auto m = server.model_or_throw();
  const json body = request_json(req);
  const ChatRequest r = chat_request_of(req, *m);
  const ResponseMeta meta = response_meta(body);
  auto handle = start_generation(*m, r.spec);
  if (r.stream) return stream_responses(res, m, r, meta, std::move(handle));
  const CollectedOutput out = collect_output(*handle);
  check_final(out.final);
  const chat::ParsedMessage p = final_chat_message(*m, r, out).message;
  json reply = response_json(meta, m->id, output_items(p, out.final), &out.final);
  reply["timings"] = timings_json(out.final);  // as llama-server adds them
  send_json(res, reply);
  set_server_timing(res, out.final);
}

// The prompt tokens a request would take, generating nothing (OpenAI's input token count).
void input_tokens(HttpServer& server, const httplib::Request& req, httplib::Response& res) {
  auto m = server.model_or_throw();
  request_json(req);  // the content type and JSON checks of every route
  const ChatRequest r = chat_request_of(req, *m);
  send_json(res, {{"object", "response.input_tokens"}, {"input_tokens", r.spec.prompt.size()}});
}

}  // namespace

void install_responses_routes(Router& http, HttpServer& server) {
  for (const char* path : {"/v1/responses", "/responses"})  // llama-server answers both
    http.Post(path, [&server](const httplib::Request& req, httplib::Response& res) {
      handle_json(req, res, [&] { responses(server, req, res); });
    });
  for (const char* path : {"/v1/responses/input_tokens", "/responses/input_tokens"})
    http.Post(path, [&server](const httplib::Request& req, httplib::Response& res) {
      handle_json(req, res, [&] { input_tokens(server, req, res); });
    });
  http.Get(R"(/v1/responses/([^/]+))", [](const httplib::Request& req, httplib::Response& res) {
    handle_json(req, res, [&] {
      throw ApiError(404, "no response " + text_excerpt(std::string(req.matches[1])) +
                              ": this server stores no responses");
    });
  });
}

}  // namespace hablar::server
