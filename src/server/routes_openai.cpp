// OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models.
#include <httplib.h>

#include "server/api_error.h"
#include "server/chat_request.h"
#include "server/http_server.h"
#include "server/live_timings.h"
#include "server/openai_chat.h"
#include "server/request_fields.h"
#include "server/sampling_fields.h"
#include "server/structured_output.h"

namespace hablar::server {

namespace {

using engine::StreamItem;
using nlohmann::json;

// Adds a finished choice to the usage totals. The choices of one prompt share it: its tokens
// count once (first_of_prompt), as OpenAI counts them.
void add_usage(StreamItem& total, const StreamItem& final, bool first_of_prompt) {
  total.n_generated += final.n_generated;
  if (!first_of_prompt) return;
  total.n_prompt += final.n_prompt;
  total.n_cached_prompt += final.n_cached_prompt;
}

const char* finish_reason_text(engine::FinishReason r, bool tool_calls) {
  if (tool_calls && r == engine::FinishReason::kStop) return "tool_calls";
  return r == engine::FinishReason::kLength ? "length" : "stop";
}

json usage_json(const StreamItem& final) {
  return {{"prompt_tokens", final.n_prompt},
          {"completion_tokens", final.n_generated},
          {"total_tokens", final.n_prompt + final.n_generated},
          {"prompt_tokens_details", {{"cached_tokens", final.n_cached_prompt}}}};
}

// Chat logprobs entries ({"token", "logprob", "bytes", "top_logprobs"}) of some tokens.
json chat_logprobs(const ServingModel& m, const std::vector<StreamItem>& tokens) {
  json content = json::array();
  for (const StreamItem& t : tokens) {
    const std::string s = token_string(m, t.token);
    json top = json::array();
    for (const auto& alt : t.top_logprobs) {
      const std::string a = token_string(m, alt.token);
      top.push_back({{"token", a}, {"logprob", alt.logprob}, {"bytes", token_bytes(a)}});
    }
    content.push_back(
        {{"token", s}, {"logprob", t.logprob}, {"bytes", token_bytes(s)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

json tool_calls_json(const std::vector<chat::ToolCall>& calls, size_t first_index, bool delta) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", calls[i].id.empty() ? random_id("call_") : calls[i].id},
              {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (delta) c["index"] = first_index + i;
    out.push_back(std::move(c));
  }
  return out;
}

// Builds chat.completion.chunk objects for one request.
struct ChunkMaker {
  std::string id = random_id("chatcmpl-");
  int64_t created = unix_time_now();
  std::string model;
  bool include_usage = false;
  const LiveTimings* live = nullptr;  // timings_per_token: the current choice's
  json make(size_t index, json delta, const json& logprobs, const char* finish_reason) const {
    json c = {{"id", id},
              {"object", "chat.completion.chunk"},
              {"created", created},
              {"model", model},
              {"system_fingerprint", "hablar"},
              {"choices",
               json::array({{{"index", index},
                             {"delta", std::move(delta)},
                             {"logprobs", logprobs},
                             {"finish_reason", finish_reason ? json(finish_reason) : json()}}})}};
    if (include_usage) c["usage"] = nullptr;
    if (live != nullptr && live->started()) c["timings"] = live->now();
    return c;
  }
};

std::string sse(const json& j) {
  return "data: " + dump_json(j) + "\n\n";
}

// One choice of a streamed chat response: its output parser and what it has sent so far.
struct ChoiceStream {
  bool sent_role = false;
  bool tool_calls = false;
  size_t n_calls = 0;
  std::unique_ptr<ChatOutputStream> output;
  std::vector<StreamItem> pending_logprobs;
};

// Sends what the parser made of a piece of choice `index`'s output as chunks.
void emit_parsed(const ServingModel& m, const ChunkMaker& maker, bool logprobs, size_t index,
                 ChoiceStream& cs, const chat::ParsedMessage& p, std::string& out) {
  json lp =
      logprobs && !cs.pending_logprobs.empty() ? chat_logprobs(m, cs.pending_logprobs) : json();
  bool used_lp = false;
  if (!p.reasoning.empty())
    out += sse(maker.make(index, {{"reasoning_content", p.reasoning}}, json(), nullptr));
  if (!p.content.empty()) {
    out += sse(maker.make(index, {{"content", p.content}}, lp, nullptr));
    used_lp = true;
  }
  if (!p.tool_calls.empty()) {
    out += sse(maker.make(index, {{"tool_calls", tool_calls_json(p.tool_calls, cs.n_calls, true)}},
                          used_lp ? json() : lp, nullptr));
    cs.n_calls += p.tool_calls.size();
    cs.tool_calls = true;
    used_lp = true;
  }
  if (used_lp) cs.pending_logprobs.clear();
}

// Streams the choices one after another (each chunk names its choice's index); after the
// last one, the usage of all (when asked) and [DONE].
void stream_chat(httplib::Response& res, std::shared_ptr<ServingModel> m, const ChatRequest& r,
                 std::vector<std::shared_ptr<engine::RequestHandle>> handles) {
  struct State {
    ChunkMaker maker;
    std::vector<ChoiceStream> choices;
    size_t current = 0;
    StreamItem total;
    std::unique_ptr<PromptProgress> progress;  // of the first choice, when asked
    std::vector<LiveTimings> live;             // one per choice, with timings_per_token
    json first_timings;                        // the first choice's, for the usage chunk
  };
  auto st = std::make_shared<State>();
  st->maker.model = m->id;
  st->maker.include_usage = r.include_usage;
  st->choices.resize(handles.size());
  if (r.return_progress)
    st->progress =
        std::make_unique<PromptProgress>(handles[0]->id(), (int32_t)r.spec.prompt.size());
  for (ChoiceStream& cs : st->choices) cs.output = std::make_unique<ChatOutputStream>(*m, r);
  if (r.timings_per_token)
    for (const auto& h : handles) st->live.emplace_back(h->id(), (int32_t)r.spec.prompt.size());
  StreamPump pump = [st, m, handles, logprobs = r.logprobs,
                     include_usage = r.include_usage](bool& done) {
    std::string out;
    const size_t i = st->current;
    ChoiceStream& cs = st->choices[i];
    st->maker.live = st->live.empty() ? nullptr : &st->live[i];
    if (!cs.sent_role) {
      // As llama-server: the role first, with no content yet.
      out += sse(st->maker.make(i, {{"role", "assistant"}, {"content", nullptr}}, json(), nullptr));
      cs.sent_role = true;
    }
    auto progress_chunk = [&](const std::optional<json>& p) {
      if (!p) return;
      json c = st->maker.make(0, json::object(), json(), nullptr);
      c["choices"] = json::array();
      c["prompt_progress"] = *p;
      if (!st->live.empty()) c["timings"] = LiveTimings::of_progress(*p);
      out += sse(c);
    };
    if (st->progress) progress_chunk(st->progress->poll(*m));
    auto items = next_items(*handles[i]);
    if (st->progress && !items.empty())
      while (auto p = st->progress->finish(*m, items)) progress_chunk(p);
    for (StreamItem& it : items) {
      if (it.kind == StreamItem::Kind::kToken) {
        cs.pending_logprobs.push_back(it);
        if (!st->live.empty()) st->live[i].on_token(*m);
      }
      emit_parsed(*m, st->maker, logprobs, i, cs, cs.output->next(it), out);
      if (it.kind != StreamItem::Kind::kFinal) continue;
      if (failed(it)) {
        out += sse(failure_body(it));
        out += "data: [DONE]\n\n";
        done = true;
        break;
      }
      json last = st->maker.make(i, json::object(), json(),
                                 finish_reason_text(it.finish_reason, cs.tool_calls));
      last["timings"] = timings_json(it);
      if (i == 0) st->first_timings = last["timings"];
      out += sse(last);
      add_usage(st->total, it, i == 0);
      st->current += 1;
      if (st->current == handles.size()) {
        if (include_usage) {
          json u = st->maker.make(0, json::object(), json(), nullptr);
          u["choices"] = json::array();
          u["usage"] = usage_json(st->total);
          u["timings"] = st->first_timings;  // as the non-streamed reply has them
          out += sse(u);
        }
        out += "data: [DONE]\n\n";
        done = true;
      }
      break;
    }
    return out;
  };
  stream_response(res, "text/event-stream", pump, [handles] {
    for (auto& h : handles) h->cancel();
  });
}

// The "choices" entry of a finished chat generation.
json chat_choice(const ServingModel& m, const ChatRequest& r, const CollectedOutput& out,
                 size_t index) {
  const ChatMessageOut o = final_chat_message(m, r, out);
  const chat::ParsedMessage& p = o.message;
  json message = {{"role", "assistant"}, {"content", o.null_content ? json() : json(p.content)}};
  if (!p.reasoning.empty()) message["reasoning_content"] = p.reasoning;
  if (!p.tool_calls.empty()) message["tool_calls"] = tool_calls_json(p.tool_calls, 0, false);
  return {{"index", index},
          {"message", message},
          {"logprobs", r.logprobs ? chat_logprobs(m, out.tokens) : json()},
          {"finish_reason", finish_reason_text(out.final.finish_reason, !p.tool_calls.empty())}};
}

void chat_completions(HttpServer& server, const httplib::Request& req, httplib::Response& res) {
  auto m = server.model_or_throw();
  json body = request_json(req);
  ChatRequest r = parse_chat_request(body, req.body, *m);
  auto handles = start_choices(*m, r.spec, r.n);
  if (r.stream) return stream_chat(res, m, r, std::move(handles));

  json choices = json::array();
  StreamItem total;
  json timings;
  std::string first_text;
  for (size_t i = 0; i < handles.size(); ++i) {
    CollectedOutput out = collect_output(*handles[i]);
    if (failed(out.final)) {
      for (auto& h : handles) h->cancel();
      check_final(out.final);
    }
    if (i == 0) first_text = out.text;
    choices.push_back(chat_choice(*m, r, out, i));
    add_usage(total, out.final, i == 0);
    if (i == 0) timings = timings_json(out.final);  // the first choice's, as llama-server has one
    if (i == 0) set_server_timing(res, out.final);
  }
  json reply = {{"id", random_id("chatcmpl-")},   {"object", "chat.completion"},
                {"created", unix_time_now()},     {"model", m->id},
                {"system_fingerprint", "hablar"}, {"choices", choices},
                {"usage", usage_json(total)},     {"timings", timings}};
  if (m->verbose_replies || opt_bool(body, "verbose").value_or(false))
    reply["__verbose"] = {{"prompt", m->tok().decode(r.spec.prompt, /*show_special=*/true)},
                          {"content", first_text},
                          {"tokens_evaluated", r.spec.prompt.size()},
                          {"generation_settings", sampling_json(r.spec.sampling)}};
  send_json(res, reply);
}

// The prompt tokens a chat request would be read as (llama-server's
// /chat/completions/input_tokens), without generating.
void chat_input_tokens(HttpServer& server, const httplib::Request& req, httplib::Response& res) {
  auto m = server.model_or_throw();
  const ChatRequest r = parse_chat_request(request_json(req), req.body, *m);
  send_json(res, {{"object", "response.input_tokens"}, {"input_tokens", r.spec.prompt.size()}});
}

// "prompt": text, list of texts, token ids, or list of token-id lists.
std::vector<std::vector<int32_t>> parse_prompts(const json& body, const ServingModel& m) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) bad_request("'prompt' is required", "prompt");
  auto from_ids = [&](const json& ids) {
    std::vector<int32_t> out;
    for (const auto& t : ids) {
      if (!t.is_number_integer()) bad_request("'prompt' token ids must be integers", "prompt");
      const int64_t v = t.get<int64_t>();
      if (v < 0 || v >= m.tok().n_vocab())
        bad_request("'prompt' token id " + std::to_string(v) + " is outside the vocabulary [0, " +
                        std::to_string(m.tok().n_vocab()) + ")",
                    "prompt");
      out.push_back((int32_t)v);
    }
    return out;
  };
  std::vector<std::vector<int32_t>> prompts;
  if (it->is_string()) {
    prompts.push_back(tokenize_prompt(m, it->get<std::string>()));
  } else if (it->is_array() && !it->empty() && (*it)[0].is_number()) {
    prompts.push_back(from_ids(*it));
  } else if (it->is_array() && !it->empty()) {
    for (const auto& p : *it) {
      if (p.is_string())
        prompts.push_back(tokenize_prompt(m, p.get<std::string>()));
      else if (p.is_array())
        prompts.push_back(from_ids(p));
      else
        bad_request("'prompt' must be text, a list of texts or token ids", "prompt");
    }
  } else {
    bad_request("'prompt' must be text, a list of texts or token ids (and not empty)", "prompt");
  }
  if (prompts.size() > 64) bad_request("'prompt' holds more than 64 prompts", "prompt");
  for (const auto& p : prompts)
    if (p.empty()) bad_request("'prompt' is empty", "prompt");
  return prompts;
}

// Legacy completions logprobs: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
// of some tokens (prompt tokens first when echoed; the first of those has null entries).
json completion_logprobs(const ServingModel& m, const std::vector<StreamItem>& tokens,
                         size_t text_offset) {
  json toks = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  for (const StreamItem& t : tokens) {
    const std::string s = token_string(m, t.token);
    toks.push_back(s);
    json top = json::object();
    for (const auto& alt : t.top_logprobs) top[token_string(m, alt.token)] = alt.logprob;
    lps.push_back(t.has_logprob ? json(t.logprob) : json());
    tops.push_back(t.has_logprob ? top : json());
    offs.push_back(text_offset);
    text_offset += s.size();
  }
  return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

// The prompt's items followed by the generated ones.
std::vector<StreamItem> joined(const std::vector<StreamItem>& prompt,
                               const std::vector<StreamItem>& tokens) {
  std::vector<StreamItem> all = prompt;
  all.insert(all.end(), tokens.begin(), tokens.end());
  return all;
}

void completions(HttpServer& server, const httplib::Request& req, httplib::Response& res) {
  auto m = server.model_or_throw();
  json body = request_json(req);
  const auto prompts = parse_prompts(body, *m);
  const bool stream = opt_bool(body, "stream").value_or(false);
  bool include_usage = false;
  if (body.contains("stream_options") && body["stream_options"].is_object())
    include_usage = opt_bool(body["stream_options"], "include_usage").value_or(false);
  const int n = (int)opt_integer(body, "n", 1, kMaxChoices).value_or(1);
  if (auto best = opt_integer(body, "best_of", 1, kMaxChoices); best && *best != 1 && *best != n)
    bad_request("'best_of' other than 1 or 'n' is not supported", "best_of");
  if ((int64_t)prompts.size() * n > kMaxChoices)
    bad_request("'n' times the number of prompts is more than " + std::to_string(kMaxChoices), "n");
  const bool echo = opt_bool(body, "echo").value_or(false);
  const auto logprobs = opt_integer(body, "logprobs", 0, 20);
  auto max_tokens = opt_integer(body, "max_tokens", 0, INT32_MAX);
  if (max_tokens == 0 && !echo)
    bad_request("'max_tokens': 0 needs 'echo': true (the prompt and its log-probabilities only)",
                "max_tokens");
  // Echo with logprobs gives the prompt tokens' log-probabilities too.
  const int32_t n_prompt_logprobs =
      echo && logprobs ? (int32_t)*logprobs : (max_tokens == 0 ? 0 : -1);
  const auto stop = opt_string_list(body, "stop", 16);
  opt_string(body, "user");
  const engine::SamplingParams sampling = parse_sampling(body, *m, Dialect::kOpenAI);
  const GrammarPtr grammar = openai_output_grammar(*m, req.body);
  const int32_t priority = parse_priority(body);
  const int32_t id_slot = parse_id_slot(body, *m);
  // llama-server's extension, which benchmarks send to get outputs of full length.
  const bool ignore_eos = opt_bool(body, "ignore_eos").value_or(false);
  const auto speculative = parse_speculative(body, *m);
  GenerationSpec shift_fields;
  parse_context_shift(body, "n_keep", shift_fields);

  // Choice i is prompt i / n's (i % n)-th: choices of one prompt are next to each other.
  std::vector<std::shared_ptr<engine::RequestHandle>> handles;
  std::vector<std::string> echoes;
  try {
    for (const auto& p : prompts) {
      GenerationSpec spec;
      spec.prompt = p;
      spec.sampling = sampling;
      spec.stop = stop;
      spec.n_logprobs = logprobs ? (int32_t)*logprobs : -1;
      spec.n_prompt_logprobs = n_prompt_logprobs;
      spec.grammar = grammar;
      spec.priority = priority;
      spec.id_slot = id_slot;
      spec.ignore_eos = ignore_eos;
      spec.speculative = speculative;
      spec.n_keep = shift_fields.n_keep;
      spec.n_discard = shift_fields.n_discard;
      spec.max_tokens = bounded_max_tokens(*m, max_tokens, p.size());
      for (auto& h : start_choices(*m, spec, n)) {
        echoes.push_back(echo ? m->tok().decode(p) : "");
        handles.push_back(std::move(h));
      }
    }
  } catch (...) {
    for (auto& h : handles) h->cancel();
    throw;
  }
  const std::string id = random_id("cmpl-");
  const int64_t created = unix_time_now();
  auto choice = [&](size_t i, const std::string& text, json lp, const char* finish) {
    return json{{"text", text},
                {"index", i},
                {"logprobs", lp},
                {"finish_reason", finish ? json(finish) : json()}};
  };
  if (!stream) {
    json choices = json::array();
    StreamItem total;
    json timings;
    for (size_t i = 0; i < handles.size(); ++i) {
      CollectedOutput out = collect_output(*handles[i]);
      if (i == 0) timings = timings_json(out.final);
      if (i == 0) set_server_timing(res, out.final);
      if (failed(out.final)) {
        for (auto& h : handles) h->cancel();
        check_final(out.final);
      }
      json lp = !logprobs ? json()
                : echo    ? completion_logprobs(*m, joined(out.prompt, out.tokens), 0)
                          : completion_logprobs(*m, out.tokens, 0);
      choices.push_back(
          choice(i, echoes[i] + out.text, lp, finish_reason_text(out.final.finish_reason, false)));
      add_usage(total, out.final, i % n == 0);
    }
    send_json(res, {{"id", id},
                    {"object", "text_completion"},
                    {"created", created},
                    {"model", m->id},
                    {"system_fingerprint", "hablar"},
                    {"choices", choices},
                    {"usage", usage_json(total)},
                    {"timings", timings}});
    return;
  }
  struct State {
    size_t current = 0;
    bool echoed = false;
    size_t offset = 0;
    std::vector<StreamItem> prompt_items;  // of the current choice, until its echo is sent
    StreamItem total;
  };
  auto st = std::make_shared<State>();
  auto chunk = [id, created, model = m->id, include_usage](json choices) {
    json c = {{"id", id},       {"object", "text_completion"},    {"created", created},
              {"model", model}, {"system_fingerprint", "hablar"}, {"choices", std::move(choices)}};
    if (include_usage) c["usage"] = nullptr;
    return c;
  };
  StreamPump pump = [=](bool& done) {
    std::string out;
    const size_t i = st->current;
    for (StreamItem& it : next_items(*handles[i])) {
      if (it.kind == StreamItem::Kind::kPrompt) {
        st->prompt_items.push_back(std::move(it));
        continue;
      }
      if (!st->echoed) {  // the echo, with the prompt's log-probabilities when asked
        st->echoed = true;
        st->offset = 0;
        if (!echoes[i].empty()) {
          json lp = logprobs ? completion_logprobs(*m, st->prompt_items, 0) : json();
          for (const auto& p : st->prompt_items) st->offset += token_string(*m, p.token).size();
          out += sse(chunk(json::array({choice(i, echoes[i], lp, nullptr)})));
        }
        st->prompt_items.clear();
      }
      if (it.kind == StreamItem::Kind::kToken) {
        json lp = logprobs ? completion_logprobs(*m, {it}, st->offset) : json();
        st->offset += token_string(*m, it.token).size();
        if (!it.text.empty() || logprobs)
          out += sse(chunk(json::array({choice(i, it.text, lp, nullptr)})));
        continue;
      }
      if (failed(it)) {
        out += sse(failure_body(it));
        out += "data: [DONE]\n\n";
        done = true;
        return out;
      }
      json last = chunk(
          json::array({choice(i, it.text, json(), finish_reason_text(it.finish_reason, false))}));
      last["timings"] = timings_json(it);
      out += sse(last);
      add_usage(st->total, it, i % n == 0);
      st->current += 1;
      st->echoed = false;
      if (st->current == handles.size()) {
        if (include_usage) {
          json u = chunk(json::array());
          u["usage"] = usage_json(st->total);
          out += sse(u);
        }
        out += "data: [DONE]\n\n";
        done = true;
      }
      break;
    }
    return out;
  };
  stream_response(res, "text/event-stream", pump, [handles] {
    for (auto& h : handles) h->cancel();
  });
}

json model_entry(const ServingModel& m) {
  const auto& c = m.model->config();
  return {{"id", m.id},
          {"object", "model"},
          {"created", m.created},
          {"owned_by", "hablar"},
          {"aliases", m.aliases},
          {"tags", m.tags},
          {"meta",
           {{"n_vocab", c.n_vocab},
            {"n_ctx_train", c.n_ctx_train},
            {"n_ctx", m.n_ctx},  // what requests are held to (props' n_ctx)
            {"n_embd", c.n_embd},
            {"n_layers", c.n_layers},
            {"arch", c.arch}}}};
}

// The model list in llama-server's second shape ("models", as Ollama's /api/tags lists
// them), beside OpenAI's "data": what the model does in "capabilities".
json model_list_entry(const ServingModel& m) {
  json capabilities = json::array();
  if (!m.model->config().encoder) capabilities.push_back("completion");
  if (m.embeddings) capabilities.push_back("embedding");
  if (!m.model->config().encoder && m.template_knows_tools) capabilities.push_back("tools");
  return {{"name", m.id},      {"model", m.id},  {"modified_at", ""},
          {"size", ""},        {"digest", ""},   {"type", "model"},
          {"description", ""}, {"tags", m.tags}, {"capabilities", capabilities}};
}

}  // namespace

void install_openai_routes(Router& http, HttpServer& server) {
  auto post = [&](const char* path,
                  void (*fn)(HttpServer&, const httplib::Request&, httplib::Response&)) {
    http.Post(path, [&server, fn](const httplib::Request& req, httplib::Response& res) {
      handle_json(req, res, [&] { fn(server, req, res); });
    });
  };
  post("/v1/chat/completions", chat_completions);
  post("/chat/completions", chat_completions);
  post("/v1/chat/completions/input_tokens", chat_input_tokens);
  post("/chat/completions/input_tokens", chat_input_tokens);
  post("/v1/completions", completions);
  auto models = [&server](const httplib::Request& req, httplib::Response& res) {
    handle_json(req, res, [&] {
      auto m = server.model_or_throw();
      send_json(res, {{"models", json::array({model_list_entry(*m)})},
                      {"object", "list"},
                      {"data", json::array({model_entry(*m)})}});
    });
  };
  http.Get("/v1/models", models);
  http.Get("/models", models);  // llama-server answers both
  http.Get(R"(/v1/models/(.+))", [&server](const httplib::Request& req, httplib::Response& res) {
    handle_json(req, res, [&] {
      auto m = server.model_or_throw();
      const std::string name = req.matches[1];
      if (name != m->id &&
          std::find(m->aliases.begin(), m->aliases.end(), name) == m->aliases.end())
        throw ApiError(404, "no model named " + text_excerpt(std::string(req.matches[1])));
      send_json(res, model_entry(*m));
    });
  });
}

}  // namespace hablar::server
