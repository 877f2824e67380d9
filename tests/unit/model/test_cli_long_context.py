"""Black-box tests of the long-context flags: `hablar bench -d` (llama-bench's depth), the
quantized KV cache flags (--cache-type-k/-v) and the context limits of run, perplexity and
serve (-c beyond the model's trained context without a RoPE scaling is refused at start-up).
Uses small synthetic models written by `hablar make-model`."""
import json
import os
import subprocess
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("HABLAR_BIN", os.path.join(ROOT, "build", "src", "cli", "hablar"))


def hablar(*args, timeout=300):
    assert os.path.exists(BIN), f"hablar binary not built: {BIN}"
    return subprocess.run([BIN, *args], capture_output=True, text=True, errors="replace",
                          timeout=timeout)


@pytest.fixture(scope="module")
def models():
    with tempfile.TemporaryDirectory() as d:
        plain = os.path.join(d, "tiny.gguf")  # context 2048, no RoPE scaling
        scaled = os.path.join(d, "tiny-yarn.gguf")  # YaRN x4 over an original 2048
        r = hablar("make-model", "--shape", "tiny", "-o", plain)
        assert r.returncode == 0, r.stderr
        r = hablar("make-model", "--shape", "tiny", "--rope-scaling", "yarn", "--rope-factor", "4",
                   "-o", scaled)
        assert r.returncode == 0, r.stderr
        yield {"plain": plain, "scaled": scaled}


def test_bench_depth_names_and_times_each_test_at_its_depth(models):
    r = hablar("bench", "-m", models["plain"], "-p", "32", "-n", "4", "-d", "0,100", "-r", "1",
               "-t", "2", "-o", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(x["test"], x["n_depth"]) for x in rows] == [
        ("pp32", 0), ("tg4", 0), ("pp32 @ d100", 100), ("tg4 @ d100", 100)]
    assert all(x["avg_ts"] > 0 for x in rows)
    # tiny: 2 layers x 2 kv heads x 64 dims, K and V in F16
    assert rows[0]["kv_bytes_per_token"] == 2 * 2 * 64 * 2 * 2
    md = hablar("bench", "-m", models["plain"], "-p", "16", "-n", "0", "-d", "64", "-r", "1",
                "-t", "2")
    assert md.returncode == 0, md.stderr
    assert "| pp16 @ d64 |" in md.stdout


def test_bench_reports_the_quantized_cache_per_token(models):
    r = hablar("bench", "-m", models["plain"], "-p", "16", "-n", "2", "-r", "1", "-t", "2",
               "-o", "json", "--cache-type-k", "q8_0", "-ctv", "q4_0")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    # per layer and kv head: K 2 blocks of 34 bytes, V 2 blocks of 18
    assert rows[0]["kv_bytes_per_token"] == 2 * 2 * (2 * 34 + 2 * 18)
    assert "K q8_0, V q4_0" in r.stderr


def test_bad_cache_type_and_depth_are_refused(models):
    r = hablar("bench", "-m", models["plain"], "-p", "16", "-n", "0", "-r", "1",
               "--cache-type-k", "q5_1")
    assert r.returncode != 0 and "q5_1" in r.stderr
    r = hablar("bench", "-m", models["plain"], "-p", "16", "-n", "0", "-r", "1", "-d", "-5")
    assert r.returncode != 0 and "-d" in r.stderr


def test_run_with_a_quantized_cache_generates(models):
    r = hablar("run", "-m", models["plain"], "-p", "hello there", "-n", "4", "--temp", "0",
               "-t", "2", "-ctk", "q8_0", "-ctv", "q8_0", "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["generated_ids"]) == 4


def test_context_beyond_the_trained_one_needs_a_rope_scaling(models):
    r = hablar("run", "-m", models["plain"], "-p", "hi", "-n", "1", "-c", "4096")
    assert r.returncode != 0
    assert "4096 exceeds the model's context of 2048" in r.stderr
    assert "no RoPE scaling" in r.stderr
    # Without -c, run takes 4096 capped at the model's 2048.
    assert hablar("run", "-m", models["plain"], "-p", "hi", "-n", "1").returncode == 0
    # YaRN x4 over 2048 allows 8192, not more.
    assert hablar("run", "-m", models["scaled"], "-p", "hi", "-n", "1", "-c", "8192").returncode == 0
    r = hablar("run", "-m", models["scaled"], "-p", "hi", "-n", "1", "-c", "8193")
    assert r.returncode != 0 and "RoPE scaling in the file" in r.stderr
    r = hablar("perplexity", "-m", models["plain"], "-f", os.path.join(ROOT, "README.md"),
               "-c", "3000")
    assert r.returncode != 0 and "exceeds the model's context" in r.stderr
