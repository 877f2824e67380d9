// Prompts as llama-server's routes read them (/completion, /infill, /embeddings,
// /v1/embeddings): one prompt is a text, a list of token ids, a list mixing texts and ids, or
// an object — {"prompt_string": text, "multimodal_data": [...]} or {"content": [{"type":
// "text", "text": ...}, ...]} (the parts' texts joined as they are). A list of any other
// kind is a list of prompts, each of those forms.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hablar::server {

struct ServingModel;

struct PromptReading {
  std::string param;  // the request field, named in errors ("prompt", "input", "content")
  // Tokenizes a prompt's text that comes first (BOS and special tokens as the route wants).
  std::function<std::vector<int32_t>(const std::string&)> tokenize_first;
  size_t max_prompts = 64;  // a longer list of prompts is refused
  // An empty text is a prompt of the tokens its tokenization adds (BOS, BERT's [CLS] [SEP]).
};

// One prompt's token ids; never empty (an empty prompt is a 400).
std::vector<int32_t> read_one_prompt(const ServingModel& m, const nlohmann::json& prompt,
                                     const PromptReading& how);
// The prompts of the field's value: one, or a list of them.
std::vector<std::vector<int32_t>> read_prompts(const ServingModel& m, const nlohmann::json& value,
                                               const PromptReading& how);

}  // namespace hablar::server
