// Sleeping (--sleep-idle-seconds): the model leaves memory while no one needs it and comes
// back on the next request that does. A watcher thread checks the idle time a few times a
// second; falling asleep first records what the read-only routes answer, so that probes,
// dashboards and metric scrapers neither wake the model nor see it missing.
#include <httplib.h>

#include <chrono>
#include <thread>

#include "core/log.h"
#include "server/api_error.h"
#include "server/http_server.h"

namespace hablar::server {
namespace {

// The read-only GET routes answered from the snapshot while asleep.
constexpr const char* kSnapshotPaths[] = {"/health",  "/v1/health", "/health/ready", "/health/live",
                                          "/props",   "/v1/models", "/models",       "/slots",
                                          "/metrics", "/api/tags"};
constexpr auto kWatchPeriod = std::chrono::milliseconds(100);

// Set while this thread runs a read-only route: reading the model's description is not a use
// (a dashboard polling /props must not keep it awake).
thread_local bool t_read_only = false;

bool is_read_only(const httplib::Request& req) {
  if (req.method != "GET" && req.method != "HEAD") return false;
  if (req.path == "/api/ps") return true;
  for (const char* path : kSnapshotPaths)
    if (req.path == path) return true;
  return false;
}

}  // namespace

bool HttpServer::counts_as_use() {
  return !t_read_only;
}

HttpServer::ReadOnlyScope::ReadOnlyScope(const httplib::Request& req) : previous_(t_read_only) {
  if (is_read_only(req)) t_read_only = true;
}

HttpServer::ReadOnlyScope::~ReadOnlyScope() {
  t_read_only = previous_;
}

int64_t steady_ns_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void HttpServer::enable_sleep(int idle_seconds,
                              std::function<std::shared_ptr<ServingModel>()> reload) {
  if (watcher_.joinable()) return;
  default_window_ns_ = idle_seconds > 0 ? (int64_t)idle_seconds * 1'000'000'000 : -1;
  window_ns_ = default_window_ns_.load();
  reload_ = std::move(reload);
  last_use_ns_ = steady_ns_now();
  watcher_ = std::thread([this] { watch_idle(); });
}

void HttpServer::stop_sleep_watch() {
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    watch_stop_ = true;
  }
  watch_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

void HttpServer::watch_idle() {
  std::unique_lock<std::mutex> lock(watch_mu_);
  while (!watch_cv_.wait_for(lock, kWatchPeriod, [this] { return watch_stop_; })) {
    lock.unlock();
    try {
      try_to_sleep();
    } catch (const std::exception& e) {
      log::error("sleep: {}", e.what());
    }
    lock.lock();
  }
}

void HttpServer::try_to_sleep() {
  const int64_t window = window_ns_;
  if (asleep_ || stopping_ || window < 0 || steady_ns_now() - last_use_ns_ < window) return;
  std::lock_guard<std::mutex> wake_lock(wake_mu_);
  std::shared_ptr<ServingModel> m;
  {
    std::lock_guard<std::mutex> lock(model_mu_);
    m = model_;
  }
  if (!m) return;  // still loading
  const engine::MetricsSnapshot s = m->engine->metrics().snapshot();
  if (s.requests_running > 0 || s.requests_waiting > 0) return;
  const int64_t seen_use = last_use_ns_;
  // What the read-only routes answer now, as they will while asleep.
  std::map<std::string, Snapshot> snapshots;
  for (const char* path : kSnapshotPaths) {
    httplib::Request req;
    req.method = "GET";
    req.path = req.target = path;
    httplib::Response res;
    route(req, res);
    Snapshot& shot = snapshots[path];
    shot.status = res.status < 0 ? 200 : res.status;  // routes leave -1 for a plain 200
    shot.content_type = res.get_header_value("Content-Type");
    shot.body = res.body;
    if (shot.status == 200 && std::string_view(path) == "/metrics") {
      httplib::Response again;
      route(req, again);
      shot.repeat_body = again.body;
    }
  }
  if (auto& props = snapshots["/props"]; props.status == 200) {
    nlohmann::json j = nlohmann::json::parse(props.body, nullptr, false);
    if (j.is_object()) {
      j["is_sleeping"] = true;
      props.body = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
  }
  {
    std::lock_guard<std::mutex> lock(model_mu_);
    if (last_use_ns_ != seen_use) return;  // a request took the model meanwhile
    snapshots_ = std::move(snapshots);
    asleep_ = true;
    model_.reset();
  }
  m.reset();  // the memory goes with the last holder (a stream finishing its last bytes)
  log::info("sleeping after {:.1f} s idle: the model is unloaded until a request needs it",
            (double)window / 1e9);
}

void HttpServer::unload_when_idle() {
  window_ns_ = 0;
  watch_cv_.notify_all();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (!asleep_ && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

std::optional<int64_t> HttpServer::expires_at() const {
  const int64_t window = window_ns_;
  if (window < 0) return std::nullopt;
  const int64_t left_ns = last_use_ns_ + window - steady_ns_now();
  return unix_time_now() + std::max<int64_t>(0, left_ns / 1'000'000'000);
}

std::shared_ptr<ServingModel> HttpServer::wake() {
  std::lock_guard<std::mutex> wake_lock(wake_mu_);
  {
    std::lock_guard<std::mutex> lock(model_mu_);
    if (model_) {  // another request woke it while this one waited
      last_use_ns_ = steady_ns_now();
      window_ns_ = default_window_ns_.load();
      return model_;
    }
  }
  log::info("waking: loading the model again");
  const auto start = std::chrono::steady_clock::now();
  std::shared_ptr<ServingModel> m;
  try {
    m = reload_();
  } catch (const std::exception& e) {
    log::error("waking: the model failed to load: {}", e.what());
    throw ApiError(500, "the model failed to load on waking: " + text_excerpt(e.what(), 300));
  }
  {
    std::lock_guard<std::mutex> lock(model_mu_);
    model_ = m;
    asleep_ = false;
    snapshots_.clear();
    last_use_ns_ = steady_ns_now();
    // A use like any other: the idle window is the default again (a keep_alive 0 that put
    // the model to sleep does not unload it again after this request).
    window_ns_ = default_window_ns_.load();
  }
  log::info(
      "awake after {:.0f} ms",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  return m;
}

bool HttpServer::answer_asleep(const httplib::Request& req, httplib::Response& res) {
  if (req.method != "GET" && req.method != "HEAD") return false;
  if (req.path == "/api/ps") {  // Ollama's running models: none while asleep
    send_json(res, {{"models", nlohmann::json::array()}});
    return true;
  }
  std::lock_guard<std::mutex> lock(model_mu_);
  if (!asleep_) return false;
  const auto it = snapshots_.find(req.path);
  if (it == snapshots_.end()) return false;
  Snapshot& shot = it->second;
  const bool repeat = shot.served && !shot.repeat_body.empty();
  shot.served = true;
  res.status = shot.status;
  res.set_content(repeat ? shot.repeat_body : shot.body,
                  shot.content_type.empty() ? "application/json" : shot.content_type.c_str());
  return true;
}

}  // namespace hablar::server
