// OpenTelemetry traces over OTLP/HTTP with the JSON encoding (--otlp-endpoint). No
// OpenTelemetry C++ SDK is packaged for Debian 12 and the wire format of a span is small, so
// the server writes it itself: one SERVER span per request, in the trace of the request's
// W3C `traceparent` header when it has one. Spans are queued and sent in batches by one
// thread; a collector that is down costs dropped spans, never a slower request.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

namespace hablar::server {

struct Span {
  std::string trace_id;        // 32 hex digits
  std::string span_id;         // 16 hex digits
  std::string parent_span_id;  // "" for a root span
  std::string name;            // "POST /v1/chat/completions"
  int64_t start_unix_ns = 0;
  int64_t end_unix_ns = 0;
  std::string method, path;
  int status = 0;
};

// Fills trace_id / parent_span_id from a `traceparent` header ("00-<trace>-<span>-<flags>")
// when it is valid, else a new trace id; always a new span id.
void start_span(Span& span, const std::string& traceparent);

class OtlpExporter {
 public:
  // `endpoint`: "http://host:port" (spans go to /v1/traces) or a full URL with its path.
  explicit OtlpExporter(const std::string& endpoint);
  ~OtlpExporter();
  void add(Span span);  // never blocks on the network

 private:
  void run();
  std::string base_, path_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Span> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace hablar::server
