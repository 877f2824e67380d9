"""llama-server details over plain HTTP: /completion's post_sampling_probs (probabilities after
the sampler chain), per-request timings (the `timings` phases and the optional
X-Hablar-Timings header) and the context one request may use (/props and /slots tell the
limit that is enforced)."""
import math

import pytest
import requests

from conftest import ServerProcess

PROMPT = "The capital of France is"


def completion(server, **body):
    r = requests.post(server.url + "/completion", json={"prompt": PROMPT, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r


def expected_post(raw_top, k, temperature):
    """The chain's survivors of top-k alone (top_p 1, min_p 0): the k best raw tokens,
    renormalized after temperature."""
    best = raw_top[:k]
    weights = [math.exp(e["logprob"] / temperature) for e in best]
    total = sum(weights)
    return {e["id"]: w / total for e, w in zip(best, weights)}


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_post_sampling_probs_are_those_after_the_chain(server, temperature):
    body = {"n_predict": 6, "n_probs": 5, "temperature": temperature, "top_k": 3, "top_p": 1.0,
            "min_p": 0.0, "seed": 11}
    raw = completion(server, **body).json()["completion_probabilities"]
    post = completion(server, post_sampling_probs=True, **body).json()["completion_probabilities"]
    # The same seed and chain draw the same tokens either way.
    assert [e["id"] for e in post] == [e["id"] for e in raw] and len(post) == 6
    for r, p in zip(raw, post):
        assert set(p) == {"id", "token", "bytes", "prob", "top_probs"}
        assert set(r) == {"id", "token", "bytes", "logprob", "top_logprobs"}
        assert len(r["top_logprobs"]) == 5
        # Only top_k = 3 tokens remain candidates: their probabilities add up to 1.
        assert 1 <= len(p["top_probs"]) <= 3
        for alt in p["top_probs"]:
            assert set(alt) == {"id", "token", "bytes", "prob"}
        probs = [alt["prob"] for alt in p["top_probs"]]
        assert probs == sorted(probs, reverse=True)
        assert sum(probs) == pytest.approx(1.0, abs=1e-4)
        want = expected_post(r["top_logprobs"], 3, temperature)
        got = {alt["id"]: alt["prob"] for alt in p["top_probs"]}
        assert got.keys() == want.keys()
        for tok, prob in want.items():
            assert got[tok] == pytest.approx(prob, rel=2e-3, abs=1e-5)
        assert p["prob"] == pytest.approx(got[p["id"]], abs=1e-6)
        # The chosen token's post-chain probability is at least its raw one (mass is renormalized
        # over fewer tokens; with temperature <= 1 the best ones only gain).
        if r["id"] == r["top_logprobs"][0]["id"]:
            assert p["prob"] >= math.exp(r["logprob"]) - 1e-6


def test_post_sampling_probs_greedy_and_streamed(server):
    greedy = completion(server, n_predict=4, n_probs=3, temperature=0,
                        post_sampling_probs=True).json()["completion_probabilities"]
    for e in greedy:
        # Greedy keeps one candidate, the chosen token.
        assert e["prob"] == 1.0 and [(a["id"], a["prob"]) for a in e["top_probs"]] == [(e["id"], 1.0)]
    r = requests.post(server.url + "/completion", json={
        "prompt": PROMPT, "n_predict": 4, "n_probs": 4, "temperature": 0.8, "top_k": 4,
        "top_p": 1.0, "min_p": 0.0, "seed": 5, "post_sampling_probs": True, "stream": True},
        stream=True, timeout=120)
    import json
    chunks = [json.loads(line[6:]) for line in r.iter_lines(decode_unicode=True)
              if line.startswith("data: ")]
    token_chunks = [c for c in chunks if c.get("completion_probabilities")]
    assert len(token_chunks) == 4
    for c in token_chunks:
        (e,) = c["completion_probabilities"]
        assert e["id"] == c["tokens"][0] and "logprob" not in e
        assert sum(a["prob"] for a in e["top_probs"]) == pytest.approx(1.0, abs=1e-4)
        assert e["prob"] in [a["prob"] for a in e["top_probs"]]


def test_post_sampling_probs_off_without_n_probs(server):
    j = completion(server, n_predict=2, post_sampling_probs=True).json()
    assert "completion_probabilities" not in j


def parse_timings_header(value):
    out = {}
    for part in value.split(";"):
        k, v = part.split("=")
        out[k] = float(v)
    return out


def test_timings_phases_and_header_on_request(server):
    ask = {"messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 8,
           "temperature": 0}
    plain = requests.post(server.url + "/v1/chat/completions", json=ask, timeout=120)
    assert plain.status_code == 200 and "X-Hablar-Timings" not in plain.headers
    t = plain.json()["timings"]
    for key in ("queue_ms", "prefill_ms", "detokenize_ms", "prompt_ms", "predicted_ms",
                "predicted_n", "prompt_n", "cache_n"):
        assert key in t, key
    assert t["detokenize_ms"] > 0 and t["prefill_ms"] > 0
    assert t["detokenize_ms"] < t["prompt_ms"] + t["predicted_ms"]
    assert "detokenize;dur=" in plain.headers["Server-Timing"]

    r = requests.post(server.url + "/v1/chat/completions", json=ask, timeout=120,
                      headers={"X-Hablar-Timings": "1"})
    h = parse_timings_header(r.headers["X-Hablar-Timings"])
    body = r.json()
    assert set(h) == {"queued", "prefill", "decode", "detokenize", "prompt_tokens",
                      "cached_tokens", "tokens"}
    assert h["tokens"] == body["usage"]["completion_tokens"] == body["timings"]["predicted_n"]
    assert h["prompt_tokens"] == body["usage"]["prompt_tokens"]
    assert h["decode"] == pytest.approx(body["timings"]["predicted_ms"], abs=0.01)
    assert h["queued"] == pytest.approx(body["timings"]["queue_ms"], abs=0.01)
    assert h["prefill"] == pytest.approx(body["timings"]["prefill_ms"], abs=0.01)
    assert h["detokenize"] == pytest.approx(body["timings"]["detokenize_ms"], abs=0.01)
    # /completion and the other routes' non-streamed replies have it too.
    r = requests.post(server.url + "/completion", json={"prompt": "Hi", "n_predict": 3},
                      headers={"X-Hablar-Timings": "yes"}, timeout=120)
    assert parse_timings_header(r.headers["X-Hablar-Timings"])["tokens"] == 3


@pytest.fixture(scope="module")
def small_ctx():
    """A 256-token cache over 4 slots, with the timings header always on."""
    s = ServerProcess("-np", "4", "-c", "256", "-t", "2", "--timings-header").wait_ready()
    yield s
    s.stop()


def test_timings_header_flag(small_ctx):
    r = requests.post(small_ctx.url + "/completion", json={"prompt": "Hi", "n_predict": 2}, timeout=60)
    h = parse_timings_header(r.headers["X-Hablar-Timings"])
    assert h["tokens"] == 2 and h["prompt_tokens"] == r.json()["tokens_evaluated"]


def test_props_and_slots_tell_the_enforced_context(small_ctx):
    props = requests.get(small_ctx.url + "/props").json()
    n_ctx = props["default_generation_settings"]["n_ctx"]
    slots = requests.get(small_ctx.url + "/slots").json()
    assert len(slots) == props["total_slots"] == 4
    assert all(s["n_ctx"] == n_ctx for s in slots)
    # One shared paged cache: a request may use all of it, more than ctx-size / parallel.
    assert n_ctx == 256 > 256 // 4
    word = requests.post(small_ctx.url + "/tokenize", json={"content": " hello"}).json()["tokens"][-1]
    too_long = requests.post(small_ctx.url + "/completion",
                             json={"prompt": [word] * n_ctx, "n_predict": 1}, timeout=60)
    assert too_long.status_code == 400
    e = too_long.json()["error"]
    assert e["type"] == "exceed_context_size_error"
    assert e["n_ctx"] == n_ctx and e["n_prompt_tokens"] == n_ctx
    fits = requests.post(small_ctx.url + "/completion",
                         json={"prompt": [word] * (n_ctx - 1), "n_predict": 8}, timeout=120)
    assert fits.status_code == 200, fits.text
    j = fits.json()
    # Prompt and completion share the context: one token of room is left.
    assert j["tokens_evaluated"] == n_ctx - 1 and j["tokens_predicted"] == 1
    assert j["stop_type"] == "limit"
