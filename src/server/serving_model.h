// What the routes serve once loading is done: the model, its engine and chat template, and
// the helpers every route uses to turn a request into a running generation.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "chat/chat.h"
#include "engine/engine.h"
#include "engine/executor.h"
#include "engine/request_sampler.h"
#include "engine/sampler.h"
#include "grammar/matcher.h"
#include "model/model.h"
#include "server/slot_table.h"
#include "tokenizer/tokenizer.h"

namespace hablar::server {

// Where a reply's reasoning (<think>...</think> and the like) goes (--reasoning-format, or a
// request's reasoning_format): kNone leaves it in the content as written; kDeepSeek and kAuto
// return it apart, as reasoning_content (Anthropic: thinking blocks).
enum class ReasoningFormat { kNone, kDeepSeek, kAuto };
// "none", "deepseek", "auto" (also "deepseek-legacy", read as deepseek); nullopt otherwise.
std::optional<ReasoningFormat> reasoning_format_from_name(std::string_view name);

// What /slots shows of a request beyond the engine's counts: the start of its prompt, its
// sampling parameters and when it came. An entry lives as long as its request's handle.
struct RequestInfo {
  std::weak_ptr<engine::RequestHandle> handle;
  std::string prompt;  // at most about 4 KiB of the prompt's text
  nlohmann::json params;
  std::chrono::steady_clock::time_point start;
  int32_t slot = 0;  // the slot it runs on (slot_table.h)
};
class RequestRegistry {
 public:
  void add(uint64_t id, RequestInfo info);
  std::optional<RequestInfo> find(uint64_t id) const;

 private:
  mutable std::mutex mu_;
  std::map<uint64_t, RequestInfo> infos_;
};

// The sampling parameters as llama-server names them (/props, /slots).
nlohmann::json sampling_json(const engine::SamplingParams& s);

// Sampling defaults from the command line (llama-server's --temp, --seed, -n, ...).
struct GenerationDefaults {
  engine::SamplingParams sampling;  // seed is per request: random when seed_random
  bool seed_random = true;
  int32_t n_predict = -1;  // -1: until the context is full (with context_shift: no limit)
  // --context-shift: a request that fills the context drops old tokens and goes on
  // (engine::ContextShift) instead of ending with "length".
  bool context_shift = false;
  int32_t n_keep = 0;  // --keep: prompt tokens a shift keeps (-1: all; BOS not counted)
};

struct ServingModel {
  std::unique_ptr<model::Model> model;
  std::unique_ptr<engine::StepExecutor> executor;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<chat::ChatTemplate> chat_template;
  chat::ToolFormat tool_format = chat::ToolFormat::kNone;
  // False when the template has no tool format of its own: the generic JSON format stands in
  // and render_chat describes the tools in the system message.
  bool template_knows_tools = true;
  // False when the template does not render a leading system message (Gemma 2's refuses
  // one): render_chat folds it into the next message, as llama-server does.
  bool template_takes_system = true;
  // False for templates that know no "developer" role (all but gpt-oss's): it becomes
  // "system".
  bool template_knows_developer = false;
  std::string id;                    // the name clients use (the first alias, or the file name)
  std::vector<std::string> aliases;  // --alias a,b,c: every name the model answers to
  std::vector<std::string> tags;     // --tags: labels /v1/models shows
  std::string path;                  // the GGUF file
  int32_t n_ctx = 0;                 // tokens one sequence may hold (prompt + generated)
  int32_t n_slots = 0;               // sequences running at once
  int64_t created = 0;               // unix time the model was loaded
  double load_seconds = 0;
  GenerationDefaults defaults;
  // Control-token text inside chat messages (e.g. "<|im_end|>" in a user message) becomes
  // the control token itself only when this is set (--special-in-content); by default it
  // is text, so a client cannot close its own turn or open a system one.
  bool special_in_content = false;
  ReasoningFormat reasoning_format = ReasoningFormat::kAuto;
  // --reasoning-budget: -1 unlimited; 0 turns thinking off (enable_thinking: false for the
  // template, as llama-server does); N > 0 closes the reasoning block after N tokens (a
  // request's reasoning_budget_tokens / thinking_budget_tokens overrides it).
  int32_t reasoning_budget = -1;
  // --chat-template-kwargs: variables every render gets (a request's own come on top).
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  RequestRegistry requests;  // running requests' prompts and parameters, for /slots
  // llama-server's throughput gauges (llamacpp:prompt_tokens_seconds, ...) cover the time
  // since the previous /metrics scrape: the totals that scrape saw.
  struct ScrapeWindow {
    std::mutex mu;
    double prompt_tokens = 0, prompt_seconds = 0, generated = 0, decode_seconds = 0;
  } scrape_window;
  // Embeddings (routes_embeddings.cpp): whether the embedding and rerank routes serve (an
  // encoder always; a decoder with --embedding, --pooling or a pooling_type in its file), and
  // their pooling (--pooling, else the file's, else mean for encoders and last for decoders).
  bool embeddings = false;
  Pooling pooling = Pooling::kMean;
  // --verbose: every chat reply carries "__verbose" (the prompt as the model read it, the raw
  // output), as a request's "verbose": true asks for its own.
  bool verbose_replies = false;

  const tokenizer::Tokenizer& tok() const { return model->tokenizer(); }

  // The -np slots (slot_table.h; n_slots of them, at least one), made on first use. Shared:
  // the engine's requests release their slot as they end, until the engine is gone.
  std::shared_ptr<SlotTable> slot_table() {
    std::call_once(slots_made_, [this] { slots_ = std::make_shared<SlotTable>(n_slots); });
    return slots_;
  }

 private:
  std::once_flag slots_made_;
  std::shared_ptr<SlotTable> slots_;
};

// One generation request in engine terms (no JSON).
struct GenerationSpec {
  std::vector<int32_t> prompt;
  engine::SamplingParams sampling;
  int32_t max_tokens = 16;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  int32_t n_logprobs = -1;         // -1 none, 0 chosen token, k > 0 top k
  int32_t n_prompt_logprobs = -1;  // the prompt tokens' own (same values); max_tokens may be 0
  bool cache_prompt = true;        // llama-server's cache_prompt: false computes every token
  // Output constraint (structured_output.h): each choice gets its own matcher over it.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  // With a trigger, the grammar applies only from the end of its first occurrence in the
  // turn's text (grammar_context, the start of the turn the client wrote, then the output).
  std::string grammar_trigger;
  std::string grammar_context;
  int32_t priority = 0;  // scheduling rank: lower runs first
  int32_t id_slot = -1;  // llama-server's id_slot: the slot it runs on (-1: the server picks)
  // speculative.n_max / n_min / p_min (llama-server's per-request fields); unset: the
  // server's --draft-max / --draft-min / --draft-p-min.
  std::optional<engine::DraftParams> speculative;
  // Context shift (with --context-shift only): n_keep prompt tokens kept besides BOS (-1:
  // the whole prompt; unset: --keep), n_discard dropped per shift (0: half the rest).
  std::optional<int32_t> n_keep;
  int32_t n_discard = 0;
  // post_sampling_probs: each sample's post-chain distribution (n_logprobs candidates at
  // most) goes here, one entry per generated token.
  std::shared_ptr<engine::PostSamplingLog> post_sampling;
  // Thinking budget (reasoning_budget.h): -1 none; else the reasoning tokens after which the
  // block's closing tag is forced. reasoning_started: the prompt opened the block.
  int32_t reasoning_budget = -1;
  bool reasoning_started = false;
  std::string reasoning_open = "<think>", reasoning_close = "</think>";
};

// A chat conversation after the template: its text, and the byte positions of it that came
// from the client's messages or tools and must not become control tokens (sorted; one per
// control-token text the client wrote, inside that text).
struct RenderedChat {
  std::string text;
  std::vector<uint32_t> text_only;
};
// `kwargs`: extra template variables (enable_thinking, reasoning_effort, ...); null: the
// server's defaults (--chat-template-kwargs, --reasoning-budget).
RenderedChat render_chat(const ServingModel& m, const nlohmann::ordered_json& messages,
                         const nlohmann::ordered_json& tools, bool add_generation_prompt,
                         const nlohmann::ordered_json& kwargs = nullptr);
// The template variables of a request: the server's defaults, then the request's
// chat_template_kwargs (an object) and reasoning_effort. ApiError 400 on wrong types.
nlohmann::ordered_json template_kwargs(const ServingModel& m, const nlohmann::json& body);
// A prompt's tokens; special tokens written in it are parsed except at `text_only`.
std::vector<int32_t> tokenize_prompt(const ServingModel& m, const std::string& text,
                                     std::span<const uint32_t> text_only = {});

// A fill-in-the-middle prompt for code models: <prefix> prefix <suffix> suffix <middle>
// middle_start, after the `extra` files (name, text) of the project, each opened with the
// vocabulary's file separator when it has one. ApiError 501 when the vocabulary lacks the
// prefix, suffix or middle token.
struct FimFile {
  std::string name, text;
};
std::vector<int32_t> fim_prompt(const ServingModel& m, const std::string& prefix,
                                const std::string& suffix, const std::string& middle_start,
                                const std::vector<FimFile>& extra = {});
bool supports_fim(const ServingModel& m);

// Submits to the engine: throws ApiError (400 bad input, 503 queue full / shutting down).
std::shared_ptr<engine::RequestHandle> start_generation(ServingModel& m, GenerationSpec spec);

// The engine's context shift for a request under --context-shift: n_keep prompt tokens
// (llama-server's count leaves BOS out; -1: all of them) and n_discard.
engine::ContextShift context_shift_of(const ServingModel& m, const GenerationSpec& spec);
// max_tokens as the client asked (or the default), bounded by the room the context leaves
// (not under --context-shift).
int32_t bounded_max_tokens(const ServingModel& m, std::optional<int64_t> requested,
                           size_t n_prompt);

// Everything one request produced, for non-streaming responses.
struct CollectedOutput {
  std::string text;
  std::vector<engine::StreamItem> prompt;  // kPrompt items in order (prompt log-probabilities)
  std::vector<engine::StreamItem> tokens;  // kToken items in order
  engine::StreamItem final;
};
CollectedOutput collect_output(engine::RequestHandle& handle);

// A token's text for logprobs (special tokens shown) and its UTF-8 bytes.
std::string token_string(const ServingModel& m, int32_t token);
nlohmann::json token_bytes(const std::string& s);

// llama-server's "timings" of a finished generation (prompt and predicted counts, times
// and rates; cache_n the prompt tokens taken from the prefix cache).
nlohmann::json timings_json(const engine::StreamItem& final);
// Fills in what the server measured of a request beside the engine (detokenize_ms) when its
// final item is read; every reader of final items calls it (collect_output, next_items).
void note_final(const engine::RequestHandle& handle, engine::StreamItem& final);

// The slot a request started by start_generation runs on (0 once its entry is gone).
int32_t slot_of_request(const ServingModel& m, uint64_t request_id);

// The /slots entry of a running request, if it is still listed.
std::optional<engine::SlotInfo> slot_of(const ServingModel& m, uint64_t request_id);

// Prompt processing progress for streams that ask for it (llama-server's return_progress):
// polled while the prompt is computed (chunk by chunk over engine steps), it gives
// {"total", "cache", "processed", "time_ms"} each time more of the prompt is done. finish(),
// when the first token comes, gives the completed state if it was not sent yet, so a stream
// that asked always shows the whole prompt processed before its first token.
class PromptProgress {
 public:
  PromptProgress(uint64_t request_id, int32_t n_prompt)
      : id_(request_id), total_(n_prompt), start_(std::chrono::steady_clock::now()) {}
  // The next report, when the prompt has moved since the last one.
  std::optional<nlohmann::json> poll(const ServingModel& m);
  // Once the first token is out: the reports still owed (the first one, if the prompt was
  // computed before any poll saw it, then the complete one); nullopt when none is left.
  // `items`: the stream's items that came with the first token (their cached-prompt count
  // stands in for the slot's once the request has ended and left the slot list).
  std::optional<nlohmann::json> finish(const ServingModel& m,
                                       std::span<const engine::StreamItem> items);

 private:
  nlohmann::json first_report();
  nlohmann::json state(int32_t processed) const;
  uint64_t id_;
  int32_t total_;
  std::chrono::steady_clock::time_point start_;
  int32_t last_ = 0;
  int32_t cache_ = 0;
  bool started_ = false;  // the first report (processed = cached tokens) was sent
  bool done_ = false;
};

// A random id with a prefix, e.g. "chatcmpl-3f9a...".
std::string random_id(const char* prefix);
int64_t unix_time_now();

}  // namespace hablar::server
