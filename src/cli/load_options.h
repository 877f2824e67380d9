// The flag that changes how a model is loaded (run, serve, bench, perplexity):
// --quantize TYPE converts a Hugging Face checkpoint's weight matrices at load.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "formats/hf_model.h"

namespace hablar::cli {

struct LoadFlags {
  std::string quantize;

  void add_to(CLI::App& app) {
    app.add_option("--quantize", quantize,
                   "Hugging Face directories: convert the weight matrices to this type at load "
                   "(q8_0, q4_k, q6_k, q4_0, ...); without it F32/F16/BF16 run as stored");
  }
  formats::HfOpenOptions options(int n_threads) const {
    formats::HfOpenOptions o;
    o.n_threads = n_threads;
    if (quantize.empty()) return o;
    o.quantize = dtype_from_name(quantize);
    if (!o.quantize)
      throw_error(ErrorKind::kInvalidArgument, "--quantize: unknown type '" + quantize + "'");
    return o;
  }
};

}  // namespace hablar::cli
