// `hablar chat [MODEL]`: an interactive chat on the terminal, as llama-cli's conversation
// mode. Each turn renders the whole conversation with the model's chat template and runs it
// through the engine (the prefix cache keeps earlier turns' KV, so only the new text is
// computed). A line ending in "\" continues on the next line; /clear, /system TEXT, /help,
// /exit. Ctrl-C stops a reply (what was written stays in the history); at the prompt it ends
// the chat, as end of input does.
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "chat/chat.h"
#include "cli/chat_loop.h"
#include "cli/chat_prompt.h"
#include "cli/command.h"
#include "cli/device_options.h"
#include "cli/load_progress.h"
#include "core/error.h"
#include "core/log.h"
#include "core/paths.h"
#include "engine/engine.h"
#include "engine/request_sampler.h"
#include "engine/text_filter.h"
#include "model/model.h"

namespace hablar::cli {
namespace {

std::atomic<bool> g_interrupted{false};

void on_sigint(int) {
  g_interrupted.store(true);
}

// SIGINT without SA_RESTART: a read at the prompt returns (EINTR) instead of waiting on.
void install_sigint() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
}

// One message from the terminal: lines ending in "\" go on. False at end of input or Ctrl-C.
bool read_message(std::string& out) {
  out.clear();
  // A Ctrl-C from here on is for this message's reply (even one pressed while the prompt
  // is being computed) or, while reading, ends the chat.
  g_interrupted.store(false);
  std::fputs("\n> ", stdout);
  std::fflush(stdout);
  char* line = nullptr;
  size_t cap = 0;
  for (;;) {
    errno = 0;
    const ssize_t n = ::getline(&line, &cap, stdin);
    if (n < 0 || g_interrupted.load()) {
      std::free(line);
      clearerr(stdin);
      return false;
    }
    std::string text(line, (size_t)n);
    if (!text.empty() && text.back() == '\n') text.pop_back();
    if (!text.empty() && text.back() == '\\') {
      text.back() = '\n';
      out += text;
      std::fputs(". ", stdout);
      std::fflush(stdout);
      continue;
    }
    out += text;
    std::free(line);
    return true;
  }
}

class ChatSession {
 public:
  explicit ChatSession(const ChatOptions& o) : o_(o) {
    const std::string path = resolve_model_path(o.model);
    warm_file_with_progress(path);
    model_ = model::Model::load(path);
    tmpl_ = std::make_unique<chat::ChatTemplate>(
        chat_template_source(model_->file(), o.chat_template_file));
    n_ctx_ = model::context_for(model_->config(), o.n_ctx, 4096, "-c/--ctx-size");
    executor_ = engine::make_executor(*model_, o.device.options(o.n_threads, n_ctx_, o.n_batch));
    engine::EngineConfig ec;
    ec.n_ctx = n_ctx_;
    ec.scheduler.max_running = 1;
    ec.scheduler.max_step_tokens = o.n_batch;
    ec.scheduler.max_prefill_chunk = o.n_batch;
    const auto& tok = model_->tokenizer();
    ec.is_eog = [&tok](int32_t t) { return tok.is_eog(t); };
    engine_ = std::make_unique<engine::Engine>(ec, *executor_);
    set_system(o.system);
  }
  ~ChatSession() { engine_->shutdown(std::chrono::milliseconds(0)); }

  void clear() { set_system(system_); }
  void set_system(const std::string& text) {
    system_ = text;
    messages_ = nlohmann::ordered_json::array();
    if (!text.empty()) messages_.push_back({{"role", "system"}, {"content", text}});
  }

  // Answers `user`, streaming the reply to stdout; Ctrl-C stops it. When the conversation
  // leaves too little room for a reply, its oldest turns go (the system message stays).
  void reply(const std::string& user) {
    messages_.push_back({{"role", "user"}, {"content", user}});
    const int reserve = std::min(n_ctx_ / 4, o_.n_predict > 0 ? o_.n_predict : n_ctx_ / 4);
    std::vector<int32_t> prompt = render_prompt();
    int dropped = 0;
    while ((int)prompt.size() + reserve > n_ctx_ && drop_oldest_turn()) {
      prompt = render_prompt();
      dropped += 1;
    }
    if (dropped > 0)
      std::fprintf(stderr, "(the oldest turns left the conversation to fit the context (-c %d))\n",
                   n_ctx_);
    if ((int)prompt.size() >= n_ctx_) {
      messages_.erase(messages_.size() - 1);
      std::fprintf(stderr,
                   "(the message does not fit the context (-c %d) even with the older turns "
                   "gone; a shorter one, a shorter /system or a larger -c)\n",
                   n_ctx_);
      return;
    }
    const auto& tok = model_->tokenizer();
    engine::GenerateRequest req;
    req.prompt = prompt;
    const int room = n_ctx_ - (int)prompt.size();
    req.max_tokens = o_.n_predict > 0 ? std::min(o_.n_predict, room) : room;
    engine::SamplingParams sampling = o_.sampling;
    sampling.seed += turn_++;  // each turn draws its own numbers, reproducibly
    req.sampler = std::make_unique<engine::ParamsSampler>(sampling, tok.n_vocab());
    req.filter = std::make_unique<engine::TextFilter>(tok, std::vector<std::string>{});
    auto handle = engine_->submit(std::move(req));
    const std::string text = stream(*handle);
    messages_.push_back({{"role", "assistant"}, {"content", text}});
  }

 private:
  std::vector<int32_t> render_prompt() {
    const auto& tok = model_->tokenizer();
    chat::ChatInput input;
    if (tok.bos_id() >= 0) input.bos_token = tok.token_piece(tok.bos_id());
    if (tok.eos_id() >= 0) input.eos_token = tok.token_piece(tok.eos_id());
    // A template that does not render a system message gets it in front of the first turn.
    if (!takes_system_) takes_system_ = chat::template_renders_system_role(*tmpl_, input);
    input.messages = *takes_system_ ? messages_ : chat::fold_system_into_next_message(messages_);
    return encode_rendered_prompt(tok, chat::apply_chat_template(*tmpl_, input));
  }

  // Drops the oldest message after the system one, then any that would leave the
  // conversation opening with something other than a user message; never the last (the
  // message being answered). False when nothing can go.
  bool drop_oldest_turn() {
    const size_t first = !messages_.empty() && messages_[0]["role"] == "system" ? 1 : 0;
    if (messages_.size() < first + 2) return false;
    messages_.erase(first);
    while (messages_.size() > first + 1 && messages_[first]["role"] != "user")
      messages_.erase(first);
    return true;
  }

  std::string stream(engine::RequestHandle& handle) {
    std::string text;
    std::vector<engine::StreamItem> items;
    for (bool done = false; !done;) {
      if (g_interrupted.exchange(false)) handle.cancel();
      items.clear();
      handle.wait(items, std::chrono::milliseconds(100));
      for (const engine::StreamItem& it : items) {
        std::fwrite(it.text.data(), 1, it.text.size(), stdout);
        std::fflush(stdout);
        text += it.text;
        if (it.kind != engine::StreamItem::Kind::kFinal) continue;
        done = true;
        if (it.finish_reason == engine::FinishReason::kCancelled) std::fputs(" [stopped]", stdout);
        if (it.finish_reason == engine::FinishReason::kError)
          std::fprintf(stderr, "\n(generation failed: %s)", it.error.c_str());
      }
    }
    std::fputs("\n", stdout);
    return text;
  }

  const ChatOptions& o_;
  int n_ctx_ = 0;  // o_.n_ctx, or (0) 4096 capped at the model's context
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<chat::ChatTemplate> tmpl_;
  std::optional<bool> takes_system_;  // template_renders_system_role, probed on first use
  std::unique_ptr<engine::StepExecutor> executor_;
  std::unique_ptr<engine::Engine> engine_;
  std::string system_;
  nlohmann::ordered_json messages_;
  uint64_t turn_ = 0;
};

constexpr const char* kHelp =
    "commands: /clear (forget the conversation), /system TEXT (set the system message and "
    "start again), /exit; end a line with \\ to go on on the next; Ctrl-C stops a reply";

}  // namespace

int run_chat(ChatOptions o) {
  o.sampling.validate();
  if (o.n_predict == 0 || o.n_predict < -1)
    throw_error(ErrorKind::kInvalidArgument, "-n must be -1 (no limit) or more than 0");
  if (o.seed < 0) {
    o.sampling.seed = std::random_device{}();
    log::info("seed: {} (random; --seed to repeat)", o.sampling.seed);
  } else {
    o.sampling.seed = (uint64_t)o.seed;
  }
  ChatSession session(o);
  install_sigint();
  std::fprintf(stderr, "%s\n", kHelp);
  for (std::string message; read_message(message);) {
    if (message == "/exit" || message == "/quit") break;
    if (message == "/help") {
      std::printf("%s\n", kHelp);
    } else if (message == "/clear") {
      session.clear();
      std::printf("(conversation cleared)\n");
    } else if (message.rfind("/system", 0) == 0) {
      const size_t at = message.find_first_not_of(' ', 7);
      session.set_system(at == std::string::npos ? "" : message.substr(at));
      std::printf("(system message set; conversation cleared)\n");
    } else if (!message.empty()) {
      session.reply(message);
    }
  }
  std::printf("\n");
  return 0;
}

namespace {

CommandRegistration reg{
    "chat",
    "Chat with a model on the terminal (history, /clear, /system, Ctrl-C stops a reply)",
    [](CLI::App& app) {
      auto o = std::make_shared<ChatOptions>();
      app.add_option("model,-m,--model", o->model,
                     "model path or name in the model cache (default model when omitted)");
      app.add_option("--system", o->system, "system message");
      app.add_option("--chat-template-file", o->chat_template_file,
                     "Jinja chat template to use instead of the model's");
      app.add_option("-n,--n-predict", o->n_predict, "most tokens per reply (-1: no limit)")
          ->capture_default_str();
      app.add_option("-c,--ctx-size", o->n_ctx, "context size in tokens (the whole conversation)")
          ->capture_default_str();
      app.add_option("-t,--threads", o->n_threads, "threads (0 = all cores)");
      app.add_option("--temp", o->sampling.temperature, "temperature (0 = greedy)")
          ->capture_default_str();
      app.add_option("--top-k", o->sampling.top_k, "top-k (0 = off)")->capture_default_str();
      app.add_option("--top-p", o->sampling.top_p, "top-p in (0, 1]")->capture_default_str();
      app.add_option("--min-p", o->sampling.min_p, "min-p in [0, 1]")->capture_default_str();
      app.add_option("--repeat-penalty", o->sampling.repeat_penalty, "repetition penalty")
          ->capture_default_str();
      app.add_option("-s,--seed", o->seed, "RNG seed (-1: random, printed)")->capture_default_str();
      o->device.add_to(app);
      return [o] { return run_chat(*o); };
    },
    {{"-ngl", "--n-gpu-layers"}}};

}  // namespace
}  // namespace hablar::cli
