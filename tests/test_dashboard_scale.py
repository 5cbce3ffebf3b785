"""The dashboard on a big store: 100,000 held locks and 10,000 concurrency keys in a real redis-server.

A soak test (``pytest --soak tests/test_dashboard_scale.py -s``: filling the
store takes a minute): the pages render while holding a bounded number of
rows, so the memory they take does not grow with the store; the time grows
with it (every key is read once, for the true totals). It prints the figures.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from starlette.testclient import TestClient

from tests.redis_server import RedisServer
from uniqjob import config
from uniqjob.concurrency import Park, store_for
from uniqjob.dashboard import _data, create_app
from uniqjob.locks import QueueMeta, RunClaim, local_holder
from uniqjob.stores.base import Backend

LOCKS = 100_000
KEYS = 10_000

pytestmark = pytest.mark.soak


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


@pytest.fixture(scope="module")
def big(server: RedisServer) -> Iterator[Backend]:
    backend = config.resolve(server.url)
    me = local_holder()
    for n in range(LOCKS):
        meta = QueueMeta(f"app.jobs.Job{n % 50}", f"{n}, 'x' * 40", f"job-{n}")
        run = RunClaim(me, lease=600) if n % 3 == 0 else None
        assert backend.claim(f"k{n}", f"t{n}", meta=meta, ttl=3600, run=run) is None
    slots = store_for(backend)
    for n in range(KEYS):
        for token in ("a", "b"):  # one slot held, one job parked behind it
            slots.acquire(
                f"c{n}", f"{token}{n}", limit=1, lease=600, running=False, holder=None,
                park=Park("queue", payload="{}"), job_class="app.jobs.Limited", args=str(n), caller=me,
            )  # fmt: skip
    yield backend


def _measure(client: TestClient, path: str) -> tuple[float, float, str]:
    """Seconds of one GET, and the peak MiB of Python allocations (traced) of another; the page."""
    began = time.perf_counter()
    response = client.get(path)
    took = time.perf_counter() - began
    tracemalloc.start()
    assert client.get(path).status_code == 200
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    assert response.status_code == 200
    return took, peak, response.text


def test_the_pages_hold_bounded_rows_of_a_big_store(big: Backend) -> None:
    client = TestClient(create_app(big))
    home_s, home_mib, home = _measure(client, "/")
    locks_s, locks_mib, locks = _measure(client, "/locks")
    print(f"\n{LOCKS} locks, {KEYS} concurrency keys: / {home_s:.1f} s, peak {home_mib:.1f} MiB;", end=" ")
    print(f"/locks {locks_s:.1f} s, peak {locks_mib:.1f} MiB, page {len(locks) / 1024:.0f} KiB")
    shown = re.sub(r"\s+", " ", re.sub("<[^>]+>", " ", locks))
    assert f"Showing {_data.ROWS} of {LOCKS} held lock(s)" in shown
    assert locks.count("<tr data-key=") == _data.ROWS + _data.TOP
    assert f">{KEYS}</div>" in home  # parked jobs, one per key
    assert locks_mib < 64 and home_mib < 64


def test_the_locks_command_lists_a_big_store(big: Backend, server: RedisServer) -> None:
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "uniqjob", "locks", "--url", server.url],
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.perf_counter() - began
    print(f"\nuniqjob locks on {LOCKS} locks: {took:.1f} s")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == LOCKS + 1  # the header, then a line per held key
