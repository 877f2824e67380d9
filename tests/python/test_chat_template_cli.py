"""`hablar template` against Python jinja2, end to end through the binary.

Every real template in <testdata>/chat-templates/ is rendered by `hablar template --template
FILE --context JSON` for a few conversations of tests/golden/chat/conversations.json, and the
bytes on stdout must equal jinja2's rendering done here, live, with Hugging Face's conventions
(tools/chat_golden.py). Where jinja2 raises, the binary must fail with the same message.
`--model` is checked on a GGUF written here with gguf-py (template and special tokens only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import chat_golden  # noqa: E402

BIN = Path(os.environ.get("HABLAR_BIN", REPO / "build" / "src" / "cli" / "hablar"))
TESTDATA = Path(os.environ.get("HABLAR_TESTDATA", REPO.parent / "shared" / "testdata"))
TEMPLATES = sorted((TESTDATA / "chat-templates").glob("*.jinja"))
CONVERSATIONS = json.loads((REPO / "tests" / "golden" / "chat" / "conversations.json").read_text())
PICKED = ["system_user", "tool_call_roundtrip", "content_parts", "unicode", "assistant_prefill"]
ENV = dict(os.environ, HABLAR_STRFTIME_NOW=str(chat_golden.FIXED_NOW), TZ="UTC")


def context_of(conversation: dict) -> dict:
    context = {
        "messages": conversation["messages"],
        "add_generation_prompt": conversation.get("add_generation_prompt", True),
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
    }
    if conversation.get("tools") is not None:
        context["tools"] = conversation["tools"]
    context.update(conversation.get("extra", {}))
    return context


def run_cli(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN), "template", *args], capture_output=True, env=ENV, timeout=60)


def test_templates_present():
    assert BIN.exists(), f"hablar binary not found at {BIN}"
    assert len(TEMPLATES) == 34


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.stem)
def test_cli_matches_jinja2(template: Path, tmp_path: Path):
    env = chat_golden.make_environment()
    compiled = env.from_string(template.read_text(encoding="utf-8"))
    for conversation in (c for c in CONVERSATIONS if c["name"] in PICKED):
        context = context_of(conversation)
        context_file = tmp_path / f"{conversation['name']}.json"
        context_file.write_text(json.dumps(context, ensure_ascii=False), encoding="utf-8")
        result = run_cli(["--template", str(template), "--context", str(context_file)])
        try:
            expected = compiled.render(**context)
        except Exception as error:  # the template refuses this input: so must we
            assert result.returncode != 0, conversation["name"]
            assert str(error) in result.stderr.decode("utf-8"), conversation["name"]
            continue
        assert result.returncode == 0, result.stderr.decode("utf-8")
        assert result.stdout.decode("utf-8") == expected, conversation["name"]


def test_no_newline_is_added(tmp_path: Path):
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages[0].content }}", encoding="utf-8")
    context = tmp_path / "c.json"
    context.write_text(json.dumps({"messages": [{"role": "user", "content": "exact"}]}))
    result = run_cli(["--template", str(template), "--context", str(context)])
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"exact"


def test_syntax_error_names_position(tmp_path: Path):
    template = tmp_path / "bad.jinja"
    template.write_text("line one\n{% if x %}\n{{ x + }}\n{% endif %}", encoding="utf-8")
    result = run_cli(["--template", str(template)])
    assert result.returncode == 1
    assert "template:3:" in result.stderr.decode("utf-8")


def write_model(path: Path, template: str | None) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["<s>", "</s>", "hello"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    if template is not None:
        writer.add_chat_template(template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_model_template_and_special_tokens(tmp_path: Path):
    model = tmp_path / "m.gguf"
    write_model(model, "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}{{ eos_token }}")
    context = tmp_path / "c.json"
    context.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    result = run_cli(["--model", str(model), "--context", str(context)])
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode("utf-8") == "<s>[user] hi</s>"


def test_model_without_template_gets_chatml(tmp_path: Path):
    model = tmp_path / "m.gguf"
    write_model(model, None)
    context = tmp_path / "c.json"
    context.write_text(json.dumps({"messages": [{"role": "system", "content": "S"},
                                                {"role": "user", "content": "U"}],
                                   "add_generation_prompt": True}))
    result = run_cli(["--model", str(model), "--context", str(context)])
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode("utf-8") == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n")
