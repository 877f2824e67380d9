#include "server/serving_model.h"

#include <chrono>
#include <random>

#include "engine/request_sampler.h"
#include "engine/text_filter.h"
#include "server/api_error.h"

namespace hablar::server {

std::string render_chat(const ServingModel& m, const nlohmann::ordered_json& messages,
                        const nlohmann::ordered_json& tools, bool add_generation_prompt) {
  chat::ChatInput input;
  input.messages = messages;
  input.tools = tools;
  input.add_generation_prompt = add_generation_prompt;
  const auto& tok = m.tok();
  if (tok.bos_id() >= 0) input.bos_token = tok.token_piece(tok.bos_id());
  if (tok.eos_id() >= 0) input.eos_token = tok.token_piece(tok.eos_id());
  try {
    return chat::apply_chat_template(*m.chat_template, input);
  } catch (const Error& e) {
    bad_request(std::string("the chat template could not render these messages: ") + e.what(),
                "messages");
  }
}

std::vector<int32_t> tokenize_prompt(const ServingModel& m, const std::string& text) {
  const auto& tok = m.tok();
  // A template that writes the BOS itself must not get a second one.
  bool add_special = true;
  if (tok.bos_id() >= 0) {
    const std::string bos = tok.token_piece(tok.bos_id());
    if (!bos.empty() && text.compare(0, bos.size(), bos) == 0) add_special = false;
  }
  return tok.encode(text, add_special, /*parse_special=*/true);
}

int32_t bounded_max_tokens(const ServingModel& m, std::optional<int64_t> requested,
                           size_t n_prompt) {
  const int64_t room = std::max<int64_t>(1, (int64_t)m.n_ctx - (int64_t)n_prompt);
  int64_t want = requested ? *requested : (m.defaults.n_predict > 0 ? m.defaults.n_predict : room);
  return (int32_t)std::min(want, room);
}

std::shared_ptr<engine::RequestHandle> start_generation(ServingModel& m, GenerationSpec spec) {
  if (spec.prompt.empty()) bad_request("the prompt is empty", "prompt");
  if ((int64_t)spec.prompt.size() >= m.n_ctx)
    bad_request("the prompt has " + std::to_string(spec.prompt.size()) +
                    " tokens but the context holds " + std::to_string(m.n_ctx) +
                    " tokens (prompt and completion together); shorten the prompt",
                "messages");
  engine::GenerateRequest req;
  req.prompt = std::move(spec.prompt);
  req.max_tokens = spec.max_tokens;
  req.ignore_eos = spec.ignore_eos;
  req.n_logprobs = spec.n_logprobs;
  req.n_prompt_logprobs = spec.n_prompt_logprobs;
  req.priority = spec.priority;
  spec.sampling.n_probs = 0;  // the engine reports log-probabilities itself
  try {
    req.sampler = std::make_unique<engine::ParamsSampler>(spec.sampling, m.tok().n_vocab());
  } catch (const Error& e) {
    bad_request(e.what());
  }
  req.filter = std::make_unique<engine::TextFilter>(m.tok(), std::move(spec.stop));
  try {
    return m.engine->submit(std::move(req));
  } catch (const Error& e) {
    throw ApiError(status_for_error_kind(e.kind()), e.what());
  }
}

CollectedOutput collect_output(engine::RequestHandle& handle) {
  CollectedOutput out;
  std::vector<engine::StreamItem> items;
  for (;;) {
    items.clear();
    handle.wait(items, std::chrono::milliseconds(1000));
    for (auto& it : items) {
      out.text += it.text;
      if (it.kind == engine::StreamItem::Kind::kFinal) {
        out.final = std::move(it);
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
