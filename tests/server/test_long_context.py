"""What /props and /v1/models report about the context is what the server enforces, with a
quantized KV cache too. `serve -c` is the KV pool all sequences share: it may exceed the
model's context, while each sequence stays within it (run and perplexity, one sequence each,
refuse -c beyond it: tests/unit/model/test_cli_long_context.py)."""
import subprocess

import pytest
import requests

from conftest import BIN, DEFAULT_MODEL, ServerProcess, cpu_only


@pytest.fixture(scope="module")
def q8_server():
    s = ServerProcess("-c", "1024", "-t", "2", "--cache-type-k", "q8_0", "--cache-type-v",
                      "q8_0").wait_ready()
    yield s
    s.stop()


@cpu_only
def test_reported_context_is_the_enforced_one(q8_server):
    props = requests.get(q8_server.url + "/props").json()
    assert props["n_ctx"] == 1024
    assert props["default_generation_settings"]["n_ctx"] == 1024
    meta = requests.get(q8_server.url + "/v1/models").json()["data"][0]["meta"]
    assert meta["n_ctx"] == 1024 and meta["n_ctx_train"] == 8192
    # A prompt that fits is served (through the Q8_0 cache) ...
    ok = requests.post(q8_server.url + "/completion",
                       json={"prompt": "The capital of France is", "n_predict": 4,
                             "temperature": 0})
    assert ok.status_code == 200 and ok.json()["tokens_predicted"] == 4
    # ... one beyond n_ctx gets llama-server's error type.
    r = requests.post(q8_server.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hello " * 1500}], "max_tokens": 2})
    assert r.status_code == 400
    e = r.json()["error"]
    assert e["type"] == "exceed_context_size_error" and e["n_ctx"] == 1024


def test_a_pool_beyond_the_trained_context_limits_each_sequence_to_it():
    s = ServerProcess("-c", "16384", "-t", "1").wait_ready()
    try:
        props = requests.get(s.url + "/props").json()
        assert props["n_ctx"] == 8192
        assert props["default_generation_settings"]["n_ctx"] == 8192
        meta = requests.get(s.url + "/v1/models").json()["data"][0]["meta"]
        assert meta["n_ctx"] == 8192 and meta["n_ctx_train"] == 8192
        r = requests.post(s.url + "/completion", json={"prompt": "Hi", "n_predict": 2})
        assert r.status_code == 200
    finally:
        s.stop()
