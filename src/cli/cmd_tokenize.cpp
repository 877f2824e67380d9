// `hablar tokenize -m FILE [--add-special] [--parse-special] [--ids|--pieces|--json] TEXT`
// and `hablar detokenize -m FILE IDS...`: the model's tokenizer from the command line.
// TEXT `-` reads standard input. By default no BOS/EOS is added, special tokens written in
// the text stay plain text, and the ids are printed space-separated on one line.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/paths.h"
#include "formats/gguf.h"
#include "formats/hf_model.h"
#include "tokenizer/tokenizer.h"

namespace hablar::cli {
namespace {

struct TokenizeOptions {
  std::string model;
  std::string text;
  bool add_special = false;
  bool parse_special = false;
  bool ids = false;
  bool pieces = false;
  bool json = false;
  bool batch = false;
};

std::unique_ptr<tokenizer::Tokenizer> open_tokenizer(const std::string& model) {
  const auto file = formats::open_model_file(resolve_model_path(model));
  return tokenizer::Tokenizer::from_gguf(file);
}

void write_all(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
}

int run_tokenize(const TokenizeOptions& o) {
  std::string text = o.text;
  if (text == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  const auto tok = open_tokenizer(o.model);
  if (o.batch) {  // a JSON array of texts in, a JSON array of id arrays out (oracle tests)
    const nlohmann::json texts = nlohmann::json::parse(text);
    nlohmann::json all = nlohmann::json::array();
    for (const auto& t : texts)
      all.push_back(tok->encode(t.get<std::string>(), o.add_special, o.parse_special));
    write_all(all.dump() + "\n");
    return 0;
  }
  const std::vector<int32_t> ids = tok->encode(text, o.add_special, o.parse_special);
  if (o.json) {
    nlohmann::json pieces = nlohmann::json::array();
    for (int32_t id : ids) pieces.push_back(tok->token_piece(id));
    const nlohmann::json j = {{"ids", ids}, {"pieces", pieces}};
    write_all(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  } else if (o.pieces) {
    std::string out;
    for (int32_t id : ids) {
      const nlohmann::json piece = tok->token_piece(id);
      out += std::to_string(id) + "\t" +
             piece.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    }
    write_all(out);
  } else {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? " " : "") + std::to_string(ids[i]);
    write_all(out + "\n");
  }
  return 0;
}

const CommandRegistration tokenize_reg{
    "tokenize", "Split text into the model's token ids", [](CLI::App& app) {
      auto o = std::make_shared<TokenizeOptions>();
      app.add_option("-m,--model", o->model,
                     "GGUF file, Hugging Face directory or model name (default model if empty)");
      app.add_flag("--add-special", o->add_special, "add BOS/EOS as the model asks");
      app.add_flag("--parse-special", o->parse_special,
                   "special tokens written in the text (<|im_start|>, <s>, ...) become their ids");
      auto* ids = app.add_flag("--ids", o->ids, "print ids, space-separated (default)");
      auto* pieces = app.add_flag("--pieces", o->pieces, "print `id<TAB>\"piece\"` per token");
      auto* json = app.add_flag("--json", o->json, R"(print {"ids": [...], "pieces": [...]})");
      app.add_flag("--batch", o->batch,
                   "the text is a JSON array of strings; print a JSON array of id arrays");
      ids->excludes(pieces)->excludes(json);
      pieces->excludes(json);
      app.add_option("text", o->text, "text to tokenize; - reads standard input")->required();
      return [o] { return run_tokenize(*o); };
    }};

struct DetokenizeOptions {
  std::string model;
  std::vector<int32_t> ids;
  bool show_special = false;
};

int run_detokenize(const DetokenizeOptions& o) {
  const auto tok = open_tokenizer(o.model);
  write_all(tok->decode(o.ids, o.show_special) + "\n");
  return 0;
}

const CommandRegistration detokenize_reg{
    "detokenize", "Turn token ids back into text", [](CLI::App& app) {
      auto o = std::make_shared<DetokenizeOptions>();
      app.add_option("-m,--model", o->model,
                     "GGUF file, Hugging Face directory or model name (default model if empty)");
      app.add_flag("--show-special", o->show_special,
                   "write control tokens (<s>, <|im_end|>, ...)");
      app.add_option("ids", o->ids, "token ids")->required();
      return [o] { return run_detokenize(*o); };
    }};

}  // namespace
}  // namespace hablar::cli
