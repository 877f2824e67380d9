// Chat templates and model-output parsing: the entry point of src/chat/.
//
// A model's chat template (GGUF key `tokenizer.chat_template`) is a Jinja2 program. ChatTemplate
// parses it once with our own interpreter (src/chat/jinja_*.h) and renders it with the
// conventions of Hugging Face's apply_chat_template: trim_blocks, lstrip_blocks, loop controls,
// a sandboxed environment, tojson as json.dumps(ensure_ascii=False), and the globals
// raise_exception(msg) and strftime_now(fmt).
//
// The reverse direction turns generated text back into an OpenAI message: content, reasoning
// (<think>...</think>) and tool calls in the format of the model's family.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hablar::chat {

namespace jinja {
struct Program;  // the parsed template (jinja_ast.h)
}

// Limits that keep a hostile template from hanging or exhausting memory.
struct RenderLimits {
  std::size_t max_output_bytes = 64u << 20;      // rendered text
  std::size_t max_call_depth = 200;              // nested macro / call / filter-block calls
  std::size_t max_loop_iterations = 1'000'000;   // loop iterations + macro calls, per render
  std::size_t max_sequence_length = 10'000'000;  // range() results, string repetition, lists
};

struct RenderOptions {
  // The time strftime_now() formats (local time). Unset: the environment variable
  // HABLAR_STRFTIME_NOW (seconds since the epoch) when set, else the current time.
  std::optional<std::time_t> now;
  RenderLimits limits;
};

// A parsed Jinja2 template. Immutable after construction: render() is const and thread-safe.
class ChatTemplate {
 public:
  // Throws Error (kInvalidArgument) "template:LINE:COL: message" on syntax errors.
  explicit ChatTemplate(std::string source);
  ~ChatTemplate();
  ChatTemplate(const ChatTemplate&);
  ChatTemplate& operator=(const ChatTemplate&);
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // `context` is an object whose keys become the template's variables. Errors (undefined use,
  // raise_exception, type errors, limits) throw Error with "template:LINE:COL: message".
  std::string render(const nlohmann::json& context) const;
  std::string render(const nlohmann::json& context, const RenderOptions& options) const;
  // Keeps the keys of every object in their given order (nlohmann::json sorts them), as
  // Python dicts do: use it when the order of tool parameters must match the request's.
  std::string render(const nlohmann::ordered_json& context, const RenderOptions& options) const;

  const std::string& source() const;

 private:
  std::string source_;
  std::shared_ptr<const jinja::Program> program_;
};

// Objects keep their keys in the order given (as Python's dicts do, so that a template
// prints a tool's parameters in the order the client listed them).
struct ChatInput {
  // OpenAI shape: role, content (string or list of parts), tool_calls, tool_call_id, name.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null or an array of OpenAI function tools
  bool add_generation_prompt = true;
  std::string bos_token, eos_token;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // {"enable_thinking": false}
};

// The variables a chat template sees: messages, tools (when not null), add_generation_prompt,
// bos_token, eos_token and every key of `extra`.
nlohmann::ordered_json chat_context(const ChatInput& input);
std::string apply_chat_template(const ChatTemplate& tmpl, const ChatInput& input);
std::string apply_chat_template(const ChatTemplate& tmpl, const ChatInput& input,
                                const RenderOptions& options);

// Whether the template renders a leading system message: a probe conversation (a system
// message, then a user one) renders without error and shows the system text. Gemma 2's
// template refuses one, some drop it silently.
bool template_renders_system_role(const ChatTemplate& tmpl, const ChatInput& probe_base);
// For templates that do not render one (as llama-server does): a leading system message's
// text goes in front of the next message's, joined by a newline; alone, it is dropped.
nlohmann::ordered_json fold_system_into_next_message(nlohmann::ordered_json messages);
// OpenAI's "developer" role as "system", for templates that know no such role (all but
// gpt-oss's harmony format, which writes <|channel|>).
bool template_knows_developer_role(const ChatTemplate& tmpl);
nlohmann::ordered_json developer_as_system(nlohmann::ordered_json messages);

// ChatML (<|im_start|>role\ncontent<|im_end|>\n), used when a model has no template.
const std::string& chatml_template_source();
// The template for a model file without one: the family's own turn format where hablar has
// one built in (Gemma's for gemma*), else ChatML.
const std::string& fallback_template_source(std::string_view architecture);

// A family's chat format by llama-server's name for it (chatml, llama2, llama3, llama4,
// mistral-v1/v3/v7, phi3, phi4, zephyr, falcon3, gemma, vicuna, openchat, deepseek,
// deepseek2, deepseek3, command-r, granite) as Jinja source; null for other names.
const std::string* builtin_chat_template(std::string_view name);
std::string builtin_chat_template_names();  // comma-separated, for error messages
// --chat-template's text as llama-server reads it: a built-in name's source, or the text
// itself where it is a template (Jinja tags, or words no name has: text with spaces renders
// as itself); null for a single word that names no format (a misspelt name, refused).
std::optional<std::string> chat_template_from_flag(const std::string& text);

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text
};

struct ParsedMessage {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
};

enum class ToolFormat {
  kNone,     // plain text, no tool calls
  kHermes,   // <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Hermes, Qwen 2.5/3)
  kLlama3,   // {"name": ..., "parameters": {...}} or <|python_tag|>
  kMistral,  // [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] or [TOOL_CALLS]name[ARGS]{...}
  kFunctionaryV3_1,  // <function=name>{...}</function>
  kFunctionaryV3_2,  // >>>name\n{...}  (all\n = plain content)
  kCommandR,         // Action: ```json [{"tool_name": ..., "parameters": {...}}] ```
  kDeepSeek,  // <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name ```json
              // ...```
  kGenericJson,  // {"tool_call": {"name": ..., "arguments": ...}} / {"tool_calls": [...]}
};

// Guesses the tool-call format from a template's source (its tags and keywords).
ToolFormat detect_tool_format(std::string_view template_source);
const char* tool_format_name(ToolFormat format);

// The text that opens a tool call in `format`, naming `function` when it is not empty: an
// assistant turn started with it makes the model write a call (OpenAI's tool_choice
// "required" or a named function). Empty where the format has no single opening (kNone) or
// the prompt holds it already (kFunctionaryV3_2: the generation prompt ends with ">>>"). The
// function name is JSON-escaped where the format is JSON.
std::string tool_call_opening(ToolFormat format, std::string_view function);

// For a template with no tool format of its own (the generic JSON format stands in, as in
// llama-server): `messages` with the tools and the answer shape described in the system
// message (merged into the first one, or a new one at the front): a JSON object
// {"tool_call": {"name": ..., "arguments": {...}}} to call a tool, {"response": "..."} to
// answer.
nlohmann::ordered_json with_generic_tool_prompt(const nlohmann::ordered_json& messages,
                                                const nlohmann::ordered_json& tools);

// True when a rendered prompt ends inside an open reasoning block ("<think>\n" and the like, as
// Qwen3 and DeepSeek-R1 templates emit): the model's output then starts with reasoning.
bool prompt_opens_reasoning(std::string_view prompt);

// Splits a whole generated message into reasoning, content and tool calls. Content and
// reasoning are trimmed of surrounding white space. `reasoning_started`: the output begins inside
// a reasoning block (see prompt_opens_reasoning). A tool-call block that does not parse stays in
// the content as text. Tool calls carry the id the model wrote, or none.
ParsedMessage parse_model_output(std::string_view text, ToolFormat format,
                                 bool extract_reasoning = true, bool reasoning_started = false);

// Incremental form of parse_model_output: feed each token's text as it arrives. push() returns
// only what became certain (content and reasoning deltas, completed tool calls); text that may
// be the start of a tag is held back until it is decided. The concatenation of all deltas plus
// finish() equals parse_model_output() of the whole text.
class StreamingOutputParser {
 public:
  explicit StreamingOutputParser(ToolFormat format, bool extract_reasoning = true,
                                 bool reasoning_started = false);
  ParsedMessage push(std::string_view text_delta);
  ParsedMessage finish();

 private:
  ParsedMessage drain(bool final);

  ToolFormat format_;
  bool extract_reasoning_;
  bool reasoning_started_;
  std::string text_;                 // everything received so far
  std::size_t content_emitted_ = 0;  // bytes of parsed content already returned
  std::size_t reasoning_emitted_ = 0;
  std::size_t tool_calls_emitted_ = 0;
};

}  // namespace hablar::chat
