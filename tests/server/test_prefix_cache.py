"""Prefix caching: a second request sharing a ~1,000-token prefix gets its first token in at
most a quarter of the first request's time, with identical output."""
import json
import time

import requests

from conftest import sse_events

# About 1,000 tokens of varied text (a fixed paragraph with numbered sentences).
SENTENCES = [f"Fact {i}: the {w} in room {i * 7 % 13} weighs {i * 3 + 1} kilograms." for i, w in
             zip(range(1, 200), ["lamp", "chair", "table", "book", "clock", "vase", "rug"] * 40)]
LONG_SYSTEM = "You keep an inventory. " + " ".join(SENTENCES[:80])


def first_token_time_and_text(server, messages):
    body = {"messages": messages, "max_tokens": 6, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    r = requests.post(server.url + "/v1/chat/completions", json=body, stream=True, timeout=600)
    ttft, text = None, ""
    for e in sse_events(r):
        if e == "[DONE]":
            break
        delta = json.loads(e)["choices"][0]["delta"].get("content")
        if delta and ttft is None:
            ttft = time.perf_counter() - t0
        text += delta or ""
    return ttft, text


def test_shared_prefix_is_four_times_faster_to_first_token(server):
    messages = [{"role": "system", "content": LONG_SYSTEM},
                {"role": "user", "content": "How much does the lamp in room 7 weigh?"}]
    prompt = requests.post(server.url + "/apply-template", json={"messages": messages}).json()["prompt"]
    n_tokens = len(requests.post(server.url + "/tokenize", json={"content": prompt}).json()["tokens"])
    assert n_tokens >= 1000, n_tokens
    cached_before = server.metrics()["hablar_prompt_tokens_cached_total"]
    first_ttft, first_text = first_token_time_and_text(server, messages)
    second_ttft, second_text = first_token_time_and_text(server, messages)
    print(f"\nprefix cache: {n_tokens}-token prompt, first token after {first_ttft * 1e3:.0f} ms cold, "
          f"{second_ttft * 1e3:.0f} ms cached (ratio {first_ttft / second_ttft:.1f}x)")
    assert second_text == first_text
    # On the CPU the prompt's compute is the first token's time; a GPU computes this prompt
    # in a few ms, beside fixed per-request costs of the same order, and is held to 2x.
    device = requests.get(server.url + "/props").json().get("device")
    assert second_ttft <= first_ttft / (4 if device == "cpu" else 2)
    cached = server.metrics()["hablar_prompt_tokens_cached_total"] - cached_before
    assert cached >= 1000 - 16


def test_cached_tokens_reach_the_first_different_token(server):
    """As llama-server counts them, whatever the cache's block size: a repeated prompt is
    served from the cache but for its last token, a changed one up to its first different
    token; each reply equals the prompt's computed afresh (echo with log-probabilities never
    takes a prompt from the cache)."""
    def messages(user):
        return [{"role": "system", "content": "You count. Session 5e0c1b."},
                {"role": "user", "content": user}]

    def templated(user):
        return requests.post(server.url + "/apply-template",
                             json={"messages": messages(user)}).json()["prompt"]

    def shared_run(a, b):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    users = ["1 2 3 4 5 6", "1 2 3 4 5 6", "1 2 3 4 5 9", "1 2 3 9 9 9"]
    previous, replies = None, {}
    for user in users:
        body = {"messages": messages(user), "max_tokens": 6, "temperature": 0}
        reply = requests.post(server.url + "/v1/chat/completions", json=body, timeout=120).json()
        toks = requests.post(server.url + "/tokenize",
                             json={"content": templated(user)}).json()["tokens"]
        assert reply["usage"]["prompt_tokens"] == len(toks)
        cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
        if previous is not None:
            assert cached == min(shared_run(previous, toks), len(toks) - 1), (user, cached)
        replies.setdefault(user, []).append(reply["choices"][0]["message"]["content"])
        previous = toks
    for user, texts in replies.items():
        body = {"prompt": templated(user), "max_tokens": 6, "temperature": 0, "echo": True,
                "logprobs": 1}
        fresh = requests.post(server.url + "/v1/completions", json=body, timeout=120).json()
        for text in texts:
            assert text and fresh["choices"][0]["text"].endswith(text), (user, text, fresh)


def test_cache_prompt_false_computes_every_prompt_token(server):
    """llama-server's cache_prompt: false on /completion computes the whole prompt again
    (a cold prefill, as benchmarks ask); the default reuses it."""
    body = {"prompt": "Count the marbles in the blue box, session 77d1.", "n_predict": 3,
            "temperature": 0}
    first = requests.post(server.url + "/completion", json=body).json()
    n = first["timings"]["prompt_n"] + first["timings"]["cache_n"]
    cold = requests.post(server.url + "/completion", json={**body, "cache_prompt": False}).json()
    assert cold["timings"]["cache_n"] == 0 and cold["timings"]["prompt_n"] == n
    warm = requests.post(server.url + "/completion", json=body).json()
    assert warm["timings"]["cache_n"] == n - 1 and warm["timings"]["prompt_n"] == 1
    assert cold["content"] == warm["content"] == first["content"]
