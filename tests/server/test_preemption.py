"""Preemption: with a KV cache too small for all running sequences, every request still
completes with the output it has alone."""
import concurrent.futures as cf
import time

import pytest
import requests

from conftest import ServerProcess

PROMPTS = ["Tell me about the moon.", "Tell me about the ocean.", "Tell me about mountains.",
           "Tell me about rivers.", "Tell me about forests.", "Tell me about deserts."]


@pytest.fixture(scope="module")
def small_cache_server():
    # 8 blocks of 16 = 128 positions. Six sequences of ~36 prompt + 32 generated tokens need
    # 5 blocks each, 2 of them shared (the template's system prompt): 20 blocks in all.
    s = ServerProcess("--metrics", "-np", "6", "-c", "128", "-t", "2", "-b", "64").wait_ready()
    yield s
    s.stop()


def complete(server, prompt):
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 32, "temperature": 0,
            "stream": False}
    r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


def test_every_request_keeps_its_solo_output(small_cache_server):
    s = small_cache_server
    solo = [complete(s, p) for p in PROMPTS]
    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: complete(s, p), PROMPTS))
    assert together == solo
    m = s.metrics()
    assert m["hablar_preemptions_total"] > 0, "the cache was large enough: nothing was preempted"
    # Published after the step that finished the last request: poll briefly.
    deadline = time.time() + 10
    while s.metrics()["hablar_kv_cache_blocks_used"] != 0 and time.time() < deadline:
        time.sleep(0.05)
    assert s.metrics()["hablar_kv_cache_blocks_used"] == 0
