// Ollama-compatible routes: /api/chat and /api/generate (NDJSON streams by default),
// /api/tags, /api/ps, /api/show, /api/version, /api/pull (of the served model); model
// management (/api/copy, /api/delete, /api/push, /api/create) answers 501.
#include <httplib.h>

#include <sys/stat.h>

#include <cctype>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>

#include "core/sha256.h"
#include "formats/model_info.h"

#include "server/api_error.h"
#include "server/http_server.h"
#include "server/openai_chat.h"
#include "server/request_fields.h"
#include "server/sampling_fields.h"
#include "server/structured_output.h"

namespace hablar::server {

namespace {

using engine::StreamItem;
using nlohmann::json;

std::string iso_time(std::time_t t) {
  char buf[32];
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string iso_time_now() {
  return iso_time(std::time(nullptr));
}

// Ollama puts sampling under "options" with its own names.
json ollama_options(const json& body) {
  json o =
      body.contains("options") && body["options"].is_object() ? body["options"] : json::object();
  json mapped = json::object();
  for (const char* k : {"temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty",
                        "repeat_last_n", "presence_penalty", "frequency_penalty", "seed",
                        "mirostat", "mirostat_tau", "mirostat_eta"})
    if (o.contains(k)) mapped[k] = o[k];
  return mapped;
}

GenerationSpec ollama_spec(const json& body, ServingModel& m, std::vector<int32_t> prompt) {
  GenerationSpec spec;
  spec.prompt = std::move(prompt);
  json opts = ollama_options(body);
  spec.sampling = parse_sampling(opts, m, Dialect::kOllama);
  json raw =
      body.contains("options") && body["options"].is_object() ? body["options"] : json::object();
  spec.stop = opt_string_list(raw, "stop", 64);
  parse_context_shift(raw, "num_keep", spec);
  auto n = opt_integer(raw, "num_predict", -2, INT32_MAX);
  if (n && *n == 0) bad_request("'num_predict' must be -1 or at least 1", "num_predict");
  if (n && *n < 0) n.reset();
  spec.max_tokens = bounded_max_tokens(m, n, spec.prompt.size());
  return spec;
}

json final_fields(json j, const StreamItem& f) {
  j["done"] = true;
  j["done_reason"] = f.finish_reason == engine::FinishReason::kLength ? "length" : "stop";
  const double ns = 1e6;
  j["total_duration"] = (int64_t)((f.prompt_ms + f.decode_ms) * ns);
  j["load_duration"] = 0;
  j["prompt_eval_count"] = f.n_prompt;
  j["prompt_eval_duration"] = (int64_t)(f.prompt_ms * ns);
  j["eval_count"] = f.n_generated;
  j["eval_duration"] = (int64_t)(f.decode_ms * ns);
  return j;
}

// How a chat's output is read back. tools: the model's tool-call format when the chat
// declared tools (kNone: plain text); the calls come back as message.tool_calls. thinking:
// the request's "think" was on: reasoning comes back as message.thinking (started: the
// prompt opened the think block). prefill: a final assistant message the model continued
// (parsed with the output, not sent again).
struct OutputParsing {
  chat::ToolFormat tools = chat::ToolFormat::kNone;
  bool thinking = false;
  bool started = false;
  std::string prefill;
  // /api/generate: the prompt's token ids, which the final reply's "context" (Ollama's
  // conversational memory) carries followed by the generated ones.
  std::shared_ptr<const std::vector<int32_t>> context_prompt;
  bool needed() const { return tools != chat::ToolFormat::kNone || thinking; }
};

// The final reply's "context": the prompt's ids and the generated ones.
json context_ids(const std::vector<int32_t>& prompt, const std::vector<int32_t>& generated) {
  json ids = json::array();
  for (int32_t t : prompt) ids.push_back(t);
  for (int32_t t : generated) ids.push_back(t);
  return ids;
}

// A request's "context": the ids a previous /api/generate reply returned; each must be a
// token of this model's vocabulary.
std::vector<int32_t> parse_context(const json& body, const ServingModel& m) {
  std::vector<int32_t> ids;
  if (!body.contains("context") || body["context"].is_null()) return ids;
  const json& c = body["context"];
  if (!c.is_array()) bad_request("'context' must be an array of token ids", "context");
  const int64_t n_vocab = m.tok().n_vocab();
  for (const json& t : c) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab)
      bad_request("'context' holds " + text_excerpt(t.dump()) + ", not a token id of this model",
                  "context");
    ids.push_back((int32_t)t.get<int64_t>());
  }
  return ids;
}

void respond(httplib::Response& res, std::shared_ptr<ServingModel> m,
             std::shared_ptr<engine::RequestHandle> handle, bool stream, bool is_chat,
             const OutputParsing& how = {}) {
  auto line = [m, is_chat](const std::string& text) {
    json j = {{"model", m->id}, {"created_at", iso_time_now()}, {"done", false}};
    if (is_chat)
      j["message"] = {{"role", "assistant"}, {"content", text}};
    else
      j["response"] = text;
    return j;
  };
  auto parsed = [line](const chat::ParsedMessage& p) {
    json j = line(p.content);
    if (!p.reasoning.empty()) j["message"]["thinking"] = p.reasoning;
    if (!p.tool_calls.empty()) j["message"]["tool_calls"] = ollama_tool_calls(p.tool_calls);
    return j;
  };
  const bool parse = is_chat && how.needed();
  const std::string& prefill = how.prefill;
  const auto context_prompt = how.context_prompt;
  if (!stream) {
    CollectedOutput out = collect_output(*handle);
    check_final(out.final);
    set_server_timing(res, out.final);
    if (!parse) {
      json j = final_fields(line(out.text), out.final);
      if (context_prompt) {
        std::vector<int32_t> generated;
        for (const StreamItem& it : out.tokens) generated.push_back(it.token);
        j["context"] = context_ids(*context_prompt, generated);
      }
      return send_json(res, j);
    }
    chat::ParsedMessage p =
        chat::parse_model_output(prefill + out.text, how.tools, how.thinking, how.started);
    if (p.content.compare(0, prefill.size(), prefill) == 0) p.content.erase(0, prefill.size());
    send_json(res, final_fields(parsed(p), out.final));
    return;
  }
  auto parser =
      parse ? std::make_shared<chat::StreamingOutputParser>(how.tools, how.thinking, how.started)
            : nullptr;
  if (parser && !prefill.empty()) parser->push(prefill);  // context only; not sent again
  auto generated = std::make_shared<std::vector<int32_t>>();
  StreamPump pump = [=](bool& done) {
    std::string out;
    for (StreamItem& it : next_items(*handle)) {
      if (it.kind == StreamItem::Kind::kToken) generated->push_back(it.token);
      chat::ParsedMessage p;
      if (parser) {
        p = parser->push(it.text);
        if (it.kind == StreamItem::Kind::kFinal) {
          chat::ParsedMessage rest = parser->finish();
          p.content += rest.content;
          p.reasoning += rest.reasoning;
          for (auto& c : rest.tool_calls) p.tool_calls.push_back(std::move(c));
        }
      } else {
        p.content = it.text;
      }
      if (it.kind == StreamItem::Kind::kToken) {
        if (!p.content.empty() || !p.reasoning.empty() || !p.tool_calls.empty())
          out += dump_json(parsed(p)) + "\n";
        continue;
      }
      if (failed(it)) {
        out += dump_json(json{{"error", failure_body(it)["error"]["message"]}}) + "\n";
      } else {
        json j = final_fields(parsed(p), it);
        if (context_prompt) j["context"] = context_ids(*context_prompt, *generated);
        out += dump_json(j) + "\n";
      }
      done = true;
      break;
    }
    return out;
  };
  stream_response(res, "application/x-ndjson", pump, [handle] { handle->cancel(); });
}

// Ollama's load and unload requests (no prompt, or no messages): keep_alive 0 unloads the
// model without loading it first; anything else loads it.
void load_or_unload(HttpServer& server, const json& body, bool chat, httplib::Response& res) {
  const std::optional<int64_t> keep = opt_keep_alive_ns(body);
  json reply = {{"model", opt_string(body, "model").value_or("")},
                {"created_at", iso_time_now()},
                {"done", true}};
  if (chat)
    reply["message"] = {{"role", "assistant"}, {"content", ""}};
  else
    reply["response"] = "";
  if (keep && *keep == 0) {
    server.unload_when_idle();
    reply["done_reason"] = "unload";
  } else {
    auto m = server.model_or_throw();
    if (keep) server.keep_alive(*keep);
    if (reply["model"] == "") reply["model"] = m->id;
    reply["done_reason"] = "load";
  }
  send_json(res, reply);
}

void api_chat(HttpServer& server, const httplib::Request& req, httplib::Response& res) {
  json body = request_json(req);
  if (const auto msgs = body.find("messages");
      msgs == body.end() || (msgs->is_array() && msgs->empty())) {
    load_or_unload(server, body, true, res);
    return;
  }
  auto m = server.model_or_throw();
  if (const auto keep = opt_keep_alive_ns(body)) server.keep_alive(*keep);
  const ChatParts chat = chat_parts(req.body);
  // A final assistant message is continued (a prefill), as Ollama does.
  const bool continue_last = !chat.messages.empty() && chat.messages.back().contains("role") &&
                             chat.messages.back()["role"] == "assistant" &&
                             chat.messages.back().value("content", json()).is_string();
  const std::string prefill =
      continue_last ? chat.messages.back()["content"].get<std::string>() : std::string();
  // think: true / false turns the template's thinking on or off and returns the reasoning
  // as message.thinking; "low" / "medium" / "high" is a reasoning effort (gpt-oss).
  json kw_body = json::object();
  const auto think = body.find("think");
  const bool has_think = think != body.end() && !think->is_null();
  if (has_think && think->is_boolean())
    kw_body["chat_template_kwargs"] = {{"enable_thinking", think->get<bool>()}};
  else if (has_think && (*think == "low" || *think == "medium" || *think == "high"))
    kw_body["reasoning_effort"] = *think;
  else if (has_think)
    bad_request("'think' must be true, false, or low / medium / high", "think");
  RenderedChat text =
      render_chat(*m, chat.messages, chat.tools, !continue_last, template_kwargs(*m, kw_body));
  if (!prefill.empty()) {
    const size_t at = text.text.rfind(prefill);  // the template closes the turn: cut after it
    if (at != std::string::npos) {
      text.text.resize(at + prefill.size());
      std::erase_if(text.text_only, [&](uint32_t pos) { return pos >= text.text.size(); });
    }
  }
  GenerationSpec spec = ollama_spec(body, *m, tokenize_prompt(*m, text.text, text.text_only));
  spec.grammar = ollama_output_grammar(*m, req.body);
  const bool stream = opt_bool(body, "stream").value_or(true);
  OutputParsing how;
  how.tools = chat.tools.is_null() ? chat::ToolFormat::kNone : m->tool_format;
  how.thinking = has_think && *think != false;
  how.started = how.thinking && !continue_last && chat::prompt_opens_reasoning(text.text);
  how.prefill = prefill;
  respond(res, m, start_generation(*m, std::move(spec)), stream, true, how);
}

void api_generate(HttpServer& server, const httplib::Request& req, httplib::Response& res) {
  json body = request_json(req);
  const std::string prompt = opt_string(body, "prompt").value_or("");
  if (prompt.empty() && !body.contains("images")) {
    // Ollama answers an empty prompt by loading (or, keep_alive 0, unloading) the model.
    load_or_unload(server, body, false, res);
    return;
  }
  auto m = server.model_or_throw();
  if (const auto keep = opt_keep_alive_ns(body)) server.keep_alive(*keep);
  const bool raw = opt_bool(body, "raw").value_or(false);
  const auto system = opt_string(body, "system");
  const bool stream = opt_bool(body, "stream").value_or(true);
  // suffix: fill in the middle between prompt and suffix (code models; Ollama's "insert").
  const auto suffix = opt_string(body, "suffix");
  if (suffix && !suffix->empty()) {
    GenerationSpec spec = ollama_spec(body, *m, fim_prompt(*m, prompt, *suffix, ""));
    return respond(res, m, start_generation(*m, std::move(spec)), stream, false);
  }
  // context: a previous reply's ids (prompt and output), which this prompt continues; the
  // reply's own "context" (not in raw mode, as Ollama) is what the next request sends.
  const std::vector<int32_t> context = parse_context(body, *m);
  // raw: the client writes the whole prompt, markup included (special tokens parsed).
  RenderedChat text{prompt, {}};
  if (!raw) {
    json messages = json::array();
    if (system) messages.push_back({{"role", "system"}, {"content", *system}});
    messages.push_back({{"role", "user"}, {"content", prompt}});
    text = render_chat(*m, messages, nullptr, true);
  }
  std::vector<int32_t> ids;
  if (context.empty()) {
    ids = tokenize_prompt(*m, text.text, text.text_only);
  } else {
    // The continuation carries no special tokens of a sequence's start (a template's BOS).
    ids = context;
    const auto more =
        m->tok().encode(text.text, /*add_special=*/false, /*parse_special=*/true, text.text_only);
    const bool bos = !more.empty() && more.front() == m->tok().bos_id();
    ids.insert(ids.end(), more.begin() + (bos ? 1 : 0), more.end());
  }
  OutputParsing how;
  if (!raw) how.context_prompt = std::make_shared<const std::vector<int32_t>>(ids);
  GenerationSpec spec = ollama_spec(body, *m, std::move(ids));
  spec.grammar = ollama_output_grammar(*m, req.body);
  respond(res, m, start_generation(*m, std::move(spec)), stream, false, how);
}

std::string upper(std::string s) {
  for (char& c : s) c = (char)std::toupper((unsigned char)c);
  return s;
}

json details(const ServingModel& m) {
  const auto& f = m.model->file();
  const uint64_t ftype = f.get_uint_or("general.file_type", 0);
  return {{"parent_model", ""},
          {"format", "gguf"},
          {"family", m.model->config().arch},
          {"families", json::array({m.model->config().arch})},
          {"parameter_size", f.get_string_or("general.size_label", "")},
          {"quantization_level", upper(gguf::file_type_name(ftype))}};
}

// The model file's size, modification time and sha256, as Ollama lists models. The digest
// is computed once, at the first request that needs it (about a second per GB).
struct FileFacts {
  uint64_t size = 0;
  std::string modified_at;
  std::string digest;
};

const FileFacts& file_facts(const ServingModel& m) {
  static std::mutex mu;
  static std::map<std::string, FileFacts> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(m.path);
  if (it != cache.end()) return it->second;
  FileFacts facts;
  std::error_code ec;
  facts.size = std::filesystem::file_size(m.path, ec);
  struct stat st {};
  if (::stat(m.path.c_str(), &st) == 0) facts.modified_at = iso_time(st.st_mtime);
  facts.digest = sha256_file_hex(m.path);
  return cache.emplace(m.path, std::move(facts)).first->second;
}

json model_entry(const ServingModel& m) {
  const FileFacts& f = file_facts(m);
  return {{"name", m.id},   {"model", m.id},      {"modified_at", f.modified_at},
          {"size", f.size}, {"digest", f.digest}, {"details", details(m)}};
}

// Ollama names carry a tag ("name:latest"); any tag of the served model's name is it.
bool names_model(const ServingModel& m, const std::string& name) {
  return name == m.id || (name.size() > m.id.size() && name.compare(0, m.id.size(), m.id) == 0 &&
                          name[m.id.size()] == ':');
}

void api_tags(HttpServer& server, const httplib::Request&, httplib::Response& res) {
  auto m = server.model_or_throw();
  send_json(res, {{"models", json::array({model_entry(*m)})}});
}

// The running models: this one while loaded (asleep: none, answered by the server), with when
// an idle spell unloads it (keep_alive, --sleep-idle-seconds).
void api_ps(HttpServer& server, const httplib::Request&, httplib::Response& res) {
  auto m = server.model_or_throw();
  json entry = model_entry(*m);
  const std::optional<int64_t> expires = server.expires_at();
  entry["expires_at"] = expires ? iso_time(*expires) : "2318-01-01T00:00:00Z";  // or never
  entry["size_vram"] = m->executor->device_name() == "cpu" ? json(0) : entry["size"];
  entry.erase("modified_at");
  send_json(res, {{"models", json::array({entry})}});
}

void api_show(HttpServer& server, const httplib::Request& req, httplib::Response& res) {
  auto m = server.model_or_throw();
  json body = request_json(req);
  const auto name = opt_string(body, "model").value_or(opt_string(body, "name").value_or(m->id));
  if (!names_model(*m, name))
    throw ApiError(404, "model " + text_excerpt(name) + " not found; this server serves " +
                            text_excerpt(m->id));
  const auto& c = m->model->config();
  const std::string a = c.arch;
  json capabilities = json::array({"completion"});
  if (m->tool_format != chat::ToolFormat::kNone) capabilities.push_back("tools");
  if (supports_fim(*m)) capabilities.push_back("insert");
  send_json(res, {{"modelfile", "FROM " + m->path},
                  {"parameters", ""},
                  {"template", m->chat_template->source()},
                  {"details", details(*m)},
                  {"modified_at", file_facts(*m).modified_at},
                  {"model_info",
                   {{"general.architecture", a},
                    {a + ".block_count", c.n_layers},
                    {a + ".embedding_length", c.n_embd},
                    {a + ".attention.head_count", c.n_heads},
                    {a + ".attention.head_count_kv", c.n_kv_heads},
                    {a + ".context_length", c.n_ctx_train},
                    {a + ".feed_forward_length", c.n_ff},
                    {"tokenizer.ggml.model", std::string(m->tok().model_name())}}},
                  {"capabilities", capabilities}});
}

// Pulling the served model succeeds at once (it is here); anything else needs a model hub,
// which this server does not use.
void api_pull(HttpServer& server, const httplib::Request& req, httplib::Response& res) {
  auto m = server.model_or_throw();
  json body = request_json(req);
  const auto name = opt_string(body, "model").value_or(opt_string(body, "name").value_or(""));
  if (!names_model(*m, name))
    throw ApiError(501,
                   "this server does not download models (there is no model hub here); it "
                   "serves " +
                       text_excerpt(m->id) + ", given with -m at start-up");
  const bool stream = opt_bool(body, "stream").value_or(true);
  if (!stream) return send_json(res, {{"status", "success"}});
  res.set_content(dump_json({{"status", "success"}}) + "\n", "application/x-ndjson");
}

// Model management Ollama has and this server, serving one file, does not.
[[noreturn]] void not_managed(const char* what, const httplib::Request&, httplib::Response&) {
  throw ApiError(501, std::string(what) +
                          " is not supported: this server serves the one model file given at "
                          "start-up (-m) and manages no model store");
}

}  // namespace

void install_ollama_routes(Router& http, HttpServer& server) {
  using Fn = void (*)(HttpServer&, const httplib::Request&, httplib::Response&);
  auto wrap = [&server](Fn fn) {
    return [&server, fn](const httplib::Request& req, httplib::Response& res) {
      handle_json(req, res, [&] { fn(server, req, res); });
    };
  };
  http.Post("/api/chat", wrap(api_chat));
  http.Post("/api/generate", wrap(api_generate));
  http.Get("/api/tags", wrap(api_tags));
  http.Get("/api/ps", wrap(api_ps));
  http.Post("/api/show", wrap(api_show));
  http.Post("/api/pull", wrap(api_pull));
  auto unsupported = [](const char* what) {
    return [what](const httplib::Request& req, httplib::Response& res) {
      handle_json(req, res, [&] { not_managed(what, req, res); });
    };
  };
  http.Post("/api/copy", unsupported("copying a model"));
  http.Delete("/api/delete", unsupported("deleting a model"));
  http.Post("/api/push", unsupported("pushing a model"));
  http.Post("/api/create", unsupported("creating a model"));
  http.Get("/api/version", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, {{"version", HABLAR_SERVER_VERSION}});
  });
}

}  // namespace hablar::server
