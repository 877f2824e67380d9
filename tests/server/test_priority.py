"""Scheduling priority (vLLM's `priority`: lower runs first) in the OpenAI and llama.cpp
bodies: accepted, validated, and with one running slot a later request of higher priority
finishes before an earlier one of lower priority; the outputs are each request's own."""
import concurrent.futures as cf
import threading
import time

import pytest
import requests

from conftest import ServerProcess, sse_events_iter


@pytest.fixture(scope="module")
def one_slot_server():
    s = ServerProcess("-np", "1", "-t", "2").wait_ready()
    yield s
    s.stop()


def completion(server, prompt, priority, n=24):
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "priority": priority}
    r = requests.post(server.url + "/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    return r.json()["choices"][0]["text"], time.monotonic()


def test_priority_is_accepted_and_checked(server):
    ok = requests.post(server.url + "/completion",
                       json={"prompt": "Hello", "n_predict": 2, "priority": -3}, timeout=120)
    assert ok.status_code == 200, ok.text
    bad = requests.post(server.url + "/v1/completions",
                        json={"prompt": "Hello", "max_tokens": 2, "priority": "high"}, timeout=120)
    assert bad.status_code == 400
    assert "priority" in bad.text


def test_higher_priority_goes_first_with_its_own_output(one_slot_server):
    s = one_slot_server
    solo_low = completion(s, "The river runs", 0)[0]
    solo_high = completion(s, "The mountain stands", 0)[0]
    started = threading.Event()

    def busy_stream():
        # Holds the one slot long enough, on any device, for both others to queue behind it.
        body = {"prompt": "Once upon a time", "n_predict": 400, "ignore_eos": True,
                "temperature": 0, "stream": True}
        r = requests.post(s.url + "/completion", json=body, stream=True, timeout=600)
        r.raise_for_status()
        for _ in sse_events_iter(r):
            started.set()

    with cf.ThreadPoolExecutor(3) as pool:
        busy = pool.submit(busy_stream)
        assert started.wait(120), "the busy request produced nothing"
        low = pool.submit(completion, s, "The river runs", 5)
        time.sleep(0.05)  # the low-priority request arrives first
        high = pool.submit(completion, s, "The mountain stands", -5)
        (text_low, t_low), (text_high, t_high) = low.result(), high.result()
        busy.result()
    assert text_low == solo_low and text_high == solo_high
    assert t_high < t_low, "the later, higher-priority request should finish first"
