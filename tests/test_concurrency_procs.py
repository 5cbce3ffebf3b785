"""Concurrency limits under races and crashes, with real processes, on Redis and on files.

Workers take jobs from a Redis list (at-least-once: a killed worker's message
goes back), some are SIGKILLed at random moments (mid-run, mid-promotion,
idle), and a cron-like sweep runs meanwhile. From the events every perform
writes, the tests check: never more than N running per key, every job that
waited ran to its end exactly once, promotion kept FIFO, and nothing is left.
Guarantee 5 (a promoter that dies around its push) is forced deterministically.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

import uniqjob
from tests.concurrency_procs import (
    DIE_ON_PUSH,
    EVENTS,
    QUEUE,
    QUEUE_URL,
    Fifo,
    Pipeline,
    inline_caller,
    promoter,
    worker,
)
from tests.conftest import SHARED_STORES, store_url
from tests.redis_server import RedisServer
from uniqjob.concurrency import Parked, store_for, sweep
from uniqjob.locks import orphaned

ctx = multiprocessing.get_context("spawn")
KEY_INLINE = "tests.concurrency_procs.InlinePipeline"
DEADLINE = 45.0  # seconds any one test may take before it is a failure, not a hang


@dataclass(frozen=True)
class Event:
    kind: str  # S, E, K (a kill, written by the test)
    job: str
    key: str
    pid: int
    at: float


@pytest.fixture(params=SHARED_STORES)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return store_url(request, tmp_path)


@pytest.fixture
def events(
    redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    path = tmp_path / "events"
    path.touch()
    monkeypatch.setenv(EVENTS, str(path))
    monkeypatch.setenv(QUEUE_URL, redis_server.url)
    QUEUE._client = None  # connect to this session's server
    return path


class Processes:
    """Every process a test starts; whatever is still alive at the end is killed and reaped."""

    def __init__(self) -> None:
        self.all: list[Any] = []

    def start(self, target: Any, *args: Any, env: dict[str, str] | None = None) -> Any:
        saved = {name: os.environ.get(name) for name in env or {}}
        os.environ.update(env or {})  # a spawned child copies the environment at start()
        try:
            proc = ctx.Process(target=target, args=args)
            proc.start()
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        self.all.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.all:
            if proc.is_alive():
                proc.kill()
            proc.join(10)


@pytest.fixture
def procs() -> Iterator[Processes]:
    processes = Processes()
    try:
        yield processes
    finally:
        processes.close()


def read_events(path: Path) -> list[Event]:
    out = []
    for line in path.read_text().splitlines():
        kind, job, key, pid, at = line.split()
        out.append(Event(kind, job, key, int(pid), float(at)))
    return sorted(out, key=lambda e: e.at)


def note(path: Path, line: str) -> None:
    with path.open("a") as f:
        f.write(line + "\n")


def kill(proc: Any, path: Path) -> None:
    """SIGKILL ``proc``, noting the time first: whatever it ran ended by then, at the latest."""
    note(path, f"K - - {proc.pid} {time.monotonic():.6f}")
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)


def most_running(events: list[Event]) -> dict[str, int]:
    """The most performs running at once per key; a kill ends what its process was running."""
    running: dict[int, Event] = {}
    now: Counter[str] = Counter()
    most: Counter[str] = Counter()
    for e in events:
        if e.kind == "S":
            running[e.pid] = e
            now[e.key] += 1
            most[e.key] = max(most[e.key], now[e.key])
        elif e.kind in ("E", "K") and e.pid in running:
            now[running.pop(e.pid).key] -= 1
    return dict(most)


def killed_mid_run(events: list[Event]) -> Counter[str]:
    """How many times each job's process was killed while it ran."""
    running: dict[int, str] = {}
    hits: Counter[str] = Counter()
    for e in events:
        if e.kind == "S":
            running[e.pid] = e.job
        elif e.kind == "E":
            running.pop(e.pid, None)
        elif e.kind == "K" and e.pid in running:
            hits[running.pop(e.pid)] += 1
    return hits


def wait_for(condition: Any, what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def requeue(client: redis.Redis, pid: int, ended: set[str]) -> set[str]:
    """Give a killed worker's messages back to the queue, unless their job had already ended (acked).

    Returns the jobs given back: each was promoted in its turn, then delayed by the crash.
    """
    given_back: set[str] = set()
    while True:
        raw: Any = client.lmove(f"processing:{pid}", QUEUE.name, "RIGHT", "LEFT")
        if raw is None:
            return given_back
        job = str(json.loads(raw)["args"][0])
        if job in ended:
            client.lrem(QUEUE.name, 1, raw)
        else:
            given_back.add(job)


@pytest.mark.slow
def test_queued_jobs_race_and_crash_within_the_limit_exactly_once_in_order(
    url: str, events: Path, procs: Processes, redis_client: redis.Redis
) -> None:
    uniqjob.configure(url)
    rng = random.Random(4)
    workers = [procs.start(worker, url) for _ in range(4)]
    # all workers wait on the queue before the first job arrives, so jobs of a key overlap at once
    wait_for(lambda: redis_client.scard("ready") == len(workers), "the workers to start")
    pipeline = [(job, job % 3, rng.uniform(0.02, 0.1)) for job in range(45)]
    fifo = [(100 + n, rng.uniform(0.01, 0.04)) for n in range(10)]
    for job, key, pause in pipeline:
        Pipeline.enqueue(job, key, pause)
    for fifo_job, pause in fifo:
        Fifo.enqueue(fifo_job, pause)
    everyone = {str(job) for job, _, _ in pipeline} | {str(job) for job, _ in fifo}
    kills = 0
    redelivered: set[str] = set()
    deadline = time.monotonic() + DEADLINE
    while True:
        ended = {e.job for e in read_events(events) if e.kind == "E"}
        if ended >= everyone:
            break
        assert time.monotonic() < deadline, f"never ran: {sorted(everyone - ended)}"
        time.sleep(rng.uniform(0.03, 0.1))
        if kills < 5 and rng.random() < 0.7:
            victim = rng.choice([w for w in workers if w.is_alive()])
            kill(victim, events)
            kills += 1
            redelivered |= requeue(
                redis_client, victim.pid, {e.job for e in read_events(events) if e.kind == "E"}
            )
            workers.append(procs.start(worker, url))
        sweep()  # as cron would: settles keys behind dead holders and dead promoters
    redis_client.set("stop", 1)
    for w in workers:
        w.join(10)

    log = read_events(events)
    assert kills >= 3
    most = most_running(log)
    assert set(most) == {"k0", "k1", "k2", "fifo"}
    assert max(most["k0"], most["k1"], most["k2"]) == 2 and most["fifo"] == 1  # never past the limit
    assert 2 in (most["k0"], most["k1"], most["k2"])  # and the limit was reached: the check has teeth
    ends = Counter(e.job for e in log if e.kind == "E")
    assert set(ends) == everyone and set(ends.values()) == {1}  # every job ran to its end exactly once
    starts = Counter(e.job for e in log if e.kind == "S")
    assert starts == Counter(everyone) + killed_mid_run(log)  # started again only after its worker died
    first_starts = list(dict.fromkeys(e.job for e in log if e.kind == "S" and e.key == "fifo"))
    # promotion is first in, first out; a job whose message a killed worker held starts late,
    # after its slot's lease let the next one through: order is kept among all the others
    in_turn = [job for job in first_starts if job not in redelivered]
    assert in_turn == [str(job) for job, _ in fifo if str(job) not in redelivered]
    assert len(in_turn) >= len(fifo) - kills  # each kill can delay at most the one job it held
    assert list(store_for(uniqjob.default_backend()).scan()) == []
    backend = uniqjob.default_backend()
    # a uniqueness lock survives only where a worker died after its perform ended: an orphan
    assert all(orphaned(backend.read(key)) for key in backend.scan())


@pytest.mark.parametrize("die", ["before", "after"])
@pytest.mark.slow
def test_guarantee_5_a_promoter_that_dies_around_its_push_loses_nothing_and_runs_nothing_twice(
    url: str, events: Path, procs: Processes, redis_client: redis.Redis, die: str
) -> None:
    uniqjob.configure(url)
    Fifo.enqueue(1, 0.0)
    assert isinstance(Fifo.enqueue(2, 0.0), Parked)
    semaphore = Fifo.semaphore(1, 0.0)
    # the process that runs job 1 takes job 2 off the parked list as it finishes, and dies
    dying = procs.start(promoter, url, env={DIE_ON_PUSH: die})
    dying.join(30)
    assert dying.exitcode == -signal.SIGKILL
    (slot,) = semaphore.read().slots
    assert (slot.status, slot.holder and slot.holder.pid) == ("promoted", dying.pid)
    assert semaphore.read().parked == 0
    assert redis_client.llen(QUEUE.name) == (1 if die == "after" else 0)
    # the next sweep proves the promoter dead and pushes job 2 (again)
    sweep()
    assert redis_client.llen(QUEUE.name) == (2 if die == "after" else 1)
    procs.start(worker, url)
    wait_for(lambda: redis_client.llen(QUEUE.name) == 0 and semaphore.read().empty, "the queue to drain")
    redis_client.set("stop", 1)
    log = read_events(events)
    assert Counter((e.kind, e.job) for e in log) == {
        ("S", "1"): 1,
        ("E", "1"): 1,
        ("S", "2"): 1,
        ("E", "2"): 1,
    }
    assert not Fifo.is_locked(2, 0.0)


@pytest.mark.slow
def test_inline_callers_wait_their_turn_across_processes_and_crashes(
    url: str, events: Path, procs: Processes
) -> None:
    uniqjob.configure(url)
    rng = random.Random(7)
    plan = {n: [n * 10 + k for k in range(5)] for n in range(6)}
    callers = {n: procs.start(inline_caller, url, jobs, n) for n, jobs in plan.items()}
    for n in rng.sample(sorted(callers), 2):  # each dies waiting or running, at a random moment
        pid = callers[n].pid
        wait_for(lambda pid=pid: any(e.pid == pid for e in read_events(events)), "a victim to start", 20)
        time.sleep(rng.uniform(0, 0.15))
        kill(callers[n], events)
    for proc in callers.values():
        proc.join(DEADLINE)
    # a caller that finished all its calls just before its kill is a survivor
    victims = {n for n, proc in callers.items() if proc.exitcode == -signal.SIGKILL}
    assert victims, "no caller was still running to be killed"
    assert all(proc.exitcode == 0 for n, proc in callers.items() if n not in victims)
    store = store_for(uniqjob.default_backend())
    # the next sweep (a live waiter's, or cron's) reclaims what the dead held
    wait_for(
        lambda: sweep() >= 0 and store.read(KEY_INLINE).empty, "the dead callers' slots to be reclaimed", 15
    )

    log = read_events(events)
    assert most_running(log) == {"inline": 2}  # the limit, reached and never passed
    ends = Counter(e.job for e in log if e.kind == "E")
    starts = Counter(e.job for e in log if e.kind == "S")
    for n, jobs in plan.items():
        if n not in victims:
            assert [ends[str(j)] for j in jobs] == [1] * len(jobs)  # a survivor's calls all ran once
        assert all(starts[str(j)] <= 1 for j in jobs)
    assert set(ends.values()) == {1}
