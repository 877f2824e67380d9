// `hablar run`: generate text from a prompt through the engine, on the CPU or a GPU. The generated
// text streams to stdout; logs and the closing speeds go to stderr. With --json, one JSON object
// with the prompt and generated ids and text is printed at the end instead. With --chat the
// prompt is the user's message of one chat turn, rendered with the model's chat template.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "chat/chat.h"
#include "cli/chat_loop.h"
#include "cli/chat_prompt.h"
#include "cli/command.h"
#include "cli/device_options.h"
#include "cli/load_options.h"
#include "cli/load_progress.h"
#include "cli/sampler_flags.h"
#include "cli/spec_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/paths.h"
#include "engine/engine.h"
#include "engine/request_sampler.h"
#include "engine/sampler.h"
#include "engine/text_filter.h"
#include "model/model.h"
#include "server/dry_breakers.h"

namespace hablar::cli {
namespace {

struct RunOptions {
  std::string model;
  LoadFlags load;              // --quantize
  std::string prompt;          // "-": read from standard input
  std::string prompt_file;     // -f
  int n_predict = 128;         // -1: until the context is full (or, shifting it, an end token)
  bool context_shift = false;  // --context-shift: a full context drops old tokens, goes on
  int n_keep = 0;              // --keep: prompt tokens a shift keeps (BOS not counted; -1 all)
  int64_t seed = -1;           // -1: random, printed
  int n_ctx = 0;               // 0: 4096, or the model's context when smaller
  int n_threads = 0;
  int n_batch = 512;
  bool json = false;
  bool chat = false;
  bool conversation = false;  // -cnv: the interactive chat (-p, if given, is the system message)
  std::string system;         // system message in chat mode
  std::string chat_template_file;  // overrides the model's template in chat mode
  std::vector<std::string> stop;
  engine::SamplingParams sampling;
  DeviceFlags device;
  SpecFlags spec;  // --spec-type, --model-draft, --draft-max, ...
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// -cnv: llama-cli's conversation mode is `hablar chat` with run's options.
int run_conversation(const RunOptions& o) {
  ChatOptions c;
  c.model = o.model;
  c.system = o.system.empty() ? o.prompt : o.system;
  c.chat_template_file = o.chat_template_file;
  c.n_predict = o.n_predict;
  c.n_ctx = o.n_ctx;
  c.n_threads = o.n_threads;
  c.n_batch = o.n_batch;
  c.seed = o.seed;
  c.sampling = o.sampling;
  c.device = o.device;
  return run_chat(c);
}

void check_options(const RunOptions& o) {
  if (o.n_predict <= 0 && o.n_predict != -1)
    throw_error(ErrorKind::kInvalidArgument,
                "-n (tokens to generate) must be > 0, or -1 for no limit but the context, got " +
                    std::to_string(o.n_predict));
  if (o.prompt.empty() == o.prompt_file.empty())
    throw_error(ErrorKind::kInvalidArgument,
                "give the prompt with -p TEXT (-p - reads standard input) or -f FILE, not both");
  if (o.n_ctx < 0)
    throw_error(ErrorKind::kInvalidArgument,
                "-c (context size) must be >= 0 (0: 4096, or the model's context when smaller), "
                "got " +
                    std::to_string(o.n_ctx));
  if (o.n_threads < 0)
    throw_error(ErrorKind::kInvalidArgument, "-t (threads) must be >= 0 (0 = all cores)");
  o.sampling.validate();
  if (!o.chat && (!o.system.empty() || !o.chat_template_file.empty()))
    throw_error(ErrorKind::kInvalidArgument, "--system and --chat-template-file need --chat");
}

// Runs the prompt through the engine (the same step loop, executor and sampling as `serve`)
// and streams the text as it comes.
// The prompt text: -p TEXT, -p - (standard input) or -f FILE.
std::string read_prompt(const RunOptions& o) {
  if (!o.prompt_file.empty()) return read_text_file(o.prompt_file, "prompt file");
  if (o.prompt != "-") return o.prompt;
  std::string text;
  char buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, stdin)) > 0;) text.append(buf, n);
  return text;
}

int run_generate(RunOptions o) {
  if (o.conversation) return run_conversation(o);
  check_options(o);
  o.prompt = read_prompt(o);
  if (o.seed < 0) {
    // A random seed unless one was given, printed so that a run can be repeated.
    o.sampling.seed = std::random_device{}();  // 32 bits, as llama.cpp's: easy to type back
    log::info("seed: {} (random; --seed to repeat)", o.sampling.seed);
  } else {
    o.sampling.seed = (uint64_t)o.seed;
  }
  const std::string path = resolve_model_path(o.model);
  warm_file_with_progress(path);
  auto m = model::Model::load(path, o.load.options(o.n_threads));
  const int n_ctx = model::context_for(m->config(), o.n_ctx, 4096, "-c/--ctx-size");
  const tokenizer::Tokenizer& tok = m->tokenizer();
  std::string prompt_text = o.prompt;
  std::vector<int32_t> prompt;
  if (o.chat) {
    const chat::ChatTemplate tmpl(chat_template_source(m->file(), o.chat_template_file));
    prompt_text = render_single_turn(tmpl, tok, o.system, o.prompt);
    log::debug("chat prompt: {}", prompt_text);
    prompt = encode_rendered_prompt(tok, prompt_text);
  } else {
    prompt = tok.encode(o.prompt, true, true);
  }
  if (prompt.empty()) throw_error(ErrorKind::kInvalidArgument, "the prompt is empty");
  if ((int)prompt.size() >= n_ctx)
    throw_error(ErrorKind::kInvalidArgument,
                "prompt is " + std::to_string(prompt.size()) + " tokens, the context holds " +
                    std::to_string(n_ctx) + " (raise -c or shorten the prompt)");

  auto executor = engine::make_executor(*m, o.device.options(o.n_threads, n_ctx, o.n_batch));
  log::info("{}", executor->describe());
  engine::EngineConfig ec;
  ec.n_ctx = n_ctx;
  ec.scheduler.max_running = 1;
  ec.scheduler.max_step_tokens = o.n_batch;
  ec.scheduler.max_prefill_chunk = o.n_batch;
  ec.is_eog = [&tok](int32_t t) { return tok.is_eog(t); };
  ec.draft = o.spec.params();
  ec.drafter = o.spec.make(*m, *executor, o.load.options(o.n_threads), o.n_threads, o.n_ctx);
  engine::Engine eng(ec, *executor);

  engine::GenerateRequest req;
  req.prompt = prompt;
  req.max_tokens = o.n_predict > 0   ? o.n_predict
                   : o.context_shift ? INT32_MAX
                                     : n_ctx - (int)prompt.size();
  if (o.context_shift)
    req.context_shift = engine::context_shift_keeping(o.n_keep, prompt, tok.bos_id(), 0);
  engine::SamplingParams sampling = o.sampling;
  if (sampling.dry.on() && !sampling.dry.breakers)
    sampling.dry.breakers = server::resolve_dry_breakers(tok, server::default_dry_breakers());
  req.sampler = std::make_unique<engine::ParamsSampler>(sampling, m->config().n_vocab);
  req.filter = std::make_unique<engine::TextFilter>(tok, o.stop);
  const auto t0 = Clock::now();
  std::shared_ptr<engine::RequestHandle> handle = eng.submit(std::move(req));

  std::vector<int32_t> generated;
  std::string text;
  engine::StreamItem final;
  double prompt_s = 0;
  auto emit = [&](const std::string& piece) {
    text += piece;
    if (!o.json && !piece.empty()) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
  };
  std::vector<engine::StreamItem> items;
  for (bool done = false; !done;) {
    items.clear();
    handle->wait(items, std::chrono::milliseconds(1000));
    for (engine::StreamItem& it : items) {
      if (it.kind == engine::StreamItem::Kind::kToken) {
        if (generated.empty()) prompt_s = seconds_since(t0);
        generated.push_back(it.token);
        emit(it.text);
      } else if (it.kind == engine::StreamItem::Kind::kFinal) {
        emit(it.text);
        final = std::move(it);
        done = true;
      }
    }
  }
  eng.shutdown(std::chrono::milliseconds(0));
  if (final.finish_reason == engine::FinishReason::kError)
    throw_error(ErrorKind::kInternal, "generation failed: " + final.error);
  const double total_s = seconds_since(t0);
  const double gen_s = std::max(total_s - prompt_s, 1e-9);
  // An end-of-generation token is not part of the output.
  if (!generated.empty() && tok.is_eog(generated.back())) generated.pop_back();
  const std::string finish = final.finish_reason == engine::FinishReason::kStop ? "stop" : "length";

  if (o.json) {
    nlohmann::json j;
    j["prompt"] = prompt_text;
    j["prompt_ids"] = prompt;
    j["generated_ids"] = generated;
    j["text"] = text;
    j["finish_reason"] = finish;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
  }
  std::fflush(stdout);
  std::fprintf(
      stderr,
      "prompt: %zu tokens in %.3f s (%.1f t/s); generated: %zu tokens in %.3f s (%.1f t/s)\n",
      prompt.size(), prompt_s, (double)prompt.size() / std::max(prompt_s, 1e-9), generated.size(),
      gen_s, (double)generated.size() / gen_s);
  if (final.n_drafted > 0)
    std::fprintf(stderr, "speculative (%s): %d drafted, %d accepted (%.1f%%)\n",
                 engine::spec_type_name(eng.spec_type()), final.n_drafted, final.n_draft_accepted,
                 100.0 * final.n_draft_accepted / final.n_drafted);
  return 0;
}

CommandRegistration reg{
    "run",
    "Generate text from a prompt",
    [](CLI::App& app) {
      auto o = std::make_shared<RunOptions>();
      app.add_option("-m,--model", o->model,
                     "model path or name in the model cache (default model when omitted)");
      o->load.add_to(app);
      app.add_option("-p,--prompt", o->prompt, "prompt text (-: read standard input)");
      app.add_option("-f,--file", o->prompt_file, "read the prompt from a file");
      app.add_option("-n,--n-predict", o->n_predict,
                     "tokens to generate (-1: until the context is full; with --context-shift, "
                     "until an end-of-generation token)")
          ->capture_default_str();
      app.add_flag("--context-shift,!--no-context-shift", o->context_shift,
                   "a full context keeps the first --keep prompt tokens, drops the older half "
                   "of the rest and goes on (llama-cli's flag)");
      app.add_option("--keep", o->n_keep,
                     "prompt tokens a context shift keeps, BOS not counted (-1: all)")
          ->check(CLI::Range(-1, INT32_MAX))
          ->capture_default_str();
      app.add_option("-c,--ctx-size", o->n_ctx,
                     "context size in tokens (0: 4096, or the model's context when smaller; more "
                     "than the model's context is an error)")
          ->capture_default_str();
      app.add_option("-t,--threads", o->n_threads, "threads (0 = all cores)")
          ->capture_default_str();
      app.add_option("-b,--batch-size", o->n_batch, "prompt tokens per forward call")
          ->capture_default_str();
      app.add_option("--temp", o->sampling.temperature, "temperature (0 = greedy)")
          ->capture_default_str();
      app.add_option("--top-k", o->sampling.top_k, "top-k (0 = off)")->capture_default_str();
      app.add_option("--top-p", o->sampling.top_p, "top-p in (0, 1]")->capture_default_str();
      app.add_option("--min-p", o->sampling.min_p, "min-p in [0, 1]")->capture_default_str();
      app.add_option("--typical", o->sampling.typical_p, "typical-p in (0, 1]")
          ->capture_default_str();
      app.add_option("--repeat-penalty", o->sampling.repeat_penalty, "repetition penalty (1 = off)")
          ->capture_default_str();
      app.add_option("--repeat-last-n", o->sampling.repeat_last_n,
                     "penalty window (-1 = all, 0 = off)")
          ->capture_default_str();
      app.add_option("--presence-penalty", o->sampling.presence_penalty, "presence penalty")
          ->capture_default_str();
      app.add_option("--frequency-penalty", o->sampling.frequency_penalty, "frequency penalty")
          ->capture_default_str();
      add_extra_sampler_flags(app, o->sampling);
      app.add_option("-s,--seed", o->seed, "RNG seed (-1: random, printed)")->capture_default_str();
      app.add_option("--stop", o->stop, "stop string (repeatable)");
      o->spec.add_to(app);
      app.add_flag("--json", o->json, "print prompt and generated ids and text as JSON at the end");
      app.add_flag("--conversation", o->conversation,
                   "interactive chat, as `hablar chat` (-cnv); -p is then the system message");
      app.add_flag("--chat", o->chat,
                   "the prompt is a user message, rendered with the model's chat template");
      app.add_option("--system", o->system, "system message (with --chat)");
      app.add_option("--chat-template-file", o->chat_template_file,
                     "Jinja chat template to use instead of the model's (with --chat)");
      o->device.add_to(app);
      return [o] { return run_generate(*o); };
    },
    {{"-ngl", "--n-gpu-layers"},
     {"-cnv", "--conversation"},
     {"-ctk", "--cache-type-k"},
     {"-ctv", "--cache-type-v"},
     {"-md", "--model-draft"}}};

}  // namespace
}  // namespace hablar::cli
