#include "cli/bench_spec.h"

#include <chrono>

#include "core/error.h"
#include "engine/engine.h"

namespace hablar::cli {
namespace {

struct Timed {
  double tps = 0;
  int32_t drafted = 0, accepted = 0;
};

Timed generate_once(engine::Engine& eng, const std::vector<int32_t>& prompt, int n_gen) {
  engine::GenerateRequest req;
  req.prompt = prompt;
  req.max_tokens = n_gen;
  req.ignore_eos = true;  // always n_gen tokens, as llama-bench's tg
  auto h = eng.submit(std::move(req));
  std::vector<engine::StreamItem> items;
  for (;;) {
    items.clear();
    h->wait(items, std::chrono::milliseconds(1000));
    for (const auto& it : items)
      if (it.kind == engine::StreamItem::Kind::kFinal) {
        if (it.finish_reason == engine::FinishReason::kError)
          throw_error(ErrorKind::kInternal, "generation failed: " + it.error);
        Timed t;
        t.tps = it.decode_ms > 0 ? 1e3 * (it.n_generated - 1) / it.decode_ms : 0;
        t.drafted = it.n_drafted;
        t.accepted = it.n_draft_accepted;
        return t;
      }
  }
}

}  // namespace

std::vector<SpecBenchRow> bench_speculation(const model::Model& m, engine::StepExecutor& executor,
                                            const SpecFlags& spec,
                                            const formats::HfOpenOptions& load, int n_threads,
                                            const std::vector<int32_t>& prompt, int n_gen,
                                            int repetitions) {
  std::vector<SpecBenchRow> rows;
  const int32_t capacity = executor.n_kv_blocks() * executor.kv_block_size();
  if ((int32_t)prompt.size() + n_gen > capacity)
    throw_error(ErrorKind::kInvalidArgument, "the prompt and -n do not fit the KV cache");
  for (bool speculate : {false, true}) {
    engine::EngineConfig ec;
    ec.n_ctx = capacity;
    ec.scheduler.max_running = 1;
    if (speculate) {
      ec.draft = spec.params();
      ec.drafter = spec.make(m, executor, load, n_threads, capacity);
    }
    engine::Engine eng(ec, executor);
    SpecBenchRow row;
    row.name = "tg" + std::to_string(n_gen) + " " + (speculate ? spec.type : std::string("none"));
    generate_once(eng, prompt, n_gen);  // warm-up (and the prompt in the prefix cache)
    for (int r = 0; r < repetitions; ++r) {
      const Timed t = generate_once(eng, prompt, n_gen);
      row.samples_ts.push_back(t.tps);
      row.drafted += t.drafted;
      row.accepted += t.accepted;
    }
    eng.shutdown(std::chrono::milliseconds(0));
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace hablar::cli
