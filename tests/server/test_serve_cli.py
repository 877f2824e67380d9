"""Command-line habits from llama-server and llama-cli: a port already in use is a clear,
fast failure (no shared port), several listen addresses, -ngl on a machine without a GPU,
an unknown subcommand named as such, and --log-level after the subcommand."""
import json
import re
import socket
import subprocess
import time

import pytest
import requests

from conftest import BIN, ServerProcess


def test_port_in_use_fails_fast_with_a_bind_error(server):
    start = time.monotonic()
    p = subprocess.run([BIN, "serve", "--host", "127.0.0.1", "--port", str(server.port), "-t", "1"],
                       capture_output=True, text=True, timeout=30)
    elapsed = time.monotonic() - start
    assert p.returncode != 0
    assert elapsed < 2, f"took {elapsed:.2f} s"
    assert f"127.0.0.1:{server.port}" in p.stderr and "Address already in use" in p.stderr, p.stderr
    # The first server still has the port to itself.
    assert requests.get(server.url + "/health", timeout=5).status_code == 200


def ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_several_host_addresses():
    s = ServerProcess("--host", "127.0.0.1,::1", "-t", "1").wait_ready()
    try:
        assert "http://[::1]:" in s.log()
        for url in (f"http://127.0.0.1:{s.port}", f"http://[::1]:{s.port}"):
            assert requests.get(url + "/health", timeout=5).json() == {"status": "ok"}
    finally:
        s.stop()


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120)


def test_ngl_on_run_without_a_gpu_runs_on_the_cpu():
    p = run("run", "-ngl", "99", "-p", "Hello", "-n", "2", "--temp", "0")
    if "cuda:" in p.stderr:
        pytest.skip("this machine has a GPU")
    assert p.returncode == 0, p.stderr
    assert "-ngl 99 ignored" in p.stderr and "CPU" in p.stderr


def test_run_prompt_from_stdin_and_file(tmp_path):
    args = ["run", "-n", "4", "--temp", "0", "-t", "1"]
    direct = run(*args, "-p", "The capital of France is")
    piped = subprocess.run([BIN, *args, "-p", "-"], input="The capital of France is", capture_output=True,
                           text=True, timeout=120)
    f = tmp_path / "prompt.txt"
    f.write_text("The capital of France is")
    from_file = run(*args, "-f", str(f))
    assert direct.returncode == piped.returncode == from_file.returncode == 0, piped.stderr
    assert direct.stdout == piped.stdout == from_file.stdout and direct.stdout.strip()
    both = run(*args, "-p", "x", "-f", str(f))
    assert both.returncode != 0 and "-f" in both.stderr


def test_run_unlimited_and_random_seed_printed():
    p = run("run", "-p", "Hi", "-n", "-1", "-c", "40", "-t", "1", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert len(out["prompt_ids"]) + len(out["generated_ids"]) <= 40
    seed = int(re.search(r"seed: (\d+)", p.stderr).group(1))
    again = run("run", "-p", "Hi", "-n", "-1", "-c", "40", "-t", "1", "--json", "--seed", str(seed))
    assert json.loads(again.stdout)["text"] == out["text"]  # the printed seed repeats the run
    assert "seed:" not in again.stderr


def test_unknown_subcommand_is_named():
    p = run("frobnicate", "--foo")
    assert p.returncode != 0
    assert "unknown command 'frobnicate'" in p.stderr and "serve" in p.stderr
    assert "A subcommand is required" not in p.stderr


def test_log_level_after_the_subcommand():
    quiet = run("run", "-p", "Hello", "-n", "1", "--log-level", "error")
    assert quiet.returncode == 0, quiet.stderr
    loud = run("run", "-p", "Hello", "-n", "1")
    assert "loaded" in loud.stderr
    assert "loaded" not in quiet.stderr
