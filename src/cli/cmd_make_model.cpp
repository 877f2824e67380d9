// `hablar make-model`: writes a GGUF with seeded random weights in the tensor layout and
// metadata of a real Llama- or Qwen-family model (see formats/synthetic_model.h).
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "core/error.h"
#include "formats/synthetic_model.h"

namespace hablar::cli {
namespace {

struct MakeModelOptions {
  std::string arch = "llama";
  std::string shape = "tiny";
  std::string type = "f16";
  std::string vocab;
  std::string output;
  uint64_t seed = 0;
  int n_threads = 0;
  bool exact = false;
  std::string rope_scaling;
  double rope_factor = 1.0;
  int64_t rope_original_context = 0;
  int64_t sliding_window = 0;
  std::string pooling;
  bool rank_head = false;
};

std::string shape_names() {
  std::string names;
  for (const synth::ModelShape& s : synth::known_shapes())
    names += (names.empty() ? "" : ", ") + s.name;
  return names;
}

// The architectures --arch takes (synth::arch_from_name's names).
constexpr const char* kArchNames =
    "llama, qwen2, qwen3, gemma, gemma2, gemma3, gemma-embedding, mixtral, qwen2moe, qwen3moe, "
    "phi2, phi3, smollm3, granite, granitemoe, ernie4_5, olmo2, starcoder2, exaone4, "
    "hunyuan-dense, glm4, arcee, mistral3, exaone, xverse, seed_oss, command-r, cohere2, minicpm, "
    "olmoe, internlm2, orion, nemotron, stablelm, bert or nomic-bert";

int run_make_model(const MakeModelOptions& o) {
  synth::SyntheticModelOptions opts;
  const auto arch = synth::arch_from_name(o.arch);
  if (!arch)
    throw_error(ErrorKind::kInvalidArgument,
                "--arch: unknown architecture '" + o.arch + "' (" + std::string(kArchNames) + ")");
  const auto shape = synth::shape_from_name(o.shape);
  if (!shape)
    throw_error(ErrorKind::kInvalidArgument,
                "--shape: unknown shape '" + o.shape + "' (" + shape_names() + ")");
  if (o.n_threads < 0)
    throw_error(ErrorKind::kInvalidArgument, "--threads must be >= 0 (0 = all cores)");
  opts.arch = *arch;
  opts.shape = *shape;
  opts.type = o.type;
  opts.vocab_path = o.vocab;
  opts.seed = o.seed;
  opts.n_threads = o.n_threads;
  opts.exact_quantization = o.exact;
  opts.pooling = o.pooling;
  opts.rank_head = o.rank_head;
  if (!o.rope_scaling.empty() && o.rope_scaling != "linear" && o.rope_scaling != "yarn" &&
      o.rope_scaling != "longrope")
    throw_error(ErrorKind::kInvalidArgument, "--rope-scaling: linear, yarn or longrope");
  if (!(o.rope_factor >= 1.0 && o.rope_factor <= 1024.0) || o.rope_original_context < 0)
    throw_error(ErrorKind::kInvalidArgument, "--rope-factor must be in [1, 1024]");
  opts.rope_scaling = o.rope_scaling;
  opts.rope_factor = o.rope_factor;
  opts.rope_original_context = o.rope_original_context;
  if (o.sliding_window < 0 || o.sliding_window > (1 << 30))
    throw_error(ErrorKind::kInvalidArgument, "--sliding-window must be in [0, 2^30]");
  opts.sliding_window = o.sliding_window;

  const auto t0 = std::chrono::steady_clock::now();
  const synth::SyntheticModelSummary sum = synth::write_synthetic_model(opts, o.output);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr,
               "wrote %s: %s %s %s, %zu tensors, %.1f M params, vocabulary %lld, %.1f MiB "
               "(%.2f bits/weight) in %.1f s\n",
               o.output.c_str(), o.arch.c_str(), o.shape.c_str(), o.type.c_str(), sum.n_tensors,
               (double)sum.n_params / 1e6, (long long)sum.vocab_size,
               (double)sum.n_bytes / (1024.0 * 1024.0),
               8.0 * (double)sum.n_bytes / (double)sum.n_params, secs);
  return 0;
}

const CommandRegistration registration{
    "make-model", "Write a GGUF with seeded random weights in a real model's shape",
    [](CLI::App& app) {
      auto o = std::make_shared<MakeModelOptions>();
      app.add_option("--arch", o->arch, kArchNames)->capture_default_str();
      app.add_option("--shape", o->shape, shape_names())->capture_default_str();
      app.add_option("--type", o->type,
                     "tensor type (f32, f16, bf16, q8_0, q4_0, q4_k, ...) or mix (q4_k_m, q5_k_m)")
          ->capture_default_str();
      app.add_option("--vocab", o->vocab,
                     "vocabulary GGUF whose tokenizer.* keys are copied (default: synthetic)");
      app.add_option("--seed", o->seed, "random seed")->capture_default_str();
      app.add_option("--rope-scaling", o->rope_scaling,
                     "RoPE scaling metadata: linear, yarn or longrope (phi3: short and long "
                     "factors, with --rope-original-context)");
      app.add_option("--rope-factor", o->rope_factor, "RoPE scaling factor")->capture_default_str();
      app.add_option("--rope-original-context", o->rope_original_context,
                     "original context of the RoPE scaling (0: the shape's)");
      app.add_option("--sliding-window", o->sliding_window,
                     "attention window: llama (Mistral-style, every layer), gemma2/gemma3 (their "
                     "local layers); 0: the shape's");
      app.add_option("-t,--threads", o->n_threads, "threads (0 = all cores)")
          ->capture_default_str();
      app.add_flag("--exact", o->exact,
                   "quantize every row of K-quant/IQ4 tensors (slow) instead of assembling "
                   "large ones from a seeded pool of quantized blocks");
      app.add_option("--pooling", o->pooling,
                     "<arch>.pooling_type: none, mean, cls, last or rank (default: mean for "
                     "encoders, rank with --rank-head; unset for decoders)");
      app.add_flag("--rank-head", o->rank_head,
                   "encoders: add a reranker's classifier head (cls, cls.output)");
      app.add_option("-o,--output", o->output, "output GGUF path")->required();
      return [o] { return run_make_model(*o); };
    }};

}  // namespace
}  // namespace hablar::cli
