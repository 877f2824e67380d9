#include "server/sampling_fields.h"

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

// OpenAI: {"50256": -100}. llama.cpp also: [[15043, 1.0], [15043, false]] (false bans).
void parse_logit_bias(const nlohmann::json& body, engine::SamplingParams& p, int32_t n_vocab,
                      double limit) {
  auto it = body.find("logit_bias");
  if (it == body.end() || it->is_null()) return;
  if (it->is_object()) {
    for (auto& [key, value] : it->items()) {
      int64_t token = -1;
      try {
        size_t used = 0;
        token = std::stoll(key, &used);
        if (used != key.size()) token = -1;
      } catch (const std::exception&) {
        token = -1;
      }
      if (token < 0)
        bad_request("'logit_bias' keys must be token ids (got " + text_excerpt(key) + ")",
                    "logit_bias");
      if (!value.is_number() || value.get<double>() < -limit || value.get<double>() > limit)
        bad_request("'logit_bias' values must be numbers between " + std::to_string((int)-limit) +
                        " and " + std::to_string((int)limit),
                    "logit_bias");
      add_bias(p, token, value.get<double>(), n_vocab);
    }
    return;
  }
  if (it->is_array()) {
    for (const auto& pair : *it) {
      if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number_integer() ||
          !(pair[1].is_number() || pair[1].is_boolean()))
        bad_request("'logit_bias' entries must be [token_id, bias] pairs", "logit_bias");
      const double bias =
          pair[1].is_boolean()
              ? (pair[1].get<bool>() ? 0.0 : -std::numeric_limits<double>::infinity())
              : pair[1].get<double>();
      add_bias(p, pair[0].get<int64_t>(), bias, n_vocab);
    }
    return;
  }
  bad_request("'logit_bias' must be an object of token id -> bias", "logit_bias");
}

uint64_t random_seed() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
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
    if (auto v = opt_number(body, "repeat_penalty", 0, 10)) {
      if (*v == 0)
        bad_request("'repeat_penalty' must be above 0 (1 turns it off)", "repeat_penalty");
      p.repeat_penalty = (float)*v;
    }
    if (auto v = opt_integer(body, "repeat_last_n", -1, 1 << 20)) p.repeat_last_n = (int)*v;
  }
  if (auto v = opt_integer(body, "seed", std::numeric_limits<int64_t>::min(),
                           std::numeric_limits<int64_t>::max())) {
    if (*v >= 0 || openai) p.seed = (uint64_t)*v;  // llama.cpp: -1 = random
  }
  parse_logit_bias(body, p, m.tok().n_vocab(), openai ? 100 : 1e9);
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

}  // namespace hablar::server
