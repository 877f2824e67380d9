#include "server/serving_model.h"

#include <atomic>
#include <chrono>
#include <ctime>
#include <random>

#include "core/json_depth.h"
#include "engine/request_sampler.h"
#include "engine/text_filter.h"
#include "server/api_error.h"
#include "server/event_server.h"
#include "server/reasoning_budget.h"
#include "server/structured_output.h"

namespace hablar::server {

namespace {

// Client text reaches the template with a marker byte (0xFF, which valid UTF-8 never holds,
// and request JSON is valid UTF-8) right after the first byte of every control-token text
// in it. The template moves, trims or joins strings as it likes; the markers travel with
// the text, and after rendering they say which control-token texts the client wrote. The
// bytes are removed and their positions kept, so that tokenizing skips exactly those.
// (A template that re-serializes a string with tojson turns a marker into U+FFFD: the
// text then differs by that character, and still holds no control token.)
constexpr char kClientMarker = '\xFF';

void mark_control_text(const tokenizer::Tokenizer& tok, nlohmann::ordered_json& v, int depth) {
  if (depth > 2 * (int)kMaxJsonDepth) return;  // request data is bounded long before this
  if (v.is_string()) {
    std::string& s = v.get_ref<std::string&>();
    const std::vector<size_t> starts = tok.control_token_starts(s);
    for (size_t i = starts.size(); i-- > 0;) s.insert(starts[i] + 1, 1, kClientMarker);
    return;
  }
  if (v.is_array() || v.is_object())
    for (auto& e : v) mark_control_text(tok, e, depth + 1);
}

RenderedChat take_markers(const std::string& marked) {
  RenderedChat out;
  out.text.reserve(marked.size());
  for (char c : marked) {
    if (c == kClientMarker)
      out.text_only.push_back((uint32_t)out.text.size());
    else
      out.text += c;
  }
  return out;
}

// The request's text filter with a stopwatch: it runs on the engine thread, once per token;
// the time adds up in `ns`, read when the request's final item is taken (note_final).
class TimedFilter : public engine::OutputFilter {
 public:
  TimedFilter(std::unique_ptr<engine::OutputFilter> inner, std::shared_ptr<std::atomic<int64_t>> ns)
      : inner_(std::move(inner)), ns_(std::move(ns)) {}
  Result push(int32_t token) override {
    const auto t0 = std::chrono::steady_clock::now();
    Result r = inner_->push(token);
    add(t0);
    return r;
  }
  std::string flush() override {
    const auto t0 = std::chrono::steady_clock::now();
    std::string s = inner_->flush();
    add(t0);
    return s;
  }

 private:
  void add(std::chrono::steady_clock::time_point t0) {
    ns_->fetch_add(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count());
  }
  std::unique_ptr<engine::OutputFilter> inner_;
  std::shared_ptr<std::atomic<int64_t>> ns_;
};

// Detokenize stopwatches by request id; an entry goes when its final item is read or its
// handle is gone.
struct DetokenizeClocks {
  struct Entry {
    std::weak_ptr<engine::RequestHandle> handle;
    std::shared_ptr<std::atomic<int64_t>> ns;
  };
  std::mutex mu;
  std::map<uint64_t, Entry> entries;
};
DetokenizeClocks& detokenize_clocks() {
  static DetokenizeClocks clocks;
  return clocks;
}

}  // namespace

void note_final(const engine::RequestHandle& handle, engine::StreamItem& final) {
  DetokenizeClocks& c = detokenize_clocks();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.entries.find(handle.id());
  if (it == c.entries.end()) return;
  final.detokenize_ms = (double)it->second.ns->load() / 1e6;
  c.entries.erase(it);
}

std::optional<ReasoningFormat> reasoning_format_from_name(std::string_view name) {
  if (name == "none") return ReasoningFormat::kNone;
  if (name == "deepseek" || name == "deepseek-legacy") return ReasoningFormat::kDeepSeek;
  if (name == "auto") return ReasoningFormat::kAuto;
  return std::nullopt;
}

nlohmann::ordered_json template_kwargs(const ServingModel& m, const nlohmann::json& body) {
  nlohmann::ordered_json kw = nlohmann::ordered_json::object();
  // Llama 3.1's template prints date_string, with a fixed date when it is not given: today's,
  // as llama-server gives it (strftime_now already is the current time).
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char date[32];
  std::strftime(date, sizeof date, "%d %b %Y", &local);
  kw["date_string"] = date;
  std::strftime(date, sizeof date, "%b %d %Y", &local);
  kw["datetime"] = date;  // Firefunction's "Today is ..."
  // Templates that read enable_thinking get it defined, true unless thinking is turned off,
  // as llama-server defines it for templates that can think: some test "if not
  // enable_thinking" and would otherwise close the think block of every reply.
  if (m.chat_template && m.chat_template->source().find("enable_thinking") != std::string::npos)
    kw["enable_thinking"] = true;
  kw.update(m.template_kwargs);
  if (m.reasoning_budget == 0) kw["enable_thinking"] = false;
  if (auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null()) {
    if (!it->is_object())
      bad_request("'chat_template_kwargs' must be an object of template variables",
                  "chat_template_kwargs");
    for (const auto& [k, v] : it->items()) kw[k] = nlohmann::ordered_json::parse(v.dump());
  }
  if (auto it = body.find("reasoning_effort"); it != body.end() && !it->is_null()) {
    if (!it->is_string())
      bad_request("'reasoning_effort' must be a string (none, minimal, low, medium, high)",
                  "reasoning_effort");
    kw["reasoning_effort"] = *it;  // gpt-oss style templates read it
    if (*it == "none") kw["enable_thinking"] = false;
  }
  return kw;
}

// A template that reads a variable nobody gave fails with "'name' is undefined": say which
// variable, and how a client can give it.
[[noreturn]] void template_error(const std::string& what) {
  const size_t end = what.find("' is undefined");
  if (end != std::string::npos) {
    const size_t start = what.rfind('\'', end - 1);
    if (start != std::string::npos && start < end) {
      const std::string name = what.substr(start + 1, end - start - 1);
      bad_request("the chat template needs the variable " + text_excerpt(name) +
                      ", which this request does not give; pass it in 'chat_template_kwargs' "
                      "(template error: " +
                      text_excerpt(what, 200) + ")",
                  "chat_template_kwargs");
    }
  }
  // The template's message may quote message text: keep it short.
  bad_request("the chat template could not render these messages: " + text_excerpt(what, 300),
              "messages");
}

RenderedChat render_chat(const ServingModel& m, const nlohmann::ordered_json& messages,
                         const nlohmann::ordered_json& tools, bool add_generation_prompt,
                         const nlohmann::ordered_json& kwargs) {
  chat::ChatInput input;
  const bool generic = !m.template_knows_tools && tools.is_array() && !tools.empty();
  nlohmann::ordered_json turns =
      m.template_knows_developer ? messages : chat::developer_as_system(messages);
  if (generic) turns = chat::with_generic_tool_prompt(turns, tools);
  input.messages = m.template_takes_system ? std::move(turns)
                                           : chat::fold_system_into_next_message(std::move(turns));
  input.tools = tools;
  input.add_generation_prompt = add_generation_prompt;
  input.extra = kwargs.is_object() ? kwargs : template_kwargs(m, nlohmann::json::object());
  // Templates written for apply_chat_template(functions=json.dumps(tools)) (Firefunction)
  // print `functions` as text: the request's tools, or nothing.
  if (!input.extra.contains("functions"))
    input.extra["functions"] = tools.is_array() && !tools.empty() ? tools.dump(2) : "";
  const auto& tok = m.tok();
  if (!m.special_in_content) {
    mark_control_text(tok, input.messages, 0);
    mark_control_text(tok, input.tools, 0);
    mark_control_text(tok, input.extra, 0);  // request variables are client text too
  }
  if (tok.bos_id() >= 0) input.bos_token = tok.token_piece(tok.bos_id());
  if (tok.eos_id() >= 0) input.eos_token = tok.token_piece(tok.eos_id());
  try {
    return take_markers(chat::apply_chat_template(*m.chat_template, input));
  } catch (const Error& e) {
    template_error(e.what());
  }
}

std::vector<int32_t> tokenize_prompt(const ServingModel& m, const std::string& text,
                                     std::span<const uint32_t> text_only) {
  const auto& tok = m.tok();
  // A template that writes the BOS itself must not get a second one.
  bool add_special = true;
  if (tok.bos_id() >= 0) {
    const std::string bos = tok.token_piece(tok.bos_id());
    if (!bos.empty() && text.compare(0, bos.size(), bos) == 0) add_special = false;
  }
  return tok.encode(text, add_special, /*parse_special=*/true, text_only);
}

bool supports_fim(const ServingModel& m) {
  using Role = tokenizer::Tokenizer::FimRole;
  const auto& tok = m.tok();
  return tok.fim_id(Role::kPrefix) >= 0 && tok.fim_id(Role::kSuffix) >= 0 &&
         tok.fim_id(Role::kMiddle) >= 0;
}

std::vector<int32_t> fim_prompt(const ServingModel& m, const std::string& prefix,
                                const std::string& suffix, const std::string& middle_start,
                                const std::vector<FimFile>& extra) {
  using Role = tokenizer::Tokenizer::FimRole;
  const auto& tok = m.tok();
  if (!supports_fim(m))
    throw ApiError(501,
                   "this model cannot fill in the middle: its vocabulary has no prefix, "
                   "suffix and middle tokens (<fim_prefix>, <|fim_prefix|>, <PRE>, ...)");
  std::vector<int32_t> ids;
  if (tok.add_bos() && tok.bos_id() >= 0) ids.push_back(tok.bos_id());
  // Client text is text: control-token spellings inside it stay plain (parse_special off).
  auto text = [&](const std::string& s) {
    const auto t = tok.encode(s, false, false);
    ids.insert(ids.end(), t.begin(), t.end());
  };
  const int32_t sep = tok.fim_id(Role::kSeparator);
  for (const FimFile& f : extra) {
    if (sep >= 0) ids.push_back(sep);
    text(f.name.empty() ? f.text : f.name + "\n" + f.text);
    if (sep < 0) text("\n");
  }
  ids.push_back(tok.fim_id(Role::kPrefix));
  text(prefix);
  ids.push_back(tok.fim_id(Role::kSuffix));
  text(suffix);
  ids.push_back(tok.fim_id(Role::kMiddle));
  text(middle_start);
  return ids;
}

// The engine's context shift for a request: the kept prompt tokens (llama-server's n_keep,
// which leaves BOS out of the count) and the discard count.
engine::ContextShift context_shift_of(const ServingModel& m, const GenerationSpec& spec) {
  return engine::context_shift_keeping(spec.n_keep.value_or(m.defaults.n_keep), spec.prompt,
                                       m.tok().bos_id(), spec.n_discard);
}

int32_t bounded_max_tokens(const ServingModel& m, std::optional<int64_t> requested,
                           size_t n_prompt) {
  // With context shift the context bounds nothing: without a limit, generation goes on until
  // an end-of-generation token, a stop string or the client leaving (llama-server's too).
  const int64_t room = m.defaults.context_shift
                           ? INT32_MAX
                           : std::max<int64_t>(1, (int64_t)m.n_ctx - (int64_t)n_prompt);
  int64_t want = requested ? *requested : (m.defaults.n_predict > 0 ? m.defaults.n_predict : room);
  return (int32_t)std::min(want, room);
}

void RequestRegistry::add(uint64_t id, RequestInfo info) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(infos_, [](const auto& e) { return e.second.handle.expired(); });
  infos_[id] = std::move(info);
}

std::optional<RequestInfo> RequestRegistry::find(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = infos_.find(id);
  if (it == infos_.end()) return std::nullopt;
  return it->second;
}

nlohmann::json sampling_json(const engine::SamplingParams& s) {
  return {{"temperature", s.temperature},
          {"top_k", s.top_k},
          {"top_p", s.top_p},
          {"min_p", s.min_p},
          {"typical_p", s.typical_p},
          {"repeat_penalty", s.repeat_penalty},
          {"repeat_last_n", s.repeat_last_n},
          {"presence_penalty", s.presence_penalty},
          {"frequency_penalty", s.frequency_penalty},
          {"top_n_sigma", s.top_n_sigma},
          {"xtc_probability", s.xtc_probability},
          {"xtc_threshold", s.xtc_threshold},
          {"dry_multiplier", s.dry.multiplier},
          {"dry_base", s.dry.base},
          {"dry_allowed_length", s.dry.allowed_length},
          {"dry_penalty_last_n", s.dry.penalty_last_n},
          {"mirostat", s.mirostat},
          {"mirostat_tau", s.mirostat_tau},
          {"mirostat_eta", s.mirostat_eta},
          {"seed", s.seed}};
}

namespace {

// The start of a prompt's text for /slots: whole characters, at most about 4 KiB.
std::string prompt_preview(const ServingModel& m, std::span<const int32_t> prompt) {
  constexpr size_t kMaxBytes = 4096;
  std::string text = m.tok().decode(prompt.first(std::min<size_t>(prompt.size(), kMaxBytes)),
                                    /*show_special=*/true);
  if (text.size() <= kMaxBytes) return text;
  size_t n = kMaxBytes;
  while (n > 0 && ((unsigned char)text[n] & 0xC0) == 0x80) --n;
  return text.substr(0, n) + "...";
}

// Gives a request's slot back as the request ends, with the tokens it left in the cache.
class SlotRelease : public engine::RequestEndListener {
 public:
  SlotRelease(std::shared_ptr<SlotTable> slots, int32_t slot)
      : slots_(std::move(slots)), slot_(slot) {}
  void ended(std::span<const int32_t> cached_tokens) override {
    slots_->release(slot_, cached_tokens);
  }

 private:
  std::shared_ptr<SlotTable> slots_;
  int32_t slot_;
};

}  // namespace

std::shared_ptr<engine::RequestHandle> start_generation(ServingModel& m, GenerationSpec spec) {
  if (m.model->config().embedding_only)
    bad_request(std::string("this model is ") +
                (m.model->config().encoder ? "an encoder (" : "an embedding model (") +
                m.model->config().arch +
                "): it serves embeddings (/v1/embeddings) and reranking (/v1/rerank), not "
                "text generation");
  if (spec.prompt.empty()) bad_request("the prompt is empty", "prompt");
  if ((int64_t)spec.prompt.size() >= m.n_ctx)
    throw ApiError(400,
                   "the prompt of " + std::to_string(spec.prompt.size()) +
                       " tokens exceeds the available context size of " + std::to_string(m.n_ctx) +
                       " tokens (prompt and completion together); shorten the prompt",
                   "messages", "exceed_context_size_error",
                   {{"n_prompt_tokens", spec.prompt.size()}, {"n_ctx", m.n_ctx}});
  RequestInfo info;
  info.prompt = prompt_preview(m, spec.prompt);
  info.params = sampling_json(spec.sampling);
  info.params["n_predict"] = spec.max_tokens;
  info.params["stop"] = spec.stop;
  info.start = std::chrono::steady_clock::now();
  engine::GenerateRequest req;
  if (m.defaults.context_shift) req.context_shift = context_shift_of(m, spec);
  req.prompt = std::move(spec.prompt);
  req.max_tokens = spec.max_tokens;
  req.ignore_eos = spec.ignore_eos;
  req.n_logprobs = spec.n_logprobs;
  req.n_prompt_logprobs = spec.n_prompt_logprobs;
  req.reuse_cached_prefix = spec.cache_prompt;
  req.priority = spec.priority;
  req.speculative = spec.speculative;
  spec.sampling.n_probs = 0;  // the engine reports log-probabilities itself
  try {
    if (spec.grammar) {
      auto g = std::make_unique<GrammarSampler>(
          spec.sampling, m.tok().n_vocab(),
          std::make_unique<GrammarGate>(spec.grammar, spec.grammar_trigger, spec.grammar_context,
                                        spec.max_tokens));
      if (spec.post_sampling) g->report_post_sampling(spec.post_sampling, spec.n_logprobs);
      req.sampler = std::move(g);
    } else {
      auto p = std::make_unique<engine::ParamsSampler>(spec.sampling, m.tok().n_vocab());
      if (spec.post_sampling) p->report_post_sampling(spec.post_sampling, spec.n_logprobs);
      req.sampler = std::move(p);
    }
  } catch (const Error& e) {
    bad_request(e.what());
  }
  if (spec.reasoning_budget >= 0)
    req.sampler =
        with_reasoning_budget(std::move(req.sampler), spec.reasoning_budget, spec.reasoning_started,
                              m.tok().encode(spec.reasoning_open, false, true),
                              m.tok().encode(spec.reasoning_close, false, true));
  auto detokenize_ns = std::make_shared<std::atomic<int64_t>>(0);
  req.filter = std::make_unique<TimedFilter>(
      std::make_unique<engine::TextFilter>(m.tok(), std::move(spec.stop)), detokenize_ns);
  // Its slot remembers the tokens it leaves in the cache as it ends (slot_table.h).
  std::shared_ptr<SlotTable> slots = m.slot_table();
  if (spec.id_slot >= slots->size())
    bad_request("'id_slot' must be -1 or a slot id below " + std::to_string(slots->size()),
                "id_slot");
  const int32_t slot = slots->acquire(spec.id_slot, req.prompt);
  req.on_end = std::make_shared<SlotRelease>(slots, slot);
  std::shared_ptr<engine::RequestHandle> handle;
  try {
    handle = m.engine->submit(std::move(req));
  } catch (const Error& e) {
    slots->abandon(slot);
    throw ApiError(status_for_error_kind(e.kind()), e.what());
  }
  slots->bind(slot, handle->id());
  info.slot = slot;
  {
    DetokenizeClocks& c = detokenize_clocks();
    std::lock_guard<std::mutex> lock(c.mu);
    std::erase_if(c.entries, [](const auto& e) { return e.second.handle.expired(); });
    c.entries[handle->id()] = {handle, detokenize_ns};
  }
  info.handle = handle;
  m.requests.add(handle->id(), std::move(info));
  return handle;
}

CollectedOutput collect_output(engine::RequestHandle& handle) {
  CollectedOutput out;
  std::vector<engine::StreamItem> items;
  for (;;) {
    items.clear();
    // The client may leave while its request waits or runs: cancel within a poll, so its
    // slot and KV blocks are freed at the engine's next step.
    if (client_gone()) {
      handle.cancel();
      out.final.finish_reason = engine::FinishReason::kCancelled;
      return out;
    }
    handle.wait(items, std::chrono::milliseconds(100));
    for (auto& it : items) {
      out.text += it.text;
      if (it.kind == engine::StreamItem::Kind::kFinal) {
        out.final = std::move(it);
        note_final(handle, out.final);
        return out;
      }
      if (it.kind == engine::StreamItem::Kind::kPrompt) {
        out.prompt.push_back(std::move(it));
        continue;
      }
      out.tokens.push_back(std::move(it));
    }
  }
}

nlohmann::json timings_json(const engine::StreamItem& f) {
  auto per = [](double ms, int n) { return n > 0 ? ms / n : 0.0; };
  auto rate = [](double ms, int n) { return ms > 0 ? 1e3 * n / ms : 0.0; };
  const int prompt_n = f.n_prompt - f.n_cached_prompt;
  // queue_ms, prefill_ms and detokenize_ms are hablar additions: submit to first scheduled,
  // first scheduled to first token, and the time spent turning tokens into text.
  nlohmann::json t = {{"queue_ms", f.queue_ms},
                      {"prefill_ms", std::max(0.0, f.prompt_ms - f.queue_ms)},
                      {"detokenize_ms", f.detokenize_ms},
                      {"cache_n", f.n_cached_prompt},
                      {"prompt_n", prompt_n},
                      {"prompt_ms", f.prompt_ms},
                      {"prompt_per_token_ms", per(f.prompt_ms, prompt_n)},
                      {"prompt_per_second", rate(f.prompt_ms, prompt_n)},
                      {"predicted_n", f.n_generated},
                      {"predicted_ms", f.decode_ms},
                      // the first token comes with the prompt's last step: the decode time
                      // covers the n - 1 after it
                      {"predicted_per_token_ms", per(f.decode_ms, f.n_generated - 1)},
                      {"predicted_per_second", rate(f.decode_ms, std::max(0, f.n_generated - 1))}};
  // Speculative decoding, as llama-server reports it (only when something was drafted).
  if (f.n_drafted > 0) {
    t["draft_n"] = f.n_drafted;
    t["draft_n_accepted"] = f.n_draft_accepted;
  }
  return t;
}

nlohmann::json PromptProgress::state(int32_t processed) const {
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  return {{"total", total_}, {"cache", cache_}, {"processed", processed}, {"time_ms", ms}};
}

int32_t slot_of_request(const ServingModel& m, uint64_t request_id) {
  const std::optional<RequestInfo> info = m.requests.find(request_id);
  return info ? info->slot : 0;
}

std::optional<engine::SlotInfo> slot_of(const ServingModel& m, uint64_t request_id) {
  const engine::MetricsSnapshot s = m.engine->metrics().snapshot();
  for (const engine::SlotInfo& slot : s.slots)
    if (slot.id == request_id) return slot;
  return std::nullopt;
}

// The first report comes as the prompt is scheduled, before any of it is computed:
// processed counts the tokens the prefix cache already holds (as llama-server's).
nlohmann::json PromptProgress::first_report() {
  started_ = true;
  last_ = std::min(cache_, total_ - 1);
  return state(last_);
}

std::optional<nlohmann::json> PromptProgress::poll(const ServingModel& m) {
  if (done_) return std::nullopt;
  const std::optional<engine::SlotInfo> slot = slot_of(m, id_);
  if (!slot) return std::nullopt;
  cache_ = slot->n_cached_prompt;
  if (!started_) return slot->running ? std::optional(first_report()) : std::nullopt;
  const int32_t processed = std::min(slot->n_computed, total_);
  if (processed <= last_) return std::nullopt;  // nothing new
  last_ = processed;
  done_ = processed >= total_;
  return state(processed);
}

std::optional<nlohmann::json> PromptProgress::finish(const ServingModel& m,
                                                     std::span<const engine::StreamItem> items) {
  if (done_) return std::nullopt;
  if (const auto slot = slot_of(m, id_)) {
    cache_ = slot->n_cached_prompt;  // while still listed
  } else {
    // The request ended before any poll saw it: its token and final items carry the count.
    for (const engine::StreamItem& it : items)
      if (it.kind != engine::StreamItem::Kind::kPrompt) {
        cache_ = it.n_cached_prompt;
        break;
      }
  }
  if (!started_) return first_report();
  done_ = true;
  last_ = total_;
  return state(total_);
}

std::string token_string(const ServingModel& m, int32_t token) {
  return m.tok().token_text(token, /*show_special=*/true, /*first=*/false);
}

nlohmann::json token_bytes(const std::string& s) {
  nlohmann::json bytes = nlohmann::json::array();
  for (unsigned char c : s) bytes.push_back((int)c);
  return bytes;
}

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* digits = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += digits[rng() % 16];
  return id;
}

int64_t unix_time_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace hablar::server
