"""The bad-input matrix over every POST route of every API: malformed, deep, huge,
wrong-typed, invalid UTF-8, compressed and chunked bodies. Each gets a 4xx (never a 5xx, a
hang or a crash) with a short error body, and the server keeps serving."""
import gzip
import json

import pytest
import requests

from .attack_util import MSGS, still_serving

DEEP = "[" * 60000 + "]" * 60000  # about 120 KB, the crashing value
HUGE = "x" * (5 << 20)
# Where text is expected, a huge value is words (a 5 MB single word would test the BPE, not
# the server's input handling): refused as longer than the context.
TEXT_FIELDS = {"prompt", "messages.content", "content", "system", "input", "instructions"}
HUGE_TEXT = "hello " * 100000

# Every POST route, with a body that is valid for it.
ROUTES = {
    "/v1/chat/completions": {"messages": MSGS, "max_tokens": 2},
    "/chat/completions": {"messages": MSGS, "max_tokens": 2},
    "/v1/completions": {"prompt": "Hi", "max_tokens": 2},
    "/completion": {"prompt": "Hi", "n_predict": 2},
    "/completions": {"prompt": "Hi", "n_predict": 2},
    "/tokenize": {"content": "Hi"},
    "/detokenize": {"tokens": [1, 2]},
    "/apply-template": {"messages": MSGS},
    "/api/chat": {"messages": MSGS, "stream": False, "options": {"num_predict": 2}},
    "/api/generate": {"prompt": "Hi", "stream": False, "options": {"num_predict": 2}},
    "/api/show": {"model": "x"},
    "/v1/messages": {"messages": MSGS, "max_tokens": 2},
    "/v1/messages/count_tokens": {"messages": MSGS},
    "/v1/responses": {"input": "Hi", "max_output_tokens": 2},
}
# Fields each route reads (a deep or huge value there must be refused, not echoed).
FIELDS = {
    "/v1/chat/completions": ["max_tokens", "temperature", "model", "messages.content", "messages.extra"],
    "/chat/completions": ["max_tokens", "messages.content"],
    "/v1/completions": ["prompt", "max_tokens", "stop"],
    "/completion": ["prompt", "n_predict", "temperature"],
    "/completions": ["prompt"],
    "/tokenize": ["content"],
    "/detokenize": ["tokens"],
    "/apply-template": ["messages.content", "messages.extra"],
    "/api/chat": ["options", "messages.content", "model"],
    "/api/generate": ["prompt", "options", "system"],
    "/api/show": ["model"],
    "/v1/messages": ["max_tokens", "system", "messages.content", "stop_sequences", "tools"],
    "/v1/messages/count_tokens": ["messages.content", "system", "tool_choice"],
    "/v1/responses": ["input", "instructions", "max_output_tokens", "tools", "text"],
}


def with_field(route, field, raw_value):
    """The route's valid body as text with `field` set to the raw JSON text `raw_value`."""
    body = json.loads(json.dumps(ROUTES[route]))
    marker = "__VALUE__"
    if field.startswith("messages."):
        key = field.split(".", 1)[1]
        body["messages"] = [{"role": "user", "content": "Hi"}]
        body["messages"][0][key] = marker
    else:
        body[field] = marker
    return json.dumps(body).replace('"' + marker + '"', raw_value).encode()


def post(server, route, data, headers=None):
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    return requests.post(server.url + route, data=data, headers=h, timeout=120)


def assert_client_error(r, max_body=2048):
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    assert len(r.content) <= max_body, f"error body of {len(r.content)} bytes"
    assert error_message(r)


def error_message(r):
    """The message of any API family's error body (OpenAI's and Anthropic's objects, Ollama's
    string)."""
    error = r.json()["error"]
    return error if isinstance(error, str) else error["message"]


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_deep_values_in_every_field(attacked, route):
    for field in FIELDS[route]:
        r = post(attacked, route, with_field(route, field, DEEP))
        assert_client_error(r)
        assert "64" in error_message(r), r.text
    still_serving(attacked)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_huge_values_are_not_echoed(attacked, route):
    for field in FIELDS[route]:
        value = HUGE_TEXT if field in TEXT_FIELDS else HUGE
        r = post(attacked, route, with_field(route, field, json.dumps(value)))
        # A huge string may be valid where text is expected (a prompt, a message): then it is
        # served or refused as too long; anywhere else it is a 400 quoting a short excerpt.
        assert r.status_code < 500, (field, r.status_code, r.text[:300])
        assert len(r.content) < 64 * 1024 or r.status_code == 200, (field, len(r.content))
    still_serving(attacked)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_malformed_wrong_typed_and_invalid_utf8(attacked, route):
    cases = [b"{", b"[]", b"null", b'{"a": }', b"\xff\xfe{}", b'{"x": "\xc3\x28"}',
             b'{"messages": 5, "prompt": {}, "content": 5, "tokens": 5, "model": 5}',
             json.dumps({"messages": [{"role": "user", "content": {"a": [1]}}], "prompt": [[{}]],
                         "tokens": ["a"], "content": [1], "options": [1], "model": [1]}).encode()]
    for data in cases:
        assert_client_error(post(attacked, route, data))
    still_serving(attacked)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_compressed_bodies_are_refused(attacked, route):
    bomb = gzip.compress(b" " * (50 << 20))  # 50 MB of spaces in about 50 KB
    for coding in ("gzip", "deflate", "br"):
        r = post(attacked, route, bomb, {"Content-Encoding": coding})
        assert r.status_code == 415, (coding, r.status_code)
    still_serving(attacked)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_chunked_bodies_are_decoded(attacked, route):
    data = json.dumps(ROUTES[route]).encode()
    r = post(attacked, route, iter([data[:7], data[7:]]))  # requests sends an iterator chunked
    assert r.status_code in (200, 404), (r.status_code, r.text[:300])  # /api/show: model x
    still_serving(attacked)


def test_error_excerpt_of_a_5mb_max_tokens(attacked):
    r = post(attacked, "/v1/chat/completions", with_field("/v1/chat/completions", "max_tokens",
                                                          json.dumps(HUGE)))
    assert r.status_code == 400
    assert len(r.content) < 1024
    assert "max_tokens" in r.json()["error"]["message"] and "..." in r.json()["error"]["message"]
