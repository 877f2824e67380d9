"""Bad input: each case gets a clear 4xx JSON error in OpenAI's shape (or the documented
behaviour), and the server keeps serving."""
import json
import socket
import time

import pytest
import requests

from conftest import ServerProcess, chat

URL = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "Hi"}]


def post_raw(server, body: bytes, content_type="application/json", path=URL):
    return requests.post(server.url + path, data=body, headers={"Content-Type": content_type}, timeout=60)


def assert_error(r, status, *words):
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert err["message"] and err["type"] and err["code"] == status
    for w in words:
        assert w in err["message"], err["message"]


def test_malformed_json(server):
    assert_error(post_raw(server, b'{"messages": [}'), 400, "not valid JSON")


def test_body_not_an_object(server):
    assert_error(post_raw(server, b'[1, 2]'), 400, "JSON object")


@pytest.mark.parametrize("field,value,word", [
    ("messages", "hello", "messages"),
    ("messages", [{"role": 5, "content": "x"}], "role"),
    ("messages", [{"role": "wizard", "content": "x"}], "role"),
    ("messages", [{"role": "user"}], "content"),
    ("max_tokens", "ten", "max_tokens"),
    ("temperature", "hot", "temperature"),
    ("stream", "yes", "stream"),
    ("stop", 5, "stop"),
    ("logit_bias", {"": 1}, "logit_bias"),  # text keys are tokenized (llama-server); empty is not
    ("logit_bias", {"99999999": 1}, "logit_bias"),
    ("top_p", 1.5, "top_p"),
    ("top_logprobs", 3, "logprobs"),
    ("tools", "nope", "tools"),
])
def test_wrong_types_and_values(server, field, value, word):
    body = {"messages": MSGS, "max_tokens": 2, field: value}
    assert_error(chat(server, body), 400, word)


def test_missing_and_empty_messages(server):
    assert_error(chat(server, {"max_tokens": 2}), 400, "messages")
    assert_error(chat(server, {"messages": [], "max_tokens": 2}), 400, "messages")


def test_twenty_megabyte_body_is_refused(server):
    big = b'{"messages": [{"role": "user", "content": "' + b"a" * (20 << 20) + b'"}]}'
    try:
        r = post_raw(server, big)
        assert_error(r, 413)
    except requests.ConnectionError:
        pass  # the server may close the connection before reading it all: also a refusal
    assert requests.get(server.url + "/health").status_code == 200


def test_invalid_utf8(server):
    body = b'{"messages": [{"role": "user", "content": "bad \xff\xfe here"}], "max_tokens": 2}'
    assert_error(post_raw(server, body), 400, "not valid JSON")


def test_nan_and_negative_temperature(server):
    body = b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}'
    assert_error(post_raw(server, body), 400)
    assert_error(chat(server, {"messages": MSGS, "temperature": -0.5}), 400, "temperature")


@pytest.mark.parametrize("value", [0, -1])
def test_max_tokens_zero_or_negative(server, value):
    assert_error(chat(server, {"messages": MSGS, "max_tokens": value}), 400, "max_tokens")


def test_max_tokens_huge_is_bounded_by_the_context(server):
    # Documented: max_tokens is capped at the room the context leaves.
    r = chat(server, {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 10 ** 9,
                      "temperature": 0, "stop": ["."]})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] < 4096


def test_prompt_too_long_states_the_numbers(server):
    long_text = "word " * 5000
    r = chat(server, {"messages": [{"role": "user", "content": long_text}], "max_tokens": 2})
    assert_error(r, 400, "tokens", "4096")


def test_unknown_fields_are_ignored(server):
    r = chat(server, {"messages": MSGS, "max_tokens": 2, "frobnicate": True, "metadata": {"a": 1},
                      "parallel_tool_calls": False})
    assert r.status_code == 200


def test_wrong_content_type(server):
    body = json.dumps({"messages": MSGS, "max_tokens": 2}).encode()
    assert_error(post_raw(server, body, content_type="text/html"), 415, "Content-Type")


def test_unknown_route_is_json_404(server):
    assert_error(requests.get(server.url + "/v1/nothing"), 404)


def wait_until_idle(server, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = server.metrics()
        if m["hablar_requests_running"] == 0 and m["hablar_kv_cache_blocks_used"] == 0:
            return True
        time.sleep(0.1)
    return False


def test_client_disconnect_mid_stream_frees_blocks(server):
    before = server.metrics()["hablar_requests_finished_total"]
    body = {"messages": [{"role": "user", "content": "Write a very long essay about history."}],
            "max_tokens": 2000, "temperature": 0, "stream": True}
    r = requests.post(server.url + URL, json=body, stream=True, timeout=60)
    lines = r.iter_lines()
    got = 0
    for line in lines:
        if line.startswith(b"data: "):
            got += 1
            if got == 3:
                break
    r.close()  # goes away mid-stream
    assert wait_until_idle(server), "blocks were not freed after the client left"
    m = server.metrics()
    assert m["hablar_requests_finished_total"] > before
    assert m["hablar_generated_tokens_total"] > 0


def test_slow_client_does_not_hold_up_others(server):
    # A client that sends a streaming request and then reads nothing.
    body = json.dumps({"messages": [{"role": "user", "content": "Tell me a story."}],
                       "max_tokens": 24, "temperature": 0, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(b"POST " + URL.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    try:
        t0 = time.time()
        r = chat(server, {"messages": MSGS, "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200
        assert time.time() - t0 < 120
        # The engine never waits for a client: the slow request ends and frees its blocks.
        assert wait_until_idle(server)
    finally:
        sock.close()


def test_ten_thousand_bad_requests_keep_memory_flat(server):
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    bad = b'{"messages": [}'

    def burst(n):
        for _ in range(n):
            conn.request("POST", URL, body=bad, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 400
    burst(1000)  # warm-up: allocator pools, thread stacks
    rss_before = server.rss_kib()
    burst(9000)
    rss_after = server.rss_kib()
    conn.close()
    print(f"\nRSS before {rss_before} KiB, after 9000 more bad requests {rss_after} KiB")
    assert rss_after - rss_before < 8 * 1024
    assert chat(server, {"messages": MSGS, "max_tokens": 2}).status_code == 200
