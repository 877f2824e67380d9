#include "server/otlp_exporter.h"

#include <httplib.h>

#include <nlohmann/json.hpp>

#include <random>

#include "core/log.h"

namespace hablar::server {

namespace {

constexpr size_t kMaxQueued = 4096;  // beyond this, spans are dropped
constexpr size_t kBatch = 256;

std::string random_hex(size_t digits) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < digits; ++i) s += hex[rng() % 16];
  return s;
}

bool is_hex(const std::string& s) {
  return s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

nlohmann::json attribute(const char* key, nlohmann::json value) {
  const char* type = value.is_number_integer() ? "intValue" : "stringValue";
  // OTLP/JSON writes 64-bit integers as strings.
  if (value.is_number_integer()) value = std::to_string(value.get<int64_t>());
  return {{"key", key}, {"value", {{type, value}}}};
}

nlohmann::json span_json(const Span& s) {
  nlohmann::json j = {
      {"traceId", s.trace_id},
      {"spanId", s.span_id},
      {"name", s.name},
      {"kind", 2},  // SPAN_KIND_SERVER
      {"startTimeUnixNano", std::to_string(s.start_unix_ns)},
      {"endTimeUnixNano", std::to_string(s.end_unix_ns)},
      {"attributes", nlohmann::json::array({attribute("http.request.method", s.method),
                                            attribute("url.path", s.path),
                                            attribute("http.response.status_code", s.status)})},
      {"status", {{"code", s.status >= 500 ? 2 : 0}}}};  // ERROR for server errors, else UNSET
  if (!s.parent_span_id.empty()) j["parentSpanId"] = s.parent_span_id;
  return j;
}

}  // namespace

void start_span(Span& span, const std::string& traceparent) {
  span.span_id = random_hex(16);
  // version "00", 32-digit trace id, 16-digit parent id, 2-digit flags; all-zero ids invalid.
  if (traceparent.size() == 55 && traceparent.compare(0, 3, "00-") == 0 && traceparent[35] == '-' &&
      traceparent[52] == '-') {
    const std::string trace = traceparent.substr(3, 32), parent = traceparent.substr(36, 16);
    if (is_hex(trace) && is_hex(parent) && trace != std::string(32, '0') &&
        parent != std::string(16, '0')) {
      span.trace_id = trace;
      span.parent_span_id = parent;
      return;
    }
  }
  span.trace_id = random_hex(32);
}

OtlpExporter::OtlpExporter(const std::string& endpoint) {
  const size_t scheme = endpoint.find("://");
  const size_t path = endpoint.find('/', scheme == std::string::npos ? 0 : scheme + 3);
  base_ = endpoint.substr(0, path);
  path_ = path == std::string::npos || path + 1 == endpoint.size() ? "/v1/traces"
                                                                   : endpoint.substr(path);
  thread_ = std::thread([this] { run(); });
}

OtlpExporter::~OtlpExporter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void OtlpExporter::add(Span span) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= kMaxQueued) return;
    queue_.push_back(std::move(span));
  }
  cv_.notify_one();
}

void OtlpExporter::run() {
  httplib::Client client(base_);
  client.set_connection_timeout(2);
  client.set_read_timeout(5);
  bool warned = false;
  for (;;) {
    std::deque<Span> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      while (!queue_.empty() && batch.size() < kBatch) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    nlohmann::json spans = nlohmann::json::array();
    for (const Span& s : batch) spans.push_back(span_json(s));
    const nlohmann::json body = {
        {"resourceSpans",
         {{{"resource", {{"attributes", {attribute("service.name", "hablar")}}}},
           {"scopeSpans", {{{"scope", {{"name", "hablar"}}}, {"spans", spans}}}}}}}};
    auto res =
        client.Post(path_, body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    "application/json");
    if ((!res || res->status >= 300) && !warned) {
      log::warn("OTLP export to {}{} failed ({}); spans are dropped while it fails", base_, path_,
                res ? "HTTP " + std::to_string(res->status) : httplib::to_string(res.error()));
      warned = true;
    }
  }
}

}  // namespace hablar::server
