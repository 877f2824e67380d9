#include "server/event_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace hablar::server {

namespace {

using Clock = std::chrono::steady_clock;

thread_local const std::atomic<bool>* t_gone = nullptr;

// Requests longer than this in their target get 414: routes match paths with std::regex,
// whose matching recurses per character.
constexpr size_t kMaxTargetBytes = 8192;

struct Conn {
  enum class State { kHead, kBody, kBusy, kClosing };
  int fd = -1;
  State state = State::kHead;
  std::string in;           // bytes read and not yet consumed
  size_t head_scanned = 0;  // of `in`, while looking for the end of the head
  wire::RequestHead head;
  std::string body;
  std::unique_ptr<wire::ChunkedDecoder> chunked;
  Clock::time_point deadline;
  std::atomic<bool> gone{false};
  bool keep_alive = false;
  std::string remote_addr;
  int remote_port = 0;
};

const char* reason_phrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Content Too Large";
    case 414:
      return "URI Too Long";
    case 415:
      return "Unsupported Media Type";
    case 417:
      return "Expectation Failed";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return status < 400 ? "OK" : "Error";
  }
}

// Writes all of `data` to a non-blocking socket, waiting for room up to `timeout_ms` at a
// time; false when the peer is gone or reads nothing for that long.
bool write_all(int fd, const char* data, size_t n, int timeout_ms, const std::atomic<bool>* gone) {
  while (n > 0) {
    if (gone && gone->load()) return false;
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w > 0) {
      data += w;
      n -= (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, timeout_ms) <= 0 || (p.revents & (POLLERR | POLLHUP))) return false;
      continue;
    }
    return false;
  }
  return true;
}

std::string error_response(int status, const std::string& message) {
  std::string body =
      "{\"error\":{\"message\":\"" + message +
      "\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":" + std::to_string(status) +
      "}}";
  return "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) +
         "\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

std::string percent_decode(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit((unsigned char)s[i + 1]) &&
        std::isxdigit((unsigned char)s[i + 2])) {
      out += (char)std::stoi(s.substr(i + 1, 2), nullptr, 16);
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The elastic worker pool: a thread per running request, created when none is idle, up to
// a limit; beyond it requests wait in the queue (they hold no thread while waiting).
class WorkerPool {
 public:
  explicit WorkerPool(size_t max_threads) : max_threads_(max_threads) {}
  void post(std::function<void()> job) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
    // An idle thread wakes for one job only: start another when the queue outgrows them.
    if (jobs_.size() > idle_ && live_ < max_threads_) {
      live_ += 1;
      std::thread([this] { work(); }).detach();
    } else {
      cv_.notify_one();
    }
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      idle_ += 1;
      const bool got = cv_.wait_for(lock, std::chrono::seconds(30), [&] { return !jobs_.empty(); });
      idle_ -= 1;
      if (!got) break;  // idle for long: the thread goes
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
    live_ -= 1;
  }

  size_t max_threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  size_t live_ = 0, idle_ = 0;
};

}  // namespace

bool client_gone() {
  return t_gone && t_gone->load();
}

const std::atomic<bool>* client_watch() {
  return t_gone;
}

ClientWatchScope::ClientWatchScope(const std::atomic<bool>* watch) : previous_(t_gone) {
  t_gone = watch;
}

ClientWatchScope::~ClientWatchScope() {
  t_gone = previous_;
}

struct EventServer::Impl {
  TransportOptions opt;
  RequestHandler handler;
  std::atomic<size_t>* n_connections = nullptr;
  std::vector<int> listen_fds;  // one per address of --host
  int epoll_fd = -1, wake_fd = -1;
  std::atomic<bool> stop{false};
  bool accept_paused = false;  // out of descriptors: resumed at the next sweep
  std::unordered_map<int, std::shared_ptr<Conn>> conns;
  std::mutex back_mu;  // connections workers hand back (keep-alive or close)
  std::vector<std::shared_ptr<Conn>> back;
  WorkerPool pool;

  Impl(TransportOptions o, RequestHandler h)
      : opt(std::move(o)), handler(std::move(h)), pool(std::max<size_t>(4, opt.max_workers)) {}

  void watch(Conn& c, uint32_t events, int op) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = c.fd;
    epoll_ctl(epoll_fd, op, c.fd, &ev);
  }
  void close_conn(const std::shared_ptr<Conn>& c) {
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c->fd, nullptr);
    ::close(c->fd);
    conns.erase(c->fd);
    n_connections->fetch_sub(1);
  }
  // Answers an error the transport found itself and closes (the framing cannot be trusted).
  // The close lingers up to a second, reading and dropping what the client still sends:
  // closing with unread bytes would reset the connection, and the client would likely lose
  // the answer (e.g. a 413 while it is still uploading).
  void refuse(const std::shared_ptr<Conn>& c, int status, const std::string& message) {
    const std::string r = error_response(status, message);
    (void)::send(c->fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::shutdown(c->fd, SHUT_WR);
    c->state = Conn::State::kClosing;
    c->in.clear();
    c->body.clear();
    c->chunked.reset();
    c->deadline = Clock::now() + std::chrono::seconds(1);
  }
  void start_head(Conn& c, int timeout_s) {
    c.state = Conn::State::kHead;
    c.head = {};
    c.body.clear();
    c.chunked.reset();
    c.deadline = Clock::now() + std::chrono::seconds(timeout_s);
  }

  void accept_all(int listen_fd);
  bool is_listener(int fd) const {
    return std::find(listen_fds.begin(), listen_fds.end(), fd) != listen_fds.end();
  }
  void watch_listeners();
  void on_readable(const std::shared_ptr<Conn>& c);
  bool advance(const std::shared_ptr<Conn>& c);
  bool take_body(const std::shared_ptr<Conn>& c);
  void dispatch(const std::shared_ptr<Conn>& c);
  void serve(const std::shared_ptr<Conn>& c);
  void write_response(Conn& c, httplib::Response& res, bool head_only);
  void take_back();
  void expire();
  void drain(std::chrono::seconds limit);
};

void EventServer::Impl::accept_all(int listen_fd) {
  for (;;) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int fd = ::accept4(listen_fd, (sockaddr*)&addr, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno == EMFILE || errno == ENFILE) {
        // The listener stays readable: stop watching it for a while rather than spin.
        log::warn("out of file descriptors: accepting paused (raise ulimit -n)");
        for (int l : listen_fds) epoll_ctl(epoll_fd, EPOLL_CTL_DEL, l, nullptr);
        accept_paused = true;
      }
      return;
    }
    if (n_connections->load() >= opt.max_connections) {
      ::close(fd);  // over the limit: refused at once rather than starving the others
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // SSE: many small writes
    auto c = std::make_shared<Conn>();
    c->fd = fd;
    char host[64] = {0};
    if (addr.ss_family == AF_INET) {
      auto* a = (sockaddr_in*)&addr;
      inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
      c->remote_port = ntohs(a->sin_port);
    } else if (addr.ss_family == AF_INET6) {
      auto* a = (sockaddr_in6*)&addr;
      inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
      c->remote_port = ntohs(a->sin6_port);
    }
    c->remote_addr = host;
    start_head(*c, opt.header_timeout_seconds);
    conns[fd] = c;
    n_connections->fetch_add(1);
    watch(*c, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_ADD);
  }
}

// Moves body bytes from the input buffer; true once the body is complete.
bool EventServer::Impl::take_body(const std::shared_ptr<Conn>& c) {
  if (c->chunked) {
    const size_t used = c->chunked->feed(c->in, c->body);
    c->in.erase(0, used);
    if (c->chunked->error().status) {
      refuse(c, c->chunked->error().status, c->chunked->error().message);
      return false;
    }
    return c->chunked->done();
  }
  const size_t want = (size_t)c->head.content_length - c->body.size();
  const size_t n = std::min(want, c->in.size());
  c->body.append(c->in, 0, n);
  c->in.erase(0, n);
  return c->body.size() == c->head.content_length;
}

// Parses what the buffer holds; dispatches a complete request. False when `c` was closed.
bool EventServer::Impl::advance(const std::shared_ptr<Conn>& c) {
  if (c->state == Conn::State::kHead) {
    wire::WireError err;
    const size_t end = wire::find_head_end(c->in, c->head_scanned, opt.limits, err);
    if (err.status) return refuse(c, err.status, err.message), false;
    if (end == 0) return true;
    if (!wire::parse_head(std::string_view(c->in).substr(0, end), opt.limits, c->head, err))
      return refuse(c, err.status, err.message), false;
    c->in.erase(0, end);
    c->head_scanned = 0;
    if (c->head.target.size() > kMaxTargetBytes)
      return refuse(c, 414, "the request target is too long"), false;
    c->state = Conn::State::kBody;
    c->deadline = Clock::now() + std::chrono::seconds(opt.body_timeout_seconds);
    if (c->head.chunked)
      c->chunked = std::make_unique<wire::ChunkedDecoder>(opt.limits.max_body_bytes);
    const bool has_body = c->head.chunked || c->head.content_length > 0;
    if (has_body && c->head.expect_continue && c->in.empty()) {
      static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
      (void)::send(c->fd, kContinue, sizeof(kContinue) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
  }
  if (c->state == Conn::State::kBody) {
    if (!take_body(c)) return conns.count(c->fd) > 0;
    dispatch(c);
  }
  return true;
}

void EventServer::Impl::on_readable(const std::shared_ptr<Conn>& c) {
  char buf[16384];
  if (c->state == Conn::State::kClosing) {      // refused: drop input until EOF or the deadline
    for (int reads = 0; reads < 16; ++reads) {  // a share per wake-up: others are served too
      const ssize_t r = ::recv(c->fd, buf, sizeof buf, 0);
      if (r > 0) continue;
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      close_conn(c);
      return;
    }
    return;
  }
  for (;;) {
    const ssize_t r = ::recv(c->fd, buf, sizeof buf, 0);
    if (r > 0) {
      c->in.append(buf, (size_t)r);
      // Never buffer more than one request's worth ahead of the parser.
      if (c->in.size() > opt.limits.max_header_bytes + opt.limits.max_body_bytes + 65536) break;
      if ((size_t)r < sizeof buf) break;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    close_conn(c);  // EOF or error before a complete request
    return;
  }
  advance(c);
}

void EventServer::Impl::dispatch(const std::shared_ptr<Conn>& c) {
  c->state = Conn::State::kBusy;
  c->keep_alive = c->head.keep_alive;
  // Only a close or an error is of interest while the request runs; bytes of a pipelined
  // next request stay in the kernel until this one is answered.
  watch(*c, EPOLLRDHUP, EPOLL_CTL_MOD);
  pool.post([this, c] {
    serve(c);
    std::lock_guard<std::mutex> lock(back_mu);
    back.push_back(c);
    const uint64_t one = 1;
    (void)::write(wake_fd, &one, sizeof one);
  });
}

void EventServer::Impl::serve(const std::shared_ptr<Conn>& c) {
  httplib::Request req;
  req.method = c->head.method;
  req.target = c->head.target;
  req.version = c->head.version;
  const size_t q = req.target.find('?');
  req.path = percent_decode(req.target.substr(0, q));
  for (auto& [k, v] : c->head.headers) req.headers.emplace(k, v);
  req.body = std::move(c->body);
  req.remote_addr = c->remote_addr;
  req.remote_port = c->remote_port;
  httplib::Response res;
  t_gone = &c->gone;
  try {
    handler(req, res);
  } catch (...) {
    // The router turns exceptions into JSON errors; anything reaching here is a bug, but it
    // must not take the process down.
    log::error("{} {}: unexpected exception", req.method, req.path);
    res = httplib::Response();
    res.status = 500;
    res.set_content("{\"error\":{\"message\":\"internal error\",\"code\":500}}",
                    "application/json");
  }
  write_response(*c, res, req.method == "HEAD");
  t_gone = nullptr;
}

void EventServer::Impl::write_response(Conn& c, httplib::Response& res, bool head_only) {
  if (res.status < 0) res.status = 200;
  const bool streamed = (bool)res.content_provider_;
  const bool chunked = streamed && c.head.version == "HTTP/1.1";
  if (streamed && !chunked) c.keep_alive = false;  // HTTP/1.0: the end of the body is the close
  if (stop.load()) c.keep_alive = false;
  std::string out =
      "HTTP/1.1 " + std::to_string(res.status) + " " + reason_phrase(res.status) + "\r\n";
  for (const auto& [k, v] : res.headers) out += k + ": " + v + "\r\n";
  if (chunked)
    out += "Transfer-Encoding: chunked\r\n";
  else if (!streamed)
    out += "Content-Length: " + std::to_string(res.body.size()) + "\r\n";
  out += c.keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  if (!streamed && !head_only) out += res.body;
  const int timeout_ms = opt.write_timeout_seconds * 1000;
  bool ok = write_all(c.fd, out.data(), out.size(), timeout_ms, &c.gone);
  if (!streamed || head_only) {
    if (!ok) c.gone = true;
    return;
  }
  bool done = false;
  size_t offset = 0;
  httplib::DataSink sink;
  sink.write = [&](const char* d, size_t n) {
    if (n == 0) return true;
    std::string piece;
    if (chunked) {
      char size[24];
      std::snprintf(size, sizeof size, "%zx\r\n", n);
      piece = size;
    }
    piece.append(d, n);
    if (chunked) piece += "\r\n";
    offset += n;
    ok = ok && write_all(c.fd, piece.data(), piece.size(), timeout_ms, &c.gone);
    return ok;
  };
  sink.done = [&] { done = true; };
  sink.is_writable = [&] { return ok && !c.gone.load(); };
  while (ok && !done && !c.gone.load()) ok = res.content_provider_(offset, 0, sink);
  if (ok && done && chunked) ok = write_all(c.fd, "0\r\n\r\n", 5, timeout_ms, &c.gone);
  res.content_provider_success_ = ok && done && !c.gone.load();
  if (!res.content_provider_success_) c.gone = true;
}

// Connections whose response is written: closed, or read again for the next request.
void EventServer::Impl::take_back() {
  std::vector<std::shared_ptr<Conn>> mine;
  {
    std::lock_guard<std::mutex> lock(back_mu);
    mine.swap(back);
  }
  for (auto& c : mine) {
    if (c->gone.load() || !c->keep_alive || stop.load()) {
      ::shutdown(c->fd, SHUT_WR);
      close_conn(c);
      continue;
    }
    start_head(*c, opt.idle_timeout_seconds);
    watch(*c, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_MOD);
    if (!c->in.empty() && advance(c) && c->state == Conn::State::kHead && !c->in.empty())
      c->deadline = Clock::now() + std::chrono::seconds(opt.header_timeout_seconds);
  }
}

// Closes connections past their deadline: headers or body too slow (408), idle keep-alive.
void EventServer::Impl::expire() {
  const auto now = Clock::now();
  std::vector<std::shared_ptr<Conn>> late;
  for (auto& [fd, c] : conns)
    if (c->state != Conn::State::kBusy && c->deadline < now) late.push_back(c);
  for (auto& c : late) {
    const bool idle = c->state == Conn::State::kHead && c->in.empty();
    if (idle || c->state == Conn::State::kClosing) {
      close_conn(c);
    } else {
      refuse(c, 408,
             c->state == Conn::State::kHead ? "the request headers took too long"
                                            : "the request body took too long");
    }
  }
}

EventServer::EventServer(TransportOptions options, RequestHandler handler)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(handler))) {
  impl_->n_connections = &n_connections_;
}

EventServer::~EventServer() {
  for (int fd : impl_->listen_fds) ::close(fd);
  if (impl_->epoll_fd >= 0) ::close(impl_->epoll_fd);
  if (impl_->wake_fd >= 0) ::close(impl_->wake_fd);
}

namespace {

// A listening socket on one address. No SO_REUSEPORT: a second server on a port in use must
// fail here rather than share the traffic. SO_REUSEADDR only lets a restarted server bind
// while old connections are in TIME_WAIT (Linux never lets two sockets listen on one port
// with it). With several addresses, IPv6 sockets take IPv6 only, so that "0.0.0.0,::" works.
int listen_on(const std::string& host, int port, bool v6_only) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  const std::string port_text = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res);
  if (rc != 0 || !res)
    throw_error(ErrorKind::kIo, "cannot resolve host " + host + ": " + gai_strerror(rc));
  const int fd = ::socket(res->ai_family, res->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  int err = fd < 0 ? errno : 0;
  if (fd >= 0) {
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (res->ai_family == AF_INET6 && v6_only)
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, 4096) != 0) err = errno;
  }
  freeaddrinfo(res);
  if (err != 0) {
    if (fd >= 0) ::close(fd);
    const std::string where =
        (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + port_text;
    throw_error(ErrorKind::kIo,
                "cannot listen on " + where + ": " + std::strerror(err) +
                    (err == EADDRINUSE ? " (another server is using this port; pick another "
                                         "with --port)"
                                       : ""));
  }
  return fd;
}

int bound_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, (sockaddr*)&addr, &len);
  return addr.ss_family == AF_INET6 ? ntohs(((sockaddr_in6*)&addr)->sin6_port)
                                    : ntohs(((sockaddr_in*)&addr)->sin_port);
}

}  // namespace

void EventServer::Impl::watch_listeners() {
  epoll_event ev{};
  ev.events = EPOLLIN;
  for (int fd : listen_fds) {
    ev.data.fd = fd;
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev);
  }
}

int EventServer::bind() {
  Impl& s = *impl_;
  // --host may list several addresses ("127.0.0.1,::1"); with port 0 the later ones take
  // the port the first was given.
  std::vector<std::string> hosts;
  for (size_t start = 0; start <= s.opt.host.size();) {
    size_t end = s.opt.host.find(',', start);
    if (end == std::string::npos) end = s.opt.host.size();
    std::string h = s.opt.host.substr(start, end - start);
    h.erase(0, h.find_first_not_of(' '));
    h.erase(h.find_last_not_of(' ') + 1);
    if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
    if (!h.empty()) hosts.push_back(h);
    start = end + 1;
  }
  if (hosts.empty()) throw_error(ErrorKind::kInvalidArgument, "--host names no address");
  int port = s.opt.port;
  try {
    for (const std::string& h : hosts) {
      s.listen_fds.push_back(listen_on(h, port, hosts.size() > 1));
      port = bound_port(s.listen_fds.back());
    }
  } catch (...) {
    for (int fd : s.listen_fds) ::close(fd);
    s.listen_fds.clear();
    throw;
  }
  s.epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  s.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  s.watch_listeners();
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = s.wake_fd;
  epoll_ctl(s.epoll_fd, EPOLL_CTL_ADD, s.wake_fd, &ev);
  return port;
}

void EventServer::run() {
  Impl& s = *impl_;
  std::vector<epoll_event> events(1024);
  auto last_sweep = Clock::now();
  while (!s.stop.load()) {
    const int n = epoll_wait(s.epoll_fd, events.data(), (int)events.size(), 200);
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (s.is_listener(fd)) {
        s.accept_all(fd);
        continue;
      }
      if (fd == s.wake_fd) {
        uint64_t v;
        (void)::read(s.wake_fd, &v, sizeof v);
        s.take_back();
        continue;
      }
      auto it = s.conns.find(fd);
      if (it == s.conns.end()) continue;
      auto c = it->second;
      if (c->state == Conn::State::kBusy) {
        // The peer closed (or the socket failed) while its request runs: tell the handler.
        // Unwatched from then on (a hung-up socket would be reported again and again);
        // take_back() closes it once the worker is done.
        if (events[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
          c->gone = true;
          epoll_ctl(s.epoll_fd, EPOLL_CTL_DEL, c->fd, nullptr);
        }
        continue;
      }
      s.on_readable(c);
    }
    if (Clock::now() - last_sweep > std::chrono::milliseconds(250)) {
      if (s.accept_paused) {
        s.watch_listeners();
        s.accept_paused = false;
      }
      s.expire();
      last_sweep = Clock::now();
    }
  }
  for (int fd : s.listen_fds) ::close(fd);
  s.listen_fds.clear();
  s.drain(std::chrono::seconds(5));
}

// After stop: requests still being answered (e.g. the 503 of a generation the shutdown cut)
// finish writing before run() returns, since the caller exits the process right after.
void EventServer::Impl::drain(std::chrono::seconds limit) {
  const auto until = Clock::now() + limit;
  std::vector<std::shared_ptr<Conn>> idle;  // not being answered: nothing to wait for
  for (auto& [fd, c] : conns)
    if (c->state != Conn::State::kBusy) idle.push_back(c);
  for (auto& c : idle) close_conn(c);
  auto busy = [&] {
    for (auto& [fd, c] : conns)
      if (c->state == Conn::State::kBusy) return true;
    return false;
  };
  while (busy() && Clock::now() < until) {
    epoll_event ev{};
    if (epoll_wait(epoll_fd, &ev, 1, 50) == 1 && ev.data.fd == wake_fd) {
      uint64_t v;
      (void)::read(wake_fd, &v, sizeof v);
    }
    take_back();
  }
}

void EventServer::stop() {
  impl_->stop.store(true);
  const uint64_t one = 1;
  (void)::write(impl_->wake_fd, &one, sizeof one);
}

}  // namespace hablar::server
