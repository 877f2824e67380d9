// `hablar embed -m MODEL [-p TEXT]... [-f FILE] [--pooling P] [--embd-normalize N] [--json]`:
// embeddings of texts on the command line (each -p, or each line of FILE; "-" reads standard
// input), printed one vector per line (space-separated floats) or as one JSON document. The
// inputs run together in embedding steps of up to --batch-tokens tokens, on the CPU or the
// device --device names (auto: CUDA when present and it can embed the model, else the CPU).
// `--bench NxL` embeds N seeded random inputs of L tokens instead (after one warm-up pass)
// and prints inputs/s and tokens/s: `hablar embed -m bert.gguf --device cuda --bench 512x128`.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/command.h"
#include "cli/load_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/paths.h"
#include "engine/cpu_executor.h"
#include "engine/embedding.h"
#include "engine/executor_factory.h"
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
  std::string device = "cpu";
  std::string bench;  // "NxL": N random inputs of L tokens, timed
  int bench_reps = 3;
  bool profile = false;  // device time per kind of op (CUDA), printed at the end
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
  return c.embedding_only ? Pooling::kMean : Pooling::kLast;
}

// The executor that embeds: --device's, falling back to the CPU on auto when the GPU cannot
// embed the model (the reason logged); --device cuda then is an error naming it.
std::unique_ptr<engine::StepExecutor> embed_executor(const model::Model& m, const EmbedOptions& o) {
  const auto cpu = [&] {  // one KV block: embedding steps keep no cache
    return std::make_unique<engine::CpuExecutor>(m, 1, kDefaultKvBlockSize, o.n_threads);
  };
  engine::ExecutorOptions eo;
  eo.device = engine::device_kind_from_name(o.device);
  if (eo.device == engine::DeviceKind::kCpu) return cpu();
  eo.n_threads = o.n_threads;
  eo.kv_tokens = 2048;  // (embedding steps keep no cache; a decoder's executor makes a small one)
  eo.cuda.max_seq_len = eo.kv_tokens;
  eo.cuda.max_step_tokens = 512;
  eo.cuda.profile_embeddings = o.profile;
  std::unique_ptr<engine::StepExecutor> ex = engine::make_executor(m, eo);
  std::string why;
  if (ex->can_embed(&why)) return ex;
  if (eo.device == engine::DeviceKind::kCuda)
    throw_error(ErrorKind::kUnsupported, "--device cuda: " + why);
  log::info("embedding on the CPU: {}", why);
  ex.reset();
  return cpu();
}

// Runs the inputs in steps of up to batch_tokens tokens; each step's vectors to `sink`.
template <typename Sink>
void embed_in_steps(engine::StepExecutor& ex, const std::vector<std::vector<int32_t>>& inputs,
                    Pooling pooling, int batch_tokens, const Sink& sink) {
  engine::EmbedOutput result;
  for (size_t first = 0; first < inputs.size();) {
    std::vector<engine::EmbedChunk> chunks;
    int64_t tokens = 0;
    size_t i = first;
    for (; i < inputs.size(); ++i) {
      if (!chunks.empty() && tokens + (int64_t)inputs[i].size() > batch_tokens) break;
      chunks.push_back({inputs[i], pooling});
      tokens += (int64_t)inputs[i].size();
    }
    ex.embed(chunks, result);
    sink(first, chunks, result);
    first = i;
  }
}

// --bench NxL: throughput over seeded random token ids, after one untimed pass.
int run_embed_bench(const model::Model& m, engine::StepExecutor& ex, Pooling pooling,
                    const EmbedOptions& o) {
  int n = 0, len = 0;
  if (std::sscanf(o.bench.c_str(), "%dx%d", &n, &len) != 2 || n < 1 || len < 1)
    throw_error(ErrorKind::kInvalidArgument, "--bench: N x L as in 512x128");
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> id(0, m.config().n_vocab - 1);
  std::vector<std::vector<int32_t>> inputs((size_t)n, std::vector<int32_t>((size_t)len));
  for (auto& in : inputs)
    for (int32_t& t : in) t = id(rng);
  const auto nothing = [](size_t, const auto&, const auto&) {};
  embed_in_steps(ex, inputs, pooling, o.batch_tokens, nothing);  // warm-up: buffers, cuBLAS
  double best = 1e30;
  for (int r = 0; r < std::max(o.bench_reps, 1); ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    embed_in_steps(ex, inputs, pooling, o.batch_tokens, nothing);
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf(
      "embed bench: %s, device %s, %d inputs x %d tokens, steps of %d tokens, pooling %s: "
      "%.1f ms, %.0f inputs/s, %.0f tokens/s (best of %d)\n",
      m.config().arch.c_str(), ex.device_name().c_str(), n, len, o.batch_tokens,
      std::string(pooling_name(pooling)).c_str(), best * 1e3, n / best, (double)n * len / best,
      std::max(o.bench_reps, 1));
  return 0;
}

int run_embed(const EmbedOptions& o) {
  std::vector<std::string> texts = o.prompts;
  if (!o.file.empty())
    for (std::string& line : read_lines(o.file)) texts.push_back(std::move(line));
  if (texts.empty() && o.bench.empty())
    throw_error(ErrorKind::kInvalidArgument, "nothing to embed: give -p or -f");
  if (o.batch_tokens < 1) throw_error(ErrorKind::kInvalidArgument, "--batch-tokens must be >= 1");
  const auto m = model::Model::load(resolve_model_path(o.model), o.load.options(o.n_threads));
  const Pooling pooling = pooling_for(m->config(), o.pooling);
  const std::unique_ptr<engine::StepExecutor> executor = embed_executor(*m, o);
  if (!o.bench.empty()) return run_embed_bench(*m, *executor, pooling, o);
  std::vector<std::vector<int32_t>> inputs;
  for (const std::string& t : texts) inputs.push_back(m->tokenizer().encode(t, true, true));
  nlohmann::json out = nlohmann::json::array();
  embed_in_steps(
      *executor, inputs, pooling, o.batch_tokens,
      [&](size_t first, const std::vector<engine::EmbedChunk>& chunks,
          const engine::EmbedOutput& result) {
        for (size_t c = 0; c < chunks.size(); ++c) {
          std::vector<float> v(result.values.begin() + result.begin[c],
                               result.values.begin() + result.begin[c + 1]);
          if (pooling != Pooling::kRank) engine::normalize_embedding(v, o.normalize);
          if (o.json) {
            out.push_back(
                {{"index", first + c}, {"n_tokens", chunks[c].tokens.size()}, {"embedding", v}});
          } else {
            std::string line;
            for (size_t k = 0; k < v.size(); ++k)
              line += fmt::format("{}{:.6g}", k ? " " : "", v[k]);
            std::printf("%s\n", line.c_str());
          }
        }
      });
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
      app.add_option("--device", o->device,
                     "cpu, cuda, or auto (CUDA when present and able to embed the model)")
          ->capture_default_str();
      app.add_option("--bench", o->bench,
                     "NxL: time N random inputs of L tokens instead (prints inputs/s)");
      app.add_option("--bench-reps", o->bench_reps, "timed passes of --bench (the best is shown)")
          ->capture_default_str();
      app.add_flag("--profile", o->profile,
                   "on the GPU: device time per kind of op (products, attention, norms), printed "
                   "at the end");
      o->load.add_to(app);
      return [o] { return run_embed(*o); };
    }};

}  // namespace
}  // namespace hablar::cli
