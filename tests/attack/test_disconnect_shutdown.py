"""Clients that leave are cancelled (streamed or not, waiting or running), and a shutdown
that cuts generations says so: /health 503 while draining, an error event at the end of a
cut stream (no "stop"), 503 for a cut non-streamed request."""
import json
import socket
import threading
import time

import requests

from .attack_util import ServerProcess, still_serving

LONG = {"prompt": "Once upon a time", "n_predict": 3000, "ignore_eos": True, "temperature": 0}


def busy(server):
    m = server.metrics()
    return m["hablar_requests_running"] + m["hablar_requests_waiting"]


def open_and_leave(server, path, body, n, stay_s):
    """n clients send `body` on raw sockets and close them after `stay_s` seconds."""
    data = json.dumps(body).encode()
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
        socks.append(s)
    time.sleep(stay_s)
    assert busy(server) > 0, "the requests were not running"
    for s in socks:
        s.close()
    t0 = time.time()
    while busy(server) > 0 and time.time() - t0 < 5:
        time.sleep(0.05)
    return time.time() - t0


def test_non_streamed_clients_that_leave_are_cancelled(attacked):
    # 16 clients on 8 slots: half run, half wait; all leave after 1.5 s.
    freed = open_and_leave(attacked, "/completion", LONG, 16, 1.5)
    print(f"freed in {freed:.2f} s")
    assert freed < 1.5, f"slots still busy {freed:.1f} s after the clients left"
    assert attacked.metrics()["hablar_kv_cache_blocks_used"] == 0
    still_serving(attacked)


def test_non_streamed_chat_clients_that_leave_are_cancelled(attacked):
    body = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 3000,
            "temperature": 1.5, "n": 2}
    freed = open_and_leave(attacked, "/v1/chat/completions", body, 4, 1.5)
    print(f"freed in {freed:.2f} s")
    assert freed < 1.5, f"slots still busy {freed:.1f} s after the clients left"
    still_serving(attacked)


def test_streamed_clients_that_leave_are_cancelled(attacked):
    freed = open_and_leave(attacked, "/completion", dict(LONG, stream=True), 8, 1.5)
    assert freed < 1.5
    still_serving(attacked)


def test_sigterm_cuts_streams_with_an_error_and_health_503():
    s = ServerProcess("--metrics", "-np", "4", "-c", "8192", "-t", "2",
                      "--shutdown-grace", "3").wait_ready()
    results = {}

    def stream(key, path, body):
        try:
            r = requests.post(s.url + path, json=body, stream=True, timeout=60)
            results[key] = [line for line in r.iter_lines(decode_unicode=True) if line]
        except requests.RequestException as e:
            results[key] = e

    def plain():
        try:
            results["plain"] = requests.post(s.url + "/completion", json=LONG, timeout=60)
        except requests.RequestException as e:
            results["plain"] = e

    # End-of-generation tokens banned, so that nothing ends before the grace period does.
    chat = {"messages": [{"role": "user", "content": "Count to a million."}], "max_tokens": 6000,
            "stream": True, "temperature": 1.5, "seed": 1,
            "logit_bias": {"0": -100, "1": -100, "2": -100}}
    threads = [threading.Thread(target=stream, args=("chat", "/v1/chat/completions", chat)),
               threading.Thread(target=stream, args=("llama", "/completion", dict(LONG, stream=True))),
               threading.Thread(target=plain)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    s.proc.send_signal(15)
    time.sleep(0.5)
    health = requests.get(s.url + "/health", timeout=5)
    assert health.status_code == 503, health.text
    for t in threads:
        t.join(30)
    assert s.proc.wait(30) == 0

    chat_lines = results["chat"]
    assert not isinstance(chat_lines, Exception), chat_lines
    events = [json.loads(l[6:]) for l in chat_lines if l.startswith("data: {")]
    finishes = [c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")]
    assert "stop" not in finishes and "length" not in finishes, finishes
    assert "error" in events[-1] and events[-1]["error"]["code"] == 503, events[-1]

    llama = [json.loads(l[6:]) for l in results["llama"] if l.startswith("data: ")]
    assert "error" in llama[-1], llama[-1]
    assert all(e.get("stop_type") != "eos" for e in llama)

    plain_r = results["plain"]
    assert not isinstance(plain_r, Exception), plain_r
    assert plain_r.status_code == 503, plain_r.text
