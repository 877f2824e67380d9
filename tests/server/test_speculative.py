"""Speculative decoding through the server: greedy outputs (text and log-probabilities) equal
plain decoding for prompt lookup (ngram), a draft model and self-speculation, alone and in
concurrent batches with requests that opt out (speculative.n_max = 0), for n > 1 and under a
grammar; timings report draft_n / draft_n_accepted as llama-server does; /metrics counts per
drafter; bad per-request fields are 400s."""
import concurrent.futures as cf

import pytest
import requests

from conftest import DEFAULT_MODEL, ServerProcess

CODE = "\n".join(f"int f{i}(int x) {{ return x * {i} + {i % 7}; }}" for i in range(24))
PROMPTS = [
    CODE + "\n\n// The same functions again:\nint f0(int x) {",
    "A B C D E F G H I J K L M N O P. A B C D E F G H I J K L M N O P. A B C D",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Once upon a time, in a small village by the sea,",
]


@pytest.fixture(scope="module", params=["ngram", "draft", "self"])
def spec_server(request):
    args = ["--metrics", "-np", "4", "-c", "4096", "-t", "2", "--spec-type", request.param]
    if request.param == "draft":
        args += ["--model-draft", str(DEFAULT_MODEL), "--draft-max", "6"]
    s = ServerProcess(*args).wait_ready()
    s.kind = request.param
    yield s
    s.stop()


def complete(server, prompt, n_max=None, **extra):
    body = {"prompt": prompt, "n_predict": 40, "temperature": 0, "n_probs": 2, **extra}
    if n_max is not None:
        body["speculative.n_max"] = n_max
    r = requests.post(server.url + "/completion", json=body, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def probs(j):
    return [(p["id"], round(p["logprob"], 6)) for p in j["completion_probabilities"]]


def test_greedy_output_equals_plain_alone_and_batched(spec_server):
    plain = [complete(spec_server, p, n_max=0) for p in PROMPTS]
    for j in plain:
        assert "draft_n" not in j["timings"]
    alone = [complete(spec_server, p) for p in PROMPTS]
    for a, b in zip(alone, plain):
        assert a["content"] == b["content"]
        assert probs(a) == probs(b)
    # Concurrent: speculating and plain requests in the same steps.
    with cf.ThreadPoolExecutor(8) as pool:
        futs = [pool.submit(complete, spec_server, p, None if i % 2 else 0)
                for i, p in enumerate(PROMPTS * 2)]
        batched = [f.result() for f in futs]
    for i, j in enumerate(batched):
        assert j["content"] == plain[i % len(PROMPTS)]["content"], i
        assert probs(j) == probs(plain[i % len(PROMPTS)]), i
    drafted = sum(j["timings"].get("draft_n", 0) for j in alone)
    accepted = sum(j["timings"].get("draft_n_accepted", 0) for j in alone)
    print(f"\n{spec_server.kind}: {accepted}/{drafted} drafted tokens accepted")
    assert drafted > 0
    if spec_server.kind != "self":  # the code prompt repeats itself: drafts must land
        assert accepted > 0
    assert accepted <= drafted


def test_n_choices_and_grammar_match_plain(spec_server):
    body = {"messages": [{"role": "user", "content": "List three colors as JSON."}],
            "max_tokens": 30, "temperature": 0, "n": 2,
            "response_format": {"type": "json_object"}}
    url = spec_server.url + "/v1/chat/completions"
    spec = requests.post(url, json=body, timeout=600).json()
    plain = requests.post(url, json={**body, "speculative.n_max": 0}, timeout=600).json()
    assert [c["message"]["content"] for c in spec["choices"]] == \
        [c["message"]["content"] for c in plain["choices"]]
    assert spec["choices"][0]["message"]["content"] == spec["choices"][1]["message"]["content"]


def test_metrics_count_per_drafter(spec_server):
    complete(spec_server, PROMPTS[0])
    text = requests.get(spec_server.url + "/metrics", timeout=10).text
    label = f'{{drafter="{spec_server.kind}"}}'
    values = {}
    for line in text.splitlines():
        if line.startswith("hablar_spec_") and label in line:
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0]] = float(value)
    assert values["hablar_spec_draft_tokens_total"] > 0
    assert 0 <= values["hablar_spec_draft_accepted_total"] <= values["hablar_spec_draft_tokens_total"]
    assert values["hablar_spec_rounds_total"] > 0
    assert 0 <= values["hablar_spec_acceptance_ratio"] <= 1


@pytest.mark.parametrize("field,value", [("speculative.n_max", -1), ("speculative.n_max", 1000),
                                         ("speculative.p_min", 2), ("speculative.n_min", "x"),
                                         ("speculative", 5)])
def test_bad_speculative_fields_are_400(spec_server, field, value):
    r = requests.post(spec_server.url + "/completion",
                      json={"prompt": "hi", "n_predict": 2, field: value}, timeout=60)
    assert r.status_code == 400, r.text
    assert "speculative" in r.text
