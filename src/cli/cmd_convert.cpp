// `hablar convert IN OUT`: a model from any source hablar reads (.gguf, .apr, a Hugging Face
// directory) written as GGUF or APR v2, chosen by OUT's extension. Tensor bytes are copied
// through (or converted first with --quantize, for Hugging Face directories).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "cli/command.h"
#include "cli/load_options.h"
#include "core/error.h"
#include "core/paths.h"
#include "formats/apr.h"
#include "formats/gguf.h"
#include "formats/hf_model.h"

namespace hablar::cli {
namespace {

struct ConvertOptions {
  std::string input, output;
  LoadFlags load;
  int n_threads = 0;
};

void write_file(const std::string& path, const std::string_view bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out.write(bytes.data(), (std::streamsize)bytes.size());
    if (!out) throw_error(ErrorKind::kIo, tmp + ": write failed");
  }
  std::filesystem::rename(tmp, path);
}

// Every metadata key and tensor, the source-format marker left out, in the layout
// llama.cpp's converter writes (formats::llama_cpp_layout: a byte-level BPE tokenizer.json
// as tokenizer.ggml.* keys, the llama family's q/k rows in llama.cpp's order).
void write_gguf(const gguf::GgufFile& source, const std::string& path) {
  const gguf::GgufFile f = formats::llama_cpp_layout(source);
  gguf::GgufWriter w;
  for (const auto& [key, value] : f.metadata())
    if (key != "general.source.format") w.set(key, value);
  if (f.has("tokenizer.huggingface.json"))
    std::fprintf(stderr,
                 "note: the tokenizer stays as tokenizer.huggingface.json (not a byte-level BPE "
                 "llama.cpp names); llama.cpp cannot read this file's vocabulary\n");
  for (const gguf::TensorInfo& t : f.tensors()) {
    const gguf::TensorInfo* src = &t;
    w.add_tensor(t.name, t.type, t.dims, [src](std::span<uint8_t> out) {
      std::copy(src->data, src->data + src->nbytes, out.begin());
    });
  }
  w.write(path);
}

int run_convert(const ConvertOptions& o) {
  const std::string in = resolve_model_path(o.input);
  const gguf::GgufFile f = formats::open_model_file(in, o.load.options(o.n_threads));
  if (o.load.quantize.size() && !formats::is_hf_model_dir(in))
    throw_error(ErrorKind::kInvalidArgument,
                "--quantize converts Hugging Face directories; " + in + " is not one");
  if (o.output.ends_with(".gguf")) {
    write_gguf(f, o.output);
  } else if (o.output.ends_with(".apr")) {
    const std::vector<uint8_t> bytes = apr::from_gguf(f);
    write_file(o.output,
               std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    // A tokenizer.json travels beside an APR file (the APR reader looks for it there).
    if (f.has("tokenizer.huggingface.json") && !f.has("tokenizer.ggml.tokens"))
      write_file((std::filesystem::path(o.output).parent_path() / "tokenizer.json").string(),
                 f.get_string("tokenizer.huggingface.json"));
  } else {
    throw_error(ErrorKind::kInvalidArgument,
                "convert: the output must end in .gguf or .apr: " + o.output);
  }
  std::fprintf(stderr, "wrote %s (%zu tensors)\n", o.output.c_str(), f.tensors().size());
  return 0;
}

const CommandRegistration registration{
    "convert", "Write a model (GGUF, APR or Hugging Face directory) as GGUF or APR v2",
    [](CLI::App& app) {
      auto o = std::make_shared<ConvertOptions>();
      app.add_option("input", o->input,
                     "a .gguf or .apr file, a Hugging Face directory, or a model name")
          ->required();
      app.add_option("output", o->output, "OUT.gguf or OUT.apr")->required();
      o->load.add_to(app);
      app.add_option("-t,--threads", o->n_threads, "threads for --quantize (0 = all cores)");
      return [o] { return run_convert(*o); };
    }};

}  // namespace
}  // namespace hablar::cli
