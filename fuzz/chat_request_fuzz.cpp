// libFuzzer target for request bodies as the routes read them, without a model: the JSON
// depth check and parse, every typed field reader on the fields the OpenAI, llama.cpp and
// Ollama routes read, the chat message checks (chat_parts: messages and tools), and the
// conversion of the checked messages into template values with a render through ChatML and
// a tool-calling template. A crash, a sanitizer report, or an exception other than the
// documented ApiError (400) / template Error is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "chat/chat.h"
#include "core/error.h"
#include "server/api_error.h"
#include "server/openai_chat.h"
#include "server/request_fields.h"

namespace {

using hablar::server::ApiError;

const char* kNumbers[] = {"temperature",      "top_p",          "min_p",
                          "typical_p",        "repeat_penalty", "presence_penalty",
                          "frequency_penalty"};
const char* kIntegers[] = {"max_tokens",
                           "max_completion_tokens",
                           "n",
                           "n_predict",
                           "top_k",
                           "seed",
                           "n_probs",
                           "logprobs",
                           "top_logprobs",
                           "repeat_last_n",
                           "num_predict"};
const char* kBools[] = {"stream",        "echo",        "logprobs",      "ignore_eos",
                        "raw",           "add_special", "parse_special", "with_pieces",
                        "return_tokens", "cache_prompt"};
const char* kStrings[] = {"model", "user", "prompt", "system", "content", "name"};

// Every reader on every field: each either returns or throws ApiError 400.
void read_fields(const nlohmann::json& body) {
  auto guarded = [](auto&& fn) {
    try {
      fn();
    } catch (const ApiError& e) {
      if (e.status() != 400 || std::string(e.what()).size() > 1024) std::abort();
    }
  };
  for (const char* k : kNumbers) guarded([&] { hablar::server::opt_number(body, k, 0, 2); });
  for (const char* k : kIntegers)
    guarded([&] { hablar::server::opt_integer(body, k, -1, 1 << 30); });
  for (const char* k : kBools) guarded([&] { hablar::server::opt_bool(body, k); });
  for (const char* k : kStrings) guarded([&] { hablar::server::opt_string(body, k); });
  guarded([&] { hablar::server::opt_string_list(body, "stop", 16); });
  if (body.contains("options") && body["options"].is_object()) {
    for (const char* k : kNumbers)
      guarded([&] { hablar::server::opt_number(body["options"], k, 0, 100); });
    for (const char* k : kIntegers)
      guarded([&] { hablar::server::opt_integer(body["options"], k, -2, 1 << 30); });
  }
}

hablar::chat::ChatTemplate* g_templates[2] = {nullptr, nullptr};

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_templates[0] = new hablar::chat::ChatTemplate(hablar::chat::chatml_template_source());
  // A template that prints tools and tool-call arguments with tojson, when the shared test
  // data is there; ChatML alone otherwise.
  const std::string qwen = read_file(std::string(HABLAR_FUZZ_TESTDATA) +
                                     "/chat-templates/Qwen-Qwen2.5-7B-Instruct.jinja");
  if (!qwen.empty()) g_templates[1] = new hablar::chat::ChatTemplate(qwen);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  nlohmann::json body;
  try {
    body = hablar::server::parse_body_object(text);
  } catch (const ApiError& e) {
    if (e.status() != 400) std::abort();
    return 0;
  }
  read_fields(body);
  hablar::server::ChatParts parts;
  try {
    parts = hablar::server::chat_parts(text);
  } catch (const ApiError& e) {
    if (e.status() != 400) std::abort();
    return 0;
  }
  for (auto* tmpl : g_templates) {
    if (!tmpl) continue;
    hablar::chat::ChatInput input;
    input.messages = parts.messages;
    input.tools = parts.tools;
    try {
      (void)hablar::chat::apply_chat_template(*tmpl, input);
    } catch (const hablar::Error&) {
      // A template may refuse a conversation (raise_exception); that is an answer.
    }
  }
  return 0;
}
