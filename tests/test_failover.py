"""Failover under load: ``kill -9`` of a busy master, and the grant a failover loses.

- Under load: worker processes (tests/failover_procs.py) run a UniqueJob in a
  loop through a Sentinel ``master_for`` client while the master is killed
  (SIGKILL) and the Sentinels promote a replica. Every caller error is a
  BackendError, no call outlasts its bound, every key runs again after
  recovery, and with ``replicas=1`` no two performs of a key overlap. The quick
  run is part of the default suite; the heavier one (more processes, longer,
  with and without acknowledgement) runs with ``-m failover`` (``.ci/run``).
- The window, forced: the replica's link to its master goes through a
  FaultProxy that is paused, so a grant made then never reaches the replica;
  the master is killed and the replica promoted. Without acknowledgement the
  grant is lost and a second holder takes the key beside the first; with
  ``replicas=1`` the grant is refused (undone) instead, and only one holds it.

Each run prints its figures (``-s`` shows them): recovery time after the kill,
performs, overlaps, errors and the slowest call.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.failover_procs import REPLICA_TIMEOUT, SOCKET_TIMEOUT, FailoverJob, sentinel_backend, worker
from tests.integration_workers import wait_until
from tests.redis_server import RedisServer
from tests.support.proxy import FaultProxy
from tests.support.topologies import SentinelGroup
from uniqjob import JobLock
from uniqjob.errors import BackendError
from uniqjob.locks import QueueMeta
from uniqjob.stores.redis import RedisBackend

# The longest a call may take while the master is away: the connect and read timeouts of a
# try and its one retry, the Sentinels asked in turn, the wait for replicas and its undo.
CALL_BOUND = 2 * (2 * SOCKET_TIMEOUT) + 3 * SOCKET_TIMEOUT + 2 * REPLICA_TIMEOUT + 2.0


@dataclass
class Figures:
    """What one run under load measured."""

    performs: int
    overlaps: int
    calls: int
    errors: list[str]
    not_backend: list[str]
    slowest: float
    recovery: float

    def __str__(self) -> str:
        return (
            f"recovery {self.recovery:.2f}s after kill -9, {self.performs} performs, "
            f"{self.overlaps} overlaps, {len(self.errors)} errors in {self.calls} calls, "
            f"slowest call {self.slowest:.2f}s"
        )


def _lines(directory: Path, prefix: str) -> list[dict[str, Any]]:
    found = []
    for path in directory.glob(f"{prefix}-*.jsonl"):
        found += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return found


def overlaps(performs: list[dict[str, Any]]) -> int:
    """How many performs began before an earlier perform of the same key had ended."""
    count = 0
    by_key: dict[int, list[dict[str, Any]]] = {}
    for perform in performs:
        by_key.setdefault(perform["key"], []).append(perform)
    for runs in by_key.values():
        runs.sort(key=lambda r: r["start"])
        latest_end = float("-inf")
        for run in runs:
            if run["start"] < latest_end:
                count += 1
            latest_end = max(latest_end, run["end"])
    return count


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    # Two replicas: one acknowledges each grant, and one is left to serve the new master.
    with SentinelGroup(replicas=2) as started:
        yield started


def _under_load(
    group: SentinelGroup,
    directory: Path,
    *,
    replicas: int,
    processes: int,
    keys: int,
    before: float,
    after: float,
) -> Figures:
    """Load, ``kill -9`` of the master ``before`` seconds in, ``after`` seconds more once it failed over."""
    sentinels = [s.port for s in group.sentinels]
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=worker, args=(sentinels, replicas, keys, str(directory)), daemon=True)
        for _ in range(processes)
    ]
    for proc in workers:
        proc.start()
    try:
        wait_until(lambda: len(_lines(directory, "performs")) >= processes, "the workers to perform", 60)
        time.sleep(before)
        master = group.current_master()
        killed_at = time.monotonic()
        group.kill(master)
        group.wait_master(not_port=master.port)
        wait_until(
            lambda: _performed_after(directory, killed_at),
            "a perform after the kill",
            60,
        )
        time.sleep(after)
    finally:
        (directory / "stop").touch()
        for proc in workers:
            proc.join(CALL_BOUND + 10)
            if proc.is_alive():
                proc.kill()
    hung = [proc.pid for proc in workers if proc.exitcode != 0]
    assert not hung, f"workers {hung} did not end: a call hung"
    calls, performs = _lines(directory, "calls"), _lines(directory, "performs")
    failed = [c for c in calls if c["outcome"] == "failed"]
    # The outage shows as the first call to fail after the kill; recovery, as the first perform after it.
    first_failure = min(c["began"] + c["took"] for c in failed if c["began"] + c["took"] > killed_at)
    recovered = min(p["start"] for p in performs if p["start"] > first_failure)
    return Figures(
        performs=len(performs),
        overlaps=overlaps(performs),
        calls=len(calls),
        errors=[c["error"] for c in failed],
        not_backend=[c["error"] for c in failed if not c["backend"]],
        slowest=max(c["took"] for c in calls),
        recovery=recovered - killed_at,
    )


def _performed_after(directory: Path, killed_at: float) -> bool:
    """A call failed after the kill, and a perform began after that failure: the load recovered."""
    ends = [c["began"] + c["took"] for c in _lines(directory, "calls") if c["outcome"] == "failed"]
    after = [end for end in ends if end > killed_at]
    return bool(after) and any(p["start"] > min(after) for p in _lines(directory, "performs"))


def _every_key_runs_again(group: SentinelGroup, keys: int, replicas: int, directory: Path) -> None:
    """No lock is left stuck: each key performs again within its lease (plus a failover's slack)."""
    FailoverJob.unique_backend = sentinel_backend([s.port for s in group.sentinels], replicas)
    FailoverJob.performs = directory / f"performs-{os.getpid()}.jsonl"
    for key in range(keys):
        wait_until(partial(_runs, key), f"key {key} to run again", FailoverJob.unique_run_lease + 10)


def _runs(key: int) -> bool:
    """True once ``key`` performs; False while it is held, or while the new master's replica catches up."""
    try:
        return bool(FailoverJob.run(key) == "done")
    except BackendError:
        return False


def _check(figures: Figures, *, acknowledged: bool) -> None:
    print(f"\nfailover (replicas={1 if acknowledged else 0}): {figures}")
    assert figures.not_backend == [], "every caller error is a BackendError"
    assert figures.slowest < CALL_BOUND, f"a call took {figures.slowest:.2f}s"
    if acknowledged:
        assert figures.overlaps == 0


@pytest.mark.slow
def test_kill_9_of_a_busy_master_loses_no_lock(group: SentinelGroup, tmp_path: Path) -> None:
    figures = _under_load(group, tmp_path, replicas=1, processes=3, keys=3, before=1.5, after=2.0)
    _check(figures, acknowledged=True)
    _every_key_runs_again(group, 3, 1, tmp_path)


@pytest.fixture
def heavy(request: pytest.FixtureRequest) -> None:
    """Skip unless the run asked for the failover marker (``-m failover``): before any server starts."""
    asked = "failover" in (request.config.option.markexpr or "") or request.config.getoption("--all-tiers")
    if not asked:
        pytest.skip("a heavier failover run: run with -m failover")


@pytest.mark.failover
@pytest.mark.parametrize("replicas", [0, 1])
def test_kill_9_under_heavier_load(heavy: None, group: SentinelGroup, tmp_path: Path, replicas: int) -> None:
    figures = _under_load(group, tmp_path, replicas=replicas, processes=6, keys=4, before=8.0, after=8.0)
    _check(figures, acknowledged=bool(replicas))
    _every_key_runs_again(group, 4, replicas, tmp_path)


# -- the window, forced ------------------------------------------------------------------------


class ProxiedPair:
    """A master and a replica whose link to it runs through a FaultProxy the test can pause."""

    def __init__(self) -> None:
        self.master = RedisServer(extra_args=("--repl-diskless-sync-delay", "0"))
        self.master.start()
        self.proxy = FaultProxy(("127.0.0.1", self.master.port))
        self.replica = RedisServer(extra_args=("--replicaof", "127.0.0.1", str(self.proxy.port)))
        self.replica.start()
        admin = redis.Redis(port=self.master.port)
        wait_until(lambda: admin.wait(1, 200) >= 1, "the replica to catch up")
        admin.close()

    def fail_over(self) -> None:
        """``kill -9`` of the master, and its replica made master (as a Sentinel would)."""
        SentinelGroup.kill(self.master)
        self.proxy.drop()
        with redis.Redis(port=self.replica.port) as client:
            client.replicaof("NO", "ONE")

    def close(self) -> None:
        self.proxy.close()
        self.replica.close()
        self.master.close()


@pytest.fixture
def proxied() -> Iterator[ProxiedPair]:
    pair = ProxiedPair()
    yield pair
    pair.close()


@pytest.mark.parametrize("replicas", [0, 1])
@pytest.mark.slow
def test_a_grant_the_replica_never_saw(proxied: ProxiedPair, replicas: int) -> None:
    """Without acknowledgement the failover loses the grant (two holders); with it the grant is refused."""
    meta = QueueMeta("tests.Job", "[]")
    on_master = redis.Redis(port=proxied.master.port, socket_timeout=5)
    first = JobLock(
        RedisBackend(on_master, replicas=replicas, replica_timeout=REPLICA_TIMEOUT), "k", meta=meta
    )
    proxied.proxy.pause()  # nothing the master writes reaches the replica now
    if replicas:
        with pytest.raises(BackendError, match=r"acknowledged by 0 of 1 replicas within 0.5s; undone"):
            first.acquire(run=True)
        holders = 0
    else:
        assert first.acquire(run=True)
        holders = 1
    proxied.fail_over()
    on_replica = redis.Redis(port=proxied.replica.port, socket_timeout=5)
    second = JobLock(RedisBackend(on_replica), "k", meta=meta)  # the new master has no replica to wait for
    assert second.acquire(run=True)  # the key is free on the new master: lost (replicas=0), never granted (1)
    holders += 1
    overlapping = holders - 1
    print(f"\nforced window, replicas={replicas}: {overlapping} overlap(s)")
    assert overlapping == (0 if replicas else 1)
    on_master.close()
    on_replica.close()
