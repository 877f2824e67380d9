// ChatTemplate: a parsed template plus the chat-application conventions of Hugging Face's
// apply_chat_template.
#include "chat/chat.h"

#include "chat/jinja_interpreter.h"
#include "core/error.h"

namespace hablar::chat {

namespace {

// jinja2 rejects unknown filters and tests when it compiles a template, even in branches that
// never run, except inside an if statement or a conditional expression (test and branches),
// where only running one is an error (Interpreter::apply_filter); so do we.
void check_names(const jinja::Expr& e) {
  if (e.kind == jinja::ExprKind::kConditional) return;
  if (e.kind == jinja::ExprKind::kFilter && !jinja::builtin_filters().count(e.name))
    throw jinja::JinjaError("No filter named '" + e.name + "'.", e.pos);
  if (e.kind == jinja::ExprKind::kTest && !jinja::builtin_tests().count(e.name))
    throw jinja::JinjaError("No test named '" + e.name + "'.", e.pos);
  for (const auto& c : e.children)
    if (c) check_names(*c);
  for (const auto& [name, c] : e.keywords) check_names(*c);
}

void check_names(const jinja::Body& body) {
  for (const auto& s : body) {
    if (s->kind == jinja::StmtKind::kIf) continue;
    for (const jinja::Expr* e : {s->expr.get(), s->condition.get()})
      if (e) check_names(*e);
    for (const auto& f : s->filters) check_names(*f);
    for (const auto& p : s->params)
      if (p.default_value) check_names(*p.default_value);
    for (const auto& [name, e] : s->assignments) check_names(*e);
    for (const auto& [cond, branch] : s->branches) {
      check_names(*cond);
      check_names(branch);
    }
    check_names(s->body);
    check_names(s->else_body);
  }
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source) : source_(std::move(source)) {
  try {
    auto program = jinja::parse_template(source_);
    check_names(program->body);
    program_ = std::move(program);
  } catch (const jinja::JinjaError& e) {
    throw_error(ErrorKind::kInvalidArgument, e.formatted());
  }
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(const ChatTemplate&) = default;
ChatTemplate& ChatTemplate::operator=(const ChatTemplate&) = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

const std::string& ChatTemplate::source() const {
  return source_;
}

namespace {

std::string render_program(const jinja::Program& program, jinja::Value context,
                           const RenderOptions& options) {
  try {
    jinja::Interpreter interpreter(program, std::move(context), options);
    return interpreter.render();
  } catch (const jinja::JinjaError& e) {
    throw_error(ErrorKind::kInvalidArgument, e.formatted());
  }
}

jinja::Value context_value(jinja::Value v) {
  if (!v.is_dict() && !v.is_none())
    throw_error(ErrorKind::kInvalidArgument, "template context must be a JSON object");
  return v;
}

}  // namespace

std::string ChatTemplate::render(const nlohmann::json& context) const {
  return render(context, RenderOptions{});
}

std::string ChatTemplate::render(const nlohmann::json& context,
                                 const RenderOptions& options) const {
  return render_program(*program_, context_value(jinja::from_json(context)), options);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context,
                                 const RenderOptions& options) const {
  return render_program(*program_, context_value(jinja::from_json(context)), options);
}

nlohmann::ordered_json chat_context(const ChatInput& input) {
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  context["messages"] = input.messages;
  if (!input.tools.is_null()) context["tools"] = input.tools;
  context["add_generation_prompt"] = input.add_generation_prompt;
  context["bos_token"] = input.bos_token;
  context["eos_token"] = input.eos_token;
  if (input.extra.is_object())
    for (auto it = input.extra.begin(); it != input.extra.end(); ++it)
      context[it.key()] = it.value();
  return context;
}

std::string apply_chat_template(const ChatTemplate& tmpl, const ChatInput& input) {
  return apply_chat_template(tmpl, input, RenderOptions{});
}

std::string apply_chat_template(const ChatTemplate& tmpl, const ChatInput& input,
                                const RenderOptions& options) {
  if (!input.messages.is_array())
    throw_error(ErrorKind::kInvalidArgument, "chat messages must be a JSON array");
  if (!input.tools.is_null() && !input.tools.is_array())
    throw_error(ErrorKind::kInvalidArgument, "chat tools must be null or a JSON array");
  return tmpl.render(chat_context(input), options);
}

bool template_renders_system_role(const ChatTemplate& tmpl, const ChatInput& probe_base) {
  static const std::string kNeedle = "<System Needle 7f3a>";
  ChatInput probe = probe_base;
  probe.messages = nlohmann::ordered_json::array(
      {{{"role", "system"}, {"content", kNeedle}}, {{"role", "user"}, {"content", "Hey"}}});
  probe.tools = nullptr;
  probe.add_generation_prompt = true;
  try {
    return apply_chat_template(tmpl, probe).find(kNeedle) != std::string::npos;
  } catch (const Error&) {
    return false;
  }
}

nlohmann::ordered_json fold_system_into_next_message(nlohmann::ordered_json messages) {
  if (!messages.is_array() || messages.empty() || !messages[0].is_object() ||
      messages[0].value("role", "") != "system")
    return messages;
  if (messages.size() > 1 && messages[1].is_object()) {
    const auto text = [](const nlohmann::ordered_json& m) {
      const auto it = m.find("content");
      return it != m.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    messages[1]["content"] = text(messages[0]) + "\n" + text(messages[1]);
  }
  messages.erase(messages.begin());
  return messages;
}

bool template_knows_developer_role(const ChatTemplate& tmpl) {
  return tmpl.source().find("<|channel|>") != std::string::npos;
}

nlohmann::ordered_json developer_as_system(nlohmann::ordered_json messages) {
  if (!messages.is_array()) return messages;
  for (auto& m : messages)
    if (m.is_object() && m.value("role", "") == "developer") m["role"] = "system";
  return messages;
}

const std::string& chatml_template_source() {
  static const std::string source =
      "{%- for message in messages -%}\n"
      "{{- '<|im_start|>' + message['role'] + '\\n' -}}\n"
      "{%- if message['content'] is string -%}\n"
      "{{- message['content'] -}}\n"
      "{%- else -%}\n"
      "{%- for part in message['content'] if part['type'] == 'text' -%}{{- part['text'] -}}{%- "
      "endfor -%}\n"
      "{%- endif -%}\n"
      "{{- '<|im_end|>\\n' -}}\n"
      "{%- endfor -%}\n"
      "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n";
  return source;
}

// Gemma's turns: "user" and "model" roles between <start_of_turn> and <end_of_turn>; a system
// message has no turn of its own and opens the first user turn, followed by a blank line.
const std::string& gemma_template_source() {
  static const std::string source =
      "{{- bos_token -}}\n"
      "{%- set system = namespace(text='') -%}\n"
      "{%- for message in messages -%}\n"
      "{%- if message['content'] is string -%}{%- set text = message['content'] -%}\n"
      "{%- else -%}{%- set text = namespace(s='') -%}\n"
      "{%- for part in message['content'] if part['type'] == 'text' -%}"
      "{%- set text.s = text.s + part['text'] -%}{%- endfor -%}\n"
      "{%- set text = text.s -%}{%- endif -%}\n"
      "{%- if message['role'] == 'system' -%}{%- set system.text = text + '\\n\\n' -%}\n"
      "{%- else -%}\n"
      "{{- '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\\n' "
      "-}}\n"
      "{%- if message['role'] == 'user' -%}{{- system.text -}}{%- set system.text = '' -%}"
      "{%- endif -%}\n"
      "{{- text | trim -}}{{- '<end_of_turn>\\n' -}}\n"
      "{%- endif -%}\n"
      "{%- endfor -%}\n"
      "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}\n";
  return source;
}

const std::string& fallback_template_source(std::string_view architecture) {
  if (architecture.starts_with("gemma")) return gemma_template_source();
  return chatml_template_source();
}

}  // namespace hablar::chat
