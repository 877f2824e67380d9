"""1,000 slowloris connections (bench/serving/slowloris.py; 10,000 in the benchmark) must
leave /health fast (p99 <= 100 ms) and chat served, and must not cost the server a thread
each. Runs last in the suite (file order), then checks RSS stayed flat over the suite."""
import json
import subprocess
import sys
from pathlib import Path

from .attack_util import still_serving

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "serving" / "slowloris.py"


def test_slowloris_1000(attacked):
    out = subprocess.run([sys.executable, str(SCRIPT), "--base-url", attacked.url,
                          "--connections", "1000", "--seconds", "8", "--pid", str(attacked.proc.pid),
                          "--max-p99-ms", "100"], capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout)
    print(report)
    assert out.returncode == 0, out.stdout + out.stderr
    assert report["attack_open_at_start"] >= 900, report
    assert report["health_failed"] == 0 and report["health_requests"] > 20, report
    assert report["health_p99_ms"] <= 100, report
    assert all(c["status"] == 200 for c in report["chat_during"]), report
    # Idle connections hold no thread: far fewer threads than connections.
    assert report["server_threads_peak"] < 200, report
    still_serving(attacked)


def test_zz_rss_flat_over_the_suite(attacked):
    """Across everything above (bad bodies, floods, disconnects, slowloris)."""
    rss = attacked.rss_kib()
    print(f"RSS {attacked.rss_start} -> {rss} KiB")
    assert rss - attacked.rss_start < 128 * 1024, f"RSS grew {attacked.rss_start} -> {rss} KiB"
