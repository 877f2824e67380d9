// The HTTP server: cpp-httplib with an elastic thread pool (one thread per open connection,
// created on demand up to a limit, so a thousand idle or streaming clients cost threads, not
// a stalled engine), OpenAI / llama.cpp / Ollama routes, auth, CORS, limits and the web page.
//
// The server listens before the model is loaded: /health answers 503 until set_model().
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "server/serving_model.h"

namespace httplib {
class Server;
class Request;
class Response;
}  // namespace httplib

namespace hablar::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::vector<std::string> api_keys;  // empty: no auth
  std::vector<std::string> cors_origins = {"*"};
  size_t max_body_bytes = 8u << 20;
  int max_http_threads = 1100;
  int timeout_seconds = 600;  // read/write timeout of a connection (a client that reads nothing)
  int shutdown_grace_seconds = 10;
  bool enable_metrics = false;
  bool enable_slots = true;
  bool enable_webui = true;
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

  // For the route files.
  std::shared_ptr<ServingModel> model_or_throw() const;  // ApiError 503 while loading
  const ServerOptions& options() const { return options_; }
  bool stopping() const { return stopping_.load(); }

 private:
  void install_middleware();
  void install_routes();

  ServerOptions options_;
  std::unique_ptr<httplib::Server> http_;
  int bound_port_ = 0;
  mutable std::mutex model_mu_;
  std::shared_ptr<ServingModel> model_;
  std::string load_error_;
  std::atomic<bool> stopping_{false};
};

// Route installers (routes_*.cpp).
void install_openai_routes(httplib::Server& http, HttpServer& server);
void install_llama_routes(httplib::Server& http, HttpServer& server);
void install_ollama_routes(httplib::Server& http, HttpServer& server);
void install_web_routes(httplib::Server& http, HttpServer& server);

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

// Waits up to `timeout` for items of one handle.
std::vector<engine::StreamItem> next_items(engine::RequestHandle& handle, int timeout_ms = 100);

}  // namespace hablar::server
