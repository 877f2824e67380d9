// Sampler flags `run` and `serve` share beyond the usual ones (llama.cpp's names):
// --top-n-sigma, --xtc-probability, --xtc-threshold (engine/sampler.h says what they do).
#pragma once

#include <CLI/CLI.hpp>

#include "engine/sampler.h"

namespace hablar::cli {

inline void add_extra_sampler_flags(CLI::App& app, engine::SamplingParams& p) {
  app.add_option("--top-n-sigma", p.top_n_sigma,
                 "keep logits within n standard deviations of the best (<= 0: off)")
      ->capture_default_str();
  app.add_option("--xtc-probability", p.xtc_probability,
                 "XTC: chance of dropping the most likely tokens (0: off)")
      ->capture_default_str();
  app.add_option("--xtc-threshold", p.xtc_threshold,
                 "XTC: tokens at least this likely are the ones dropped (above 0.5: off)")
      ->capture_default_str();
}

}  // namespace hablar::cli
