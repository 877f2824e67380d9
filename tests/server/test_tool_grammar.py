"""Tool calls enforced while sampling: with tool_choice "required" or a named function the
call names a declared function and its arguments validate against that function's
parameters schema, at temperature 1 (a Hermes-style template, as in test_tools.py). A call
cut by max_tokens ends with "length" and never shows up as content."""
import concurrent.futures as cf
import json

import jsonschema
import pytest
import requests

from conftest import ServerProcess, TESTDATA

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 24},
            "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}},
    {"type": "function", "function": {
        "name": "convert_currency", "description": "Convert money",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number", "minimum": 0, "maximum": 1000000},
            "from": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "to": {"type": "string", "pattern": "^[A-Z]{3}$"}},
            "required": ["amount", "from", "to"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "schedule", "description": "Put a meeting in the calendar",
        "parameters": {"type": "object", "properties": {
            "title": {"type": "string", "maxLength": 30},
            "date": {"type": "string", "format": "date"},
            "attendees": {"type": "array", "items": {"type": "string", "format": "email"},
                          "minItems": 1, "maxItems": 3}},
            "required": ["title", "date", "attendees"]}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTION = {"role": "user", "content": "Weather in Paris, 20 EUR in USD, and a meeting tomorrow?"}
FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER


@pytest.fixture(scope="module")
def hermes_server():
    template = TESTDATA / "chat-templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
    s = ServerProcess("--chat-template-file", str(template), "-t", "2", "-np", "8").wait_ready()
    yield s
    s.stop()


def ask(server, **kw):
    body = {"messages": [QUESTION], "tools": TOOLS, "max_tokens": 256, "temperature": 1.0}
    body.update(kw)
    r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def check_call(choice, names):
    assert choice["finish_reason"] == "tool_calls", choice
    calls = choice["message"]["tool_calls"]
    assert len(calls) == 1
    name = calls[0]["function"]["name"]
    assert name in names
    args = json.loads(calls[0]["function"]["arguments"])
    jsonschema.Draft202012Validator(SCHEMAS[name], format_checker=FORMATS).validate(args)
    return name


def test_required_calls_a_declared_function_with_valid_arguments(hermes_server):
    with cf.ThreadPoolExecutor(8) as pool:
        choices = list(pool.map(lambda seed: ask(hermes_server, tool_choice="required", seed=seed),
                                range(12)))
    for c in choices:
        check_call(c, set(SCHEMAS))


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_named_function_gets_valid_arguments(hermes_server, name):
    for seed in (1, 2):
        c = ask(hermes_server, seed=seed, tool_choice={"type": "function", "function": {"name": name}})
        assert check_call(c, {name}) == name


def test_required_call_streamed(hermes_server):
    r = requests.post(hermes_server.url + "/v1/chat/completions", timeout=300, stream=True, json={
        "messages": [QUESTION], "tools": TOOLS, "max_tokens": 160, "temperature": 1.0, "seed": 4,
        "tool_choice": "required", "stream": True})
    calls, content, finish = [], "", None
    for line in r.iter_lines(decode_unicode=True):
        if line.startswith("data: ") and line != "data: [DONE]":
            ch = json.loads(line[6:])["choices"]
            if ch:
                calls += ch[0]["delta"].get("tool_calls") or []
                content += ch[0]["delta"].get("content") or ""
                finish = ch[0]["finish_reason"] or finish
    assert finish == "tool_calls" and not content.strip()
    assert len(calls) == 1 and calls[0]["function"]["name"] in SCHEMAS
    json.loads(calls[0]["function"]["arguments"])


def test_a_call_cut_by_max_tokens_is_not_content(hermes_server):
    c = ask(hermes_server, tool_choice="required", max_tokens=6, seed=1)
    assert c["finish_reason"] == "length"
    assert not c["message"].get("content") and not c["message"].get("tool_calls")
    r = requests.post(hermes_server.url + "/v1/chat/completions", timeout=300, stream=True, json={
        "messages": [QUESTION], "tools": TOOLS, "max_tokens": 6, "temperature": 1.0, "seed": 1,
        "tool_choice": "required", "stream": True})
    content = ""
    for line in r.iter_lines(decode_unicode=True):
        if line.startswith("data: ") and line != "data: [DONE]":
            ch = json.loads(line[6:])["choices"]
            if ch:
                content += ch[0]["delta"].get("content") or ""
                assert not ch[0]["delta"].get("tool_calls")
    assert content == ""


def test_openai_client_tool_choice_required(hermes_server):
    from openai import OpenAI
    client = OpenAI(base_url=hermes_server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    r = client.chat.completions.create(model="m", messages=[QUESTION], tools=TOOLS, temperature=1.0,
                                       seed=7, max_tokens=160, tool_choice="required")
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name in SCHEMAS
    jsonschema.Draft202012Validator(SCHEMAS[call.function.name], format_checker=FORMATS).validate(
        json.loads(call.function.arguments))


def test_auto_call_is_constrained_once_opened(hermes_server):
    # tool_choice auto: the client opens the call (a prefill); from the opening on the call is
    # written under the grammar, so it names a declared function with valid arguments.
    opened = {"role": "assistant", "content": "<tool_call>\n"}
    with cf.ThreadPoolExecutor(4) as pool:
        choices = list(pool.map(lambda seed: ask(hermes_server, seed=seed, messages=[QUESTION, opened]),
                                range(6)))
    for c in choices:
        check_call(c, set(SCHEMAS))


def test_auto_call_cut_by_max_tokens_is_not_content(hermes_server):
    opened = {"role": "assistant", "content": "<tool_call>\n"}
    c = ask(hermes_server, seed=3, max_tokens=8, messages=[QUESTION, opened])
    assert c["finish_reason"] == "length"
    assert not c["message"].get("content") and not c["message"].get("tool_calls")


def test_auto_without_a_call_is_plain_text(hermes_server):
    c = ask(hermes_server, seed=0, max_tokens=24, tools=TOOLS[:1])
    assert c["message"]["content"] and not c["message"].get("tool_calls")


def test_auto_with_parameters_that_cannot_be_enforced_still_answers(hermes_server):
    tool = {"type": "function", "function": {"name": "tag", "parameters": {
        "type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}}}
    r = requests.post(hermes_server.url + "/v1/chat/completions", timeout=300, json={
        "messages": [QUESTION], "tools": [tool], "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200
    r = requests.post(hermes_server.url + "/v1/chat/completions", timeout=300, json={
        "messages": [QUESTION], "tools": [tool], "max_tokens": 8, "tool_choice": "required"})
    assert r.status_code == 400 and "uniqueItems" in r.json()["error"]["message"]
