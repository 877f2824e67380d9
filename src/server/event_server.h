// The HTTP/1.1 transport: one epoll thread reads every connection's request (headers and
// body, under size limits and deadlines), and a bounded, elastic pool of worker threads runs
// the complete requests and writes their responses. A connection that is idle, slow or still
// sending costs a file descriptor and its buffer, never a thread: ten thousand slow clients
// leave the workers to everyone else. (See docs/ARCHITECTURE.md for why this is hand-written
// on epoll rather than cpp-httplib's thread per connection.)
//
// While a request runs, its socket stays watched for the peer closing (EPOLLRDHUP): the
// handler sees client_gone() turn true within one poll, streamed or not, and cancels.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "server/http_wire.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace hablar::server {

struct TransportOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  wire::WireLimits limits;
  int header_timeout_seconds = 10;  // from the first byte (or keep-alive start) to the last header
  int body_timeout_seconds = 60;    // from the end of the headers to the last body byte
  int idle_timeout_seconds = 5;     // a kept-alive connection with no new request
  int write_timeout_seconds = 600;  // a client that reads nothing of its response
  size_t max_workers = 1024;        // threads running requests (streams hold one each)
  size_t max_connections = 20000;   // open connections beyond which new ones are closed
};

// Runs one request: fills `res` (a plain body, or a chunked content provider).
using RequestHandler = std::function<void(httplib::Request& req, httplib::Response& res)>;

class EventServer {
 public:
  EventServer(TransportOptions options, RequestHandler handler);
  ~EventServer();
  EventServer(const EventServer&) = delete;
  EventServer& operator=(const EventServer&) = delete;

  // Binds and listens; returns the port (the chosen one for port 0). Throws Error.
  int bind();
  // Serves until stop(); blocking.
  void run();
  // Stops accepting and serving; run() returns. Workers still writing are abandoned to the
  // process exit (the caller has let streams drain first).
  void stop();

  size_t open_connections() const { return n_connections_.load(); }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<size_t> n_connections_{0};
};

// True when the client of the request this thread is running has gone away (closed its
// socket); false outside a request. Handlers poll it while they wait for the engine.
bool client_gone();

// Lets another thread working for the current request see its client_gone() (a request fanned
// out to helper threads): take client_watch() on the request's thread, hold a
// ClientWatchScope with it on the helper while the request is still running.
const std::atomic<bool>* client_watch();
class ClientWatchScope {
 public:
  explicit ClientWatchScope(const std::atomic<bool>* watch);
  ~ClientWatchScope();
  ClientWatchScope(const ClientWatchScope&) = delete;
  ClientWatchScope& operator=(const ClientWatchScope&) = delete;

 private:
  const std::atomic<bool>* previous_;
};

}  // namespace hablar::server
