"""What /props and /v1/models report about the context is what the server enforces, with a
quantized KV cache too. `serve -c` is the KV pool all sequences share: it may exceed the
model's context, while each sequence stays within it (run and perplexity, one sequence each,
refuse -c beyond it: tests/unit/model/test_cli_long_context.py)."""
import subprocess

import pytest
import requests

from conftest import BIN, DEFAULT_MODEL, TESTDATA, ServerProcess, cpu_only


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


@pytest.fixture(scope="module")
def windowed_server(tmp_path_factory):
    # A Mistral-style model (every layer slides over 12 positions) on a KV pool of 64 tokens
    # and steps of 16: the blocks behind the window are given back, so the pool bounds no
    # sequence and each may reach the model's context (2048 for the tiny shape).
    path = tmp_path_factory.mktemp("windowed") / "mistral-tiny.gguf"
    subprocess.run([BIN, "make-model", "--arch", "llama", "--shape", "tiny", "--type", "q8_0",
                    "--sliding-window", "12", "-t", "1",
                    "--vocab", str(TESTDATA / "vocab" / "ggml-vocab-llama-spm.gguf"),
                    "-o", str(path)], check=True, capture_output=True)
    s = ServerProcess("-m", str(path), "-c", "64", "-b", "16", "-t", "2").wait_ready()
    yield s
    s.stop()


@cpu_only
def test_sliding_window_sequence_outgrows_the_pool(windowed_server):
    url = windowed_server.url
    props = requests.get(url + "/props").json()
    assert props["n_ctx"] == 2048
    r = requests.post(url + "/completion", json={"prompt": "hello world", "n_predict": 200,
                                                 "ignore_eos": True, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens_predicted"] == 200 and body["stop_type"] == "limit"
    assert body["tokens_evaluated"] + 200 > 3 * 64  # three times the pool
