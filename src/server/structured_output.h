// Structured output: the grammar a request's output must follow, from the fields of each API
// family. The grammar is applied while sampling (SamplerAdapter masks the logits), so the
// output follows it token by token; a grammar that reaches its end allows only the
// end-of-generation tokens, which stops the sequence with finish_reason "stop".
//
//   OpenAI   response_format {"type": "json_object" | "json_schema" | "text"}; the vLLM-style
//            guided_json / guided_regex / guided_choice / guided_grammar; llama-server's
//            grammar / json_schema. At most one of these per request.
//   tools    tool_choice "required" or a named function: the call (after the opening the
//            server writes into the turn) must name a declared function with arguments that
//            match its parameters schema, in the model's tool-call format.
//   llama    /completion grammar (GBNF) / json_schema.
//   Ollama   format "json" or a JSON Schema.
// Anything that cannot be enforced is an ApiError 400 naming the field.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <span>
#include <string>

#include "chat/chat.h"
#include "engine/request_sampler.h"
#include "grammar/matcher.h"
#include "server/serving_model.h"

namespace hablar::server {

using GrammarPtr = std::shared_ptr<const grammar::CompiledGrammar>;

// The model's vocabulary as the grammar layer sees it (built once per model).
std::shared_ptr<const grammar::Vocab> grammar_vocab(const ServingModel& m);

// GBNF text -> a compiled grammar for this model; errors are 400s naming `field`.
GrammarPtr compile_for_model(const ServingModel& m, const std::string& gbnf, const char* field,
                             grammar::GbnfSource source = grammar::GbnfSource::kUser);

// The output grammar of an OpenAI chat or completions request (null: none asked).
GrammarPtr openai_output_grammar(const ServingModel& m, const std::string& body_text);
// llama.cpp /completion: "grammar" or "json_schema".
GrammarPtr llama_output_grammar(const ServingModel& m, const std::string& body_text);
// Ollama: "format".
GrammarPtr ollama_output_grammar(const ServingModel& m, const std::string& body_text);

// A tool call the request requires (tool_choice "required": function == ""; named: its
// name), written in `format` after the opening chat::tool_call_opening gives (Hermes, Llama
// 3, Mistral, Functionary v3.1 and v3.2, Command-R, DeepSeek R1 / V3.1, generic JSON). With
// `parallel` and no named function, up to 8 calls follow one another where the format can
// hold several. Null when the format has no constrained form (the call is then left to the
// model).
GrammarPtr tool_call_grammar(const ServingModel& m, chat::ToolFormat format,
                             const nlohmann::ordered_json& tools, const std::string& function,
                             bool parallel = false);

// The text that opens a call the model writes on its own in `format` (tool_choice "auto"),
// after which tool_call_grammar(..., "") applies; "" where that is not supported.
std::string auto_call_trigger(chat::ToolFormat format);

// A grammar applied while sampling one sequence: feeds the matcher the tokens generated
// since the last step, then sets refused tokens' logits to -infinity. With a trigger, it
// waits (no constraint) until the trigger text has appeared in context + output, then
// starts the grammar right after it (a tool call the model opens on its own). A grammar
// left with no token (a dead end) lets only the end-of-generation tokens through.
//
// The token budget (max_tokens > 0): a sample after which the grammar could no longer be
// completed within the tokens left is taken again from the tokens that keep it completable,
// so that an output cut by max_tokens still ends as a whole sentence of the grammar (a JSON
// document that parses rather than one cut mid-value). Distances are in bytes, an upper
// bound on tokens (every byte has a token of its own in byte-level and byte-fallback
// vocabularies). Where even the shortest completion is longer than the tokens left, each
// token must bring the end closer. Far from the budget nothing changes.
class GrammarGate {
 public:
  GrammarGate(GrammarPtr grammar, std::string trigger, std::string context, int32_t max_tokens = 0);
  void constrain(std::span<float> logits, std::span<const int32_t> history);
  // The same in two halves, for a device that applies the mask itself: advance() takes the
  // tokens generated since the last step and says whether a mask applies now (false while
  // waiting for the trigger, or when the grammar was left off); fill_allowed() then writes
  // it as bits (words zeroed, n_vocab bits): what constrain() would leave finite.
  // A history that ends in engine::kPendingToken (a step launched before the last sample
  // reached the host) is taken up to it, and a mask applies (all bits while nothing
  // constrains); resolve_pending() then gives that token before fill_allowed().
  bool advance(std::span<const int32_t> history);
  void fill_allowed(std::span<uint32_t> words);
  // The pending token: whether it stands (fits the budget, as keeps_device_sample() would
  // judge it); if so, the grammar takes it. The verdict is kept for verdict_ahead(). True
  // when no token is pending.
  bool resolve_pending(int32_t token);
  // The verdict resolve_pending() gave `token` after a history of `n_history` tokens, once.
  std::optional<bool> verdict_ahead(int32_t token, size_t n_history);
  // For a device that samples under fill_allowed()'s mask: near the budget (a slack of less
  // than kBudgetWatch tokens), clears the tokens after which the grammar could no longer
  // finish in time (unless none would be left), so that no device sample is refused; far
  // from it, or where no allowed token could overrun it, nothing is walked.
  void restrict_to_budget(std::span<uint32_t> words);
  static constexpr int32_t kBudgetWatch = 32;
  // The most bytes the grammar may still need after the next token (-1: no limit): the
  // tokens left after it less one for the end of generation, or, when the end is already
  // farther than that, one byte closer.
  int32_t distance_limit(std::span<const int32_t> history);
  // Whether the grammar needs at most `limit` bytes after `token`.
  bool fits(int32_t token, int32_t limit);
  // Whether the token budget is within `margin` tokens of the shortest completion, where a
  // sample is likely to be refused for it (a device then samples on the host instead).
  bool near_budget(std::span<const int32_t> history, int32_t margin);
  // The constrained logits limited to tokens that fit (unchanged when none does).
  void restrict_to_distance(std::span<float> logits, int32_t limit);

 private:
  // Tokens left with the next one, and the fewest bytes that finish the grammar now; none
  // without a budget, a matcher, or a finite completion.
  struct Budget {
    int32_t left, now;
  };
  std::optional<Budget> budget(size_t n_history);
  int32_t distance_limit_at(size_t n_history);
  void feed(int32_t token);

  GrammarPtr grammar_;
  std::string trigger_;
  std::string text_;  // context + output until the trigger shows up
  std::unique_ptr<grammar::GrammarMatcher> matcher_;
  bool off_ = false;     // the trigger came with text the grammar refuses: left unconstrained
  bool failed_ = false;  // the grammar threw (too ambiguous): only the end of generation
  std::optional<size_t> start_;  // history length at the first step (the prompt)
  size_t seen_ = 0;
  bool pending_ = false;  // the history advance() took ended in a token not yet known
  struct Verdict {
    size_t n_history;
    int32_t token;
    bool stands;
  };
  std::optional<Verdict> ahead_;  // resolve_pending()'s last, until verdict_ahead() takes it
  int32_t max_tokens_ = 0;
  std::vector<uint32_t> mask_;  // constrain()'s token bits
};

// A request with an output grammar: the gate masks the logits, then the request's own
// ParamsSampler samples. On an executor that samples on its device, the device gets the
// sampler's parameters and the gate's mask (computed when the executor asks, while the
// forward runs), near the budget limited to the tokens that keep the grammar finishable in
// time (GrammarGate::restrict_to_budget: the host's restriction, applied before the draw);
// a device sample that would still leave it unfinishable is refused (keeps_device_sample)
// and that position sampled again on the host. Within `host_margin` tokens of the budget the
// host samples from the start (0, the default: never).
class GrammarSampler : public engine::NextTokenSampler, public engine::TokenMaskSource {
 public:
  static constexpr int32_t kDefaultHostMargin = 0;
  GrammarSampler(engine::SamplingParams params, int32_t n_vocab, std::unique_ptr<GrammarGate> gate,
                 int32_t host_margin = kDefaultHostMargin)
      : inner_(std::move(params), n_vocab), gate_(std::move(gate)), host_margin_(host_margin) {}
  // The gate masks; a sample that would leave the grammar unfinishable within max_tokens is
  // drawn again from the constrained logits limited to tokens that fit (GrammarGate).
  int32_t sample(std::span<float> logits, std::span<const int32_t> history) override;
  bool device_params(std::span<const int32_t> history, engine::DeviceSampling& out) override;
  bool keeps_device_sample(int32_t token, std::span<const int32_t> history) override;
  bool samples_ahead() const override { return inner_.samples_ahead(); }
  void fill_allowed(std::span<uint32_t> words, int32_t pending) override;
  void report_post_sampling(std::shared_ptr<engine::PostSamplingLog> log, int n) {
    inner_.report_post_sampling(std::move(log), n);
  }

 private:
  engine::ParamsSampler inner_;
  std::unique_ptr<GrammarGate> gate_;
  int32_t host_margin_;
  std::vector<float> constrained_;
};

// Ollama's message.tool_calls: [{"function": {"name", "arguments": {...}}}] (arguments as an
// object, as Ollama returns them).
nlohmann::json ollama_tool_calls(const std::vector<chat::ToolCall>& calls);

}  // namespace hablar::server
