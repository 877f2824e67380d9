#!/usr/bin/env python3
"""Golden outputs of the chat-template matrix, rendered by Python jinja2 (the reference).

Renders every template in <testdata>/chat-templates/ with every conversation in
tests/golden/chat/conversations.json, using the conventions of Hugging Face's
apply_chat_template (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loop controls,
tojson = json.dumps(ensure_ascii=False, ...), raise_exception, strftime_now). strftime_now is
pinned to FIXED_NOW (UTC) so both renderers agree. Writes tests/golden/chat/expected/<template>.json:
{conversation name: {"output": text} or {"error": message}}.

Usage: python tools/chat_golden.py [--testdata DIR]
"""
import argparse
import json
import os
import sys
from datetime import datetime, timezone

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_NOW = 1721989800  # 2024-07-26 10:30:00 UTC; the C++ test pins the same instant
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(REPO, "tests", "golden", "chat")


def make_environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.fromtimestamp(FIXED_NOW, tz=timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, source, conversation):
    context = {
        "messages": conversation["messages"],
        "add_generation_prompt": conversation.get("add_generation_prompt", True),
        "bos_token": conversation.get("bos_token", "<|bos|>"),
        "eos_token": conversation.get("eos_token", "<|eos|>"),
    }
    if conversation.get("tools") is not None:
        context["tools"] = conversation["tools"]
    context.update(conversation.get("extra", {}))
    try:
        return {"output": env.from_string(source).render(**context)}
    except jinja2.exceptions.TemplateSyntaxError:
        raise
    except Exception as error:  # the template refused the input: record its message
        return {"error": str(error)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--testdata", default=os.environ.get(
        "HABLAR_TESTDATA", os.path.join(REPO, "..", "shared", "testdata")))
    args = parser.parse_args()
    with open(os.path.join(GOLDEN, "conversations.json"), encoding="utf-8") as f:
        conversations = json.load(f)
    template_dir = os.path.join(args.testdata, "chat-templates")
    out_dir = os.path.join(GOLDEN, "expected")
    os.makedirs(out_dir, exist_ok=True)
    env = make_environment()
    counts = {"output": 0, "error": 0}
    for name in sorted(os.listdir(template_dir)):
        if not name.endswith(".jinja"):
            continue
        with open(os.path.join(template_dir, name), encoding="utf-8") as f:
            source = f.read()
        results = {}
        for conversation in conversations:
            result = render(env, source, conversation)
            counts[next(iter(result))] += 1
            results[conversation["name"]] = result
        with open(os.path.join(out_dir, name[:-len(".jinja")] + ".json"), "w",
                  encoding="utf-8") as f:
            json.dump(results, f, ensure_ascii=False, indent=1)
            f.write("\n")
    print(f"rendered {counts['output']} outputs, {counts['error']} template errors",
          file=sys.stderr)
    write_feature_cases(env)


def write_feature_cases(env):
    """One small template per interpreter feature, rendered by jinja2 (features.json)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from chat_feature_cases import CASES, random_cases, random_macro_cases, random_statement_cases
    results = []
    for name, source, context in (CASES + random_cases() + random_statement_cases() +
                                  random_macro_cases()):
        case = {"name": name, "template": source, "context": context}
        try:
            case["output"] = env.from_string(source).render(**context)
        except Exception as error:
            case["error"] = str(error)
            if name.startswith("random_"):
                case["error_kind"] = type(error).__name__
        results.append(case)
    with open(os.path.join(GOLDEN, "features.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(results)} feature cases", file=sys.stderr)


if __name__ == "__main__":
    main()
