// llama.cpp-server-compatible routes: /completion, /tokenize, /detokenize, /apply-template,
// /health, /props, /metrics (/slots: routes_slots.cpp).
#include <httplib.h>

#include <cmath>
#include <optional>
#include <sstream>

#include "server/api_error.h"
#include "server/http_server.h"
#include "server/live_timings.h"
#include "server/openai_chat.h"
#include "server/prompt_inputs.h"
#include "server/request_fields.h"
#include "server/sampling_fields.h"
#include "server/structured_output.h"

namespace hablar::server {

namespace {

using engine::StreamItem;
using nlohmann::json;

// A piece as llama.cpp shows it: the text when it is valid UTF-8, else its bytes.
json piece_json(const std::string& s) {
  json probe = s;
  try {
    (void)probe.dump();
    return s;
  } catch (const json::type_error&) {
    return token_bytes(s);
  }
}

// The prompts of a request's "prompt" (server/prompt_inputs.h): the first text of each
// tokenized as the model's prompts are (BOS unless the text starts with it).
std::vector<std::vector<int32_t>> llama_prompts(const json& body, const ServingModel& m) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) bad_request("'prompt' is required", "prompt");
  PromptReading how{"prompt", [&m](const std::string& text) { return tokenize_prompt(m, text); }};
  return read_prompts(m, *it, how);
}

// llama-server's n_probs entries: id, token (text, or its bytes when not valid UTF-8),
// bytes, logprob, and the same for the top alternatives.
json probs_json(const ServingModel& m, const StreamItem& t) {
  auto entry = [&](int32_t id, float logprob) {
    const std::string s = token_string(m, id);
    return json{
        {"id", id}, {"token", piece_json(s)}, {"bytes", token_bytes(s)}, {"logprob", logprob}};
  };
  json top = json::array();
  for (const auto& alt : t.top_logprobs) top.push_back(entry(alt.token, alt.logprob));
  json e = entry(t.token, t.logprob);
  e["top_logprobs"] = std::move(top);
  return e;
}

// The same with post_sampling_probs: probabilities after the sampler chain (of the tokens that
// stayed candidates), as `prob` and `top_probs`. `e` is the sample's PostSamplingLog entry;
// without one (none was recorded) the model's own probabilities stand in.
json post_probs_json(const ServingModel& m, const StreamItem& t,
                     const std::optional<engine::PostSamplingLog::Entry>& e) {
  auto entry = [&](int32_t id, float prob) {
    const std::string s = token_string(m, id);
    return json{{"id", id}, {"token", piece_json(s)}, {"bytes", token_bytes(s)}, {"prob", prob}};
  };
  json top = json::array();
  json j;
  if (e) {
    for (const auto& c : e->top) top.push_back(entry(c.token, c.prob));
    j = entry(t.token, e->prob);
  } else {
    for (const auto& alt : t.top_logprobs) top.push_back(entry(alt.token, std::exp(alt.logprob)));
    j = entry(t.token, std::exp(t.logprob));
  }
  j["top_probs"] = std::move(top);
  return j;
}

const char* stop_type(const StreamItem& f, bool eog) {
  if (f.finish_reason == engine::FinishReason::kLength) return "limit";
  if (f.finish_reason == engine::FinishReason::kStop) return eog ? "eos" : "word";
  return "none";
}

// What a /completion reply shows besides the text.
struct CompletionShape {
  int64_t n_probs = 0;
  // post_sampling_probs: one log per prompt (engine/request_sampler.h)
  std::vector<std::shared_ptr<engine::PostSamplingLog>> post_logs;
  bool return_tokens = false;  // non-streamed; streamed chunks always carry their tokens
  json generation_settings;    // the request's own settings, as llama-server echoes them
  std::vector<std::string> response_fields;  // "a/b" paths: only these, flattened
};

// llama-server's response_fields: the reply holds only the named fields, a path "a/b" read
// from inside "a" and keyed by the path itself. A path that names nothing is left out.
json pick_fields(const json& full, const std::vector<std::string>& paths) {
  json out = json::object();
  for (const std::string& path : paths) {
    const json* at = &full;
    for (size_t a = 0, b; at != nullptr && a <= path.size(); a = b + 1) {
      b = std::min(path.find('/', a), path.size());
      const auto it = at->is_object() ? at->find(path.substr(a, b - a)) : at->end();
      at = it != at->end() ? &*it : nullptr;
    }
    if (at != nullptr) out[path] = *at;
  }
  return out;
}

// The fields of a finished generation. has_new_line: whether the generated text holds a
// line break (llama-server's infill clients use it); stopping_word: the stop string that
// ended it.
void final_fields(const ServingModel& m, json& j, const StreamItem& f,
                  const std::vector<int32_t>& toks, bool has_new_line, int32_t id_slot) {
  const bool eog = !toks.empty() && m.tok().is_eog(toks.back());
  j["stop"] = true;
  j["has_new_line"] = has_new_line;
  j["stopping_word"] = f.stop_word;
  j["model"] = m.id;
  j["tokens_predicted"] = f.n_generated;
  j["tokens_evaluated"] = f.n_prompt;
  j["tokens_cached"] = f.n_cached_prompt;
  j["stop_type"] = stop_type(f, eog);
  // As llama-server: the context filled (and shifted, or stopped the generation).
  j["truncated"] = f.n_discarded > 0 || (f.finish_reason == engine::FinishReason::kLength &&
                                         (int64_t)f.n_prompt + f.n_generated >= m.n_ctx);
  j["id_slot"] = id_slot;
  j["timings"] = timings_json(f);
}

json completion_result(const ServingModel& m, const CollectedOutput& out, size_t index,
                       const CompletionShape& shape, const std::vector<int32_t>& prompt,
                       int32_t id_slot) {
  std::vector<int32_t> toks;
  for (const auto& t : out.tokens) toks.push_back(t.token);
  json j = {{"content", out.text}, {"index", index}};
  if (shape.return_tokens) j["tokens"] = toks;
  if (shape.n_probs > 0) {
    json probs = json::array();
    for (size_t k = 0; k < out.tokens.size(); ++k)
      probs.push_back(shape.post_logs.empty()
                          ? probs_json(m, out.tokens[k])
                          : post_probs_json(m, out.tokens[k], shape.post_logs[index]->take(k)));
    j["completion_probabilities"] = probs;
  }
  final_fields(m, j, out.final, toks, out.text.find('\n') != std::string::npos, id_slot);
  j["generation_settings"] = shape.generation_settings;
  j["prompt"] = m.tok().decode(prompt, /*show_special=*/true);
  return shape.response_fields.empty() ? j : pick_fields(j, shape.response_fields);
}

// Streams the prompts' completions one after another, each chunk naming its prompt's index.
// With timings_per_token every chunk carries the timings so far (live_timings.h).
void stream_completions(httplib::Response& res, std::shared_ptr<ServingModel> m,
                        std::vector<std::shared_ptr<engine::RequestHandle>> handles,
                        CompletionShape shape, std::shared_ptr<PromptProgress> progress,
                        std::vector<LiveTimings> live) {
  struct State {
    size_t current = 0;
    std::vector<int32_t> toks;
    bool new_line = false;
    std::vector<LiveTimings> live;  // one per prompt, or none
  };
  auto st = std::make_shared<State>();
  st->live = std::move(live);
  StreamPump pump = [=](bool& done) {
    std::string out;
    auto send = [&](const json& j) { out += "data: " + dump_json(j) + "\n\n"; };
    auto progress_chunk = [&](const std::optional<json>& p) {
      if (!p) return;
      json j = {{"index", 0},
                {"content", ""},
                {"tokens", json::array()},
                {"stop", false},
                {"prompt_progress", *p}};
      if (!st->live.empty()) j["timings"] = LiveTimings::of_progress(*p);
      send(j);
    };
    const size_t i = st->current;
    if (progress) progress_chunk(progress->poll(*m));
    auto items = next_items(*handles[i]);
    if (progress && !items.empty())
      while (auto p = progress->finish(*m, items)) progress_chunk(p);
    for (StreamItem& it : items) {
      json j = {{"content", it.text}, {"index", i}, {"stop", false}};
      st->new_line = st->new_line || it.text.find('\n') != std::string::npos;
      if (it.kind == StreamItem::Kind::kToken) {
        if (shape.n_probs > 0)
          j["completion_probabilities"] = json::array(
              {shape.post_logs.empty()
                   ? probs_json(*m, it)
                   : post_probs_json(*m, it, shape.post_logs[i]->take(st->toks.size()))});
        st->toks.push_back(it.token);
        j["tokens"] = json::array({it.token});  // llama-server sends each chunk's token ids
        if (!st->live.empty()) {
          st->live[i].on_token(*m);
          j["timings"] = st->live[i].now();
        }
        send(j);
        continue;
      }
      if (failed(it)) {
        send(failure_body(it));
        done = true;
        break;
      }
      final_fields(*m, j, it, st->toks, st->new_line, slot_of_request(*m, handles[i]->id()));
      send(j);
      st->current += 1;
      st->toks.clear();
      st->new_line = false;
      done = st->current == handles.size();
      break;
    }
    return out;
  };
  stream_response(res, "text/event-stream", pump, [handles] {
    for (auto& h : handles) h->cancel();
  });
}

// The settings a /completion request runs with, as llama-server echoes them in its reply:
// its sampling, n_predict and stop strings, and the logit biases (ignore_eos bans every
// end-of-generation token: bias null, JSON's stand-in for -inf).
json request_settings(const ServingModel& m, const GenerationSpec& spec,
                      std::optional<int64_t> n_predict) {
  json g = sampling_json(spec.sampling);
  g["n_predict"] = n_predict.value_or(m.defaults.n_predict);
  g["stop"] = spec.stop;
  g["ignore_eos"] = spec.ignore_eos;
  g["n_probs"] = std::max(0, spec.n_logprobs);
  g["n_keep"] = spec.n_keep.value_or(m.defaults.n_keep);
  g["n_discard"] = spec.n_discard;
  g["model"] = m.id;
  json bias = json::array();
  for (const auto& [token, value] : spec.sampling.logit_bias)
    bias.push_back({{"token", token}, {"bias", std::isfinite(value) ? json(value) : json()}});
  if (spec.ignore_eos)
    for (const int32_t t : m.tok().eog_ids()) bias.push_back({{"token", t}, {"bias", nullptr}});
  g["logit_bias"] = std::move(bias);
  return g;
}

// /completion and /infill: everything after the prompts. One prompt gets one result, a list
// of prompts a list of results (as llama-server answers).
void run_completion(std::shared_ptr<ServingModel> m, const httplib::Request& req,
                    httplib::Response& res, const json& body,
                    const std::vector<std::vector<int32_t>>& prompts) {
  GenerationSpec spec;
  spec.sampling = parse_sampling(body, *m, Dialect::kLlama);
  spec.priority = parse_priority(body);
  spec.id_slot = parse_id_slot(body, *m);
  parse_context_shift(body, "n_keep", spec);
  spec.speculative = parse_speculative(body, *m);
  spec.stop = opt_string_list(body, "stop", 64);
  spec.ignore_eos = opt_bool(body, "ignore_eos").value_or(false);
  CompletionShape shape;
  shape.n_probs = opt_integer(body, "n_probs", 0, 100).value_or(0);
  spec.n_logprobs = shape.n_probs > 0 ? (int32_t)shape.n_probs : -1;
  const bool post_sampling = opt_bool(body, "post_sampling_probs").value_or(false);
  spec.cache_prompt = opt_bool(body, "cache_prompt").value_or(true);
  auto n_predict = opt_integer(body, "n_predict", -1, INT32_MAX);
  if (n_predict && *n_predict == 0)
    bad_request("'n_predict' must be -1 or at least 1", "n_predict");
  if (n_predict && *n_predict < 0) n_predict.reset();
  if (!n_predict) n_predict = opt_integer(body, "max_tokens", 1, INT32_MAX);
  const bool stream = opt_bool(body, "stream").value_or(false);
  shape.return_tokens = opt_bool(body, "return_tokens").value_or(false);
  const bool return_progress = opt_bool(body, "return_progress").value_or(false);
  const bool timings_per_token = opt_bool(body, "timings_per_token").value_or(false);
  shape.response_fields = opt_string_list(body, "response_fields", 64);
  spec.grammar = llama_output_grammar(*m, req.body);
  shape.generation_settings = request_settings(*m, spec, n_predict);
  std::vector<std::shared_ptr<engine::RequestHandle>> handles;
  try {
    for (const auto& p : prompts) {
      GenerationSpec one = spec;
      one.prompt = p;
      one.max_tokens = bounded_max_tokens(*m, n_predict, p.size());
      if (post_sampling && shape.n_probs > 0) {
        one.post_sampling = std::make_shared<engine::PostSamplingLog>();
        shape.post_logs.push_back(one.post_sampling);
      }
      handles.push_back(start_generation(*m, std::move(one)));
    }
  } catch (...) {
    for (auto& h : handles) h->cancel();
    throw;
  }
  if (stream) {
    auto progress = return_progress ? std::make_shared<PromptProgress>(handles[0]->id(),
                                                                       (int32_t)prompts[0].size())
                                    : nullptr;
    std::vector<LiveTimings> live;
    if (timings_per_token)
      for (size_t i = 0; i < handles.size(); ++i)
        live.emplace_back(handles[i]->id(), (int32_t)prompts[i].size());
    return stream_completions(res, m, std::move(handles), shape, std::move(progress),
                              std::move(live));
  }
  json results = json::array();
  StreamItem first;
  for (size_t i = 0; i < handles.size(); ++i) {
    CollectedOutput out = collect_output(*handles[i]);
    if (failed(out.final))
      for (auto& h : handles) h->cancel();
    check_final(out.final);
    results.push_back(
        completion_result(*m, out, i, shape, prompts[i], slot_of_request(*m, handles[i]->id())));
    if (i == 0) first = out.final;
  }
  send_json(res, results.size() == 1 ? results[0] : results);
  set_server_timing(res, first);
}

void completion(HttpServer& server, const httplib::Request& req, httplib::Response& res) {
  auto m = server.model_or_throw();
  const json body = request_json(req);
  run_completion(m, req, res, body, llama_prompts(body, *m));
}

// llama-server's /infill: input_prefix, input_suffix, input_extra ([{filename, text}]) and
// prompt (the start of the middle) become a fill-in-the-middle prompt.
void infill(HttpServer& server, const httplib::Request& req, httplib::Response& res) {
  auto m = server.model_or_throw();
  const json body = request_json(req);
  std::vector<FimFile> extra;
  if (auto it = body.find("input_extra"); it != body.end() && !it->is_null()) {
    if (!it->is_array())
      bad_request("'input_extra' must be a list of {filename, text}", "input_extra");
    for (const auto& chunk : *it) {
      // As llama-server checks them: a string "text" in each, "filename" a string if given.
      if (!chunk.is_object() || !chunk.contains("text") || !chunk["text"].is_string())
        bad_request("'input_extra' entries need a string 'text' (and a string 'filename')",
                    "input_extra");
      extra.push_back(
          {opt_string(chunk, "filename").value_or(""), chunk["text"].get<std::string>()});
    }
  }
  auto prompt = fim_prompt(*m, opt_string(body, "input_prefix").value_or(""),
                           opt_string(body, "input_suffix").value_or(""),
                           opt_string(body, "prompt").value_or(""), extra);
  run_completion(m, req, res, body, {std::move(prompt)});
}

void tokenize(HttpServer& server, const httplib::Request& req, httplib::Response& res) {
  auto m = server.model_or_throw();
  json body = request_json(req);
  const std::string content = opt_string(body, "content").value_or("");
  const bool add_special = opt_bool(body, "add_special").value_or(false);
  const bool parse_special = opt_bool(body, "parse_special").value_or(true);
  const bool with_pieces = opt_bool(body, "with_pieces").value_or(false);
  const auto ids = m->tok().encode(content, add_special, parse_special);
  json tokens = json::array();
  for (int32_t id : ids) {
    if (with_pieces)
      tokens.push_back({{"id", id}, {"piece", piece_json(token_string(*m, id))}});
    else
      tokens.push_back(id);
  }
  send_json(res, {{"tokens", tokens}});
}

void detokenize(HttpServer& server, const httplib::Request& req, httplib::Response& res) {
  auto m = server.model_or_throw();
  json body = request_json(req);
  std::vector<int32_t> ids;
  if (body.contains("tokens")) {
    if (!body["tokens"].is_array()) bad_request("'tokens' must be a list of token ids", "tokens");
    for (const auto& t : body["tokens"]) {
      if (!t.is_number_integer()) bad_request("'tokens' must be a list of token ids", "tokens");
      const int64_t v = t.get<int64_t>();
      if (v < 0 || v >= m->tok().n_vocab())
        bad_request("token id " + std::to_string(v) + " is outside the vocabulary [0, " +
                        std::to_string(m->tok().n_vocab()) + ")",
                    "tokens");
      ids.push_back((int32_t)v);
    }
  }
  send_json(res, {{"content", m->tok().decode(ids)}});
}

void apply_template(HttpServer& server, const httplib::Request& req, httplib::Response& res) {
  auto m = server.model_or_throw();
  json body = request_json(req);
  const ChatParts chat = chat_parts(req.body);
  const bool add_gen = opt_bool(body, "add_generation_prompt").value_or(true);
  std::string text =
      render_chat(*m, chat.messages, chat.tools, add_gen, template_kwargs(*m, body)).text;
  // The prompt as a client would post it to /completion, which adds the vocabulary's BOS
  // (and EOS) itself: a template's own BOS / final EOS is left out, as llama-server does.
  const auto& tok = m->tok();
  auto piece = [&](int32_t id) { return id >= 0 ? tok.token_piece(id) : std::string(); };
  if (const std::string bos = piece(tok.bos_id());
      tok.add_bos() && !bos.empty() && text.starts_with(bos))
    text.erase(0, bos.size());
  if (const std::string eos = piece(tok.eos_id());
      tok.add_eos() && !eos.empty() && text.ends_with(eos))
    text.resize(text.size() - eos.size());
  send_json(res, {{"prompt", text}});
}

json generation_settings(const ServingModel& m) {
  json g = sampling_json(m.defaults.sampling);
  g["n_ctx"] = m.n_ctx;
  g["n_predict"] = m.defaults.n_predict;
  g["n_keep"] = m.defaults.n_keep;
  g["n_discard"] = 0;
  g["context_shift"] = m.defaults.context_shift;
  g["model"] = m.path;
  g["seed"] = m.defaults.seed_random ? json(-1) : json(m.defaults.sampling.seed);
  return g;
}

void props(HttpServer& server, const httplib::Request&, httplib::Response& res) {
  auto m = server.model_or_throw();
  const auto& tok = m->tok();
  send_json(res, {{"default_generation_settings", generation_settings(*m)},
                  {"n_ctx", m->n_ctx},  // the context every request is held to
                  {"total_slots", m->n_slots},
                  {"model_path", m->path},
                  {"model_alias", m->id},
                  {"chat_template", m->chat_template->source()},
                  {"bos_token", tok.bos_id() >= 0 ? tok.token_piece(tok.bos_id()) : ""},
                  {"eos_token", tok.eos_id() >= 0 ? tok.token_piece(tok.eos_id()) : ""},
                  {"tool_format", chat::tool_format_name(m->tool_format)},
                  {"device", m->executor->device_name()},
                  {"is_sleeping", false},  // asleep, /props answers from its snapshot
                  {"build_info", std::string("hablar ") + HABLAR_SERVER_VERSION}});
}

// llama-server's LoRA hot-swap routes. hablar loads no adapters (there is no --lora), so
// the list is empty and a request to scale an adapter names one that does not exist.
void lora_adapters(HttpServer&, const httplib::Request& req, httplib::Response& res) {
  if (req.method == "GET") return send_json(res, json::array());
  const json body = parse_body_json(req.body);
  if (!body.is_array()) bad_request("the body must be a list of {id, scale}", "body");
  for (const json& e : body) {
    if (!e.is_object() || !e.contains("id") || !e["id"].is_number_integer())
      bad_request("each entry must be {\"id\": integer, \"scale\": number}", "id");
    bad_request("there is no LoRA adapter " + std::to_string(e["id"].get<int64_t>()) +
                    ": this server loaded none",
                "id");
  }
  send_json(res, {{"success", true}});
}

void histogram_text(std::ostringstream& o, const char* name, const char* help,
                    const engine::Histogram& h) {
  o << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  for (size_t i = 0; i < h.bounds.size(); ++i)
    o << name << "_bucket{le=\"" << h.bounds[i] << "\"} " << h.counts[i] << "\n";
  o << name << "_bucket{le=\"+Inf\"} " << h.count << "\n";
  o << name << "_sum " << h.sum << "\n" << name << "_count " << h.count << "\n";
}

// The same figures under llama-server's names, for the dashboards made for it.
template <typename Metric>
void llamacpp_metrics(Metric& metric, const engine::MetricsSnapshot& s, ServingModel& m) {
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  metric("llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed.",
         (double)s.prompt_tokens_computed);
  metric("llamacpp:prompt_tokens_cached_total", "counter",
         "Number of prompt tokens served from the prompt cache.", (double)s.prompt_tokens_cached);
  metric("llamacpp:prompt_seconds_total", "counter", "Prompt process time.",
         s.prompt_seconds_total);
  metric("llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed.",
         (double)s.generated_tokens_total);
  metric("llamacpp:tokens_predicted_seconds_total", "counter", "Predict process time.",
         s.decode_seconds_total);
  metric("llamacpp:n_decode_total", "counter", "Total number of llama_decode() calls.",
         (double)s.steps_total);
  metric("llamacpp:n_tokens_max", "counter", "Largest observed n_tokens.",
         (double)s.max_batch_size);
  metric("llamacpp:spec_decode_num_draft_tokens_total", "counter",
         "Number of drafted tokens verified.", (double)s.draft_tokens_total);
  metric("llamacpp:spec_decode_num_accepted_tokens_total", "counter",
         "Number of drafted tokens accepted.", (double)s.draft_accepted_total);
  metric("llamacpp:spec_decode_num_drafts_total", "counter", "Number of drafts verified.",
         (double)s.spec_rounds_total);
  metric("llamacpp:n_busy_slots_per_decode", "gauge",
         "Average number of busy slots per llama_decode() call.",
         ratio(s.batch_size.sum, (double)s.batch_size.count));
  // Throughput since the previous scrape (llama-server's "bucket"), then the window restarts.
  double prompt_rate = 0, decode_rate = 0;
  {
    ServingModel::ScrapeWindow& w = m.scrape_window;
    std::lock_guard<std::mutex> lock(w.mu);
    prompt_rate = ratio((double)s.prompt_tokens_computed - w.prompt_tokens,
                        s.prompt_seconds_total - w.prompt_seconds);
    decode_rate = ratio((double)s.generated_tokens_total - w.generated,
                        s.decode_seconds_total - w.decode_seconds);
    w.prompt_tokens = (double)s.prompt_tokens_computed;
    w.prompt_seconds = s.prompt_seconds_total;
    w.generated = (double)s.generated_tokens_total;
    w.decode_seconds = s.decode_seconds_total;
  }
  metric("llamacpp:prompt_tokens_seconds", "gauge",
         "Average prompt throughput in tokens/s since the previous scrape.", prompt_rate);
  metric("llamacpp:predicted_tokens_seconds", "gauge",
         "Average generation throughput in tokens/s since the previous scrape.", decode_rate);
  metric("llamacpp:kv_cache_usage_ratio", "gauge", "KV-cache usage. 1 means 100 percent usage.",
         ratio(s.kv_blocks_used, s.kv_blocks_total));
  metric("llamacpp:requests_processing", "gauge", "Number of requests processing.",
         s.requests_running);
  metric("llamacpp:requests_deferred", "gauge", "Number of requests deferred.", s.requests_waiting);
}

void metrics(HttpServer& server, const httplib::Request&, httplib::Response& res) {
  if (!server.options().enable_metrics)
    throw ApiError(501, "the /metrics endpoint is disabled (start with --metrics)");
  auto m = server.model_or_throw();
  const engine::MetricsSnapshot s = m->engine->metrics().snapshot();
  std::ostringstream o;
  auto metric = [&](const char* name, const char* type, const char* help, double v) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n"
      << name << " " << v << "\n";
  };
  metric("hablar_prompt_tokens_total", "counter", "Prompt tokens received.",
         (double)s.prompt_tokens_total);
  metric("hablar_prompt_tokens_computed_total", "counter", "Prompt tokens run through the model.",
         (double)s.prompt_tokens_computed);
  metric("hablar_prompt_tokens_cached_total", "counter",
         "Prompt tokens served from the prefix cache.", (double)s.prompt_tokens_cached);
  metric("hablar_generated_tokens_total", "counter", "Tokens generated.",
         (double)s.generated_tokens_total);
  metric("hablar_prompt_seconds_total", "counter", "Step time spent on prompt tokens.",
         s.prompt_seconds_total);
  metric("hablar_decode_seconds_total", "counter", "Step time spent on generated tokens.",
         s.decode_seconds_total);
  metric("hablar_executor_host_seconds_total", "counter",
         "Step time the device executor spent on the host before the device had the step.",
         s.executor_host_seconds);
  metric("hablar_executor_wait_seconds_total", "counter",
         "Step time the device executor spent waiting for the device's results.",
         s.executor_wait_seconds);
  metric("hablar_executor_device_seconds_total", "counter",
         "Step time on the device's own clock, from each step's first command after its host "
         "staging to its last; host + wait - device is the device's idle time inside the steps.",
         s.executor_device_seconds);
  metric("hablar_executor_stage_seconds_total", "counter",
         "Of the executor's host time, the part before the device's span began (block copies, "
         "staging and uploading the step's inputs).",
         s.executor_stage_seconds);
  metric("hablar_engine_schedule_seconds_total", "counter",
         "Step time in the engine before the executor's call (drafts, scheduling).",
         s.engine_schedule_seconds);
  metric("hablar_engine_emit_seconds_total", "counter",
         "Step time in the engine once the step's output was collected (tokens emitted, "
         "stop checks).",
         s.engine_emit_seconds);
  metric(
      "hablar_prompt_tokens_per_second", "gauge", "Average prompt throughput.",
      s.prompt_seconds_total > 0 ? (double)s.prompt_tokens_computed / s.prompt_seconds_total : 0);
  metric(
      "hablar_generated_tokens_per_second", "gauge", "Average generation throughput.",
      s.decode_seconds_total > 0 ? (double)s.generated_tokens_total / s.decode_seconds_total : 0);
  metric("hablar_requests_total", "counter", "Requests accepted.", (double)s.requests_total);
  metric("hablar_requests_finished_total", "counter", "Requests finished.",
         (double)s.requests_finished);
  metric("hablar_requests_rejected_total", "counter", "Requests refused (queue full).",
         (double)s.requests_rejected);
  metric("hablar_preemptions_total", "counter", "Sequences preempted for recomputation.",
         (double)s.preemptions_total);
  metric("hablar_context_shifts_total", "counter",
         "Context shifts (--context-shift): old tokens dropped from a full context.",
         (double)s.context_shifts_total);
  metric("hablar_steps_total", "counter", "Engine steps run.", (double)s.steps_total);
  metric("hablar_steps_launched_ahead_total", "counter",
         "Engine steps launched before the step ahead of them had finished on the device "
         "(their tokens fed there); the others waited for the last step's tokens.",
         (double)s.steps_launched_ahead_total);
  metric("hablar_device_samples_refused_total", "counter",
         "Device samples a request's sampler refused (an output grammar's token that would "
         "overrun max_tokens), computed again and sampled on the host.",
         (double)s.device_samples_refused_total);
  metric("hablar_steps_voided_total", "counter",
         "Of those, refused tokens a step had already been launched on (its output for that "
         "sequence dropped).",
         (double)s.steps_voided_total);
  metric("hablar_embedding_inputs_total", "counter", "Inputs embedded.",
         (double)s.embedding_inputs_total);
  metric("hablar_embedding_steps_total", "counter", "Embedding steps run.",
         (double)s.embedding_steps_total);
  metric("hablar_requests_running", "gauge", "Sequences in the running batch.", s.requests_running);
  metric("hablar_requests_waiting", "gauge", "Sequences waiting to run.", s.requests_waiting);
  metric("hablar_kv_cache_blocks_total", "gauge", "KV cache blocks.", s.kv_blocks_total);
  metric("hablar_kv_cache_blocks_used", "gauge", "KV cache blocks held by sequences.",
         s.kv_blocks_used);
  metric("hablar_kv_cache_usage_ratio", "gauge", "Share of KV cache blocks in use.",
         s.kv_blocks_total > 0 ? (double)s.kv_blocks_used / s.kv_blocks_total : 0);
  metric("hablar_kv_cache_blocks_cached", "gauge", "Full blocks registered in the prefix cache.",
         s.kv_blocks_cached);
  metric("hablar_batch_size_max", "gauge", "Largest batch (sequences in one step) so far.",
         s.max_batch_size);
  // Speculative decoding, per drafter (one per server): drafted, accepted, their ratio.
  const std::string drafter = "{drafter=\"" + s.spec_type + "\"}";
  auto labeled = [&](const char* name, const char* type, const char* help, double v) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n"
      << name << drafter << " " << v << "\n";
  };
  labeled("hablar_spec_draft_tokens_total", "counter", "Speculative tokens drafted and verified.",
          (double)s.draft_tokens_total);
  labeled("hablar_spec_draft_accepted_total", "counter", "Drafted tokens the model accepted.",
          (double)s.draft_accepted_total);
  labeled("hablar_spec_rounds_total", "counter", "Verification rounds (drafted chunks) run.",
          (double)s.spec_rounds_total);
  labeled("hablar_spec_acceptance_ratio", "gauge", "Accepted / drafted tokens so far.",
          s.draft_tokens_total > 0 ? (double)s.draft_accepted_total / s.draft_tokens_total : 0);
  histogram_text(o, "hablar_batch_size", "Sequences per engine step.", s.batch_size);
  histogram_text(o, "hablar_time_to_first_token_seconds", "Submit to first token.", s.ttft_seconds);
  histogram_text(o, "hablar_time_per_output_token_seconds", "Time between generated tokens.",
                 s.token_latency_seconds);
  llamacpp_metrics(metric, s, *m);
  res.set_content(o.str(), "text/plain; version=0.0.4; charset=utf-8");
  res.set_header("Process-Start-Time-Unix", std::to_string(server.start_time()));
}

}  // namespace

void install_llama_routes(Router& http, HttpServer& server) {
  using Fn = void (*)(HttpServer&, const httplib::Request&, httplib::Response&);
  auto route = [&](bool is_post, const char* path, Fn fn) {
    auto h = [&server, fn](const httplib::Request& req, httplib::Response& res) {
      handle_json(req, res, [&] { fn(server, req, res); });
    };
    if (is_post)
      http.Post(path, h);
    else
      http.Get(path, h);
  };
  route(true, "/completion", completion);
  route(true, "/completions", completion);
  route(true, "/infill", infill);
  route(true, "/tokenize", tokenize);
  route(true, "/detokenize", detokenize);
  route(true, "/apply-template", apply_template);
  route(false, "/props", props);
  route(false, "/lora-adapters", lora_adapters);
  route(true, "/lora-adapters", lora_adapters);
  route(false, "/metrics", metrics);
  // Readiness: 503 while the model loads and while draining at shutdown, so that load
  // balancers send requests elsewhere. /health/ready is the same (Kubernetes' name).
  auto ready = [&server](const httplib::Request& req, httplib::Response& res) {
    handle_json(req, res, [&] {
      server.model_or_throw();
      if (server.stopping()) throw ApiError(503, "the server is shutting down");
      send_json(res, {{"status", "ok"}});
    });
  };
  http.Get("/health", ready);
  http.Get("/v1/health", ready);
  http.Get("/health/ready", ready);
  // Liveness: the process answers, whatever it is doing (loading, draining); a failed model
  // load is the one state a restart may cure.
  http.Get("/health/live", [&server](const httplib::Request& req, httplib::Response& res) {
    handle_json(req, res, [&] {
      try {
        server.model_or_throw();
      } catch (const ApiError& e) {
        if (e.status() != 503) throw;
      }
      send_json(res, {{"status", "ok"}});
    });
  });
}

}  // namespace hablar::server
