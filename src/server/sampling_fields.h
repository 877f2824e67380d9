// Sampling parameters from a request body, in the dialect of each API family. Values the
// request leaves out come from the server's defaults (the command line).
#pragma once

#include <nlohmann/json.hpp>

#include "engine/sampler.h"
#include "server/serving_model.h"

namespace hablar::server {

enum class Dialect { kOpenAI, kLlama, kOllama };

// Reads temperature, top_p, penalties, logit_bias, seed, ... (and for kLlama / kOllama also
// top_k, min_p, typical_p, repeat_penalty, repeat_last_n). Throws ApiError 400 naming the field.
engine::SamplingParams parse_sampling(const nlohmann::json& body, const ServingModel& m,
                                      Dialect dialect);

// The scheduling `priority` (vLLM's: lower runs first; default 0), in every dialect.
int32_t parse_priority(const nlohmann::json& body);

// llama-server's `id_slot`: the slot the request runs on (server/slot_table.h); -1 or absent:
// the server picks one. 400 unless -1 <= id_slot < the server's slots (-np).
int32_t parse_id_slot(const nlohmann::json& body, const ServingModel& m);

// Context shift fields (they matter under --context-shift only): `keep_field` ("n_keep", or
// Ollama's "num_keep": prompt tokens kept, -1 all of them) and llama-server's "n_discard"
// (tokens dropped per shift, 0: half). 400 naming the field when out of range.
void parse_context_shift(const nlohmann::json& body, const char* keep_field, GenerationSpec& spec);

// llama-server's per-request draft lengths: "speculative.n_max", "speculative.n_min",
// "speculative.p_min" (also as an object "speculative": {"n_max": ...}); fields left out
// keep the server's defaults. Unset when none is given. 400 naming the field otherwise.
std::optional<engine::DraftParams> parse_speculative(const nlohmann::json& body,
                                                     const ServingModel& m);

}  // namespace hablar::server
