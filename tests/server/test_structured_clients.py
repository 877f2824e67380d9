"""The official clients against `hablar serve` with structured output and tools: openai's
chat.completions.parse with a Pydantic model, LangChain's with_structured_output and
bind_tools, the ollama client's format and tools (and litellm's tools when installed)."""
import json
from typing import List, Literal, Optional

import pytest
from pydantic import BaseModel, Field

from conftest import ServerProcess, TESTDATA


class Pet(BaseModel):
    name: str = Field(max_length=20)
    kind: Literal["cat", "dog", "parrot"]
    age: int = Field(ge=0, le=30)
    toys: List[str] = Field(max_length=3)
    owner_email: Optional[str] = Field(default=None, max_length=40)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                   "required": ["city"]}}}
QUESTION = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def hermes_server():
    template = TESTDATA / "chat-templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
    s = ServerProcess("--chat-template-file", str(template), "-t", "2").wait_ready()
    yield s
    s.stop()


def test_openai_parse_with_pydantic(client):
    for seed in (1, 2, 3):
        r = client.chat.completions.parse(
            model="m", messages=[{"role": "user", "content": "Describe a pet."}], response_format=Pet,
            temperature=1.0, seed=seed, max_tokens=200)
        pet = r.choices[0].message.parsed
        assert isinstance(pet, Pet) and r.choices[0].finish_reason == "stop"


def test_langchain_structured_output_and_bind_tools(server, hermes_server):
    from langchain_openai import ChatOpenAI
    llm = ChatOpenAI(base_url=server.url + "/v1", api_key="x", model="m", temperature=1.0,
                     max_tokens=200, seed=5, max_retries=0)
    pet = llm.with_structured_output(Pet, method="json_schema").invoke("Describe a pet.")
    assert isinstance(pet, Pet)
    tools_llm = ChatOpenAI(base_url=hermes_server.url + "/v1", api_key="x", model="m",
                           temperature=1.0, max_tokens=120, seed=5, max_retries=0)
    msg = tools_llm.bind_tools([WEATHER], tool_choice="get_weather").invoke(QUESTION)
    assert [c["name"] for c in msg.tool_calls] == ["get_weather"]
    assert isinstance(msg.tool_calls[0]["args"]["city"], str)


def test_ollama_client_format_and_tools(server, hermes_server):
    import ollama
    c = ollama.Client(host=server.url)
    r = c.chat(model="m", messages=[{"role": "user", "content": "Describe a pet."}],
               format=Pet.model_json_schema(), options={"temperature": 1.0, "seed": 3})
    Pet.model_validate_json(r.message.content)
    r = c.generate(model="m", prompt="Give your name as JSON.", format="json",
                   options={"temperature": 0, "num_predict": 200})
    assert r.done_reason == "stop" and isinstance(json.loads(r.response), dict)
    h = ollama.Client(host=hermes_server.url)
    prefill = {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "'}
    r = h.chat(model="m", messages=[{"role": "user", "content": QUESTION}, prefill], tools=[WEATHER],
               options={"temperature": 0, "num_predict": 64})
    assert r.message.tool_calls and r.message.tool_calls[0].function.name == "get_weather"
    assert isinstance(r.message.tool_calls[0].function.arguments["city"], str)
    streamed = [tc for part in h.chat(model="m", messages=[{"role": "user", "content": QUESTION}, prefill],
                                      tools=[WEATHER], stream=True, options={"temperature": 0, "num_predict": 64})
                for tc in (part.message.tool_calls or [])]
    assert [tc.function.name for tc in streamed] == ["get_weather"]


def test_litellm_tools(hermes_server):
    import litellm
    r = litellm.completion(model="openai/m", api_base=hermes_server.url + "/v1", api_key="x",
                           messages=[{"role": "user", "content": QUESTION}], tools=[WEATHER],
                           tool_choice="required", temperature=1.0, max_tokens=120, seed=2)
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
