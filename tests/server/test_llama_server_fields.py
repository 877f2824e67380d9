"""llama-server's request and reply fields beyond the basics, as its own test suite and
clients use them: prompt objects and mixed lists in /completion, generation_settings and
response_fields in the reply, __verbose, continue_final_message, the input_tokens count, the
llamacpp:* metric names, and its command-line flags."""
import json
import subprocess

import requests

from conftest import BIN, TESTDATA, ServerProcess, chat, sse_events


def completion(server, body):
    return requests.post(server.url + "/completion", json=body, timeout=300)


def test_prompt_objects_and_mixed_lists(server):
    text = "The capital of France is"
    ids = requests.post(server.url + "/tokenize", json={"content": text}).json()["tokens"]
    want = completion(server, {"prompt": text, "n_predict": 4, "temperature": 0}).json()["content"]
    for prompt in [ids, {"prompt_string": text}, {"prompt_string": text, "multimodal_data": []}]:
        r = completion(server, {"prompt": prompt, "n_predict": 4, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["content"] == want
    r = completion(server, {"prompt": [ids, text, {"prompt_string": text}], "n_predict": 4,
                            "temperature": 0})
    assert [x["content"] for x in r.json()] == [want] * 3
    r = completion(server, {"prompt": {"prompt_string": text, "multimodal_data": ["iVBORw0"]}})
    assert r.status_code == 400 and "multimodal" in r.json()["error"]["message"]


def test_generation_settings_and_response_fields(server):
    r = completion(server, {"prompt": "Hello", "n_predict": 3, "temperature": 0.5,
                            "ignore_eos": True, "logit_bias": [[42, -2.0]]}).json()
    g = r["generation_settings"]
    assert g["n_predict"] == 3 and g["temperature"] == 0.5 and g["ignore_eos"] is True
    assert {"token": 42, "bias": -2.0} in g["logit_bias"]
    banned = [b["token"] for b in g["logit_bias"] if b["bias"] is None]
    assert 2 in banned  # <|im_end|>, an end-of-generation token of the model
    assert r["prompt"] == "Hello"
    plain = completion(server, {"prompt": "Hello", "n_predict": 1}).json()["generation_settings"]
    assert plain["logit_bias"] == []
    r = completion(server, {"prompt": "Hello", "n_predict": 5,
                            "response_fields": ["content", "generation_settings/n_predict",
                                                "timings/predicted_n", "no/such"]}).json()
    assert set(r) == {"content", "generation_settings/n_predict", "timings/predicted_n"}
    assert r["generation_settings/n_predict"] == 5


def test_verbose_reply_shows_the_prompt_as_read(server):
    body = {"max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
    assert "__verbose" not in chat(server, body).json()
    v = chat(server, {**body, "verbose": True}).json()["__verbose"]
    assert v["prompt"].endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert v["tokens_evaluated"] > 3


def test_continue_final_message_and_its_conflicts(server):
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]
    v = chat(server, {"max_tokens": 1, "verbose": True, "continue_final_message": True,
                      "add_generation_prompt": False, "messages": msgs}).json()["__verbose"]
    assert v["prompt"].endswith("<|im_start|>assistant\nHel")
    closed = chat(server, {"max_tokens": 1, "verbose": True, "add_generation_prompt": True,
                           "messages": msgs}).json()["__verbose"]
    assert closed["prompt"].endswith("Hel<|im_end|>\n<|im_start|>assistant\n")
    no_gen = chat(server, {"max_tokens": 1, "verbose": True, "add_generation_prompt": False,
                           "messages": msgs[:1]}).json()["__verbose"]
    assert no_gen["prompt"].endswith("Hi<|im_end|>\n")
    parts = chat(server, {"max_tokens": 1, "verbose": True, "messages": [
        msgs[0], {"role": "assistant", "content": [{"type": "text", "text": "A"},
                                                   {"type": "text", "text": "B"}]}]})
    assert parts.json()["__verbose"]["prompt"].endswith("assistant\nA\n\nB")
    for bad in [{"add_generation_prompt": True, "continue_final_message": True, "messages": msgs},
                {"continue_final_message": True, "messages": msgs[:1]},
                {"messages": msgs + [{"role": "assistant", "content": "x"}]}]:
        r = chat(server, {"max_tokens": 1, **bad})
        assert r.status_code == 400, (bad, r.text)


def test_chat_input_tokens_counts_the_rendered_prompt(server):
    body = {"messages": [{"role": "user", "content": "What is the best book?"}]}
    v = chat(server, {**body, "max_tokens": 1, "verbose": True}).json()
    for path in ["/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"]:
        r = requests.post(server.url + path, json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["input_tokens"] == v["usage"]["prompt_tokens"]


def test_llamacpp_metric_names(server):
    completion(server, {"prompt": "Hello", "n_predict": 2})
    text = requests.get(server.url + "/metrics").text
    for name, kind in [("llamacpp:prompt_tokens_cached_total", "counter"),
                       ("llamacpp:n_tokens_max", "counter"),
                       ("llamacpp:spec_decode_num_draft_tokens_total", "counter"),
                       ("llamacpp:spec_decode_num_accepted_tokens_total", "counter"),
                       ("llamacpp:spec_decode_num_drafts_total", "counter"),
                       ("llamacpp:n_busy_slots_per_decode", "gauge")]:
        assert f"# TYPE {name} {kind}" in text
        assert f"# HELP {name} " in text
    t = completion(server, {"prompt": "Hello", "n_predict": 1}).json()["timings"]
    assert t["predicted_per_token_ms"] == 0 and t["predicted_per_second"] == 0


def test_llama_server_command_lines_start():
    """Flags llama-server scripts pass (its own test suite among them) are accepted."""
    s = ServerProcess("-np", "1", "-c", "512", "--no-jinja", "--offline", "--kv-unified", "-kvu",
                      "--swa-full", "--no-ui", "-ub", "32", "--cache-ram", "0",
                      "--no-context-shift", "--reasoning", "off", "--verbose").wait_ready()
    try:
        assert requests.get(s.url + "/").status_code == 404  # --no-ui
        r = chat(s, {"max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}).json()
        assert "__verbose" in r  # --verbose
    finally:
        s.stop()
    named = ServerProcess("-np", "1", "--alias", "smol,chat-small", "--tags", "chat,small").wait_ready()
    try:
        entry = requests.get(named.url + "/v1/models").json()["data"][0]
        assert entry["id"] == "smol" and entry["aliases"] == ["smol", "chat-small"]
        assert entry["tags"] == ["chat", "small"]
        # llama-server's second list, as its web UI and Ollama-style clients read it
        for path in ("/v1/models", "/models"):
            listed = requests.get(named.url + path).json()["models"]
            assert [m["name"] for m in listed] == ["smol"] and listed[0]["model"] == "smol"
            assert "completion" in listed[0]["capabilities"]
            assert "embedding" not in listed[0]["capabilities"]  # no --embedding
            assert listed[0]["tags"] == ["chat", "small"]
        assert requests.get(named.url + "/v1/models/chat-small").status_code == 200
        assert requests.get(named.url + "/v1/models/other").status_code == 404
    finally:
        named.stop()
    bad = subprocess.run([BIN, "serve", "--port", "0", "--reasoning", "sometimes"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--reasoning must be on, off or auto" in bad.stderr


def test_timings_per_token_in_streams(server):
    """timings_per_token: every chunk after the first token carries the timings so far
    (growing counts, and predicted_n never past the tokens sent); progress chunks carry the
    prompt's; the usage chunk and the last chunk carry the final ones."""
    r = requests.post(server.url + "/v1/chat/completions", stream=True, timeout=300, json={
        "messages": [{"role": "user", "content": "Count to twenty"}], "max_tokens": 6, "stream": True,
        "stream_options": {"include_usage": True}, "timings_per_token": True, "return_progress": True})
    chunks = [json.loads(e) for e in sse_events(r) if e != "[DONE]"]
    role = next(c for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"])
    assert "timings" not in role
    progress = [c for c in chunks if "prompt_progress" in c]
    assert progress and all("timings" in c for c in progress)
    assert progress[0]["timings"]["prompt_n"] == 0 and progress[0]["timings"]["prompt_ms"] == 0
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    seen = [c["timings"]["predicted_n"] for c in content]
    assert seen == sorted(seen) and seen[-1] <= 6 and all(n >= 1 for n in seen)
    usage = chunks[-1]
    assert not usage["choices"] and usage["timings"]["predicted_n"] == usage["usage"]["completion_tokens"]
    # /completion: each token chunk carries them too.
    r = requests.post(server.url + "/completion", stream=True, timeout=300, json={
        "prompt": "Once upon a time", "n_predict": 4, "stream": True, "timings_per_token": True})
    chunks = [json.loads(e) for e in sse_events(r)]
    assert [c["timings"]["predicted_n"] for c in chunks[:-1]] == list(range(1, len(chunks)))
    assert chunks[-1]["timings"]["predicted_n"] == len(chunks) - 1
    plain = requests.post(server.url + "/completion", stream=True, timeout=300, json={
        "prompt": "Once upon a time", "n_predict": 2, "stream": True})
    assert all("timings" not in json.loads(e) for e in list(sse_events(plain))[:-1])


def test_truncated_says_the_context_filled():
    """A generation cut by a full context (not by n_predict) is "truncated", as llama-server
    reports it; a prompt that does not fit is refused in llama-server's words."""
    s = ServerProcess("-np", "1", "-c", "128").wait_ready()
    try:
        full = completion(s, {"prompt": "Hi how are you", "n_predict": -1, "ignore_eos": True}).json()
        assert full["truncated"] is True and full["stop_type"] == "limit"
        assert full["tokens_predicted"] + full["tokens_evaluated"] == 128
        # (EOS ignored: a sampled end of text inside 4 tokens would end it early.)
        short = completion(s, {"prompt": "Hi how are you", "n_predict": 4, "ignore_eos": True}).json()
        assert short["truncated"] is False and short["tokens_predicted"] == 4
        long = completion(s, {"prompt": "word " * 300, "n_predict": 4})
        assert long.status_code == 400
        assert "exceeds the available context size" in long.json()["error"]["message"]
    finally:
        s.stop()


def test_context_shift_keeps_generating_past_a_full_context():
    """With --context-shift a request that fills the context goes on (llama-server's flag):
    n_predict tokens come back, "truncated" says the context shifted, the counts include
    every token, and each route takes its keep field (n_keep; Ollama's num_keep)."""
    s = ServerProcess("-np", "1", "-c", "128", "--context-shift", "--keep", "2",
                      "--metrics").wait_ready()
    try:
        r = completion(s, {"prompt": "Hi how are you", "n_predict": 200, "ignore_eos": True,
                           "temperature": 0})
        body = r.json()
        assert r.status_code == 200, body
        assert body["tokens_predicted"] == 200 and body["truncated"] is True
        assert body["generation_settings"]["n_keep"] == 2
        assert body["timings"]["predicted_n"] == 200
        kept = completion(s, {"prompt": "Hi how are you", "n_predict": 150, "ignore_eos": True,
                              "n_keep": -1, "n_discard": 8}).json()
        assert kept["tokens_predicted"] == 150 and kept["truncated"] is True
        chat = requests.post(s.url + "/v1/chat/completions", timeout=300, json={
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 160, "ignore_eos": True, "n_keep": 4}).json()
        assert chat["usage"]["completion_tokens"] == 160
        assert chat["choices"][0]["finish_reason"] == "length"
        ollama = requests.post(s.url + "/api/generate", timeout=300, json={
            "model": "x", "prompt": "Count:", "stream": False,
            "options": {"num_predict": 140, "num_keep": 1, "temperature": 0}}).json()
        assert ollama["eval_count"] <= 140 and ollama["done"] is True
        huge = completion(s, {"prompt": "Hi there", "n_predict": 140, "ignore_eos": True,
                              "n_keep": 2147483647, "n_discard": 2147483647}).json()
        assert huge["tokens_predicted"] == 140 and huge["truncated"] is True
        bad = completion(s, {"prompt": "Hi", "n_keep": -5})
        assert bad.status_code == 400 and "n_keep" in bad.text
        assert s.metrics()["hablar_context_shifts_total"] >= 3
        # Without the flag the same request stops at the context (test above); with it the
        # shift never touches the limit of a request that fits (EOS ignored, as above).
        short = completion(s, {"prompt": "Hi how are you", "n_predict": 4, "ignore_eos": True}).json()
        assert short["truncated"] is False and short["tokens_predicted"] == 4
    finally:
        s.stop()


def test_system_message_folded_for_templates_without_one():
    """Gemma 2's template refuses a system message (raise_exception): as llama-server does,
    its text goes in front of the first user turn; "developer" counts as "system"."""
    template = TESTDATA / "chat-templates" / "google-gemma-2-2b-it.jinja"
    s = ServerProcess("--chat-template-file", str(template), "-t", "2").wait_ready()
    try:
        for role in ("system", "developer"):
            r = chat(s, {"max_tokens": 1, "verbose": True, "messages": [
                {"role": role, "content": "Talk like a pirate."},
                {"role": "user", "content": "Hi"}]})
            assert r.status_code == 200, r.text
            prompt = r.json()["__verbose"]["prompt"]
            assert "<start_of_turn>user\nTalk like a pirate.\nHi<end_of_turn>" in prompt, prompt
        # A template that renders system messages keeps them as they are.
        r = chat(s, {"max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 200
    finally:
        s.stop()
    plain = ServerProcess("-t", "2").wait_ready()
    try:
        v = chat(plain, {"max_tokens": 1, "verbose": True, "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "Hi"}]}).json()["__verbose"]["prompt"]
        assert "<|im_start|>system\nBe brief.<|im_end|>" in v, v
    finally:
        plain.stop()


def test_top_n_sigma_and_xtc_samplers(server):
    """llama-server's top_n_sigma and XTC: taken on the llama and OpenAI routes, echoed in
    generation_settings, bad values refused; a tiny sigma leaves only the best token, so the
    draw equals greedy decoding whatever the seed."""
    greedy = completion(server, {"prompt": "The capital of France is", "n_predict": 6,
                                 "temperature": 0}).json()["content"]
    for seed in (1, 2, 3):
        r = completion(server, {"prompt": "The capital of France is", "n_predict": 6, "seed": seed,
                                "temperature": 1.5, "top_k": 0, "top_p": 1, "min_p": 0,
                                "top_n_sigma": 1e-6}).json()
        assert r["content"] == greedy
        assert abs(r["generation_settings"]["top_n_sigma"] - 1e-6) < 1e-9
    r = completion(server, {"prompt": "Hello", "n_predict": 4, "xtc_probability": 1,
                            "xtc_threshold": 0.05}).json()
    assert r["generation_settings"]["xtc_probability"] == 1
    assert abs(r["generation_settings"]["xtc_threshold"] - 0.05) < 1e-6
    ok = chat(server, {"max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}],
                       "xtc_probability": 0.5, "top_n_sigma": 2})
    assert ok.status_code == 200, ok.text
    for bad in [{"xtc_probability": 1.5}, {"xtc_threshold": -1}, {"top_n_sigma": "x"}]:
        r = completion(server, {"prompt": "Hi", "n_predict": 1, **bad})
        assert r.status_code == 400, (bad, r.text)


def test_dry_repetition_penalty(server):
    """DRY: a token that would extend an earlier sequence loses logit (greedy decoding too);
    the fields are echoed, a zero window turns it off, malformed breakers are refused."""
    prompt = "one two three four one two three four one two three four one two three"
    base = {"prompt": prompt, "n_predict": 1, "temperature": 0}
    plain = completion(server, base).json()
    assert plain["content"].strip() == "four"
    dry = completion(server, {**base, "dry_multiplier": 100, "dry_allowed_length": 2}).json()
    assert dry["content"].strip() != "four"
    g = dry["generation_settings"]
    assert g["dry_multiplier"] == 100 and g["dry_allowed_length"] == 2 and g["dry_base"] == 1.75
    off = completion(server, {**base, "dry_multiplier": 100, "dry_penalty_last_n": 0}).json()
    assert off["content"] == plain["content"]
    # With "three" as a breaker the match of the end stops at it: the repeat that " four"
    # would extend is too short to punish.
    broken = completion(server, {**base, "dry_multiplier": 100, "dry_allowed_length": 2,
                                 "dry_sequence_breakers": ["three"]}).json()
    assert broken["content"] == plain["content"]
    for bad in [{"dry_sequence_breakers": []}, {"dry_sequence_breakers": [1]},
                {"dry_multiplier": -1}, {"dry_penalty_last_n": -2}]:
        r = completion(server, {**base, **bad})
        assert r.status_code == 400, (bad, r.text)


def test_mirostat(server):
    """Mirostat 1 and 2 on the llama route and in Ollama's options; echoed; bad values refused."""
    for version in (1, 2):
        r = completion(server, {"prompt": "Once upon a time", "n_predict": 8, "mirostat": version,
                                "mirostat_tau": 3.0, "mirostat_eta": 0.2, "seed": 5})
        assert r.status_code == 200, r.text
        g = r.json()["generation_settings"]
        assert g["mirostat"] == version and g["mirostat_tau"] == 3.0
        assert r.json()["tokens_predicted"] >= 1
    o = requests.post(server.url + "/api/generate", timeout=300, json={
        "model": "x", "prompt": "Hi", "stream": False,
        "options": {"num_predict": 4, "mirostat": 2, "mirostat_tau": 4.0}})
    assert o.status_code == 200, o.text
    assert completion(server, {"prompt": "Hi", "n_predict": 1, "mirostat": 3}).status_code == 400
