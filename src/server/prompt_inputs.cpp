// Reading llama-server's prompt forms into token ids (prompt_inputs.h).
#include "server/prompt_inputs.h"

#include "server/api_error.h"
#include "server/serving_model.h"

namespace hablar::server {
namespace {

using nlohmann::json;

// A list that is one prompt: token ids, or ids and texts mixed.
bool is_one_prompt_list(const json& list) {
  for (const auto& item : list)
    if (item.is_number()) return true;
  return false;
}

// The text of an object prompt. Images and audio are refused: no model here reads them.
std::string object_prompt_text(const json& object, const std::string& param) {
  if (auto media = object.find("multimodal_data");
      media != object.end() && !media->is_null() && !(media->is_array() && media->empty()))
    bad_request("'" + param + "' carries multimodal data, which this model cannot read", param);
  if (auto s = object.find("prompt_string"); s != object.end()) {
    if (!s->is_string()) bad_request("'" + param + "' prompt_string must be a text", param);
    return s->get<std::string>();
  }
  if (auto parts = object.find("content"); parts != object.end()) {
    if (!parts->is_array()) bad_request("'" + param + "' content must be a list of parts", param);
    std::string text;
    for (const auto& part : *parts) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
          !part["text"].is_string())
        bad_request("'" + param + "' content parts must be {\"type\": \"text\", \"text\": ...}",
                    param);
      text += part["text"].get<std::string>();
    }
    return text;
  }
  bad_request("'" + param + "' objects need prompt_string or content", param);
}

}  // namespace

std::vector<int32_t> read_one_prompt(const ServingModel& m, const json& prompt,
                                     const PromptReading& how) {
  const std::string& param = how.param;
  std::vector<int32_t> ids;
  auto add_text = [&](const std::string& text, bool first) {
    const std::vector<int32_t> t =
        first ? how.tokenize_first(text) : m.tok().encode(text, false, true);
    ids.insert(ids.end(), t.begin(), t.end());
  };
  auto add = [&](const json& part, bool first) {
    if (part.is_string()) {
      add_text(part.get<std::string>(), first);
    } else if (part.is_number_integer()) {
      const int64_t v = part.get<int64_t>();
      if (v < 0 || v >= m.tok().n_vocab())
        bad_request("'" + param + "' token id " + std::to_string(v) + " is outside the vocabulary",
                    param);
      ids.push_back((int32_t)v);
    } else if (part.is_object() && first) {
      add_text(object_prompt_text(part, param), true);
    } else {
      bad_request("'" + param +
                      "' must be text, token ids, a list mixing both, an object with "
                      "prompt_string or content, or a list of prompts",
                  param);
    }
  };
  if (prompt.is_array()) {
    bool first = true;
    for (const auto& p : prompt) {
      add(p, first);
      first = false;
    }
  } else {
    add(prompt, true);
  }
  if (ids.empty()) bad_request("'" + param + "' is empty (it gives no tokens)", param);
  return ids;
}

std::vector<std::vector<int32_t>> read_prompts(const ServingModel& m, const json& value,
                                               const PromptReading& how) {
  if (value.is_null()) bad_request("'" + how.param + "' is required", how.param);
  if (!value.is_array() || value.empty() || is_one_prompt_list(value))
    return {read_one_prompt(m, value, how)};
  if (value.size() > how.max_prompts)
    bad_request(
        "'" + how.param + "' holds more than " + std::to_string(how.max_prompts) + " prompts",
        how.param);
  std::vector<std::vector<int32_t>> prompts;
  prompts.reserve(value.size());
  for (const auto& p : value) prompts.push_back(read_one_prompt(m, p, how));
  return prompts;
}

}  // namespace hablar::server
