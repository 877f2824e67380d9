// `hablar quantize IN OUT TYPE`: a model (GGUF, Hugging Face directory or APR) rewritten as
// a GGUF file of one of llama-quantize's types, byte-identical to llama.cpp's quantizer
// without an importance matrix (formats/quantize.h).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "cli/command.h"
#include "core/error.h"
#include "core/paths.h"
#include "formats/hf_model.h"
#include "formats/quantize.h"

namespace hablar::cli {
namespace {

struct QuantizeCliOptions {
  std::string input, output, type;
  int n_threads = 0;
  bool allow_requantize = false;
  bool quiet = false;
};

// One line per tensor: "[  3/ 30] blk.0.attn_k.weight  [576, 192]  f16 -> q5_0".
void print_progress(const formats::QuantizeProgress& p) {
  const formats::QuantizedTensorPlan& t = *p.tensor;
  const bool same = t.type == t.source->type;
  std::fprintf(stderr, "[%4d/%4d] %-36s %-16s %6s%s%s\n", p.index, p.count, t.source->name.c_str(),
               t.source->shape_string().c_str(), std::string(dtype_name(t.source->type)).c_str(),
               same ? "" : " -> ", same ? "" : std::string(dtype_name(t.type)).c_str());
}

int run_quantize(const QuantizeCliOptions& o) {
  const std::optional<formats::Ftype> ftype = formats::ftype_from_name(o.type);
  if (!ftype)
    throw_error(ErrorKind::kInvalidArgument,
                "quantize: unknown type '" + o.type + "' (one of: " + formats::ftype_names() + ")");
  if (!o.output.ends_with(".gguf"))
    throw_error(ErrorKind::kInvalidArgument, "quantize: the output must end in .gguf: " + o.output);
  const std::string in = resolve_model_path(o.input);
  const gguf::GgufFile source = formats::open_model_file(in);
  // A Hugging Face directory is written as `hablar convert` writes it (llama.cpp's layout):
  // quantizing it gives the bytes of converting it first and quantizing that GGUF.
  const gguf::GgufFile f = formats::llama_cpp_layout(source);
  formats::QuantizeOptions qo;
  qo.n_threads = o.n_threads;
  qo.allow_requantize = o.allow_requantize;
  if (!o.quiet) qo.progress = print_progress;
  const auto start = std::chrono::steady_clock::now();
  const gguf::GgufWriter w = formats::quantize_model(f, *ftype, qo);
  w.write(o.output);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  uint64_t in_bytes = 0;
  for (const gguf::TensorInfo& t : f.tensors()) in_bytes += t.nbytes;
  const double in_mib = (double)in_bytes / (1 << 20);
  const double out_mib = (double)std::filesystem::file_size(o.output) / (1 << 20);
  std::fprintf(stderr, "wrote %s (%s): tensors %.2f MiB -> file %.2f MiB in %.2f s\n",
               o.output.c_str(), formats::ftype_name(*ftype).c_str(), in_mib, out_mib, seconds);
  return 0;
}

const CommandRegistration registration{
    "quantize", "Quantize a model to a GGUF file of a llama-quantize type (Q4_K_M, Q8_0, ...)",
    [](CLI::App& app) {
      auto o = std::make_shared<QuantizeCliOptions>();
      app.add_option("input", o->input,
                     "a .gguf (F32/F16/BF16) or .apr file, a Hugging Face directory, or a name")
          ->required();
      app.add_option("output", o->output, "OUT.gguf")->required();
      app.add_option("type", o->type, "llama-quantize's type name: " + formats::ftype_names())
          ->required();
      app.add_option("-t,--threads", o->n_threads, "threads (0 = all cores)");
      app.add_flag("--allow-requantize", o->allow_requantize,
                   "accept already-quantized tensors (dequantized first; loses accuracy)");
      app.add_flag("-q,--quiet", o->quiet, "no per-tensor progress lines");
      return [o] { return run_quantize(*o); };
    }};

}  // namespace
}  // namespace hablar::cli
