// Model output -> reasoning, content and tool calls, for the tool-call formats of the shipped
// templates' families. One scanner serves both whole and streamed text: with final == false it
// stops at the first thing that is not yet decided (a tag cut in half, an unclosed tool call,
// JSON still open) so that everything it returns is a prefix of the final result.
#include "chat/output_parser_impl.h"

#include "core/json_depth.h"

#include <algorithm>
#include <array>
#include <functional>

namespace hablar::chat {
namespace {

using nlohmann::ordered_json;
constexpr std::size_t npos = std::string_view::npos;

bool is_ws(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\v' || c == '\f';
}

std::size_t skip_ws(std::string_view t, std::size_t p) {
  while (p < t.size() && is_ws(t[p])) ++p;
  return p;
}

std::string_view trim(std::string_view t) {
  std::size_t b = skip_ws(t, 0);
  std::size_t e = t.size();
  while (e > b && is_ws(t[e - 1])) --e;
  return t.substr(b, e - b);
}

// Start of a trailing piece of t[from:] that is a proper prefix of `marker`, or npos.
std::size_t partial_marker_start(std::string_view t, std::size_t from, std::string_view marker) {
  std::size_t avail = t.size() - std::min(from, t.size());
  for (std::size_t k = std::min(marker.size() - 1, avail); k > 0; --k)
    if (t.substr(t.size() - k) == marker.substr(0, k)) return t.size() - k;
  return npos;
}

// End (one past) of the JSON value that starts at `p`, or npos while it is still open.
std::size_t json_value_end(std::string_view t, std::size_t p) {
  if (p >= t.size()) return npos;
  if (t[p] != '{' && t[p] != '[') {  // a scalar: up to a delimiter
    if (t[p] == '"') {
      for (std::size_t i = p + 1; i < t.size(); ++i) {
        if (t[i] == '\\')
          ++i;
        else if (t[i] == '"')
          return i + 1;
      }
      return npos;
    }
    std::size_t i = p;
    while (i < t.size() && !is_ws(t[i]) && t[i] != ',' && t[i] != '}' && t[i] != ']') ++i;
    return i;
  }
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = p; i < t.size(); ++i) {
    char c = t[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return npos;
}

std::optional<ordered_json> parse_json(std::string_view t) {
  // Model output is outside text too: deeper JSON stays text rather than a tool call.
  if (json_nesting_depth(t, kMaxJsonDepth) > kMaxJsonDepth) return std::nullopt;
  ordered_json j = ordered_json::parse(t.begin(), t.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// Arguments as JSON text: objects as written (compact), a string holding JSON as is.
std::string arguments_text(const ordered_json& args) {
  if (args.is_string()) {
    auto inner = parse_json(args.get<std::string>());
    if (inner) return inner->dump();
    return args.get<std::string>();
  }
  if (args.is_null()) return "{}";
  return args.dump();
}

// {"name": ..., "arguments"|"parameters": ...} (optionally wrapped as {"function": {...}}).
std::optional<ToolCall> call_from_json(const ordered_json& j, const char* name_key = "name") {
  if (!j.is_object()) return std::nullopt;
  const ordered_json* obj = &j;
  if (j.contains("function") && j["function"].is_object()) obj = &j["function"];
  if (!obj->contains(name_key) || !(*obj)[name_key].is_string()) return std::nullopt;
  ToolCall call;
  call.name = (*obj)[name_key].get<std::string>();
  if (obj->contains("arguments"))
    call.arguments = arguments_text((*obj)["arguments"]);
  else if (obj->contains("parameters"))
    call.arguments = arguments_text((*obj)["parameters"]);
  else
    call.arguments = "{}";
  for (const char* id_key : {"id", "tool_call_id"})
    if (j.contains(id_key) && (j[id_key].is_string() || j[id_key].is_number()))
      call.id = j[id_key].is_string() ? j[id_key].get<std::string>() : j[id_key].dump();
  return call;
}

// A JSON array of calls (Mistral, Command R); nullopt when any element is not a call.
std::optional<std::vector<ToolCall>> calls_from_array(std::string_view t,
                                                      const char* name_key = "name") {
  auto j = parse_json(t);
  if (!j) return std::nullopt;
  std::vector<ToolCall> calls;
  if (j->is_object()) {
    auto c = call_from_json(*j, name_key);
    if (!c) return std::nullopt;
    calls.push_back(*c);
    return calls;
  }
  if (!j->is_array()) return std::nullopt;
  for (const auto& e : *j) {
    auto c = call_from_json(e, name_key);
    if (!c) return std::nullopt;
    calls.push_back(*c);
  }
  return calls;
}

ToolCall python_call(std::string_view code) {
  return ToolCall{"", "python", ordered_json({{"code", std::string(code)}}).dump()};
}

// Qwen3-Coder style: <function=NAME><parameter=KEY>VALUE</parameter>...</function>
std::optional<ToolCall> call_from_xml(std::string_view body) {
  body = trim(body);
  constexpr std::string_view kOpen = "<function=";
  if (body.substr(0, kOpen.size()) != kOpen) return std::nullopt;
  std::size_t name_end = body.find('>');
  if (name_end == npos) return std::nullopt;
  ToolCall call;
  call.name = std::string(trim(body.substr(kOpen.size(), name_end - kOpen.size())));
  ordered_json args = ordered_json::object();
  std::size_t p = name_end + 1;
  while (true) {
    std::size_t open = body.find("<parameter=", p);
    if (open == npos) break;
    std::size_t key_end = body.find('>', open);
    std::size_t close = body.find("</parameter>", key_end == npos ? open : key_end);
    if (key_end == npos || close == npos) return std::nullopt;
    std::string key(trim(body.substr(open + 11, key_end - open - 11)));
    std::string_view raw = body.substr(key_end + 1, close - key_end - 1);
    if (!raw.empty() && raw.front() == '\n') raw.remove_prefix(1);
    if (!raw.empty() && raw.back() == '\n') raw.remove_suffix(1);
    auto value = parse_json(raw);
    args[key] = (value && !value->is_string()) ? *value : ordered_json(std::string(raw));
    p = close + 12;
  }
  if (body.find("</function>", p) == npos) return std::nullopt;
  call.arguments = args.dump();
  return call;
}

// GLM 4.x style: NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>...
std::optional<ToolCall> call_from_arg_tags(std::string_view body) {
  body = trim(body);
  std::size_t first = body.find("<arg_key>");
  std::string name(trim(body.substr(0, first)));
  if (name.empty() || name.find_first_of("<>{}\n ") != std::string::npos) return std::nullopt;
  ordered_json args = ordered_json::object();
  std::size_t p = first == npos ? body.size() : first;
  while (p < body.size()) {
    std::size_t key_end = body.find("</arg_key>", p);
    std::size_t value_at = body.find("<arg_value>", p);
    std::size_t value_end = body.find("</arg_value>", p);
    if (body.compare(p, 9, "<arg_key>") != 0 || key_end == npos || value_at == npos ||
        value_end == npos || value_at < key_end || value_end < value_at)
      return std::nullopt;
    std::string key(trim(body.substr(p + 9, key_end - p - 9)));
    std::string_view raw = body.substr(value_at + 11, value_end - value_at - 11);
    auto value = parse_json(raw);
    args[key] = (value && !value->is_string()) ? *value : ordered_json(std::string(raw));
    p = skip_ws(body, value_end + 12);
  }
  return ToolCall{"", name, args.dump()};
}

// `name.call(key="value", ...)` after <|python_tag|> (Llama 3.1 built-in tools).
std::optional<ToolCall> call_from_python_syntax(std::string_view t) {
  t = trim(t);
  std::size_t dot = t.find(".call(");
  if (dot == npos || t.back() != ')') return std::nullopt;
  std::string name(t.substr(0, dot));
  if (name.empty() || !std::all_of(name.begin(), name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
      }))
    return std::nullopt;
  std::string_view inner = t.substr(dot + 6, t.size() - dot - 7);
  ordered_json args = ordered_json::object();
  std::size_t p = 0;
  while ((p = skip_ws(inner, p)) < inner.size()) {
    std::size_t eq = inner.find('=', p);
    if (eq == npos) return std::nullopt;
    std::string key(trim(inner.substr(p, eq - p)));
    std::size_t v = skip_ws(inner, eq + 1);
    std::size_t end = json_value_end(inner, v);
    if (end == npos) return std::nullopt;
    auto value = parse_json(inner.substr(v, end - v));
    if (!value) return std::nullopt;
    args[key] = *value;
    p = skip_ws(inner, end);
    if (p < inner.size() && inner[p] == ',') ++p;
  }
  return ToolCall{"", name, args.dump()};
}

// The scan state shared by every format.
struct Scan {
  std::string_view text;
  bool final;
  std::string content;
  std::vector<ToolCall> calls;
};

// A handler parses the block whose opener ended at `body`; returns the position after the block,
// or npos while it is incomplete (only when !final; a final handler that cannot parse returns
// npos too, and the block stays as text).
using BlockHandler = std::function<std::size_t(Scan&, std::size_t which, std::size_t body)>;

void scan_blocks(Scan& s, std::size_t pos, const std::vector<std::string_view>& opens,
                 const BlockHandler& handle) {
  while (true) {
    std::size_t at = npos, which = 0;
    for (std::size_t i = 0; i < opens.size(); ++i) {
      std::size_t hit = s.text.find(opens[i], pos);
      if (hit < at) {
        at = hit;
        which = i;
      }
    }
    if (at == npos) {
      std::size_t hold = npos;
      if (!s.final)
        for (auto open : opens) hold = std::min(hold, partial_marker_start(s.text, pos, open));
      s.content += s.text.substr(pos, hold == npos ? npos : hold - pos);
      return;
    }
    s.content += s.text.substr(pos, at - pos);
    std::vector<ToolCall> saved = s.calls;
    std::size_t end = handle(s, which, at + opens[which].size());
    if (end == npos) {
      s.calls = std::move(saved);
      if (s.final) s.content += s.text.substr(at);
      return;
    }
    pos = end;
  }
}

// <tool_call>{json}</tool_call> or <tool_call><function=...>...</function></tool_call>.
void scan_hermes(Scan& s, std::size_t pos) {
  scan_blocks(s, pos, {"<tool_call>"}, [](Scan& sc, std::size_t, std::size_t body) -> std::size_t {
    std::size_t close = sc.text.find("</tool_call>", body);
    if (close == npos && !sc.final) return npos;
    std::string_view inner = trim(sc.text.substr(body, close == npos ? npos : close - body));
    std::optional<ToolCall> call;
    if (auto j = parse_json(inner)) call = call_from_json(*j);
    if (!call) call = call_from_xml(inner);
    if (!call) call = call_from_arg_tags(inner);
    std::size_t end = close == npos ? sc.text.size() : close + 12;
    if (!call) {
      if (close == npos) return npos;
      sc.content += sc.text.substr(body - 11, end - (body - 11));
      return end;
    }
    sc.calls.push_back(*call);
    return end;
  });
}

// Tool calls written as bare JSON objects from `p` on ({"name":..., "parameters":...}; ...).
// Returns false when the text at p is not such a call (it is content then).
std::size_t scan_json_calls(Scan& s, std::size_t p, bool* not_calls) {
  *not_calls = false;
  while (true) {
    p = skip_ws(s.text, p);
    if (p < s.text.size() && s.text[p] == ';') p = skip_ws(s.text, p + 1);
    if (p >= s.text.size()) return p;
    if (s.text[p] != '{') {
      *not_calls = true;
      return p;
    }
    std::size_t end = json_value_end(s.text, p);
    if (end == npos) return s.final ? (*not_calls = true, p) : npos;
    auto j = parse_json(s.text.substr(p, end - p));
    auto call = j ? call_from_json(*j) : std::nullopt;
    if (!call) {
      *not_calls = true;
      return p;
    }
    s.calls.push_back(*call);
    p = end;
  }
}

void scan_llama3(Scan& s, std::size_t pos) {
  constexpr std::string_view kTag = "<|python_tag|>";
  std::size_t p = skip_ws(s.text, pos);
  if (p < s.text.size() && s.text[p] == '{') {
    bool not_calls = false;
    std::size_t end = scan_json_calls(s, p, &not_calls);
    if (end == npos) return;  // a call still being written
    if (!not_calls) return;
    pos = end;  // the rest is content
  }
  scan_blocks(s, pos, {kTag}, [](Scan& sc, std::size_t, std::size_t body) -> std::size_t {
    if (!sc.final) return npos;  // code or a call after the tag runs to the end of the message
    std::string_view rest = sc.text.substr(body);
    std::size_t eom = rest.find("<|eom_id|>");
    if (eom != npos) rest = rest.substr(0, eom);
    rest = trim(rest);
    Scan inner{rest, true, "", {}};
    bool not_calls = false;
    if (!rest.empty() && rest[0] == '{') {
      scan_json_calls(inner, 0, &not_calls);
      if (!not_calls) {
        sc.calls.insert(sc.calls.end(), inner.calls.begin(), inner.calls.end());
        return sc.text.size();
      }
    }
    if (auto call = call_from_python_syntax(rest))
      sc.calls.push_back(*call);
    else
      sc.calls.push_back(python_call(rest));
    return sc.text.size();
  });
}

void scan_mistral(Scan& s, std::size_t pos) {
  scan_blocks(s, pos, {"[TOOL_CALLS]"}, [](Scan& sc, std::size_t, std::size_t body) -> std::size_t {
    std::size_t p = skip_ws(sc.text, body);
    if (p >= sc.text.size()) return npos;
    if (sc.text[p] == '[' || sc.text[p] == '{') {  // [TOOL_CALLS][{"name":..., "arguments":...}]
      std::size_t end = json_value_end(sc.text, p);
      if (end == npos) return npos;
      auto calls = calls_from_array(sc.text.substr(p, end - p));
      if (!calls) return npos;
      sc.calls.insert(sc.calls.end(), calls->begin(), calls->end());
      return end;
    }
    std::size_t args = sc.text.find("[ARGS]", p);  // [TOOL_CALLS]name[ARGS]{...}
    if (args == npos) return npos;
    std::string name(trim(sc.text.substr(p, args - p)));
    std::string id;
    if (std::size_t id_at = name.find("[CALL_ID]"); id_at != std::string::npos) {
      id = name.substr(id_at + 9);
      name = name.substr(0, id_at);
    }
    std::size_t a = skip_ws(sc.text, args + 6);
    std::size_t end = json_value_end(sc.text, a);
    if (end == npos || name.empty()) return npos;
    auto j = parse_json(sc.text.substr(a, end - a));
    if (!j) return npos;
    sc.calls.push_back(ToolCall{id, name, arguments_text(*j)});
    return end;
  });
}

void scan_functionary_v31(Scan& s, std::size_t pos) {
  scan_blocks(s, pos, {"<function=", "<|python_tag|>"},
              [](Scan& sc, std::size_t which, std::size_t body) -> std::size_t {
                if (which == 1) {
                  if (!sc.final) return npos;
                  sc.calls.push_back(python_call(trim(sc.text.substr(body))));
                  return sc.text.size();
                }
                std::size_t name_end = sc.text.find('>', body);
                if (name_end == npos) return npos;
                std::size_t close = sc.text.find("</function>", name_end);
                std::size_t args_end = close;
                if (close == npos) {
                  if (!sc.final) return npos;
                  args_end = sc.text.size();
                }
                auto j = parse_json(trim(sc.text.substr(name_end + 1, args_end - name_end - 1)));
                if (!j) return npos;
                sc.calls.push_back(ToolCall{"", std::string(sc.text.substr(body, name_end - body)),
                                            arguments_text(*j)});
                return close == npos ? sc.text.size() : close + 11;
              });
}

// >>>name\n{json} segments; "all" carries plain content. The first ">>>" may be in the prompt.
void scan_functionary_v32(Scan& s, std::size_t pos) {
  constexpr std::string_view kSep = ">>>";
  if (s.text.compare(pos, kSep.size(), kSep) == 0) pos += kSep.size();
  while (pos < s.text.size()) {
    std::size_t nl = s.text.find('\n', pos);
    if (nl == npos) {
      if (s.final) s.content += s.text.substr(pos);
      return;
    }
    std::string name(trim(s.text.substr(pos, nl - pos)));
    std::size_t body = nl + 1;
    std::size_t next = s.text.find(kSep, body);
    if (name == "all") {
      std::size_t hold = next;
      if (next == npos && !s.final) hold = partial_marker_start(s.text, body, kSep);
      s.content += s.text.substr(body, hold == npos ? npos : hold - body);
      if (next == npos) return;
      pos = next + kSep.size();
      continue;
    }
    std::size_t p = skip_ws(s.text, body);
    std::size_t end = npos;
    std::optional<ordered_json> args;
    if (p < s.text.size() && s.text[p] == '{') {
      end = json_value_end(s.text, p);
      if (end != npos) args = parse_json(s.text.substr(p, end - p));
    }
    if (!args) {  // python code (or malformed): runs to the next segment
      if (next == npos && !s.final) return;
      std::size_t stop = next == npos ? s.text.size() : next;
      if (name == "python")
        s.calls.push_back(python_call(trim(s.text.substr(body, stop - body))));
      else
        s.content += s.text.substr(pos, stop - pos);
      if (next == npos) return;
      pos = next + kSep.size();
      continue;
    }
    s.calls.push_back(ToolCall{"", name, arguments_text(*args)});
    std::size_t after = skip_ws(s.text, end);
    if (after >= s.text.size()) return;
    if (s.text.compare(after, kSep.size(), kSep) == 0) {
      pos = after + kSep.size();
    } else if (!s.final && partial_marker_start(s.text, after, kSep) == after) {
      return;
    } else {
      pos = after;
      s.content += s.text.substr(after, next == npos ? npos : next - after);
      if (next == npos) return;
      pos = next + kSep.size();
    }
  }
}

void scan_command_r(Scan& s, std::size_t pos) {
  static const std::vector<std::string_view> kOpens = {"<|START_ACTION|>", "<|START_RESPONSE|>",
                                                       "<|END_RESPONSE|>", "Action:"};
  scan_blocks(s, pos, kOpens, [](Scan& sc, std::size_t which, std::size_t body) -> std::size_t {
    if (which == 1 || which == 2) return body;  // response markers are dropped
    std::size_t p = skip_ws(sc.text, body);
    std::size_t stop;
    if (which == 0) {
      stop = sc.text.find("<|END_ACTION|>", p);
      if (stop == npos && !sc.final) return npos;
    } else {
      constexpr std::string_view kFence = "```json";
      if (sc.text.compare(p, kFence.size(), kFence) != 0) {
        bool maybe = !sc.final && sc.text.size() - p < kFence.size() &&
                     kFence.substr(0, sc.text.size() - p) == sc.text.substr(p);
        if (maybe) return npos;
        sc.content += "Action:";
        return body;
      }
      p += kFence.size();
      stop = sc.text.find("```", p);
      if (stop == npos && !sc.final) return npos;
    }
    std::size_t json_end = stop == npos ? sc.text.size() : stop;
    auto calls = calls_from_array(trim(sc.text.substr(p, json_end - p)), "tool_name");
    if (!calls) return npos;
    sc.calls.insert(sc.calls.end(), calls->begin(), calls->end());
    if (stop == npos) return sc.text.size();
    return stop + (which == 0 ? 14 : 3);
  });
}

constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";

// One DeepSeek call body: "function<sep>NAME\n```json\n{...}\n```" (R1) or "NAME<sep>{...}" (V3.1).
std::optional<ToolCall> deepseek_call(std::string_view body) {
  std::size_t sep = body.find(kDsSep);
  if (sep == npos) return std::nullopt;
  std::string_view head = trim(body.substr(0, sep));
  std::string_view rest = body.substr(sep + kDsSep.size());
  std::string name;
  if (head == "function") {
    std::size_t nl = rest.find('\n');
    if (nl == npos) return std::nullopt;
    name = std::string(trim(rest.substr(0, nl)));
    rest = trim(rest.substr(nl + 1));
    if (rest.substr(0, 7) == "```json") rest = rest.substr(7);
    if (rest.size() >= 3 && rest.substr(rest.size() - 3) == "```") rest.remove_suffix(3);
  } else {
    name = std::string(head);
  }
  auto args = parse_json(trim(rest));
  if (!args || name.empty()) return std::nullopt;
  return ToolCall{"", name, arguments_text(*args)};
}

void scan_deepseek(Scan& s, std::size_t pos) {
  scan_blocks(s, pos, {kDsCallsBegin, kDsCallBegin},
              [](Scan& sc, std::size_t which, std::size_t body) -> std::size_t {
                std::size_t p = which == 0 ? body : body - kDsCallBegin.size();
                while (true) {
                  p = skip_ws(sc.text, p);
                  if (sc.text.compare(p, kDsCallsEnd.size(), kDsCallsEnd) == 0)
                    return p + kDsCallsEnd.size();
                  if (sc.text.compare(p, kDsCallBegin.size(), kDsCallBegin) != 0)
                    return sc.final && !sc.calls.empty() ? p
                                                         : npos;  // no end tag: accept at the end
                  std::size_t start = p + kDsCallBegin.size();
                  std::size_t end = sc.text.find(kDsCallEnd, start);
                  if (end == npos) return npos;
                  auto call = deepseek_call(sc.text.substr(start, end - start));
                  if (!call) return npos;
                  sc.calls.push_back(*call);
                  p = end + kDsCallEnd.size();
                  if (which == 1) return p;
                }
              });
}

void scan_generic(Scan& s, std::size_t pos) {
  std::size_t p = skip_ws(s.text, pos);
  if (p < s.text.size() && s.text[p] == '{') {
    if (!s.final) return;  // only the whole message tells a JSON answer from JSON text
    std::size_t end = json_value_end(s.text, p);
    if (end != npos && skip_ws(s.text, end) == s.text.size()) {
      if (auto j = parse_json(s.text.substr(p, end - p)); j && j->is_object()) {
        if (j->contains("tool_call")) {
          if (auto c = call_from_json((*j)["tool_call"])) {
            s.calls.push_back(*c);
            return;
          }
        } else if (j->contains("tool_calls") && (*j)["tool_calls"].is_array()) {
          auto calls = calls_from_array((*j)["tool_calls"].dump());
          if (calls) {
            s.calls = *calls;
            return;
          }
        } else if (j->contains("response") && (*j)["response"].is_string()) {
          s.content += (*j)["response"].get<std::string>();
          return;
        }
      }
    }
  }
  s.content += s.text.substr(pos);
}

struct ReasoningMarkers {
  std::string_view open, close;
};
constexpr std::array<ReasoningMarkers, 4> kReasoningMarkers = {{
    {"<think>", "</think>"},
    {"[THINK]", "[/THINK]"},
    {"<|START_THINKING|>", "<|END_THINKING|>"},
    {"<seed:think>", "</seed:think>"},
}};

// Finds the reasoning block at the start; returns where the rest begins, or npos when the
// rest is not decided yet (streaming inside reasoning).
std::size_t split_reasoning(std::string_view t, bool final, bool started, std::string& reasoning) {
  std::size_t p = skip_ws(t, 0);
  std::size_t body = npos;
  if (started) {
    body = 0;
  } else {
    for (const auto& m : kReasoningMarkers) {
      if (t.compare(p, m.open.size(), m.open) == 0) {
        body = p + m.open.size();
        break;
      }
      if (!final && t.size() - p < m.open.size() && m.open.substr(0, t.size() - p) == t.substr(p))
        return npos;  // could still become an opening tag
    }
    if (body == npos) return 0;
  }
  std::size_t close = npos, close_len = 0, hold = npos;
  for (const auto& m : kReasoningMarkers) {
    std::size_t hit = t.find(m.close, body);
    if (hit < close) {
      close = hit;
      close_len = m.close.size();
    }
    if (!final) hold = std::min(hold, partial_marker_start(t, body, m.close));
  }
  if (close != npos) {
    reasoning = t.substr(body, close - body);
    return close + close_len;
  }
  if (final) {
    reasoning = t.substr(body);
    return t.size();
  }
  reasoning = t.substr(body, hold == npos ? npos : hold - body);
  return npos;
}

// Content and reasoning are trimmed. While streaming this holds back trailing white space,
// which is what keeps every partial result a prefix of the final one.
std::string settle(std::string_view text) {
  return std::string(trim(text));
}

}  // namespace

ParsedMessage parse_output(std::string_view text, ToolFormat format, bool extract_reasoning,
                           bool reasoning_started, bool final) {
  ParsedMessage out;
  std::size_t rest = 0;
  if (extract_reasoning) {
    std::string reasoning;
    rest = split_reasoning(text, final, reasoning_started, reasoning);
    out.reasoning = settle(reasoning);
    if (rest == npos) return out;
  }
  Scan s{text, final, "", {}};
  switch (format) {
    case ToolFormat::kNone:
      s.content = std::string(text.substr(rest));
      break;
    case ToolFormat::kHermes:
      scan_hermes(s, rest);
      break;
    case ToolFormat::kLlama3:
      scan_llama3(s, rest);
      break;
    case ToolFormat::kMistral:
      scan_mistral(s, rest);
      break;
    case ToolFormat::kFunctionaryV3_1:
      scan_functionary_v31(s, rest);
      break;
    case ToolFormat::kFunctionaryV3_2:
      scan_functionary_v32(s, rest);
      break;
    case ToolFormat::kCommandR:
      scan_command_r(s, rest);
      break;
    case ToolFormat::kDeepSeek:
      scan_deepseek(s, rest);
      break;
    case ToolFormat::kGenericJson:
      scan_generic(s, rest);
      break;
  }
  out.content = settle(s.content);
  out.tool_calls = std::move(s.calls);
  return out;
}

ParsedMessage parse_model_output(std::string_view text, ToolFormat format, bool extract_reasoning,
                                 bool reasoning_started) {
  return parse_output(text, format, extract_reasoning, reasoning_started, true);
}

bool prompt_opens_reasoning(std::string_view prompt) {
  std::string_view t = prompt;
  while (!t.empty() && is_ws(t.back())) t.remove_suffix(1);
  for (const auto& m : kReasoningMarkers) {
    if (t.size() >= m.open.size() && t.substr(t.size() - m.open.size()) == m.open) return true;
  }
  return false;
}

ToolFormat detect_tool_format(std::string_view source) {
  auto has = [&](std::string_view s) { return source.find(s) != npos; };
  if (has(kDsCallsBegin) || has(kDsCallBegin)) return ToolFormat::kDeepSeek;
  if (has(">>>all") || (has(">>>") && has("<|start_header_id|>") && has("tools")))
    return ToolFormat::kFunctionaryV3_2;
  if (has("<function=") && (has("<|python_tag|>") || has("<|start_header_id|>")))
    return ToolFormat::kFunctionaryV3_1;
  if (has("<tool_call>")) return ToolFormat::kHermes;
  if (has("[TOOL_CALLS]")) return ToolFormat::kMistral;
  if (has("<|START_ACTION|>") || (has("Action:") && has("tool_name"))) return ToolFormat::kCommandR;
  if (has("<|start_header_id|>") && has("tools")) return ToolFormat::kLlama3;
  if (has("tools")) return ToolFormat::kGenericJson;
  return ToolFormat::kNone;
}

const char* tool_format_name(ToolFormat format) {
  switch (format) {
    case ToolFormat::kNone:
      return "none";
    case ToolFormat::kHermes:
      return "hermes";
    case ToolFormat::kLlama3:
      return "llama3";
    case ToolFormat::kMistral:
      return "mistral";
    case ToolFormat::kFunctionaryV3_1:
      return "functionary-v3.1";
    case ToolFormat::kFunctionaryV3_2:
      return "functionary-v3.2";
    case ToolFormat::kCommandR:
      return "command-r";
    case ToolFormat::kDeepSeek:
      return "deepseek";
    case ToolFormat::kGenericJson:
      return "generic-json";
  }
  return "unknown";
}

StreamingOutputParser::StreamingOutputParser(ToolFormat format, bool extract_reasoning,
                                             bool reasoning_started)
    : format_(format),
      extract_reasoning_(extract_reasoning),
      reasoning_started_(reasoning_started) {}

ParsedMessage StreamingOutputParser::push(std::string_view text_delta) {
  text_.append(text_delta);
  return drain(false);
}

ParsedMessage StreamingOutputParser::finish() {
  return drain(true);
}

ParsedMessage StreamingOutputParser::drain(bool final) {
  ParsedMessage now = parse_output(text_, format_, extract_reasoning_, reasoning_started_, final);
  ParsedMessage delta;
  if (now.content.size() > content_emitted_) {
    delta.content = now.content.substr(content_emitted_);
    content_emitted_ = now.content.size();
  }
  if (now.reasoning.size() > reasoning_emitted_) {
    delta.reasoning = now.reasoning.substr(reasoning_emitted_);
    reasoning_emitted_ = now.reasoning.size();
  }
  for (std::size_t i = tool_calls_emitted_; i < now.tool_calls.size(); ++i)
    delta.tool_calls.push_back(now.tool_calls[i]);
  tool_calls_emitted_ = std::max(tool_calls_emitted_, now.tool_calls.size());
  return delta;
}

}  // namespace hablar::chat
