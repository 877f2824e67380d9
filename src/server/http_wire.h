// HTTP/1.1 request framing (RFC 9112), strict: the request line and headers of one request,
// how long its body is, and an incremental chunked-body decoder. No I/O here; the event loop
// (event_server.cpp) feeds bytes in, and the fuzzer feeds arbitrary ones.
//
// Strictness is what keeps a proxy in front of the server and the server agreeing on where a
// request ends (request smuggling): a request with both Content-Length and Transfer-Encoding,
// with differing Content-Length values, a Content-Length that is not a plain decimal, a
// transfer coding other than "chunked", or white space before a header's colon is refused
// with 400 rather than guessed at (RFC 9112 §6.3, §5.1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hablar::server::wire {

struct WireLimits {
  size_t max_header_bytes = 64 * 1024;  // request line and headers together
  size_t max_headers = 100;
  size_t max_body_bytes = 8u << 20;  // decoded body, whatever the framing
};

struct RequestHead {
  std::string method;
  std::string target;                                        // as sent: path and query
  std::string version;                                       // "HTTP/1.1" or "HTTP/1.0"
  std::vector<std::pair<std::string, std::string>> headers;  // names as sent, values trimmed
  bool chunked = false;
  uint64_t content_length = 0;  // when not chunked
  bool keep_alive = true;
  bool expect_continue = false;

  // The first value of a header (case-insensitive name), or "".
  std::string header(std::string_view name) const;
};

// A refusal: the status to answer and why (short, safe to send).
struct WireError {
  int status = 0;  // 0: none
  std::string message;
};

// Where the head ends in `buf` ("\r\n\r\n" inclusive), or 0 while it is incomplete.
// Sets `error` (431) when the head is already longer than the limit, 400 on a bare LF.
// `scanned`: how much of `buf` earlier calls have looked at (updated), so that a head that
// arrives a byte at a time costs linear time, not quadratic.
size_t find_head_end(std::string_view buf, size_t& scanned, const WireLimits& limits,
                     WireError& error);

// Parses a complete head (up to and including the blank line). Returns false with `error`.
bool parse_head(std::string_view head, const WireLimits& limits, RequestHead& out,
                WireError& error);

// Decodes a chunked body as bytes arrive. feed() consumes from `in` what it can and appends
// the decoded data to `out`; it returns the bytes consumed. done() once the last chunk and
// its trailers are read; error() set on malformed framing or a body over the limit.
class ChunkedDecoder {
 public:
  explicit ChunkedDecoder(size_t max_body) : max_body_(max_body) {}
  size_t feed(std::string_view in, std::string& out);
  bool done() const { return state_ == State::kDone; }
  const WireError& error() const { return error_; }

 private:
  enum class State { kSize, kSizeExt, kSizeLf, kData, kDataCr, kDataLf, kTrailer, kDone, kFail };
  bool fail(int status, const char* message);

  size_t max_body_;
  State state_ = State::kSize;
  uint64_t chunk_left_ = 0;
  size_t size_digits_ = 0;
  size_t total_ = 0;
  size_t trailer_bytes_ = 0;
  size_t trailer_line_ = 0;  // bytes of the current trailer line
  WireError error_;
};

}  // namespace hablar::server::wire
