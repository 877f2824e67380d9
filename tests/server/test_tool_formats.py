"""Constrained tool calls in the formats of DeepSeek (R1 and V3.1), Functionary v3.2,
Command-R and the generic JSON format (templates with no tool format of their own, as
llama-server does), through the official openai client: tool_choice "required" and a named
function give calls to declared functions whose arguments validate against their parameters,
at temperature 1; parallel_tool_calls lets one turn hold several calls."""
import concurrent.futures as cf
import json

import jsonschema
import pytest
from openai import OpenAI

from conftest import ServerProcess, TESTDATA

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 24, "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"],
                     "description": "Temperature unit"}}, "required": ["city", "unit"],
            "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "convert_currency", "description": "Convert money",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000000,
                       "description": "Amount to convert"},
            "from": {"type": "string", "pattern": "^[A-Z]{3}$", "description": "From currency"},
            "to": {"type": "string", "pattern": "^[A-Z]{3}$", "description": "To currency"}},
            "required": ["amount", "from", "to"], "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTION = {"role": "user", "content": "Weather in Paris, and 20 EUR in USD?"}

TEMPLATES = {
    "deepseek-r1": "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
    "deepseek-v3.1": "deepseek-ai-DeepSeek-V3.1.jinja",
    "functionary-v3.2": "meetkai-functionary-medium-v3.2.jinja",
    "command-r": "CohereForAI-c4ai-command-r-plus-tool_use.jinja",
    "generic": None,  # the default model's own template: no tool format
}


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def server(request):
    args = ["-t", "2", "-np", "4"]
    if TEMPLATES[request.param]:
        args += ["--chat-template-file", str(TESTDATA / "chat-templates" / TEMPLATES[request.param])]
    s = ServerProcess(*args).wait_ready()
    s.format = request.param
    yield s
    s.stop()


def client(server):
    return OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)


def check_calls(message, names):
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call.function.name in names, call
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    return [c.function.name for c in message.tool_calls]


def ask(server, seed, **kw):
    body = dict(model="m", messages=[QUESTION], tools=TOOLS, temperature=1.0, seed=seed,
                max_tokens=200)
    body.update(kw)
    return client(server).chat.completions.create(**body).choices[0]


def test_the_server_reports_its_format(server):
    import requests
    props = requests.get(server.url + "/props", timeout=30).json()
    want = {"deepseek-r1": "deepseek", "deepseek-v3.1": "deepseek",
            "functionary-v3.2": "functionary-v3.2", "command-r": "command-r",
            "generic": "generic-json"}[server.format]
    assert json.dumps(props).find(want) >= 0


def test_required_call_is_declared_and_valid(server):
    with cf.ThreadPoolExecutor(4) as pool:
        choices = list(pool.map(lambda s: ask(server, s, tool_choice="required"), range(6)))
    for c in choices:
        assert c.finish_reason == "tool_calls", c
        assert len(check_calls(c.message, set(SCHEMAS))) == 1


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_named_call(server, name):
    c = ask(server, 3, tool_choice={"type": "function", "function": {"name": name}})
    assert c.finish_reason == "tool_calls", c
    assert check_calls(c.message, {name}) == [name]


def test_parallel_calls_all_validate(server):
    # Where the format holds several calls in one turn, parallel_tool_calls lets the model
    # write more than one; every one of them must still validate.
    counts = []
    for seed in range(6):
        c = ask(server, seed, tool_choice="required", parallel_tool_calls=True, max_tokens=1200)
        assert c.finish_reason == "tool_calls", c
        counts.append(len(check_calls(c.message, set(SCHEMAS))))
    assert all(1 <= n <= 8 for n in counts)
    if server.format in ("generic",):  # one call per turn in this format
        assert counts == [1] * len(counts)
