#include "server/sampling_fields.h"

#include "server/dry_breakers.h"

#include <random>
#include <string>

#include "server/api_error.h"
#include "server/request_fields.h"

namespace hablar::server {

namespace {

void add_bias(engine::SamplingParams& p, int64_t token, double bias, int32_t n_vocab) {
  if (token < 0 || token >= n_vocab)
    bad_request("'logit_bias' names token " + std::to_string(token) +
                    ", outside the vocabulary [0, " + std::to_string(n_vocab) + ")",
                "logit_bias");
  p.logit_bias.emplace_back((int32_t)token, (float)bias);
}

// A key that is a decimal token id gives that id; any other text (llama-server's form,
// {"Hello": -1} or [["Hello", false]]) biases every token of that text.
std::vector<int64_t> bias_tokens(const std::string& key, const ServingModel& m) {
  try {
    size_t used = 0;
    const int64_t id = std::stoll(key, &used);
    if (used == key.size()) return {id};
  } catch (const std::exception&) {
  }
  if (key.empty()) bad_request("'logit_bias' keys must be token ids or text", "logit_bias");
  const auto ids = m.tok().encode(key, false, false);
  return {ids.begin(), ids.end()};
}

// OpenAI: {"50256": -100}. llama.cpp also: [[15043, 1.0], [15043, false]] (false bans), and
// text in place of ids in both forms.
void parse_logit_bias(const nlohmann::json& body, engine::SamplingParams& p, const ServingModel& m,
                      double limit) {
  const int32_t n_vocab = m.tok().n_vocab();
  auto it = body.find("logit_bias");
  if (it == body.end() || it->is_null()) return;
  auto bias_value = [&](const nlohmann::json& value) {
    if (value.is_boolean())
      return value.get<bool>() ? 0.0 : -std::numeric_limits<double>::infinity();
    if (!value.is_number() || value.get<double>() < -limit || value.get<double>() > limit)
      bad_request("'logit_bias' values must be numbers between " + std::to_string((int64_t)-limit) +
                      " and " + std::to_string((int64_t)limit) + ", or false to ban a token",
                  "logit_bias");
    return value.get<double>();
  };
  if (it->is_object()) {
    for (auto& [key, value] : it->items()) {
      const double bias = bias_value(value);
      for (int64_t token : bias_tokens(key, m)) add_bias(p, token, bias, n_vocab);
    }
    return;
  }
  if (it->is_array()) {
    for (const auto& pair : *it) {
      if (!pair.is_array() || pair.size() != 2 ||
          !(pair[0].is_number_integer() || pair[0].is_string()))
        bad_request("'logit_bias' entries must be [token id or text, bias] pairs", "logit_bias");
      const double bias = bias_value(pair[1]);
      if (pair[0].is_number_integer())
        add_bias(p, pair[0].get<int64_t>(), bias, n_vocab);
      else
        for (int64_t token : bias_tokens(pair[0].get<std::string>(), m))
          add_bias(p, token, bias, n_vocab);
    }
    return;
  }
  bad_request("'logit_bias' must be an object of token id -> bias, or [token, bias] pairs",
              "logit_bias");
}

uint64_t random_seed() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

// llama-server's DRY fields. The breakers (default: newline, ':', '"', '*') are resolved
// against the vocabulary only when DRY is on.
void parse_dry(const nlohmann::json& body, engine::DryParams& d, const ServingModel& m) {
  if (auto v = opt_number(body, "dry_multiplier", 0, 1e6)) d.multiplier = (float)*v;
  if (auto v = opt_number(body, "dry_base", 0, 1e6))
    if (*v >= 1) d.base = (float)*v;  // below 1: the default stays, as in llama-server
  if (auto v = opt_integer(body, "dry_allowed_length", 0, INT32_MAX))
    d.allowed_length = (int32_t)*v;
  if (auto v = opt_integer(body, "dry_penalty_last_n", -1, INT32_MAX))
    d.penalty_last_n = (int32_t)*v;
  std::optional<std::vector<std::string>> breakers;
  if (auto it = body.find("dry_sequence_breakers"); it != body.end() && !it->is_null()) {
    if (!it->is_array() || it->empty() || it->size() > 64)
      bad_request("'dry_sequence_breakers' must be a non-empty list of strings",
                  "dry_sequence_breakers");
    breakers.emplace();
    for (const auto& b : *it) {
      if (!b.is_string())
        bad_request("'dry_sequence_breakers' must be a non-empty list of strings",
                    "dry_sequence_breakers");
      breakers->push_back(b.get<std::string>());
    }
  }
  if (!d.on()) return;
  if (breakers)
    d.breakers = resolve_dry_breakers(m.tok(), *breakers);
  else if (!d.breakers)
    d.breakers = resolve_dry_breakers(m.tok(), default_dry_breakers());
}

}  // namespace

engine::SamplingParams parse_sampling(const nlohmann::json& body, const ServingModel& m,
                                      Dialect dialect) {
  engine::SamplingParams p = m.defaults.sampling;
  const bool openai = dialect == Dialect::kOpenAI;
  p.seed = random_seed();
  if (!m.defaults.seed_random) p.seed = m.defaults.sampling.seed;

  if (auto v = opt_number(body, "temperature", 0, openai ? 2 : 100)) p.temperature = (float)*v;
  if (auto v = opt_number(body, "top_p", 0, 1)) {
    if (*v == 0)
      p.temperature = 0;  // only the most likely token survives: greedy
    else
      p.top_p = (float)*v;
  }
  if (auto v = opt_number(body, "frequency_penalty", -2, 2)) p.frequency_penalty = (float)*v;
  if (auto v = opt_number(body, "presence_penalty", -2, 2)) p.presence_penalty = (float)*v;
  if (openai) {
    // OpenAI's model has no top-k / min-p: turn them off unless the server default asks.
    if (auto v = opt_integer(body, "top_k", 0, m.tok().n_vocab())) p.top_k = (int)*v;
    if (auto v = opt_number(body, "min_p", 0, 1)) p.min_p = (float)*v;
  } else {
    if (auto v = opt_integer(body, "top_k", -1, m.tok().n_vocab())) p.top_k = (int)*v;
    if (auto v = opt_number(body, "min_p", 0, 1)) p.min_p = (float)*v;
    if (auto v = opt_number(body, "typical_p", 0, 1)) {
      if (*v == 0) bad_request("'typical_p' must be above 0 (1 turns it off)", "typical_p");
      p.typical_p = (float)*v;
    }
  }
  // llama.cpp's repetition penalty, which llama-server also takes on its OpenAI routes.
  if (auto v = opt_number(body, "repeat_penalty", 0, 10)) {
    if (*v == 0) bad_request("'repeat_penalty' must be above 0 (1 turns it off)", "repeat_penalty");
    p.repeat_penalty = (float)*v;
  }
  if (auto v = opt_integer(body, "repeat_last_n", -1, 1 << 20)) p.repeat_last_n = (int)*v;
  // llama-server's other samplers (its OpenAI routes take them too): top-n-sigma and XTC.
  if (auto v = opt_number(body, "top_n_sigma", -1e9, 1e9)) p.top_n_sigma = (float)*v;
  if (auto v = opt_number(body, "xtc_probability", 0, 1)) p.xtc_probability = (float)*v;
  if (auto v = opt_number(body, "xtc_threshold", 0, 1)) p.xtc_threshold = (float)*v;
  parse_dry(body, p.dry, m);
  if (auto v = opt_integer(body, "mirostat", 0, 2)) p.mirostat = (int)*v;
  if (auto v = opt_number(body, "mirostat_tau", 0, 1e3)) p.mirostat_tau = (float)*v;
  if (auto v = opt_number(body, "mirostat_eta", 0, 1e3)) p.mirostat_eta = (float)*v;
  if (auto v = opt_integer(body, "seed", std::numeric_limits<int64_t>::min(),
                           std::numeric_limits<int64_t>::max())) {
    if (*v >= 0 || openai) p.seed = (uint64_t)*v;  // llama.cpp: -1 = random
  }
  parse_logit_bias(body, p, m, openai ? 100 : 1e9);
  // llama-server's per-request LoRA scales: hablar loads no adapters, so only an empty list
  // means anything here (the one every route parses sampling through).
  if (auto lora = body.find("lora"); lora != body.end() && !lora->is_null()) {
    if (!lora->is_array()) bad_request("'lora' must be a list of {id, scale}", "lora");
    if (!lora->empty())
      bad_request("'lora' names an adapter, but this server loaded no LoRA adapters", "lora");
  }
  try {
    p.validate();
  } catch (const Error& e) {
    bad_request(e.what());
  }
  return p;
}

int32_t parse_priority(const nlohmann::json& body) {
  return (int32_t)opt_integer(body, "priority", INT32_MIN, INT32_MAX).value_or(0);
}

int32_t parse_id_slot(const nlohmann::json& body, const ServingModel& m) {
  return (int32_t)opt_integer(body, "id_slot", -1, std::max(1, m.n_slots) - 1).value_or(-1);
}

void parse_context_shift(const nlohmann::json& body, const char* keep_field, GenerationSpec& spec) {
  if (auto keep = opt_integer(body, keep_field, -1, INT32_MAX)) spec.n_keep = (int32_t)*keep;
  spec.n_discard = (int32_t)opt_integer(body, "n_discard", 0, INT32_MAX).value_or(0);
}

std::optional<engine::DraftParams> parse_speculative(const nlohmann::json& body,
                                                     const ServingModel& m) {
  const nlohmann::json* obj = nullptr;
  if (auto it = body.find("speculative"); it != body.end() && !it->is_null()) {
    if (!it->is_object())
      throw ApiError(400, "'speculative' must be an object with n_max, n_min, p_min",
                     "speculative");
    obj = &*it;
  }
  engine::DraftParams p = m.engine->config().draft;
  bool any = false;
  auto take_int = [&](const char* flat, const char* key, int32_t& out) {
    std::optional<int64_t> v = opt_integer(body, flat, 0, 256);
    if (!v && obj) {
      if (obj->contains(key) && !(*obj)[key].is_number_integer())
        throw ApiError(400, std::string("'") + flat + "' must be an integer between 0 and 256",
                       flat);
      v = opt_integer(*obj, key, 0, 256);
    }
    if (v) out = (int32_t)*v, any = true;
  };
  take_int("speculative.n_max", "n_max", p.n_max);
  take_int("speculative.n_min", "n_min", p.n_min);
  std::optional<double> pm = opt_number(body, "speculative.p_min", 0, 1);
  if (!pm && obj) pm = opt_number(*obj, "p_min", 0, 1);
  if (pm) p.p_min = (float)*pm, any = true;
  if (!any) return std::nullopt;
  return p;
}

}  // namespace hablar::server
