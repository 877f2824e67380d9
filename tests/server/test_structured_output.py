"""Structured output enforced while sampling, through the real server and the default model.

The schema suite (schema_suite.py, 100+ schemas) is sampled at temperature 1 through
response_format json_schema: every output must finish with "stop", parse, and validate with
the `jsonschema` package (formats checked). Then the other ways in: json_object, llama.cpp's
/completion grammar and json_schema, Ollama's format, guided regex / choice, n > 1,
streaming, stop strings, max_tokens cuts, and the 400s for what cannot be enforced.
"""
import concurrent.futures as cf
import json
import re

import jsonschema
import pytest
import requests

from conftest import chat
from schema_suite import SCHEMAS

FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER


def validate(instance, schema):
    jsonschema.Draft202012Validator(schema, format_checker=FORMATS).validate(instance)


def ask_schema(server, name, schema, seed, max_tokens=320):
    body = {"messages": [{"role": "user", "content": f"Give a JSON example of a {name.replace('_', ' ')}."}],
            "temperature": 1.0, "max_tokens": max_tokens, "seed": seed,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": name, "schema": schema, "strict": True}}}
    r = chat(server, body)
    assert r.status_code == 200, (name, r.text)
    return r.json()["choices"][0]


def test_schema_suite_outputs_always_validate(server):
    assert len(SCHEMAS) >= 100
    failures = []
    with cf.ThreadPoolExecutor(8) as pool:
        futures = {pool.submit(ask_schema, server, name, schema, i): (name, schema)
                   for i, (name, schema) in enumerate(SCHEMAS)}
        for fut in cf.as_completed(futures):
            name, schema = futures[fut]
            choice = fut.result()
            text = choice["message"]["content"]
            try:
                assert choice["finish_reason"] == "stop", "finish_reason " + choice["finish_reason"]
                validate(json.loads(text), schema)
            except Exception as e:  # collect all, report together
                failures.append(f"{name}: {e!s:.200}\n  output: {text[:300]!r}")
    assert not failures, f"{len(failures)}/{len(SCHEMAS)} failed:\n" + "\n".join(failures)


def open_ended(schema, root=None, seen=()):
    """Whether the schema lets a value grow long through the model's own choice: a string with
    no maxLength (and no format or enum), an array or map with no (or a large) bound, any
    JSON value, or a recursive $ref. Everything else has a short longest value."""
    root = root if root is not None else schema
    if schema is True or schema == {} or not isinstance(schema, dict):
        return True
    if "$ref" in schema:
        ref = schema["$ref"]
        if ref in seen:
            return True
        node = root
        for part in ref.lstrip("#/").split("/"):
            node = node[part] if part else node
        return open_ended(node, root, seen + (ref,))
    if "enum" in schema or "const" in schema:
        return False
    shaping = ("type", "properties", "items", "prefixItems", "anyOf", "oneOf", "allOf",
               "additionalProperties")
    if not any(k in schema for k in shaping):
        return True  # any JSON value
    for k in ("anyOf", "oneOf", "allOf"):
        if any(open_ended(x, root, seen) for x in schema.get(k, [])):
            return True
    types = schema.get("type")
    types = types if isinstance(types, list) else [types]
    for t in types:
        if t == "string" and "maxLength" not in schema and "format" not in schema:
            pat = schema.get("pattern", "*")
            if any(c in pat for c in "*+") or ",}" in pat:
                return True
        if t == "array":
            if schema.get("maxItems", 99) > 10:
                return True
            items = [schema.get("items", {})] + schema.get("prefixItems", [])
            if any(open_ended(x, root, seen) for x in items if x is not False):
                return True
        if t == "object" or "properties" in schema:
            if any(open_ended(x, root, seen) for x in schema.get("properties", {}).values()):
                return True
            extra = schema.get("additionalProperties")
            if isinstance(extra, dict) and not schema.get("properties") and \
                    schema.get("maxProperties", 99) > 10:
                return True
    return False


def test_no_schema_output_runs_away(server):
    # Whitespace is bounded at every gap (none before a colon, one space after it, else one
    # newline and an indent of at most 16 spaces or 4 tabs), numbers, formats, enums and
    # small containers are finite. Sampled at temperature 1 with new seeds and a generous
    # max_tokens: an output of a schema with a short longest value always stops, and no
    # output, cut or not, holds a whitespace run beyond the bound. (A string, a big array or a
    # map the model keeps writing is the model's choice, as in plain text.)
    runaways, blanks = [], []
    with cf.ThreadPoolExecutor(8) as pool:
        futures = {pool.submit(ask_schema, server, name, schema, 5000 + i, 1024): (name, schema)
                   for i, (name, schema) in enumerate(SCHEMAS)}
        for fut in cf.as_completed(futures):
            (name, schema), choice = futures[fut], fut.result()
            text = choice["message"]["content"] or ""
            if choice["finish_reason"] != "stop" and not open_ended(schema):
                runaways.append(f"{name}: {choice['finish_reason']}: {text[-200:]!r}")
            outside = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)  # whitespace between tokens
            if re.search(r"\s{18,}|\n\s*\n", outside):
                blanks.append(f"{name}: {text[-200:]!r}")
    assert not runaways, f"{len(runaways)} ran away:\n" + "\n".join(runaways)
    assert not blanks, f"{len(blanks)} with whitespace runs:\n" + "\n".join(blanks)
    bounded = [n for n, s in SCHEMAS if not open_ended(s)]
    assert len(bounded) >= 40  # the strict half of the check covers enough of the suite


def test_json_object_mode(server):
    r = chat(server, {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 200,
                      "temperature": 1.0, "seed": 3, "response_format": {"type": "json_object"}})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert isinstance(json.loads(choice["message"]["content"]), dict)


def test_json_object_with_its_schema(server):
    """llama-server's extension: response_format json_object with a "schema" follows it; a
    schema that is not one is a 400."""
    rf = {"type": "json_object", "schema": {"type": "array", "items": {"type": "integer"},
                                            "minItems": 2, "maxItems": 2}}
    r = chat(server, {"messages": [{"role": "user", "content": "Two numbers."}], "max_tokens": 40,
                      "temperature": 1.0, "seed": 5, "response_format": rf})
    value = json.loads(r.json()["choices"][0]["message"]["content"])
    assert isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value)
    for bad in (123, {"type": 123}, {"type": "hiccup"}):
        r = chat(server, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                          "response_format": {"type": "json_object", "schema": bad}})
        assert r.status_code == 400 and "response_format" in r.json()["error"]["message"], bad


def test_n_choices_and_streaming_follow_the_schema(server):
    schema = {"type": "object", "properties": {"animal": {"enum": ["cat", "dog", "owl"]},
                                               "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
              "required": ["animal", "legs"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    body = {"messages": [{"role": "user", "content": "An animal?"}], "max_tokens": 60, "n": 3,
            "temperature": 1.0, "seed": 11, "response_format": rf}
    for c in chat(server, body).json()["choices"]:
        assert c["finish_reason"] == "stop"
        validate(json.loads(c["message"]["content"]), schema)
    r = chat(server, dict(body, n=1, stream=True), stream=True)
    text, finish = "", None
    for line in r.iter_lines(decode_unicode=True):
        if line.startswith("data: ") and line != "data: [DONE]":
            ch = json.loads(line[6:])["choices"]
            if ch:
                text += ch[0]["delta"].get("content") or ""
                finish = ch[0]["finish_reason"] or finish
    assert finish == "stop"
    validate(json.loads(text), schema)


def test_max_tokens_cut_is_length(server):
    schema = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
    r = chat(server, {"messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 5,
                      "temperature": 0, "response_format": {"type": "json_schema",
                                                            "json_schema": {"name": "s", "schema": schema}}})
    c = r.json()["choices"][0]
    assert c["finish_reason"] == "length"
    assert c["message"]["content"].startswith("{")


def test_output_cut_by_max_tokens_still_parses(server):
    # Near the token budget the sampler only takes tokens after which the grammar can still
    # be finished in the tokens left, so a recursive schema sampled at temperature 1 with a
    # small max_tokens ends as a whole document (finish_reason may be either).
    tree = {"type": "object", "properties": {"label": {"type": "string"},
                                             "children": {"type": "array", "items": {"$ref": "#"}}},
            "required": ["label", "children"]}
    rf = {"type": "json_schema", "json_schema": {"name": "tree", "schema": tree}}
    for seed in range(6):
        r = chat(server, {"messages": [{"role": "user", "content": "A deep tree, please."}],
                          "max_tokens": 24 + 8 * seed, "temperature": 1.0, "seed": seed,
                          "response_format": rf})
        validate(json.loads(r.json()["choices"][0]["message"]["content"]), tree)
    r = requests.post(server.url + "/api/generate", timeout=120, json={
        "model": "x", "stream": False, "format": "json", "prompt": "Nested JSON:",
        "options": {"temperature": 1.0, "seed": 5, "num_predict": 20}})
    assert isinstance(json.loads(r.json()["response"]), dict)


def test_stop_string_still_applies(server):
    r = chat(server, {"messages": [{"role": "user", "content": "Count."}], "max_tokens": 40,
                      "temperature": 0, "stop": [","], "guided_regex": "[0-9]{1,3}(, [0-9]{1,3}){3}"})
    c = r.json()["choices"][0]
    assert c["finish_reason"] == "stop"
    assert re.fullmatch(r"[0-9]{1,3}", c["message"]["content"]), c["message"]["content"]


def test_guided_regex_and_choice(server):
    r = chat(server, {"messages": [{"role": "user", "content": "A date?"}], "max_tokens": 30,
                      "temperature": 1.0, "seed": 5, "guided_regex": r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]"})
    c = r.json()["choices"][0]
    assert c["finish_reason"] == "stop"
    assert re.fullmatch(r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]", c["message"]["content"])
    r = chat(server, {"messages": [{"role": "user", "content": "Pick."}], "max_tokens": 10,
                      "temperature": 1.0, "guided_choice": ["alpha", "beta", "gamma delta"]})
    assert r.json()["choices"][0]["message"]["content"] in ("alpha", "beta", "gamma delta")


def test_legacy_completions_with_grammar(server):
    r = requests.post(server.url + "/v1/completions", timeout=120, json={
        "prompt": "The answer is", "max_tokens": 20, "temperature": 1.0, "n": 2,
        "guided_choice": ["yes", "no"]})
    for c in r.json()["choices"]:
        assert c["text"] in ("yes", "no") and c["finish_reason"] == "stop"


ARITH = r'''root ::= expr
expr ::= term (("+" | "-") term)*
term ::= num | "(" expr ")"
num ::= [1-9] [0-9]{0,2}
'''


def test_llama_completion_grammar_and_json_schema(server):
    r = requests.post(server.url + "/completion", timeout=120, json={
        "prompt": "2+2=", "n_predict": 40, "temperature": 1.0, "seed": 2, "grammar": ARITH})
    j = r.json()
    assert re.fullmatch(r"[0-9+\-()]+", j["content"]), j["content"]
    assert j["stop_type"] in ("eos", "limit")
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 4}
    r = requests.post(server.url + "/completion", timeout=120, json={
        "prompt": "Digits:", "n_predict": 40, "temperature": 1.0, "seed": 4, "json_schema": schema})
    validate(json.loads(r.json()["content"]), schema)


def test_ollama_format_json_and_schema(server):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "pop": {"type": "integer", "minimum": 0}},
              "required": ["city", "pop"]}
    r = requests.post(server.url + "/api/chat", timeout=120, json={
        "model": "x", "stream": False, "format": schema, "options": {"temperature": 1.0, "seed": 9},
        "messages": [{"role": "user", "content": "A city?"}]})
    validate(json.loads(r.json()["message"]["content"]), schema)
    # Free JSON can run past any token limit at temperature 1: greedy here, and it must end.
    r = requests.post(server.url + "/api/generate", timeout=120, json={
        "model": "x", "stream": False, "format": "json", "prompt": "Give your name as JSON.",
        "options": {"temperature": 0, "num_predict": 200}})
    assert r.json()["done_reason"] == "stop"
    assert isinstance(json.loads(r.json()["response"]), dict)


@pytest.mark.parametrize("field,value,fragment", [
    ("response_format", {"type": "json_schema", "json_schema": {"schema": {"type": "array", "uniqueItems": True}}},
     "uniqueItems"),
    ("response_format", {"type": "json_schema", "json_schema": {"schema": {"type": "string", "format": "hostname"}}},
     "hostname"),
    ("response_format", {"type": "yaml"}, "json_schema"),
    ("guided_regex", "(?<=a)b", "lookaround"),
    ("grammar", "root ::= foo", "undefined rule"),
])
def test_what_cannot_be_enforced_is_a_400(server, field, value, fragment):
    r = chat(server, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, field: value})
    assert r.status_code == 400, r.text
    assert fragment in r.json()["error"]["message"]


def test_two_constraints_are_refused(server):
    r = chat(server, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                      "response_format": {"type": "json_object"}, "guided_regex": "a"})
    assert r.status_code == 400
