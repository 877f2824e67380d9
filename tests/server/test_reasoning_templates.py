"""Reasoning control and chat templates as llama-server has them: --reasoning-format and a
request's reasoning_format, reasoning_content in replies and deltas (and Anthropic thinking
blocks) for templates that open the think block, chat_template_kwargs / enable_thinking and
--reasoning-budget 0, strftime_now giving today's date, --chat-template NAME, and a clear 400
naming a template variable a request lacks."""
import datetime
import json
import subprocess

import anthropic
import pytest
import requests

from conftest import BIN, TESTDATA, ServerProcess, sse_events

TEMPLATES = TESTDATA / "chat-templates"
ASK = [{"role": "user", "content": "What is 2+2?"}]


def start(*args):
    return ServerProcess(*args, "-t", "1").wait_ready()


@pytest.fixture(scope="module")
def r1():
    # DeepSeek-R1's template ends the prompt with "<think>\n": the reply starts as reasoning.
    s = start("--chat-template-file", str(TEMPLATES / "llama-cpp-deepseek-r1.jinja"))
    yield s
    s.stop()


def chat(server, **body):
    r = requests.post(server.url + "/v1/chat/completions", json={"messages": ASK, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


def test_reasoning_content_and_format_none(r1):
    assert requests.post(r1.url + "/apply-template", json={"messages": ASK}).json()["prompt"].endswith("<think>\n")
    parsed = chat(r1, max_tokens=8)
    raw = chat(r1, max_tokens=8, reasoning_format="none")
    assert parsed["reasoning_content"] and "reasoning_content" not in raw
    # Nothing is lost: the raw text holds the reasoning (and any answer after </think>).
    assert parsed["reasoning_content"] in raw["content"]
    assert parsed["content"] in raw["content"]
    r = requests.post(r1.url + "/v1/chat/completions", json={"messages": ASK, "reasoning_format": "brief"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_format"


def test_reasoning_deltas_and_anthropic_thinking(r1):
    whole = chat(r1, max_tokens=8)
    r = requests.post(r1.url + "/v1/chat/completions", stream=True, json={
        "messages": ASK, "temperature": 0, "max_tokens": 8, "stream": True})
    deltas = [json.loads(e)["choices"][0]["delta"] for e in sse_events(r) if e != "[DONE]" and '"choices":[{' in e]
    streamed = "".join(d.get("reasoning_content") or "" for d in deltas)
    assert streamed.strip() == whole["reasoning_content"]
    claude = anthropic.Anthropic(base_url=r1.url, api_key="x", max_retries=0)
    m = claude.messages.create(model="x", max_tokens=8, messages=ASK, extra_body={"temperature": 0})
    assert m.content[0].type == "thinking" and m.content[0].thinking == whole["reasoning_content"]
    with claude.messages.stream(model="x", max_tokens=8, messages=ASK, extra_body={"temperature": 0}) as s:
        kinds = [e.delta.type for e in s if e.type == "content_block_delta"]
        final = s.get_final_message()
    assert "thinking_delta" in kinds
    assert final.content[0].type == "thinking" and final.content[0].thinking.strip() == whole["reasoning_content"]


def test_ollama_think(r1):
    import ollama
    whole = chat(r1, max_tokens=8)
    c = ollama.Client(host=r1.url)
    opts = {"num_predict": 8, "temperature": 0}
    r = c.chat(model="x", messages=ASK, think=True, options=opts)
    assert r.message.thinking == whole["reasoning_content"]
    streamed = "".join(part.message.thinking or "" for part in c.chat(model="x", messages=ASK, think=True,
                                                                      options=opts, stream=True))
    assert streamed.strip() == whole["reasoning_content"]
    plain = c.chat(model="x", messages=ASK, options=opts)  # no think: the text as written
    assert not plain.message.thinking and whole["reasoning_content"] in plain.message.content


@pytest.fixture(scope="module")
def qwen3_no_thinking():
    s = start("--chat-template-file", str(TEMPLATES / "Qwen-Qwen3-0.6B.jinja"), "--reasoning-budget", "0")
    yield s
    s.stop()


def test_enable_thinking_and_reasoning_budget(qwen3_no_thinking):
    url = qwen3_no_thinking.url + "/apply-template"
    off = requests.post(url, json={"messages": ASK}).json()["prompt"]
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # --reasoning-budget 0
    on = requests.post(url, json={"messages": ASK, "chat_template_kwargs": {"enable_thinking": True}}).json()["prompt"]
    assert on.endswith("<|im_start|>assistant\n") and "<think>" not in on
    # The chat route renders the same prompt: one more token set with thinking off.
    def prompt_tokens(**extra):
        r = requests.post(qwen3_no_thinking.url + "/v1/chat/completions",
                          json={"messages": ASK, "max_tokens": 1, **extra})
        return r.json()["usage"]["prompt_tokens"]
    assert prompt_tokens() > prompt_tokens(chat_template_kwargs={"enable_thinking": True})
    r = requests.post(qwen3_no_thinking.url + "/v1/chat/completions",
                      json={"messages": ASK, "chat_template_kwargs": "yes"})
    assert r.status_code == 400 and "chat_template_kwargs" in r.json()["error"]["message"]
    # Ollama's think: true asks the template for thinking (no empty think block here).
    def ollama_prompt_tokens(**extra):
        r = requests.post(qwen3_no_thinking.url + "/api/chat", json={
            "messages": ASK, "stream": False, "options": {"num_predict": 1}, **extra})
        assert r.status_code == 200, r.text
        return r.json()["prompt_eval_count"]
    assert ollama_prompt_tokens(think=True) < ollama_prompt_tokens() == ollama_prompt_tokens(think=False)
    r = requests.post(qwen3_no_thinking.url + "/api/chat", json={
        "messages": ASK, "think": "sometimes?", "stream": False})
    assert r.status_code == 400 and "think" in r.json()["error"]


def test_strftime_now_and_date_string_are_today():
    # Llama 3.2 calls strftime_now; Llama 3.1 prints date_string (a fixed date when not
    # given): both show today's date, as llama-server renders them.
    today = "Today Date: " + datetime.datetime.now().strftime("%d %b %Y")
    for name in ("meta-llama-Llama-3.2-3B-Instruct.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja"):
        s = start("--chat-template-file", str(TEMPLATES / name))
        try:
            prompt = requests.post(s.url + "/apply-template", json={"messages": ASK}).json()["prompt"]
            given = requests.post(s.url + "/apply-template", json={
                "messages": ASK, "chat_template_kwargs": {"date_string": "01 Jan 2000"}}).json()["prompt"]
        finally:
            s.stop()
        assert today in prompt, name
        assert "26 Jul 2024" not in prompt
        if "3.1" in name:
            assert "Today Date: 01 Jan 2000" in given


def test_firefunction_gets_its_functions_and_datetime():
    """Firefunction v2's template prints `functions` (the tools as JSON text, as its model card
    passes them) and `datetime`: both are given, today's date and the request's tools."""
    s = start("--chat-template-file", str(TEMPLATES / "fireworks-ai-llama-3-firefunction-v2.jinja"))
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                             "parameters": {"type": "object", "properties": {}}}}
    try:
        plain = requests.post(s.url + "/apply-template", json={"messages": ASK})
        with_tools = requests.post(s.url + "/apply-template", json={"messages": ASK, "tools": [tool]})
    finally:
        s.stop()
    assert plain.status_code == 200, plain.text
    today = datetime.datetime.now().strftime("%b %d %Y")
    assert f"Today is {today}." in plain.json()["prompt"]
    assert "get_weather" not in plain.json()["prompt"]
    assert '"name": "get_weather"' in with_tools.json()["prompt"]


def test_chat_template_by_name_and_missing_variable():
    s = start("--chat-template", "llama3")
    try:
        prompt = requests.post(s.url + "/apply-template", json={"messages": ASK}).json()["prompt"]
        bos = requests.get(s.url + "/props").json()["bos_token"]  # SmolLM2's is <|im_start|>
        assert prompt == bos + ("<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
                          "<|start_header_id|>assistant<|end_header_id|>\n\n")
        assert requests.post(s.url + "/v1/chat/completions",
                             json={"messages": ASK, "max_tokens": 2}).status_code == 200
    finally:
        s.stop()
    bad = subprocess.run([BIN, "serve", "--port", "0", "--chat-template", "nosuch"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode != 0
    assert "unknown template name 'nosuch'" in bad.stderr and "chatml" in bad.stderr
    # Jinja source given inline; the template reads a variable the request must give.
    s = start("--chat-template", "{% for m in messages %}{{ m.content }}{% endfor %}{{ persona.name }}:")
    try:
        r = requests.post(s.url + "/v1/chat/completions", json={"messages": ASK, "max_tokens": 2})
        assert r.status_code == 400
        assert "'persona'" in r.json()["error"]["message"] or '"persona"' in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "chat_template_kwargs"
        ok = requests.post(s.url + "/apply-template", json={
            "messages": ASK, "chat_template_kwargs": {"persona": {"name": "Bot"}}}).json()["prompt"]
        assert ok == "What is 2+2?Bot:"
    finally:
        s.stop()


def test_anthropic_thinking_param_maps_to_enable_thinking(qwen3_no_thinking):
    # thinking {"type": "enabled", "budget_tokens": N} asks the template for thinking (Qwen3
    # then leaves out its empty think block); {"type": "disabled"} turns it off.
    claude = anthropic.Anthropic(base_url=qwen3_no_thinking.url, api_key="unused", max_retries=0)
    def count(**extra):
        return claude.messages.count_tokens(model="x", messages=ASK, **extra).input_tokens
    enabled = count(thinking={"type": "enabled", "budget_tokens": 1024})
    disabled = count(thinking={"type": "disabled"})
    assert enabled < disabled == count()  # the server's default here is --reasoning-budget 0
    m = claude.messages.create(model="x", max_tokens=2048, messages=ASK,
                               thinking={"type": "enabled", "budget_tokens": 1024},
                               extra_body={"max_tokens": 4})
    prompt = lambda u: u.input_tokens + u.cache_read_input_tokens  # noqa: E731
    assert prompt(m.usage) == enabled
    m = claude.messages.create(model="x", max_tokens=4, messages=ASK, thinking={"type": "disabled"})
    assert prompt(m.usage) == disabled and [b.type for b in m.content] == ["text"]
    for bad in ({"type": "enabled", "budget_tokens": "lots"}, {"type": "sometimes"}, "on",
                {"type": "enabled", "budget_tokens": 0}):
        with pytest.raises(anthropic.BadRequestError) as e:
            claude.messages.create(model="x", max_tokens=4, messages=ASK, thinking=bad)
        assert e.value.body["error"]["type"] == "invalid_request_error"
        assert "thinking" in e.value.body["error"]["message"]


def n_tokens(server, text):
    return len(requests.post(server.url + "/tokenize", json={"content": text}).json()["tokens"])


def test_thinking_budget_closes_the_block(r1):
    # Unbounded, the small model keeps "reasoning" for all 40 tokens (the prompt opened the block).
    free = chat(r1, max_tokens=40)
    assert n_tokens(r1, free["reasoning_content"]) > 20 and not free.get("content")
    # With a budget of 6 the closing tag is forced after 6 tokens and the reply goes on as content.
    capped = chat(r1, max_tokens=40, reasoning_budget_tokens=6)
    assert 0 < n_tokens(r1, capped["reasoning_content"]) <= 6
    assert capped["reasoning_content"] in free["reasoning_content"]
    assert capped["content"]
    raw = chat(r1, max_tokens=40, reasoning_budget_tokens=6, reasoning_format="none")
    assert "</think>" in raw["content"]
    claude = anthropic.Anthropic(base_url=r1.url, api_key="x", max_retries=0)
    m = claude.messages.create(model="x", max_tokens=40, messages=ASK, extra_body={"temperature": 0},
                               thinking={"type": "enabled", "budget_tokens": 6})
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == capped["reasoning_content"] and m.content[1].text == capped["content"]
    with claude.messages.stream(model="x", max_tokens=40, messages=ASK, extra_body={"temperature": 0},
                                thinking={"type": "enabled", "budget_tokens": 6}) as s:
        kinds = [e.delta.type for e in s if e.type == "content_block_delta"]
        final = s.get_final_message()
    assert "thinking_delta" in kinds and "text_delta" in kinds
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking.strip() == capped["reasoning_content"]
    for bad in (-2, "six"):
        r = requests.post(r1.url + "/v1/chat/completions", json={"messages": ASK, "reasoning_budget_tokens": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_budget_tokens"


def test_reasoning_budget_flag():
    s = start("--chat-template-file", str(TEMPLATES / "llama-cpp-deepseek-r1.jinja"), "--reasoning-budget", "4")
    try:
        m = chat(s, max_tokens=30)
        assert 0 < n_tokens(s, m["reasoning_content"]) <= 4 and m["content"]
        # A request's own budget wins.
        longer = chat(s, max_tokens=30, reasoning_budget_tokens=10)
        assert 4 < n_tokens(s, longer["reasoning_content"]) <= 10
    finally:
        s.stop()
    bad = subprocess.run([BIN, "serve", "--reasoning-budget", "-5"], capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0 and "--reasoning-budget" in bad.stderr


@pytest.mark.parametrize("template,thinking_on,thinking_off", [
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "<think>\n", "<think>\n</think>"),
    ("Qwen-QwQ-32B.jinja", "<|im_start|>assistant\n<think>\n", "<|im_start|>assistant\n<think>\n</think>"),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
     "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>"),
])
def test_enable_thinking_is_defined_for_templates_that_read_it(template, thinking_on, thinking_off):
    """Templates that test "if not enable_thinking" think unless thinking is turned off (as
    llama-server renders them): the variable is defined, true by default."""
    def ends(server, **body):
        p = requests.post(server.url + "/apply-template", json={"messages": ASK, **body}).json()["prompt"]
        return p
    s = start("--chat-template-file", str(TEMPLATES / template))
    try:
        assert ends(s).endswith(thinking_on)
        assert ends(s, chat_template_kwargs={"enable_thinking": False}).endswith(thinking_off)
    finally:
        s.stop()
    s = start("--chat-template-file", str(TEMPLATES / template), "--reasoning", "off")
    try:
        assert ends(s).endswith(thinking_off)
    finally:
        s.stop()
