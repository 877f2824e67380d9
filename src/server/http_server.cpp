#include "server/http_server.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "core/log.h"
#include "server/api_error.h"
#include "server/request_fields.h"

namespace hablar::server {

namespace {

// Streams whose last bytes are not yet written: stop() lets these drain before the
// transport stops.
std::atomic<int> g_open_streams{0};

bool constant_time_equal(const std::string& a, const std::string& b) {
  // Compares every byte of the longer string whatever matches, so timing tells nothing.
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? (unsigned char)a[i] : 0;
    const unsigned char y = i < b.size() ? (unsigned char)b[i] : 0;
    diff |= (unsigned char)(x ^ y);
  }
  return diff == 0;
}

// Whether a request's Origin is allowed by --cors-origins. An entry matches the origin
// itself ("http://localhost:5173"), its scheme and host with any port ("http://localhost"),
// or its host alone with any scheme and port ("example.com"); "localhost" alone stands for
// every loopback name (localhost, 127.0.0.1, [::1]); "*" matches every origin.
bool origin_allowed(const std::vector<std::string>& allowed, const std::string& origin) {
  // Browsers send scheme://host[:port]; other clients may send a bare host.
  const size_t scheme_end = origin.find("://");
  const size_t host_start = scheme_end == std::string::npos ? 0 : scheme_end + 3;
  size_t host_end = origin.size();
  if (origin.compare(host_start, 1, "[") == 0) {  // [IPv6]
    host_end = origin.find(']', host_start);
    host_end = host_end == std::string::npos ? origin.size() : host_end + 1;
  } else {
    host_end = std::min(origin.find(':', host_start), origin.size());
  }
  const std::string host = origin.substr(host_start, host_end - host_start);
  const std::string without_port = origin.substr(0, host_end);
  const bool loopback = host == "localhost" || host == "127.0.0.1" || host == "[::1]";
  for (const std::string& a : allowed)
    if (a == "*" || a == origin || a == without_port || a == host || (a == "localhost" && loopback))
      return true;
  return false;
}

// Health probes: open without an API key.
bool is_health(const std::string& path) {
  return path == "/health" || path == "/v1/health" || path == "/health/live" ||
         path == "/health/ready";
}

// Routes a load balancer polls: logged at debug level only, so that the default log shows
// the traffic that matters.
bool is_probe(const std::string& path) {
  return is_health(path) || path == "/metrics";
}

}  // namespace

void send_json(httplib::Response& res, const nlohmann::json& body, int status) {
  res.status = status;
  res.set_content(dump_json(body), "application/json; charset=utf-8");
}

void handle_json(const httplib::Request& req, httplib::Response& res,
                 const std::function<void()>& fn) {
  const ErrorStyle style = error_style_for_path(req.path);
  try {
    fn();
  } catch (const ApiError& e) {
    send_json(res, error_body(style, e), e.status());
    if (e.status() == 503) res.set_header("Retry-After", "1");
  } catch (const Error& e) {
    const int status = status_for_error_kind(e.kind());
    send_json(res, error_body(style, status, e.what()), status);
    if (status == 503) res.set_header("Retry-After", "1");
  } catch (const std::exception& e) {
    log::error("{} {}: {}", req.method, req.path, e.what());
    send_json(res, error_body(style, 500, std::string("internal error: ") + e.what()), 500);
  }
}

nlohmann::json request_json(const httplib::Request& req) {
  if (req.has_header("Content-Type")) {
    const std::string type = req.get_header_value("Content-Type");
    const std::string base = type.substr(0, type.find(';'));
    // `curl -d '{...}'`, as Ollama's and llama-server's examples send it, says
    // application/x-www-form-urlencoded; such bodies (and text/plain) are read as JSON too.
    const bool json_like = base == "application/json" || base.find("+json") != std::string::npos ||
                           base == "application/x-www-form-urlencoded" || base == "text/plain";
    if (!json_like)
      throw ApiError(415, "the request body must be JSON (Content-Type: application/json), got " +
                              text_excerpt(type));
  }
  return parse_body_object(req.body);
}

bool failed(const engine::StreamItem& f) {
  return f.finish_reason == engine::FinishReason::kError ||
         f.finish_reason == engine::FinishReason::kCancelled;
}

nlohmann::json failure_body(const engine::StreamItem& f) {
  if (f.finish_reason == engine::FinishReason::kCancelled)
    return error_body(503, "the generation was cut short: " +
                               (f.error.empty() ? std::string("cancelled") : f.error));
  return error_body(500, "generation failed: " + text_excerpt(f.error, 300));
}

void check_final(const engine::StreamItem& f) {
  if (f.finish_reason == engine::FinishReason::kError)
    throw ApiError(500, "generation failed: " + text_excerpt(f.error, 300));
  if (f.finish_reason == engine::FinishReason::kCancelled) {
    // A client that left reads nothing; the status only shows in the log.
    if (client_gone()) throw ApiError(499, "the client closed the connection");
    throw ApiError(503, "the server is shutting down; the generation was cut short");
  }
}

namespace {
// Whether this request asked for X-Hablar-Timings (its own header, or --timings-header); set
// by HttpServer::handle on the thread that runs the request's handler.
thread_local bool t_timings_header = false;
}  // namespace

void set_server_timing(httplib::Response& res, const engine::StreamItem& f) {
  const double prefill = std::max(0.0, f.prompt_ms - f.queue_ms);
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "queue;dur=%.2f, prefill;dur=%.2f, decode;dur=%.2f, detokenize;dur=%.2f",
                f.queue_ms, prefill, f.decode_ms, f.detokenize_ms);
  res.set_header("Server-Timing", buf);
  if (!t_timings_header) return;
  std::snprintf(buf, sizeof buf,
                "queued=%.2f;prefill=%.2f;decode=%.2f;detokenize=%.2f;prompt_tokens=%d;"
                "cached_tokens=%d;tokens=%d",
                f.queue_ms, prefill, f.decode_ms, f.detokenize_ms, f.n_prompt, f.n_cached_prompt,
                f.n_generated);
  res.set_header("X-Hablar-Timings", buf);
}

std::vector<engine::StreamItem> next_items(engine::RequestHandle& handle, int timeout_ms) {
  std::vector<engine::StreamItem> items;
  handle.wait(items, std::chrono::milliseconds(timeout_ms));
  for (auto& it : items)
    if (it.kind == engine::StreamItem::Kind::kFinal) note_final(handle, it);
  return items;
}

void stream_response(httplib::Response& res, const char* content_type, StreamPump pump,
                     std::function<void()> on_abort) {
  struct State {
    StreamPump pump;
    std::function<void()> on_abort;
    bool done = false;
  };
  auto state = std::make_shared<State>(State{std::move(pump), std::move(on_abort)});
  g_open_streams.fetch_add(1);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      content_type,
      [state](size_t, httplib::DataSink& sink) {
        if (state->done) {
          sink.done();
          return true;
        }
        std::string out = state->pump(state->done);
        if (!out.empty() && !sink.write(out.data(), out.size())) return false;
        if (state->done) sink.done();
        return true;
      },
      [state](bool) {
        if (!state->done && state->on_abort) state->on_abort();
        g_open_streams.fetch_sub(1);
      });
}

void Router::add(const char* method, const std::string& pattern, Handler h) {
  routes_.push_back({method, pattern, std::regex(pattern), std::move(h)});
}

std::vector<std::string> Router::plain_paths(const char* method) const {
  std::vector<std::string> out;
  for (const Route& r : routes_)
    if (r.method == method && r.text.find_first_of("()[]{}*+?\\|^$") == std::string::npos)
      out.push_back(r.text);
  return out;
}

const Router::Handler* Router::find(httplib::Request& req, std::string& allow) const {
  allow.clear();
  for (const Route& r : routes_) {
    std::smatch m;
    if (!std::regex_match(req.path, m, r.pattern)) continue;
    if (r.method == req.method) {
      req.matches = std::move(m);
      return &r.handler;
    }
    if (allow.find(r.method) == std::string::npos) allow += (allow.empty() ? "" : ", ") + r.method;
  }
  if (!allow.empty()) allow += ", OPTIONS";
  return nullptr;
}

HttpServer::HttpServer(ServerOptions options)
    : options_(std::move(options)), start_time_(unix_time_now()) {
  if (!options_.otlp_endpoint.empty())
    otlp_ = std::make_unique<OtlpExporter>(options_.otlp_endpoint);
  TransportOptions t;
  t.host = options_.host;
  t.port = options_.port;
  t.limits.max_body_bytes = options_.max_body_bytes;
  t.limits.max_header_bytes = options_.max_header_bytes;
  t.limits.max_headers = options_.max_headers;
  t.header_timeout_seconds = options_.header_timeout_seconds;
  t.body_timeout_seconds = options_.body_timeout_seconds;
  t.idle_timeout_seconds = options_.idle_timeout_seconds;
  t.write_timeout_seconds = options_.timeout_seconds;
  t.max_workers = (size_t)std::max(4, options_.max_http_threads);
  t.max_connections = (size_t)std::max(16, options_.max_connections);
  http_ = std::make_unique<EventServer>(
      t, [this](httplib::Request& req, httplib::Response& res) { handle(req, res); });
  install_routes();
}

HttpServer::~HttpServer() {
  stop_sleep_watch();
}

void HttpServer::bind() {
  bound_port_ = http_->bind();
}

void HttpServer::run() {
  http_->run();
}

void HttpServer::stop() {
  if (stopping_.exchange(true)) return;
  stop_sleep_watch();
  std::shared_ptr<ServingModel> m;
  {
    std::lock_guard<std::mutex> lock(model_mu_);
    m = model_;
  }
  // /health answers 503 from now on. In-flight generations get the grace period; those
  // still running then end as cancelled by shutdown, which the routes send as an error.
  if (m && m->engine) m->engine->shutdown(std::chrono::seconds(options_.shutdown_grace_seconds));
  // Every generation has ended; let the streams write their last chunk before stopping.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (g_open_streams.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  http_->stop();
}

void HttpServer::set_model(std::shared_ptr<ServingModel> model) {
  std::lock_guard<std::mutex> lock(model_mu_);
  model_ = std::move(model);
}

void HttpServer::set_load_error(const std::string& message) {
  std::lock_guard<std::mutex> lock(model_mu_);
  load_error_ = message;
}

std::shared_ptr<ServingModel> HttpServer::model_or_throw() {
  {
    std::lock_guard<std::mutex> lock(model_mu_);
    if (model_) {
      if (counts_as_use()) {
        last_use_ns_ = steady_ns_now();
        window_ns_ = default_window_ns_.load();
      }
      return model_;
    }
    if (!asleep_) {
      if (!load_error_.empty()) throw ApiError(500, "the model failed to load: " + load_error_);
      throw ApiError(503, "Loading model");
    }
  }
  return wake();
}

// CORS, preflight and auth before routing; true when the request is answered here.
bool HttpServer::pre_route(const httplib::Request& req, httplib::Response& res) {
  // CORS as llama-server does it: an allowed Origin is echoed (never "*", which browsers
  // refuse together with credentials) with Access-Control-Allow-Credentials; preflight
  // requests are answered here with 200.
  const std::string origin = req.get_header_value("Origin");
  if (!origin.empty() && origin_allowed(options_.cors_origins, origin)) {
    res.set_header("Access-Control-Allow-Origin", origin);
    res.set_header("Access-Control-Allow-Credentials", "true");
    res.set_header("Vary", "Origin");
  }
  if (req.method == "OPTIONS") {
    res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
    const std::string asked = req.get_header_value("Access-Control-Request-Headers");
    res.set_header("Access-Control-Allow-Headers",
                   asked.empty() ? "Authorization, Content-Type, X-Api-Key" : asked);
    res.set_header("Access-Control-Max-Age", "86400");
    res.status = 200;
    return true;
  }
  // Auth: Bearer key on every API route; health probes and the static page stay open.
  const bool open =
      is_health(req.path) || req.path == "/" || req.path == "/index.html" ||
      req.path == "/favicon.ico" ||
      (!options_.predict_health_route.empty() && req.path == options_.predict_health_route);
  if (!options_.api_keys.empty() && !open) {
    const std::string auth = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    const std::string key = auth.compare(0, prefix.size(), prefix) == 0
                                ? auth.substr(prefix.size())
                                : req.get_header_value("X-Api-Key");
    bool ok = false;
    for (const std::string& k : options_.api_keys) ok |= constant_time_equal(k, key);
    if (!ok) {
      send_json(res,
                error_body(error_style_for_path(req.path), 401,
                           "invalid or missing API key (Authorization: Bearer ... or x-api-key)"),
                401);
      res.set_header("WWW-Authenticate", "Bearer");
      return true;
    }
  }
  return false;
}

namespace {
int64_t unix_ns_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void HttpServer::handle(httplib::Request& req, httplib::Response& res) {
  const auto start = std::chrono::steady_clock::now();
  t_timings_header = options_.timings_header || req.has_header("X-Hablar-Timings");
  Span span;
  if (otlp_) {
    start_span(span, req.get_header_value("traceparent"));
    span.start_unix_ns = unix_ns_now();
  }
  route(req, res);
  if (otlp_) {
    // A stream's span ends when its headers go out (its body is written afterwards).
    span.end_unix_ns = unix_ns_now();
    span.method = req.method;
    span.path = req.path;
    span.name = req.method + " " + req.path;
    span.status = res.status;
    otlp_->add(std::move(span));
  }
  // One line per request at the default level (a stream's line comes when its headers go
  // out; the time is the time to its first byte).
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const bool stream = res.is_chunked_content_provider_;
  if (is_probe(req.path))
    log::debug("{} {} {} {} {:.1f} ms", req.remote_addr, req.method, req.path, res.status, ms);
  else
    log::info("{} {} {} {}{} {:.1f} ms", req.remote_addr, req.method, req.path, res.status,
              stream ? " (stream)" : "", ms);
}

void HttpServer::route(httplib::Request& req, httplib::Response& res) {
  if (pre_route(req, res)) return;
  if (asleep_ && answer_asleep(req, res)) return;
  const ReadOnlyScope read_only(req);
  std::string allow;
  const Router::Handler* h = router_.find(req, allow);
  const ErrorStyle style = error_style_for_path(req.path);
  if (!h) {
    if (allow.empty()) {
      send_json(res,
                error_body(style, 404,
                           "no route for " + text_excerpt(req.method, 16) + " " +
                               text_excerpt(req.path, 200)),
                404);
    } else {
      send_json(res,
                error_body(style, 405,
                           "method " + text_excerpt(req.method, 16) + " is not allowed on " +
                               text_excerpt(req.path, 200) + " (allowed: " + allow + ")"),
                405);
      res.set_header("Allow", allow);
    }
    return;
  }
  try {
    (*h)(req, res);
  } catch (const std::exception& e) {
    log::error("{} {}: {}", req.method, req.path, e.what());
    send_json(res, error_body(style, 500, "internal error: " + text_excerpt(e.what(), 200)), 500);
  }
}

void HttpServer::install_routes() {
  install_openai_routes(router_, *this);
  install_llama_routes(router_, *this);
  install_slot_routes(router_, *this);
  install_ollama_routes(router_, *this);
  install_anthropic_routes(router_, *this);
  install_responses_routes(router_, *this);
  install_embedding_routes(router_, *this);
  install_web_routes(router_, *this);
  install_predict_routes(router_, *this);
}

}  // namespace hablar::server
