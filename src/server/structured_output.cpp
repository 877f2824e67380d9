#include "server/structured_output.h"

#include <functional>
#include <map>
#include <mutex>
#include <optional>

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "core/log.h"
#include "grammar/completion_length.h"
#include "grammar/grammar_cache.h"
#include "grammar/regex.h"
#include "server/api_error.h"

namespace hablar::server {

namespace {

using OJson = nlohmann::ordered_json;

OJson ordered_body(const std::string& body_text) {
  try {
    return OJson::parse(body_text);
  } catch (const std::exception&) {
    bad_request("the request body is not valid JSON");
  }
}

// Compiles `make()`'s GBNF; the front ends' errors (schema, regex) become 400s too.
template <typename F>
GrammarPtr build(const ServingModel& m, const char* field, F make) {
  std::string gbnf;
  try {
    gbnf = make();
  } catch (const Error& e) {
    bad_request(std::string("'") + field + "' cannot be enforced: " + e.what(), field);
  }
  return compile_for_model(m, gbnf, field, grammar::GbnfSource::kGenerated);
}

GrammarPtr schema_grammar(const ServingModel& m, const OJson& schema, const char* field) {
  if (!schema.is_object() && !schema.is_boolean())
    bad_request(std::string("'") + field + "' must be a JSON Schema object", field);
  return build(m, field, [&] { return grammar::json_schema_to_gbnf(schema); });
}

GrammarPtr any_object(const ServingModel& m, const char* field) {
  return build(m, field, [] { return grammar::any_json_object_gbnf(); });
}

GrammarPtr response_format(const ServingModel& m, const OJson& rf) {
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    bad_request("'response_format' must be an object with a 'type'", "response_format");
  const std::string type = rf["type"].get<std::string>();
  if (type == "text") return nullptr;
  // llama-server's extension: a json_object may carry the schema it follows.
  if (type == "json_object")
    return rf.contains("schema") ? schema_grammar(m, rf["schema"], "response_format")
                                 : any_object(m, "response_format");
  if (type != "json_schema")
    bad_request("'response_format.type' must be text, json_object or json_schema",
                "response_format");
  const OJson js = rf.value("json_schema", OJson());
  if (!js.is_object())
    bad_request("'response_format.json_schema' must be an object", "response_format");
  // llama-server and some clients put the schema directly in json_schema.
  if (js.contains("schema")) return schema_grammar(m, js["schema"], "response_format");
  if (js.contains("type") || js.contains("properties") || js.contains("$ref"))
    return schema_grammar(m, js, "response_format");
  return any_object(m, "response_format");
}

}  // namespace

std::shared_ptr<const grammar::Vocab> grammar_vocab(const ServingModel& m) {
  // One per loaded model (its file and load time name it, whatever the addresses).
  static std::mutex mu;
  static std::map<std::pair<std::string, int64_t>, std::shared_ptr<const grammar::Vocab>> vocabs;
  std::lock_guard<std::mutex> lock(mu);
  auto& v = vocabs[{m.path, m.created}];
  if (!v || v->n_vocab() != m.tok().n_vocab()) v = grammar::Vocab::from_tokenizer(m.tok());
  return v;
}

GrammarPtr compile_for_model(const ServingModel& m, const std::string& gbnf, const char* field,
                             grammar::GbnfSource source) {
  // Requests with the same constraint share its compiled grammar, and so the states earlier
  // ones walked (grammar::SharedStates).
  static grammar::GrammarCache cache;
  try {
    return cache.get(gbnf, source, grammar_vocab(m));
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kInvalidArgument) throw;
    bad_request(std::string("'") + field + "': " + e.what(), field);
  }
}

GrammarPtr openai_output_grammar(const ServingModel& m, const std::string& body_text) {
  // Most requests have no constraint: their body is not parsed a second time.
  bool mentioned = false;
  for (const char* k : {"response_format", "guided_", "grammar", "json_schema"})
    mentioned = mentioned || body_text.find(k) != std::string::npos;
  if (!mentioned) return nullptr;
  const OJson body = ordered_body(body_text);
  std::vector<const char*> given;
  for (const char* k : {"response_format", "guided_json", "guided_regex", "guided_choice",
                        "guided_grammar", "grammar", "json_schema"})
    if (body.contains(k) && !body[k].is_null()) given.push_back(k);
  if (given.empty()) return nullptr;
  if (given.size() > 1)
    bad_request(std::string("'") + given[0] + "' and '" + given[1] +
                    "' cannot be used together: give one output constraint",
                given[1]);
  const std::string field = given[0];
  const OJson& v = body[field];
  if (field == "response_format") return response_format(m, v);
  if (field == "guided_json" || field == "json_schema") {
    if (v.is_string()) {  // vLLM accepts the schema as JSON text too
      OJson parsed;
      try {
        parsed = OJson::parse(v.get<std::string>());
      } catch (const std::exception&) {
        bad_request("'" + field + "' is not valid JSON", field.c_str());
      }
      return schema_grammar(m, parsed, given[0]);
    }
    return schema_grammar(m, v, given[0]);
  }
  if (field == "guided_regex") {
    if (!v.is_string()) bad_request("'guided_regex' must be a string", "guided_regex");
    return build(m, given[0], [&] { return grammar::regex_to_gbnf(v.get<std::string>()); });
  }
  if (field == "guided_choice") {
    if (!v.is_array() || v.empty())
      bad_request("'guided_choice' must be a list of strings", "guided_choice");
    std::vector<std::string> choices;
    for (const auto& c : v) {
      if (!c.is_string()) bad_request("'guided_choice' must be a list of strings", "guided_choice");
      choices.push_back(c.get<std::string>());
    }
    return build(m, given[0], [&] { return grammar::choices_to_gbnf(choices); });
  }
  if (!v.is_string()) bad_request("'" + field + "' must be GBNF text", field.c_str());
  return compile_for_model(m, v.get<std::string>(), given[0]);
}

GrammarPtr llama_output_grammar(const ServingModel& m, const std::string& body_text) {
  if (body_text.find("grammar") == std::string::npos &&
      body_text.find("json_schema") == std::string::npos &&
      body_text.find("response_format") == std::string::npos)
    return nullptr;
  const OJson body = ordered_body(body_text);
  const bool has_grammar = body.contains("grammar") && body["grammar"].is_string() &&
                           !body["grammar"].get<std::string>().empty();
  const bool has_schema = body.contains("json_schema") && !body["json_schema"].is_null();
  if (has_grammar && has_schema)
    bad_request("'grammar' and 'json_schema' cannot be used together", "json_schema");
  if (body.contains("grammar") && !body["grammar"].is_null() && !body["grammar"].is_string())
    bad_request("'grammar' must be GBNF text", "grammar");
  if (has_grammar) return compile_for_model(m, body["grammar"].get<std::string>(), "grammar");
  if (has_schema) return schema_grammar(m, body["json_schema"], "json_schema");
  if (body.contains("response_format") && !body["response_format"].is_null())
    return response_format(m, body["response_format"]);
  return nullptr;
}

GrammarPtr ollama_output_grammar(const ServingModel& m, const std::string& body_text) {
  if (body_text.find("format") == std::string::npos) return nullptr;
  const OJson body = ordered_body(body_text);
  if (!body.contains("format") || body["format"].is_null()) return nullptr;
  const OJson& f = body["format"];
  if (f.is_string()) {
    const std::string s = f.get<std::string>();
    if (s.empty()) return nullptr;
    if (s == "json") return any_object(m, "format");
    bad_request("'format' must be \"json\" or a JSON Schema", "format");
  }
  return schema_grammar(m, f, "format");
}

namespace {

// How a format writes calls after its opening (chat::tool_call_opening): `head`, then calls
// separated by `sep`, then `tail`. One call is `pre` (given the function's name, JSON-escaped
// where the format is JSON) + the arguments + `post`. `named_in_opening`: a named call's
// opening already holds head and pre, so only the arguments, post and tail follow. An empty
// `sep`: one call per turn.
struct CallShape {
  std::string head, sep, tail;
  std::function<std::vector<std::string>(const std::string& name)> pre;  // alternatives
  std::string post;
  bool named_in_opening = true;
};

std::string json_inner(const std::string& name) {
  const std::string q = nlohmann::json(name).dump();
  return q.substr(1, q.size() - 2);
}

std::optional<CallShape> call_shape(chat::ToolFormat format) {
  using chat::ToolFormat;
  CallShape c;
  switch (format) {
    case ToolFormat::kHermes:
      c.pre = [](const std::string& n) {
        return std::vector<std::string>{"{\"name\": \"" + json_inner(n) + "\", \"arguments\": "};
      };
      c.post = "}\n</tool_call>";
      c.sep = "\n<tool_call>\n";
      return c;
    case ToolFormat::kLlama3:  // opening {"name": "
      c.pre = [](const std::string& n) {
        return std::vector<std::string>{json_inner(n) + "\", \"parameters\": "};
      };
      c.post = "}";
      return c;
    case ToolFormat::kMistral:  // opening [TOOL_CALLS]
      c.head = "[";
      c.pre = [](const std::string& n) {
        return std::vector<std::string>{"{\"name\": \"" + json_inner(n) + "\", \"arguments\": "};
      };
      c.post = "}";
      c.sep = ", ";
      c.tail = "]";
      return c;
    case ToolFormat::kFunctionaryV3_1:  // opening <function=
      c.pre = [](const std::string& n) { return std::vector<std::string>{n + ">"}; };
      c.post = "</function>";
      c.sep = "<function=";
      return c;
    case ToolFormat::kFunctionaryV3_2:  // the prompt ends with ">>>": name, newline, JSON
      c.pre = [](const std::string& n) { return std::vector<std::string>{n + "\n"}; };
      c.sep = "\n>>>";
      c.named_in_opening = false;
      return c;
    case ToolFormat::kCommandR:  // opening Action:\n```json\n[\n, as the template writes calls
      c.pre = [](const std::string& n) {
        return std::vector<std::string>{"    {\n        \"tool_name\": \"" + json_inner(n) +
                                        "\",\n        \"parameters\": "};
      };
      c.post = "\n    }";
      c.sep = ",\n";
      c.tail = "\n]\n```";
      c.named_in_opening = false;
      return c;
    case ToolFormat::kDeepSeek:  // opening <calls begin><call begin>; R1 or V3.1 spelling
      c.pre = [](const std::string& n) {
        return std::vector<std::string>{"function<｜tool▁sep｜>" + n + "\n```json\n",
                                        n + "<｜tool▁sep｜>"};
      };
      // R1's closing fence and each call's end marker are written per spelling in
      // tool_call_grammar.
      c.sep = "<｜tool▁call▁begin｜>";
      c.tail = "<｜tool▁calls▁end｜>";
      c.named_in_opening = false;
      return c;
    case ToolFormat::kGenericJson:  // opening {"tool_call": {"name": "
      c.pre = [](const std::string& n) {
        return std::vector<std::string>{json_inner(n) + "\", \"arguments\": "};
      };
      c.post = "}}";
      return c;
    case ToolFormat::kNone:
      break;
  }
  return std::nullopt;
}

// At most this many calls in one turn when parallel calls are asked for.
constexpr int kMaxParallelCalls = 8;

}  // namespace

GrammarPtr tool_call_grammar(const ServingModel& m, chat::ToolFormat format,
                             const nlohmann::ordered_json& tools, const std::string& function,
                             bool parallel) {
  const auto shape = call_shape(format);
  if (!shape) return nullptr;
  const bool deepseek = format == chat::ToolFormat::kDeepSeek;
  return build(m, "tools", [&] {
    std::string rules, alts;
    int index = 0;
    for (const auto& t : tools) {
      const OJson& fn = t.contains("function") ? t["function"] : t;
      const std::string name = fn.value("name", std::string());
      if (!function.empty() && name != function) continue;
      const OJson params = fn.contains("parameters") && !fn["parameters"].is_null()
                               ? fn["parameters"]
                               : OJson{{"type", "object"}};
      const std::string rule = "tool" + std::to_string(index++);
      rules += grammar::json_schema_rules(params, rule);
      const bool bare = !function.empty() && shape->named_in_opening;
      std::string alt;
      const auto pres = shape->pre(name);
      for (size_t i = 0; i < (bare ? 1 : pres.size()); ++i) {
        std::string one = bare ? rule : grammar::gbnf_literal(pres[i]) + " " + rule;
        if (deepseek) one += i == 0 ? " \"\\n```\"" : "";  // R1: the fence closes
        if (deepseek) one += " \"<｜tool▁call▁end｜>\"";
        alt += (alt.empty() ? "" : " | ") + one;
      }
      if (!shape->post.empty()) alt = "( " + alt + " ) " + grammar::gbnf_literal(shape->post);
      alts += (alts.empty() ? "" : " | ") + ("( " + alt + " )");
    }
    if (alts.empty())
      throw_error(ErrorKind::kInvalidArgument, "no declared function is named '" + function + "'");
    std::string root = "root ::= ";
    if (!shape->head.empty() && !(function.size() && shape->named_in_opening))
      root += grammar::gbnf_literal(shape->head) + " ";
    root += "call";
    if (parallel && function.empty() && !shape->sep.empty())
      root += " ( " + grammar::gbnf_literal(shape->sep) + " call ){0," +
              std::to_string(kMaxParallelCalls - 1) + "}";
    if (!shape->tail.empty()) root += " " + grammar::gbnf_literal(shape->tail);
    return root + "\ncall ::= " + alts + "\n" + rules + grammar::json_primitives_gbnf();
  });
}

std::string auto_call_trigger(chat::ToolFormat format) {
  switch (format) {
    case chat::ToolFormat::kHermes:
    case chat::ToolFormat::kLlama3:
    case chat::ToolFormat::kMistral:
    case chat::ToolFormat::kFunctionaryV3_1:
    case chat::ToolFormat::kCommandR:
    case chat::ToolFormat::kDeepSeek:
    case chat::ToolFormat::kGenericJson:
      return chat::tool_call_opening(format, "");
    default:
      return {};
  }
}

GrammarGate::GrammarGate(GrammarPtr grammar, std::string trigger, std::string context,
                         int32_t max_tokens)
    : grammar_(std::move(grammar)), trigger_(std::move(trigger)), max_tokens_(max_tokens) {
  if (trigger_.empty()) {
    matcher_ = std::make_unique<grammar::GrammarMatcher>(grammar_);
    return;
  }
  text_ = std::move(context);
  feed(-1);  // the context alone may hold the trigger already
}

// Adds a token's bytes (none for -1) while waiting for the trigger, or advances the matcher.
void GrammarGate::feed(int32_t token) {
  if (off_) return;
  if (matcher_) {
    matcher_->accept_token(token);
    return;
  }
  const grammar::Vocab& v = *grammar_->vocab;
  if (token >= 0 && token < v.n_vocab() && v.usable(token)) text_ += v.bytes(token);
  const size_t at = text_.find(trigger_);
  if (at == std::string::npos) return;
  matcher_ = std::make_unique<grammar::GrammarMatcher>(grammar_);
  if (!matcher_->accept_bytes(std::string_view(text_).substr(at + trigger_.size()))) {
    matcher_.reset();
    off_ = true;
  }
  text_.clear();
}

bool GrammarGate::advance(std::span<const int32_t> history) {
  pending_ = !history.empty() && history.back() == engine::kPendingToken;
  if (pending_) history = history.first(history.size() - 1);
  if (!start_) start_ = history.size();
  if (failed_) return true;  // only the end of generation
  try {
    for (size_t i = std::max(*start_, seen_); i < history.size(); ++i) feed(history[i]);
    seen_ = history.size();
  } catch (const std::exception& e) {
    // Never out of the engine's step (it would fail every sequence): this one ends here.
    log::warn("grammar stopped the sequence: {}", e.what());
    failed_ = true;
  }
  return pending_ || failed_ || matcher_ != nullptr;
}

bool GrammarGate::resolve_pending(int32_t token) {
  if (!pending_) return true;
  pending_ = false;
  const bool stands = fits(token, distance_limit_at(seen_));
  ahead_ = Verdict{seen_, token, stands};
  if (!stands) return false;  // the engine computes this position again
  if (failed_) return true;   // (only the end of generation from here)
  try {
    feed(token);
    seen_ += 1;
  } catch (const std::exception& e) {
    log::warn("grammar stopped the sequence: {}", e.what());
    failed_ = true;
  }
  return true;
}

void GrammarGate::restrict_to_budget(std::span<uint32_t> words) {
  const std::optional<Budget> b = budget(seen_);  // (seen_: the history the mask follows)
  if (!b || b->left - 2 - b->now >= kBudgetWatch) return;
  try {
    const int32_t limit = distance_limit_at(seen_);
    if (limit >= matcher_->max_distance_after()) return;
    const size_t n = std::min(words.size(), ((size_t)grammar_->vocab->n_vocab() + 31) / 32);
    matcher_->restrict_mask_to_distance(words.first(n), limit);
  } catch (const std::exception& e) {
    log::warn("grammar budget check skipped: {}", e.what());
  }
}

std::optional<bool> GrammarGate::verdict_ahead(int32_t token, size_t n_history) {
  if (!ahead_ || ahead_->n_history != n_history || ahead_->token != token) return std::nullopt;
  const bool stands = ahead_->stands;
  ahead_.reset();
  return stands;
}

void GrammarGate::constrain(std::span<float> logits, std::span<const int32_t> history) {
  if (!advance(history)) return;
  mask_.assign((logits.size() + 31) / 32, 0u);
  fill_allowed(mask_);
  grammar::mask_logits(mask_, logits);
}

void GrammarGate::fill_allowed(std::span<uint32_t> words) {
  if (!failed_ && !matcher_) {  // nothing constrains: every token
    std::fill(words.begin(), words.end(), ~0u);
    return;
  }
  if (!failed_) {
    try {
      const size_t n = std::min(words.size(), ((size_t)grammar_->vocab->n_vocab() + 31) / 32);
      matcher_->fill_mask(words.first(n));
      if (std::any_of(words.begin(), words.begin() + (ptrdiff_t)n, [](uint32_t w) { return w; }))
        return;
    } catch (const std::exception& e) {
      log::warn("grammar stopped the sequence: {}", e.what());
      failed_ = true;
    }
  }
  std::fill(words.begin(), words.end(), 0u);
  for (int32_t id : grammar_->vocab->eog())
    if ((size_t)id < words.size() * 32) words[(size_t)id >> 5] |= 1u << (id & 31);
}

std::optional<GrammarGate::Budget> GrammarGate::budget(size_t n_history) {
  if (max_tokens_ <= 0 || !start_ || !matcher_ || failed_ || off_) return std::nullopt;
  try {
    const int32_t now = matcher_->distance_to_end();
    if (now >= grammar::kNoCompletion) return std::nullopt;
    return Budget{max_tokens_ - (int32_t)(n_history - *start_), now};
  } catch (const std::exception&) {
    return std::nullopt;  // a grammar too ambiguous to follow here: constrain() deals with it
  }
}

int32_t GrammarGate::distance_limit_at(size_t n_history) {
  const std::optional<Budget> b = budget(n_history);
  if (!b) return -1;
  // After the next token, left - 1 remain for the completion's bytes and then the end of
  // generation (without which the sequence would stop for its length, not its grammar).
  return std::max({b->left - 2, b->now - 1, 0});
}

int32_t GrammarGate::distance_limit(std::span<const int32_t> history) {
  return distance_limit_at(history.size());
}

// (A pending token counts in the history's length; the grammar's state is the one before it.)
bool GrammarGate::near_budget(std::span<const int32_t> history, int32_t margin) {
  const std::optional<Budget> b = budget(history.size());
  return b && b->left - 2 - b->now < margin;
}

bool GrammarGate::fits(int32_t token, int32_t limit) {
  if (limit < 0 || !matcher_) return true;
  try {
    return matcher_->distance_after(token) <= limit;
  } catch (const std::exception&) {
    return true;
  }
}

void GrammarGate::restrict_to_distance(std::span<float> logits, int32_t limit) {
  if (limit < 0 || !matcher_) return;
  try {
    matcher_->restrict_to_distance(logits, limit);
  } catch (const std::exception& e) {
    log::warn("grammar budget check skipped: {}", e.what());
  }
}

int32_t GrammarSampler::sample(std::span<float> logits, std::span<const int32_t> history) {
  gate_->constrain(logits, history);
  const int32_t limit = gate_->distance_limit(history);
  if (limit < 0) return inner_.sample(logits, history);
  constrained_.assign(logits.begin(), logits.end());  // the sampler's chain edits logits
  const int32_t token = inner_.sample(logits, history);
  if (gate_->fits(token, limit)) return token;
  std::copy(constrained_.begin(), constrained_.end(), logits.begin());
  gate_->restrict_to_distance(logits, limit);
  return inner_.sample(logits, history);
}

bool GrammarSampler::device_params(std::span<const int32_t> history, engine::DeviceSampling& out) {
  if (!inner_.device_params(history, out)) return false;
  out.allowed = gate_->advance(history) ? this : nullptr;
  return host_margin_ <= 0 || !gate_->near_budget(history, host_margin_);
}

bool GrammarSampler::keeps_device_sample(int32_t token, std::span<const int32_t> history) {
  // Judged already where the executor gave the token for the next step's mask (the grammar
  // has taken it since, when it stood).
  if (const std::optional<bool> v = gate_->verdict_ahead(token, history.size())) return *v;
  return gate_->fits(token, gate_->distance_limit(history));
}

void GrammarSampler::fill_allowed(std::span<uint32_t> words, int32_t pending) {
  if (pending != engine::kPendingToken && !gate_->resolve_pending(pending)) {
    // Refused: this step's sample is void (the engine computes the position again).
    std::fill(words.begin(), words.end(), ~0u);
    return;
  }
  gate_->fill_allowed(words);
  gate_->restrict_to_budget(words);
}

nlohmann::json ollama_tool_calls(const std::vector<chat::ToolCall>& calls) {
  nlohmann::json out = nlohmann::json::array();
  for (const chat::ToolCall& c : calls) {
    nlohmann::json args;
    try {
      args = nlohmann::json::parse(c.arguments.empty() ? "{}" : c.arguments);
    } catch (const std::exception&) {
      args = c.arguments;  // not JSON: passed on as text
    }
    out.push_back({{"function", {{"name", c.name}, {"arguments", args}}}});
  }
  return out;
}

}  // namespace hablar::server
