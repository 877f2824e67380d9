"""llama.cpp-server and Ollama compatible routes."""
import json

import requests


def test_llama_completion_with_timings_and_probs(server):
    r = requests.post(server.url + "/completion", json={
        "prompt": "The capital of France is", "n_predict": 4, "temperature": 0, "top_k": 40,
        "min_p": 0.05, "repeat_penalty": 1.1, "n_probs": 2, "cache_prompt": True, "return_tokens": True})
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["stop"] is True
    assert j["tokens_predicted"] == len(j["tokens"]) <= 4
    assert j["stop_type"] in ("limit", "eos", "word")
    assert len(j["completion_probabilities"]) == j["tokens_predicted"]
    assert len(j["completion_probabilities"][0]["top_logprobs"]) == 2
    t = j["timings"]
    for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second"):
        assert k in t
    assert t["predicted_n"] == j["tokens_predicted"]


def test_llama_completion_stream(server):
    r = requests.post(server.url + "/completion", json={"prompt": "Hello", "n_predict": 3, "stream": True},
                      stream=True)
    events = [json.loads(l[6:]) for l in r.iter_lines(decode_unicode=True) if l.startswith("data: ")]
    assert events[-1]["stop"] is True and "timings" in events[-1]
    assert all(e["stop"] is False for e in events[:-1])


def test_tokenize_detokenize_round_trip(server):
    text = "Hello world, ça va? 你好"
    ids = requests.post(server.url + "/tokenize", json={"content": text}).json()["tokens"]
    assert all(isinstance(i, int) for i in ids)
    back = requests.post(server.url + "/detokenize", json={"tokens": ids}).json()["content"]
    assert back == text
    pieces = requests.post(server.url + "/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == ids
    assert "piece" in pieces[0]
    special = requests.post(server.url + "/tokenize", json={"content": "<|im_start|>", "add_special": True}).json()
    assert len(special["tokens"]) == 1


def test_apply_template(server):
    r = requests.post(server.url + "/apply-template", json={"messages": [{"role": "user", "content": "Hi there"}]})
    prompt = r.json()["prompt"]
    assert "Hi there" in prompt and prompt.endswith("<|im_start|>assistant\n")


def test_health_props_slots(server):
    assert requests.get(server.url + "/health").json() == {"status": "ok"}
    props = requests.get(server.url + "/props").json()
    assert props["total_slots"] == 8
    assert props["default_generation_settings"]["n_ctx"] == 4096
    assert "im_start" in props["chat_template"]
    slots = requests.get(server.url + "/slots").json()
    assert len(slots) >= 8


def test_metrics_prometheus_text(server):
    text = requests.get(server.url + "/metrics").text
    for name in ("hablar_prompt_tokens_total", "hablar_generated_tokens_total",
                 "hablar_requests_running", "hablar_requests_waiting", "hablar_kv_cache_usage_ratio",
                 "hablar_batch_size_bucket", "hablar_time_to_first_token_seconds_bucket",
                 "hablar_time_per_output_token_seconds_bucket", "hablar_generated_tokens_per_second"):
        assert name in text
    assert "# TYPE hablar_generated_tokens_total counter" in text


def test_ollama_chat_ndjson(server):
    r = requests.post(server.url + "/api/chat", json={
        "model": "x", "messages": [{"role": "user", "content": "Hi"}], "options": {"num_predict": 3,
                                                                                 "temperature": 0}},
                      stream=True)
    assert r.headers["Content-Type"].startswith("application/x-ndjson")
    lines = [json.loads(l) for l in r.iter_lines() if l]
    assert lines[-1]["done"] is True and lines[-1]["eval_count"] <= 3
    assert all(l["done"] is False and l["message"]["role"] == "assistant" for l in lines[:-1])
    text = "".join(l["message"]["content"] for l in lines)
    plain = requests.post(server.url + "/api/chat", json={
        "messages": [{"role": "user", "content": "Hi"}], "stream": False,
        "options": {"num_predict": 3, "temperature": 0}}).json()
    assert plain["message"]["content"] == text


def test_ollama_generate_tags_show_version(server):
    r = requests.post(server.url + "/api/generate", json={"prompt": "Hi", "stream": False,
                                                         "options": {"num_predict": 2}}).json()
    assert r["done"] is True and isinstance(r["response"], str)
    tags = requests.get(server.url + "/api/tags").json()
    assert tags["models"][0]["name"] == "SmolLM2-135M-Instruct.Q4_1"
    show = requests.post(server.url + "/api/show", json={"model": "SmolLM2-135M-Instruct.Q4_1"}).json()
    assert show["model_info"]["general.architecture"] == "llama"
    assert requests.get(server.url + "/api/version").json()["version"]


def test_ollama_generate_context_continues_a_conversation(server):
    """/api/generate's "context" (the official client's conversational memory): the final reply
    holds the prompt's ids and the generated ones, and a request that sends them back continues
    from there (its prompt: those ids, then the new turn without a second BOS)."""
    import ollama
    client = ollama.Client(host=server.url)
    model = "SmolLM2-135M-Instruct.Q4_1"
    opts = {"temperature": 0, "num_predict": 6}
    first = client.generate(model=model, prompt="Name a color.", options=opts)
    assert first.context and len(first.context) == first.prompt_eval_count + first.eval_count
    second = client.generate(model=model, prompt="Another one.", context=first.context, options=opts)
    assert second.context[:len(first.context)] == first.context
    n_prompt = second.prompt_eval_count
    assert n_prompt > len(first.context) and len(second.context) == n_prompt + second.eval_count
    # The same ids through llama-server's token-array prompt give the same greedy reply.
    same = requests.post(server.url + "/completion", json={
        "prompt": second.context[:n_prompt], "n_predict": 6, "temperature": 0}).json()
    assert same["content"] == second.response
    streamed = list(client.generate(model=model, prompt="Another one.", context=first.context,
                                    options=opts, stream=True))
    assert streamed[-1].done and streamed[-1].context == second.context
    assert "".join(part.response for part in streamed) == second.response
    raw = requests.post(server.url + "/api/generate", json={
        "prompt": "Hi", "raw": True, "stream": False, "options": {"num_predict": 2}}).json()
    assert "context" not in raw
    for bad in ("abc", [-1], [49152], [1.5]):
        r = requests.post(server.url + "/api/generate", json={"prompt": "Hi", "context": bad,
                                                             "stream": False})
        assert r.status_code == 400 and "context" in r.json()["error"], bad


def test_v1_health_and_lora_adapters(server):
    """llama-server's /v1/health, and its LoRA routes answered truthfully: no adapters are
    loaded, so the list is empty and naming an adapter (route or request) is a 400."""
    assert requests.get(server.url + "/v1/health").json() == {"status": "ok"}
    assert requests.get(server.url + "/lora-adapters").json() == []
    assert requests.post(server.url + "/lora-adapters", json=[]).json() == {"success": True}
    bad = requests.post(server.url + "/lora-adapters", json=[{"id": 0, "scale": 0.5}])
    assert bad.status_code == 400 and "no LoRA adapter 0" in bad.json()["error"]["message"]
    assert requests.post(server.url + "/lora-adapters", json={"id": 0}).status_code == 400
    ok = requests.post(server.url + "/completion", json={"prompt": "Hi", "n_predict": 1, "lora": []})
    assert ok.status_code == 200
    refused = requests.post(server.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "lora": [{"id": 0, "scale": 1}]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "lora"
