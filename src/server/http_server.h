// The HTTP server: the event-driven transport (event_server.h: idle and slow connections
// cost no thread; running requests get a worker from a bounded pool), a router that answers
// 404 / 405 with Allow, OpenAI / llama.cpp / Ollama routes, auth, CORS, limits and the web
// page. Routes use cpp-httplib's Request / Response types as plain data.
//
// The server listens before the model is loaded: /health answers 503 until set_model().
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <regex>

#include "server/event_server.h"
#include "server/otlp_exporter.h"
#include "server/serving_model.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace hablar::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::vector<std::string> api_keys;  // empty: no auth
  std::vector<std::string> cors_origins = {"*"};
  size_t max_body_bytes = 8u << 20;     // decoded request body, whatever the framing
  size_t max_header_bytes = 64 * 1024;  // request line and headers together
  size_t max_headers = 100;
  int max_http_threads = 1024;  // workers running requests; idle connections take none
  int max_connections = 20000;
  int timeout_seconds = 600;        // write timeout (a client that reads nothing)
  int header_timeout_seconds = 10;  // to receive a request's headers
  int body_timeout_seconds = 60;    // to receive its body
  int idle_timeout_seconds = 5;     // keep-alive connection with no new request
  int shutdown_grace_seconds = 10;
  bool enable_metrics = false;
  bool enable_slots = true;
  // --slot-save-path: the directory slot files are saved to and restored from
  // (routes_slots.cpp); empty: save and restore answer 501.
  std::string slot_save_path;
  bool enable_webui = true;
  // X-Hablar-Timings on every non-streamed generation (queued, prefill, decode, detokenize
  // ms and token counts); without it, only requests that send an X-Hablar-Timings header
  // get it.
  bool timings_header = false;
  std::string otlp_endpoint;  // OTLP/HTTP collector for request spans; empty: none
  // Vertex AI (Google Cloud) prediction: POST here takes {"instances": [...]}, runs each on
  // the route its "@requestFormat" names and answers {"predictions": [...]}; empty: off.
  std::string predict_route;
  std::string predict_health_route;  // answers as /health does (no API key); empty: none
};

// Routes by method and path (a regex, matched whole; captures in req.matches).
class Router {
 public:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;
  void Get(const std::string& pattern, Handler h) { add("GET", pattern, std::move(h)); }
  void Post(const std::string& pattern, Handler h) { add("POST", pattern, std::move(h)); }
  void Delete(const std::string& pattern, Handler h) { add("DELETE", pattern, std::move(h)); }
  // The handler for the request, or null; then `allow` lists the methods the path has
  // (empty: no such path).
  const Handler* find(httplib::Request& req, std::string& allow) const;
  // The method's routes whose pattern is a plain path (no regex syntax), in the order added.
  std::vector<std::string> plain_paths(const char* method) const;

 private:
  void add(const char* method, const std::string& pattern, Handler h);
  struct Route {
    std::string method;
    std::string text;
    std::regex pattern;
    Handler handler;
  };
  std::vector<Route> routes_;
};

class HttpServer {
 public:
  explicit HttpServer(ServerOptions options);
  ~HttpServer();

  // Binds the port; throws Error when it cannot.
  void bind();
  int port() const { return bound_port_; }
  // Serves until stop(); blocking.
  void run();
  // Stops accepting, lets running generations finish (up to the grace period), returns.
  void stop();

  void set_model(std::shared_ptr<ServingModel> model);
  void set_load_error(const std::string& message);

  // Sleeping (--sleep-idle-seconds): once no request has needed the model for `idle_seconds`
  // and the engine runs nothing, the model is unloaded (weights, KV cache, device memory);
  // the next request that needs it loads it again with `reload`, waiting meanwhile. Asleep,
  // the read-only routes (health, /props, /models, /slots, /metrics, Ollama's /api/tags and
  // /api/ps) answer from a snapshot taken on falling asleep and wake nothing.
  // Without idle_seconds > 0 the model only sleeps when a request's keep_alive says so.
  void enable_sleep(int idle_seconds, std::function<std::shared_ptr<ServingModel>()> reload);
  bool sleeping() const { return asleep_.load(); }
  // Ollama's keep_alive, for the request being served (after model_or_throw): how long the
  // model stays loaded once idle (negative: for good; 0: unloaded as soon as nothing runs).
  void keep_alive(int64_t ns) { window_ns_ = ns < 0 ? -1 : ns; }
  // Unloads the model as soon as nothing runs (Ollama's keep_alive 0 without a prompt),
  // waking nothing; returns when it is asleep or after a few seconds if requests still run.
  void unload_when_idle();
  // Unix seconds after which an idle model is unloaded; nullopt: never.
  std::optional<int64_t> expires_at() const;

  // For the route files.
  // The model, loaded again first when asleep; ApiError 503 while loading at startup.
  std::shared_ptr<ServingModel> model_or_throw();
  const ServerOptions& options() const { return options_; }
  bool stopping() const { return stopping_.load(); }
  int64_t start_time() const { return start_time_; }  // unix seconds the server started
  // Runs a request made inside the server (the predict route's instances) as if it had come
  // in: auth, routing and the JSON errors of every route.
  void dispatch(httplib::Request& req, httplib::Response& res) { route(req, res); }

 private:
  void handle(httplib::Request& req, httplib::Response& res);
  void route(httplib::Request& req, httplib::Response& res);
  bool pre_route(const httplib::Request& req, httplib::Response& res);
  void install_routes();
  // Sleeping (http_server_sleep.cpp).
  void watch_idle();
  void try_to_sleep();
  std::shared_ptr<ServingModel> wake();
  static bool counts_as_use();
  // Marks the thread's request as read-only (not a use of the model) while it runs.
  class ReadOnlyScope {
   public:
    explicit ReadOnlyScope(const httplib::Request& req);
    ~ReadOnlyScope();

   private:
    bool previous_;
  };
  bool answer_asleep(const httplib::Request& req, httplib::Response& res);
  void stop_sleep_watch();

  ServerOptions options_;
  Router router_;
  std::unique_ptr<EventServer> http_;
  int bound_port_ = 0;
  mutable std::mutex model_mu_;
  std::shared_ptr<ServingModel> model_;
  std::string load_error_;
  std::atomic<bool> stopping_{false};
  int64_t start_time_ = 0;
  std::unique_ptr<OtlpExporter> otlp_;

  struct Snapshot {
    int status = 200;
    std::string body, content_type;
    // /metrics: its throughput gauges cover the time since the previous scrape, so only the
    // first scrape while asleep sees the last activity; later ones get this (zero rates).
    std::string repeat_body;
    bool served = false;
  };
  std::function<std::shared_ptr<ServingModel>()> reload_;
  std::atomic<bool> asleep_{false};
  std::atomic<int64_t> last_use_ns_{0};         // steady clock; set under model_mu_
  std::atomic<int64_t> window_ns_{-1};          // idle time before sleeping; -1: never
  std::atomic<int64_t> default_window_ns_{-1};  // --sleep-idle-seconds
  std::mutex wake_mu_;                          // one loader; held while falling asleep
  std::map<std::string, Snapshot> snapshots_;   // path -> answer while asleep (model_mu_)
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool watch_stop_ = false;
  std::thread watcher_;
};

// Nanoseconds on the steady clock (idle times).
int64_t steady_ns_now();

// Route installers (routes_*.cpp).
void install_openai_routes(Router& http, HttpServer& server);
void install_llama_routes(Router& http, HttpServer& server);
void install_slot_routes(Router& http, HttpServer& server);
void install_ollama_routes(Router& http, HttpServer& server);
void install_anthropic_routes(Router& http, HttpServer& server);
void install_responses_routes(Router& http, HttpServer& server);
void install_web_routes(Router& http, HttpServer& server);
void install_embedding_routes(Router& http, HttpServer& server);
// The Vertex AI predict and health routes (options().predict_route); installed last, as it
// names the routes installed before it.
void install_predict_routes(Router& http, HttpServer& server);

// Runs `fn`, turning ApiError / Error / exceptions into JSON errors with the right status.
void handle_json(const httplib::Request& req, httplib::Response& res,
                 const std::function<void()>& fn);
// Parses the body as a JSON object after checking its content type (415 otherwise).
nlohmann::json request_json(const httplib::Request& req);
void send_json(httplib::Response& res, const nlohmann::json& body, int status = 200);

// Streams a response. `pump` waits briefly (about 100 ms at most) for more output and
// returns the bytes to send, setting `done` after the last. A client that goes away (or stops
// reading until the write timeout) triggers `on_abort`, which cancels the generation; its
// blocks are freed at the next step.
using StreamPump = std::function<std::string(bool& done)>;
void stream_response(httplib::Response& res, const char* content_type, StreamPump pump,
                     std::function<void()> on_abort);

// Turns a non-streamed generation's end into the response's status: 503 when the server cut
// it short at shutdown, 499-style cancellation when the client left (nothing is sent then),
// 500 on an engine error. Returns normally for a finished generation.
void check_final(const engine::StreamItem& final);
// A stream's end that is not a normal finish (engine error, cut at shutdown): the error
// body to send as the stream's last event (the stream then has no "stop" finish).
bool failed(const engine::StreamItem& final);
nlohmann::json failure_body(const engine::StreamItem& final);

// The W3C Server-Timing header of a non-streamed generation (queue, prefill, decode and
// detokenize durations in ms): browsers' developer tools and HTTP tooling show it without
// parsing bodies. Also X-Hablar-Timings (the same with token counts, in one
// `key=value;...` line) when the request asked for it or the server has --timings-header.
void set_server_timing(httplib::Response& res, const engine::StreamItem& final);

// Waits up to `timeout` for items of one handle.
std::vector<engine::StreamItem> next_items(engine::RequestHandle& handle, int timeout_ms = 100);

}  // namespace hablar::server
