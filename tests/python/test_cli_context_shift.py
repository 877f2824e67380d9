"""`hablar run --context-shift` (llama-cli's flag): a generation that fills -c keeps going,
the tokens before the first shift being those of the run without it; without the flag it
stops at the context. The engine's exactness after a shift is tested in C++
(tests/unit/engine/context_shift_test.cpp)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("HABLAR_BIN", REPO / "build" / "src" / "cli" / "hablar"))


def run(*args: str) -> subprocess.CompletedProcess:
    assert BIN.exists(), f"hablar binary not built: {BIN}"
    return subprocess.run([str(BIN), "run", "-p", "Once upon a time", "-c", "128", "--temp", "0",
                           "-t", "2", "--json", *args], capture_output=True, text=True, timeout=300)


def test_run_goes_on_past_a_full_context():
    plain = json.loads(run("-n", "300").stdout)
    shifted = json.loads(run("-n", "300", "--context-shift", "--keep", "2").stdout)
    n_prompt = len(plain["prompt_ids"])
    assert len(plain["generated_ids"]) == 128 - n_prompt
    assert len(shifted["generated_ids"]) == 300
    assert shifted["finish_reason"] == "length"
    # Up to the first shift both runs are the same computation.
    assert shifted["generated_ids"][:len(plain["generated_ids"])] == plain["generated_ids"]


def test_keep_out_of_range_is_a_clear_error():
    r = run("--context-shift", "--keep", "-2")
    assert r.returncode != 0 and "--keep" in r.stderr
