"""OpenAI's Responses API through the official client (`client.responses`): text and
message-list input, instructions, max_output_tokens and incomplete replies, the streamed
event sequence, structured output (text.format), function calls in and out (on a server with
a Hermes-style template) and errors."""
import json

import openai
import pytest
import requests

from conftest import ServerProcess, TESTDATA, sse_events

# The greedy reply to this ends on its own in 12 tokens (status "completed").
SHORT = "What is 2+2?"
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
QUESTION = "What is the weather in Paris?"


def test_text_input_matches_the_chat_route(client):
    r = client.responses.create(model="any", input="Say hello in one short sentence.", instructions="Be brief.",
                                max_output_tokens=8, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.output[0].status == "incomplete"
    c = client.chat.completions.create(model="any", max_tokens=8, temperature=0, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello in one short sentence."}])
    assert r.output_text == c.choices[0].message.content
    assert r.usage.input_tokens == c.usage.prompt_tokens
    assert r.usage.output_tokens == 8 and r.usage.total_tokens == r.usage.input_tokens + 8
    assert r.instructions == "Be brief." and r.max_output_tokens == 8


def test_input_token_count(client, server):
    # The official client's responses.input_tokens.count: the prompt a request would take.
    r = client.responses.create(model="any", input="Say hello in one short sentence.", instructions="Be brief.",
                                max_output_tokens=2, temperature=0)
    n = client.responses.input_tokens.count(model="any", input="Say hello in one short sentence.",
                                            instructions="Be brief.")
    assert n.object == "response.input_tokens" and n.input_tokens == r.usage.input_tokens
    longer = client.responses.input_tokens.count(input=[
        {"role": "user", "content": "Say hello in one short sentence."},
        {"role": "assistant", "content": "Hello there."}, {"role": "user", "content": "Again."}])
    assert longer.input_tokens > n.input_tokens - 5
    chat = requests.post(server.url + "/v1/chat/completions/input_tokens", json={"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello in one short sentence."}]})
    assert chat.json() == {"object": "response.input_tokens", "input_tokens": n.input_tokens}
    bad = requests.post(server.url + "/v1/responses/input_tokens", json={"input": 5})
    assert bad.status_code == 400


def test_message_list_input_and_completed_status(client):
    r = client.responses.create(model="any", max_output_tokens=24, temperature=0, input=[
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": SHORT}]}])
    assert r.status == "completed" and r.incomplete_details is None
    assert r.output_text and r.usage.output_tokens < 24
    c = client.chat.completions.create(model="any", max_tokens=24, temperature=0, messages=[
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": SHORT}])
    assert r.output_text == c.choices[0].message.content


def test_stream_events(client):
    plain = client.responses.create(model="any", input=SHORT, max_output_tokens=24, temperature=0)
    events = list(client.responses.create(model="any", input=SHORT, max_output_tokens=24, temperature=0,
                                          stream=True))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == plain.output_text
    assert events[-1].response.output_text == plain.output_text
    assert events[-1].response.usage.output_tokens == plain.usage.output_tokens
    # The client's stream helper accumulates the same final response.
    with client.responses.stream(model="any", input=SHORT, max_output_tokens=24, temperature=0) as s:
        final = s.get_final_response()
    assert final.output_text == plain.output_text and final.status == "completed"


def test_stream_cut_by_max_output_tokens_ends_incomplete(client):
    events = list(client.responses.create(model="any", input="Write one word.", max_output_tokens=3,
                                          temperature=0, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-1].response.usage.output_tokens == 3


def test_json_schema_text_format(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = client.responses.create(model="any", input="Is the sky blue? Answer in JSON.", max_output_tokens=24,
                                temperature=0, text={"format": {"type": "json_schema", "name": "answer",
                                                                "schema": schema, "strict": True}})
    assert isinstance(json.loads(r.output_text)["ok"], bool)


def test_errors(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="any", input="Hi", previous_response_id="resp_123")
    assert "previous_response_id" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="any", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}])
    assert "input_image" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_123")
    r = requests.post(server.url + "/v1/responses", json={"model": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    r = requests.post(server.url + "/v1/responses", json={"input": "Hi", "max_output_tokens": 0})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    # llama-server's alias without /v1 is the same route
    r = requests.post(server.url + "/responses", json={"input": "Hi", "max_output_tokens": 2})
    assert r.status_code == 200 and r.json()["object"] == "response"


@pytest.fixture(scope="module")
def tools_client():
    template = TESTDATA / "chat-templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
    s = ServerProcess("--chat-template-file", str(template), "-t", "2").wait_ready()
    yield openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=300)
    s.stop()


def test_function_call_round_trip(tools_client):
    r = tools_client.responses.create(model="any", input=QUESTION, tools=[WEATHER_TOOL], max_output_tokens=64,
                                      temperature=0, tool_choice={"type": "function", "name": "get_weather"})
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    assert isinstance(json.loads(calls[0].arguments)["city"], str)
    follow = tools_client.responses.create(model="any", tools=[WEATHER_TOOL], max_output_tokens=8, temperature=0,
                                           input=[{"role": "user", "content": QUESTION},
                                                  {"type": "function_call", "call_id": calls[0].call_id,
                                                   "name": "get_weather", "arguments": calls[0].arguments},
                                                  {"type": "function_call_output", "call_id": calls[0].call_id,
                                                   "output": "21 degrees and sunny"}])
    assert follow.output_text
    assert not [o for o in follow.output if o.type == "function_call"]


def test_function_call_streamed(tools_client):
    with tools_client.responses.stream(model="any", input=QUESTION, tools=[WEATHER_TOOL], max_output_tokens=64,
                                       temperature=0, tool_choice="required") as s:
        events = list(s)
        final = s.get_final_response()
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done and done[0].name == "get_weather"
    calls = [o for o in final.output if o.type == "function_call"]
    assert calls and json.loads(calls[0].arguments) == json.loads(done[0].arguments)


def test_llama_server_extensions(server):
    """llama-server's fields reach the Responses route as they reach chat completions:
    sampling extensions (top_k, seed), return_progress (response.in_progress events with the
    prompt's progress) and timings_per_token (timings on every text delta), and the final
    event and the plain reply carry the generation's timings."""
    body = {"model": "any", "input": "Once upon a time " * 6, "max_output_tokens": 6,
            "temperature": 0.7, "top_k": 5, "seed": 42}
    plain = requests.post(server.url + "/v1/responses", json=body, timeout=300).json()
    again = requests.post(server.url + "/v1/responses", json=body, timeout=300).json()
    assert plain["output"][0]["content"][0]["text"] == again["output"][0]["content"][0]["text"]
    assert plain["timings"]["predicted_n"] == 6
    bad = requests.post(server.url + "/v1/responses", json={**body, "top_k": "many"}, timeout=60)
    assert bad.status_code == 400 and "top_k" in bad.text
    r = requests.post(server.url + "/v1/responses", stream=True, timeout=300, json={
        **body, "stream": True, "return_progress": True, "timings_per_token": True})
    events = [json.loads(e) for e in sse_events(r)]
    progress = [e for e in events if "prompt_progress" in e]
    assert progress and all(e["type"] == "response.in_progress" for e in progress)
    assert progress[-1]["prompt_progress"]["processed"] == progress[-1]["prompt_progress"]["total"]
    assert all("prompt_per_second" in e["timings"] for e in progress)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all("predicted_per_second" in e["timings"] for e in deltas)
    final = events[-1]
    assert final["type"] in ("response.completed", "response.incomplete")
    assert final["timings"]["predicted_n"] == 6
