// `hablar serve [-m MODEL]`: the OpenAI-, llama.cpp- and Ollama-compatible HTTP server.
//
// Flags follow llama-server where they overlap, so switching is a change of binary name:
//   --host --port -m/--model -c/--ctx-size -np/--parallel -t/--threads --temp --seed
//   -n/--n-predict --alias --api-key --api-key-file --metrics --slots --jinja
//   --chat-template-file -ngl/--n-gpu-layers -cb/--cont-batching --no-webui -b/--batch-size
//   -to/--timeout --threads-http --slot-save-path
// and its own for a public endpoint: --header-timeout --body-timeout --idle-timeout
//   --max-connections --max-header-bytes --max-body --special-in-content (README.md)
// llama-server spells some flags with one dash and several letters (-np, -ngl, -cb, -to,
// -tb); they are registered as flag aliases of the subcommand (cli/command.h).
//
// The port is bound first and /health answers 503 while the model loads; SIGTERM or SIGINT
// stops taking requests, lets running generations finish (up to --shutdown-grace seconds)
// and exits.
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

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
#include "engine/executor_factory.h"
#include "model/model.h"
#include "server/dry_breakers.h"
#include "server/http_server.h"

namespace hablar::cli {
namespace {

struct ServeOptions {
  std::string model;
  LoadFlags load;     // --quantize
  SpecFlags spec;     // --spec-type, --model-draft, --draft-max, ...
  std::string alias;  // comma-separated names
  std::string tags;   // comma-separated labels
  server::ServerOptions http;
  int n_ctx = 0;  // KV cache size in tokens shared by all sequences; 0: 8192
  int n_parallel = 8;
  int n_threads = 0;
  int n_batch = 512;
  bool embedding = false;            // --embedding: serve embeddings from a decoder
  bool reranking = false;            // --reranking: pooling rank
  std::string pooling;               // --pooling
  int decode_step_tokens = 128;      // step budget while any stream is decoding (0 = n_batch)
  double max_step_ms = 0;            // step time while any stream is decoding (0 = no bound)
  double max_decode_slowdown = 2.0;  // step time relative to its decodes alone (0 = no bound)
  int min_step_prompt_tokens = 32;   // prompt tokens a time-bounded step always offers
  bool wave_prefill = true;          // prompts prefilled while nobody decodes finish together
  int n_predict = -1;
  bool context_shift = false;
  int n_keep = 0;
  int max_queue = 256;
  float temp = 0.8f;
  float top_p = 0.95f;
  float min_p = 0.05f;
  int top_k = 40;
  float repeat_penalty = 1.0f;
  engine::SamplingParams extra_sampling;  // --top-n-sigma, --xtc-probability, --xtc-threshold
  int64_t seed = -1;
  std::vector<std::string> api_keys;
  std::string api_key_file;
  std::string chat_template_file;
  std::string chat_template;  // a built-in format's name, or Jinja source
  std::string reasoning_format = "auto";
  int reasoning_budget = -1;
  std::string chat_template_kwargs;  // JSON object
  std::string cors;
  int n_gpu_layers = -1;  // -1: unset (--device decides)
  std::string device = "auto";
  double gpu_memory_utilization = 0.9;
  bool deterministic = false;
  bool no_bf16_copies = false;
  bool no_step_ahead = false;
  std::string cache_type_k = "f16", cache_type_v = "f16";
  bool special_in_content = false;
  bool jinja = true;
  bool cont_batching = true;
  bool no_webui = false;
  bool no_slots = false;
  bool vertex_ai = false;
  int sleep_idle_seconds = -1;
  bool metrics = false;
  bool slots = false;
  int threads_batch = 0;
  std::string flash_attn;
  std::string reasoning;  // --reasoning on|off|auto (llama-server): thinking on or off
  bool verbose = false;
  bool accepted_flag = false;  // llama-server flags whose behaviour is hablar's only one
  std::string accepted_value;  // values of such flags (-ub, --cache-ram, ...)
};

// Comma-separated names, empty ones dropped ("a,b,c" -> {a, b, c}).
std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  for (size_t a = 0, b; a <= text.size(); a = b + 1) {
    b = std::min(text.find(',', a), text.size());
    if (b > a) out.push_back(text.substr(a, b - a));
  }
  return out;
}

std::string model_id_for(const ServeOptions& o, const std::string& path) {
  if (const auto aliases = split_list(o.alias); !aliases.empty()) return aliases[0];
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.size() > 5 && name.substr(name.size() - 5) == ".gguf") name.resize(name.size() - 5);
  return name;
}

// --embedding, --pooling, --reranking as llama-server reads them: --reranking is rank
// pooling; a decoder serves embeddings only when one of them (or its file's pooling_type)
// says so, an encoder always.
void set_embedding_options(const ServeOptions& o, const model::ModelConfig& cfg,
                           server::ServingModel& sm) {
  std::optional<Pooling> pooling = cfg.pooling;
  if (!o.pooling.empty()) pooling = pooling_from_name(o.pooling);  // checked
  if (o.reranking) pooling = Pooling::kRank;
  sm.embeddings = cfg.embedding_only || o.embedding || o.reranking || pooling.has_value();
  sm.pooling = pooling.value_or(cfg.embedding_only ? Pooling::kMean : Pooling::kLast);
  if (sm.pooling == Pooling::kRank && cfg.n_cls_out == 0)
    throw_error(ErrorKind::kInvalidArgument,
                "rank pooling (--reranking) needs a model with a classifier head (cls tensors)");
}

std::shared_ptr<server::ServingModel> load_serving_model(const ServeOptions& o,
                                                         const std::string& path) {
  const auto t0 = std::chrono::steady_clock::now();
  warm_file_with_progress(path);
  auto sm = std::make_shared<server::ServingModel>();
  sm->model = model::Model::load(path, o.load.options(o.n_threads));
  const auto& cfg = sm->model->config();
  const std::string tmpl =
      chat_template_source(sm->model->file(), o.chat_template_file, o.chat_template);
  sm->chat_template = std::make_unique<chat::ChatTemplate>(tmpl);
  sm->tool_format = chat::detect_tool_format(tmpl);
  sm->template_knows_developer = chat::template_knows_developer_role(*sm->chat_template);
  {
    chat::ChatInput probe;
    const auto& tok = sm->model->tokenizer();
    if (tok.bos_id() >= 0) probe.bos_token = tok.token_piece(tok.bos_id());
    if (tok.eos_id() >= 0) probe.eos_token = tok.token_piece(tok.eos_id());
    sm->template_takes_system = chat::template_renders_system_role(*sm->chat_template, probe);
    if (!sm->template_takes_system)
      log::info("the chat template renders no system message: one is put before the next turn");
  }
  if (sm->tool_format == chat::ToolFormat::kNone) {  // tools still work, as in llama-server
    sm->tool_format = chat::ToolFormat::kGenericJson;
    sm->template_knows_tools = false;
  }
  sm->reasoning_format = *server::reasoning_format_from_name(o.reasoning_format);  // checked
  sm->reasoning_budget = o.reasoning_budget;
  if (!o.chat_template_kwargs.empty())
    sm->template_kwargs = nlohmann::ordered_json::parse(o.chat_template_kwargs);  // checked

  // -c is the KV pool all sequences share (many users' contexts), so it may exceed what one
  // sequence can hold; each sequence is limited to the model's context (its trained one, or a
  // RoPE scaling's extension) below, and /props reports that limit.
  engine::ExecutorOptions eo;
  eo.device = engine::device_kind_from_name(o.device);
  eo.n_threads = o.n_threads;
  eo.kv_tokens = o.n_ctx;
  if (cfg.embedding_only) eo.kv_tokens = kDefaultKvBlockSize;  // embedders keep no KV cache
  eo.n_gpu_layers = o.n_gpu_layers;
  eo.cuda.gpu_memory_utilization = o.gpu_memory_utilization;
  eo.cuda.max_step_tokens = std::max(o.n_batch, o.n_parallel);
  eo.cuda.deterministic = o.deterministic;
  eo.cuda.bf16_weight_copies = !o.no_bf16_copies;
  eo.cuda.launch_ahead = !o.no_step_ahead;
  eo.cache_type_k = engine::kv_dtype_from_name(o.cache_type_k);
  eo.cache_type_v = engine::kv_dtype_from_name(o.cache_type_v);
  sm->executor = engine::make_executor(*sm->model, eo);
  const int32_t pool_tokens = sm->executor->n_kv_blocks() * sm->executor->kv_block_size();
  const int32_t model_ctx = model::max_context(cfg);
  // Where every layer slides and the executor reads nothing before a window (the CPU's), the
  // scheduler gives back the blocks behind it, so the pool bounds no sequence; not with
  // LongRoPE, whose factors the executor picked for a context of the pool's size.
  const int32_t window = cfg.rope_factors_long.empty() ? sm->executor->kv_window() : 0;
  sm->n_ctx = engine::max_sequence_tokens(model_ctx, sm->executor->n_kv_blocks(),
                                          sm->executor->kv_block_size(), window,
                                          std::max(o.n_batch, o.n_parallel));
  if (pool_tokens > sm->n_ctx && !cfg.embedding_only)
    log::info(
        "KV pool of {} tokens shared by all sequences; each sequence holds at most {} (the "
        "model's context)",
        pool_tokens, sm->n_ctx);
  if (sm->n_ctx > pool_tokens && !cfg.embedding_only)
    log::info(
        "every layer slides over {} positions: blocks behind the window are given back, so a "
        "sequence may hold {} tokens (the model's context) on a KV pool of {}",
        window, sm->n_ctx, pool_tokens);
  if (cfg.embedding_only)
    sm->n_ctx = o.n_ctx > 0 ? std::min(o.n_ctx, cfg.n_ctx_train) : cfg.n_ctx_train;
  set_embedding_options(o, cfg, *sm);
  sm->n_slots = o.n_parallel;

  engine::EngineConfig ec;
  ec.n_ctx = sm->n_ctx;
  ec.max_queue = o.max_queue;
  ec.embed_step_tokens = std::max(o.n_batch, 2048);
  ec.scheduler.max_running = o.n_parallel;
  ec.scheduler.max_step_tokens = std::max(o.n_batch, o.n_parallel);
  ec.scheduler.max_prefill_chunk = o.n_batch;
  ec.scheduler.max_step_tokens_decoding = o.decode_step_tokens;
  ec.scheduler.max_step_ms = o.max_step_ms;
  ec.scheduler.max_decode_slowdown = o.max_decode_slowdown;
  ec.scheduler.min_step_prompt_tokens = o.min_step_prompt_tokens;
  ec.scheduler.wave_prefill = o.wave_prefill;
  const tokenizer::Tokenizer* tok = &sm->model->tokenizer();
  ec.is_eog = [tok](int32_t t) { return tok->is_eog(t); };
  ec.draft = o.spec.params();
  ec.drafter =
      o.spec.make(*sm->model, *sm->executor, o.load.options(o.n_threads), o.n_threads, pool_tokens);
  sm->engine = std::make_unique<engine::Engine>(ec, *sm->executor);

  sm->id = model_id_for(o, path);
  sm->aliases = split_list(o.alias);
  sm->tags = split_list(o.tags);
  sm->path = path;
  sm->created = server::unix_time_now();
  auto& d = sm->defaults;
  d.sampling.temperature = o.temp;
  d.sampling.top_k = o.top_k;
  d.sampling.top_p = o.top_p;
  d.sampling.min_p = o.min_p;
  d.sampling.repeat_penalty = o.repeat_penalty;
  d.sampling.top_n_sigma = o.extra_sampling.top_n_sigma;
  d.sampling.xtc_probability = o.extra_sampling.xtc_probability;
  d.sampling.xtc_threshold = o.extra_sampling.xtc_threshold;
  d.sampling.dry = o.extra_sampling.dry;
  d.sampling.mirostat = o.extra_sampling.mirostat;
  d.sampling.mirostat_tau = o.extra_sampling.mirostat_tau;
  d.sampling.mirostat_eta = o.extra_sampling.mirostat_eta;
  if (d.sampling.dry.on())
    d.sampling.dry.breakers =
        server::resolve_dry_breakers(sm->tok(), server::default_dry_breakers());
  d.seed_random = o.seed < 0;
  if (o.seed >= 0) d.sampling.seed = (uint64_t)o.seed;
  d.n_predict = o.n_predict;
  d.context_shift = o.context_shift;
  d.n_keep = o.n_keep;
  sm->special_in_content = o.special_in_content;
  sm->verbose_replies = o.verbose;
  d.sampling.validate();
  sm->load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log::info(
      "model {} loaded in {:.2f} s: {} layers, vocab {}, {} sequences at once, context {} "
      "per sequence, tools: {}",
      sm->id, sm->load_seconds, cfg.n_layers, cfg.n_vocab, o.n_parallel, sm->n_ctx,
      chat::tool_format_name(sm->tool_format));
  log::info("{}", sm->executor->describe());
  return sm;
}

// Vertex AI (Google Cloud) runs a custom container with AIP_MODE=PREDICTION and names its port
// and routes in AIP_HTTP_PORT, AIP_PREDICT_ROUTE and AIP_HEALTH_ROUTE: the platform's
// container contract, honoured as llama-server honours it (the port wins over --port).
// --vertex-ai turns the predict route on without the platform.
void configure_prediction(ServeOptions& o) {
  auto fail = [](const std::string& m) { throw_error(ErrorKind::kInvalidArgument, m); };
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  };
  const bool platform = env("AIP_MODE") == "PREDICTION";
  if (!platform && !o.vertex_ai) return;
  o.http.predict_route = env("AIP_PREDICT_ROUTE").empty() ? "/predict" : env("AIP_PREDICT_ROUTE");
  o.http.predict_health_route = env("AIP_HEALTH_ROUTE");
  if (o.http.predict_route[0] != '/' ||
      (!o.http.predict_health_route.empty() && o.http.predict_health_route[0] != '/'))
    fail("AIP_PREDICT_ROUTE and AIP_HEALTH_ROUTE must be paths starting with /");
  if (platform && !env("AIP_HTTP_PORT").empty()) {
    const std::string port = env("AIP_HTTP_PORT");
    char* end = nullptr;
    const long p = std::strtol(port.c_str(), &end, 10);
    if (end == port.c_str() || *end != '\0' || p < 1 || p > 65535)
      fail("AIP_HTTP_PORT must be a port number (got '" + port + "')");
    if (p != o.http.port) log::warn("AIP_HTTP_PORT={} overrides --port {}", p, o.http.port);
    o.http.port = (int)p;
  }
  log::info(
      "Vertex AI prediction on POST {}{}", o.http.predict_route,
      o.http.predict_health_route.empty() ? "" : ", health on GET " + o.http.predict_health_route);
}

void check_options(ServeOptions& o) {
  auto fail = [](const std::string& m) { throw_error(ErrorKind::kInvalidArgument, m); };
  if (o.n_parallel < 1) fail("-np/--parallel must be at least 1");
  if (!server::reasoning_format_from_name(o.reasoning_format))
    fail("--reasoning-format must be none, deepseek or auto (got '" + o.reasoning_format + "')");
  if (o.reasoning_budget < -1)
    fail("--reasoning-budget must be -1 (unlimited), 0 (thinking off) or a token count");
  if (!o.chat_template.empty() && !chat::chat_template_from_flag(o.chat_template))
    fail("--chat-template: unknown template name '" + o.chat_template + "' (built-in names: " +
         chat::builtin_chat_template_names() + "; or give Jinja source, or --chat-template-file)");
  if (!o.chat_template_kwargs.empty()) {
    const auto kw = nlohmann::ordered_json::parse(o.chat_template_kwargs, nullptr, false);
    if (!kw.is_object()) fail("--chat-template-kwargs must be a JSON object");
  }
  if (!o.reasoning.empty()) {
    const std::string& r = o.reasoning;
    if (r == "off" || r == "false" || r == "0") {
      o.reasoning_budget = 0;
    } else if (r == "on" || r == "true" || r == "1") {
      auto kw = o.chat_template_kwargs.empty()
                    ? nlohmann::ordered_json::object()
                    : nlohmann::ordered_json::parse(o.chat_template_kwargs);
      if (!kw.contains("enable_thinking")) kw["enable_thinking"] = true;
      o.chat_template_kwargs = kw.dump();
    } else if (r != "auto") {
      fail("--reasoning must be on, off or auto (got '" + r + "')");
    }
  }
  if (o.verbose) log::set_level("debug");
  if (o.n_ctx < 0) fail("-c/--ctx-size must be >= 0 (0: 8192 on the CPU, free memory on a GPU)");
  if (o.n_batch < 1) fail("-b/--batch-size must be at least 1");
  if (!o.pooling.empty() && !pooling_from_name(o.pooling))
    fail("--pooling: none, mean, cls, last or rank");
  if (o.decode_step_tokens < 0) fail("--decode-step-tokens must be >= 0 (0 = -b)");
  if (!(o.max_step_ms >= 0)) fail("--max-step-ms must be >= 0 (0 = no time bound)");
  if (!(o.max_decode_slowdown == 0 || o.max_decode_slowdown >= 1))
    fail("--max-decode-slowdown must be 0 (no bound) or at least 1");
  if (o.min_step_prompt_tokens < 1) fail("--min-step-prompt-tokens must be at least 1");
  if (o.max_queue < 1) fail("--max-queue must be at least 1");
  if (o.sleep_idle_seconds < -1)
    fail("--sleep-idle-seconds must be a number of seconds (-1 or 0: never sleep)");
  if (o.n_threads < 0) fail("-t/--threads must be >= 0 (0 = all cores)");
  if (o.http.port < 0 || o.http.port > 65535) fail("--port must be in 0..65535");
  if (o.n_gpu_layers < -1) fail("-ngl/--n-gpu-layers must be >= 0");
  if (o.http.header_timeout_seconds < 1 || o.http.body_timeout_seconds < 1 ||
      o.http.idle_timeout_seconds < 1 || o.http.timeout_seconds < 1)
    fail("--timeout, --header-timeout, --body-timeout and --idle-timeout must be at least 1");
  if (!o.cont_batching) log::warn("continuous batching is always on; --no-cont-batching ignored");
  for (const std::string& k : o.api_keys)
    for (std::string& key : split_list(k)) o.http.api_keys.push_back(std::move(key));
  if (!o.api_key_file.empty()) {
    std::string text = read_text_file(o.api_key_file, "API key file");
    for (size_t a = 0, b; a < text.size(); a = b + 1) {
      b = text.find('\n', a);
      if (b == std::string::npos) b = text.size();
      std::string line = text.substr(a, b - a);
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (!line.empty() && line[0] != '#') o.http.api_keys.push_back(line);
    }
    if (o.http.api_keys.empty()) fail("--api-key-file '" + o.api_key_file + "' holds no key");
  }
  if (!o.cors.empty()) o.http.cors_origins = split_list(o.cors);
  configure_prediction(o);
  o.http.enable_metrics = o.metrics;
  o.http.enable_slots = !o.no_slots;
  if (!o.http.slot_save_path.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.http.slot_save_path, ec);
    if (!std::filesystem::is_directory(o.http.slot_save_path))
      fail("--slot-save-path '" + o.http.slot_save_path + "' is not a directory and cannot be " +
           "created" + (ec ? ": " + ec.message() : std::string()));
  }
  o.http.enable_webui = !o.no_webui;
}

// Each connection is a file descriptor: lift the soft limit to the hard one so a thousand
// clients fit (the usual soft limit is 1024).
void raise_open_file_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

// The server's URLs, one per address of --host ("127.0.0.1,::1"), IPv6 ones in brackets.
std::string server_urls(const std::string& hosts, int port, const char* path = "") {
  std::string out;
  for (size_t start = 0; start <= hosts.size();) {
    size_t end = hosts.find(',', start);
    if (end == std::string::npos) end = hosts.size();
    std::string h = hosts.substr(start, end - start);
    start = end + 1;
    h.erase(0, h.find_first_not_of(' '));
    h.erase(h.find_last_not_of(' ') + 1);
    if (h.empty()) continue;
    if (h.find(':') != std::string::npos && h.front() != '[') h = "[" + h + "]";
    out +=
        (out.empty() ? "" : ", ") + std::string("http://") + h + ":" + std::to_string(port) + path;
  }
  return out;
}

int run_serve(ServeOptions& o) {
  check_options(o);
  raise_open_file_limit();
  const std::string path = resolve_model_path(o.model);
  // Signals go to a waiting thread only: block them before any thread starts.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  server::HttpServer http(o.http);
  http.bind();
  log::info("listening on {} (loading the model; /health answers 503 until ready)",
            server_urls(o.http.host, http.port()));
  std::thread listener([&] { http.run(); });
  std::atomic<bool> load_failed{false};
  std::thread loader([&] {
    try {
      http.set_model(load_serving_model(o, path));
      // Also without --sleep-idle-seconds: Ollama clients unload the model with keep_alive.
      http.enable_sleep(o.sleep_idle_seconds, [&o, path] { return load_serving_model(o, path); });
      log::info("ready: {}  (OpenAI API at /v1)", server_urls(o.http.host, http.port(), "/"));
    } catch (const std::exception& e) {
      log::error("loading {} failed: {}", path, e.what());
      http.set_load_error(e.what());
      load_failed = true;
      kill(getpid(), SIGTERM);
    }
  });
  int sig = 0;
  sigwait(&stop_signals, &sig);
  log::info("{} received: finishing running requests (up to {} s), then exiting",
            sig == SIGTERM ? "SIGTERM" : "SIGINT", o.http.shutdown_grace_seconds);
  loader.join();
  http.stop();
  listener.join();
  log::info("stopped");
  // Connection threads of clients that keep idle connections open may still exist; exit
  // without running destructors under them.
  spdlog::default_logger()->flush();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(load_failed ? 1 : 0);  // a model that did not load is a failed start
}

// llama-server flags that scripts and test suites pass and whose effect is already how hablar
// works, or that tune llama.cpp internals hablar does not have: accepted so a command line
// moves over unchanged.
void add_llama_server_compat_flags(CLI::App& app, ServeOptions& o) {
  app.add_option("--reasoning", o.reasoning,
                 "on, off or auto (-rea): thinking on (enable_thinking true), off (as "
                 "--reasoning-budget 0) or as the template decides");
  app.add_flag("--verbose", o.verbose, "debug logging (-v; as --log-level debug)");
  const char* accepted_flags[] = {
      "--no-jinja",    // the model's Jinja template is always what renders chats
      "--offline",     // nothing is ever downloaded
      "--kv-unified",  // the KV pool is always shared by all sequences
      "--swa-full",    // sliding-window layers keep the positions they read
      "--no-cache-idle-slots",
      "--cache-idle-slots",
      "--no-mmap",
      "--mlock",
      "--no-warmup",
      "--backend-sampling",
      "--log-disable",
      "--no-perf"};
  for (const char* f : accepted_flags)
    app.add_flag(f, o.accepted_flag, "accepted for compatibility with llama-server")->group("");
  const char* accepted_options[] = {"--ubatch-size", "--cache-ram", "--slot-prompt-similarity",
                                    "--numa"};
  for (const char* f : accepted_options)
    app.add_option(f, o.accepted_value, "accepted for compatibility with llama-server")->group("");
}

CommandRegistration serve_registration{
    "serve",
    "Serve a model over HTTP (OpenAI, llama.cpp and Ollama APIs, web chat at /)",
    [](CLI::App& app) {
      auto o = std::make_shared<ServeOptions>();
      app.add_option("-m,--model", o->model,
                     "GGUF file or model name (default: the default model)");
      o->load.add_to(app);
      o->spec.add_to(app);
      // The last --host / --port wins, as in llama-server: a wrapper's defaults can be
      // overridden by arguments appended after them.
      app.add_option("--host", o->http.host,
                     "address(es) to listen on, comma-separated (\"127.0.0.1,::1\")")
          ->capture_default_str()
          ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
      app.add_option("--port", o->http.port, "port (0: any free port)")
          ->capture_default_str()
          ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
      app.add_option("-a,--alias", o->alias,
                     "model name shown to clients; several, comma-separated, are all accepted "
                     "(the first is the id)");
      app.add_option("--tags", o->tags, "comma-separated labels /v1/models shows");
      app.add_option("-c,--ctx-size", o->n_ctx,
                     "KV cache size in tokens, shared by all sequences (0: 8192 on the CPU; on a "
                     "GPU, what --gpu-memory-utilization leaves)");
      app.add_option("--device", o->device,
                     "where the model runs: auto (CUDA when present), cpu, cuda")
          ->capture_default_str();
      app.add_option("--gpu-memory-utilization", o->gpu_memory_utilization,
                     "share of the GPU's memory hablar may use (weights, KV cache, buffers)")
          ->capture_default_str();
      add_cache_type_flags(app, o->cache_type_k, o->cache_type_v);
      app.add_flag("--deterministic", o->deterministic,
                   "GPU: batch-invariant kernels (a sequence's output does not depend on the "
                   "others in its steps); slower");
      add_no_bf16_copies_flag(app, o->no_bf16_copies);
      add_no_step_ahead_flag(app, o->no_step_ahead);
      add_lab_knobs_flag(app);
      app.add_option("--parallel", o->n_parallel, "sequences decoded at once (-np)")
          ->capture_default_str();
      app.add_option("-t,--threads", o->n_threads, "CPU threads (0: all cores)");
      app.add_option("--threads-batch", o->threads_batch, "accepted for compatibility (-tb)");
      app.add_flag("--embedding,--embeddings", o->embedding,
                   "serve embeddings from a generative model (encoders always serve them)");
      app.add_option("--pooling", o->pooling,
                     "pooling type for embeddings: none, mean, cls, last or rank (default: "
                     "the model's, else mean for encoders and last for decoders)");
      app.add_flag("--rerank,--reranking", o->reranking,
                   "enable the rerank routes (rank pooling; the model needs a classifier head)");
      app.add_option("-b,--batch-size", o->n_batch, "most tokens in one engine step")
          ->capture_default_str();
      app.add_option("--decode-step-tokens", o->decode_step_tokens,
                     "most tokens in one engine step while any stream is decoding: bounds the "
                     "inter-token latency that prompt chunks add (0 = -b); until the step costs "
                     "are measured, and with --max-step-ms 0")
          ->capture_default_str();
      app.add_option("--max-step-ms", o->max_step_ms,
                     "most time one engine step may take while any stream is decoding, in ms: "
                     "each stream's inter-token latency under load; prompt chunks fill what the "
                     "decodes leave, priced by the step costs measured on this device (0: no "
                     "time bound)")
          ->capture_default_str();
      app.add_option("--max-decode-slowdown", o->max_decode_slowdown,
                     "most time one engine step may take while streams decode, as a multiple of "
                     "what the decodes alone cost on this device (2: streams keep at least half "
                     "their pace while prompts prefill; 0: no bound; with --max-step-ms the "
                     "smaller bound holds)")
          ->capture_default_str();
      app.add_option("--min-step-prompt-tokens", o->min_step_prompt_tokens,
                     "prompt tokens a time-bounded step always offers waiting prompts, however "
                     "little time the decodes leave: prefill keeps moving, and in chunks wide "
                     "enough to run the matmuls efficiently")
          ->capture_default_str();
      app.add_flag("--wave-prefill,!--no-wave-prefill", o->wave_prefill,
                   "while no stream decodes, alike prompts being prefilled finish together (each "
                   "holds its last token back until all fit in one short step; arrivals join; a "
                   "short chat is not held behind a long prompt): their first tokens come from "
                   "one step and no stream stalls for the rest of its wave's prefill (default "
                   "on)");
      app.add_option("-n,--n-predict", o->n_predict,
                     "default tokens to generate (-1: until the context is full; with "
                     "--context-shift, until an end-of-generation token or a stop string)");
      app.add_flag("--context-shift,!--no-context-shift", o->context_shift,
                   "a request that fills its context keeps going: the tokens after the first "
                   "--keep (a request's n_keep / num_keep) lose their older half (n_discard), "
                   "the rest is computed again (default off: it ends with \"length\")");
      app.add_option("--keep", o->n_keep,
                     "prompt tokens a context shift keeps, BOS not counted (-1: all)")
          ->check(CLI::Range(-1, INT32_MAX))
          ->capture_default_str();
      app.add_option("--temp", o->temp, "default temperature")->capture_default_str();
      app.add_option("--top-k", o->top_k, "default top-k")->capture_default_str();
      app.add_option("--top-p", o->top_p, "default top-p")->capture_default_str();
      app.add_option("--min-p", o->min_p, "default min-p")->capture_default_str();
      app.add_option("--repeat-penalty", o->repeat_penalty, "default repetition penalty");
      add_extra_sampler_flags(app, o->extra_sampling);
      app.add_option("-s,--seed", o->seed, "default seed (-1: random per request)");
      app.add_option("--api-key", o->api_keys,
                     "API key(s) clients must send as Bearer tokens (comma-separated)");
      app.add_option("--api-key-file", o->api_key_file, "file with one API key per line");
      app.add_flag("--metrics", o->metrics, "enable /metrics (Prometheus)");
      app.add_flag("--slots", o->slots, "enable /slots (on by default)");
      app.add_flag("--no-slots", o->no_slots, "disable /slots");
      app.add_option("--slot-save-path", o->http.slot_save_path,
                     "directory for slot files: POST /slots/{id}?action=save|restore with "
                     "{\"filename\"} saves a slot's cached K/V there or restores it "
                     "(created if missing; without it save and restore answer 501)");
      app.add_option("--sleep-idle-seconds", o->sleep_idle_seconds,
                     "unload the model after this many seconds without a request that needs it "
                     "(freeing its memory, GPU memory included); the next such request loads it "
                     "again. Health, /props, /models, /slots and /metrics do not wake it (-1 or 0: "
                     "never)")
          ->capture_default_str();
      app.add_flag("--vertex-ai", o->vertex_ai,
                   "serve Vertex AI predictions: POST /predict (or $AIP_PREDICT_ROUTE) with "
                   "{\"instances\": [...]}, each instance a request body whose @requestFormat "
                   "names a route (chatCompletions, completions, embeddings, ...); on by itself "
                   "when AIP_MODE=PREDICTION");
      app.add_flag("--jinja", o->jinja, "use the Jinja chat template (always on)");
      app.add_option("--chat-template-file", o->chat_template_file,
                     "Jinja chat template to use instead of the model's");
      app.add_option("--chat-template", o->chat_template,
                     "chat format by name (" + chat::builtin_chat_template_names() +
                         ") or Jinja source, instead of the model's template");
      app.add_option(
          "--chat-template-kwargs", o->chat_template_kwargs,
          "JSON object of extra template variables, e.g. '{\"enable_thinking\": false}'");
      app.add_option("--otlp-endpoint", o->http.otlp_endpoint,
                     "send a trace span per request to this OTLP/HTTP collector (JSON), e.g. "
                     "http://127.0.0.1:4318");
      app.add_option("--reasoning-format", o->reasoning_format,
                     "none (reasoning stays in the content), deepseek or auto (returned apart as "
                     "reasoning_content)")
          ->capture_default_str();
      app.add_option("--reasoning-budget", o->reasoning_budget,
                     "-1: unlimited thinking; 0: thinking off (enable_thinking false); N > 0: the "
                     "reasoning block is closed after N tokens")
          ->capture_default_str();
      app.add_option("--n-gpu-layers", o->n_gpu_layers,
                     "layers on the GPU (-ngl): 0 the CPU, >= the layer count all on the GPU; "
                     "partial offload is not supported");
      app.add_flag("--cont-batching", o->cont_batching, "continuous batching (always on) (-cb)");
      app.add_flag("--no-cont-batching{false}", o->cont_batching, "accepted; batching stays on");
      app.add_option("--flash-attn", o->flash_attn, "accepted for compatibility (-fa)");
      app.add_flag("--no-webui,--no-ui", o->no_webui, "do not serve the chat page at /");
      app.add_flag("--timings-header", o->http.timings_header,
                   "send X-Hablar-Timings (queued, prefill, decode, detokenize ms; token counts) "
                   "with every non-streamed generation, not only when the request sends that "
                   "header");
      app.add_flag("--special-in-content", o->special_in_content,
                   "control-token text inside chat messages becomes control tokens (by default "
                   "it is tokenized as plain text; only the template's markup is special)");
      app.add_option("--timeout", o->http.timeout_seconds,
                     "seconds a client may read nothing of its response (-to)")
          ->capture_default_str();
      app.add_option("--header-timeout", o->http.header_timeout_seconds,
                     "seconds a client gets to send a request's headers (then 408)")
          ->capture_default_str();
      app.add_option("--body-timeout", o->http.body_timeout_seconds,
                     "seconds a client gets to send a request's body (then 408)")
          ->capture_default_str();
      app.add_option("--idle-timeout", o->http.idle_timeout_seconds,
                     "seconds a kept-alive connection may wait for its next request")
          ->capture_default_str();
      app.add_option("--threads-http", o->http.max_http_threads,
                     "most HTTP worker threads (one per running request; idle and slow "
                     "connections take none)")
          ->capture_default_str();
      app.add_option("--max-connections", o->http.max_connections,
                     "open connections beyond which new ones are closed at once")
          ->capture_default_str();
      app.add_option("--max-header-bytes", o->http.max_header_bytes,
                     "largest request line and headers together, in bytes (then 431)")
          ->capture_default_str();
      app.add_option("--max-queue", o->max_queue, "requests waiting beyond which new ones get 503")
          ->capture_default_str();
      app.add_option("--max-body", o->http.max_body_bytes, "largest request body in bytes")
          ->capture_default_str();
      app.add_option("--cors-origins", o->cors,
                     "allowed CORS origins, comma-separated (default *)");
      app.add_option("--shutdown-grace", o->http.shutdown_grace_seconds,
                     "seconds running requests get to finish on SIGTERM")
          ->capture_default_str();
      add_llama_server_compat_flags(app, *o);
      return [o] { return run_serve(*o); };
    },
    {{"-np", "--parallel"},
     {"-ngl", "--n-gpu-layers"},
     {"-ctk", "--cache-type-k"},
     {"-ctv", "--cache-type-v"},
     {"-cb", "--cont-batching"},
     {"-nocb", "--no-cont-batching"},
     {"-to", "--timeout"},
     {"-tb", "--threads-batch"},
     {"-fa", "--flash-attn"},
     {"-md", "--model-draft"},
     {"-ub", "--ubatch-size"},
     {"-rea", "--reasoning"},
     {"-kvu", "--kv-unified"},
     {"-cram", "--cache-ram"},
     {"-v", "--verbose"}}};

}  // namespace
}  // namespace hablar::cli
