"""OpenAI API through the official client: chat, streaming delta rules, completions, models,
logprobs, seeds, stop strings, finish reasons and usage counts."""
import json

import requests

from conftest import chat, sse_events

HELLO = [{"role": "user", "content": "Say hello in one short sentence."}]


def prompt_token_count(server, messages):
    prompt = requests.post(server.url + "/apply-template", json={"messages": messages}).json()["prompt"]
    ids = requests.post(server.url + "/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"]
    return len(ids)


def test_models_lists_the_loaded_model(client):
    models = client.models.list()
    assert len(models.data) == 1
    assert models.data[0].id == "SmolLM2-135M-Instruct.Q4_1"
    assert models.data[0].object == "model"


def test_chat_plain_with_usage_equal_to_our_tokenizer(server, client):
    r = client.chat.completions.create(model="any", messages=HELLO, max_tokens=12, temperature=0)
    choice = r.choices[0]
    assert r.object == "chat.completion"
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens == prompt_token_count(server, HELLO)
    assert 0 < r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    if choice.finish_reason == "length":
        assert r.usage.completion_tokens == 12


def test_chat_stream_follows_the_delta_rules(server, client):
    stream = client.chat.completions.create(model="any", messages=HELLO, max_tokens=8, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content is None  # role first, content null (llama-server)
    content_chunks = chunks[1:-2]
    assert content_chunks, "no content deltas"
    for c in content_chunks:
        assert c.object == "chat.completion.chunk"
        assert c.choices[0].delta.role is None
        assert c.choices[0].finish_reason is None
        assert c.usage is None
    finish = chunks[-2]
    assert finish.choices[0].finish_reason in ("stop", "length")
    assert finish.choices[0].delta.content is None
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage.completion_tokens <= 8
    assert usage_chunk.usage.prompt_tokens == prompt_token_count(server, HELLO)
    assert len({c.id for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    plain = client.chat.completions.create(model="any", messages=HELLO, max_tokens=8, temperature=0)
    assert text == plain.choices[0].message.content


def test_raw_stream_ends_with_done(server):
    r = chat(server, {"messages": HELLO, "max_tokens": 3, "stream": True}, stream=True)
    assert r.headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    assert all(json.loads(e)["object"] == "chat.completion.chunk" for e in events[:-1])
    # Without include_usage there is no usage chunk and no usage key.
    assert all("usage" not in json.loads(e) for e in events[:-1])


def test_finish_reason_length(client):
    r = client.chat.completions.create(model="any", max_completion_tokens=3, temperature=0,
                                       messages=[{"role": "user", "content": "Write a long story about a dragon."}])
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3


def test_stop_string_cuts_the_output(client):
    msgs = [{"role": "user", "content": "Count from one to ten in words, separated by commas."}]
    full = client.chat.completions.create(model="any", messages=msgs, max_tokens=16, temperature=0)
    text = full.choices[0].message.content
    assert len(text) > 6
    stop = text[len(text) // 2: len(text) // 2 + 3]
    expected = text[: text.index(stop)]
    cut = client.chat.completions.create(model="any", messages=msgs, max_tokens=16, temperature=0, stop=[stop])
    assert cut.choices[0].message.content == expected
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(model="any", messages=msgs, max_tokens=16, temperature=0,
                                              stop=stop, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == expected


def test_seed_reproducibility(client):
    def sample(seed):
        return client.chat.completions.create(model="any", messages=HELLO, max_tokens=8, temperature=1.2,
                                              top_p=1.0, seed=seed).choices[0].message.content
    first = sample(1234)
    assert sample(1234) == first
    assert sample(99) != first, "a different seed gave the same text"


def test_chat_logprobs_shape(client):
    r = client.chat.completions.create(model="any", messages=HELLO, max_tokens=4, temperature=0,
                                       logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob >= entry.top_logprobs[2].logprob
        # Greedy: the chosen token is the most likely one.
        assert entry.token == entry.top_logprobs[0].token
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token


def test_completions_text_list_and_token_ids(server, client):
    r = client.completions.create(model="any", prompt="The capital of France is", max_tokens=4, temperature=0)
    assert r.object == "text_completion"
    text = r.choices[0].text
    assert text
    ids = requests.post(server.url + "/tokenize", json={"content": "The capital of France is"}).json()["tokens"]
    by_ids = client.completions.create(model="any", prompt=ids, max_tokens=4, temperature=0)
    assert by_ids.choices[0].text == text
    assert r.usage.prompt_tokens == len(ids)
    two = client.completions.create(model="any", prompt=["The capital of France is", "One, two,"],
                                    max_tokens=4, temperature=0)
    assert [c.index for c in two.choices] == [0, 1]
    assert two.choices[0].text == text


def test_completions_echo_and_logprobs(client):
    prompt = "Roses are red,"
    r = client.completions.create(model="any", prompt=prompt, max_tokens=3, temperature=0, echo=True, logprobs=2)
    choice = r.choices[0]
    assert choice.text.startswith(prompt)
    lp = choice.logprobs
    # Echoed: the prompt's tokens come first (the first without a log-probability).
    n = r.usage.prompt_tokens + 3
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x <= 0 for x in lp.token_logprobs[1:])
    assert all(len(t) <= 2 for t in lp.top_logprobs[1:])
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(n)]
    assert lp.text_offset[r.usage.prompt_tokens] == len(prompt)


def test_completions_stream(client):
    stream = client.completions.create(model="any", prompt="Once upon a time", max_tokens=5, temperature=0,
                                       stream=True)
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    text = "".join(c.choices[0].text for c in chunks)
    plain = client.completions.create(model="any", prompt="Once upon a time", max_tokens=5, temperature=0)
    assert text == plain.choices[0].text


def test_chat_n_choices_each_seeded_apart(server, client):
    kw = dict(model="any", messages=HELLO, max_tokens=8, temperature=1.3, top_p=1.0, seed=77)
    r = client.chat.completions.create(n=3, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.message.content for c in r.choices]
    assert len(set(texts)) > 1, "three sampled choices were all the same"
    # Choice j draws with seed + j: choice 0 is the n = 1 answer with the same seed.
    assert texts[0] == client.chat.completions.create(**kw).choices[0].message.content
    assert texts[1] == client.chat.completions.create(**{**kw, "seed": 78}).choices[0].message.content
    # The prompt is counted once; the completions of every choice add up.
    assert r.usage.prompt_tokens == prompt_token_count(server, HELLO)
    assert r.usage.completion_tokens >= sum(1 for t in texts if t)
    assert r.usage.completion_tokens <= 3 * 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_n_choices_compute_a_long_prompt_once(server, client):
    system = "You answer questions about a list. " + " ".join(
        f"Item {i} is a {c} box of {i * 3} marbles." for i, c in enumerate(["red", "blue", "green"] * 6))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Which item is largest?"}]
    n_tokens = prompt_token_count(server, messages)
    assert n_tokens > 100
    before = server.metrics()["hablar_prompt_tokens_cached_total"]
    r = client.chat.completions.create(model="any", messages=messages, n=3, max_tokens=4, temperature=0)
    assert len(r.choices) == 3 and r.choices[0].message.content == r.choices[2].message.content
    cached = server.metrics()["hablar_prompt_tokens_cached_total"] - before
    # Choices 1 and 2 take every full block of the prompt from the cache.
    assert cached >= 2 * (n_tokens - 16), (cached, n_tokens)


def test_chat_n_choices_stream_by_index(server, client):
    kw = dict(model="any", messages=HELLO, max_tokens=6, temperature=0)
    stream = client.chat.completions.create(n=2, stream=True, stream_options={"include_usage": True}, **kw)
    texts, finishes, roles = {}, {}, {}
    usage = None
    for c in stream:
        if not c.choices:
            usage = c.usage
            continue
        ch = c.choices[0]
        texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
        if ch.delta.role:
            roles[ch.index] = ch.delta.role
        if ch.finish_reason:
            finishes[ch.index] = ch.finish_reason
    assert sorted(texts) == [0, 1] and roles == {0: "assistant", 1: "assistant"}
    assert set(finishes) == {0, 1}
    plain = client.chat.completions.create(**kw).choices[0].message.content
    assert texts[0] == texts[1] == plain  # greedy: every choice the same
    assert usage.prompt_tokens == prompt_token_count(server, HELLO)


def test_completions_n_per_prompt(client):
    prompts = ["Roses are red,", "The capital of France is"]
    r = client.completions.create(model="any", prompt=prompts, n=2, max_tokens=3, temperature=0, echo=True)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text.startswith(prompts[0]) and r.choices[1].text.startswith(prompts[0])
    assert r.choices[2].text.startswith(prompts[1]) and r.choices[3].text.startswith(prompts[1])
    assert r.choices[0].text == r.choices[1].text
    single = client.completions.create(model="any", prompt=prompts[1], max_tokens=3, temperature=0)
    assert r.choices[2].text == prompts[1] + single.choices[0].text
    streamed = client.completions.create(model="any", prompt=prompts, n=2, max_tokens=3, temperature=0,
                                         stream=True)
    got = {}
    for c in streamed:
        for ch in c.choices:
            got[ch.index] = got.get(ch.index, "") + ch.text
    assert got == {i: r.choices[i].text[len(prompts[i // 2]):] for i in range(4)}


def test_n_out_of_range_is_a_clear_400(server):
    for n in (0, 65, "2"):
        r = chat(server, {"messages": HELLO, "n": n})
        assert r.status_code == 400, n
        assert "'n'" in r.json()["error"]["message"]
    r = requests.post(server.url + "/v1/completions", json={"prompt": ["a"] * 9, "n": 8})
    assert r.status_code == 400
    assert "'n'" in r.json()["error"]["message"]
    r = requests.post(server.url + "/v1/completions", json={"prompt": "a", "n": 2, "best_of": 3})
    assert r.status_code == 400
    assert "best_of" in r.json()["error"]["message"]


def test_penalties_bias_and_user_are_accepted(client):
    r = client.chat.completions.create(model="any", messages=HELLO, max_tokens=4, temperature=0,
                                       frequency_penalty=0.5, presence_penalty=0.5, user="tester",
                                       logit_bias={"0": -100})
    assert r.choices[0].message.content is not None


def test_logit_bias_changes_the_choice(client):
    base = client.chat.completions.create(model="any", messages=HELLO, max_tokens=1, temperature=0,
                                          logprobs=True, top_logprobs=2)
    first = base.choices[0].logprobs.content[0]
    banned = client.chat.completions.create(model="any", messages=HELLO, max_tokens=1, temperature=0,
                                            logprobs=True, top_logprobs=2,
                                            logit_bias=_bias_against(client, first.token))
    assert banned.choices[0].logprobs.content[0].token != first.token


def _bias_against(client, token_text):
    import requests as rq
    base = str(client.base_url).rstrip("/").removesuffix("/v1")
    ids = rq.post(base + "/tokenize", json={"content": token_text, "parse_special": False}).json()["tokens"]
    assert len(ids) == 1
    return {str(ids[0]): -100}


def _ids(server, text):
    return requests.post(server.url + "/tokenize", json={"content": text, "add_special": False}).json()["tokens"]


def test_completions_echo_gives_prompt_logprobs_equal_to_next_token_ones(server, client):
    ids = _ids(server, "The capital of France is Paris, and the capital of Spain is")
    r = client.completions.create(model="any", prompt=ids, max_tokens=0, echo=True, logprobs=3)
    lp = r.choices[0].logprobs
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)
    assert len(lp.tokens) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
    assert all(len(t) == 3 for t in lp.top_logprobs[1:])
    # Each prompt token's log-probability is the one the model gives it as the next token
    # after the tokens before it (a prefix request's top log-probabilities).
    # The CPU computes a position's logits to the same bits in any batch; the GPU's default
    # mode multiplies a prompt's rows on bf16 tensor cores, within 2e-2 of a lone row's.
    device = requests.get(server.url + "/props").json().get("device")
    tol = 1e-3 if device == "cpu" else 2e-2
    checked = 0
    for i in range(1, len(ids)):
        nxt = client.completions.create(model="any", prompt=ids[:i], max_tokens=1, temperature=0, logprobs=20)
        top = nxt.choices[0].logprobs.top_logprobs[0]
        if lp.tokens[i] in top:
            assert abs(top[lp.tokens[i]] - lp.token_logprobs[i]) < tol, (i, lp.tokens[i])
            checked += 1
    assert checked >= len(ids) // 2
    # Streamed: the echo chunk carries the same log-probabilities.
    chunks = list(client.completions.create(model="any", prompt=ids, max_tokens=2, echo=True, logprobs=3,
                                            temperature=0, stream=True))
    first = chunks[0].choices[0]
    assert first.logprobs.token_logprobs == lp.token_logprobs
    assert first.logprobs.tokens == lp.tokens


def test_max_tokens_zero_needs_echo(server):
    r = requests.post(server.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 0})
    assert r.status_code == 400
    assert "echo" in r.json()["error"]["message"]
    r = requests.post(server.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 0, "echo": True})
    assert r.status_code == 200
    assert r.json()["choices"][0]["text"] == "Hello"
    assert r.json()["usage"]["completion_tokens"] == 0


def test_required_tool_choice_without_a_template_format_uses_generic_json(server):
    # The default model's template has no tool format: the generic JSON format stands in.
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}]
    r = chat(server, {"messages": HELLO, "tools": tools, "tool_choice": "required",
                      "max_tokens": 60, "temperature": 1.0, "seed": 2})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"] == "f" and isinstance(json.loads(call["arguments"])["x"], int)
