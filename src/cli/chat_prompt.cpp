#include "cli/chat_prompt.h"

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"

namespace hablar::cli {

std::string read_text_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw_error(ErrorKind::kNotFound, std::string("cannot read ") + what + " '" + path + "'");
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::string chat_template_source(const gguf::GgufFile& file, const std::string& override_file,
                                 const std::string& override_text) {
  if (!override_file.empty() && !override_text.empty())
    throw_error(ErrorKind::kInvalidArgument,
                "--chat-template and --chat-template-file are alternatives: give one");
  if (!override_file.empty()) return read_text_file(override_file, "chat template");
  if (!override_text.empty()) {
    // llama-server takes a built-in format's name or a Jinja template itself.
    if (auto source = chat::chat_template_from_flag(override_text)) return *source;
    throw_error(ErrorKind::kInvalidArgument,
                "--chat-template: unknown template name '" + override_text +
                    "' (built-in names: " + chat::builtin_chat_template_names() +
                    "; or give Jinja source, or --chat-template-file)");
  }
  std::string source = file.get_string_or("tokenizer.chat_template", "");
  if (source.empty()) {
    const std::string arch = file.get_string_or("general.architecture", "");
    source = chat::fallback_template_source(arch);
    log::warn("the model has no chat template; using the built-in {}",
              source == chat::chatml_template_source() ? "ChatML" : "turn format of " + arch);
  }
  return source;
}

std::string render_single_turn(const chat::ChatTemplate& tmpl, const tokenizer::Tokenizer& tok,
                               const std::string& system, const std::string& user) {
  chat::ChatInput input;
  if (!system.empty()) input.messages.push_back({{"role", "system"}, {"content", system}});
  input.messages.push_back({{"role", "user"}, {"content", user}});
  input.add_generation_prompt = true;
  if (tok.bos_id() >= 0) input.bos_token = tok.token_piece(tok.bos_id());
  if (tok.eos_id() >= 0) input.eos_token = tok.token_piece(tok.eos_id());
  return chat::apply_chat_template(tmpl, input);
}

std::vector<int32_t> encode_rendered_prompt(const tokenizer::Tokenizer& tok,
                                            const std::string& text) {
  bool add_special = true;
  if (tok.bos_id() >= 0) {
    const std::string bos = tok.token_piece(tok.bos_id());
    if (!bos.empty() && text.compare(0, bos.size(), bos) == 0) add_special = false;
  }
  return tok.encode(text, add_special, /*parse_special=*/true);
}

}  // namespace hablar::cli
