"""Strict HTTP/1.1 framing (RFC 9112 §6.3), size limits whatever the framing, 405 with Allow,
and deadlines for slow headers and bodies."""
import socket
import time

import pytest
import requests

from .attack_util import raw_exchange, status_of, still_serving

POST_HEAD = b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
BODY = b'{"content":"hi"}'


@pytest.mark.parametrize("name,request_bytes,expect", [
    ("cl-and-te", POST_HEAD + b"Content-Length: 16\r\nTransfer-Encoding: chunked\r\n\r\n" + BODY, 400),
    ("differing-cl", POST_HEAD + b"Content-Length: 16\r\nContent-Length: 17\r\n\r\n" + BODY, 400),
    ("cl-list-differing", POST_HEAD + b"Content-Length: 16, 17\r\n\r\n" + BODY, 400),
    ("negative-cl", POST_HEAD + b"Content-Length: -1\r\n\r\n", 400),
    ("exponent-cl", POST_HEAD + b"Content-Length: 1e20\r\n\r\n", 400),
    ("huge-cl", POST_HEAD + b"Content-Length: 99999999999999999999999\r\n\r\n", 400),
    ("plus-cl", POST_HEAD + b"Content-Length: +16\r\n\r\n" + BODY, 400),
    ("unknown-te", POST_HEAD + b"Transfer-Encoding: gzip\r\n\r\n" + BODY, 501),
    ("te-list", POST_HEAD + b"Transfer-Encoding: gzip, chunked\r\n\r\n" + BODY, 501),
    ("space-before-colon", POST_HEAD + b"Transfer-Encoding : chunked\r\n\r\n10\r\n" + BODY + b"\r\n0\r\n\r\n", 400),
    ("empty-te", POST_HEAD + b"Transfer-Encoding:\r\n\r\n" + BODY, 400),
    ("te-in-http10", POST_HEAD.replace(b"1.1", b"1.0") + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    ("folded-header", POST_HEAD + b"X-A: 1\r\n  folded\r\nContent-Length: 16\r\n\r\n" + BODY, 400),
    ("bare-lf", b"POST /tokenize HTTP/1.1\nHost: x\n\n", 400),
    ("bad-chunk-size", POST_HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + BODY + b"\r\n0\r\n\r\n", 400),
    ("chunk-longer", POST_HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\n" + BODY + b"\r\n0\r\n\r\n", 400),
    ("bad-version", b"POST /tokenize HTTP/2.0\r\nHost: x\r\n\r\n", 505),
    ("bad-request-line", b"POST  /tokenize HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    ("control-in-value", POST_HEAD + b"X-A: a\x01b\r\nContent-Length: 16\r\n\r\n" + BODY, 400),
])
def test_lenient_framing_is_refused(attacked, name, request_bytes, expect):
    t0 = time.time()
    out = raw_exchange(attacked, request_bytes, timeout=5)
    assert time.time() - t0 < 4, f"{name}: the connection hung"
    if expect is None:  # bare LF: refused (400) or dropped, never served
        assert status_of(out) in (None, 400), out[:200]
    else:
        assert status_of(out) == expect, (name, out[:300])
    still_serving(attacked)


def test_well_formed_variants_are_served(attacked):
    same_cl = POST_HEAD + b"Content-Length: 16\r\nContent-Length: 16\r\n\r\n" + BODY
    assert status_of(raw_exchange(attacked, same_cl)) == 200
    chunked = POST_HEAD + b"Transfer-Encoding: chunked\r\n\r\n6\r\n" + BODY[:6] + b"\r\na\r\n" + \
        BODY[6:] + b"\r\n0\r\nX-Trailer: 1\r\n\r\n"
    assert status_of(raw_exchange(attacked, chunked)) == 200
    still_serving(attacked)


def test_chunked_body_over_the_limit_is_413(attacked):
    """50 MB chunked used to be accepted; the decoded size is limited (8 MB by default)."""
    def gen():
        piece = b"x" * (1 << 20)
        for _ in range(50):
            yield piece
    rss0 = attacked.rss_kib()
    try:
        r = requests.post(attacked.url + "/tokenize", data=gen(),
                          headers={"Content-Type": "application/json"}, timeout=60)
        assert r.status_code == 413
    except requests.ConnectionError:
        pass  # refused and closed while we were still sending: also a refusal
    assert attacked.rss_kib() - rss0 < 64 * 1024
    still_serving(attacked)


def test_content_length_over_the_limit_is_413_at_once(attacked):
    out = raw_exchange(attacked, POST_HEAD + b"Content-Length: 52428800\r\n\r\n", timeout=5)
    assert status_of(out) == 413


def test_header_flood_is_431(attacked):
    """64 MB of headers in 8 KB lines used to be accepted (and buffered). Now the head is
    refused with 431 once past 64 KiB; what follows is read and dropped for a second at most
    (so that the client sees the answer), never kept."""
    rss0 = attacked.rss_kib()
    t0 = time.time()
    with socket.create_connection(("127.0.0.1", attacked.port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        line = b"X-Flood: " + b"a" * 8192 + b"\r\n"
        sent = 0
        try:
            while sent < (64 << 20):
                s.sendall(line)
                sent += len(line)
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            out = s.recv(65536)
        except ConnectionResetError:
            out = b""
    assert time.time() - t0 < 10
    assert status_of(out) == 431, out[:200]
    assert attacked.rss_kib() - rss0 < 32 * 1024
    still_serving(attacked)


def test_too_many_headers_is_431(attacked):
    req = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(
        b"X-%d: 1\r\n" % i for i in range(150)) + b"\r\n"
    assert status_of(raw_exchange(attacked, req)) == 431
    still_serving(attacked)


def test_wrong_methods_get_405_with_allow(attacked):
    r = requests.get(attacked.url + "/v1/chat/completions", timeout=10)
    assert r.status_code == 405 and "POST" in r.headers["Allow"], r.headers
    assert r.json()["error"]["code"] == 405
    r = requests.post(attacked.url + "/health", timeout=10)
    assert r.status_code == 405 and "GET" in r.headers["Allow"]
    r = requests.delete(attacked.url + "/v1/models", timeout=10)
    assert r.status_code == 405 and "GET" in r.headers["Allow"]
    assert requests.get(attacked.url + "/nowhere", timeout=10).status_code == 404


def test_slow_headers_get_408(attacked):
    """A client dribbling its headers is cut at the header deadline (2 s in this suite)."""
    with socket.create_connection(("127.0.0.1", attacked.port), timeout=10) as s:
        t0 = time.time()
        out = b""
        try:
            for b in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
                s.sendall(bytes([b]))
                time.sleep(0.25)
                if time.time() - t0 > 6:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            out = s.recv(4096)
        except (ConnectionResetError, socket.timeout):
            pass
        assert time.time() - t0 < 6, "slow headers were not cut"
    assert status_of(out) in (408, None)
    still_serving(attacked)


def test_slow_body_gets_408(attacked):
    with socket.create_connection(("127.0.0.1", attacked.port), timeout=10) as s:
        t0 = time.time()
        s.sendall(POST_HEAD + b"Content-Length: 100\r\n\r\n{")
        out = s.recv(4096)
        assert status_of(out) == 408
        assert 2 < time.time() - t0 < 6


def test_idle_connection_is_closed(attacked):
    with socket.create_connection(("127.0.0.1", attacked.port), timeout=10) as s:
        t0 = time.time()
        assert s.recv(10) == b""  # closed by the server, nothing sent
        assert time.time() - t0 < 6
