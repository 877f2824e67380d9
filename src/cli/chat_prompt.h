// Chat prompts for the CLI commands: which template a model uses (its own, a file given on
// the command line, or ChatML when it has none) and the text of one rendered turn.
#pragma once

#include <string>

#include "chat/chat.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"

namespace hablar::cli {

// The whole file as bytes; kNotFound naming `what` and the path when it cannot be read.
std::string read_text_file(const std::string& path, const char* what);

// The template source: `override_file` when not empty, else the model's
// `tokenizer.chat_template`, else ChatML (with a warning).
// `override_text`: --chat-template, a built-in format's name (chatml, llama3, ...) or Jinja.
std::string chat_template_source(const gguf::GgufFile& file, const std::string& override_file,
                                 const std::string& override_text = "");

// Renders [system (when not empty), user] with the generation prompt opened.
std::string render_single_turn(const chat::ChatTemplate& tmpl, const tokenizer::Tokenizer& tok,
                               const std::string& system, const std::string& user);

// Token ids of a rendered prompt: special tokens written in the text become their ids, and
// the BOS is added only when the template did not write it already.
std::vector<int32_t> encode_rendered_prompt(const tokenizer::Tokenizer& tok,
                                            const std::string& text);

}  // namespace hablar::cli
