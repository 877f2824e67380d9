// `hablar perplexity`: perplexity of a text, computed as llama.cpp's perplexity tool does:
// the text's tokens (with BOS when the vocabulary adds one) are cut into chunks of n_ctx; each
// chunk starts with BOS in place of its first token, is evaluated from an empty cache, and
// the second half of its positions are scored (each predicts the next token).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/device_options.h"
#include "cli/load_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/paths.h"
#include "engine/perplexity.h"
#include "engine/sampler.h"
#include "model/model.h"

namespace hablar::cli {
namespace {

struct PerplexityOptions {
  std::string model;
  LoadFlags load;  // --quantize
  std::string file;
  int n_ctx = 512;
  int n_threads = 0;
  int n_batch = 512;
  int max_chunks = 0;
  DeviceFlags device;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error(ErrorKind::kNotFound, "cannot open text file " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int run_perplexity(const PerplexityOptions& o) {
  if (o.n_ctx < 4)
    throw_error(ErrorKind::kInvalidArgument, "-c must be >= 4, got " + std::to_string(o.n_ctx));
  auto m = model::Model::load(resolve_model_path(o.model), o.load.options(o.n_threads));
  model::check_context(m->config(), o.n_ctx, "-c/--ctx-size");
  const std::string text = read_file(o.file);
  auto executor = engine::make_executor(*m, o.device.options(o.n_threads, o.n_ctx, o.n_batch));
  log::info("{}", executor->describe());
  const engine::PerplexityResult r = engine::perplexity(
      *m, *executor, text, o.n_ctx, o.n_batch, o.max_chunks, [](int chunk, double ppl) {
        std::fprintf(stderr, "[%d]%.4f,", chunk + 1, ppl);
        std::fflush(stderr);
      });
  std::fprintf(stderr, "\n");
  std::printf("Final estimate: PPL = %.4f +/- %.5f (%d chunks of %d tokens, %lld scored)\n", r.ppl,
              r.ppl_stderr, r.n_chunks, o.n_ctx, (long long)r.n_scored);
  return 0;
}

CommandRegistration reg{
    "perplexity",
    "Perplexity of a model on a text file",
    [](CLI::App& app) {
      auto o = std::make_shared<PerplexityOptions>();
      app.add_option("-m,--model", o->model, "model path or name (default model when omitted)");
      o->load.add_to(app);
      app.add_option("-f,--file", o->file, "text file")->required();
      o->device.add_to(app);
      app.add_option("-c,--ctx-size", o->n_ctx, "tokens per chunk")->capture_default_str();
      app.add_option("-t,--threads", o->n_threads, "threads (0 = all cores)")
          ->capture_default_str();
      app.add_option("-b,--batch-size", o->n_batch, "tokens per forward call")
          ->capture_default_str();
      app.add_option("--chunks", o->max_chunks, "score at most this many chunks (0 = all)")
          ->capture_default_str();
      return [o] { return run_perplexity(*o); };
    },
    {{"-ngl", "--n-gpu-layers"}, {"-ctk", "--cache-type-k"}, {"-ctv", "--cache-type-v"}}};

}  // namespace
}  // namespace hablar::cli
