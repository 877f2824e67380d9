// `hablar embed -m MODEL [-p TEXT]... [-f FILE] [--pooling P] [--embd-normalize N] [--json]`:
// embeddings of texts on the command line (each -p, or each line of FILE; "-" reads standard
// input), printed one vector per line (space-separated floats) or as one JSON document. The
// inputs run together in embedding steps of up to --batch-tokens tokens on the CPU.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/command.h"
#include "cli/load_options.h"
#include "core/error.h"
#include "core/paths.h"
#include "engine/cpu_executor.h"
#include "engine/embedding.h"
#include "model/model.h"

namespace hablar::cli {
namespace {

struct EmbedOptions {
  std::string model;
  std::vector<std::string> prompts;
  std::string file;
  std::string pooling;
  int normalize = 2;
  bool json = false;
  int n_threads = 0;
  int batch_tokens = 8192;
  LoadFlags load;
};

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream file_in;
  if (path != "-") {
    file_in.open(path);
    if (!file_in) throw_error(ErrorKind::kIo, "cannot read " + path);
  }
  std::istream& in = path == "-" ? std::cin : file_in;
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

// The pooling a model embeds with: the flag, else the file's <arch>.pooling_type, else mean
// for encoders and last for decoders (Qwen3-Embedding and most decoder embedders).
Pooling pooling_for(const model::ModelConfig& c, const std::string& flag) {
  if (!flag.empty()) {
    const auto p = pooling_from_name(flag);
    if (!p) throw_error(ErrorKind::kInvalidArgument, "--pooling: none, mean, cls, last or rank");
    return *p;
  }
  if (c.pooling) return *c.pooling;
  return c.encoder ? Pooling::kMean : Pooling::kLast;
}

int run_embed(const EmbedOptions& o) {
  std::vector<std::string> texts = o.prompts;
  if (!o.file.empty())
    for (std::string& line : read_lines(o.file)) texts.push_back(std::move(line));
  if (texts.empty()) throw_error(ErrorKind::kInvalidArgument, "nothing to embed: give -p or -f");
  if (o.batch_tokens < 1) throw_error(ErrorKind::kInvalidArgument, "--batch-tokens must be >= 1");
  const auto m = model::Model::load(resolve_model_path(o.model), o.load.options(o.n_threads));
  const Pooling pooling = pooling_for(m->config(), o.pooling);
  engine::CpuExecutor executor(*m, 1, kDefaultKvBlockSize, o.n_threads);
  std::vector<std::vector<int32_t>> inputs;
  for (const std::string& t : texts) inputs.push_back(m->tokenizer().encode(t, true, true));
  nlohmann::json out = nlohmann::json::array();
  engine::EmbedOutput result;
  for (size_t first = 0; first < inputs.size();) {
    std::vector<engine::EmbedChunk> chunks;
    int64_t tokens = 0;
    size_t i = first;
    for (; i < inputs.size(); ++i) {
      if (!chunks.empty() && tokens + (int64_t)inputs[i].size() > o.batch_tokens) break;
      chunks.push_back({inputs[i], pooling});
      tokens += (int64_t)inputs[i].size();
    }
    executor.embed(chunks, result);
    for (size_t c = 0; c < chunks.size(); ++c) {
      std::vector<float> v(result.values.begin() + result.begin[c],
                           result.values.begin() + result.begin[c + 1]);
      if (pooling != Pooling::kRank) engine::normalize_embedding(v, o.normalize);
      if (o.json) {
        out.push_back(
            {{"index", first + c}, {"n_tokens", chunks[c].tokens.size()}, {"embedding", v}});
      } else {
        std::string line;
        for (size_t k = 0; k < v.size(); ++k) line += fmt::format("{}{:.6g}", k ? " " : "", v[k]);
        std::printf("%s\n", line.c_str());
      }
    }
    first = i;
  }
  if (o.json) {
    const nlohmann::json doc = {
        {"model", o.model}, {"pooling", pooling_name(pooling)}, {"data", out}};
    std::printf("%s\n", doc.dump().c_str());
  }
  return 0;
}

const CommandRegistration registration{
    "embed", "Print the embeddings of texts (encoders and decoder embedders)", [](CLI::App& app) {
      auto o = std::make_shared<EmbedOptions>();
      app.add_option("-m,--model", o->model, "model GGUF (or Hugging Face directory)")->required();
      app.add_option("-p,--prompt", o->prompts, "a text to embed (repeatable)");
      app.add_option("-f,--file", o->file, "a file of texts, one per line ('-': stdin)");
      app.add_option("--pooling", o->pooling,
                     "none, mean, cls, last or rank (default: the model's, else mean for "
                     "encoders and last for decoders)");
      app.add_option("--embd-normalize", o->normalize,
                     "-1 none, 0 max-abs to int16, 1 taxicab, 2 Euclidean, >2 p-norm")
          ->capture_default_str();
      app.add_flag("--json", o->json, "one JSON document: {model, pooling, data: [...]}");
      app.add_option("-t,--threads", o->n_threads, "CPU threads (0 = all cores)")
          ->capture_default_str();
      app.add_option("--batch-tokens", o->batch_tokens, "tokens per embedding step")
          ->capture_default_str();
      o->load.add_to(app);
      return [o] { return run_embed(*o); };
    }};

}  // namespace
}  // namespace hablar::cli
