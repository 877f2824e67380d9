"""`hablar run --chat`: the prompt becomes one user turn rendered with the model's own chat
template. The rendered text is held against Python jinja2 rendering the template read from
the GGUF with gguf-py; the ids against the tokenizer's encoding of that text."""

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
MODEL = Path(os.environ.get("HABLAR_HOME", Path.home() / ".cache" / "hablar")) / "models" / \
    "SmolLM2-135M-Instruct.Q4_1.gguf"


def hablar(*args: str) -> subprocess.CompletedProcess:
    assert BIN.exists(), f"hablar binary not built: {BIN}"
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def model_template() -> str:
    assert MODEL.exists(), f"default model missing: run scripts/fetch-model.sh ({MODEL})"
    field = gguf.GGUFReader(str(MODEL)).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def jinja_render(source: str, messages: list[dict]) -> str:
    conversation = {"messages": messages, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    return chat_golden.render(chat_golden.make_environment(), source, conversation)["output"]


def run_chat(*extra: str) -> dict:
    r = hablar("run", "--chat", "-n", "4", "--temp", "0", "--json", "-t", "1", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_prompt_is_rendered_with_the_models_template(model_template):
    out = run_chat("-p", "What is 2+2?")
    expected = jinja_render(model_template, [{"role": "user", "content": "What is 2+2?"}])
    assert out["prompt"] == expected
    # Special tokens written by the template are single ids, not their spelled-out text.
    ids = hablar("tokenize", "--parse-special", "--ids", expected)
    assert ids.returncode == 0, ids.stderr
    assert out["prompt_ids"] == [int(x) for x in ids.stdout.replace(",", " ").strip("[] \n").split()]
    assert len(out["generated_ids"]) >= 1


def test_system_message_and_template_file(model_template, tmp_path):
    out = run_chat("-p", "Hi", "--system", "Be brief.")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert out["prompt"] == jinja_render(model_template, messages)
    custom = tmp_path / "t.jinja"
    custom.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                      "{% if add_generation_prompt %}[assistant] {% endif %}")
    out = run_chat("-p", "Hi", "--chat-template-file", str(custom))
    assert out["prompt"] == "[user] Hi\n[assistant] "


@pytest.mark.parametrize("args,needle", [
    (["--system", "x"], "--chat"),
    (["--chat", "--chat-template-file", "/nonexistent/t.jinja"], "chat template"),
    (["--chat", "--chat-template-file", "BROKEN"], "template"),
])
def test_bad_chat_options_are_clear_errors(args, needle, tmp_path):
    if "BROKEN" in args:
        broken = tmp_path / "broken.jinja"
        broken.write_text("{% for m in messages %}{{ m.content ")
        args = [str(broken) if a == "BROKEN" else a for a in args]
    r = hablar("run", "-p", "Hi", "-n", "2", "-t", "1", *args)
    assert r.returncode != 0
    assert needle in r.stderr
    assert "Traceback" not in r.stderr and "terminate" not in r.stderr


def test_long_options_take_underscores_as_llama_cpp_does(model_template):
    """--chat_template_file is --chat-template-file (llama.cpp's tools read '_' as '-' in a
    long option's name); a value after '=' keeps its underscores."""
    out = run_chat("-p", "Hi", "--system=Be_brief.")
    messages = [{"role": "system", "content": "Be_brief."}, {"role": "user", "content": "Hi"}]
    assert out["prompt"] == jinja_render(model_template, messages)
    r = hablar("run", "--chat", "-n", "2", "--temp", "0", "--json", "-t", "1", "-p", "Hi",
               "--ctx_size", "256")
    assert r.returncode == 0, r.stderr
    r = hablar("run", "-p", "Hi", "-n", "2", "--no_such_option")
    assert r.returncode != 0 and "--no-such-option" in r.stderr
