#include "server/http_server.h"

#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <thread>

#include "core/log.h"
#include "server/api_error.h"
#include "server/request_fields.h"

namespace hablar::server {

namespace {

constexpr int kKeepAliveSeconds = 5;

// Streams whose last bytes are not yet written. httplib cuts chunked responses short once it
// is stopping, so stop() waits for these to drain first.
std::atomic<int> g_open_streams{0};

// httplib's task queue: a thread per connection, created when no idle thread is there, up
// to `max_threads`; idle threads exit after a while. Beyond the limit, connections wait.
class ElasticTaskQueue : public httplib::TaskQueue {
 public:
  explicit ElasticTaskQueue(size_t max_threads) : max_threads_(max_threads) {}
  ~ElasticTaskQueue() override = default;

  void enqueue(std::function<void()> fn) override {
    std::unique_lock<std::mutex> lock(mu_);
    jobs_.push_back(std::move(fn));
    if (idle_ == 0 && live_ < max_threads_) {
      live_ += 1;
      std::thread([this] { work(); }).detach();
    } else {
      cv_.notify_one();
    }
  }

  // Waits for the connection threads, but not past the keep-alive timeout and a little:
  // a client holding an idle keep-alive connection must not stall a shutdown. Threads still
  // alive then are abandoned to the process exit (the caller exits right after).
  void shutdown() override {
    std::unique_lock<std::mutex> lock(mu_);
    shutdown_ = true;
    cv_.notify_all();
    done_cv_.wait_for(lock, std::chrono::seconds(kKeepAliveSeconds + 1),
                      [&] { return live_ == 0; });
    all_joined_ = live_ == 0;
  }
  bool all_joined() const { return all_joined_; }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      idle_ += 1;
      const bool got =
          cv_.wait_for(lock, std::chrono::seconds(30), [&] { return !jobs_.empty() || shutdown_; });
      idle_ -= 1;
      if (jobs_.empty() && (shutdown_ || !got)) break;
      if (jobs_.empty()) continue;
      auto fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
    live_ -= 1;
    done_cv_.notify_all();
  }

  size_t max_threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::function<void()>> jobs_;
  size_t live_ = 0, idle_ = 0;
  bool shutdown_ = false;
  bool all_joined_ = false;
};

// The packaged httplib listens with a backlog of 5; a burst of clients connecting at once
// would then wait for SYN retries. Raise it on our listening socket (listen() again only
// changes the backlog).
void raise_listen_backlog(int port) {
  for (int fd = 3; fd < 1024; ++fd) {
    int accepting = 0;
    socklen_t len = sizeof(accepting);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0 || !accepting) continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof(addr);
    if (getsockname(fd, (sockaddr*)&addr, &alen) != 0) continue;
    int p = addr.ss_family == AF_INET6 ? ntohs(((sockaddr_in6*)&addr)->sin6_port)
                                       : ntohs(((sockaddr_in*)&addr)->sin_port);
    if (p == port) ::listen(fd, 4096);
  }
}

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

}  // namespace

void send_json(httplib::Response& res, const nlohmann::json& body, int status) {
  res.status = status;
  res.set_content(dump_json(body), "application/json; charset=utf-8");
}

void handle_json(const httplib::Request& req, httplib::Response& res,
                 const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    send_json(res, error_body(e.status(), e.what(), e.param()), e.status());
    if (e.status() == 503) res.set_header("Retry-After", "1");
  } catch (const Error& e) {
    const int status = status_for_error_kind(e.kind());
    send_json(res, error_body(status, e.what()), status);
    if (status == 503) res.set_header("Retry-After", "1");
  } catch (const std::exception& e) {
    log::error("{} {}: {}", req.method, req.path, e.what());
    send_json(res, error_body(500, std::string("internal error: ") + e.what()), 500);
  }
}

nlohmann::json request_json(const httplib::Request& req) {
  if (req.has_header("Content-Type")) {
    const std::string type = req.get_header_value("Content-Type");
    const std::string base = type.substr(0, type.find(';'));
    if (base != "application/json" && base.find("+json") == std::string::npos)
      throw ApiError(415, "the request body must be JSON (Content-Type: application/json), got " +
                              text_excerpt(type));
  }
  return parse_body_object(req.body);
}

std::vector<engine::StreamItem> next_items(engine::RequestHandle& handle, int timeout_ms) {
  std::vector<engine::StreamItem> items;
  handle.wait(items, std::chrono::milliseconds(timeout_ms));
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

HttpServer::HttpServer(ServerOptions options)
    : options_(std::move(options)), http_(std::make_unique<httplib::Server>()) {
  const size_t max_threads = (size_t)std::max(4, options_.max_http_threads);
  http_->new_task_queue = [max_threads] { return new ElasticTaskQueue(max_threads); };
  http_->set_payload_max_length(options_.max_body_bytes);
  http_->set_read_timeout(options_.timeout_seconds, 0);
  http_->set_write_timeout(options_.timeout_seconds, 0);
  http_->set_tcp_nodelay(true);  // SSE writes many small chunks: no Nagle delays
  http_->set_keep_alive_max_count(1000);
  http_->set_keep_alive_timeout(kKeepAliveSeconds);
  install_middleware();
  install_routes();
}

HttpServer::~HttpServer() = default;

void HttpServer::bind() {
  if (options_.port == 0) {
    bound_port_ = http_->bind_to_any_port(options_.host);
  } else {
    bound_port_ = http_->bind_to_port(options_.host, options_.port) ? options_.port : -1;
  }
  if (bound_port_ <= 0)
    throw_error(ErrorKind::kIo, "cannot listen on " + options_.host + ":" +
                                    std::to_string(options_.port) +
                                    " (address in use or not available)");
  raise_listen_backlog(bound_port_);
}

void HttpServer::run() {
  http_->listen_after_bind();
}

void HttpServer::stop() {
  if (stopping_.exchange(true)) return;
  std::shared_ptr<ServingModel> m;
  {
    std::lock_guard<std::mutex> lock(model_mu_);
    m = model_;
  }
  // In-flight generations finish (streams end with their final chunk), then the listener.
  if (m && m->engine) m->engine->shutdown(std::chrono::seconds(options_.shutdown_grace_seconds));
  // Every generation has ended; let the streams write their last chunk before httplib stops.
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

std::shared_ptr<ServingModel> HttpServer::model_or_throw() const {
  std::lock_guard<std::mutex> lock(model_mu_);
  if (!model_) {
    if (!load_error_.empty()) throw ApiError(500, "the model failed to load: " + load_error_);
    throw ApiError(503, "Loading model");
  }
  return model_;
}

void HttpServer::install_middleware() {
  http_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // CORS: echo an allowed origin; answer preflight requests here.
    const std::string origin = req.get_header_value("Origin");
    if (!origin.empty()) {
      for (const std::string& allowed : options_.cors_origins) {
        if (allowed == "*" || allowed == origin) {
          res.set_header("Access-Control-Allow-Origin", allowed == "*" ? "*" : origin);
          if (allowed != "*") res.set_header("Vary", "Origin");
          break;
        }
      }
    }
    if (req.method == "OPTIONS") {
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
      res.set_header("Access-Control-Max-Age", "86400");
      res.status = 204;
      return httplib::Server::HandlerResponse::Handled;
    }
    // Auth: Bearer key on every API route; /health and the static page stay open.
    const bool open = req.path == "/health" || req.path == "/" || req.path == "/index.html" ||
                      req.path == "/favicon.ico";
    if (!options_.api_keys.empty() && !open) {
      const std::string auth = req.get_header_value("Authorization");
      const std::string prefix = "Bearer ";
      const std::string key = auth.compare(0, prefix.size(), prefix) == 0
                                  ? auth.substr(prefix.size())
                                  : req.get_header_value("X-Api-Key");
      bool ok = false;
      for (const std::string& k : options_.api_keys) ok |= constant_time_equal(k, key);
      if (!ok) {
        send_json(res, error_body(401, "invalid or missing API key (Authorization: Bearer ...)"),
                  401);
        res.set_header("WWW-Authenticate", "Bearer");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // Statuses httplib sets itself (404 unknown route, 413 body too large, 400 bad request
  // line) get a JSON body in the same shape as ours.
  http_->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = "request failed";
    if (res.status == 404) message = "no route for " + req.method + " " + text_excerpt(req.path, 200);
    if (res.status == 405) message = "method " + req.method + " not allowed on " + text_excerpt(req.path, 200);
    if (res.status == 413) message = "the request body is larger than the server accepts";
    if (res.status == 400) message = "malformed HTTP request";
    send_json(res, error_body(res.status, message), res.status);
  });
  http_->set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        log::error("{} {}: {}", req.method, req.path, what);
        send_json(res, error_body(500, "internal error: " + what), 500);
      });
}

void HttpServer::install_routes() {
  install_openai_routes(*http_, *this);
  install_llama_routes(*http_, *this);
  install_ollama_routes(*http_, *this);
  install_web_routes(*http_, *this);
}

}  // namespace hablar::server
