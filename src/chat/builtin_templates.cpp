// Chat formats by name, for --chat-template NAME as llama-server takes it (chatml, llama3,
// command-r, ...): each is written here as a small Jinja template rendering the format of
// that model family, so it runs through the same interpreter as a model's own template.
#include <map>
#include <string>
#include <string_view>

#include "chat/chat.h"

namespace hablar::chat {

namespace {

// Messages arrive with string content (the server flattens parts). `first_user_system`
// templates fold a system message into the first user turn, as those families do.
const std::map<std::string, std::string, std::less<>>& templates() {
  static const std::map<std::string, std::string, std::less<>> kTemplates = {
      {"chatml",
       "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
       "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"},
      {"llama3",
       "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
       "{{ m.content | trim }}<|eot_id|>{% endfor %}"
       "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif "
       "%}"},
      {"llama4",
       "{{ bos_token }}{% for m in messages %}<|header_start|>{{ m.role }}<|header_end|>\n\n"
       "{{ m.content | trim }}<|eot|>{% endfor %}"
       "{% if add_generation_prompt %}<|header_start|>assistant<|header_end|>\n\n{% endif %}"},
      // The llama2 family as llama.cpp names it: plain llama2 folds a system message into the
      // first turn as text; -sys wraps it in <<SYS>>; -sys-bos opens later turns with <s>;
      // -sys-strip trims every message. A turn's [INST] comes with its first message.
      {"llama2",
       "{{ bos_token }}[INST] {% set ns = namespace(open=true) %}{% for m in messages %}"
       "{% if not ns.open %}[INST] {% set ns.open = true %}{% endif %}"
       "{% if m.role == 'system' %}{{ m.content }}\n"
       "{% elif m.role == 'user' %}{{ m.content }} [/INST]"
       "{% else %}{{ m.content }}</s>{% set ns.open = false %}{% endif %}{% endfor %}"},
      {"llama2-sys",
       "{{ bos_token }}[INST] {% set ns = namespace(open=true) %}{% for m in messages %}"
       "{% if not ns.open %}[INST] {% set ns.open = true %}{% endif %}"
       "{% if m.role == 'system' %}<<SYS>>\n{{ m.content }}\n<</SYS>>\n\n"
       "{% elif m.role == 'user' %}{{ m.content }} [/INST]"
       "{% else %}{{ m.content }}</s>{% set ns.open = false %}{% endif %}{% endfor %}"},
      {"llama2-sys-bos",
       "{{ bos_token }}[INST] {% set ns = namespace(open=true) %}{% for m in messages %}"
       "{% if not ns.open %}<s>[INST] {% set ns.open = true %}{% endif %}"
       "{% if m.role == 'system' %}<<SYS>>\n{{ m.content }}\n<</SYS>>\n\n"
       "{% elif m.role == 'user' %}{{ m.content }} [/INST]"
       "{% else %}{{ m.content }}</s>{% set ns.open = false %}{% endif %}{% endfor %}"},
      {"llama2-sys-strip",
       "{{ bos_token }}[INST] {% set ns = namespace(open=true) %}{% for m in messages %}"
       "{% if not ns.open %}[INST] {% set ns.open = true %}{% endif %}"
       "{% if m.role == 'system' %}<<SYS>>\n{{ m.content | trim }}\n<</SYS>>\n\n"
       "{% elif m.role == 'user' %}{{ m.content | trim }} [/INST]"
       "{% else %}{{ m.content | trim }}</s>{% set ns.open = false %}{% endif %}{% endfor %}"},
      {"mistral-v1",
       "{{ bos_token }}{% set ns = namespace(sys='') %}{% for m in messages %}"
       "{% if m.role == 'system' %}{% set ns.sys = m.content + '\n\n' %}"
       "{% elif m.role == 'user' %} [INST] {{ ns.sys }}{{ m.content }} [/INST]{% set ns.sys = '' %}"
       "{% else %} {{ m.content }}</s>{% endif %}{% endfor %}"},
      {"mistral-v3",  // assistant messages trimmed, as Mistral's v3 tokenizer does
       "{{ bos_token }}{% set ns = namespace(sys='') %}{% for m in messages %}"
       "{% if m.role == 'system' %}{% set ns.sys = m.content + '\n\n' %}"
       "{% elif m.role == 'user' %}[INST] {{ ns.sys }}{{ m.content }}[/INST]{% set ns.sys = '' %}"
       "{% else %} {{ m.content | trim }}</s>{% endif %}{% endfor %}"},
      {"mistral-v3-tekken",
       "{{ bos_token }}{% set ns = namespace(sys='') %}{% for m in messages %}"
       "{% if m.role == 'system' %}{% set ns.sys = m.content + '\n\n' %}"
       "{% elif m.role == 'user' %}[INST]{{ ns.sys }}{{ m.content }}[/INST]{% set ns.sys = '' %}"
       "{% else %}{{ m.content }}</s>{% endif %}{% endfor %}"},
      {"mistral-v7",
       "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}[SYSTEM_PROMPT] "
       "{{ m.content }}[/SYSTEM_PROMPT]{% elif m.role == 'user' %}[INST] {{ m.content }}[/INST]"
       "{% else %} {{ m.content }}</s>{% endif %}{% endfor %}"},
      {"phi3",
       "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}"
       "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"},
      {"phi4",
       "{% for m in messages %}<|im_start|>{{ m.role }}<|im_sep|>{{ m.content }}<|im_end|>"
       "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant<|im_sep|>{% endif %}"},
      {"zephyr",
       "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|endoftext|>\n{% endfor %}"
       "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"},
      {"falcon3",
       "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}\n{% endfor %}"
       "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"},
      {"gemma",
       "{{ bos_token }}{% set ns = namespace(sys='') %}{% for m in messages %}"
       "{% if m.role == 'system' %}{% set ns.sys = m.content + '\n\n' %}{% else %}"
       "<start_of_turn>{{ 'model' if m.role == 'assistant' else 'user' }}\n{{ ns.sys }}"
       "{{ m.content | trim }}<end_of_turn>\n{% set ns.sys = '' %}{% endif %}{% endfor %}"
       "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"},
      {"vicuna",
       "{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}\n\n"
       "{% elif m.role == 'user' %}USER: {{ m.content }}\n{% else %}ASSISTANT: {{ m.content }}"
       "</s>\n{% endif %}{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"},
      {"openchat",
       "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}"
       "<|end_of_turn|>{% else %}GPT4 Correct {{ 'User' if m.role == 'user' else 'Assistant' }}: "
       "{{ m.content }}<|end_of_turn|>{% endif %}{% endfor %}"
       "{% if add_generation_prompt %}GPT4 Correct Assistant:{% endif %}"},
      {"deepseek",
       "{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}"
       "{% elif m.role == 'user' %}### Instruction:\n{{ m.content }}\n"
       "{% else %}### Response:\n{{ m.content }}\n<|EOT|>\n{% endif %}{% endfor %}"
       "{% if add_generation_prompt %}### Response:\n{% endif %}"},
      {"deepseek2",
       "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}\n\n"
       "{% elif m.role == 'user' %}User: {{ m.content }}\n\n"
       "{% else %}Assistant: {{ m.content }}<\xEF\xBD\x9C"
       "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>{% endif %}{% endfor %}"
       "{% if add_generation_prompt %}Assistant:{% endif %}"},
      {"deepseek3",
       "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}"
       "{% elif m.role == 'user' %}<\xEF\xBD\x9CUser\xEF\xBD\x9C>{{ m.content }}"
       "{% else %}<\xEF\xBD\x9C"
       "Assistant\xEF\xBD\x9C>{{ m.content }}<\xEF\xBD\x9C"
       "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>{% endif %}{% endfor %}"
       "{% if add_generation_prompt %}<\xEF\xBD\x9C"
       "Assistant\xEF\xBD\x9C>{% endif %}"},
      {"command-r",
       "{{ bos_token }}{% for m in messages %}<|START_OF_TURN_TOKEN|>"
       "{% if m.role == 'system' %}<|SYSTEM_TOKEN|>{% elif m.role == 'user' %}<|USER_TOKEN|>"
       "{% else %}<|CHATBOT_TOKEN|>{% endif %}{{ m.content | trim }}<|END_OF_TURN_TOKEN|>"
       "{% endfor %}{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
       "{% endif %}"},
      {"granite",
       "{% for m in messages %}<|start_of_role|>{{ m.role }}<|end_of_role|>{{ m.content }}"
       "<|end_of_text|>\n{% endfor %}"
       "{% if add_generation_prompt %}<|start_of_role|>assistant<|end_of_role|>{% endif %}"},
  };
  return kTemplates;
}

}  // namespace

const std::string* builtin_chat_template(std::string_view name) {
  const auto& t = templates();
  auto it = t.find(name);
  return it == t.end() ? nullptr : &it->second;
}

std::optional<std::string> chat_template_from_flag(const std::string& text) {
  if (const std::string* builtin = builtin_chat_template(text)) return *builtin;
  const bool tags = text.find("{{") != std::string::npos || text.find("{%") != std::string::npos ||
                    text.find("{#") != std::string::npos;
  const bool words = text.find_first_of(" \t\r\n") != std::string::npos;
  if (tags || words) return text;
  return std::nullopt;
}

std::string builtin_chat_template_names() {
  std::string names;
  for (const auto& [name, source] : templates()) names += (names.empty() ? "" : ", ") + name;
  return names;
}

}  // namespace hablar::chat
