// Sampler flags `run` and `serve` share beyond the usual ones (llama.cpp's names):
// --top-n-sigma, --xtc-probability, --xtc-threshold and DRY's --dry-multiplier, --dry-base,
// --dry-allowed-length, --dry-penalty-last-n (engine/sampler.h, engine/dry_penalty.h).
// DRY's sequence breakers are llama-server's defaults, resolved against the model's
// vocabulary by the command once it is loaded (server/dry_breakers.h).
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
  app.add_option("--mirostat", p.mirostat, "Mirostat sampling: 0 off, 1 or 2 (replaces top-k/p)")
      ->capture_default_str();
  app.add_option("--mirostat-ent", p.mirostat_tau, "Mirostat target surprise tau")
      ->capture_default_str();
  app.add_option("--mirostat-lr", p.mirostat_eta, "Mirostat learning rate eta")
      ->capture_default_str();
  app.add_option("--dry-multiplier", p.dry.multiplier, "DRY repetition penalty strength (0: off)")
      ->capture_default_str();
  app.add_option("--dry-base", p.dry.base, "DRY: penalty base, raised to the repetition's excess")
      ->capture_default_str();
  app.add_option("--dry-allowed-length", p.dry.allowed_length,
                 "DRY: repetitions up to this many tokens go unpunished")
      ->capture_default_str();
  app.add_option("--dry-penalty-last-n", p.dry.penalty_last_n,
                 "DRY: tokens of history scanned (-1: all, 0: off)")
      ->capture_default_str();
}

}  // namespace hablar::cli
