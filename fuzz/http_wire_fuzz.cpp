// libFuzzer target for the HTTP/1.1 request framing (src/server/http_wire.h): arbitrary bytes
// are fed as they would arrive on a connection, in pieces whose sizes come from the input,
// through the head scanner, the head parser and, for chunked requests, the chunked decoder.
// Any crash, sanitizer report or a decoded body over the limit is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "server/http_wire.h"

using namespace hablar::server::wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t step = 1 + data[0] % 64;  // how the bytes are split into reads
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  WireLimits limits;
  limits.max_header_bytes = 4096;
  limits.max_headers = 16;
  limits.max_body_bytes = 1024;
  size_t scanned = 0, end = 0, have = 0;
  WireError error;
  while (end == 0 && !error.status && have < in.size()) {
    have = std::min(in.size(), have + step);
    end = find_head_end(in.substr(0, have), scanned, limits, error);
  }
  if (end == 0) return 0;
  RequestHead head;
  if (!parse_head(in.substr(0, end), limits, head, error)) {
    if (error.status < 400 || error.status > 505) std::abort();
    return 0;
  }
  if (!head.chunked) {
    if (head.content_length > limits.max_body_bytes) std::abort();
    return 0;
  }
  ChunkedDecoder decoder(limits.max_body_bytes);
  std::string body;
  std::string_view rest = in.substr(end);
  while (!rest.empty() && !decoder.done() && !decoder.error().status) {
    const size_t used = decoder.feed(rest.substr(0, step), body);
    if (used == 0 && !decoder.error().status && !decoder.done()) std::abort();  // no progress
    rest.remove_prefix(used);
  }
  if (body.size() > limits.max_body_bytes) std::abort();
  return 0;
}
