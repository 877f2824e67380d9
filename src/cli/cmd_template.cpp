// `hablar template --template FILE | --model GGUF --context JSON_FILE`: renders a chat template
// with the variables of a JSON object (messages, tools, add_generation_prompt and any extra ones)
// and prints the text exactly, without adding a newline, so it can be held against another
// renderer. With --model the template is the GGUF's tokenizer.chat_template (ChatML when it has
// none), and bos_token / eos_token default to the model's special tokens.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "chat/chat.h"
#include "cli/command.h"
#include "core/error.h"
#include "core/paths.h"
#include "formats/gguf.h"
#include "formats/hf_model.h"

namespace hablar::cli {
namespace {

using nlohmann::ordered_json;

struct TemplateOptions {
  std::string template_file;
  std::string model;
  std::string context_file;
  bool show_format = false;
};

std::string read_text(const std::string& path, const char* what) {
  if (path == "-") {
    std::stringstream ss;
    ss << std::cin.rdbuf();
    return ss.str();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw_error(ErrorKind::kNotFound, std::string("cannot open ") + what + " file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The special token text of `id_key` (e.g. tokenizer.ggml.bos_token_id), or "" when absent.
std::string special_token(const gguf::GgufFile& file, std::string_view id_key,
                          const std::vector<std::string>& tokens) {
  auto id = file.uint_or_none(id_key);
  if (!id || *id >= tokens.size()) return "";
  return tokens[*id];
}

int run_template(const TemplateOptions& opts) {
  if (opts.template_file.empty() == opts.model.empty())
    throw_error(ErrorKind::kInvalidArgument,
                "give exactly one of --template FILE and --model GGUF");
  ordered_json context = ordered_json::object();
  if (!opts.context_file.empty()) {
    std::string text = read_text(opts.context_file, "context");
    context = ordered_json::parse(text, nullptr, false);
    if (context.is_discarded() || !context.is_object())
      throw_error(ErrorKind::kInvalidArgument,
                  "context file '" + opts.context_file + "' must hold one JSON object");
  }
  std::string source;
  if (!opts.template_file.empty()) {
    source = read_text(opts.template_file, "template");
  } else {
    gguf::GgufFile file = formats::open_model_file(resolve_model_path(opts.model));
    source = file.get_string_or(
        "tokenizer.chat_template",
        chat::fallback_template_source(file.get_string_or("general.architecture", "")));
    if (!context.contains("bos_token") || !context.contains("eos_token")) {
      std::vector<std::string> tokens;
      if (file.has("tokenizer.ggml.tokens"))
        tokens = file.get_string_array("tokenizer.ggml.tokens");
      if (!context.contains("bos_token"))
        context["bos_token"] = special_token(file, "tokenizer.ggml.bos_token_id", tokens);
      if (!context.contains("eos_token"))
        context["eos_token"] = special_token(file, "tokenizer.ggml.eos_token_id", tokens);
    }
  }
  chat::ChatTemplate tmpl(std::move(source));
  if (opts.show_format) {
    std::fprintf(stderr, "tool-call format: %s\n",
                 chat::tool_format_name(chat::detect_tool_format(tmpl.source())));
  }
  std::string text = tmpl.render(context, chat::RenderOptions{});
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
  return 0;
}

CommandRegistration reg{
    "template", "Render a chat template with a JSON context and print the text exactly",
    [](CLI::App& app) {
      auto opts = std::make_shared<TemplateOptions>();
      app.add_option("--template", opts->template_file, "Jinja template file");
      app.add_option("--model", opts->model, "GGUF model whose tokenizer.chat_template is used");
      app.add_option("--context", opts->context_file,
                     "JSON object of template variables (messages, tools, add_generation_prompt, "
                     "...); '-' reads standard input");
      app.add_flag("--show-format", opts->show_format,
                   "also print the detected tool-call format on standard error");
      return [opts] { return run_template(*opts); };
    }};

}  // namespace
}  // namespace hablar::cli
