"""Black-box tests of `hablar run`, `hablar bench` and `hablar perplexity` on the default model."""
import json
import math
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("HABLAR_BIN", os.path.join(ROOT, "build", "src", "cli", "hablar"))
GOLDEN = os.path.join(ROOT, "tests", "golden", "model")


def hablar(*args, timeout=300):
    assert os.path.exists(BIN), f"hablar binary not built: {BIN}"
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def golden():
    with open(os.path.join(GOLDEN, "smollm2.json")) as f:
        return json.load(f)


def test_greedy_json_matches_llama_cpp_first_tokens(golden):
    # llama.cpp's greedy continuation of this prompt (ours agrees on all 64 tokens as
    # measured; the first 5 are asserted, see tests/unit/model/golden_real_models_test.cpp).
    prompt = golden["prompts"][0]
    r = hablar("run", "-p", prompt["text"], "-n", "12", "--temp", "0", "--json", "-t", "2")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["prompt_ids"] == prompt["ids"]
    assert len(out["generated_ids"]) == 12
    assert out["generated_ids"][:5] == golden["greedy"][0][:5]
    assert out["finish_reason"] == "length"
    assert len(out["text"]) > 0


def test_streamed_text_equals_json_text_and_speeds_go_to_stderr():
    args = ["run", "-p", "Once upon a time", "-n", "16", "--temp", "0", "-t", "2"]
    streamed = hablar(*args)
    summary = hablar(*args, "--json")
    assert streamed.returncode == 0 and summary.returncode == 0, streamed.stderr
    assert streamed.stdout == json.loads(summary.stdout)["text"] + "\n"
    assert "t/s" in streamed.stderr and "t/s" not in streamed.stdout


def test_same_seed_same_text_with_sampling():
    args = ["run", "-p", "My favourite food is", "-n", "16", "--temp", "0.9", "--seed", "5",
            "--json", "-t", "2"]
    a, b = hablar(*args), hablar(*args)
    assert a.returncode == 0, a.stderr
    assert json.loads(a.stdout)["generated_ids"] == json.loads(b.stdout)["generated_ids"]


@pytest.mark.parametrize("args,needle", [
    (["-n", "0"], "-n"),
    (["-n", "-3"], "-n"),
    (["--temp", "-1"], "temperature"),
    (["--temp", "nan"], "temperature"),
    (["--top-p", "0"], "top_p"),
    (["--top-p", "1.5"], "top_p"),
    (["-c", "4"], "context"),
])
def test_bad_input_is_a_clear_error(args, needle):
    r = hablar("run", "-p", "The capital of France is a city", *args)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "error:" in r.stderr and needle in r.stderr, r.stderr
    assert r.stdout == ""


def test_bench_json_reports_pp_and_tg():
    r = hablar("bench", "-p", "32", "-n", "8", "-r", "2", "-t", "2", "-o", "json")
    assert r.returncode == 0, r.stderr
    tests = {t["test"]: t for t in json.loads(r.stdout)}
    assert set(tests) == {"pp32", "tg8"}
    for t in tests.values():
        assert len(t["samples_ts"]) == 2 and t["avg_ts"] > 0


def test_perplexity_prints_final_estimate(golden):
    r = hablar("perplexity", "-f", os.path.join(GOLDEN, "ppl_text.txt"), "-c", "128",
               "--chunks", "2", "-t", "2")
    assert r.returncode == 0, r.stderr
    line = [l for l in r.stdout.splitlines() if l.startswith("Final estimate: PPL = ")]
    assert line, r.stdout
    ppl = float(line[0].split("=")[1].split()[0])
    assert math.isfinite(ppl) and 1.0 < ppl < 1000.0
