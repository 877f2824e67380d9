// The strict HTTP/1.1 framing rules (RFC 9112 §6.3) and the chunked decoder, byte by byte.
#include "server/http_wire.h"

#include <gtest/gtest.h>

namespace hablar::server::wire {
namespace {

WireError parse(const std::string& head, RequestHead* out = nullptr) {
  RequestHead h;
  WireError e;
  parse_head(head, WireLimits{}, h, e);
  if (out) *out = h;
  return e;
}

TEST(HttpWire, PlainRequests) {
  RequestHead h;
  EXPECT_EQ(parse("POST /v1/x?a=1 HTTP/1.1\r\nHost: a\r\nContent-Length:  12 \r\n\r\n", &h).status,
            0);
  EXPECT_EQ(h.method, "POST");
  EXPECT_EQ(h.target, "/v1/x?a=1");
  EXPECT_EQ(h.content_length, 12u);
  EXPECT_TRUE(h.keep_alive);
  EXPECT_EQ(h.header("content-length"), "12");
  EXPECT_EQ(parse("GET / HTTP/1.0\r\n\r\n", &h).status, 0);
  EXPECT_FALSE(h.keep_alive);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n", &h).status, 0);
  EXPECT_TRUE(h.chunked);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n").status, 0);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n").status, 0);
}

TEST(HttpWire, AmbiguousFramingIsRefused) {
  const std::pair<const char*, int> cases[] = {
      {"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", 400},
      {"Content-Length: 5\r\nContent-Length: 6\r\n", 400},
      {"Content-Length: 5, 6\r\n", 400},
      {"Content-Length: -1\r\n", 400},
      {"Content-Length: 1e20\r\n", 400},
      {"Content-Length: +5\r\n", 400},
      {"Content-Length: \r\n", 400},
      {"Content-Length: 99999999999999999999\r\n", 400},
      {"Content-Length: 999999999\r\n", 413},
      {"Transfer-Encoding: gzip\r\n", 501},
      {"Transfer-Encoding: gzip, chunked\r\n", 501},
      {"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", 501},
      {"Transfer-Encoding:\r\n", 400},
      {"Transfer-Encoding : chunked\r\n", 400},
      {" Host: a\r\n", 400},
      {"X: a\x01\r\n", 400},
      {"Content-Encoding: gzip\r\n", 415},
      {"Expect: 200-ok\r\n", 417},
  };
  for (const auto& [header, status] : cases)
    EXPECT_EQ(parse(std::string("POST / HTTP/1.1\r\n") + header + "\r\n").status, status) << header;
  EXPECT_EQ(parse("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n").status, 400);
  EXPECT_EQ(parse("POST / HTTP/2.0\r\n\r\n").status, 505);
  EXPECT_EQ(parse("POST  / HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(parse("POST example.com HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(parse("P(ST / HTTP/1.1\r\n\r\n").status, 400);
}

TEST(HttpWire, HeadLimits) {
  WireLimits small;
  small.max_header_bytes = 64;
  small.max_headers = 2;
  WireError e;
  size_t scanned = 0;
  EXPECT_EQ(find_head_end(std::string(100, 'a'), scanned, small, e), 0u);
  EXPECT_EQ(e.status, 431);
  e = {};
  scanned = 0;
  EXPECT_EQ(find_head_end("GET / HTTP/1.1\nHost: a\n\n", scanned, small, e), 0u);
  EXPECT_EQ(e.status, 400);
  // Found across calls as bytes arrive one by one.
  const std::string head = "GET / HTTP/1.1\r\nA: b\r\n\r\n";
  e = {};
  scanned = 0;
  size_t end = 0;
  for (size_t n = 1; n <= head.size() && end == 0; ++n)
    end = find_head_end(std::string_view(head).substr(0, n), scanned, small, e);
  EXPECT_EQ(end, head.size());
  // Body bytes after the head may hold anything, bare LFs included.
  e = {};
  scanned = 0;
  EXPECT_EQ(find_head_end(head + "\n\x1f\n", scanned, small, e), head.size());
  EXPECT_EQ(e.status, 0);
  RequestHead h;
  EXPECT_FALSE(parse_head("GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", small, h, e));
  EXPECT_EQ(e.status, 431);
}

std::string decode_all(const std::string& in, size_t step, WireError* error = nullptr,
                       size_t max_body = 1 << 20) {
  ChunkedDecoder d(max_body);
  std::string out;
  for (size_t i = 0; i < in.size() && !d.done() && !d.error().status;) {
    const std::string_view piece = std::string_view(in).substr(i, step);
    const size_t used = d.feed(piece, out);
    if (used == 0) break;
    i += used;
  }
  if (error) *error = d.error();
  return d.done() ? out : "<incomplete>";
}

TEST(HttpWire, ChunkedBodies) {
  const std::string body = "5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-T: 1\r\n\r\n";
  for (size_t step : {1, 2, 3, 7, 100}) EXPECT_EQ(decode_all(body, step), "hello, world") << step;
  WireError e;
  EXPECT_EQ(decode_all("5\r\nhello!\r\n0\r\n\r\n", 4, &e), "<incomplete>");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(decode_all("zz\r\n", 1, &e), "<incomplete>");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(decode_all("ffffffffffffffffff\r\n", 1, &e), "<incomplete>");
  EXPECT_EQ(e.status, 413);
  EXPECT_EQ(decode_all("400\r\n", 1, &e, 1000), "<incomplete>");
  EXPECT_EQ(e.status, 413);
  EXPECT_EQ(decode_all("0\r\n\n", 1, &e), "<incomplete>");
  EXPECT_EQ(e.status, 400);
}

}  // namespace
}  // namespace hablar::server::wire
