"""Protocol details llama-server's clients rely on: health probes, CORS, the first streamed
delta, timings, logit_bias forms, the context-size error, llamacpp:* metrics, the request
log and JSON bodies sent as curl sends them."""
import json
import time

import pytest
import requests

from conftest import ServerProcess, sse_events

HI = [{"role": "user", "content": "Say hello in one short sentence."}]


def test_health_live_and_ready(server):
    assert requests.get(server.url + "/health/live").json() == {"status": "ok"}
    assert requests.get(server.url + "/health/ready").json() == {"status": "ok"}


@pytest.fixture(scope="module")
def guarded():
    s = ServerProcess("--api-key", "k1", "--cors-origins", "localhost,https://app.example", "-t", "1")
    s.wait_ready(headers={"Authorization": "Bearer k1"})
    yield s
    s.stop()


def test_cors_as_llama_server(guarded, server):
    # A host entry matches any scheme and port of that host.
    pre = requests.options(guarded.url + "/v1/chat/completions", headers={
        "Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert pre.status_code == 200
    assert pre.headers["Access-Control-Allow-Origin"] == "http://localhost:5173"
    assert pre.headers["Access-Control-Allow-Credentials"] == "true"
    assert pre.headers["Access-Control-Allow-Methods"] == "GET, POST, DELETE, OPTIONS"
    assert "authorization" in pre.headers["Access-Control-Allow-Headers"]
    r = requests.get(guarded.url + "/v1/models", headers={"Origin": "https://app.example",
                                                          "Authorization": "Bearer k1"})
    assert r.headers["Access-Control-Allow-Origin"] == "https://app.example"
    # "localhost" stands for every loopback name, and only for those.
    for origin in ("http://127.0.0.1", "http://127.0.0.1:3000", "http://[::1]", "http://[::1]:3000"):
        r = requests.get(guarded.url + "/v1/models", headers={"Origin": origin, "Authorization": "Bearer k1"})
        assert r.headers.get("Access-Control-Allow-Origin") == origin, origin
    for origin in ("http://app.example", "http://evil.example", "http://localhost.evil.example",
                   "http://notlocalhost", "http://127.0.0.2"):
        r = requests.get(guarded.url + "/v1/models", headers={"Origin": origin, "Authorization": "Bearer k1"})
        assert "Access-Control-Allow-Origin" not in r.headers, origin
    # The default (*) echoes the origin rather than "*", with credentials allowed.
    r = requests.get(server.url + "/v1/models", headers={"Origin": "http://any.example"})
    assert r.headers["Access-Control-Allow-Origin"] == "http://any.example"
    # An origin without a scheme (non-browser clients send bare hosts) is read as a host.
    r = requests.get(server.url + "/v1/models", headers={"Origin": "any.example"})
    assert r.headers["Access-Control-Allow-Origin"] == "any.example"
    r = requests.get(guarded.url + "/v1/models", headers={"Origin": "evil.example",
                                                          "Authorization": "Bearer k1"})
    assert "Access-Control-Allow-Origin" not in r.headers
    # Probes stay open under an API key.
    assert requests.get(guarded.url + "/health/live").status_code == 200
    assert requests.get(guarded.url + "/health/ready").status_code == 200


def test_first_delta_and_timings(server):
    r = requests.post(server.url + "/v1/chat/completions", stream=True, json={
        "messages": HI, "max_tokens": 4, "temperature": 0, "stream": True})
    chunks = [json.loads(e) for e in sse_events(r) if e != "[DONE]"]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert chunks[-1]["choices"][0]["finish_reason"] and chunks[-1]["timings"]["predicted_n"] == 4
    j = requests.post(server.url + "/v1/chat/completions", json={
        "messages": HI, "max_tokens": 4, "temperature": 0}).json()
    t = j["timings"]
    assert t["predicted_n"] == j["usage"]["completion_tokens"] == 4
    assert t["prompt_n"] + t["cache_n"] == j["usage"]["prompt_tokens"]
    assert t["predicted_ms"] > 0 and t["prompt_per_second"] >= 0
    c = requests.post(server.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 3}).json()
    assert c["timings"]["predicted_n"] == c["usage"]["completion_tokens"]
    # The same durations in a Server-Timing header (non-streamed replies).
    r = requests.post(server.url + "/v1/chat/completions", json={"messages": HI, "max_tokens": 3})
    parts = dict(p.strip().split(";dur=") for p in r.headers["Server-Timing"].split(","))
    assert set(parts) == {"queue", "prefill", "decode", "detokenize"}
    t = r.json()["timings"]
    assert abs(float(parts["decode"]) - t["predicted_ms"]) < 0.01 and t["queue_ms"] >= 0
    assert abs(float(parts["detokenize"]) - t["detokenize_ms"]) < 0.01
    for path, body in (("/completion", {"prompt": "Hi", "n_predict": 2}),
                       ("/v1/messages", {"messages": HI, "max_tokens": 2}),
                       ("/v1/responses", {"input": "Hi", "max_output_tokens": 2}),
                       ("/api/generate", {"prompt": "Hi", "stream": False, "options": {"num_predict": 2}})):
        assert "decode;dur=" in requests.post(server.url + path, json=body).headers["Server-Timing"], path


def test_logit_bias_by_id_and_by_text(server):
    prompt = "The capital of France is"
    first = requests.post(server.url + "/completion", json={
        "prompt": prompt, "n_predict": 3, "temperature": 0, "return_tokens": True}).json()
    t0 = first["tokens"][0]
    piece = requests.post(server.url + "/detokenize", json={"tokens": [t0]}).json()["content"]
    assert requests.post(server.url + "/tokenize", json={"content": piece}).json()["tokens"] == [t0]

    def oai(bias):
        r = requests.post(server.url + "/v1/completions", json={
            "prompt": prompt, "max_tokens": 3, "temperature": 0, "logit_bias": bias})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    by_id = oai({str(t0): -100})
    assert not by_id.startswith(piece) and by_id != first["content"]
    assert oai({piece: -100}) == by_id  # a key that is not an id is text
    assert oai([[t0, -100]]) == by_id

    def llama(bias):
        return requests.post(server.url + "/completion", json={
            "prompt": prompt, "n_predict": 3, "temperature": 0, "return_tokens": True,
            "logit_bias": bias}).json()["tokens"]

    banned = llama([[t0, False]])
    assert banned[0] != t0 and llama([[piece, False]]) == banned
    r = requests.post(server.url + "/v1/completions", json={"prompt": prompt, "logit_bias": {"1": 500}})
    assert r.status_code == 400 and "logit_bias" in r.json()["error"]["message"]


def test_n_probs_entries_have_bytes(server):
    j = requests.post(server.url + "/completion", json={"prompt": "Hello", "n_predict": 2, "n_probs": 2,
                                                        "temperature": 0}).json()
    for p in j["completion_probabilities"]:
        assert bytes(p["bytes"]).decode("utf-8", "replace") == p["token"]
        assert len(p["top_logprobs"]) == 2
        assert all(bytes(t["bytes"]).decode("utf-8", "replace") == t["token"] for t in p["top_logprobs"])


def test_completion_stream_tokens_new_line_and_stopping_word(server):
    body = {"prompt": "List three fruits, one per line:\n1.", "n_predict": 12, "temperature": 0}
    whole = requests.post(server.url + "/completion", json={**body, "return_tokens": True}).json()
    r = requests.post(server.url + "/completion", stream=True, json={**body, "stream": True})
    chunks = [json.loads(e) for e in sse_events(r)]
    ids = [t for c in chunks[:-1] for t in c["tokens"]]
    assert ids == whole["tokens"]
    assert chunks[-1]["has_new_line"] == whole["has_new_line"] == ("\n" in whole["content"])
    word = whole["content"].split()[1]
    stopped = requests.post(server.url + "/completion", json={**body, "stop": [word]}).json()
    assert stopped["stop_type"] == "word" and stopped["stopping_word"] == word


@pytest.fixture(scope="module")
def small_steps():
    # At most 32 tokens per engine step: a 200-token prompt takes several steps.
    s = ServerProcess("-b", "32", "-t", "1").wait_ready()
    yield s
    s.stop()


def check_progress(progress, total):
    assert progress, "no prompt_progress chunk"
    processed = [p["processed"] for p in progress]
    assert processed == sorted(set(processed)), processed  # growing, no repeats
    assert processed[-1] == total and all(p["total"] == total for p in progress)
    assert len(progress) >= 2, processed  # several steps were reported
    # The first report comes before any of the prompt is computed: only cached tokens count.
    assert all(p["cache"] == progress[0]["cache"] for p in progress)
    assert processed[0] == progress[0]["cache"]


def test_return_progress(small_steps):
    prompt = "one two three four " * 50
    r = requests.post(small_steps.url + "/completion", stream=True, json={
        "prompt": prompt, "n_predict": 2, "stream": True, "return_progress": True, "cache_prompt": False})
    chunks = [json.loads(e) for e in sse_events(r)]
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    first_text = next(i for i, c in enumerate(chunks) if "prompt_progress" not in c)
    assert all("prompt_progress" in c for c in chunks[:first_text])  # all progress comes first
    check_progress(progress, chunks[-1]["tokens_evaluated"])
    r = requests.post(small_steps.url + "/v1/chat/completions", stream=True, json={
        "messages": [{"role": "user", "content": "five six seven " * 50}], "max_tokens": 2, "stream": True,
        "return_progress": True, "stream_options": {"include_usage": True}})
    chunks = [json.loads(e) for e in sse_events(r) if e != "[DONE]"]
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    check_progress(progress, chunks[-1]["usage"]["prompt_tokens"])
    # The same chat again: its first report already counts the cached prefix as processed.
    r = requests.post(small_steps.url + "/v1/chat/completions", stream=True, json={
        "messages": [{"role": "user", "content": "five six seven " * 50}], "max_tokens": 2, "stream": True,
        "return_progress": True})
    again = [json.loads(e)["prompt_progress"] for e in sse_events(r)
             if e != "[DONE]" and "prompt_progress" in e]
    assert again[0]["cache"] > 0 and again[0]["processed"] == again[0]["cache"], again
    assert again[-1]["processed"] == progress[-1]["processed"]
    # Without return_progress there is none.
    r = requests.post(small_steps.url + "/completion", stream=True, json={
        "prompt": prompt, "n_predict": 1, "stream": True})
    assert not [e for e in sse_events(r) if "prompt_progress" in e]


def test_slots_idle_once_the_reply_is_sent(small_steps):
    for _ in range(3):
        r = requests.post(small_steps.url + "/completion", json={"prompt": "Hello there", "n_predict": 3})
        assert r.status_code == 200
        slots = requests.get(small_steps.url + "/slots").json()
        assert not [s for s in slots if s["is_processing"]], slots


def test_completion_with_a_list_of_prompts(server):
    url = server.url + "/completion"
    ids = requests.post(server.url + "/tokenize", json={"content": "The capital of France is"}).json()["tokens"]

    def one(prompt):
        return requests.post(url, json={"prompt": prompt, "n_predict": 3, "temperature": 0}).json()

    singles = [one("Hello"), one(ids)]
    both = requests.post(url, json={"prompt": ["Hello", ids], "n_predict": 3, "temperature": 0}).json()
    assert isinstance(both, list) and [r["index"] for r in both] == [0, 1]
    assert [r["content"] for r in both] == [r["content"] for r in singles]
    assert both[1]["tokens_evaluated"] == singles[1]["tokens_evaluated"]
    # Texts mixed with ids at the top level are one prompt, as before.
    assert isinstance(one(["Hello", 42]), dict)
    r = requests.post(url, stream=True, json={"prompt": [ids, "Hello"], "n_predict": 3, "temperature": 0,
                                              "stream": True})
    chunks = [json.loads(e) for e in sse_events(r)]
    finals = [c for c in chunks if c["stop"]]
    assert [c["index"] for c in finals] == [0, 1]
    for i, single in enumerate((singles[1], singles[0])):
        assert "".join(c["content"] for c in chunks if c["index"] == i) == single["content"]
    bad = requests.post(url, json={"prompt": [["a", {}]]})
    assert bad.status_code == 400


def test_slots_show_prompt_and_params(small_steps):
    # A long prompt at 32 tokens per step keeps the request busy for a while.
    body = {"prompt": "alpha beta gamma delta " * 60, "n_predict": 3, "temperature": 0.5, "top_k": 7,
            "stream": True}
    r = requests.post(small_steps.url + "/completion", json=body, stream=True)
    busy = []
    deadline = time.time() + 30
    while not busy and time.time() < deadline:
        busy = [s for s in requests.get(small_steps.url + "/slots").json() if s["is_processing"]]
    r.close()
    assert busy, "never saw the request in /slots"
    slot = busy[0]
    assert "alpha beta gamma delta" in slot["prompt"]
    assert slot["params"]["temperature"] == 0.5 and slot["params"]["top_k"] == 7
    assert slot["params"]["n_predict"] == 3 and slot["t_elapsed_ms"] >= 0


def test_exceed_context_size_error(server):
    r = requests.post(server.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hello " * 5000}], "max_tokens": 2})
    assert r.status_code == 400
    e = r.json()["error"]
    assert e["type"] == "exceed_context_size_error"
    assert e["n_ctx"] == 4096 and e["n_prompt_tokens"] > 4096
    assert str(e["n_prompt_tokens"]) in e["message"]


def test_llamacpp_metrics_and_start_time(server):
    requests.post(server.url + "/completion", json={"prompt": "Hi", "n_predict": 2})
    r = requests.get(server.url + "/metrics")
    start = int(r.headers["Process-Start-Time-Unix"])
    assert time.time() - 3600 < start <= time.time()
    values = server.metrics()
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total",
                 "llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_seconds_total",
                 "llamacpp:n_decode_total", "llamacpp:kv_cache_usage_ratio",
                 "llamacpp:requests_processing", "llamacpp:requests_deferred"):
        assert name in values, name
    assert values["llamacpp:tokens_predicted_total"] == values["hablar_generated_tokens_total"] >= 2
    assert "# TYPE llamacpp:prompt_tokens_total counter" in r.text


def test_request_log_line(server):
    requests.post(server.url + "/tokenize", json={"content": "log me"})
    deadline = time.time() + 5
    while time.time() < deadline:
        if any("POST /tokenize 200" in line for line in server.log_lines):
            break
        time.sleep(0.05)
    lines = [line for line in server.log_lines if "POST /tokenize 200" in line]
    assert lines and "127.0.0.1" in lines[-1] and " ms" in lines[-1]


def test_json_without_json_content_type(server):
    body = json.dumps({"prompt": "Hi", "n_predict": 2})
    # curl -d sends application/x-www-form-urlencoded; no header at all is JSON too.
    for headers in ({"Content-Type": "application/x-www-form-urlencoded"}, {"Content-Type": "text/plain"}, {}):
        r = requests.post(server.url + "/completion", data=body, headers=headers)
        assert r.status_code == 200, (headers, r.text)
    r = requests.post(server.url + "/api/generate", data=json.dumps({"prompt": "Hi", "stream": False,
                                                                      "options": {"num_predict": 2}}),
                      headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200 and r.json()["done"] is True
    r = requests.post(server.url + "/completion", data=body, headers={"Content-Type": "text/html"})
    assert r.status_code == 415
