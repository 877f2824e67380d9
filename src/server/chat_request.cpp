#include "server/chat_request.h"

#include "server/api_error.h"
#include "server/event_server.h"
#include "server/reasoning_budget.h"
#include "server/request_fields.h"
#include "server/sampling_fields.h"
#include "server/structured_output.h"

namespace hablar::server {

namespace {

using nlohmann::json;

// Prompts longer than this (two cache blocks of 16) are computed once for all n choices.
constexpr int64_t kSharedPromptTokens = 32;

// The function a request's tool_choice requires: nullopt when none is required, "" for
// "required" (any), else the named function.
std::optional<std::string> required_tool(const json& body) {
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return *it == "required" ? std::optional<std::string>("") : std::nullopt;
  const json& name = it->at("function").at("name");  // present: select_tools checked
  if (!name.is_string()) bad_request("'tool_choice.function.name' must be a string", "tool_choice");
  return name.get<std::string>();
}

// tool_choice "required" or a named function: the assistant turn starts with the format's
// call opening, so that the model writes a call (unless the client began the turn itself).
void start_required_tool_call(const json& body, const ServingModel& m, ChatRequest& r) {
  if (r.tools.is_null() || r.messages.back()["role"] == "assistant") return;
  const auto function = required_tool(body);
  if (!function) return;
  const std::string opening = chat::tool_call_opening(m.tool_format, *function);
  // Functionary v3.2's prompt opens the call itself: the grammar alone starts it.
  const bool in_prompt = m.tool_format == chat::ToolFormat::kFunctionaryV3_2;
  if (opening.empty() && !in_prompt)
    bad_request(std::string("'tool_choice' cannot require a call: this model's chat template has "
                            "no tool-call format that can be started (") +
                    chat::tool_format_name(m.tool_format) + ")",
                "tool_choice");
  if (!opening.empty()) r.messages.push_back({{"role", "assistant"}, {"content", opening}});
  const bool parallel = opt_bool(body, "parallel_tool_calls").value_or(false);
  r.spec.grammar = tool_call_grammar(m, m.tool_format, r.tools, *function, parallel);
  r.forced_call = r.spec.grammar != nullptr;
}

// tool_choice "auto": a call the model opens on its own is written under the tools' grammar
// from its opening on (the client's own start of the turn counts as text before it).
void constrain_auto_call(const json& body, const ServingModel& m, ChatRequest& r) {
  std::string trigger = auto_call_trigger(m.tool_format);
  if (trigger.empty()) return;
  try {
    r.spec.grammar = tool_call_grammar(m, m.tool_format, r.tools, "",
                                       opt_bool(body, "parallel_tool_calls").value_or(false));
  } catch (const ApiError&) {
    return;  // parameters that cannot be enforced: an auto call stays unconstrained
  }
  if (!r.spec.grammar) return;
  r.spec.grammar_trigger = std::move(trigger);
  const auto& last = r.messages.back();
  if (last["role"] == "assistant" && last["content"].is_string())
    r.spec.grammar_context = last["content"].get<std::string>();
}

// A call the model opened on its own and max_tokens cut: its text is not content. `head` is
// the turn's text before `content` (the client's start of the turn, when content follows it).
void drop_cut_call(std::string& content, const std::string& trigger, engine::FinishReason reason,
                   const std::string& head = "") {
  if (reason != engine::FinishReason::kLength || trigger.empty()) return;
  const size_t at = (head + content).find(trigger);
  if (at == std::string::npos) return;
  content.resize(at > head.size() ? at - head.size() : 0);
}

// Whether the last message is a prefix the model continues (no generation prompt): a final
// assistant message is one unless the request says otherwise (vLLM's and transformers'
// continue_final_message, with add_generation_prompt its opposite). Only one trailing
// assistant message can be the prefix.
bool continues_final_message(const json& body, const OrderedJson& messages) {
  const auto add_generation = opt_bool(body, "add_generation_prompt");
  const auto continue_final = opt_bool(body, "continue_final_message");
  if (add_generation.value_or(false) && continue_final.value_or(false))
    bad_request("'add_generation_prompt' and 'continue_final_message' cannot both be true",
                "continue_final_message");
  const bool last_is_assistant = messages.back()["role"] == "assistant";
  if (continue_final.value_or(false) && !last_is_assistant)
    bad_request("'continue_final_message' needs a final assistant message to continue",
                "continue_final_message");
  const bool prefill =
      continue_final.value_or(last_is_assistant && !add_generation.value_or(false));
  if (prefill && messages.size() >= 2 && messages[messages.size() - 2]["role"] == "assistant")
    bad_request(
        "the messages end in two assistant messages: only one final assistant message can be "
        "continued",
        "messages");
  return prefill;
}

}  // namespace

ChatRequest parse_chat_request(const json& body, const std::string& body_text, ServingModel& m) {
  ChatRequest r;
  ChatParts chat = chat_parts(body_text);
  r.messages = std::move(chat.messages);
  r.tools = std::move(chat.tools);
  r.stream = opt_bool(body, "stream").value_or(false);
  if (body.contains("stream_options") && body["stream_options"].is_object())
    r.include_usage = opt_bool(body["stream_options"], "include_usage").value_or(false);
  r.n = (int)opt_integer(body, "n", 1, kMaxChoices).value_or(1);
  r.return_progress = opt_bool(body, "return_progress").value_or(false);
  r.timings_per_token = opt_bool(body, "timings_per_token").value_or(false);
  opt_string(body, "user");
  opt_string(body, "model");
  r.logprobs = opt_bool(body, "logprobs").value_or(false);
  auto top = opt_integer(body, "top_logprobs", 0, 20);
  if (top && !r.logprobs) bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  r.spec.n_logprobs = r.logprobs ? (int32_t)top.value_or(0) : -1;
  r.spec.stop = opt_string_list(body, "stop", 16);
  r.spec.sampling = parse_sampling(body, m, Dialect::kOpenAI);
  r.spec.priority = parse_priority(body);
  r.spec.id_slot = parse_id_slot(body, m);
  parse_context_shift(body, "n_keep", r.spec);
  r.spec.ignore_eos = opt_bool(body, "ignore_eos").value_or(false);  // llama-server's extension
  r.spec.speculative = parse_speculative(body, m);
  auto max_tokens = opt_integer(body, "max_completion_tokens", 1, INT32_MAX);
  if (!max_tokens) max_tokens = opt_integer(body, "max_tokens", 1, INT32_MAX);
  const OrderedJson kwargs = template_kwargs(m, body);
  ReasoningFormat format = m.reasoning_format;
  if (auto f = opt_string(body, "reasoning_format")) {
    const auto parsed = reasoning_format_from_name(*f);
    if (!parsed)
      bad_request(
          "'reasoning_format' must be none, deepseek or auto (got " + text_excerpt(*f) + ")",
          "reasoning_format");
    format = *parsed;
  }
  r.extract_reasoning = format != ReasoningFormat::kNone;
  start_required_tool_call(body, m, r);
  if (GrammarPtr g = openai_output_grammar(m, body_text)) {
    if (r.spec.grammar)
      bad_request("an output format cannot be combined with a required tool call", "tool_choice");
    r.spec.grammar = std::move(g);
  }
  if (!r.spec.grammar && !r.tools.is_null()) constrain_auto_call(body, m, r);

  const bool continue_last = continues_final_message(body, r.messages);
  if (continue_last) r.prefill = r.messages.back()["content"].get<std::string>();
  const bool add_generation =
      !continue_last && opt_bool(body, "add_generation_prompt").value_or(true);
  RenderedChat chat_text = render_chat(m, r.messages, r.tools, add_generation, kwargs);
  std::string& text = chat_text.text;
  // A template that opens the think block itself (DeepSeek-R1, QwQ, Qwen3 with thinking on):
  // the output begins inside it, without an opening tag of its own.
  r.reasoning_started = r.extract_reasoning && !continue_last && chat::prompt_opens_reasoning(text);
  // A thinking budget: llama-server's reasoning_budget_tokens / thinking_budget_tokens
  // (Anthropic's thinking.budget_tokens arrives as the latter); -1 none; by default
  // --reasoning-budget's.
  auto budget = opt_integer(body, "reasoning_budget_tokens", -1, INT32_MAX);
  if (!budget) budget = opt_integer(body, "thinking_budget_tokens", -1, INT32_MAX);
  r.spec.reasoning_budget = budget ? (int32_t)*budget : m.reasoning_budget;
  r.spec.reasoning_started = !continue_last && chat::prompt_opens_reasoning(text);
  if (r.spec.reasoning_budget >= 0) {
    ReasoningTags tags = reasoning_tags(text);
    r.spec.reasoning_open = std::move(tags.open);
    r.spec.reasoning_close = std::move(tags.close);
  }
  r.parse_output = !r.tools.is_null() || (r.extract_reasoning &&
                                          (needs_output_parser(m, r.tools) || r.reasoning_started));
  if (continue_last && !r.prefill.empty()) {
    // The template closes the assistant turn; cut what follows its content.
    const size_t at = text.rfind(r.prefill);
    if (at != std::string::npos) text.resize(at + r.prefill.size());
  }
  r.spec.prompt = tokenize_prompt(m, text, chat_text.text_only);
  r.spec.max_tokens = bounded_max_tokens(m, max_tokens, r.spec.prompt.size());
  return r;
}

ChatMessageOut final_chat_message(const ServingModel& m, const ChatRequest& r,
                                  const CollectedOutput& out) {
  ChatMessageOut o;
  if (!r.parse_output) {
    o.message.content = out.text;
    return o;
  }
  chat::ParsedMessage& p = o.message;
  p = chat::parse_model_output(r.prefill + out.text,
                               r.tools.is_null() ? chat::ToolFormat::kNone : m.tool_format,
                               r.extract_reasoning, r.reasoning_started);
  if (!r.prefill.empty() && p.content.compare(0, r.prefill.size(), r.prefill) == 0)
    p.content.erase(0, r.prefill.size());
  const engine::FinishReason reason = out.final.finish_reason;
  if (p.tool_calls.empty()) drop_cut_call(p.content, r.spec.grammar_trigger, reason, r.prefill);
  o.null_content = p.content.empty() && !p.tool_calls.empty();
  // A required call cut by max_tokens is not content.
  if (r.forced_call && p.tool_calls.empty() && reason == engine::FinishReason::kLength) {
    p.content.clear();
    o.null_content = true;
  }
  return o;
}

ChatOutputStream::ChatOutputStream(const ServingModel& m, const ChatRequest& r)
    : grammar_trigger_(r.spec.grammar_trigger), forced_call_(r.forced_call) {
  if (!r.parse_output) return;
  parser_ = std::make_unique<chat::StreamingOutputParser>(
      r.tools.is_null() ? chat::ToolFormat::kNone : m.tool_format, r.extract_reasoning,
      r.reasoning_started);
  if (!r.prefill.empty()) parser_->push(r.prefill);  // context only; not re-sent
}

chat::ParsedMessage ChatOutputStream::next(const engine::StreamItem& it) {
  const bool last = it.kind == engine::StreamItem::Kind::kFinal;
  chat::ParsedMessage p;
  if (!parser_) {
    p.content = it.text;
    return p;
  }
  p = parser_->push(it.text);
  if (last) {
    chat::ParsedMessage rest = parser_->finish();
    p.content += rest.content;
    p.reasoning += rest.reasoning;
    for (auto& c : rest.tool_calls) p.tool_calls.push_back(std::move(c));
    if (p.tool_calls.empty()) drop_cut_call(p.content, grammar_trigger_, it.finish_reason);
  }
  if (!forced_call_) return p;
  // A required call's text stays back until the end: a call cut by max_tokens ("length")
  // never shows up as content.
  held_ += p.content;
  p.content.clear();
  if (!last) return p;
  if (it.finish_reason != engine::FinishReason::kLength) p.content = std::move(held_);
  held_.clear();
  return p;
}

// Starts one generation per choice: copies of spec, choice j drawing with seed + j. When the
// prompt fills whole cache blocks, the others start once the first has its prompt computed
// (its first item is there), so that they take those blocks from the prefix cache instead of
// computing the prompt again. If one cannot start, those already started are cancelled and
// the error propagates.
std::vector<std::shared_ptr<engine::RequestHandle>> start_choices(ServingModel& m,
                                                                  const GenerationSpec& spec,
                                                                  int n) {
  std::vector<std::shared_ptr<engine::RequestHandle>> handles;
  const bool share_prompt =
      n > 1 && spec.n_prompt_logprobs < 0 && (int64_t)spec.prompt.size() > kSharedPromptTokens;
  try {
    for (int j = 0; j < n; ++j) {
      GenerationSpec copy = spec;
      copy.sampling.seed = spec.sampling.seed + (uint64_t)j;
      handles.push_back(start_generation(m, std::move(copy)));
      if (j == 0 && share_prompt) {
        while (!handles[0]->wait_ready(std::chrono::milliseconds(100)))
          if (client_gone()) throw ApiError(499, "the client closed the connection");
      }
    }
  } catch (...) {
    for (auto& h : handles) h->cancel();
    throw;
  }
  return handles;
}

json arguments_object(const std::string& arguments) {
  json args = json::parse(arguments.empty() ? "{}" : arguments, nullptr, false);
  return args.is_object() ? args : json::object();
}

}  // namespace hablar::server
