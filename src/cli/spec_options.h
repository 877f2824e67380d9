// The speculative decoding flags of serve, run and bench, in llama-server's spelling:
// --spec-type none|ngram|draft|self, --model-draft (-md), --draft-max, --draft-min,
// --draft-p-min (and llama.cpp's newer --spec-draft-n-max / -n-min / -p-min), plus
// --spec-ngram-size-n (the longest n-gram prompt lookup matches) and --spec-self-skip (the
// layers self-speculation skips).
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "engine/cpu_executor.h"
#include "engine/drafter_model.h"
#include "engine/drafter_ngram.h"
#include "engine/engine.h"
#include "model/model.h"

namespace hablar::cli {

struct SpecFlags {
  std::string type = "none";
  std::string model_draft;
  int draft_max = -1;  // -1: the drafter's default (ngram 16, draft 8, self 4)
  int draft_min = 0;
  float draft_p_min = 0.0f;
  int ngram_size_n = 8;
  std::string self_skip;  // empty: every other layer of the middle half

  void add_to(CLI::App& app) {
    app.add_option("--spec-type", type,
                   "speculative decoding: none, ngram (prompt lookup), draft (--model-draft), "
                   "self (skip layers of the model)")
        ->capture_default_str();
    app.add_option("--model-draft,--spec-draft-model", model_draft,
                   "draft model for --spec-type draft (-md); same vocabulary as the model");
    app.add_option("--draft-max,--draft,--draft-n,--spec-draft-n-max", draft_max,
                   "most tokens drafted per step (default: ngram 16, draft 8, self 4)");
    app.add_option("--draft-min,--draft-n-min,--spec-draft-n-min", draft_min,
                   "a shorter draft is not verified")
        ->capture_default_str();
    app.add_option("--draft-p-min,--spec-draft-p-min", draft_p_min,
                   "a draft model stops drafting below this top-token probability")
        ->capture_default_str();
    app.add_option("--spec-ngram-size-n", ngram_size_n,
                   "ngram: longest n-gram looked up (down to 2)")
        ->capture_default_str();
    app.add_option("--spec-self-skip", self_skip,
                   "self: layers to skip, e.g. 8-20 or 9,11,13 (default: every other layer of "
                   "the middle half)");
  }

  engine::SpecType spec_type() const {
    engine::SpecType t = engine::spec_type_from_name(type);
    if (t == engine::SpecType::kNone && !model_draft.empty()) t = engine::SpecType::kDraft;
    return t;
  }

  // The engine's default draft lengths (checked).
  engine::DraftParams params() const {
    engine::DraftParams p;
    const engine::SpecType t = spec_type();
    p.n_max = draft_max >= 0                  ? draft_max
              : t == engine::SpecType::kNgram ? 16
              : t == engine::SpecType::kDraft ? 8
                                              : 4;
    p.n_min = draft_min;
    p.p_min = draft_p_min;
    p.validate();
    return p;
  }

  // The drafter for `target` running on `executor` (null for none); a draft model is loaded
  // here (its vocabulary checked against the target's).
  std::shared_ptr<engine::Drafter> make(const model::Model& target, engine::StepExecutor& executor,
                                        const formats::HfOpenOptions& load, int n_threads,
                                        int32_t kv_tokens) const {
    const engine::SpecType t = spec_type();
    if (t != engine::SpecType::kDraft && !model_draft.empty())
      throw_error(ErrorKind::kInvalidArgument, "--model-draft needs --spec-type draft");
    if (t == engine::SpecType::kNone) return nullptr;
    if (t == engine::SpecType::kNgram)
      return std::make_shared<engine::NgramDrafter>(
          engine::NgramConfig{.size_n_max = ngram_size_n, .size_n_min = std::min(2, ngram_size_n)});
    engine::ModelDrafterOptions o;
    o.n_threads = n_threads;
    o.kv_tokens = kv_tokens;
    if (auto* cpu = dynamic_cast<engine::CpuExecutor*>(&executor)) o.pool = &cpu->thread_pool();
    std::shared_ptr<engine::ModelDrafter> d;
    if (t == engine::SpecType::kDraft) {
      if (model_draft.empty())
        throw_error(ErrorKind::kInvalidArgument, "--spec-type draft needs --model-draft PATH");
      d = std::make_shared<engine::ModelDrafter>(target, model::Model::load(model_draft, load), o);
    } else {
      const int n = target.config().n_layers;
      const std::string skip = self_skip.empty() ? engine::default_self_skip(n) : self_skip;
      d = std::make_shared<engine::ModelDrafter>(target, engine::kept_layers(skip, n), o);
    }
    log::info("{}", d->describe());
    return d;
  }
};

}  // namespace hablar::cli
