"""Routes people reach for when switching from llama-server or Ollama: /models beside
/v1/models, Ollama's model listing (/api/tags with the file's real size, sha256 and time,
/api/ps, /api/show for name:tag names) and model management answered with Ollama's error
body, and /infill (fill in the middle) on a model with FIM tokens and on one without."""
import datetime
import hashlib
import subprocess

import ollama
import pytest
import requests

from conftest import BIN, DEFAULT_MODEL, TESTDATA, ServerProcess

NAME = "SmolLM2-135M-Instruct.Q4_1"


def test_models_without_v1(server):
    assert requests.get(server.url + "/models").json() == requests.get(server.url + "/v1/models").json()


def test_tags_and_ps_describe_the_file(server):
    data = DEFAULT_MODEL.read_bytes()
    entry = requests.get(server.url + "/api/tags").json()["models"][0]
    assert entry["size"] == len(data)
    assert entry["digest"] == hashlib.sha256(data).hexdigest()
    mtime = datetime.datetime.fromtimestamp(int(DEFAULT_MODEL.stat().st_mtime), datetime.timezone.utc)
    assert entry["modified_at"] == mtime.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert entry["details"]["quantization_level"] == "Q4_1"
    c = ollama.Client(host=server.url)
    listed = c.list().models
    assert [m.model for m in listed] == [NAME] and listed[0].digest == entry["digest"]
    running = c.ps().models
    assert [m.model for m in running] == [NAME] and running[0].size == len(data)
    assert running[0].expires_at.year > 2100


def test_show_takes_name_and_tag(server):
    c = ollama.Client(host=server.url)
    for name in (NAME, NAME + ":latest"):
        show = c.show(name)
        assert show.modelinfo["general.architecture"] == "llama"
        assert "completion" in show.capabilities
    r = requests.post(server.url + "/api/show", json={"model": "llama3:8b"})
    assert r.status_code == 404
    assert isinstance(r.json()["error"], str) and "llama3:8b" in r.json()["error"]


def test_model_management_is_refused_clearly(server):
    c = ollama.Client(host=server.url)
    assert c.pull(NAME).status == "success"  # the served model is here already
    with pytest.raises(ollama.ResponseError) as e:
        c.pull("llama3")
    assert e.value.status_code == 501 and "does not download" in e.value.error
    for call in (lambda: c.delete(NAME), lambda: c.copy(NAME, "copy"), lambda: c.push(NAME)):
        with pytest.raises(ollama.ResponseError) as e:
            call()
        assert e.value.status_code == 501 and "not supported" in e.value.error
    # Errors on /api/* are Ollama's {"error": "..."}, unknown routes included.
    r = requests.get(server.url + "/api/nothing")
    assert r.status_code == 404 and isinstance(r.json()["error"], str)


def test_infill_needs_fim_tokens(server):
    r = requests.post(server.url + "/infill", json={"input_prefix": "def f():", "input_suffix": "", "n_predict": 2})
    assert r.status_code == 501
    assert "fill in the middle" in r.json()["error"]["message"]
    assert "insert" not in requests.post(server.url + "/api/show", json={"model": NAME}).json()["capabilities"]


@pytest.mark.parametrize("extra", [{}, {"filename": "ok"}, {"filename": 123, "text": "abc"},
                                   {"filename": "a.c", "text": 456}, "text"])
def test_infill_input_extra_is_checked_before_anything_else(server, extra):
    """As llama-server checks them: each input_extra entry needs a string text (and a string
    filename if any); a bad one is a 400 even on a model without FIM tokens."""
    r = requests.post(server.url + "/infill", json={"input_extra": [extra], "input_prefix": "def f():",
                                                    "input_suffix": "", "n_predict": 2})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] in ("input_extra", "filename")


@pytest.fixture(scope="module")
def fim_server(tmp_path_factory):
    # Random weights over StarCoder's vocabulary, which has <fim_prefix> / <fim_suffix> /
    # <fim_middle>: the output is noise, the prompt's layout is what is tested.
    path = tmp_path_factory.mktemp("fim") / "fim.gguf"
    subprocess.run([BIN, "make-model", "--arch", "llama", "--shape", "tiny", "--type", "q8_0", "-t", "1",
                    "--vocab", str(TESTDATA / "vocab" / "ggml-vocab-starcoder.gguf"), "-o", str(path)],
                   check=True, capture_output=True)
    s = ServerProcess("-m", str(path), "-t", "2").wait_ready()
    yield s
    s.stop()


def test_infill_prompt_layout(fim_server):
    url = fim_server.url

    def n_tokens(text, add_special=False):
        return len(requests.post(url + "/tokenize", json={"content": text, "add_special": add_special}).json()["tokens"])

    prefix, suffix, middle = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n", "a"
    r = requests.post(url + "/infill", json={"input_prefix": prefix, "input_suffix": suffix, "prompt": middle,
                                             "input_extra": [{"filename": "util.py", "text": "x = 1"}],
                                             "n_predict": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    # BOS (if the vocabulary adds one), the extra file and its newline (no file separator
    # token in this vocabulary), then <fim_prefix> prefix <fim_suffix> suffix <fim_middle> a.
    expected = (n_tokens("", True) + n_tokens("util.py\nx = 1") + n_tokens("\n") + 3 + n_tokens(prefix) +
                n_tokens(suffix) + n_tokens(middle))
    assert r.json()["tokens_evaluated"] == expected
    assert r.json()["tokens_predicted"] == 2
    for bad in ({"input_prefix": 5}, {"input_extra": "x.py"}, {"input_extra": [7]}, {"input_suffix": ["a"]}):
        r = requests.post(url + "/infill", json={"input_prefix": "a", "n_predict": 1, **bad})
        assert r.status_code == 400, (bad, r.text)
    show = requests.post(url + "/api/show", json={"model": "fim"}).json()
    assert "insert" in show["capabilities"]
    # Ollama's suffix on /api/generate is the same fill-in-the-middle prompt.
    g = requests.post(url + "/api/generate", json={"model": "fim", "prompt": prefix, "suffix": suffix,
                                                   "stream": False, "options": {"num_predict": 2}}).json()
    assert g["done"] is True and g["prompt_eval_count"] == expected - n_tokens("util.py\nx = 1") - \
        n_tokens("\n") - n_tokens(middle)


def test_apply_template_leaves_the_bos_to_completion(tmp_path):
    """A template that writes the BOS itself (Gemma's, Llama 2's, Command-R's): /apply-template
    answers the prompt as a client posts it to /completion, which adds the vocabulary's BOS,
    so the prompt is evaluated as the chat request's (one BOS, same tokens)."""
    model = tmp_path / "spm.gguf"
    subprocess.run([BIN, "make-model", "--arch", "llama", "--shape", "tiny", "--type", "q8_0", "-t", "1",
                    "--vocab", str(TESTDATA / "vocab" / "ggml-vocab-llama-spm.gguf"), "-o", str(model)],
                   check=True, capture_output=True)
    template = tmp_path / "bos.jinja"
    template.write_text("{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                        "{% if add_generation_prompt %}[assistant] {% endif %}")
    s = ServerProcess("-m", str(model), "-t", "2", "--chat-template-file", str(template)).wait_ready()
    try:
        messages = [{"role": "user", "content": "Hi there"}]
        prompt = requests.post(s.url + "/apply-template", json={"messages": messages}).json()["prompt"]
        assert prompt == "[user] Hi there\n[assistant] "
        chat = requests.post(s.url + "/v1/chat/completions",
                             json={"messages": messages, "max_tokens": 1}).json()
        completion = requests.post(s.url + "/completion", json={"prompt": prompt, "n_predict": 1}).json()
        assert completion["tokens_evaluated"] == chat["usage"]["prompt_tokens"]
        ids = requests.post(s.url + "/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"]
        assert ids[0] == 1 and ids[1] != 1 and len(ids) == chat["usage"]["prompt_tokens"]  # <s> once
    finally:
        s.stop()
