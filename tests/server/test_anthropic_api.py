"""Anthropic's Messages API through the official `anthropic` client: replies and usage, the
system prompt, stop sequences, the streamed event sequence, token counting, error bodies,
and tool use in and out (on a server with a Hermes-style template, as test_tools.py)."""
import json

import anthropic
import pytest
import requests

from conftest import ServerProcess, TESTDATA

HI = [{"role": "user", "content": "Say hello in one short sentence."}]
WEATHER_TOOL = {"name": "get_weather", "description": "Get the current weather in a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                 "required": ["city"]}}
QUESTION = {"role": "user", "content": "What is the weather in Paris?"}
# Sampling parameters are not arguments of this client version: they go in the body as is.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=300)


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def test_message_reply_matches_the_chat_route(server, claude, client):
    m = claude.messages.create(model="any", max_tokens=8, extra_body=GREEDY, system="Be brief.", messages=HI)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.content and m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert 0 < m.usage.output_tokens <= 8
    # The same prompt (system first) as OpenAI's chat route: the same greedy text and count.
    c = client.chat.completions.create(model="any", max_tokens=8, extra_body=GREEDY,
                                       messages=[{"role": "system", "content": "Be brief."}, *HI])
    assert text_of(m) == c.choices[0].message.content
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == c.usage.prompt_tokens
    if m.stop_reason == "max_tokens":
        assert m.usage.output_tokens == 8


def test_system_blocks_and_count_tokens(server, claude):
    as_text = claude.messages.count_tokens(model="any", system="You are a pirate.", messages=HI)
    as_blocks = claude.messages.count_tokens(
        model="any", system=[{"type": "text", "text": "You are a pirate."}], messages=HI)
    without = claude.messages.count_tokens(model="any", messages=HI)
    assert as_text.input_tokens == as_blocks.input_tokens > 0
    assert as_text.input_tokens != without.input_tokens
    prompt = requests.post(server.url + "/apply-template", json={
        "messages": [{"role": "system", "content": "You are a pirate."}, *HI]}).json()["prompt"]
    ids = requests.post(server.url + "/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"]
    assert as_text.input_tokens == len(ids)


def test_stop_sequence_is_reported(claude):
    full = text_of(claude.messages.create(model="any", max_tokens=10, extra_body=GREEDY, messages=HI))
    word = full.split()[1]  # a word the greedy reply is known to write
    m = claude.messages.create(model="any", max_tokens=10, extra_body=GREEDY, messages=HI,
                               stop_sequences=["zzz-never", word])
    assert m.stop_reason == "stop_sequence"
    assert m.stop_sequence == word
    assert text_of(m) == full[:full.index(word)]


def test_stream_events_in_order(server, claude):
    plain = claude.messages.create(model="any", max_tokens=6, extra_body=GREEDY, messages=HI)
    with claude.messages.stream(model="any", max_tokens=6, extra_body=GREEDY, messages=HI) as stream:
        deltas = [e.text for e in stream if e.type == "text"]
        final = stream.get_final_message()
    assert "".join(deltas) == text_of(final) == text_of(plain)
    assert final.stop_reason == plain.stop_reason
    assert final.usage.output_tokens == plain.usage.output_tokens
    # The raw event names (the client hides pings): each "event:" line names its data's type.
    r = requests.post(server.url + "/v1/messages", stream=True, json={
        "model": "x", "max_tokens": 6, "temperature": 0, "messages": HI, "stream": True})
    assert r.headers["Content-Type"].startswith("text/event-stream")
    names, types = [], []
    for line in r.iter_lines(decode_unicode=True):
        if line.startswith("event: "):
            names.append(line[7:])
        elif line.startswith("data: "):
            types.append(json.loads(line[6:])["type"])
    assert names == types
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}


def test_prefilled_assistant_turn_is_continued(claude):
    m = claude.messages.create(model="any", max_tokens=4, extra_body=GREEDY, messages=[
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is"}])
    assert "Paris" in text_of(m)
    assert not text_of(m).startswith("The capital")


def test_errors_have_anthropics_shape(claude, server):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="any", max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                       "data": "AAAA"}}]}])
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "image" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="any", max_tokens=4, extra_body={"temperature": 5}, messages=HI)
    r = requests.post(server.url + "/v1/messages", json={"model": "x", "messages": HI})
    assert r.status_code == 400
    assert r.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                   "message": "'max_tokens' is required"}}
    r = requests.post(server.url + "/v1/messages", json={"max_tokens": 2, "messages": [{"role": "system",
                                                                                        "content": "x"}]})
    assert r.status_code == 400 and "role" in r.json()["error"]["message"]


@pytest.fixture(scope="module")
def tools_claude():
    template = TESTDATA / "chat-templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
    s = ServerProcess("--chat-template-file", str(template), "-t", "2", "--api-key", "sk-ant-test").wait_ready(
        headers={"x-api-key": "sk-ant-test"})
    yield s, anthropic.Anthropic(base_url=s.url, api_key="sk-ant-test", max_retries=0, timeout=300)
    s.stop()


def test_api_key_and_auth_error(tools_claude):
    s, _ = tools_claude
    wrong = anthropic.Anthropic(base_url=s.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        wrong.messages.count_tokens(model="any", messages=HI)
    assert e.value.body["error"]["type"] == "authentication_error"


def test_tool_use_round_trip(tools_claude):
    _, c = tools_claude
    m = c.messages.create(model="any", max_tokens=64, extra_body=GREEDY, messages=[QUESTION], tools=[WEATHER_TOOL],
                          tool_choice={"type": "tool", "name": "get_weather"})
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id
    assert isinstance(uses[0].input, dict) and isinstance(uses[0].input.get("city"), str)
    # The tool result goes back in: it reaches the prompt, and the model answers in text.
    follow = [QUESTION, {"role": "assistant", "content": m.content},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                            "content": "21 degrees and sunny"}]}]
    with_result = c.messages.count_tokens(model="any", messages=follow, tools=[WEATHER_TOOL])
    assert with_result.input_tokens > c.messages.count_tokens(model="any", messages=[QUESTION],
                                                              tools=[WEATHER_TOOL]).input_tokens
    answer = c.messages.create(model="any", max_tokens=8, extra_body=GREEDY, messages=follow, tools=[WEATHER_TOOL])
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert text_of(answer) and not [b for b in answer.content if b.type == "tool_use"]


def test_tool_use_streamed_and_any(tools_claude):
    _, c = tools_claude
    with c.messages.stream(model="any", max_tokens=64, extra_body=GREEDY, messages=[QUESTION], tools=[WEATHER_TOOL],
                           tool_choice={"type": "any"}) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    uses = [b for b in final.content if b.type == "tool_use"]
    assert uses and uses[0].name == "get_weather" and isinstance(uses[0].input.get("city"), str)
    deltas = [e for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    assert deltas
    # No raw markup in text blocks.
    assert "<tool_call>" not in text_of(final)
