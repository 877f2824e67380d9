// A chat request in engine terms, shared by every API that chats: OpenAI's chat completions,
// Anthropic's Messages and OpenAI's Responses. The other two translate their bodies into
// OpenAI's chat shape and come through parse_chat_request, so tools, tool_choice, prefills,
// output grammars and reasoning behave the same on every route; only the JSON around the
// generated message differs.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "chat/chat.h"
#include "server/openai_chat.h"
#include "server/serving_model.h"

namespace hablar::server {

struct ChatRequest {
  OrderedJson messages;  // in the client's key order (templates print them so)
  OrderedJson tools;
  int n = 1;  // choices, each its own sequence (with a seed, choice j draws with seed + j)
  bool stream = false;
  bool include_usage = false;
  bool return_progress = false;    // stream prompt_progress chunks while the prompt is computed
  bool timings_per_token = false;  // every streamed chunk carries the timings so far
  bool logprobs = false;
  bool parse_output = false;
  bool extract_reasoning = true;   // reasoning goes apart (not --reasoning-format none)
  bool reasoning_started = false;  // the prompt opened a think block: the output starts in it
  bool forced_call = false;        // the turn is a required tool call, written under its grammar
  std::string prefill;             // a final assistant message the model continues
  GenerationSpec spec;
};

// Most choices one request may ask for ('n', times the prompts of a completions request).
constexpr int64_t kMaxChoices = 64;

// Reads an OpenAI chat completions body (`body_text` is the same body as text, read again
// for the client's key order). Throws ApiError 400 naming the field.
ChatRequest parse_chat_request(const nlohmann::json& body, const std::string& body_text,
                               ServingModel& m);

// One finished choice's message as the client should see it.
struct ChatMessageOut {
  chat::ParsedMessage message;  // content without the prefill, reasoning, tool calls
  bool null_content = false;    // OpenAI's "content": null (a call and no text, a cut call)
};
ChatMessageOut final_chat_message(const ServingModel& m, const ChatRequest& r,
                                  const CollectedOutput& out);

// The incremental form of final_chat_message for one streamed choice: feed each item, send
// what comes back. The concatenated pieces equal final_chat_message's message.
class ChatOutputStream {
 public:
  ChatOutputStream(const ServingModel& m, const ChatRequest& r);
  chat::ParsedMessage next(const engine::StreamItem& item);

 private:
  std::unique_ptr<chat::StreamingOutputParser> parser_;
  std::string grammar_trigger_;
  bool forced_call_ = false;
  std::string held_;  // text of a required call: shown only if the call did not come out
};

// Starts one generation per choice (choice j drawing with seed + j); see the .cpp.
std::vector<std::shared_ptr<engine::RequestHandle>> start_choices(ServingModel& m,
                                                                  const GenerationSpec& spec,
                                                                  int n);

// Tool-call arguments (JSON text from the model) as a JSON value: an object when they parse
// as one, else {} (a cut call); Anthropic and Ollama send arguments as objects.
nlohmann::json arguments_object(const std::string& arguments);

}  // namespace hablar::server
