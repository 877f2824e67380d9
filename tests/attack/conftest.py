"""Fixtures of the attack suite: the real `hablar serve` (tests/server/conftest.py starts it)
with short header/body deadlines so slow-client cases finish quickly, plus raw-socket helpers.

Every case runs against loopback only, is bounded in time and count, and is followed by a
health check: a normal chat request must succeed and the process must be alive.
"""
import pytest

from .attack_util import ServerProcess, still_serving


@pytest.fixture(scope="session")
def attacked():
    """One server for the whole suite; its RSS is checked flat at the end."""
    s = ServerProcess("--metrics", "-np", "8", "-c", "4096", "-t", "2", "--header-timeout", "2",
                      "--body-timeout", "3", "--idle-timeout", "3").wait_ready()
    still_serving(s)  # warm: weights paged in, KV cache touched
    s.rss_start = s.rss_kib()
    yield s
    rc = s.stop()
    assert rc == 0, s.log()
