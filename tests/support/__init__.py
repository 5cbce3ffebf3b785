"""Test helpers shared across test modules (a fault-injecting proxy, ...)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from tests.redis_server import RedisServer

__all__ = ["module_redis_server", "sigstop"]


@pytest.fixture(scope="module", name="server")
def module_redis_server() -> Iterator[RedisServer]:
    """A redis-server of the test module's own, which its tests may stop, stall and restart.

    Import it into a test module (``from tests.support import module_redis_server``)
    and take ``server`` as a fixture.
    """
    with RedisServer() as server:
        yield server


def sigstop(pid: int, timeout: float = 5.0) -> None:
    """Stop process ``pid`` (SIGSTOP) and return once it is stopped, not merely signalled (Linux /proc)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rpartition(")")[2].split()[0] in ("T", "t"):
                    return
        except OSError:
            return  # no /proc (not Linux): the signal has to do
        time.sleep(0.001)
    raise AssertionError(f"process {pid} did not stop within {timeout}s of SIGSTOP")
