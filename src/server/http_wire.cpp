#include "server/http_wire.h"

#include <algorithm>

namespace hablar::server::wire {

namespace {

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower((unsigned char)x) == std::tolower((unsigned char)y);
         });
}

// RFC 9110 token characters (method and header names).
bool is_tchar(char c) {
  if (std::isalnum((unsigned char)c)) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool is_token(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), is_tchar);
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Field values: visible characters, obs-text and inner white space; no other controls.
bool valid_value(std::string_view v) {
  return std::none_of(v.begin(), v.end(), [](char c) {
    const auto u = (unsigned char)c;
    return (u < 0x20 && u != '\t') || u == 0x7F;
  });
}

bool set_error(WireError& e, int status, std::string message) {
  e.status = status;
  e.message = std::move(message);
  return false;
}

// A Content-Length value (possibly a comma list of equal values): plain decimal digits only.
bool parse_length(std::string_view v, uint64_t& out) {
  bool any = false;
  uint64_t first = 0;
  for (size_t a = 0; a <= v.size();) {
    size_t b = v.find(',', a);
    if (b == std::string_view::npos) b = v.size();
    const std::string_view item = trim_ows(v.substr(a, b - a));
    if (item.empty() || item.size() > 18 ||
        !std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return false;
    uint64_t n = 0;
    for (char c : item) n = n * 10 + (uint64_t)(c - '0');
    if (any && n != first) return false;
    first = n;
    any = true;
    a = b + 1;
  }
  out = first;
  return any;
}

bool parse_request_line(std::string_view line, RequestHead& out, WireError& error) {
  const size_t s1 = line.find(' ');
  const size_t s2 = s1 == std::string_view::npos ? s1 : line.find(' ', s1 + 1);
  if (s2 == std::string_view::npos || line.find(' ', s2 + 1) != std::string_view::npos)
    return set_error(error, 400, "malformed request line");
  out.method = std::string(line.substr(0, s1));
  out.target = std::string(line.substr(s1 + 1, s2 - s1 - 1));
  out.version = std::string(line.substr(s2 + 1));
  if (!is_token(out.method)) return set_error(error, 400, "malformed request method");
  if (out.target.empty() || (out.target[0] != '/' && out.target != "*") ||
      !std::all_of(out.target.begin(), out.target.end(),
                   [](char c) { return (unsigned char)c > 0x20 && (unsigned char)c < 0x7F; }))
    return set_error(error, 400, "malformed request target");
  if (out.version != "HTTP/1.1" && out.version != "HTTP/1.0")
    return set_error(error, 505, "only HTTP/1.0 and HTTP/1.1 are served");
  out.keep_alive = out.version == "HTTP/1.1";
  return true;
}

// Framing and connection headers, once all headers are read.
bool apply_framing(RequestHead& out, const WireLimits& limits, WireError& error) {
  bool has_te = false, has_cl = false;
  std::string te;
  for (const auto& [name, value] : out.headers) {
    if (iequals(name, "Transfer-Encoding")) {
      if (has_te) te += ",";
      te += value;
      has_te = true;
    } else if (iequals(name, "Content-Length")) {
      uint64_t n = 0;
      if (!parse_length(value, n)) return set_error(error, 400, "invalid Content-Length");
      if (has_cl && n != out.content_length)
        return set_error(error, 400, "conflicting Content-Length headers");
      out.content_length = n;
      has_cl = true;
    } else if (iequals(name, "Connection")) {
      std::string v = value;
      std::transform(v.begin(), v.end(), v.begin(), [](char c) { return std::tolower(c); });
      if (v.find("close") != std::string::npos) out.keep_alive = false;
      if (v.find("keep-alive") != std::string::npos && out.version == "HTTP/1.0")
        out.keep_alive = true;
    } else if (iequals(name, "Expect")) {
      if (!iequals(trim_ows(value), "100-continue"))
        return set_error(error, 417, "only 'Expect: 100-continue' is supported");
      out.expect_continue = true;
    } else if (iequals(name, "Content-Encoding")) {
      if (!iequals(trim_ows(value), "identity"))
        return set_error(error, 415,
                         "compressed request bodies (Content-Encoding) are not accepted");
    }
  }
  if (has_te && has_cl)
    return set_error(error, 400, "both Transfer-Encoding and Content-Length are present");
  if (has_te) {
    if (out.version == "HTTP/1.0")
      return set_error(error, 400, "Transfer-Encoding is not allowed in HTTP/1.0");
    if (!iequals(trim_ows(te), "chunked"))
      return set_error(error, trim_ows(te).empty() ? 400 : 501,
                       "only the 'chunked' transfer coding is supported");
    out.chunked = true;
  }
  if (!out.chunked && out.content_length > limits.max_body_bytes)
    return set_error(error, 413, "the request body is larger than the server accepts");
  return true;
}

}  // namespace

std::string RequestHead::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return {};
}

size_t find_head_end(std::string_view buf, size_t& scanned, const WireLimits& limits,
                     WireError& error) {
  const size_t from = scanned > 3 ? scanned - 3 : 0;
  scanned = buf.size();
  const size_t at = buf.find("\r\n\r\n", from);
  // A bare LF would never complete the head: refuse it now instead of at the deadline.
  // (Only within the head: the body that may follow it in the buffer is any bytes.)
  const size_t head_end = at == std::string_view::npos ? buf.size() : at;
  for (size_t i = buf.find('\n', from); i < head_end; i = buf.find('\n', i + 1))
    if (i == 0 || buf[i - 1] != '\r') {
      set_error(error, 400, "bare LF in the request head");
      return 0;
    }
  if (at != std::string_view::npos && at + 4 <= limits.max_header_bytes) return at + 4;
  if (at != std::string_view::npos || buf.size() > limits.max_header_bytes)
    set_error(error, 431, "the request headers are larger than the server accepts");
  return 0;
}

bool parse_head(std::string_view head, const WireLimits& limits, RequestHead& out,
                WireError& error) {
  if (head.size() < 4 || head.substr(head.size() - 4) != "\r\n\r\n")
    return set_error(error, 400, "incomplete request head");
  head.remove_suffix(2);  // the blank line; every line below ends with CRLF
  size_t pos = 0;
  bool first = true;
  while (pos < head.size()) {
    const size_t eol = head.find("\r\n", pos);
    const std::string_view line = head.substr(pos, eol - pos);
    pos = eol + 2;
    if (line.find('\n') != std::string_view::npos || line.find('\r') != std::string_view::npos)
      return set_error(error, 400, "bare CR or LF in the request head");
    if (first) {
      if (!parse_request_line(line, out, error)) return false;
      first = false;
      continue;
    }
    if (line.empty() || line[0] == ' ' || line[0] == '\t')
      return set_error(error, 400, "folded or empty header line");
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || !is_token(line.substr(0, colon)))
      return set_error(error, 400, "malformed header line");
    const std::string_view value = trim_ows(line.substr(colon + 1));
    if (!valid_value(value)) return set_error(error, 400, "control character in a header value");
    if (out.headers.size() >= limits.max_headers)
      return set_error(error, 431, "too many request headers");
    out.headers.emplace_back(std::string(line.substr(0, colon)), std::string(value));
  }
  return apply_framing(out, limits, error);
}

bool ChunkedDecoder::fail(int status, const char* message) {
  state_ = State::kFail;
  error_ = {status, message};
  return false;
}

size_t ChunkedDecoder::feed(std::string_view in, std::string& out) {
  size_t i = 0;
  while (i < in.size() && state_ != State::kDone && state_ != State::kFail) {
    const char c = in[i];
    switch (state_) {
      case State::kSize: {
        const int d = hex_value(c);
        if (d >= 0) {
          if (++size_digits_ > 15) return i + fail(413, "chunk size too large");
          chunk_left_ = chunk_left_ * 16 + (uint64_t)d;
        } else if (size_digits_ > 0 && (c == ';' || c == ' ' || c == '\t')) {
          state_ = State::kSizeExt;
        } else if (size_digits_ > 0 && c == '\r') {
          state_ = State::kSizeLf;
        } else {
          return i + fail(400, "malformed chunk size");
        }
        ++i;
        break;
      }
      case State::kSizeExt:  // chunk extensions are ignored, but bounded by the head limit
        if (c == '\r') state_ = State::kSizeLf;
        if (c == '\n' || ++trailer_bytes_ > 4096) return i + fail(400, "malformed chunk");
        ++i;
        break;
      case State::kSizeLf:
        if (c != '\n') return i + fail(400, "malformed chunk size line");
        ++i;
        if (total_ + chunk_left_ > max_body_)
          return i + fail(413, "the request body is larger than the server accepts");
        size_digits_ = 0;
        state_ = chunk_left_ == 0 ? State::kTrailer : State::kData;
        trailer_line_ = 0;
        break;
      case State::kData: {
        const size_t n = (size_t)std::min<uint64_t>(chunk_left_, in.size() - i);
        out.append(in.data() + i, n);
        total_ += n;
        chunk_left_ -= n;
        i += n;
        if (chunk_left_ == 0) state_ = State::kDataCr;
        break;
      }
      case State::kDataCr:
        if (c != '\r') return i + fail(400, "chunk data longer than its size");
        state_ = State::kDataLf;
        ++i;
        break;
      case State::kDataLf:
        if (c != '\n') return i + fail(400, "malformed chunk end");
        state_ = State::kSize;
        ++i;
        break;
      case State::kTrailer:  // trailer fields are read and dropped; an empty line ends them
        ++i;
        if (++trailer_bytes_ > 8192) return i + fail(431, "chunked trailers too large");
        if (c == '\n') {
          if (trailer_line_ == 1) state_ = State::kDone;  // just "\r"
          if (trailer_line_ == 0) return i + fail(400, "bare LF in chunked trailers");
          trailer_line_ = 0;
        } else {
          ++trailer_line_;
        }
        break;
      default:
        break;
    }
  }
  return i;
}

}  // namespace hablar::server::wire
