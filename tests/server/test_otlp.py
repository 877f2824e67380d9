"""OpenTelemetry traces over OTLP/HTTP (JSON) with --otlp-endpoint, checked against a small
receiver in this test: one SERVER span per request, in the caller's trace (W3C traceparent),
with the method, path and status; a collector that is down does not slow requests."""
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from conftest import ServerProcess

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"


class Receiver(BaseHTTPRequestHandler):
    posts = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Receiver.posts.append((self.path, self.headers["Content-Type"], json.loads(body)))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def traced():
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    s = ServerProcess("--otlp-endpoint", f"http://127.0.0.1:{receiver.server_port}", "-t", "1").wait_ready()
    yield s
    s.stop()
    receiver.shutdown()


def spans_named(name, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = [(path, ctype, span) for path, ctype, body in list(Receiver.posts)
                 for rs in body["resourceSpans"] for ss in rs["scopeSpans"] for span in ss["spans"]
                 if span["name"] == name]
        if found:
            return found
        time.sleep(0.05)
    return []


def attrs(span):
    return {a["key"]: next(iter(a["value"].values())) for a in span["attributes"]}


def test_span_per_request_in_the_callers_trace(traced):
    r = requests.post(traced.url + "/v1/chat/completions", headers={"traceparent": f"00-{TRACE}-{PARENT}-01"},
                      json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert r.status_code == 200
    [(path, ctype, span)] = spans_named("POST /v1/chat/completions")
    assert path == "/v1/traces" and ctype.startswith("application/json")
    assert span["traceId"] == TRACE and span["parentSpanId"] == PARENT
    assert len(span["spanId"]) == 16 and span["spanId"] != PARENT
    assert span["kind"] == 2
    assert int(span["endTimeUnixNano"]) >= int(span["startTimeUnixNano"]) > (time.time() - 60) * 1e9
    a = attrs(span)
    assert a["http.request.method"] == "POST" and a["url.path"] == "/v1/chat/completions"
    assert a["http.response.status_code"] == "200"
    body = Receiver.posts[0][2]
    service = body["resourceSpans"][0]["resource"]["attributes"][0]
    assert service == {"key": "service.name", "value": {"stringValue": "hablar"}}
    # Without a traceparent: a new trace; errors are spans too.
    requests.post(traced.url + "/tokenize", data="{")
    [(_, _, bad)] = spans_named("POST /tokenize")
    assert len(bad["traceId"]) == 32 and bad["traceId"] != TRACE and "parentSpanId" not in bad
    assert attrs(bad)["http.response.status_code"] == "400"


def test_collector_down_does_not_slow_requests():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]  # nothing listens once this closes
    s = ServerProcess("--otlp-endpoint", f"http://127.0.0.1:{closed_port}", "-t", "1").wait_ready()
    try:
        start = time.monotonic()
        for _ in range(5):
            assert requests.post(s.url + "/tokenize", json={"content": "hi"}).status_code == 200
        assert time.monotonic() - start < 2
    finally:
        s.stop()
