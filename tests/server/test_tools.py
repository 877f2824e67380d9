"""Tools round trip with the official client: the tools reach the template, the model's
<tool_call> comes back parsed with finish_reason "tool_calls", and the tool result goes back
in for the final answer. The default model's own template has no tool support, so this server
uses a Hermes-style (Qwen 2.5) template, and the assistant turn is started with the call's
opening (a prefill the model continues), which a 135M model then completes, closing its turn within
64 tokens."""
import json

import pytest
import requests

from conftest import ServerProcess, TESTDATA

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
QUESTION = {"role": "user", "content": "What is the weather in Paris?"}
PREFILL = {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "'}


@pytest.fixture(scope="module")
def tools_server():
    template = TESTDATA / "chat-templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
    s = ServerProcess("--chat-template-file", str(template), "-t", "2").wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tools_client(tools_server):
    from openai import OpenAI
    return OpenAI(base_url=tools_server.url + "/v1", api_key="x", max_retries=0, timeout=300)


def test_tools_reach_the_template(tools_server):
    with_tools = requests.post(tools_server.url + "/apply-template",
                               json={"messages": [QUESTION], "tools": TOOLS}).json()["prompt"]
    without = requests.post(tools_server.url + "/apply-template", json={"messages": [QUESTION]}).json()["prompt"]
    assert "get_weather" in with_tools and "<tools>" in with_tools
    assert "get_weather" not in without
    none = requests.post(tools_server.url + "/apply-template",
                         json={"messages": [QUESTION], "tools": TOOLS, "tool_choice": "none"}).json()["prompt"]
    assert "get_weather" not in none


def test_tool_parameters_keep_the_clients_order(tools_server):
    # Templates print tool schemas as given (Python dicts keep insertion order); a server that
    # sorted keys would show alpha before zeta both times.
    def prompt(names):
        tool = {"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {n: {"type": "string"} for n in names}}}}
        return requests.post(tools_server.url + "/apply-template",
                             json={"messages": [QUESTION], "tools": [tool]}).json()["prompt"]
    forward, backward = prompt(["zeta", "alpha"]), prompt(["alpha", "zeta"])
    assert forward.index('"zeta"') < forward.index('"alpha"')
    assert backward.index('"alpha"') < backward.index('"zeta"')
    assert forward.index('"type": "function"') < forward.index('"function": {')


def test_named_tool_choice_makes_the_model_call_it(tools_client):
    # No prefill from the client: the server starts the turn with the call's opening.
    r = tools_client.chat.completions.create(
        model="any", messages=[QUESTION], tools=TOOLS, max_tokens=64, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
    json.loads(choice.message.tool_calls[0].function.arguments)
    streamed = tools_client.chat.completions.create(
        model="any", messages=[QUESTION], tools=TOOLS, max_tokens=64, temperature=0, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    names = [tc.function.name for c in streamed if c.choices and c.choices[0].delta.tool_calls
             for tc in c.choices[0].delta.tool_calls if tc.function and tc.function.name]
    assert names == ["get_weather"]


def test_tool_call_round_trip(tools_client):
    r = tools_client.chat.completions.create(model="x", messages=[QUESTION, PREFILL], tools=TOOLS,
                                             max_tokens=64, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert isinstance(args.get("city"), str) and args["city"]
    assert call.id
    # The result goes back in; the model answers in text.
    follow = tools_client.chat.completions.create(model="x", tools=TOOLS, max_tokens=12, temperature=0, messages=[
        QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": "get_weather", "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 21, "sky": "sunny"})},
    ])
    assert follow.choices[0].message.content
    assert follow.choices[0].finish_reason in ("stop", "length")
    assert not follow.choices[0].message.tool_calls


def test_tool_call_streamed(tools_client):
    stream = tools_client.chat.completions.create(model="x", messages=[QUESTION, PREFILL], tools=TOOLS,
                                                  max_tokens=64, temperature=0, stream=True)
    chunks = list(stream)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls and calls[0].function.name == "get_weather" and calls[0].index == 0
    json.loads(calls[0].function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # No raw tag leaks into the streamed content.
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "<tool_call>" not in content
