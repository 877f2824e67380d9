// `hablar bench --spec-type ...`: generation speed through the engine with and without
// speculative decoding, on one prompt (-f FILE, else random tokens), greedy, each -r times.
#pragma once

#include <string>
#include <vector>

#include "cli/spec_options.h"
#include "engine/executor.h"
#include "model/model.h"

namespace hablar::cli {

struct SpecBenchRow {
  std::string name;                // "tg128 none", "tg128 ngram"
  std::vector<double> samples_ts;  // decode tokens/s (first token to last), per run
  int64_t drafted = 0, accepted = 0;
};

// Runs n_gen greedy tokens after `prompt` through an engine on `executor`, once plain and once
// with the drafter `spec` makes, `repetitions` times each (after one warm-up run).
std::vector<SpecBenchRow> bench_speculation(const model::Model& m, engine::StepExecutor& executor,
                                            const SpecFlags& spec,
                                            const formats::HfOpenOptions& load, int n_threads,
                                            const std::vector<int32_t>& prompt, int n_gen,
                                            int repetitions);

}  // namespace hablar::cli
