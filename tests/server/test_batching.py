"""Continuous batching seen through HTTP: concurrent greedy streams equal their solo runs,
a short request overtakes a long one, and /metrics shows batches of more than one."""
import concurrent.futures as cf
import json
import threading
import time

import requests

from conftest import sse_events, sse_events_iter

PROMPTS = [
    "Name three fruits.",
    "What is two plus two?",
    "Describe the sea in a sentence.",
    "Give me a color.",
    "Say something about cats.",
    "What do bees make?",
    "Where is the sun at noon?",
    "Tell me a number between one and ten.",
]
MAX_TOKENS = 6


def stream_text(server, prompt, max_tokens=MAX_TOKENS):
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    r = requests.post(server.url + "/v1/chat/completions", json=body, stream=True, timeout=600)
    r.raise_for_status()
    text, finish = "", None
    for e in sse_events(r):
        if e == "[DONE]":
            break
        c = json.loads(e)
        text += c["choices"][0]["delta"].get("content") or ""
        finish = c["choices"][0]["finish_reason"] or finish
    return text, finish


def test_32_concurrent_streams_equal_their_solo_output(server):
    solo = {p: stream_text(server, p) for p in PROMPTS}
    requests_ = [PROMPTS[i % len(PROMPTS)] for i in range(32)]
    with cf.ThreadPoolExecutor(32) as pool:
        together = list(pool.map(lambda p: stream_text(server, p), requests_))
    for p, got in zip(requests_, together):
        assert got == solo[p], f"batched output differs for {p!r}"
    m = server.metrics()
    assert m["hablar_batch_size_max"] > 1
    # Batches above one were observed in the histogram too.
    assert m['hablar_batch_size_bucket{le="1"}'] < m["hablar_batch_size_count"]


def test_short_request_finishes_during_a_long_one(server):
    long_done = {}
    generating = threading.Event()

    def long_request():
        # Long enough (ignore_eos) to still run when the short one arrives, on any device.
        body = {"prompt": "Once upon a time, a brave knight", "n_predict": 200,
                "ignore_eos": True, "temperature": 0, "stream": True}
        r = requests.post(server.url + "/completion", json=body, stream=True, timeout=600)
        r.raise_for_status()
        for _ in sse_events_iter(r):
            generating.set()  # its first token is out: it is decoding now
        long_done["t"] = time.time()

    with cf.ThreadPoolExecutor(2) as pool:
        fut = pool.submit(long_request)
        assert generating.wait(120), "the long request produced nothing"
        text, finish = stream_text(server, "Say yes.", max_tokens=2)
        short_done = time.time()
        fut.result()
    assert finish == "length" or finish == "stop"
    assert short_done < long_done["t"], "the short request waited for the long one"
