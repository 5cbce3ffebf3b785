"""Races and crashes with real processes, on the stores that span processes."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import uniqjob
from tests.conftest import SHARED_STORES, store_url
from tests.proc_jobs import Sleeper, crash_worker, race_worker

ctx = multiprocessing.get_context("spawn")
PROCESSES = 8
ATTEMPTS = 60


@pytest.fixture(params=SHARED_STORES)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return store_url(request, tmp_path)


@pytest.mark.slow
def test_race_one_holder_at_a_time_and_no_false_conflicts(url: str) -> None:
    active, max_active = ctx.Value("i", 0), ctx.Value("i", 0)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=race_worker, args=(url, ATTEMPTS, (active, max_active), results))
        for _ in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    logs: list[list[tuple[float, float, float | None]]] = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0

    assert max_active.value == 1  # never two performs of one key at once
    attempts = [entry for log in logs for entry in log]
    assert len(attempts) == PROCESSES * ATTEMPTS
    runs = sorted(began for _, _, began in attempts if began is not None)
    assert runs, "nothing ran"
    # None lost: each rejected attempt overlapped a perform that was running then.
    ran_windows = [(asked, answered) for asked, answered, began in attempts if began is not None]
    for asked, answered, began in attempts:
        if began is None:
            assert any(a <= answered and asked <= b for a, b in ran_windows), "rejected while free"
    uniqjob.configure(url)
    assert list(uniqjob.default_backend().scan()) == []  # nothing leaked


def _start_sleeper(url: str, tmp_path: Path, lease: float, host: str | None) -> Any:
    started = tmp_path / f"started-{time.monotonic_ns()}"
    proc = ctx.Process(target=crash_worker, args=(url, str(started), lease, host))
    proc.start()
    deadline = time.monotonic() + 30
    while not started.exists():
        assert proc.is_alive() and time.monotonic() < deadline, "worker never started"
        time.sleep(0.01)
    return proc


def test_killed_worker_on_this_host_is_reclaimed_at_once(url: str, tmp_path: Path) -> None:
    uniqjob.configure(url)
    proc = _start_sleeper(url, tmp_path, lease=30.0, host=None)
    assert Sleeper.is_locked(1)
    assert Sleeper.lock(1).acquire() is False  # held by a live worker: never robbed
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    # same host, pid gone: reclaimed by the very next enqueue, long before the 30 s lease
    assert not Sleeper.is_locked(1)
    lock = Sleeper.lock(1)
    assert lock.acquire()
    lock.release()


@pytest.mark.slow
def test_killed_worker_on_another_host_is_reclaimed_within_one_lease(url: str, tmp_path: Path) -> None:
    uniqjob.configure(url)
    lease = 0.6
    proc = _start_sleeper(url, tmp_path, lease=lease, host="elsewhere")
    time.sleep(lease * 1.5)  # alive across leases: the heartbeat keeps it
    assert Sleeper.is_locked(1)
    os.kill(proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    proc.join(10)
    lock = Sleeper.lock(1)
    assert not lock.acquire()  # another host's pid cannot be checked: wait for its lease
    while not lock.acquire():
        assert time.monotonic() - killed < lease + 1.0, "not reclaimed within one lease"
        time.sleep(0.02)
    lock.release()
