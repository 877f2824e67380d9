"""What /props and /v1/models report about the context is what the server enforces, with a
quantized KV cache too; -c beyond the model's trained context is refused at start-up."""
import subprocess

import pytest
import requests

from conftest import BIN, DEFAULT_MODEL, ServerProcess


@pytest.fixture(scope="module")
def q8_server():
    s = ServerProcess("-c", "1024", "-t", "2", "--cache-type-k", "q8_0", "--cache-type-v",
                      "q8_0").wait_ready()
    yield s
    s.stop()


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


def test_context_beyond_the_trained_one_is_refused_at_start_up():
    r = subprocess.run([BIN, "serve", "-m", str(DEFAULT_MODEL), "--port", "0", "-c", "16384"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "16384 exceeds the model's context of 8192" in r.stderr
